//! The multicast search (the Berkeley protocol) in the simulator: exact message counts and
//! waits by hand.

use meshcache_sim::spec::{MulticastMode, Protocol};
use meshcache_sim::{SimSpec, Trace};

mod common;
use common::{req, run};

fn serial(mode: MulticastMode) -> SimSpec {
    let mut spec = common::serial(4, Protocol::Multicast);
    spec.protocol.multicast_mode = mode;
    spec
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= b * 0.002
}

/// Four siblings, one request at a time, nothing else taking time: c0 misses `a` (one query,
/// nobody holds it, nobody answers: the search ends at the cold deadline, five times the
/// 20 ms floor); c1 misses `a` (one query, c0 answers HIT, the others stay silent: a sibling
/// hit); c1 misses `b` (one query, silence: its wait now adapts to c0's HIT round trip, and is
/// the floor).
#[test]
fn multicast_by_hand() {
    let trace = Trace::new(
        &[
            req(0, "http://h/a"),
            req(1, "http://h/a"),
            req(1, "http://h/b"),
        ],
        0,
        1,
    );
    let query = 20 + 4 + "http://h/a".len() as u64 + 1;
    let hit = 20 + "http://h/a".len() as u64 + 1;
    for (mode, per_query) in [(MulticastMode::Ip, 1), (MulticastMode::Logical, 3)] {
        let r = run(&serial(mode), &trace);
        let a = &r.answered;
        assert_eq!(
            (a.requests, a.sibling_hits, a.misses),
            (3, 1, 2),
            "{mode:?}"
        );
        // One query per miss (one datagram to the group, or one per member), one HIT reply;
        // misses are silent.
        assert_eq!(r.traffic.multicast_messages, 3 * per_query + 1, "{mode:?}");
        assert_eq!(
            r.traffic.multicast_bytes,
            3 * per_query * query + hit,
            "{mode:?}"
        );
        assert_eq!(r.traffic.icp_queries + r.traffic.icp_replies, 0);
        assert_eq!(r.traffic.peer_http, 1);
        // Every member receives each query, once: c3 received three and sent nothing.
        assert_eq!(r.nodes[3].datagrams, 3, "{mode:?}");
        // c0 sent a query (or three) and a HIT, and received two queries.
        assert_eq!(r.nodes[0].datagrams, per_query + 1 + 2, "{mode:?}");
        // Latencies: 100 ms (the cold wait), 0 (the hit), 20 ms (the floor).
        assert!(close(r.latency_ms.max, 100.0), "{:?}", r.latency_ms);
        assert!(close(r.latency_ms.mean, 40.0), "{:?}", r.latency_ms);
    }
}

/// A parent never answers a group query from a leaf it does not list (it has no peers); the
/// query still reaches it (one group datagram, every node receives it).
#[test]
fn parents_receive_the_group_but_do_not_answer() {
    let mut spec = serial(MulticastMode::Ip);
    spec.mesh.caches = 2;
    spec.mesh.parents = 1;
    let trace = Trace::new(&[req(0, "http://h/a"), req(1, "http://h/a")], 0, 1);
    let r = run(&spec, &trace);
    // The parent fetched `a` for c0 and holds it, but is silent; c0 answers c1.
    assert_eq!(
        (
            r.answered.sibling_hits,
            r.answered.parent_hits,
            r.answered.misses
        ),
        (1, 0, 1)
    );
    assert_eq!(r.traffic.multicast_messages, 3);
    let parent = &r.nodes[2];
    assert_eq!(
        parent.datagrams, 2,
        "two group queries received, nothing sent"
    );
}
