//! The multicast search with hand-delivered replies; time is a parameter.

use super::*;
use crate::hier::HierCode;
use crate::icp::IcpConfig;
use crate::peer::PeerSpec;
use crate::select::Hop;

fn addr(last: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, last], port))
}

fn peer(name: &str, role: Role, n: u8) -> PeerSpec {
    PeerSpec::new(name, role, addr(n, 3128), Some(addr(n, 3130)))
}

fn hit(reqnum: u32, url: &str) -> Reply<'_> {
    Reply {
        kind: ReplyKind::Hit,
        reqnum,
        url,
        src_rtt_ms: None,
    }
}

const URL: &str = "http://o.test/x";
const HOST: &str = "o.test";

fn table(peers: Vec<PeerSpec>) -> IcpMesh {
    IcpMesh::new(peers, IcpConfig::default())
}

fn siblings(n: u8) -> Vec<PeerSpec> {
    (0..n)
        .map(|i| peer(&format!("s{i}"), Role::Sibling, 10 + i))
        .collect()
}

fn deadline(s: &McSearch) -> Instant {
    match s.outcome {
        Outcome::Wait { deadline } => deadline,
        Outcome::Decided(ref r) => panic!("decided at once: {r:?}"),
    }
}

fn ms(t: Instant, n: u64) -> Instant {
    t + Duration::from_millis(n)
}

#[test]
fn logical_mode_sends_one_query_per_member_and_the_first_hit_decides() {
    let now = Instant::now();
    let mut mesh = table(siblings(3));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Logical);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    assert_ne!(s.reqnum, 0);
    assert_eq!(
        s.queries,
        (0..3)
            .map(|i| Destination::Peer {
                peer: PeerId(i),
                addr: addr(10 + i as u8, 3130)
            })
            .collect::<Vec<_>>()
    );
    deadline(&s);
    // The second member holds it; nobody else says anything.
    let route = mc
        .on_reply(ms(now, 4), &mut mesh, addr(11, 3130), hit(s.reqnum, URL))
        .expect("ours")
        .expect("a HIT decides");
    assert_eq!(
        route,
        Route {
            hops: vec![
                Hop::Peer {
                    peer: PeerId(1),
                    code: HierCode::SiblingHit
                },
                Hop::Direct
            ],
            timed_out: false
        }
    );
    // A second HIT is too late to matter and decides nothing.
    assert_eq!(
        mc.on_reply(ms(now, 5), &mut mesh, addr(12, 3130), hit(s.reqnum, URL)),
        None
    );
    assert_eq!(mc.in_flight(), 0);
    let st = mc.stats();
    assert_eq!(
        (st.searches, st.datagrams, st.hits, st.timeouts),
        (1, 3, 1, 0)
    );
    assert_eq!(mesh.peers()[1].stats.hits, 1);
    assert_eq!(
        mesh.peers()[1].rtt_ms,
        Some(4),
        "the HIT measured the round trip"
    );
    assert!(mesh.peers().iter().all(|p| p.stats.queries == 1));
}

#[test]
fn ip_mode_sends_one_datagram_and_a_parent_hit_leads() {
    let now = Instant::now();
    let mut mesh = table(vec![
        peer("s", Role::Sibling, 10),
        peer("p", Role::Parent, 11),
    ]);
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    assert_eq!(s.queries, vec![Destination::Group]);
    assert_eq!(mc.stats().datagrams, 1);
    assert!(
        mesh.peers().iter().all(|p| p.stats.queries == 0),
        "no datagram went to a peer of its own"
    );
    let route = mc
        .on_reply(ms(now, 2), &mut mesh, addr(11, 3130), hit(s.reqnum, URL))
        .expect("ours")
        .expect("decided");
    assert_eq!(
        route.hops[0],
        Hop::Peer {
            peer: PeerId(1),
            code: HierCode::ParentHit
        }
    );
    assert_eq!(route.hops.last(), Some(&Hop::Direct));
}

#[test]
fn silence_ends_at_the_deadline_and_goes_to_the_parents() {
    let now = Instant::now();
    let mut mesh = table(vec![
        peer("s1", Role::Sibling, 10),
        peer("s2", Role::Sibling, 11),
        peer("p", Role::Parent, 12),
    ]);
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Logical);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    let d = deadline(&s);
    assert_eq!(s.queries.len(), 3, "the parent is a member too");
    let route = mc
        .on_deadline(d, &mut mesh, s.reqnum)
        .expect("undecided until now");
    assert!(route.timed_out, "logged TIMEOUT_…");
    assert_eq!(
        route.hops,
        vec![
            Hop::Peer {
                peer: PeerId(2),
                code: HierCode::SingleParent
            },
            Hop::Direct
        ]
    );
    assert_eq!(mc.on_deadline(d, &mut mesh, s.reqnum), None, "decided once");
    assert_eq!(mc.stats().timeouts, 1);
    // Silence is the normal answer to a miss: nobody is blamed for it.
    assert!(mesh.peers().iter().all(|p| p.stats.timeouts == 0));
    assert!(mesh.peers().iter().all(|p| p.unanswered_since.is_none()));
}

#[test]
fn without_parents_a_miss_goes_to_the_origin_at_the_deadline() {
    let now = Instant::now();
    let mut mesh = table(siblings(2));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    let route = mc
        .on_deadline(deadline(&s), &mut mesh, s.reqnum)
        .expect("undecided");
    assert_eq!(route.hops, vec![Hop::Direct]);
    assert!(route.timed_out);
}

#[test]
fn non_hierarchical_requests_are_not_searched() {
    let now = Instant::now();
    let mut mesh = table(siblings(2));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let s = mc.begin(now, &mut mesh, URL, HOST, false);
    assert!(s.queries.is_empty());
    assert_eq!(s.reqnum, 0);
    assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
    assert_eq!((mc.stats().searches, mc.stats().unsearched), (0, 1));
}

#[test]
fn no_sibling_means_no_query() {
    let now = Instant::now();
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Logical);
    // Nobody at all.
    let mut empty = table(vec![]);
    let s = mc.begin(now, &mut empty, URL, HOST, true);
    assert!(s.queries.is_empty());
    assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
    // Parents only: a miss would wait a whole timeout to learn what the parent order says.
    let mut parents = table(vec![
        peer("p1", Role::Parent, 10),
        peer("p2", Role::Parent, 11),
    ]);
    let s = mc.begin(now, &mut parents, URL, HOST, true);
    assert!(s.queries.is_empty());
    let Outcome::Decided(route) = s.outcome else {
        panic!("decided")
    };
    assert_eq!(route.hops.len(), 3, "{route:?}");
    assert!(!route.timed_out);
    // A sibling that may not be queried, or does not serve the host, does not count.
    let mut quiet = peer("s", Role::Sibling, 10);
    quiet.no_query = true;
    let mut elsewhere = peer("t", Role::Sibling, 11);
    elsewhere.domains = vec![".br".into()];
    let mut m = table(vec![quiet, elsewhere]);
    assert!(mc.begin(now, &mut m, URL, HOST, true).queries.is_empty());
    // ... but serves its own domain.
    let s = mc.begin(now, &mut m, "http://www.ufrj.br/", "www.ufrj.br", true);
    assert_eq!(
        s.queries,
        vec![Destination::Peer {
            peer: PeerId(1),
            addr: addr(11, 3130)
        }]
    );
    assert_eq!(mc.stats().unsearched, 3);
}

#[test]
fn the_deadline_adapts_to_hit_round_trips_within_floor_and_ceiling() {
    let now = Instant::now();
    let config = MulticastConfig::default();
    let (floor, ceiling) = (config.timeout_floor, config.timeout_ceiling);
    let mut mesh = table(siblings(2));
    let mut mc = Multicast::new(config, Mode::Ip);
    let members = [PeerId(0), PeerId(1)];
    // Nothing measured yet.
    assert_eq!(mc.wait_for(mesh.peers(), &members), floor * COLD_FACTOR);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    assert_eq!(deadline(&s), now + floor * COLD_FACTOR);
    // A HIT after 30 ms: three times that.
    mc.on_reply(ms(now, 30), &mut mesh, addr(10, 3130), hit(s.reqnum, URL));
    assert_eq!(
        mc.wait_for(mesh.peers(), &members),
        Duration::from_millis(30) * RTT_FACTOR
    );
    // The slowest member counts.
    mesh.record_rtt(PeerId(1), Duration::from_millis(50));
    assert_eq!(
        mc.wait_for(mesh.peers(), &members),
        Duration::from_millis(150)
    );
    assert_eq!(
        mc.wait_for(mesh.peers(), &[PeerId(0)]),
        Duration::from_millis(90)
    );
    // Clamped below ...
    let mut fast = table(siblings(1));
    fast.record_rtt(PeerId(0), Duration::from_millis(1));
    assert_eq!(mc.wait_for(fast.peers(), &[PeerId(0)]), floor);
    // ... and above.
    let mut slow = table(siblings(1));
    slow.record_rtt(PeerId(0), Duration::from_secs(5));
    assert_eq!(mc.wait_for(slow.peers(), &[PeerId(0)]), ceiling);
    // A floor above the ceiling is the wait.
    let odd = Multicast::new(
        MulticastConfig {
            timeout_floor: Duration::from_secs(3),
            timeout_ceiling: Duration::from_secs(2),
        },
        Mode::Ip,
    );
    assert_eq!(
        odd.wait_for(slow.peers(), &[PeerId(0)]),
        Duration::from_secs(3)
    );
}

#[test]
fn a_late_hit_still_measures_its_round_trip() {
    let now = Instant::now();
    let mut mesh = table(siblings(1));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    let d = deadline(&s);
    assert_eq!(d, ms(now, 100), "cold: five times the 20 ms floor");
    assert!(mc.on_deadline(d, &mut mesh, s.reqnum).is_some());
    // The holder was farther than the wait.
    assert_eq!(
        mc.on_reply(ms(now, 160), &mut mesh, addr(10, 3130), hit(s.reqnum, URL)),
        Some(None),
        "ours, but decides nothing"
    );
    assert_eq!(mc.stats().late_hits, 1);
    assert_eq!(mesh.peers()[0].stats.late, 1);
    assert_eq!(mesh.peers()[0].rtt_ms, Some(160));
    // The next search waits long enough to hear it.
    let s = mc.begin(ms(now, 200), &mut mesh, URL, HOST, true);
    assert_eq!(deadline(&s), ms(now, 200 + 480));
}

#[test]
fn replies_that_are_not_a_members_hit_decide_nothing() {
    let now = Instant::now();
    let mut s_br = peer("br", Role::Sibling, 12);
    s_br.domains = vec![".br".into()];
    let mut specs = siblings(2);
    specs.push(s_br);
    let mut mesh = table(specs);
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    // A stranger's HIT.
    assert_eq!(
        mc.on_reply(now, &mut mesh, addr(99, 3130), hit(s.reqnum, URL)),
        Some(None)
    );
    // A peer that does not serve the host.
    assert_eq!(
        mc.on_reply(now, &mut mesh, addr(12, 3130), hit(s.reqnum, URL)),
        Some(None)
    );
    // Another URL under the same number: not ours.
    assert_eq!(
        mc.on_reply(
            now,
            &mut mesh,
            addr(10, 3130),
            hit(s.reqnum, "http://o.test/y")
        ),
        None
    );
    // A responder that does not know the flag answers its misses: ignored.
    let miss = Reply {
        kind: ReplyKind::MissNoFetch,
        ..hit(s.reqnum, URL)
    };
    assert_eq!(
        mc.on_reply(now, &mut mesh, addr(10, 3130), miss),
        Some(None)
    );
    assert_eq!(mesh.peers()[0].stats.miss_nofetch, 1);
    assert!(mc.is_searching(s.reqnum));
    // Another search's number: not ours at all.
    assert_eq!(
        mc.on_reply(now, &mut mesh, addr(10, 3130), hit(s.reqnum + 7, URL)),
        None
    );
    // The requester went away.
    mc.abandon(s.reqnum);
    assert_eq!(mc.in_flight(), 0);
    assert_eq!(mc.on_deadline(ms(now, 500), &mut mesh, s.reqnum), None);
}

#[test]
fn responders_answer_members_hits_only() {
    let mut mesh = table(siblings(2));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    assert_eq!(
        mc.on_query(&mut mesh, addr(10, 3130), Holding::Fresh),
        Answer::Hit
    );
    assert_eq!(
        mc.on_query(&mut mesh, addr(11, 3130), Holding::Nothing),
        Answer::Silent
    );
    assert_eq!(
        mc.on_query(&mut mesh, addr(99, 3130), Holding::Fresh),
        Answer::Foreign
    );
    assert_eq!(
        mc.on_query(&mut mesh, addr(10, 9999), Holding::Fresh),
        Answer::Foreign,
        "address and port must both match"
    );
    let st = mc.stats();
    assert_eq!(
        (
            st.queries_received,
            st.hits_answered,
            st.silent_misses,
            st.foreign_dropped
        ),
        (2, 1, 1, 2)
    );
    assert_eq!(mesh.peers()[0].stats.queries_received, 1);
    assert_eq!(mesh.peers()[1].stats.queries_received, 1);
}

#[test]
fn the_mode_can_change_after_start() {
    let now = Instant::now();
    let mut mesh = table(siblings(3));
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    assert_eq!(mc.mode().as_str(), "ip");
    mc.set_mode(Mode::Logical);
    assert_eq!(mc.mode().as_str(), "logical");
    assert_eq!(mc.begin(now, &mut mesh, URL, HOST, true).queries.len(), 3);
}

/// The slowest round trip the mesh keeps as samples come is the one a scan of the table
/// finds, also when the slowest peer gets faster; a search waits for it, and a table with a
/// domain list is scanned per host instead.
#[test]
fn the_slowest_member_is_kept_as_round_trips_change() {
    let mut mesh = table(siblings(6));
    let scan = |mesh: &IcpMesh| mesh.peers().iter().filter_map(|p| p.rtt_ms).max();
    // A fixed pseudo-random walk of samples, 1..400 ms, over the six peers.
    let mut x: u32 = 12345;
    for _ in 0..2_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let peer = PeerId((x >> 16) as usize % 6);
        let sample = Duration::from_millis(u64::from(1 + (x >> 8) % 400));
        mesh.record_rtt(peer, sample);
        assert_eq!(mesh.queried_everywhere(), Some((true, scan(&mesh))));
    }
    let mut mc = Multicast::new(MulticastConfig::default(), Mode::Ip);
    let members = Multicast::members(mesh.peers(), HOST);
    let now = Instant::now();
    let s = mc.begin(now, &mut mesh, URL, HOST, true);
    assert_eq!(deadline(&s), now + mc.wait_for(mesh.peers(), &members));

    let mut specs = siblings(2);
    specs[1].domains = vec![".br".into()];
    let domains = table(specs);
    assert_eq!(domains.queried_everywhere(), None);
}
