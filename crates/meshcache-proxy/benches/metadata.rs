//! Metadata overhead per cached object, measured: stores N small objects in a real `Cache` and
//! compares the process's resident memory growth with the bytes the objects carry (header names
//! and values, bodies). What is left is everything the cache spends to hold an object: the
//! store's index and policy node, the entry record, the `Arc`s, the header slice, allocator
//! overhead and the hash table's spare room. Not a timing benchmark.
//!
//! `cargo bench -p meshcache-proxy --bench metadata [-- N]` (default 200,000 objects). Each
//! case runs in a process of its own (resident memory does not shrink when a cache is dropped):
//! LRU and GDSF, objects with no headers and an empty body (the bookkeeping alone), and objects
//! with three headers and a 100-byte body. Allocations go through mimalloc, as in the
//! `meshcache` binary.
#![allow(missing_docs)]

use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use meshcache_proxy::cache::{Cache, CachedObject};
use meshcache_proxy::semantics::Freshness;
use meshcache_store::{Replacement, StoreConfig};

/// The allocator the `meshcache` binary uses, so its per-block overhead is the one measured.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// One case: `policy` (lru or gdsf), `headers` (0 or 3), in this process.
fn measure(n: usize, replacement: Replacement, with_headers: bool) {
    let now = SystemTime::now();
    let request = Request::get("http://o.example/").body(()).expect("request");
    let (req_parts, ()) = request.into_parts();
    let cache = Cache::new(StoreConfig {
        capacity: 16 << 30,
        max_object_size: 1 << 20,
        replacement,
    });
    let mut payload = 0u64;
    let before = resident_bytes();
    let mut half = (0, 0);
    for i in 0..n {
        if i == n / 2 {
            half = (resident_bytes(), payload);
        }
        let mut headers = HeaderMap::new();
        // Freshness needs a lifetime; without stored headers it is computed from these and
        // the headers are then dropped.
        let mut exchange = HeaderMap::new();
        exchange.insert("cache-control", HeaderValue::from_static("max-age=3600"));
        let body = if with_headers {
            headers.insert("content-type", HeaderValue::from_static("text/html"));
            headers.insert("cache-control", HeaderValue::from_static("max-age=3600"));
            headers.insert(
                "etag",
                HeaderValue::from_str(&format!("\"{i:08x}\"")).expect("etag"),
            );
            Bytes::from(vec![b'x'; 100])
        } else {
            Bytes::new()
        };
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::OK;
        *resp.headers_mut() = exchange;
        let (resp_parts, ()) = resp.into_parts();
        let freshness =
            Freshness::for_exchange(&req_parts, resp_parts.status, &resp_parts.headers, now, 0.1)
                .expect("storable");
        payload += body.len() as u64
            + headers
                .iter()
                .map(|(k, v)| (k.as_str().len() + v.len()) as u64)
                .sum::<u64>();
        let url = format!("http://o.example/object/{i}");
        cache.insert(
            &url,
            &HeaderMap::new(),
            CachedObject::new(StatusCode::OK, &headers, body, freshness),
        );
    }
    let after = resident_bytes();
    let grown = after.saturating_sub(before);
    let stats = cache.stats();
    assert_eq!(stats.objects, n as u64, "every object stored");
    // The second half's growth per object: what one more object costs, without the costs paid
    // once (the allocator's first arenas, the event channel's ring).
    let second_half = (n - n / 2) as f64;
    let marginal = (after.saturating_sub(half.0) as f64 - (payload - half.1) as f64) / second_half;
    println!(
        "{replacement:5} {:<22} {n} objects: resident +{:6.1} MiB, payload {:5.1} MiB: {:4.0} bytes of overhead per object ({marginal:4.0} per object in the second half)",
        if with_headers { "3 headers, 100 B body" } else { "no headers, no body" },
        grown as f64 / (1 << 20) as f64,
        payload as f64 / (1 << 20) as f64,
        (grown as f64 - payload as f64) / n as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(200_000);
    if let Some(case) = args.iter().find_map(|a| a.strip_prefix("--case=")) {
        let (policy, headers) = case.split_once(',').expect("--case=POLICY,HEADERS");
        let replacement = if policy == "gdsf" {
            Replacement::Gdsf
        } else {
            Replacement::Lru
        };
        measure(n, replacement, headers == "3");
        return;
    }
    let me = std::env::current_exe().expect("own path");
    for case in ["lru,0", "gdsf,0", "lru,3", "gdsf,3"] {
        let status = std::process::Command::new(&me)
            .arg(format!("--case={case}"))
            .arg(n.to_string())
            .status()
            .expect("runs");
        assert!(status.success(), "case {case}");
    }
}
