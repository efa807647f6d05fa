//! The engine against hand-checkable cases and the protocols' own arithmetic.

use std::sync::atomic::AtomicBool;

use meshcache_sim::spec::{Protocol, Replay};
use meshcache_sim::{Control, Results, SimSpec, Trace};
use meshcache_workload::generate::{generate, Benchmark, WorkloadSpec};
use meshcache_workload::Request;

mod common;
use common::{req, run, serial};

/// Four siblings, one request at a time: every outcome and message is known in advance.
#[test]
fn icp_by_hand() {
    // Each cache misses once: its queries go out, but its peers have never answered it, so
    // nobody is waited for (as in Squid) and the origin serves. Then c1 asks for c0's object:
    // it waits, c0 says HIT, a sibling hit (c1 keeps a copy); c0 asks again (local hit, no
    // message); c2 asks for b (three MISS_NOFETCH, origin).
    let trace = Trace::new(
        &[
            req(0, "http://h/a"),
            req(1, "http://h/1"),
            req(2, "http://h/2"),
            req(3, "http://h/3"),
            req(1, "http://h/a"),
            req(0, "http://h/a"),
            req(2, "http://h/b"),
        ],
        0,
        1,
    );
    let r = run(&serial(4, Protocol::Icp), &trace);
    let a = &r.answered;
    assert_eq!(
        (a.requests, a.local_hits, a.sibling_hits, a.misses),
        (7, 1, 1, 5)
    );
    // Six misses searched, three queries and three replies each.
    assert_eq!(r.traffic.icp_queries, 18);
    assert_eq!(r.traffic.icp_replies, 18);
    // One HTTP request between caches: c1 to c0.
    assert_eq!(r.traffic.peer_http, 1);
    assert_eq!(r.nodes[1].objects, 2);

    let none = run(&serial(4, Protocol::None), &trace);
    assert_eq!(
        (
            none.answered.local_hits,
            none.answered.sibling_hits,
            none.answered.misses
        ),
        (1, 0, 6)
    );
    assert_eq!(none.traffic.datagrams(), 0);
}

/// A lone parent is never polled; its cache serves the second leaf.
#[test]
fn parent_hits_without_queries() {
    let mut spec = serial(2, Protocol::Icp);
    spec.mesh.siblings = false;
    spec.mesh.parents = 1;
    let trace = Trace::new(&[req(0, "http://h/a"), req(1, "http://h/a")], 0, 1);
    let r = run(&spec, &trace);
    assert_eq!((r.answered.parent_hits, r.answered.misses), (1, 1));
    assert_eq!(r.traffic.datagrams(), 0);
    assert_eq!(r.traffic.peer_http, 2);
}

/// CARP among equals: each URL has one home; a leaf forwards what it does not win to the
/// winner, which fetches it: one origin fetch per URL, and a later client of any cache finds
/// it at the winner.
#[test]
fn carp_mesh_of_equals_fetches_each_url_once() {
    let urls: Vec<String> = (0..200).map(|i| format!("http://h/{i}")).collect();
    let mut reqs: Vec<Request> = urls.iter().map(|u| req(0, u)).collect();
    reqs.extend(urls.iter().map(|u| req(1, u)));
    let trace = Trace::new(&reqs, 0, 1);
    let r = run(&serial(4, Protocol::Carp), &trace);
    let fetches: u64 = r.nodes.iter().map(|n| n.origin_fetches).sum();
    assert_eq!(fetches, 200, "one origin fetch per URL in the whole mesh");
    assert_eq!(r.answered.misses, 200);
    assert_eq!(r.answered.local_hits + r.answered.sibling_hits, 200);
    // The URL space is split: every cache won a fair share.
    assert!(
        r.nodes.iter().all(|n| n.origin_fetches > 25),
        "{:?}",
        r.nodes
    );
    assert_eq!(r.traffic.datagrams(), 0);
}

fn benchmark(clients: u32, per_client: u32, disjoint: bool) -> Trace {
    let spec = WorkloadSpec::Benchmark(Benchmark {
        clients,
        requests_per_client: per_client,
        groups: 4,
        disjoint,
        ..Benchmark::default()
    });
    Trace::new(&generate(&spec, 7).expect("generates"), 0, 3)
}

/// With disjoint groups no remote hit exists: ICP finds none, and costs 2 (N - 1) datagrams
/// per miss once every peer has answered once.
#[test]
fn icp_worst_case_arithmetic() {
    let trace = benchmark(8, 100, true);
    let mut spec = SimSpec::default();
    spec.mesh.caches = 4;
    let r = run(&spec, &trace);
    assert_eq!(r.answered.requests, 800);
    assert_eq!(r.answered.sibling_hits, 0);
    let misses = r.answered.misses;
    assert_eq!(r.traffic.icp_queries, 3 * misses);
    assert_eq!(r.traffic.icp_replies, 3 * misses);
    let none = run(
        &SimSpec {
            protocol: meshcache_sim::spec::ProtocolSpec {
                name: Protocol::None,
                ..Default::default()
            },
            ..spec.clone()
        },
        &trace,
    );
    assert_eq!(none.answered.local_hits, r.answered.local_hits);
    // Searching costs time: ICP's mean latency is above no cooperation's.
    assert!(
        r.latency_ms.mean > none.latency_ms.mean,
        "{:?} {:?}",
        r.latency_ms,
        none.latency_ms
    );
}

/// Shared URLs make remote hits, and the hit ratio with ICP beats no cooperation.
#[test]
fn icp_finds_remote_hits() {
    let trace = benchmark(16, 200, false);
    let mut spec = SimSpec::default();
    spec.mesh.caches = 4;
    let icp = run(&spec, &trace);
    spec.protocol.name = Protocol::None;
    let none = run(&spec, &trace);
    assert!(icp.answered.sibling_hits > 0);
    assert!(
        icp.hit_ratio > none.hit_ratio + 0.01,
        "{} vs {}",
        icp.hit_ratio,
        none.hit_ratio
    );
}

/// A stop request ends the run early, with what was measured.
#[test]
fn interruption_reports_partial_results() {
    let trace = benchmark(40, 5_000, false);
    let spec = SimSpec::default();
    let stop = AtomicBool::new(true);
    let mut progress = |_| {};
    let r = meshcache_sim::run(
        &spec,
        &trace,
        Control {
            stop: &stop,
            progress: &mut progress,
        },
    )
    .expect("runs");
    assert!(r.interrupted);
    assert!(r.answered.requests < 200_000);
}

/// The event-free loop for one cache replayed serially gives exactly the engine's results.
#[test]
fn single_cache_loop_equals_the_engine() {
    let trace = benchmark(20, 300, false);
    for replacement in [
        meshcache_store::Replacement::Lru,
        meshcache_store::Replacement::Gdsf,
    ] {
        let mut spec = SimSpec::default();
        spec.mesh.caches = 1;
        spec.mesh.cache_size = bytesize::ByteSize::mib(8);
        spec.mesh.replacement = replacement;
        spec.protocol.name = Protocol::None;
        spec.replay.mode = Replay::Serial;
        assert!(meshcache_sim::single::applies(&spec));
        let fast = run(&spec, &trace);
        let stop = AtomicBool::new(false);
        let mut progress = |_| {};
        let engine = meshcache_sim::Sim::new(&spec, &trace).run(Control {
            stop: &stop,
            progress: &mut progress,
        });
        assert!(fast.nodes[0].evictions > 0, "replacement ran");
        let same = |r: &Results| {
            (
                r.answered.clone(),
                r.latency_ms.clone(),
                r.nodes.clone(),
                r.simulated_seconds,
            )
        };
        assert_eq!(same(&fast), same(&engine), "{replacement:?}");
    }
}

/// Per-domain parents: each URL goes to the parent that serves its host.
#[test]
fn domain_parents_split_by_host() {
    let mut spec = serial(2, Protocol::None);
    spec.mesh.siblings = false;
    spec.mesh.parents = 2;
    spec.mesh.parent_domains = vec![vec![".br".into()], vec!["!.br".into()]];
    let trace = Trace::new(
        &[
            req(0, "http://www.x.br/a"),
            req(0, "http://www.y.com/b"),
            req(0, "http://www.z.br/c"),
            req(1, "http://www.x.br/a"),
            req(1, "http://www.y.com/b"),
        ],
        0,
        1,
    );
    let r = run(&spec, &trace);
    assert_eq!((r.answered.parent_hits, r.answered.misses), (2, 3));
    let (p0, p1) = (&r.nodes[2], &r.nodes[3]);
    assert_eq!(
        (p0.name.as_str(), p0.objects),
        ("p0", 2),
        "p0 holds the .br objects"
    );
    assert_eq!(
        (p1.name.as_str(), p1.objects),
        ("p1", 1),
        "p1 holds the rest"
    );
    assert_eq!((p0.store_hits, p1.store_hits), (1, 1));
}

/// The admission rule: with `client`, one client's requests all go to its cache; with
/// `random`, they spread over every cache (the same way in every run), and a second request
/// for an object often lands on another cache, which ICP turns into a sibling hit.
#[test]
fn random_admission_spreads_one_client_over_the_caches() {
    let urls: Vec<String> = (0..100).map(|i| format!("http://h/{i}")).collect();
    let mut reqs: Vec<Request> = urls.iter().map(|u| req(0, u)).collect();
    reqs.extend(urls.iter().map(|u| req(0, u)));
    let trace = Trace::new(&reqs, 0, 1);
    let mut spec = serial(4, Protocol::Icp);
    let fixed = run(&spec, &trace);
    assert_eq!(fixed.nodes[0].client_requests, 200);
    assert_eq!(fixed.answered.local_hits, 100);
    spec.mesh.admission = meshcache_sim::spec::Admission::Random;
    let random = run(&spec, &trace);
    for n in &random.nodes {
        assert!(
            (30..=70).contains(&n.client_requests),
            "{}: {} requests",
            n.name,
            n.client_requests
        );
    }
    let a = &random.answered;
    assert_eq!(a.misses, 100, "each object fetched once");
    assert!(a.sibling_hits > 50, "{a:?}");
    assert_eq!(a.local_hits + a.sibling_hits, 100);
    assert_eq!(run(&spec, &trace).nodes, random.nodes, "the same every run");
}
