//! The aggregate ICP model against the per-datagram one: the same searches, the same counts.

use meshcache_sim::spec::{IcpModel, NetSpec, Protocol, Replay};
use meshcache_sim::{Results, SimSpec, Trace};
use meshcache_workload::generate::{generate, Benchmark, WorkloadSpec};

mod common;
use common::run;

/// The benchmark workload: `clients` clients in four groups sharing 30 % of their URLs, on
/// several hosts (so that domain parents split them).
fn trace(clients: u32, per_client: u32) -> Trace {
    let spec = WorkloadSpec::Benchmark(Benchmark {
        clients,
        requests_per_client: per_client,
        groups: 4,
        disjoint: false,
        ..Benchmark::default()
    });
    Trace::new(&generate(&spec, 11).expect("generates"), 0, 3)
}

fn both(spec: &SimSpec, trace: &Trace) -> (Results, Results) {
    let mut datagrams = spec.clone();
    datagrams.protocol.icp_model = IcpModel::Datagrams;
    let mut aggregate = spec.clone();
    aggregate.protocol.icp_model = IcpModel::Aggregate;
    (run(&datagrams, trace), run(&aggregate, trace))
}

/// What must be identical: every outcome, every message count, and each node's share.
fn counts(r: &Results) -> impl PartialEq + std::fmt::Debug {
    let nodes: Vec<_> = r
        .nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                n.local_hits,
                n.sibling_hits,
                n.parent_hits,
                n.store_hits,
                n.peer_requests,
                n.origin_fetches,
                n.datagrams,
                n.datagrams_sent,
                n.objects,
            )
        })
        .collect();
    (r.answered.clone(), r.traffic.clone(), nodes)
}

fn topologies() -> Vec<(&'static str, SimSpec)> {
    let mut siblings = SimSpec::default();
    siblings.protocol.name = Protocol::Icp;
    siblings.mesh.caches = 8;
    let mut with_parent = siblings.clone();
    with_parent.mesh.caches = 6;
    with_parent.mesh.parents = 1;
    let mut two_parents = siblings.clone();
    two_parents.mesh.caches = 5;
    two_parents.mesh.parents = 2;
    let mut domain_parents = siblings.clone();
    domain_parents.mesh.caches = 4;
    domain_parents.mesh.siblings = false;
    domain_parents.mesh.parents = 3;
    domain_parents.mesh.parent_domains = vec![
        vec!["!group0.lab".into()],
        vec![],
        vec!["group0.lab".into(), "group1.lab".into()],
    ];
    vec![
        ("8 siblings", siblings),
        ("6 siblings and a parent", with_parent),
        ("5 siblings and two parents", two_parents),
        ("4 leaves under three domain parents", domain_parents),
    ]
}

/// Many clients at once: hit ratios within half a point, mean latency within 5 %, the
/// datagram counts within 1 %.
fn assert_close(name: &str, d: &Results, a: &Results) {
    assert!(
        (a.hit_ratio - d.hit_ratio).abs() <= 0.005,
        "{name}: hit ratio {} aggregate, {} per datagram",
        a.hit_ratio,
        d.hit_ratio
    );
    let (dm, am) = (d.latency_ms.mean, a.latency_ms.mean);
    assert!(
        (am - dm).abs() <= 0.05 * dm,
        "{name}: mean latency {am} ms aggregate, {dm} ms per datagram"
    );
    let (dd, ad) = (d.traffic.datagrams() as f64, a.traffic.datagrams() as f64);
    assert!(
        (ad - dd).abs() <= 0.01 * dd,
        "{name}: {ad} datagrams aggregate, {dd} per datagram"
    );
}

/// One request at a time, on an instantaneous network and on the default one: the same hits
/// (local, sibling, parent), the same datagrams and bytes, the same per-node counts.
#[test]
fn one_at_a_time_the_two_models_agree_exactly() {
    let trace = trace(12, 120);
    for (name, mut spec) in topologies() {
        spec.replay.mode = Replay::Serial;
        for net in [NetSpec::instant(), NetSpec::default()] {
            spec.net = net;
            let (d, a) = both(&spec, &trace);
            assert!(d.traffic.icp_queries > 0, "{name}: searches happened");
            assert_eq!(counts(&a), counts(&d), "{name}");
            let (dm, am) = (d.latency_ms.mean, a.latency_ms.mean);
            assert!(
                (am - dm).abs() <= 0.001 * dm.max(0.001),
                "{name}: mean latency {am} ms aggregate, {dm} ms per datagram"
            );
        }
    }
}

/// Many clients at once on a loaded mesh: hit ratios within half a point, mean latency
/// within 5 %, the datagram counts within 1 % — also with the shared network saturated by
/// the queries and replies of 24 siblings, where every datagram's time on it counts.
#[test]
fn under_load_the_two_models_agree_closely() {
    let trace = trace(120, 60);
    let mut saturated = SimSpec::default();
    saturated.mesh.caches = 24;
    saturated.net.network_bandwidth = 20_000_000;
    let mut cases = topologies();
    cases.push(("24 siblings on a saturated network", saturated));
    for (name, mut spec) in cases {
        spec.replay.mode = Replay::Closed;
        spec.net.origin_bandwidth = 0;
        let (d, a) = both(&spec, &trace);
        assert_close(name, &d, &a);
    }
}

/// Multicast's group queries in the aggregate model (only the copy to the holder whose HIT
/// comes first is an event): one request at a time, exactly the per-datagram results; many at
/// once, close to them.
#[test]
fn multicast_group_queries_agree_with_a_copy_per_member() {
    let one_at_a_time = trace(12, 120);
    let load = trace(120, 60);
    let mut siblings = SimSpec::default();
    siblings.protocol.name = Protocol::Multicast;
    siblings.mesh.caches = 8;
    let mut with_parent = siblings.clone();
    with_parent.mesh.caches = 6;
    with_parent.mesh.parents = 1;
    for (name, mut spec) in [
        ("8 siblings", siblings),
        ("6 siblings and a parent", with_parent),
    ] {
        spec.replay.mode = Replay::Serial;
        let (d, a) = both(&spec, &one_at_a_time);
        assert!(
            d.traffic.multicast_messages > 0,
            "{name}: searches happened"
        );
        assert!(
            d.nodes.iter().any(|n| n.sibling_hits > 0),
            "{name}: holders answered"
        );
        assert_eq!(counts(&a), counts(&d), "{name}");
        assert_eq!(a.latency_ms.mean, d.latency_ms.mean, "{name}");

        spec.replay.mode = Replay::Closed;
        spec.net.origin_bandwidth = 0;
        let (d, a) = both(&spec, &load);
        assert_close(name, &d, &a);
    }
}
