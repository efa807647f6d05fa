//! The node-level engine: a search's steps, replies and deadlines as a driver sees them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshcache_dcm::engine::{Engine, Miss, NoSearch, Progress, Send, Step};
use meshcache_dcm::protocols::SummarySearch;
use meshcache_dcm::{Hop, IcpConfig, IcpMesh, Outcome, PeerId, PeerSpec, Reply, ReplyKind, Role};

const URL: &str = "http://h/object";

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 2], port))
}

/// Two siblings that have answered before (so they are waited for), and a parent.
fn mesh(now: Instant) -> IcpMesh {
    let specs = vec![
        PeerSpec::new("s0", Role::Sibling, addr(3128), Some(addr(3130))),
        PeerSpec::new("s1", Role::Sibling, addr(3228), Some(addr(3230))),
        PeerSpec::new("p", Role::Parent, addr(3328), Some(addr(3330))),
    ];
    let mut mesh = IcpMesh::new(specs, IcpConfig::default());
    for i in 0..3 {
        mesh.heard_from(now, PeerId(i));
    }
    mesh
}

fn begin(engine: &mut Engine, now: Instant, candidates: Vec<PeerId>) -> Step {
    let key = [7; 16];
    let mut candidates = Some(candidates);
    let mut say = || candidates.take().unwrap_or_default();
    let mut miss = Miss::new(URL, &key, "h", true);
    miss.candidates = Some(&mut say);
    engine.begin(now, miss)
}

fn reply(kind: ReplyKind, reqnum: u32) -> Reply<'static> {
    Reply {
        kind,
        reqnum,
        url: URL,
        src_rtt_ms: None,
    }
}

/// The one query a step sends: to whom.
fn asked(step: &Step) -> SocketAddr {
    match step.sends.as_slice() {
        [Send::Query { addr, reqnum, .. }] => {
            assert_eq!(*reqnum, step.reqnum);
            *addr
        }
        other => panic!("one query expected, got {other:?}"),
    }
}

#[test]
fn summary_cache_asks_its_candidates_one_at_a_time() {
    let now = Instant::now();
    let mut engine = Engine::new(mesh(now), Box::new(SummarySearch::default()));
    let first = begin(&mut engine, now, vec![PeerId(0), PeerId(1)]);
    assert!(matches!(first.outcome, Outcome::Wait { .. }));
    assert_eq!(asked(&first), addr(3130), "the first candidate alone");
    // Its MISS (a false hit) moves the search to the next candidate, a step of its own.
    let moved = engine.on_reply(now, addr(3130), reply(ReplyKind::Miss, first.reqnum));
    let Some((reqnum, Progress::Next(second))) = moved else {
        panic!("a next step expected, got {moved:?}");
    };
    assert_eq!(reqnum, first.reqnum);
    assert_ne!(second.reqnum, first.reqnum);
    assert_eq!(asked(&second), addr(3230));
    // Its HIT decides: that sibling first.
    let moved = engine.on_reply(now, addr(3230), reply(ReplyKind::Hit, second.reqnum));
    let Some((reqnum, Progress::Decided(route))) = moved else {
        panic!("a route expected, got {moved:?}");
    };
    assert_eq!(reqnum, second.reqnum);
    assert!(matches!(
        route.hops[0],
        Hop::Peer {
            peer: PeerId(1),
            ..
        }
    ));
    // A late reply to a finished step moves nothing.
    assert_eq!(
        engine.on_reply(now, addr(3130), reply(ReplyKind::Miss, first.reqnum)),
        None
    );
}

#[test]
fn a_deadline_ends_the_walk_and_an_abandoned_search_leaves_nothing() {
    let now = Instant::now();
    let mut engine = Engine::new(mesh(now), Box::new(SummarySearch::default()));
    let step = begin(&mut engine, now, vec![PeerId(0), PeerId(1)]);
    let later = now + Duration::from_secs(5);
    match engine.on_deadline(later, step.reqnum) {
        Some(Progress::Decided(route)) => assert!(route.timed_out),
        other => panic!("a timed-out route expected, got {other:?}"),
    }
    assert_eq!(engine.on_deadline(later, step.reqnum), None, "decided once");

    let step = begin(&mut engine, now, vec![PeerId(0), PeerId(1)]);
    engine.abandon(step.reqnum);
    assert_eq!(
        engine.on_reply(now, addr(3130), reply(ReplyKind::Miss, step.reqnum)),
        None
    );
    assert_eq!(engine.on_deadline(later, step.reqnum), None);
    assert_eq!(engine.mesh().in_flight(), 0);
}

#[test]
fn no_candidate_and_no_search_decide_at_once() {
    let now = Instant::now();
    let mut engine = Engine::new(mesh(now), Box::new(SummarySearch::default()));
    // No summary says "maybe": the parent, then the origin, without a message.
    let step = begin(&mut engine, now, Vec::new());
    assert!(step.sends.is_empty());
    assert!(
        matches!(step.outcome, Outcome::Decided(ref r) if matches!(r.hops[0], Hop::Peer { peer: PeerId(2), .. }))
    );
    let mut none = Engine::new(mesh(now), Box::new(NoSearch));
    let step = begin(&mut none, now, vec![PeerId(0)]);
    assert!(step.sends.is_empty());
    assert!(matches!(step.outcome, Outcome::Decided(_)));
    assert!(none.protocol::<NoSearch>().is_some());
    assert!(none.protocol::<SummarySearch>().is_none());
}
