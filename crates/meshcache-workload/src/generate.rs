//! Synthetic request streams, deterministic: the same spec and seed always
//! give the same requests, on any machine (a PCG generator, seeded
//! explicitly; no other source of randomness).
//!
//! Two models, chosen by `model` in a [`WorkloadSpec`] (as it appears in an
//! experiment file's `[workload]` table):
//!
//! * **`benchmark`** — the Summary Cache paper's proxy benchmark. Each of
//!   `clients` clients issues `requests_per_client` requests; with
//!   probability `inherent_hit_ratio` a request re-references a URL from the
//!   client's own history, else it asks for a new URL. The re-referenced URL
//!   is chosen with temporal locality: its position in the client's LRU
//!   stack (0 = most recent) is drawn from a Zipf law of exponent `locality`
//!   over the stack, so recent URLs come back most often. Sizes follow a
//!   Pareto law (`pareto_alpha` = 1.1, `pareto_k` = 3 KiB, the paper's
//!   values) capped at `max_size` (default 1 MiB: without a cap one object
//!   in a few thousand exceeds 10 MiB and dominates a short run's bytes).
//!   Clients are split into `groups` by client number modulo groups (the lab
//!   puts group g's clients on cache g); with `disjoint = true` no two
//!   groups ever share a URL — no remote hit is possible, the paper's worst
//!   case for ICP — and with `disjoint = false` a share `shared` of the new
//!   URLs is drawn (Zipf, `shared_popularity`) from a pool common to all
//!   groups, so remote hits exist.
//! * **`characterized`** — the hierarchy-evaluation paper's model. Requests
//!   are split over domain `groups` by their `domain_ratio`; inside a group a
//!   request goes to the group's hot set with probability `hot_ratio` (the
//!   object drawn by a Zipf law of exponent `hot_set_popularity` over
//!   `hot_set_size` objects), else to a new object requested once. To scale
//!   a characterization down, give fewer `requests` and scale the hot set
//!   sizes by the same factor (`scale`), which keeps every ratio.
//!
//! URLs are `http://HOST/oN?size=BYTES` (the origin emulator serves them;
//! the lab adds the origin's port), with `&cc=no-store` for the share
//! `uncacheable` of objects. `time_ms` is 0 unless `rate` (requests per
//! second over the whole stream) spaces the requests out.
//!
//! Also here: [`Characterized::from_characterization`] (the `characterized`
//! model of a log's [`crate::characterize::Characterization`], scaled to a
//! number of requests), [`replay`] (a log's records as a trace) and
//! [`Summary`] (what any stream holds, with the suggested cache size).

use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Pareto, Zipf};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};

use crate::trace::Request;

/// What to generate: the `[workload]` table of an experiment file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "model", rename_all = "lowercase", deny_unknown_fields)]
pub enum WorkloadSpec {
    /// The Summary Cache paper's proxy benchmark.
    Benchmark(Benchmark),
    /// The hierarchy-evaluation paper's per-domain characterization.
    Characterized(Characterized),
}

/// Parameters of the `benchmark` model (defaults: the Summary Cache paper's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Benchmark {
    /// Number of clients.
    pub clients: u32,
    /// Requests each client issues.
    pub requests_per_client: u32,
    /// Share of requests that re-reference a URL the same client asked for before.
    pub inherent_hit_ratio: f64,
    /// Zipf exponent over the client's LRU stack for re-references (higher: more recent).
    pub locality: f64,
    /// Client groups (client mod groups); group g's URLs live on host `groupG.lab`.
    pub groups: u32,
    /// Whether groups never share a URL.
    pub disjoint: bool,
    /// With `disjoint = false`: share of new URLs drawn from the pool common to all groups.
    pub shared: f64,
    /// Size of the common pool, in objects.
    pub shared_objects: u32,
    /// Zipf exponent of the common pool's popularity.
    pub shared_popularity: f64,
    /// Pareto shape of object sizes.
    pub pareto_alpha: f64,
    /// Pareto scale (smallest size), bytes.
    pub pareto_k: u64,
    /// Largest object, bytes.
    pub max_size: u64,
    /// Share of objects the origin marks `no-store`.
    pub uncacheable: f64,
    /// Requests per second over the whole stream (0: all at time 0, a closed loop).
    pub rate: f64,
}

impl Default for Benchmark {
    fn default() -> Self {
        Benchmark {
            clients: 120,
            requests_per_client: 200,
            inherent_hit_ratio: 0.25,
            locality: 1.0,
            groups: 4,
            disjoint: true,
            shared: 0.3,
            shared_objects: 1000,
            shared_popularity: 0.8,
            pareto_alpha: 1.1,
            pareto_k: 3 * 1024,
            max_size: 1 << 20,
            uncacheable: 0.0,
            rate: 0.0,
        }
    }
}

/// Parameters of the `characterized` model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Characterized {
    /// Requests in all.
    pub requests: u32,
    /// Clients the requests are spread over (round robin).
    pub clients: u32,
    /// Multiplies every hot set size (to scale a characterization down).
    pub scale: f64,
    /// Pareto shape of object sizes.
    pub pareto_alpha: f64,
    /// Pareto scale (smallest size), bytes.
    pub pareto_k: u64,
    /// Largest object, bytes.
    pub max_size: u64,
    /// Requests per second over the whole stream (0: a closed loop).
    pub rate: f64,
    /// The domain groups.
    pub group: Vec<DomainGroup>,
}

impl Default for Characterized {
    fn default() -> Self {
        Characterized {
            requests: 9600,
            clients: 40,
            scale: 1.0,
            pareto_alpha: 1.1,
            pareto_k: 3 * 1024,
            max_size: 1 << 20,
            rate: 0.0,
            group: Vec::new(),
        }
    }
}

/// One domain group of the `characterized` model (the hierarchy paper's Table 1 row).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainGroup {
    /// Host name of its objects, e.g. `www.g0.br` (its suffix decides domain-based routing).
    pub host: String,
    /// Share of all requests that go to this group (shares are normalized to sum to 1).
    pub domain_ratio: f64,
    /// Share of the group's requests that go to its hot set.
    pub hot_ratio: f64,
    /// Objects in the hot set (before `scale`).
    pub hot_set_size: u32,
    /// Zipf exponent of the hot set's popularity.
    pub hot_set_popularity: f64,
}

/// A spec that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct WorkloadError {
    /// The offending key.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

fn err(field: &str, reason: impl Into<String>) -> WorkloadError {
    WorkloadError {
        field: field.into(),
        reason: reason.into(),
    }
}

fn share(field: &str, v: f64) -> Result<(), WorkloadError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(err(field, format!("must be within 0..1, got {v}")))
    }
}

/// The most requests one stream may have.
pub const MAX_REQUESTS: u64 = 100_000_000;

fn sizes(alpha: f64, k: u64, max: u64) -> Result<Pareto<f64>, WorkloadError> {
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(err(
            "pareto_alpha",
            format!("must be positive, got {alpha}"),
        ));
    }
    if k == 0 || k > max {
        return Err(err(
            "pareto_k",
            format!("must be within 1..=max_size, got {k}"),
        ));
    }
    Pareto::new(k as f64, alpha).map_err(|e| err("pareto_alpha", e.to_string()))
}

impl WorkloadSpec {
    /// Checks the values; errors name the key.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        match self {
            WorkloadSpec::Benchmark(b) => {
                if b.clients == 0 {
                    return Err(err("clients", "must be at least 1"));
                }
                if b.groups == 0 || b.groups > b.clients {
                    return Err(err(
                        "groups",
                        format!("must be within 1..=clients, got {}", b.groups),
                    ));
                }
                if u64::from(b.clients) * u64::from(b.requests_per_client) > MAX_REQUESTS {
                    return Err(err(
                        "requests_per_client",
                        format!("more than {MAX_REQUESTS} requests in all"),
                    ));
                }
                share("inherent_hit_ratio", b.inherent_hit_ratio)?;
                share("shared", b.shared)?;
                share("uncacheable", b.uncacheable)?;
                if !(b.locality >= 0.0 && b.locality <= 10.0) {
                    return Err(err(
                        "locality",
                        format!("must be within 0..10, got {}", b.locality),
                    ));
                }
                if !b.disjoint && b.shared > 0.0 && b.shared_objects == 0 {
                    return Err(err("shared_objects", "must be at least 1 when shared > 0"));
                }
                if !(0.0..=10.0).contains(&b.shared_popularity) {
                    return Err(err("shared_popularity", "must be within 0..10"));
                }
                if !(b.rate >= 0.0 && b.rate.is_finite()) {
                    return Err(err("rate", "must be at least 0"));
                }
                sizes(b.pareto_alpha, b.pareto_k, b.max_size).map(|_| ())
            }
            WorkloadSpec::Characterized(c) => {
                if c.requests == 0 || u64::from(c.requests) > MAX_REQUESTS {
                    return Err(err(
                        "requests",
                        format!("must be within 1..={MAX_REQUESTS}"),
                    ));
                }
                if c.clients == 0 {
                    return Err(err("clients", "must be at least 1"));
                }
                if !(c.scale > 0.0 && c.scale <= 1000.0) {
                    return Err(err(
                        "scale",
                        format!("must be within (0, 1000], got {}", c.scale),
                    ));
                }
                if c.group.is_empty() {
                    return Err(err("group", "at least one [[workload.group]] is needed"));
                }
                for (i, g) in c.group.iter().enumerate() {
                    let f = |k: &str| format!("group[{i}].{k}");
                    if g.host.is_empty()
                        || !g
                            .host
                            .chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || ch == '.' || ch == '-')
                    {
                        return Err(err(&f("host"), format!("{:?} is not a host name", g.host)));
                    }
                    if !(g.domain_ratio > 0.0 && g.domain_ratio.is_finite()) {
                        return Err(err(&f("domain_ratio"), "must be positive"));
                    }
                    share(&f("hot_ratio"), g.hot_ratio)?;
                    if g.hot_set_size == 0 {
                        return Err(err(&f("hot_set_size"), "must be at least 1"));
                    }
                    if !(g.hot_set_popularity >= 0.0 && g.hot_set_popularity <= 10.0) {
                        return Err(err(&f("hot_set_popularity"), "must be within 0..10"));
                    }
                }
                if !(c.rate >= 0.0 && c.rate.is_finite()) {
                    return Err(err("rate", "must be at least 0"));
                }
                sizes(c.pareto_alpha, c.pareto_k, c.max_size).map(|_| ())
            }
        }
    }
}

/// Generates the stream of `spec` with `seed`.
pub fn generate(spec: &WorkloadSpec, seed: u64) -> Result<Vec<Request>, WorkloadError> {
    spec.validate()?;
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut out = match spec {
        WorkloadSpec::Benchmark(b) => benchmark(b, &mut rng)?,
        WorkloadSpec::Characterized(c) => characterized(c, &mut rng)?,
    };
    let rate = match spec {
        WorkloadSpec::Benchmark(b) => b.rate,
        WorkloadSpec::Characterized(c) => c.rate,
    };
    if rate > 0.0 {
        for (i, r) in out.iter_mut().enumerate() {
            r.time_ms = (i as f64 * 1000.0 / rate) as u64;
        }
    }
    Ok(out)
}

fn draw_size(d: &Pareto<f64>, max: u64, rng: &mut Pcg64) -> u64 {
    (d.sample(rng) as u64).min(max)
}

/// A Zipf rank in `0..n` (exponent 0 is uniform).
fn zipf_rank(n: u64, s: f64, rng: &mut Pcg64) -> u64 {
    if n <= 1 {
        return 0;
    }
    match Zipf::new(n as f64, s) {
        Ok(z) => (z.sample(rng) as u64).clamp(1, n) - 1,
        Err(_) => rng.random_range(0..n),
    }
}

fn url(host: &str, id: u64, size: u64, no_store: bool) -> String {
    if no_store {
        format!("http://{host}/o{id}?size={size}&cc=no-store")
    } else {
        format!("http://{host}/o{id}?size={size}")
    }
}

/// An object of the benchmark: its URL and size.
#[derive(Clone)]
struct Object {
    url: String,
    size: u64,
}

fn benchmark(b: &Benchmark, rng: &mut Pcg64) -> Result<Vec<Request>, WorkloadError> {
    let size_law = sizes(b.pareto_alpha, b.pareto_k, b.max_size)?;
    let mut next_id = vec![0u64; b.groups as usize];
    let mut new_object = |group: u32, rng: &mut Pcg64| {
        let id = next_id[group as usize];
        next_id[group as usize] += 1;
        let size = draw_size(&size_law, b.max_size, rng);
        let no_store = b.uncacheable > 0.0 && rng.random_bool(b.uncacheable);
        Object {
            url: url(&format!("group{group}.lab"), id, size, no_store),
            size,
        }
    };
    // The pool shared by all groups (host `shared.lab`).
    let pool: Vec<Object> = if b.disjoint || b.shared == 0.0 {
        Vec::new()
    } else {
        (0..u64::from(b.shared_objects))
            .map(|id| {
                let size = draw_size(&size_law, b.max_size, rng);
                Object {
                    url: url("shared.lab", id, size, false),
                    size,
                }
            })
            .collect()
    };
    // Each client's LRU stack of distinct URLs (most recent last).
    let mut stacks: Vec<Vec<Object>> = vec![Vec::new(); b.clients as usize];
    let total = u64::from(b.clients) * u64::from(b.requests_per_client);
    let mut out = Vec::with_capacity(total as usize);
    // Round-robin over clients, so that the stream interleaves them as concurrent clients would.
    for _ in 0..b.requests_per_client {
        for client in 0..b.clients {
            let stack = &mut stacks[client as usize];
            let group = client % b.groups;
            let reref = !stack.is_empty() && rng.random_bool(b.inherent_hit_ratio);
            let obj = if reref {
                let depth = zipf_rank(stack.len() as u64, b.locality, rng) as usize;
                let idx = stack.len() - 1 - depth;
                stack.remove(idx)
            } else if !pool.is_empty() && rng.random_bool(b.shared) {
                let rank = zipf_rank(pool.len() as u64, b.shared_popularity, rng) as usize;
                let o = pool[rank].clone();
                // A pool object this client already holds is a re-reference; move it to the top.
                if let Some(i) = stack.iter().position(|s| s.url == o.url) {
                    stack.remove(i);
                }
                o
            } else {
                new_object(group, rng)
            };
            out.push(Request {
                time_ms: 0,
                client,
                size: obj.size,
                url: obj.url.clone(),
            });
            stack.push(obj);
        }
    }
    Ok(out)
}

fn characterized(c: &Characterized, rng: &mut Pcg64) -> Result<Vec<Request>, WorkloadError> {
    let size_law = sizes(c.pareto_alpha, c.pareto_k, c.max_size)?;
    let total_ratio: f64 = c.group.iter().map(|g| g.domain_ratio).sum();
    // Object sizes are a function of (group, object id), drawn once and remembered.
    let hot: Vec<Vec<u64>> = c
        .group
        .iter()
        .map(|g| {
            let n = ((f64::from(g.hot_set_size) * c.scale).round() as u64).max(1);
            (0..n)
                .map(|_| draw_size(&size_law, c.max_size, rng))
                .collect()
        })
        .collect();
    let mut next_cold: Vec<u64> = hot.iter().map(|h| h.len() as u64).collect();
    let mut out = Vec::with_capacity(c.requests as usize);
    for i in 0..c.requests {
        // Pick the group by domain ratio.
        let mut x = rng.random::<f64>() * total_ratio;
        let mut gi = c.group.len() - 1;
        for (j, g) in c.group.iter().enumerate() {
            if x < g.domain_ratio {
                gi = j;
                break;
            }
            x -= g.domain_ratio;
        }
        let g = &c.group[gi];
        let (id, size) = if rng.random_bool(g.hot_ratio) {
            let rank = zipf_rank(hot[gi].len() as u64, g.hot_set_popularity, rng);
            (rank, hot[gi][rank as usize])
        } else {
            let id = next_cold[gi];
            next_cold[gi] += 1;
            (id, draw_size(&size_law, c.max_size, rng))
        };
        out.push(Request {
            time_ms: 0,
            client: i % c.clients,
            size,
            url: url(&g.host, id, size, false),
        });
    }
    Ok(out)
}

/// What a stream holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests.
    pub requests: u64,
    /// Distinct clients.
    pub clients: u64,
    /// Distinct URLs.
    pub unique_objects: u64,
    /// Bytes of the distinct URLs.
    pub unique_bytes: u64,
    /// Share of requests for a URL requested before (by anyone).
    pub inherent_hit_ratio: f64,
    /// Suggested cache size per node: `cache_share` of the unique bytes (the hierarchy
    /// paper sizes each cache at 10% of the unique bytes).
    pub suggested_cache_bytes: u64,
}

/// The hierarchy paper's cache size: 10% of the unique bytes.
pub const DEFAULT_CACHE_SHARE: f64 = 0.1;

impl Summary {
    /// Summarizes `requests`, suggesting caches of [`DEFAULT_CACHE_SHARE`] of the unique bytes.
    pub fn of(requests: &[Request]) -> Summary {
        Summary::with_cache_share(requests, DEFAULT_CACHE_SHARE)
    }

    /// Summarizes `requests`, suggesting caches of `cache_share` of the unique bytes.
    pub fn with_cache_share(requests: &[Request], cache_share: f64) -> Summary {
        let mut seen = std::collections::HashSet::new();
        let mut clients = std::collections::HashSet::new();
        let mut s = Summary::default();
        let mut rerefs = 0u64;
        for r in requests {
            s.requests += 1;
            clients.insert(r.client);
            if seen.insert(r.url.as_str()) {
                s.unique_bytes += r.size;
            } else {
                rerefs += 1;
            }
        }
        s.clients = clients.len() as u64;
        s.unique_objects = seen.len() as u64;
        if s.requests > 0 {
            s.inherent_hit_ratio = rerefs as f64 / s.requests as f64;
        }
        s.suggested_cache_bytes = (s.unique_bytes as f64 * cache_share.clamp(0.0, 1.0)) as u64;
        s
    }

    /// A per-node cache size keeping the hierarchy paper's ratio: `share` of the unique bytes
    /// (the paper: 10%) split over `nodes`.
    pub fn cache_size_per_node(&self, share: f64, nodes: u32) -> u64 {
        (self.unique_bytes as f64 * share / f64::from(nodes.max(1))) as u64
    }
}

/// What [`replay`] skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayStats {
    /// Records turned into requests.
    pub kept: u64,
    /// Records skipped because their method is not `GET`.
    pub not_get: u64,
    /// Records skipped because their URL has no `http://` host.
    pub bad_url: u64,
}

/// Turns log records into a trace: time from the log (milliseconds after the
/// first record, never going back), client = index of the distinct client
/// address in order of appearance, size = the bytes logged for the URL's
/// first `GET` (so every object keeps one size), URL =
/// `http://HOST/PATH?size=N` where `PATH` is the original path and query
/// with everything but `A-Z a-z 0-9 - . _ ~ /` percent-encoded (distinct
/// URLs stay distinct, the same URL stays the same). Non-`GET` records and
/// URLs without an `http://` host are skipped and counted.
pub fn replay<I>(records: I) -> (Vec<Request>, ReplayStats)
where
    I: IntoIterator<Item = crate::log::LogRecord>,
{
    let mut stats = ReplayStats::default();
    let mut clients: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    let mut urls: std::collections::HashMap<String, (String, u64)> =
        std::collections::HashMap::new();
    let mut out = Vec::new();
    let mut first: Option<u64> = None;
    let mut last = 0u64;
    for r in records {
        if r.method != "GET" {
            stats.not_get += 1;
            continue;
        }
        let Some(rest) = r
            .url
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("http://"))
            .map(|_| &r.url[7..])
        else {
            stats.bad_url += 1;
            continue;
        };
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let host = &rest[..split];
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
        if !host_ok {
            stats.bad_url += 1;
            continue;
        }
        let (url, size) = urls
            .entry(r.url.clone())
            .or_insert_with(|| {
                let mut path = String::new();
                for b in rest[split..].bytes() {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
                        path.push(char::from(b));
                    } else {
                        path.push_str(&format!("%{b:02X}"));
                    }
                }
                if !path.starts_with('/') {
                    path.insert(0, '/');
                }
                let host = host.to_ascii_lowercase();
                (format!("http://{host}{path}?size={}", r.bytes), r.bytes)
            })
            .clone();
        let next = clients.len() as u32;
        let client = *clients.entry(r.client).or_insert(next);
        let t0 = *first.get_or_insert(r.time_ms);
        last = last.max(r.time_ms.saturating_sub(t0));
        out.push(Request {
            time_ms: last,
            client,
            size,
            url,
        });
        stats.kept += 1;
    }
    (out, stats)
}

impl Characterized {
    /// The `characterized` model of a log's characterization, scaled to
    /// `requests` requests over `clients` clients. Every group with requests
    /// becomes a [`DomainGroup`] with host `www.gI.TLD` (`TLD` from its first
    /// suffix, `other` for `rest`). Scaling rule: the hot set sizes are
    /// multiplied by `requests / log requests` (`scale`), so each hot object
    /// keeps its expected number of references and the hot ratio, the domain
    /// ratios and the popularity slope are kept.
    pub fn from_characterization(
        ch: &crate::characterize::Characterization,
        requests: u32,
        clients: u32,
    ) -> Characterized {
        let scale = if ch.overall.requests == 0 {
            1.0
        } else {
            (f64::from(requests) / ch.overall.requests as f64).min(1000.0)
        };
        let group = ch
            .groups
            .iter()
            .filter(|g| g.requests > 0)
            .enumerate()
            .map(|(i, g)| {
                let tld: String = g
                    .suffixes
                    .first()
                    .map(|s| s.rsplit('.').next().unwrap_or("").to_ascii_lowercase())
                    .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric()))
                    .unwrap_or_else(|| "other".into());
                DomainGroup {
                    host: format!("www.g{i}.{tld}"),
                    domain_ratio: g.domain_ratio,
                    hot_ratio: g.hot_ratio,
                    hot_set_size: u32::try_from(g.hot_set_size.max(1)).unwrap_or(u32::MAX),
                    hot_set_popularity: g.hot_set_popularity.clamp(0.0, 10.0),
                }
            })
            .collect();
        let sizes = &ch.overall.sizes;
        let mut c = Characterized {
            requests,
            clients,
            scale: if scale > 0.0 { scale } else { 1.0 },
            group,
            ..Characterized::default()
        };
        if sizes.pareto_alpha > 0.0 && sizes.pareto_k > 0 && sizes.pareto_k <= c.max_size {
            c.pareto_alpha = sizes.pareto_alpha;
            c.pareto_k = sizes.pareto_k;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(h: f64) -> WorkloadSpec {
        WorkloadSpec::Benchmark(Benchmark {
            clients: 40,
            requests_per_client: 500,
            inherent_hit_ratio: h,
            ..Benchmark::default()
        })
    }

    #[test]
    fn benchmark_hits_its_inherent_hit_ratio() {
        for h in [0.0, 0.25, 0.45, 0.8] {
            let reqs = generate(&bench(h), 7).unwrap();
            assert_eq!(reqs.len(), 20_000);
            let s = Summary::of(&reqs);
            // The first request of each client cannot be a re-reference.
            assert!((s.inherent_hit_ratio - h).abs() < 0.01, "h {h}: {s:?}");
        }
    }

    #[test]
    fn deterministic_and_seed_dependent() {
        let a = generate(&bench(0.3), 1).unwrap();
        let b = generate(&bench(0.3), 1).unwrap();
        let c = generate(&bench(0.3), 2).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn disjoint_groups_share_nothing() {
        let reqs = generate(&bench(0.4), 3).unwrap();
        let mut owner = std::collections::HashMap::new();
        for r in &reqs {
            let g = r.client % 4;
            assert_eq!(
                *owner.entry(r.url.clone()).or_insert(g),
                g,
                "{} shared",
                r.url
            );
            assert!(r.url.starts_with(&format!("http://group{g}.lab/o")));
        }
    }

    #[test]
    fn shared_pool_makes_remote_hits_possible() {
        let spec = WorkloadSpec::Benchmark(Benchmark {
            clients: 8,
            requests_per_client: 300,
            disjoint: false,
            shared: 0.5,
            ..Benchmark::default()
        });
        let reqs = generate(&spec, 5).unwrap();
        let mut groups = std::collections::HashMap::<String, std::collections::HashSet<u32>>::new();
        for r in &reqs {
            groups
                .entry(r.url.clone())
                .or_default()
                .insert(r.client % 4);
        }
        assert!(groups.values().any(|g| g.len() > 1));
    }

    #[test]
    fn sizes_follow_the_capped_pareto_law() {
        let reqs = generate(&bench(0.0), 9).unwrap();
        assert!(reqs.iter().all(|r| (3072..=1 << 20).contains(&r.size)));
        assert!(reqs
            .iter()
            .all(|r| r.url.ends_with(&format!("?size={}", r.size))));
        let mut sizes: Vec<u64> = reqs.iter().map(|r| r.size).collect();
        sizes.sort_unstable();
        // Pareto(1.1, 3 KiB): the median is k * 2^(1/1.1) ~ 5.6 KiB.
        let median = sizes[sizes.len() / 2] as f64;
        assert!((5000.0..6500.0).contains(&median), "median {median}");
    }

    #[test]
    fn characterized_keeps_its_ratios() {
        let spec: WorkloadSpec = toml::from_str(
            r#"
model = "characterized"
requests = 20000
clients = 10
[[group]]
host = "www.g0.br"
domain_ratio = 0.5
hot_ratio = 0.68
hot_set_size = 230
hot_set_popularity = 0.8
[[group]]
host = "www.g1.com"
domain_ratio = 0.5
hot_ratio = 0.36
hot_set_size = 435
hot_set_popularity = 0.8
"#,
        )
        .unwrap();
        let reqs = generate(&spec, 11).unwrap();
        let br: Vec<_> = reqs.iter().filter(|r| r.url.contains(".br/")).collect();
        let share = br.len() as f64 / reqs.len() as f64;
        assert!((share - 0.5).abs() < 0.02, "{share}");
        let hot = br
            .iter()
            .filter(|r| {
                let id: u64 = r
                    .url
                    .split("/o")
                    .nth(1)
                    .and_then(|x| x.split('?').next())
                    .unwrap()
                    .parse()
                    .unwrap();
                id < 230
            })
            .count();
        assert!((hot as f64 / br.len() as f64 - 0.68).abs() < 0.02);
        // A hot object keeps one size.
        let mut sizes = std::collections::HashMap::new();
        for r in &reqs {
            assert_eq!(*sizes.entry(r.url.clone()).or_insert(r.size), r.size);
        }
    }

    #[test]
    fn bad_specs_name_the_key() {
        let e = generate(&bench(1.5), 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "inherent_hit_ratio: must be within 0..1, got 1.5"
        );
        let e = toml::from_str::<WorkloadSpec>("model = \"benchmark\"\nclient = 3\n").unwrap_err();
        assert!(e.to_string().contains("client"), "{e}");
        let e = toml::from_str::<WorkloadSpec>("model = \"zipf\"\n").unwrap_err();
        assert!(e.to_string().contains("zipf"), "{e}");
        let spec = WorkloadSpec::Characterized(Characterized::default());
        assert_eq!(spec.validate().unwrap_err().field, "group");
    }

    #[test]
    fn characterizing_model_b_recovers_its_ratios() {
        let groups = [
            (".br", 0.3, 0.68, 230),
            (".com", 0.5, 0.36, 435),
            ("", 0.2, 0.2, 100),
        ];
        let spec = Characterized {
            requests: 60_000,
            clients: 20,
            group: groups
                .iter()
                .enumerate()
                .map(|(i, &(tld, d, h, n))| DomainGroup {
                    host: format!("www.g{i}{}", if tld.is_empty() { ".org" } else { tld }),
                    domain_ratio: d,
                    hot_ratio: h,
                    hot_set_size: n,
                    hot_set_popularity: 0.8,
                })
                .collect(),
            ..Characterized::default()
        };
        let reqs = generate(&WorkloadSpec::Characterized(spec.clone()), 4).unwrap();
        let records = reqs.iter().map(|r| crate::log::LogRecord {
            time_ms: r.time_ms,
            elapsed_ms: 0,
            client: r.client.to_string(),
            code: "TCP_MISS".into(),
            status: 200,
            bytes: r.size,
            method: "GET".into(),
            url: r.url.clone(),
            hierarchy: "-".into(),
            peer: "-".into(),
            content_type: "-".into(),
        });
        let sfx = vec![vec![".br".to_string()], vec![".com".to_string()]];
        let ch = crate::characterize::characterize(records, &sfx, &Default::default());
        for (g, &(_, d, h, n)) in ch.groups.iter().zip(&groups) {
            assert!((g.domain_ratio - d).abs() < 0.02, "{g:?}");
            assert!((g.hot_ratio - h).abs() < 0.03, "{g:?}");
            assert!(g.hot_set_size <= u64::from(n) && g.hot_set_size * 10 >= u64::from(n) * 9);
        }
        // And back: a spec from the characterization, scaled down by 10.
        let back = Characterized::from_characterization(&ch, 6000, 5);
        assert!((back.scale - 0.1).abs() < 1e-9);
        assert_eq!(back.group.len(), 3);
        assert_eq!(back.group[0].host, "www.g0.br");
        assert_eq!(back.group[2].host, "www.g2.other");
        assert!((back.group[1].hot_ratio - 0.36).abs() < 0.03);
        let small = generate(&WorkloadSpec::Characterized(back), 1).unwrap();
        assert_eq!(small.len(), 6000);
    }

    #[test]
    fn replay_rewrites_and_skips() {
        let log = "\
1700000000.000 1 10.0.0.1 TCP_MISS/200 100 GET http://A.br/x?q=1&r - DIRECT/x text/html
1700000000.500 1 10.0.0.2 TCP_MISS/200 50 POST http://a.br/form - DIRECT/x text/html
1700000000.400 1 10.0.0.2 TCP_HIT/200 70 GET http://A.br/x?q=1&r - NONE/- text/html
1700000000.300 1 10.0.0.1 TCP_MISS/200 9 GET http://a.br/y%20z - DIRECT/x text/html
1700000002.000 1 10.0.0.3 TCP_DENIED/403 0 CONNECT a.br:443 - NONE/- -
1700000003.000 1 10.0.0.3 NONE/400 0 GET /relative - NONE/- -
";
        let (reqs, st) = replay(crate::log::LogReader::new(log.as_bytes()));
        assert_eq!(
            st,
            ReplayStats {
                kept: 3,
                not_get: 2,
                bad_url: 1
            }
        );
        assert_eq!(reqs[0].url, "http://a.br/x%3Fq%3D1%26r?size=100");
        assert_eq!(
            (reqs[1].url.as_str(), reqs[1].size),
            (reqs[0].url.as_str(), 100)
        );
        assert_eq!(reqs[2].url, "http://a.br/y%2520z?size=9");
        assert_eq!(
            reqs.iter()
                .map(|r| (r.time_ms, r.client))
                .collect::<Vec<_>>(),
            [(0, 0), (400, 1), (400, 0)]
        );
        let mut buf = Vec::new();
        crate::trace::write(&mut buf, &[], &reqs).unwrap();
        assert_eq!(crate::trace::read(&buf[..]).unwrap().1, reqs);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn deterministic_and_consistent(
            clients in 1u32..8, per in 0u32..60, h in 0.0f64..1.0, groups in 1u32..4,
            disjoint in proptest::bool::ANY, seed in 0u64..1000,
        ) {
            let spec = WorkloadSpec::Benchmark(Benchmark {
                clients, requests_per_client: per, inherent_hit_ratio: h,
                groups: groups.min(clients), disjoint, uncacheable: 0.1, rate: 100.0,
                ..Benchmark::default()
            });
            let a = generate(&spec, seed).unwrap();
            let mut ta = Vec::new();
            crate::trace::write(&mut ta, &[], &a).unwrap();
            let mut tb = Vec::new();
            crate::trace::write(&mut tb, &[], &generate(&spec, seed).unwrap()).unwrap();
            proptest::prop_assert_eq!(&ta, &tb);
            let s = Summary::of(&a);
            proptest::prop_assert_eq!(s.requests, u64::from(clients * per));
            proptest::prop_assert!(s.unique_objects <= s.requests);
            proptest::prop_assert!(s.clients <= u64::from(clients));
            let expect = if s.requests == 0 { 0.0 } else { 1.0 - s.unique_objects as f64 / s.requests as f64 };
            proptest::prop_assert!((s.inherent_hit_ratio - expect).abs() < 1e-9);
            proptest::prop_assert!(s.suggested_cache_bytes <= s.unique_bytes / 10 + 1);
            proptest::prop_assert!(a.windows(2).all(|w| w[0].time_ms <= w[1].time_ms));
        }
    }
}
