//! A cooperation protocol written outside both drivers — "ask one sibling", the sibling a
//! hash of the URL picks — run unchanged by the proxy (real nodes, real ICP over loopback)
//! and by the simulator. It is the worked example of `docs/architecture.md`: a protocol is a
//! `SearchProtocol`, and neither driver names it.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use common::{bind, get, start_searching, wait_icp_alive};
use meshcache_dcm::engine::{Miss, SearchProtocol, Step};
use meshcache_dcm::{IcpMesh, PeerId, Role};
use meshcache_lab::Origin;
use meshcache_proxy::config::PeerConfig;
use meshcache_sim::spec::{NetSpec, Protocol, Replay};
use meshcache_sim::{Control, Sim, SimSpec, Trace};
use meshcache_workload::Request;

/// The toy protocol: a miss asks one sibling by ICP, the one `pick` names; its HIT sends the
/// request there, its MISS (or silence until the deadline) to the parents or the origin.
/// Replies and deadlines are ICP's own, so `begin` is all there is to write.
struct OneSibling;

/// The sibling of `siblings` (in peer-table order) that `url` hashes to (FNV-1a).
fn pick(url: &str, siblings: usize) -> usize {
    let hash = url.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % siblings as u64) as usize
}

impl SearchProtocol for OneSibling {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        let siblings: Vec<PeerId> = (0..mesh.peers().len())
            .map(PeerId)
            .filter(|id| mesh.peers()[id.0].spec.role == Role::Sibling)
            .collect();
        let asked: Vec<PeerId> = match siblings.len() {
            0 => Vec::new(),
            n => vec![siblings[pick(miss.url, n)]],
        };
        mesh.begin_among(now, miss.url, miss.host, miss.hierarchical, &asked)
            .into()
    }
}

/// The proxy: node `a` runs the toy protocol among siblings `b` and `c` (which run ICP). A miss
/// at `a` sends one query, to the sibling the URL hashes to, and is served by it when it holds
/// the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_runs_a_protocol_it_does_not_know() {
    let origin = Origin::start().await.expect("origin");
    let names = ["a", "b", "c"];
    let bound: Vec<_> = names
        .iter()
        .map(|n| bind(true, |c| c.name = (*n).into()))
        .collect();
    let addrs: Vec<_> = bound.iter().map(|b| (b.addr, b.icp)).collect();
    let peers_of = |i: usize| -> Vec<PeerConfig> {
        (0..names.len())
            .filter(|&j| j != i)
            .map(|j| PeerConfig::new(names[j], Role::Sibling, addrs[j].0, addrs[j].1))
            .collect()
    };
    let mut nodes = Vec::new();
    for (i, b) in bound.into_iter().enumerate() {
        let peers = peers_of(i);
        let search: Option<Box<dyn SearchProtocol>> = (i == 0).then(|| Box::new(OneSibling) as _);
        nodes.push(start_searching(b, |c| c.peers = peers, search));
    }
    let (a, siblings) = (&nodes[0], ["b", "c"]);
    // Both siblings answer `a` before the test starts (a peer never heard from is not waited
    // for, as in Squid): a miss at `a` for a URL that hashes to each.
    for sibling in 0..siblings.len() {
        let warm = (0..)
            .map(|k| origin.url(&format!("/warm/{k}")))
            .find(|url| pick(url, siblings.len()) == sibling)
            .expect("a URL for each sibling");
        let _ = get(a.addr, &warm).await;
    }
    wait_icp_alive(a, 0).await;
    wait_icp_alive(a, 1).await;
    let queries = |s: &serde_json::Value| s["icp"]["queries_sent"].as_u64().expect("counter");

    for k in 0..4 {
        let url = origin.url(&format!("/toy/{k}?size=500&cc=max-age=600"));
        let holder = pick(&url, siblings.len());
        // The sibling the URL hashes to holds it; the other does not.
        let fetched = get(nodes[1 + holder].addr, &url).await;
        assert_eq!(fetched.status, 200);
        let before = a.stats().await;
        let served = get(a.addr, &url).await;
        assert_eq!(served.status, 200);
        assert!(common::hier_of(a, &url).await.starts_with("SIBLING_HIT/"));
        let after = a.stats().await;
        let hits = |s: &serde_json::Value| s["peers"][holder]["stats"]["hits"].as_u64();
        assert_eq!(
            hits(&after).zip(hits(&before)).map(|(x, y)| x - y),
            Some(1),
            "{url}: {} said HIT",
            siblings[holder]
        );
        assert_eq!(origin.hits(&url[url.find("/toy").expect("path")..]), 1);
        assert_eq!(queries(&after) - queries(&before), 1, "one query per miss");
    }
    // Plain ICP at `b` asks both of its siblings.
    let url = origin.url("/toy/icp");
    let before = queries(&nodes[1].stats().await);
    let _ = get(nodes[1].addr, &url).await;
    assert_eq!(queries(&nodes[1].stats().await) - before, 2);
}

/// A 1000-byte request for `url` by client `client`.
fn req(client: u32, url: &str) -> Request {
    Request {
        time_ms: 0,
        client,
        size: 1000,
        url: url.into(),
    }
}

/// The simulator: four sibling caches, every one of them running the toy protocol. Each miss
/// sends exactly one query (plain ICP sends three), and finds the copies its picks hold.
#[test]
fn the_simulator_runs_it_too() {
    let mut spec = SimSpec::default();
    spec.mesh.caches = 4;
    // ICP is what the nodes speak (sockets, answers); the search is the toy's.
    spec.protocol.name = Protocol::Icp;
    spec.net = NetSpec::instant();
    spec.replay.mode = Replay::Serial;
    // 60 objects, each fetched by cache 0, then asked for at cache 1.
    let requests: Vec<Request> = (0..60)
        .flat_map(|k| {
            let url = format!("http://h/toy/{k}");
            [req(0, &url), req(1, &url)]
        })
        .collect();
    let trace = Trace::new(&requests, 0, 1);
    let stop = AtomicBool::new(false);
    let (mut quiet, mut quiet_too) = (|_| {}, |_| {});
    let toy = Sim::with_protocol(&spec, &trace, |_, _| Box::new(OneSibling)).run(Control {
        stop: &stop,
        progress: &mut quiet,
    });
    let icp = Sim::new(&spec, &trace).run(Control {
        stop: &stop,
        progress: &mut quiet_too,
    });
    let misses = |r: &meshcache_sim::Results| r.answered.requests - r.answered.local_hits;
    assert_eq!(misses(&toy), 120, "no request hits locally");
    assert_eq!(toy.traffic.icp_queries, 120, "one query per miss");
    assert_eq!(icp.traffic.icp_queries, 360, "ICP asks all three siblings");
    // Cache 1's picks among caches 0, 2 and 3 name cache 0 for about a third of the URLs
    // (the first of them only wakes cache 0 up: it has never answered before).
    let expected = (0..60)
        .filter(|k| pick(&format!("http://h/toy/{k}"), 3) == 0)
        .count() as u64;
    assert!(expected > 1);
    assert_eq!(toy.answered.sibling_hits, expected - 1);
    assert_eq!(icp.answered.sibling_hits, 59);
}
