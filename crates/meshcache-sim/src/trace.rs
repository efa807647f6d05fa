//! The trace as the engine wants it: URLs interned once into objects (store key, host, origin
//! server), requests as small fixed records.

use std::collections::HashMap;

use meshcache_store::StoreKey;
use meshcache_workload::Request;

/// One distinct URL of the trace.
#[derive(Clone, Debug)]
pub struct Object {
    /// The absolute URL.
    pub url: String,
    /// Its host, without port (what per-domain parents match).
    pub host: String,
    /// The store key (MD5 of method and URL, as the proxy and Squid compute it).
    pub key: StoreKey,
    /// Whether a cache may keep it (URLs the origin marks `no-store`, `private` or `no-cache`
    /// through `cc=` in their query string are not).
    pub cacheable: bool,
    /// Which origin server hosts it.
    pub server: u32,
}

/// One request of the trace. It carries a copy of what the engine reads of its object on
/// every request (store key, cacheability, origin server, URL length): one record read per
/// request instead of two, the object's being a likely cache miss in a large trace. A record
/// fills one cache line exactly (53 bytes of fields would otherwise straddle two lines in
/// most places of the array, two misses per request).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub struct Req {
    /// When it is issued, in ns from the start (timed replay).
    pub time_ns: u64,
    /// The client that issues it, as the trace numbers it (client `c` uses cache `c mod
    /// caches`).
    pub client: u32,
    /// The same client numbered densely from 0 in order of appearance (`0..Trace::clients`).
    pub slot: u32,
    /// The object.
    pub obj: u32,
    /// The response body's length.
    pub size: u64,
    /// The object's store key ([`Object::key`]).
    pub key: StoreKey,
    /// The object's origin server ([`Object::server`]).
    pub server: u32,
    /// The length of the object's URL (what ICP messages carry).
    pub url_len: u32,
    /// Whether a cache may keep the object ([`Object::cacheable`]).
    pub cacheable: bool,
}

/// A trace ready to replay.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Distinct objects.
    pub objects: Vec<Object>,
    /// Requests, in trace order.
    pub requests: Vec<Req>,
    /// Number of distinct clients.
    pub clients: u32,
}

/// The host of an absolute `http://` URL, without port or user info.
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn cacheable(url: &str) -> bool {
    let Some((_, query)) = url.split_once('?') else {
        return true;
    };
    !query.split('&').any(|kv| {
        kv.strip_prefix("cc=").is_some_and(|cc| {
            cc.contains("no-store") || cc.contains("private") || cc.contains("no-cache")
        })
    })
}

impl Trace {
    /// Interns `requests` (of `meshcache workload generate`, or a log), keeping the first
    /// `limit` (0: all). Origin servers are picked by a hash of the host, `servers` of them.
    pub fn new(requests: &[Request], limit: u64, servers: u32) -> Trace {
        let n = if limit == 0 {
            requests.len()
        } else {
            requests.len().min(limit as usize)
        };
        let mut index: HashMap<&str, u32> = HashMap::new();
        let mut objects = Vec::new();
        let mut out = Vec::with_capacity(n);
        let mut slots: HashMap<u32, u32> = HashMap::new();
        for r in &requests[..n] {
            let obj = *index.entry(r.url.as_str()).or_insert_with(|| {
                let host = host_of(&r.url).to_owned();
                let server = fnv(host.as_bytes()) % u64::from(servers.max(1));
                objects.push(Object {
                    key: StoreKey::get(&r.url),
                    cacheable: cacheable(&r.url),
                    url: r.url.clone(),
                    host,
                    server: server as u32,
                });
                (objects.len() - 1) as u32
            });
            let next = slots.len() as u32;
            let slot = *slots.entry(r.client).or_insert(next);
            let o = &objects[obj as usize];
            out.push(Req {
                time_ns: r.time_ms.saturating_mul(1_000_000),
                client: r.client,
                slot,
                obj,
                size: r.size,
                key: o.key,
                server: o.server,
                url_len: u32::try_from(o.url.len()).unwrap_or(u32::MAX),
                cacheable: o.cacheable,
            });
        }
        Trace {
            objects,
            requests: out,
            clients: slots.len() as u32,
        }
    }

    /// Distinct bytes: the sum of each object's size (its first request's).
    pub fn unique_bytes(&self) -> u64 {
        let mut seen = vec![false; self.objects.len()];
        let mut total = 0;
        for r in &self.requests {
            if !std::mem::replace(&mut seen[r.obj as usize], true) {
                total += r.size;
            }
        }
        total
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_cacheability() {
        assert_eq!(host_of("http://a.example:8080/x?y"), "a.example");
        assert_eq!(host_of("http://u@b.example/x"), "b.example");
        assert_eq!(host_of("http://c.example"), "c.example");
        assert!(cacheable("http://a/o1?size=10"));
        assert!(!cacheable("http://a/o1?size=10&cc=no-store"));
        assert!(cacheable("http://a/o1?size=10&cc=max-age%3D60"));
    }

    #[test]
    fn urls_are_interned() {
        let req = |client, url: &str| Request {
            time_ms: 1,
            client,
            size: 5,
            url: url.into(),
        };
        let t = Trace::new(
            &[
                req(0, "http://a/1"),
                req(3, "http://a/2"),
                req(1, "http://a/1"),
            ],
            0,
            3,
        );
        assert_eq!(t.objects.len(), 2);
        assert_eq!(t.clients, 3);
        assert_eq!(
            t.requests
                .iter()
                .map(|r| (r.client, r.slot))
                .collect::<Vec<_>>(),
            [(0, 0), (3, 1), (1, 2)]
        );
        assert_eq!(t.requests[2].obj, 0);
        assert_eq!(t.requests[0].time_ns, 1_000_000);
        assert_eq!(t.unique_bytes(), 10);
        // Client numbers are names: the largest one costs nothing.
        let t = Trace::new(&[req(u32::MAX, "http://a/1")], 0, 1);
        assert_eq!((t.clients, t.requests[0].slot), (1, 0));
        assert_eq!(
            Trace::new(&[req(0, "http://a/1"), req(0, "http://a/2")], 1, 1)
                .requests
                .len(),
            1
        );
    }
}
