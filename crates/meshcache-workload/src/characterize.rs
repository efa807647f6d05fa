//! What an access log says about its workload: the hierarchy-evaluation
//! paper's four parameters per **domain group**, and the usual statistics.
//!
//! A domain group is a list of host-name suffixes (`.br`, `.com`, …); a
//! request belongs to the first group one of whose suffixes ends its URL's
//! host (compared without case; `.br` matches `www.a.br`, and `br` itself).
//! Requests matching no group form the last group, `rest`.
//!
//! An *object* is a URL (byte for byte). Our definitions, per group:
//!
//! * **domain ratio**: the group's share of all requests;
//! * **hot set**: the objects referenced more than once; **hot set size**:
//!   their number;
//! * **hot ratio**: the share of the group's requests that go to hot-set
//!   objects (so a one-timer's request is the only kind that is not "hot");
//! * **hot set popularity**: the slope `s` of the hot set's rank/frequency
//!   curve, `count ∝ rank^-s`, fitted by least squares on `ln rank` vs
//!   `ln count` (0 when fewer than two objects);
//! * **popularity slope**: the same fit over all the group's objects;
//! * **rate**: mean requests per second over the span from first to last
//!   request, and the busiest calendar minute's requests per second;
//! * **sizes**, over objects (an object's size is the largest byte count
//!   logged for it, so a `304` or an aborted transfer does not shrink it):
//!   mean, median, 90th percentile, max; a Pareto tail fit with `k` the 25th
//!   percentile (at least 1 byte) and `alpha = n / Σ ln(x/k)` over the `n`
//!   sizes `x ≥ k` (maximum likelihood); a lognormal fit (`mu`, `sigma`:
//!   mean and standard deviation of `ln x` over sizes > 0);
//! * **temporal locality**: for each re-reference, its LRU stack distance:
//!   the number of *other* distinct objects referenced since this object's
//!   previous reference (0: nothing in between). Median, 90th percentile,
//!   and the shares of re-references with distance < 10, < 100, < 1000.
//!   Computed in O(n log n) with a Fenwick tree marking each object's last
//!   reference position;
//! * **one-timers**: objects referenced exactly once, as a share of objects
//!   and as a share of requests;
//! * **cacheable share**: the share of requests that are `GET`, answered
//!   with status 200, 203, 300, 301 or 410, and whose URL has neither a `?`
//!   nor `cgi-bin` (the classic heuristic for dynamic pages);
//! * **unique objects**, **unique bytes** (sum of the object sizes), and the
//!   **inherent hit ratio**: the share of requests for a URL requested
//!   before (by any client), i.e. what an infinite shared cache would hit.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::log::{BadLines, LogRecord};

/// The whole characterization of a log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Characterization {
    /// One entry per requested group, then `rest`.
    pub groups: Vec<GroupStats>,
    /// All requests together (its `domain_ratio` is 1).
    pub overall: GroupStats,
    /// Lines the parser skipped, by reason (as given to [`characterize`]).
    pub bad_lines: BadLines,
}

/// The statistics of one domain group (or of the whole log).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    /// The group's name: its suffixes joined by `,`, or `rest`, or `all`.
    pub name: String,
    /// The suffixes that select it (empty for `rest` and `all`).
    pub suffixes: Vec<String>,
    /// Requests.
    pub requests: u64,
    /// Share of all requests.
    pub domain_ratio: f64,
    /// Objects referenced more than once.
    pub hot_set_size: u64,
    /// Share of the requests that go to the hot set.
    pub hot_ratio: f64,
    /// Zipf-like slope of the hot set's rank/frequency curve.
    pub hot_set_popularity: f64,
    /// Zipf-like slope over all objects.
    pub popularity_slope: f64,
    /// Distinct objects.
    pub unique_objects: u64,
    /// Sum of the object sizes.
    pub unique_bytes: u64,
    /// Share of objects referenced once.
    pub one_timer_objects: f64,
    /// Share of requests that go to one-timers.
    pub one_timer_requests: f64,
    /// Share of cacheable requests.
    pub cacheable: f64,
    /// Share of requests for an object requested before.
    pub inherent_hit_ratio: f64,
    /// Request rate.
    pub rate: RateStats,
    /// Object sizes.
    pub sizes: SizeStats,
    /// LRU stack distances of re-references.
    pub locality: LocalityStats,
}

/// Request rate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateStats {
    /// Mean requests per second from the first to the last request.
    pub mean_per_s: f64,
    /// Requests per second in the busiest minute.
    pub peak_minute_per_s: f64,
}

/// Object size distribution, bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SizeStats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: u64,
    /// 90th percentile.
    pub p90: u64,
    /// Largest.
    pub max: u64,
    /// Pareto fit: the scale `k` (25th percentile).
    pub pareto_k: u64,
    /// Pareto fit: the shape, by maximum likelihood over sizes ≥ k.
    pub pareto_alpha: f64,
    /// Lognormal fit: mean of ln(size).
    pub lognormal_mu: f64,
    /// Lognormal fit: standard deviation of ln(size).
    pub lognormal_sigma: f64,
}

/// Temporal locality: LRU stack distances of re-references.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalityStats {
    /// Re-references measured.
    pub rereferences: u64,
    /// Median distance.
    pub median: u64,
    /// 90th percentile distance.
    pub p90: u64,
    /// Share of re-references with distance < 10.
    pub within_10: f64,
    /// Share with distance < 100.
    pub within_100: f64,
    /// Share with distance < 1000.
    pub within_1000: f64,
}

/// The host of a URL, lower case, without port or user info (`None` if there is none).
pub fn host_of(url: &str) -> Option<String> {
    let rest = match url.find("://") {
        Some(i) => &url[i + 3..],
        None => url,
    };
    let auth = rest.split(['/', '?', '#']).next().unwrap_or("");
    let auth = auth.rsplit('@').next().unwrap_or(auth);
    let host = if auth.starts_with('[') {
        auth.split(']').next().map(|h| &h[1..]).unwrap_or("")
    } else {
        auth.split(':').next().unwrap_or("")
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

fn matches(host: &str, suffix: &str) -> bool {
    let suffix = suffix.to_ascii_lowercase();
    host.ends_with(&suffix) || suffix.strip_prefix('.') == Some(host)
}

/// Whether a request counts as cacheable (see the module doc).
pub fn is_cacheable(r: &LogRecord) -> bool {
    r.method == "GET"
        && matches!(r.status, 200 | 203 | 300 | 301 | 410)
        && !r.url.contains('?')
        && !r.url.contains("cgi-bin")
}

/// One request, reduced to what the statistics need.
struct Ref {
    time_ms: u64,
    object: u32,
    cacheable: bool,
}

/// Characterizes `records` per group of suffixes; `bad_lines` is copied into the result.
pub fn characterize<I>(records: I, groups: &[Vec<String>], bad_lines: &BadLines) -> Characterization
where
    I: IntoIterator<Item = LogRecord>,
{
    let n_groups = groups.len() + 1;
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut sizes: Vec<u64> = Vec::new();
    let mut per_group: Vec<Vec<Ref>> = (0..n_groups).map(|_| Vec::new()).collect();
    let mut all: Vec<Ref> = Vec::new();
    let mut host_group: HashMap<String, usize> = HashMap::new();
    for r in records {
        let g = match host_of(&r.url) {
            Some(h) => *host_group.entry(h).or_insert_with_key(|h| {
                groups
                    .iter()
                    .position(|sfx| sfx.iter().any(|s| matches(h, s)))
                    .unwrap_or(groups.len())
            }),
            None => groups.len(),
        };
        let cacheable = is_cacheable(&r);
        let next = ids.len() as u32;
        let object = *ids.entry(r.url).or_insert(next);
        if object as usize == sizes.len() {
            sizes.push(r.bytes);
        } else {
            let s = &mut sizes[object as usize];
            *s = (*s).max(r.bytes);
        }
        per_group[g].push(Ref {
            time_ms: r.time_ms,
            object,
            cacheable,
        });
        all.push(Ref {
            time_ms: r.time_ms,
            object,
            cacheable,
        });
    }
    let total = all.len() as u64;
    let mut out: Vec<GroupStats> = per_group
        .iter()
        .enumerate()
        .map(|(i, refs)| {
            let (name, sfx) = match groups.get(i) {
                Some(s) => (s.join(","), s.clone()),
                None => ("rest".to_string(), Vec::new()),
            };
            stats(name, sfx, refs, &sizes, total)
        })
        .collect();
    let overall = stats("all".into(), Vec::new(), &all, &sizes, total);
    // Keep `rest` even when empty, so consumers can rely on the layout.
    out.shrink_to_fit();
    Characterization {
        groups: out,
        overall,
        bad_lines: bad_lines.clone(),
    }
}

fn share(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Least-squares slope of ln(count) over ln(rank), negated; `counts` sorted descending.
fn zipf_slope(counts: &[u64]) -> f64 {
    if counts.len() < 2 {
        return 0.0;
    }
    let n = counts.len() as f64;
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for (i, &c) in counts.iter().enumerate() {
        let x = ((i + 1) as f64).ln();
        let y = (c.max(1) as f64).ln();
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let den = n * sxx - sx * sx;
    if den.abs() < f64::EPSILON {
        0.0
    } else {
        -(n * sxy - sx * sy) / den
    }
}

fn stats(
    name: String,
    suffixes: Vec<String>,
    refs: &[Ref],
    sizes: &[u64],
    total: u64,
) -> GroupStats {
    let n = refs.len() as u64;
    let mut g = GroupStats {
        name,
        suffixes,
        requests: n,
        domain_ratio: share(n, total),
        ..GroupStats::default()
    };
    if refs.is_empty() {
        return g;
    }
    // Counts per object, in order of first reference.
    let mut local: HashMap<u32, u32> = HashMap::new();
    let mut objects: Vec<u32> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let mut seq: Vec<u32> = Vec::with_capacity(refs.len());
    let mut rerefs = 0u64;
    let mut cacheable = 0u64;
    for r in refs {
        let next = objects.len() as u32;
        let id = *local.entry(r.object).or_insert(next);
        if id == next {
            objects.push(r.object);
            counts.push(0);
        } else {
            rerefs += 1;
        }
        counts[id as usize] += 1;
        seq.push(id);
        cacheable += u64::from(r.cacheable);
    }
    g.unique_objects = objects.len() as u64;
    g.unique_bytes = objects.iter().map(|&o| sizes[o as usize]).sum();
    g.inherent_hit_ratio = share(rerefs, n);
    g.cacheable = share(cacheable, n);
    let one_timers = counts.iter().filter(|&&c| c == 1).count() as u64;
    g.one_timer_objects = share(one_timers, g.unique_objects);
    g.one_timer_requests = share(one_timers, n);
    g.hot_set_size = g.unique_objects - one_timers;
    g.hot_ratio = share(n - one_timers, n);
    let mut sorted = counts.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    g.popularity_slope = zipf_slope(&sorted);
    let hot: Vec<u64> = sorted.iter().copied().filter(|&c| c > 1).collect();
    g.hot_set_popularity = zipf_slope(&hot);

    // Rate.
    let first = refs.iter().map(|r| r.time_ms).min().unwrap_or(0);
    let last = refs.iter().map(|r| r.time_ms).max().unwrap_or(0);
    let span_s = (last - first) as f64 / 1000.0;
    g.rate.mean_per_s = if span_s > 0.0 { n as f64 / span_s } else { 0.0 };
    let mut minutes: HashMap<u64, u64> = HashMap::new();
    for r in refs {
        *minutes.entry(r.time_ms / 60_000).or_default() += 1;
    }
    g.rate.peak_minute_per_s = minutes.values().copied().max().unwrap_or(0) as f64 / 60.0;

    // Sizes.
    let mut sz: Vec<u64> = objects.iter().map(|&o| sizes[o as usize]).collect();
    sz.sort_unstable();
    g.sizes.mean = g.unique_bytes as f64 / sz.len() as f64;
    g.sizes.median = quantile(&sz, 0.5);
    g.sizes.p90 = quantile(&sz, 0.9);
    g.sizes.max = sz.last().copied().unwrap_or(0);
    let k = quantile(&sz, 0.25).max(1);
    g.sizes.pareto_k = k;
    let (mut m, mut sum) = (0u64, 0.0);
    for &x in sz.iter().filter(|&&x| x >= k) {
        m += 1;
        sum += (x as f64 / k as f64).ln();
    }
    g.sizes.pareto_alpha = if sum > 0.0 { m as f64 / sum } else { 0.0 };
    let logs: Vec<f64> = sz
        .iter()
        .filter(|&&x| x > 0)
        .map(|&x| (x as f64).ln())
        .collect();
    if !logs.is_empty() {
        let mu = logs.iter().sum::<f64>() / logs.len() as f64;
        let var = logs.iter().map(|l| (l - mu) * (l - mu)).sum::<f64>() / logs.len() as f64;
        g.sizes.lognormal_mu = mu;
        g.sizes.lognormal_sigma = var.sqrt();
    }

    g.locality = locality(&seq, objects.len());
    g
}

/// LRU stack distances of the re-references in `seq` (object ids `0..n_objects`).
fn locality(seq: &[u32], n_objects: usize) -> LocalityStats {
    let mut tree = Fenwick::new(seq.len());
    let mut last: Vec<Option<usize>> = vec![None; n_objects];
    let mut d: Vec<u64> = Vec::new();
    for (i, &o) in seq.iter().enumerate() {
        if let Some(p) = last[o as usize] {
            // Distinct objects whose last reference lies strictly between p and i.
            d.push(tree.prefix(i) - tree.prefix(p + 1));
            tree.add(p, -1);
        }
        tree.add(i, 1);
        last[o as usize] = Some(i);
    }
    let mut s = LocalityStats {
        rereferences: d.len() as u64,
        ..LocalityStats::default()
    };
    if d.is_empty() {
        return s;
    }
    let within = |lim: u64| {
        share(
            d.iter().filter(|&&x| x < lim).count() as u64,
            d.len() as u64,
        )
    };
    s.within_10 = within(10);
    s.within_100 = within(100);
    s.within_1000 = within(1000);
    d.sort_unstable();
    s.median = quantile(&d, 0.5);
    s.p90 = quantile(&d, 0.9);
    s
}

/// A Fenwick (binary indexed) tree of counts.
struct Fenwick(Vec<i64>);

impl Fenwick {
    fn new(n: usize) -> Self {
        Fenwick(vec![0; n + 1])
    }

    fn add(&mut self, i: usize, v: i64) {
        let mut i = i + 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }

    /// Sum over positions `0..i`.
    fn prefix(&self, i: usize) -> u64 {
        let mut i = i;
        let mut s = 0;
        while i > 0 {
            s += self.0[i];
            i -= i & i.wrapping_neg();
        }
        s.max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64, url: &str, bytes: u64) -> LogRecord {
        LogRecord {
            time_ms: t,
            elapsed_ms: 0,
            client: "c".into(),
            code: "TCP_MISS".into(),
            status: 200,
            bytes,
            method: "GET".into(),
            url: url.into(),
            hierarchy: "-".into(),
            peer: "-".into(),
            content_type: "-".into(),
        }
    }

    #[test]
    fn hosts() {
        assert_eq!(
            host_of("http://WWW.A.br:8080/x").as_deref(),
            Some("www.a.br")
        );
        assert_eq!(host_of("http://u:p@h.com/").as_deref(), Some("h.com"));
        assert_eq!(host_of("a.com:443").as_deref(), Some("a.com"));
        assert_eq!(host_of("http://[::1]:80/").as_deref(), Some("::1"));
        assert_eq!(host_of("http:///x"), None);
        assert!(matches("www.a.br", ".br") && matches("br", ".br") && !matches("abr", ".br"));
    }

    #[test]
    fn four_parameters_by_hand() {
        // .br: a a a b b c  -> hot {a, b}, hot ratio 5/6; .com: x y -> no hot set.
        let urls = [
            "http://a.br/a",
            "http://x.com/x",
            "http://a.br/a",
            "http://a.br/b",
            "http://a.br/c",
            "http://a.br/a",
            "http://y.com/y",
            "http://a.br/b",
            "http://z.org/?q",
        ];
        let recs = urls
            .iter()
            .enumerate()
            .map(|(i, u)| rec(i as u64 * 1000, u, 100 * (i as u64 + 1)));
        let c = characterize(
            recs,
            &[vec![".br".into()], vec![".com".into()]],
            &BadLines::new(),
        );
        assert_eq!(c.groups.len(), 3);
        let br = &c.groups[0];
        assert_eq!(br.requests, 6);
        assert!((br.domain_ratio - 6.0 / 9.0).abs() < 1e-9);
        assert_eq!(br.hot_set_size, 2);
        assert!((br.hot_ratio - 5.0 / 6.0).abs() < 1e-9);
        // Counts 3, 2: slope ln(3/2)/ln 2.
        assert!((br.hot_set_popularity - (1.5f64).ln() / 2f64.ln()).abs() < 1e-9);
        assert!((br.inherent_hit_ratio - 3.0 / 6.0).abs() < 1e-9);
        assert_eq!(br.unique_objects, 3);
        // a: max(100, 300, 600); b: max(400, 800); c: 500.
        assert_eq!(br.unique_bytes, 600 + 800 + 500);
        assert!((br.one_timer_objects - 1.0 / 3.0).abs() < 1e-9);
        // Stack distances: a@2 (x between, other group) -> 0 within .br;
        // a@5 (b, c) -> 2; b@7 (c, a) -> 2.
        assert_eq!(br.locality.rereferences, 3);
        assert_eq!(br.locality.median, 2);
        let com = &c.groups[1];
        assert_eq!((com.requests, com.hot_set_size), (2, 0));
        assert_eq!(c.groups[2].name, "rest");
        assert_eq!(c.groups[2].cacheable, 0.0);
        assert_eq!(c.overall.requests, 9);
        // Overall: a@2 has x in between -> 1.
        assert_eq!(c.overall.locality.rereferences, 3);
        assert!((c.overall.rate.mean_per_s - 9.0 / 8.0).abs() < 1e-9);
    }

    #[test]
    fn locality_matches_a_naive_lru_stack() {
        let seq: Vec<u32> = (0..2000u32)
            .map(|i| (i * 7919 + i / 3) % 97 % (1 + i % 50))
            .collect();
        let n = 97;
        let fast = {
            let mut tree = Fenwick::new(seq.len());
            let mut last = vec![None; n];
            let mut d = Vec::new();
            for (i, &o) in seq.iter().enumerate() {
                if let Some(p) = last[o as usize] {
                    d.push(tree.prefix(i) - tree.prefix(p + 1));
                    tree.add(p, -1);
                }
                tree.add(i, 1);
                last[o as usize] = Some(i);
            }
            d
        };
        let mut stack: Vec<u32> = Vec::new();
        let mut naive = Vec::new();
        for &o in &seq {
            if let Some(pos) = stack.iter().rposition(|&s| s == o) {
                naive.push((stack.len() - 1 - pos) as u64);
                stack.remove(pos);
            }
            stack.push(o);
        }
        assert_eq!(fast, naive);
        assert!(locality(&seq, n).rereferences > 0);
    }

    #[test]
    fn pareto_fit_recovers_alpha() {
        // Deterministic Pareto(1.1, 3072) quantiles.
        let recs = (0..20_000u64).map(|i| {
            let u = (i as f64 + 0.5) / 20_000.0;
            let size = (3072.0 / (1.0 - u).powf(1.0 / 1.1)) as u64;
            rec(i, &format!("http://a.br/{i}"), size)
        });
        let c = characterize(recs, &[], &BadLines::new());
        let s = &c.overall.sizes;
        assert!((s.pareto_alpha - 1.1).abs() < 0.05, "{s:?}");
        assert!((5200..6000).contains(&s.median), "{s:?}");
        assert_eq!(c.overall.one_timer_objects, 1.0);
    }

    #[test]
    fn json_round_trip() {
        let recs = (0..50u64).map(|i| rec(i * 10, &format!("http://a.br/{}", i % 7), i));
        let mut bad = BadLines::new();
        bad.insert(crate::log::BadReason::BadTime, 3);
        let c = characterize(recs, &[vec![".br".into()]], &bad);
        let json = serde_json::to_string(&c).unwrap();
        let back: Characterization = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert!(json.contains("bad_time"));
    }
}
