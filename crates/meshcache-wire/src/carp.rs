//! CARP v1 (Cache Array Routing Protocol) hashing, computed exactly as Squid 5.7 does.
//!
//! CARP spreads URLs over an array of parent caches without any query: every member gets a
//! score for the URL, and the request goes to the highest score. The same URL always scores
//! the same, so each parent ends up holding its own slice of the URL space instead of every
//! parent caching everything. The scheme comes from draft-vinod-carp-v1-03 (Valloppillil &
//! Ross, 1998); this module follows Squid's `src/carp.cc`, which differs from the draft in
//! ways that change which parent is picked, so that a meshcache node and a Squid configured
//! with the same parents (`cache_peer … parent … carp`) send every URL to the same parent.
//!
//! The pieces, all on 32-bit unsigned integers that wrap:
//!
//! - [`url_hash`]: `h = h + rotl(h, 19) + c` over the key's bytes, starting at 0. Squid adds
//!   each byte as an x86 `char`, which is **signed**: a byte ≥ 0x80 is added as `byte − 256`.
//! - [`member_hash`]: the same loop over the member's name, then `h += h × 0x62531965` and
//!   `h = rotl(h, 21)`.
//! - [`combine`]: `c = url ^ member`, then the same multiply and rotate.
//! - [`multipliers`]: each member's load-factor multiplier `X_k`, from the draft's recurrence
//!   in double precision, members taken in ascending weight order; the score of a member is
//!   `combined × X_k` ([`Score`]).
//! - [`carp_key`]: the key Squid hashes by default, the request's effective URI.
//!
//! [`CarpArray`] puts them together. It replicates Squid's **cumulative URL hash**: Squid never
//! resets the URL hash between members, so the member at position *i* of the weight-sorted list
//! hashes the key *i* times in a chain ([`url_hash_from`]). Only the first member's score is the
//! draft's. [`CarpArray::choose`] returns Squid's pick; [`CarpArray::order`] returns every
//! member from best to worst, which is our extension for failover: the draft says to use the
//! "next highest" member when the best is unreachable, while Squid has no CARP-level retry
//! (it falls back to its other parent-selection methods).
//!
//! Two consequences of Squid's arithmetic that the tests pin down:
//!
//! - Removing a member from the array re-chains the URL hash of every member after it in
//!   sorted order, so unlike textbook rendezvous hashing, URLs owned by other members can move.
//!   A member that is merely *down* stays in the array (it is only skipped), and then exactly
//!   the URLs it owned move.
//! - A member whose share of the total weight is under 0.1 % gets a load factor of 0, which
//!   makes the recurrence divide by zero: its multiplier is 0, the next member's is +∞, and
//!   every later member's is NaN (see [`multipliers`]). Squid then never picks the NaN members.
//!
//! Everything here is pure: no I/O, no clock, no global state.

/// The draft's mixing constant, used by [`member_hash`] and [`combine`].
pub const MIX: u32 = 0x6253_1965;

/// Continues the draft's URL hash over `key`, starting from `seed` instead of 0.
///
/// Each byte is added as an x86 C `char` (signed): bytes 0x80..=0xFF count as −128..=−1, that
/// is `0xFFFF_FF00 | byte` in 32 bits. [`CarpArray`] uses this to reproduce Squid's chaining:
/// member *i* in sorted order hashes the key starting from member *i − 1*'s value.
pub fn url_hash_from(seed: u32, key: &[u8]) -> u32 {
    key.iter().fold(seed, |h, &b| {
        // Sign-extend, as adding a `char` to an `unsigned` does on x86.
        let c = b as i8 as u32;
        // `h + rotl(h, 19) + c`, added in the order that lets the rotation and the first
        // addition run side by side: Squid's chaining hashes the key once per member, so this
        // loop is most of a CARP route's cost.
        h.wrapping_add(c).wrapping_add(h.rotate_left(19))
    })
}

/// The draft's URL hash of `key` (a single pass from 0), bytes taken as signed chars.
pub fn url_hash(key: &[u8]) -> u32 {
    url_hash_from(0, key)
}

/// `h + h × MIX`, then a 21-bit left rotation: the final mix of member and combined hashes.
///
/// `h + h × 0x62531965` is `h × 0x62531966`, an even number, so bit 21 of every member and
/// combined hash is 0.
fn mix(h: u32) -> u32 {
    h.wrapping_add(h.wrapping_mul(MIX)).rotate_left(21)
}

/// A member's hash: the URL hash loop over its name, then the final mix.
///
/// Squid hashes the `cache_peer` line's `name=` value, or else the host exactly as written in
/// `squid.conf` (neither lower-cased nor resolved), so the name must be byte-identical to
/// Squid's to pick the same member.
pub fn member_hash(name: &[u8]) -> u32 {
    mix(url_hash(name))
}

/// The combined hash of a URL hash and a member hash: XOR, then the final mix.
pub fn combine(url_hash: u32, member_hash: u32) -> u32 {
    mix(url_hash ^ member_hash)
}

/// Each member's load factor as Squid computes it, in the input order: `weight / Σ weights`,
/// except that a factor under 0.1 % (`floor(factor × 1000) == 0`) becomes 0.
///
/// Members of weight 0 are not in Squid's array at all: they get 0 and add nothing to the sum.
pub fn load_factors(weights: &[u32]) -> Vec<f64> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    weights
        .iter()
        .map(|&w| {
            if w == 0 {
                return 0.0;
            }
            let factor = f64::from(w) / total as f64;
            // floor(factor × 1000) == 0, for a factor that is never negative.
            if factor * 1000.0 < 1.0 {
                0.0
            } else {
                factor
            }
        })
        .collect()
}

/// Squid's evaluation order: indices of the members of weight > 0, by ascending weight, ties in
/// input order (Squid uses C `qsort`, whose order among equal weights glibc keeps in practice
/// but does not guarantee).
pub fn sorted_order(weights: &[u32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
    order.sort_by_key(|&i| weights[i]);
    order
}

/// The load-factor multipliers `X_k` of members with these weights, in the input order.
///
/// The draft's recurrence, in double precision as Squid computes it: members of weight > 0 are
/// taken by ascending weight ([`sorted_order`]); with `K` of them, `P_k` their [`load_factors`],
/// `X_0 = 0`, `P_0 = 0` and an empty product of 1, for k = 1..K:
///
/// ```text
/// X_k = ( (K−k+1)·(P_k − P_{k−1}) / (X_1·…·X_{k−1}) + X_{k−1}^(K−k+1) )^(1/(K−k+1))
/// ```
///
/// (the draft's 32-bit floats would round differently). Members of weight 0 get 0.
///
/// The result is not always finite, because Squid's is not: a member whose load factor the
/// 0.1 % rule zeroed gets multiplier 0, which zeroes the running product; the next member then
/// divides by 0 and gets +∞ (or NaN if its own factor is 0 too), and every member after that
/// gets NaN. For weights `[1, 1000, 1000]` the multipliers are `[0, +∞, NaN]`.
pub fn multipliers(weights: &[u32]) -> Vec<f64> {
    let factors = load_factors(weights);
    let order = sorted_order(weights);
    let mut out = vec![0.0; weights.len()];
    let k_total = order.len();
    let (mut p_last, mut x_last, mut product) = (0.0_f64, 0.0_f64, 1.0_f64);
    for (pos, &i) in order.iter().enumerate() {
        // K − k + 1, with k = pos + 1.
        let kk1 = (k_total - pos) as f64;
        let mut x = (kk1 * (factors[i] - p_last)) / product;
        x += x_last.powf(kk1);
        x = x.powf(1.0 / kk1);
        product *= x;
        x_last = x;
        p_last = factors[i];
        out[i] = x;
    }
    out
}

/// The key Squid hashes by default: the request's effective URI,
/// `scheme://host[:port]/path?query`.
///
/// Squid's URL parser lower-cases the scheme and host and drops the host's trailing dots
/// before the URI is printed back, and the port is printed only when it is not the scheme's
/// default (http 80, https 443, ftp 21, gopher 70, wais 210, whois 43). User information
/// before `@` is dropped; an empty path becomes `/`; the path and query are kept byte for byte.
/// A CONNECT target (`host:port` with a numeric port, no scheme) keeps its port. Anything else
/// (no `scheme://` and not such a target) is returned unchanged. IPv6 literals keep their brackets and are
/// only lower-cased, not rewritten in Squid's canonical form.
///
/// Applying it twice gives the same key as applying it once.
pub fn carp_key(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if is_scheme(scheme) {
            let scheme = scheme.to_ascii_lowercase();
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = split_host_port(host_port);
            let mut key = String::with_capacity(url.len() + 1);
            key.push_str(&scheme);
            key.push_str("://");
            key.push_str(&normalize_host(host));
            if let Some(port) = port.filter(|p| !p.is_empty()) {
                let parsed = port.parse::<u16>().ok();
                if parsed.is_none() || parsed != default_port(&scheme) {
                    key.push(':');
                    match parsed {
                        Some(p) => key.push_str(&p.to_string()),
                        None => key.push_str(port),
                    }
                }
            }
            if !tail.starts_with('/') {
                key.push('/');
            }
            key.push_str(tail);
            return key;
        }
    }
    if url.contains(['/', '?', '#', '@']) {
        return url.to_owned();
    }
    // A CONNECT target: host:port, the port always printed.
    match split_host_port(url) {
        (host, Some(port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            let mut key = normalize_host(host);
            key.push(':');
            match port.parse::<u16>() {
                Ok(p) => key.push_str(&p.to_string()),
                Err(_) => key.push_str(port),
            }
            key
        }
        _ => url.to_owned(),
    }
}

/// RFC 3986 scheme syntax: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// Splits `host[:port]`, `[v6]` or `[v6]:port`; an unbracketed host with several colons (an
/// IPv6 address) has no port.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    if s.starts_with('[') {
        if let Some(close) = s.find(']') {
            let (host, rest) = s.split_at(close + 1);
            return (host, rest.strip_prefix(':'));
        }
        return (s, None);
    }
    match s.split_once(':') {
        Some((host, port)) if !port.contains(':') => (host, Some(port)),
        _ => (s, None),
    }
}

/// Lower-cases a host and drops its trailing dots, as Squid's URL parser does.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The default port of the schemes Squid knows one for.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        "ftp" => Some(21),
        "gopher" => Some(70),
        "wais" => Some(210),
        "whois" => Some(43),
        _ => None,
    }
}

/// One member of a [`CarpArray`], with what Squid's `mgr:carp` page shows for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// The name hashed (Squid's `name=`, or the host as written).
    pub name: Vec<u8>,
    /// Its configured weight; 0 keeps it out of Squid's array.
    pub weight: u32,
    /// [`member_hash`] of the name.
    pub hash: u32,
    /// Its load factor ([`load_factors`]).
    pub load_factor: f64,
    /// Its load-factor multiplier ([`multipliers`]); may be 0, +∞ or NaN under the 0.1 % rule.
    pub multiplier: f64,
}

/// How one member scored for one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// Index of the member, in the order the array was built from.
    pub member: usize,
    /// The URL hash Squid uses for this member: the key hashed once per member up to and
    /// including this one in sorted order. For a member of weight 0 (not in Squid's array),
    /// the single-pass [`url_hash`].
    pub url_hash: u32,
    /// [`combine`] of that URL hash and the member's hash.
    pub combined: u32,
    /// `combined × multiplier`, in double precision; Squid picks only a score above 0.
    pub score: f64,
}

/// A CARP array: the members, their hashes and multipliers, computed once; scoring a key is
/// then O(members × key length).
#[derive(Clone, Debug, PartialEq)]
pub struct CarpArray {
    members: Vec<Member>,
    /// Members of weight > 0 in Squid's evaluation order.
    sorted: Vec<usize>,
}

impl CarpArray {
    /// Builds the array from `(name, weight)` pairs; members keep their index in this order.
    pub fn new<I, N>(members: I) -> Self
    where
        I: IntoIterator<Item = (N, u32)>,
        N: AsRef<[u8]>,
    {
        let pairs: Vec<(Vec<u8>, u32)> = members
            .into_iter()
            .map(|(name, weight)| (name.as_ref().to_vec(), weight))
            .collect();
        let weights: Vec<u32> = pairs.iter().map(|(_, w)| *w).collect();
        let factors = load_factors(&weights);
        let multipliers = multipliers(&weights);
        let members = pairs
            .into_iter()
            .zip(factors.into_iter().zip(multipliers))
            .map(|((name, weight), (load_factor, multiplier))| Member {
                hash: member_hash(&name),
                name,
                weight,
                load_factor,
                multiplier,
            })
            .collect();
        CarpArray {
            members,
            sorted: sorted_order(&weights),
        }
    }

    /// The members, in the order the array was built from.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Number of members (including those of weight 0).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the array has no member at all.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Squid's evaluation order: members of weight > 0 by ascending weight, ties in build order.
    pub fn sorted(&self) -> &[usize] {
        &self.sorted
    }

    /// Every member of weight > 0 scored for `key`, in Squid's evaluation order, with the
    /// chained URL hash Squid uses for each.
    pub fn scores(&self, key: &[u8]) -> Vec<Score> {
        self.scored(key).collect()
    }

    /// [`CarpArray::scores`], one at a time.
    fn scored<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = Score> + 'a {
        let mut url = 0;
        self.sorted.iter().map(move |&i| {
            let m = &self.members[i];
            url = url_hash_from(url, key);
            let combined = combine(url, m.hash);
            Score {
                member: i,
                url_hash: url,
                combined,
                score: f64::from(combined) * m.multiplier,
            }
        })
    }

    /// The member Squid picks for `key` among those `usable` admits: the highest score above
    /// 0, the earlier member in sorted order on a tie; `None` if no usable member scores above
    /// 0 (Squid then falls back to its other ways of choosing a parent).
    pub fn choose(&self, key: &[u8], usable: impl Fn(usize) -> bool) -> Option<usize> {
        let mut best = None;
        let mut high = 0.0;
        for s in self.scored(key) {
            if s.score > high && usable(s.member) {
                best = Some(s.member);
                high = s.score;
            }
        }
        best
    }

    /// Every member, most preferred first, for `key`. The first usable member of this list is
    /// [`CarpArray::choose`]'s pick whenever Squid picks one.
    ///
    /// Members scoring above 0 come first, by descending score (ties keep sorted order), which
    /// is Squid's ranking; using the ones after the first as failover targets is our extension
    /// (the draft's "next highest"). Then come the members Squid would never pick for this
    /// key — weight 0, a multiplier of 0 or NaN under the 0.1 % rule, or a score of exactly 0 —
    /// heaviest first, then by descending combined hash so that their load still spreads
    /// across URLs, then in build order.
    pub fn order(&self, key: &[u8]) -> Vec<usize> {
        self.top(key, usize::MAX)
    }

    /// The first `k` members of [`CarpArray::order`] (all of them when there are fewer),
    /// without sorting the rest: a route that lists a few parents need not rank a thousand.
    /// Scoring is still O(members × key length), as Squid's.
    pub fn top(&self, key: &[u8], k: usize) -> Vec<usize> {
        // (score, position in evaluation order, member): the position keeps ties in sorted
        // order, as a stable sort by score would.
        type Ranked = (f64, usize, usize);
        let better = |a: &Ranked, b: &Ranked| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        // A short prefix is kept sorted as the scores come (most are below its last and cost
        // one comparison); a long one is selected and sorted at the end.
        let short = k <= SHORT_TOP;
        let mut head: Vec<Ranked> =
            Vec::with_capacity(if short { k + 1 } else { self.sorted.len() });
        // (weight, combined hash, member)
        let mut tail: Vec<(u32, u32, usize)> = Vec::new();
        for (position, s) in self.scored(key).enumerate() {
            if s.score <= 0.0 || s.score.is_nan() {
                tail.push((self.members[s.member].weight, s.combined, s.member));
                continue;
            }
            let r = (s.score, position, s.member);
            if !short {
                head.push(r);
            } else if head.len() < k || head.last().is_some_and(|l| better(&r, l).is_lt()) {
                // Positions only grow, so an equal score goes after the ones already here.
                let at = head.partition_point(|e| e.0.total_cmp(&r.0).is_ge());
                head.insert(at, r);
                head.truncate(k);
            }
        }
        if !short {
            smallest_first(&mut head, k, better);
        }
        let mut out: Vec<usize> = head.iter().take(k).map(|h| h.2).collect();
        if out.len() < k {
            let single = url_hash(key);
            tail.extend(
                self.members
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.weight == 0)
                    .map(|(i, m)| (0, combine(single, m.hash), i)),
            );
            let rest = k - out.len();
            smallest_first(&mut tail, rest, |a, b| {
                b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2))
            });
            out.extend(tail.iter().take(rest).map(|t| t.2));
        }
        out
    }
}

/// The longest prefix [`CarpArray::top`] keeps sorted as it scores.
const SHORT_TOP: usize = 64;

/// Puts the `k` least elements of `v` by `cmp` (a total order) first, in order; the rest
/// follow in no particular order.
fn smallest_first<T>(v: &mut [T], k: usize, mut cmp: impl FnMut(&T, &T) -> std::cmp::Ordering) {
    if k < v.len() {
        v.select_nth_unstable_by(k, &mut cmp);
        v[..k].sort_unstable_by(cmp);
    } else {
        v.sort_unstable_by(cmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_chars() {
        // One byte: 0 + rotl(0, 19) + c.
        assert_eq!(url_hash(b"\x7f"), 0x7f);
        assert_eq!(url_hash(b"\x80"), 0xFFFF_FF80);
        assert_eq!(url_hash(b"\xff"), 0xFFFF_FFFF);
    }

    #[test]
    fn chaining_continues_the_hash() {
        let key = b"http://a.test/";
        assert_eq!(url_hash_from(url_hash(key), b""), url_hash(key));
        let mut twice = key.to_vec();
        twice.extend_from_slice(key);
        assert_eq!(url_hash_from(url_hash(key), key), url_hash(&twice));
    }

    #[test]
    fn key_normalisation() {
        assert_eq!(
            carp_key("HTTP://WWW.Example.COM.:80/Index.html?Q=1"),
            "http://www.example.com/Index.html?Q=1"
        );
        assert_eq!(
            carp_key("http://user:pw@h.test:8080"),
            "http://h.test:8080/"
        );
        assert_eq!(carp_key("https://h.test:443?x"), "https://h.test/?x");
        assert_eq!(carp_key("http://[::1]:3128/"), "http://[::1]:3128/");
        assert_eq!(carp_key("Secure.Example:443"), "secure.example:443");
        assert_eq!(carp_key("/relative/Path"), "/relative/Path");
    }
}
