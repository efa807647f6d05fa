//! The neighbours of a node: how each is configured, whether it is up, and what it has done.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Index of a peer in the node's peer table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub usize);

/// What a peer is to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A sibling: we fetch only its hits (with `only-if-cached`).
    Sibling,
    /// A parent: it fetches our misses for us.
    Parent,
}

/// A configured peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerSpec {
    /// Name shown in logs and metrics.
    pub name: String,
    /// Sibling or parent.
    pub role: Role,
    /// Its HTTP proxy address.
    pub http: SocketAddr,
    /// Its ICP address; `None` means it speaks no ICP.
    pub icp: Option<SocketAddr>,
    /// Never query it (it may still be used as a parent).
    pub no_query: bool,
    /// Last-resort parent.
    pub default: bool,
    /// Balance requests among round-robin parents.
    pub round_robin: bool,
    /// Do not keep a local copy of what it serves.
    pub proxy_only: bool,
    /// Divides its RTT when ranking parent misses, and biases round-robin. At least 1.
    pub weight: u32,
    /// Only requests for these domains go to it (`.example.org` matches the domain and its
    /// subdomains, `example.org` only that host); empty means every domain. An entry written
    /// `!.example.org` excludes instead, as in Squid's `cache_peer_domain`: the first entry
    /// that matches decides, and a host no entry matches is served only if the last entry is
    /// an exclusion (so `["!.br"]` means "everything but .br").
    pub domains: Vec<String>,
}

impl PeerSpec {
    /// A peer with defaults for everything but name, role and addresses.
    pub fn new(name: &str, role: Role, http: SocketAddr, icp: Option<SocketAddr>) -> Self {
        PeerSpec {
            name: name.to_owned(),
            role,
            http,
            icp,
            no_query: false,
            default: false,
            round_robin: false,
            proxy_only: false,
            weight: 1,
            domains: Vec::new(),
        }
    }

    /// Whether requests for `host` may go to this peer.
    pub fn serves(&self, host: &str) -> bool {
        if self.domains.is_empty() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        for entry in &self.domains {
            let (exclude, d) = match entry.strip_prefix('!') {
                Some(d) => (true, d),
                None => (false, entry.as_str()),
            };
            let d = d.to_ascii_lowercase();
            let matches = match d.strip_prefix('.') {
                Some(suffix) => host == suffix || (host.ends_with(&d) && host.len() > d.len()),
                None => host == d,
            };
            if matches {
                return !exclude;
            }
        }
        self.domains.last().is_some_and(|d| d.starts_with('!'))
    }

    /// Whether we send it ICP queries at all.
    pub fn queried(&self) -> bool {
        self.icp.is_some() && !self.no_query
    }
}

/// Per-peer counters, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeerStats {
    /// ICP queries sent to it.
    pub queries: u64,
    /// Replies by kind: HIT, MISS, MISS_NOFETCH, DENIED, ERR.
    pub hits: u64,
    /// MISS replies.
    pub misses: u64,
    /// MISS_NOFETCH replies.
    pub miss_nofetch: u64,
    /// DENIED replies.
    pub denied: u64,
    /// ERR replies.
    pub errors: u64,
    /// Replies that came after we stopped waiting.
    pub late: u64,
    /// Queries it never answered in time.
    pub timeouts: u64,
    /// Requests forwarded to it.
    pub fetches: u64,
    /// Forwarded requests that failed (connect, timeout, stall).
    pub fetch_failures: u64,
    /// Queries it sent us.
    pub queries_received: u64,
}

/// Liveness and measurements of one peer.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its configuration.
    pub spec: PeerSpec,
    /// Average ICP round trip, milliseconds (Squid's running mean over at most 50 samples).
    pub rtt_ms: Option<u32>,
    rtt_samples: u32,
    /// When it last sent us an ICP reply.
    pub last_reply: Option<Instant>,
    /// When the oldest query it has not answered since its last reply was sent.
    pub unanswered_since: Option<Instant>,
    /// Set while its HTTP side is considered down: not chosen before this instant.
    pub down_until: Option<Instant>,
    /// Consecutive failed fetches.
    pub failures: u32,
    /// Requests routed to it by round-robin.
    pub rr_count: u64,
    /// The last query sent to it: request number, when, and whether a search waits for it.
    pub last_query: Option<(u32, Instant, bool)>,
    /// Counters.
    pub stats: PeerStats,
}

/// How long a peer's HTTP side is skipped after `failures` consecutive failures: 1 s, doubling
/// up to 30 s. When that passes, the next request probes it; one success restores it.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

impl Peer {
    /// A peer that has not been heard from yet.
    pub fn new(spec: PeerSpec) -> Self {
        Peer {
            spec,
            rtt_ms: None,
            rtt_samples: 0,
            last_reply: None,
            unanswered_since: None,
            down_until: None,
            failures: 0,
            rr_count: 0,
            last_query: None,
            stats: PeerStats::default(),
        }
    }

    /// Records an ICP round trip (samples outside 1..10000 ms are discarded, as Squid does).
    pub(crate) fn record_rtt(&mut self, sample: Duration) {
        let ms = u32::try_from(sample.as_millis()).unwrap_or(u32::MAX).max(1);
        if ms > 10_000 {
            return;
        }
        self.rtt_samples = (self.rtt_samples + 1).min(50);
        let n = self.rtt_samples;
        self.rtt_ms = Some(match self.rtt_ms {
            None => ms,
            Some(avg) => (avg * (n - 1) + ms) / n,
        });
    }

    /// ICP liveness: it has answered, and not stayed silent for `dead_after` since a query.
    pub fn icp_alive(&self, now: Instant, dead_after: Duration) -> bool {
        if self.last_reply.is_none() {
            return false;
        }
        match self.unanswered_since {
            Some(t) => now.saturating_duration_since(t) < dead_after,
            None => true,
        }
    }

    /// Whether a search for `host` asks it as a sibling.
    pub fn asked_as_sibling(&self, host: &str) -> bool {
        self.spec.role == Role::Sibling && self.spec.queried() && self.spec.serves(host)
    }

    /// Whether its HTTP side may be chosen now.
    pub fn http_up(&self, now: Instant) -> bool {
        self.down_until.is_none_or(|t| now >= t)
    }

    /// A fetch through it failed: back off.
    pub fn fetch_failed(&mut self, now: Instant) {
        self.failures += 1;
        self.stats.fetch_failures += 1;
        self.down_until = Some(now + backoff(self.failures));
    }

    /// A fetch through it worked: it is up.
    pub fn fetch_ok(&mut self) {
        self.failures = 0;
        self.down_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(domains: &[&str]) -> PeerSpec {
        let mut s = PeerSpec::new("p", Role::Parent, "127.0.0.1:1".parse().unwrap(), None);
        s.domains = domains.iter().map(|d| d.to_string()).collect();
        s
    }

    #[test]
    fn domain_matching() {
        assert!(spec(&[]).serves("anything.test"));
        let br = spec(&[".br", "example.org"]);
        assert!(br.serves("www.ufrj.br"));
        assert!(br.serves("BR"));
        assert!(br.serves("www.ufrj.br."));
        assert!(!br.serves("abr"));
        assert!(br.serves("example.org"));
        assert!(!br.serves("www.example.org"));
        let not_br = spec(&["!.br"]);
        assert!(!not_br.serves("www.ufmg.br"));
        assert!(not_br.serves("www.example.com"));
        let mixed = spec(&["!www.ufmg.br", ".br"]);
        assert!(!mixed.serves("www.ufmg.br"));
        assert!(mixed.serves("www.usp.br"));
        assert!(!mixed.serves("example.com"));
    }

    #[test]
    fn rtt_running_mean() {
        let mut p = Peer::new(spec(&[]));
        p.record_rtt(Duration::from_millis(10));
        p.record_rtt(Duration::from_millis(30));
        assert_eq!(p.rtt_ms, Some(20));
        p.record_rtt(Duration::from_secs(20));
        assert_eq!(p.rtt_ms, Some(20), "outliers are dropped");
    }

    #[test]
    fn liveness() {
        let t0 = Instant::now();
        let dead = Duration::from_secs(10);
        let mut p = Peer::new(spec(&[]));
        assert!(!p.icp_alive(t0, dead), "never heard from");
        p.last_reply = Some(t0);
        assert!(p.icp_alive(t0, dead));
        p.unanswered_since = Some(t0);
        assert!(p.icp_alive(t0 + Duration::from_secs(9), dead));
        assert!(!p.icp_alive(t0 + Duration::from_secs(10), dead));
    }

    #[test]
    fn backoff_and_recovery() {
        let t0 = Instant::now();
        let mut p = Peer::new(spec(&[]));
        p.fetch_failed(t0);
        assert!(!p.http_up(t0));
        assert!(p.http_up(t0 + Duration::from_secs(1)));
        p.fetch_failed(t0);
        assert!(!p.http_up(t0 + Duration::from_secs(1)));
        p.fetch_ok();
        assert!(p.http_up(t0));
        assert_eq!(backoff(10), Duration::from_secs(30));
    }
}
