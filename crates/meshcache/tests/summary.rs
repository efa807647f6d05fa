//! Summary Cache and Cache Digests between meshcache nodes: real nodes, real UDP and HTTP on
//! loopback, a real origin. A summary hit is queried (summary) or fetched (digest); a summary
//! miss costs no message; a false hit falls through without a client-visible error; a bad
//! summary is refused and the peer counts as a miss.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{bind, get, hier_of, start, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::{PeerConfig, Protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sibling(name: &str, http: SocketAddr, icp: Option<SocketAddr>) -> PeerConfig {
    PeerConfig::new(name, Role::Sibling, http, icp)
}

/// Waits (at most 10 s) until `node`'s summary of peer `i` satisfies `ok`.
async fn wait_summary(node: &Node, i: usize, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = node.stats().await;
        if ok(&s["summary"]["peers"][i]) {
            return;
        }
        assert!(Instant::now() < until, "{what}: {}", s["summary"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_cache_queries_only_peers_whose_summary_says_hit() {
    let origin = Origin::start().await.expect("origin");
    let tweak = |name: &str| {
        let name = name.to_owned();
        move |c: &mut meshcache_proxy::Config| {
            c.name = name;
            c.cooperation.protocol = Protocol::Summary;
            c.cooperation.summary_threshold = 0.01;
            // Sized for 100 documents: 1 % is one document, so every admission is sent.
            c.cooperation.summary_capacity = 100;
        }
    };
    let a = bind(true, tweak("a"));
    let b = bind(true, tweak("b"));
    let (a_http, a_icp, b_http, b_icp) = (a.addr, a.icp, b.addr, b.icp);
    let a = start(a, |c| c.peers = vec![sibling("b", b_http, b_icp)]);
    let b = start(b, |c| c.peers = vec![sibling("a", a_http, a_icp)]);
    // Each fetches the other's (empty) array at start.
    wait_summary(&a, 0, "a has b's array", |p| p["valid"] == true).await;
    wait_summary(&b, 0, "b has a's array", |p| p["valid"] == true).await;

    // b caches objects; its updates (1 % threshold: every admission) reach a's inbox, which a
    // named when it fetched b's array.
    let urls: Vec<String> = (0..20)
        .map(|i| origin.url(&format!("/sc{i}?size=300&cc=max-age=600")))
        .collect();
    for u in &urls {
        assert_eq!(get(b.addr, u).await.status, 200);
    }
    // Wait until b has sent everything it has to say, then until a has applied all of it. (The
    // document count a holds is estimated from the bits set, so it is only near 20.)
    let until = Instant::now() + Duration::from_secs(10);
    let sent = loop {
        let s = b.stats().await;
        let local = &s["summary"]["local"];
        if n(&local["entries"]) == 20 && n(&local["changed_since_update"]) == 0 {
            break n(&s["summary"]["updates_sent"]);
        }
        assert!(
            Instant::now() < until,
            "b summarises its 20: {}",
            s["summary"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(sent >= 1);
    wait_summary(&a, 0, "b's updates reach a", |p| {
        n(&p["stats"]["updates"]) == sent && p["valid"] == true
    })
    .await;
    let a_summary = a.stats().await["summary"].clone();
    assert!(a_summary["inbox"].is_string(), "{a_summary}");
    assert_eq!(n(&a_summary["inbox_received"]), sent, "{a_summary}");
    let held = &a.stats().await["summary"]["peers"][0];
    assert!(n(&held["entries"]).abs_diff(20) <= 3, "{held}");
    assert_eq!(n(&held["stats"]["gaps"]), 0, "{held}");
    let before = a.stats().await;
    assert_eq!(before["icp"]["queries_sent"], 0, "{before}");

    // A miss on a that b holds: one query, to b, and a SIBLING_HIT.
    let r = get(a.addr, &urls[3]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, meshcache_lab::expected_body(300));
    assert!(hier_of(&a, &urls[3]).await.starts_with("SIBLING_HIT/"));
    assert_eq!(
        origin.hits(&urls[3][urls[3].find("/sc").expect("path")..]),
        1
    );

    // Misses b does not hold: no query at all (unless a Bloom false positive), origin serves.
    for i in 0..30 {
        let u = origin.url(&format!("/elsewhere{i}?size=10"));
        assert_eq!(get(a.addr, &u).await.status, 200);
    }
    let s = a.stats().await;
    let sent = n(&s["icp"]["queries_sent"]);
    let lookups = n(&s["summary"]["peers"][0]["stats"]["lookups"]);
    let hits = n(&s["summary"]["peers"][0]["stats"]["summary_hits"]);
    assert_eq!(lookups, 31, "{s}");
    assert_eq!(sent, hits, "one query per summary hit: {s}");
    assert!(sent < 6, "30 misses should cost (almost) no queries: {s}");
    assert_eq!(
        n(&s["summary"]["peers"][0]["stats"]["false_hits"]),
        hits - 1,
        "every summary hit but the real one was false: {s}"
    );
    let local = &b.stats().await["summary"];
    assert!(n(&local["updates_sent"]) >= 1, "{local}");
    assert!(n(&local["served"]) >= 1, "{local}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_from_strangers_are_refused() {
    let origin = Origin::start().await.expect("origin");
    let a = bind(true, |c| {
        c.name = "a".into();
        c.cooperation.protocol = Protocol::Summary;
    });
    let b = bind(true, |c| {
        c.name = "b".into();
        c.cooperation.protocol = Protocol::Summary;
        c.cooperation.summary_capacity = 100;
    });
    let (a_http, a_icp, b_http, b_icp) = (a.addr, a.icp, b.addr, b.icp);
    let a = start(a, |c| c.peers = vec![sibling("b", b_http, b_icp)]);
    let b = start(b, |c| c.peers = vec![sibling("a", a_http, a_icp)]);
    wait_summary(&a, 0, "a has b's array", |p| p["valid"] == true).await;
    // An update from a socket that is not a peer's ICP address is refused and counted.
    let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let mut forged = Vec::new();
    meshcache_wire::summary::encode_dirupdate(
        &meshcache_wire::summary::DirUpdate {
            seq: 5,
            sender: std::net::Ipv4Addr::LOCALHOST,
            params: meshcache_wire::summary::HashParams {
                functions: 4,
                function_bits: 32,
                bits: 8,
            },
            updates: vec![],
        },
        &mut forged,
    )
    .expect("encode");
    stranger
        .send_to(&forged, a_icp.expect("icp"))
        .await
        .expect("send");
    // And to a's update inbox.
    let inbox: std::net::SocketAddr = a.stats().await["summary"]["inbox"]
        .as_str()
        .expect("a has an inbox")
        .parse()
        .expect("address");
    stranger.send_to(&forged, inbox).await.expect("send");
    // b's real updates still arrive.
    let u = origin.url("/repair?size=50&cc=max-age=600");
    get(b.addr, &u).await;
    wait_summary(&a, 0, "b's update reaches a", |p| n(&p["entries"]) == 1).await;
    let s = a.stats().await;
    assert_eq!(n(&s["summary"]["bad_updates"]), 2, "{s}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_digests_go_straight_to_the_peer_and_false_hits_fall_through() {
    let origin = Origin::start().await.expect("origin");
    let tweak = |name: &'static str| {
        move |c: &mut meshcache_proxy::Config| {
            c.name = name.into();
            c.cooperation.protocol = Protocol::Digest;
            c.cooperation.digest_rebuild_period = Duration::from_secs(1);
        }
    };
    let a = bind(false, tweak("a"));
    let b = bind(false, tweak("b"));
    let (a_http, b_http) = (a.addr, b.addr);
    let a = start(a, |c| c.peers = vec![sibling("b", b_http, None)]);
    let b = start(b, |c| c.peers = vec![sibling("a", a_http, None)]);

    // b's digest, served at Squid's URL, origin-form.
    let raw = common::raw(
        b_http,
        b"GET /squid-internal-periodic/store_digest HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200 Cache Digest OK\r\n"), "{raw}");
    assert!(raw
        .to_ascii_lowercase()
        .contains("content-type: application/cache-digest"));

    let urls: Vec<String> = (0..10)
        .map(|i| origin.url(&format!("/cd{i}?size=200&cc=max-age=600")))
        .collect();
    // One object goes stale at once: b keeps it (and advertises it) but will not serve it to
    // `only-if-cached`.
    let gone = origin.url("/cd-stale?size=200&cc=max-age=1");
    for u in urls.iter().chain([&gone]) {
        get(b.addr, u).await;
    }
    let admitted = Instant::now();
    // a refetches b's digest when it expires (1 s).
    wait_summary(&a, 0, "a has b's new digest", |p| n(&p["entries"]) == 11).await;
    let r = get(a.addr, &urls[0]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        hier_of(&a, &urls[0]).await,
        format!("CD_SIBLING_HIT/{}", b_http.ip())
    );
    let s = a.stats().await;
    assert_eq!(s["icp"]["queries_sent"], 0, "no ICP at all: {s}");

    // The stale one: a's fetch gets 504 and goes to the origin; the client sees a 200.
    tokio::time::sleep(
        (admitted + Duration::from_millis(1200)).saturating_duration_since(Instant::now()),
    )
    .await;
    let r = get(a.addr, &gone).await;
    assert_eq!(r.status, 200, "a false hit never reaches the client");
    let s = a.stats().await;
    let false_hits = n(&s["summary"]["peers"][0]["stats"]["false_hits"]);
    assert_eq!(
        hier_of(&a, &gone).await,
        format!("HIER_DIRECT/{}", origin.addr().ip())
    );
    assert_eq!(false_hits, 1, "{s}");
    a.stop().await;
    b.stop().await;
}

/// A peer that serves garbage at the digest URL.
async fn bogus_peer(body: &'static [u8]) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        for _ in 0..50 {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/cache-digest\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(body).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_digests_are_refused_and_the_peer_is_a_miss() {
    let origin = Origin::start().await.expect("origin");
    // A digest whose mask is all ones: over 65 % full.
    let mut full = meshcache_summary::CacheDigest::new(8, 5).encode();
    for b in &mut full[128..] {
        *b = 0xFF;
    }
    let full: &'static [u8] = Box::leak(full.into_boxed_slice());
    let too_full = bogus_peer(full).await;
    let truncated = bogus_peer(&[0, 5, 0, 3, 0, 0]).await;
    let a = bind(false, |c| {
        c.cooperation.protocol = Protocol::Digest;
    });
    let a = start(a, |c| {
        c.peers = vec![
            sibling("full", too_full, None),
            sibling("cut", truncated, None),
        ]
    });
    wait_summary(&a, 0, "the full digest is refused", |p| {
        n(&p["stats"]["rejected_too_full"]) >= 1
    })
    .await;
    wait_summary(&a, 1, "the truncated digest is refused", |p| {
        n(&p["stats"]["rejected_malformed"]) >= 1
    })
    .await;
    let u = origin.url("/after-bad?size=5");
    assert_eq!(get(a.addr, &u).await.status, 200);
    assert!(hier_of(&a, &u).await.starts_with("HIER_DIRECT/"));
    let s = a.stats().await;
    assert_eq!(s["summary"]["peers"][0]["valid"], false, "{s}");
    assert_eq!(n(&s["summary"]["peers"][0]["stats"]["lookups"]), 0, "{s}");
    a.stop().await;
}
