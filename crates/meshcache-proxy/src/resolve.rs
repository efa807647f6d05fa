//! Name resolution for origins: the static host table (`dns.hosts`), then the system resolver,
//! with answers kept for `dns.positive_ttl` (failures for `dns.negative_ttl`).
//!
//! One resolver serves both the access rules (a `dst` matcher, and the check that a client off
//! this host does not reach loopback through the proxy) and the connections to origins, so the
//! address a rule saw is the address the connection goes to while the answer is kept: a name
//! that changes its address between the check and the connection cannot slip past the rule.
//! The system resolver gives no TTLs; the kept answers are bounded in number and age.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::DnsConfig;

/// The most names kept at once; past it, expired answers go, then everything.
const MAX_KEPT: usize = 10_000;

/// Resolves host names to addresses.
pub(crate) struct Resolver {
    /// The static host table, names lower-case without a trailing dot.
    hosts: HashMap<String, IpAddr>,
    kept: Mutex<HashMap<Box<str>, Kept>>,
    positive_ttl: Duration,
    negative_ttl: Duration,
}

#[derive(Clone)]
struct Kept {
    /// The addresses; empty when the name did not resolve.
    addrs: Arc<[IpAddr]>,
    until: Instant,
    /// The resolver's error, for a failure.
    error: Option<Arc<str>>,
}

/// A name that did not resolve.
#[derive(Clone, Debug)]
pub(crate) struct ResolveError(pub Arc<str>);

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Resolver {
    /// A resolver with `dns`'s host table and lifetimes.
    pub(crate) fn new(dns: &DnsConfig) -> Self {
        let hosts = dns
            .hosts
            .iter()
            .map(|(name, ip)| {
                let name = name.strip_suffix('.').unwrap_or(name);
                (name.to_ascii_lowercase(), *ip)
            })
            .collect();
        Self {
            hosts,
            kept: Mutex::new(HashMap::new()),
            positive_ttl: dns.positive_ttl,
            negative_ttl: dns.negative_ttl,
        }
    }

    /// The address of an IP literal host (`10.0.0.1`, `[::1]`) or of a host in the static
    /// table: what is known without asking anyone.
    pub(crate) fn known(&self, host: &str) -> Option<IpAddr> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse() {
            return Some(ip);
        }
        if self.hosts.is_empty() {
            return None;
        }
        self.hosts
            .get(host.strip_suffix('.').unwrap_or(host))
            .copied()
    }

    /// The addresses of `host` (lower-case), in the resolver's order.
    pub(crate) async fn lookup(&self, host: &str) -> Result<Arc<[IpAddr]>, ResolveError> {
        if let Some(ip) = self.known(host) {
            return Ok(Arc::from([ip]));
        }
        let now = Instant::now();
        if let Some(kept) = self.kept.lock().get(host).filter(|k| k.until > now) {
            return match &kept.error {
                None => Ok(kept.addrs.clone()),
                Some(e) => Err(ResolveError(e.clone())),
            };
        }
        // Port 0: the system resolver wants one; only the addresses are kept.
        let answer = tokio::net::lookup_host((host, 0)).await;
        let kept = match answer {
            Ok(addrs) => {
                let mut list: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !list.contains(&a.ip()) {
                        list.push(a.ip());
                    }
                }
                if list.is_empty() {
                    Kept::failed(now + self.negative_ttl, "no addresses".into())
                } else {
                    Kept {
                        addrs: list.into(),
                        until: now + self.positive_ttl,
                        error: None,
                    }
                }
            }
            Err(e) => Kept::failed(now + self.negative_ttl, e.to_string().into()),
        };
        let result = match &kept.error {
            None => Ok(kept.addrs.clone()),
            Some(e) => Err(ResolveError(e.clone())),
        };
        if kept.until > now {
            let mut map = self.kept.lock();
            if map.len() >= MAX_KEPT {
                map.retain(|_, k| k.until > now);
                if map.len() >= MAX_KEPT {
                    map.clear();
                }
            }
            map.insert(host.into(), kept);
        }
        result
    }
}

impl Kept {
    fn failed(until: Instant, error: Arc<str>) -> Self {
        Self {
            addrs: Arc::from([]),
            until,
            error: Some(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_the_table_need_no_lookup() {
        let mut dns = DnsConfig::default();
        dns.hosts
            .insert("Origin.Test.".into(), "127.0.0.9".parse().expect("literal"));
        let r = Resolver::new(&dns);
        assert_eq!(
            r.known("10.1.2.3"),
            Some("10.1.2.3".parse().expect("literal"))
        );
        assert_eq!(r.known("[::1]"), Some("::1".parse().expect("literal")));
        assert_eq!(
            r.known("origin.test"),
            Some("127.0.0.9".parse().expect("literal"))
        );
        assert_eq!(r.known("other.test"), None);
        let addrs = r.lookup("localhost").await.expect("localhost resolves");
        assert!(addrs.iter().all(|a| a.is_loopback()), "{addrs:?}");
        assert!(r.lookup("no-such-host.invalid").await.is_err());
        // Kept: the second failure comes from memory.
        assert!(r.kept.lock().contains_key("no-such-host.invalid"));
    }
}
