//! The directory protocol between in-memory members: messages are passed by hand, time is
//! a parameter.

use super::*;
use crate::hier::HierCode;
use crate::icp::IcpConfig;
use crate::peer::{PeerSpec, Role};
use crate::select::Hop;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn icp(i: usize) -> SocketAddrV4 {
    SocketAddrV4::new([127, 0, 0, 10 + i as u8].into(), 3130)
}

/// Member `i` of four (a, b, c, d), all siblings of each other.
fn node(i: usize, config: DirectoryConfig) -> (Directory, IcpMesh) {
    let mut specs = Vec::new();
    let mut members = Vec::new();
    for (j, name) in NAMES.iter().enumerate() {
        if j == i {
            continue;
        }
        let http = SocketAddr::V4(SocketAddrV4::new(*icp(j).ip(), 3128));
        members.push(Member {
            name: (*name).to_owned(),
            icp: icp(j),
            peer: PeerId(specs.len()),
        });
        specs.push(PeerSpec::new(
            name,
            Role::Sibling,
            http,
            Some(SocketAddr::V4(icp(j))),
        ));
    }
    let mut mesh = IcpMesh::new(specs, IcpConfig::default());
    for j in 0..NAMES.len() - 1 {
        mesh.heard_from(Instant::now(), PeerId(j));
    }
    (Directory::new(NAMES[i], icp(i), members, config, 7), mesh)
}

/// A key whose entry member `owner` keeps.
fn key_owned_by(owner: usize, salt: u8) -> [u8; 16] {
    for n in 0u32.. {
        let mut key = [salt; 16];
        key[..4].copy_from_slice(&n.to_be_bytes());
        if meshcache_wire::directory::owner_index(&NAMES, &key) == Some(owner) {
            return key;
        }
    }
    unreachable!("some key maps to every member")
}

fn from(i: usize) -> SocketAddr {
    SocketAddr::V4(icp(i))
}

fn reply(kind: ReplyKind, reqnum: u32, url: &str) -> Reply<'_> {
    Reply {
        kind,
        reqnum,
        url,
        src_rtt_ms: None,
    }
}

const URL: &str = "http://o.test/x";

fn wait(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Wait { .. })
}

/// Member `holder` tells the owner it holds `key`: its update reaches `owner`.
fn hold(
    holder: &mut Directory,
    owner: &mut Directory,
    owner_i: usize,
    holder_i: usize,
    key: [u8; 16],
) {
    let now = Instant::now();
    holder.on_admitted(now, key);
    let sends = holder.take_updates();
    assert_eq!(
        sends,
        vec![Outgoing::Add {
            to: icp(owner_i),
            keys: vec![key]
        }]
    );
    assert!(owner.on_update(now, from(holder_i), icp(holder_i), true, &[key]));
}

#[test]
fn placement_is_shared_and_local_ownership_sends_nothing() {
    let (a, _) = node(0, DirectoryConfig::default());
    let (b, _) = node(1, DirectoryConfig::default());
    for salt in 0..50u8 {
        let key = [salt; 16];
        // Exactly one member thinks it owns each key.
        let owners = [&a, &b].iter().filter(|d| d.owns(&key)).count();
        assert!(owners <= 1);
    }
    let (mut a, mut mesh) = node(0, DirectoryConfig::default());
    let key = key_owned_by(0, 1);
    let s = a.begin(Instant::now(), &mut mesh, URL, &key, "o.test", true);
    assert!(s.sends.is_empty(), "{s:?}");
    assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
    assert_eq!(a.stats().owned_locally, 1);
    assert_eq!(a.stats().empty, 1);
}

#[test]
fn variant_1_owner_returns_holders_and_the_requester_queries_alpha_of_them() {
    let now = Instant::now();
    let key = key_owned_by(1, 2);
    let (mut a, mut mesh_a) = node(0, DirectoryConfig::default());
    let (mut b, _) = node(1, DirectoryConfig::default());
    let (mut c, _) = node(2, DirectoryConfig::default());
    let (mut d, _) = node(3, DirectoryConfig::default());
    hold(&mut c, &mut b, 1, 2, key);
    hold(&mut d, &mut b, 1, 3, key);
    assert_eq!(b.entries(), 1);

    // a misses: one DIR_GET to b, the owner.
    let s = a.begin(now, &mut mesh_a, URL, &key, "o.test", true);
    assert!(wait(&s.outcome));
    let [Outgoing::Get {
        to,
        reqnum,
        optimistic: false,
        forward: false,
        alpha: 1,
        url,
    }] = &s.sends[..]
    else {
        panic!("{:?}", s.sends)
    };
    assert_eq!((*to, url.as_str()), (icp(1), URL));
    let reqnum = *reqnum;

    // b answers with both holders.
    let answer = b.on_get(now, from(0), icp(0), reqnum, false, false, 1, URL, &key);
    let [Outgoing::Data {
        to,
        holders,
        forwarded: false,
        ..
    }] = &answer[..]
    else {
        panic!("{answer:?}")
    };
    assert_eq!(*to, icp(0));
    assert_eq!(holders.len(), 2);

    // a queries α = 1 of them, under the same request number.
    let (sends, route) = a.on_data(now, &mut mesh_a, from(1), reqnum, false, holders);
    assert!(route.is_none());
    let [Outgoing::Query {
        to: asked,
        reqnum: n,
        on_behalf_of: None,
        ..
    }] = &sends[..]
    else {
        panic!("{sends:?}")
    };
    assert_eq!(*n, reqnum);
    assert!(*asked == icp(2) || *asked == icp(3));

    // Its HIT decides: a sibling hit first, the origin after.
    let asked = SocketAddr::V4(*asked);
    let route = a
        .on_reply(now, &mut mesh_a, asked, reply(ReplyKind::Hit, reqnum, URL))
        .expect("ours")
        .expect("decided");
    assert_eq!(route.hops[0].code(), HierCode::SiblingHit);
    assert_eq!(route.hops.last(), Some(&Hop::Direct));
    assert_eq!(a.stats().hits, 1);
    assert_eq!(a.in_flight(), 0);
}

#[test]
fn round_robin_spreads_the_candidates() {
    let now = Instant::now();
    let key = key_owned_by(0, 3);
    let (mut a, mut mesh) = node(0, DirectoryConfig::default());
    for holder in 1..4 {
        let (mut h, _) = node(holder, DirectoryConfig::default());
        h.on_admitted(now, key);
        let sends = h.take_updates();
        assert_eq!(sends.len(), 1);
        assert!(a.on_update(now, from(holder), icp(holder), true, &[key]));
    }
    let mut asked = Vec::new();
    for _ in 0..6 {
        let s = a.begin(now, &mut mesh, URL, &key, "o.test", true);
        let [Outgoing::Query { to, reqnum, .. }] = &s.sends[..] else {
            panic!("{:?}", s.sends)
        };
        asked.push(*to);
        a.abandon(*reqnum);
    }
    for h in 1..4 {
        assert_eq!(
            asked.iter().filter(|&&x| x == icp(h)).count(),
            2,
            "{asked:?}"
        );
    }
}

#[test]
fn all_misses_go_on_to_the_origin_and_count_false_entries() {
    let now = Instant::now();
    let key = key_owned_by(0, 4);
    let config = DirectoryConfig {
        alpha: 0,
        choice: Choice::Random,
        ..DirectoryConfig::default()
    };
    let (mut a, mut mesh) = node(0, config);
    for h in 1..4 {
        assert!(a.on_update(now, from(h), icp(h), true, &[key]));
    }
    let s = a.begin(now, &mut mesh, URL, &key, "o.test", true);
    assert_eq!(s.sends.len(), 3, "α = 0 asks every holder");
    let mut decided = None;
    for h in 1..4 {
        let r = a
            .on_reply(
                now,
                &mut mesh,
                from(h),
                reply(ReplyKind::MissNoFetch, s.reqnum, URL),
            )
            .expect("ours");
        assert!(decided.is_none());
        decided = r;
    }
    assert_eq!(decided, Some(Route::direct()));
    assert_eq!(a.stats().false_entries, 3);
}

#[test]
fn variant_2_the_owner_queries_for_the_requester() {
    let now = Instant::now();
    let config = DirectoryConfig {
        variant: Variant::Owner,
        ..DirectoryConfig::default()
    };
    let key = key_owned_by(1, 5);
    let (mut a, mut mesh_a) = node(0, config.clone());
    let (mut b, _) = node(1, config.clone());
    let (mut c, _) = node(2, config.clone());
    hold(&mut c, &mut b, 1, 2, key);

    let s = a.begin(now, &mut mesh_a, URL, &key, "o.test", true);
    let [Outgoing::Get {
        reqnum,
        forward: true,
        ..
    }] = &s.sends[..]
    else {
        panic!("{:?}", s.sends)
    };
    let reqnum = *reqnum;
    // b asks c for a, and sends a nothing: it asked exactly α = 1.
    let sends = b.on_get(now, from(0), icp(0), reqnum, false, true, 1, URL, &key);
    assert_eq!(
        sends,
        vec![Outgoing::Query {
            to: icp(2),
            reqnum,
            url: URL.into(),
            on_behalf_of: Some(icp(0)),
        }]
    );
    assert_eq!(b.stats().queries_forwarded, 1);
    // c answers a directly, as b named it.
    assert_eq!(c.forwarded_reply_to(from(1), icp(0)), Some(from(0)));
    let route = a
        .on_reply(
            now,
            &mut mesh_a,
            from(2),
            reply(ReplyKind::Hit, reqnum, URL),
        )
        .expect("ours")
        .expect("decided");
    assert_eq!(route.hops[0].code(), HierCode::SiblingHit);
    // The owner's silence did not make it look dead: the forwarded answer vouched for it.
    assert!(mesh_a.peers()[0].unanswered_since.is_none());

    // With no holder, the owner says so and the requester goes on at once.
    let other = key_owned_by(1, 6);
    let s = a.begin(now, &mut mesh_a, URL, &other, "o.test", true);
    let sends = b.on_get(now, from(0), icp(0), s.reqnum, false, true, 1, URL, &other);
    let [Outgoing::Data {
        forwarded: true,
        holders,
        ..
    }] = &sends[..]
    else {
        panic!("{sends:?}")
    };
    assert!(holders.is_empty());
    let (more, route) = a.on_data(now, &mut mesh_a, from(1), s.reqnum, true, holders);
    assert!(more.is_empty());
    assert_eq!(route, Some(Route::direct()));
}

#[test]
fn optimistic_entries_are_taken_back_when_nothing_was_stored() {
    let now = Instant::now();
    let config = DirectoryConfig {
        mode: UpdateMode::Optimistic,
        ..DirectoryConfig::default()
    };
    let key = key_owned_by(1, 7);
    let (mut a, mut mesh_a) = node(0, config.clone());
    let (mut b, _) = node(1, config.clone());
    let s = a.begin(now, &mut mesh_a, URL, &key, "o.test", true);
    let sends = b.on_get(now, from(0), icp(0), s.reqnum, true, false, 1, URL, &key);
    assert_eq!(sends.len(), 1);
    assert_eq!(b.entries(), 1, "the owner entered a at lookup time");

    // Stored: nothing more to say (no DIR_ADD, the owner knows).
    a.on_admitted(now, key);
    assert!(a.take_updates().is_empty());

    // A second object that did not end in the store: DIR_DEL.
    let key2 = key_owned_by(1, 8);
    let s = a.begin(now, &mut mesh_a, URL, &key2, "o.test", true);
    b.on_get(now, from(0), icp(0), s.reqnum, true, false, 1, URL, &key2);
    assert_eq!(b.entries(), 2);
    a.fetch_done(now, key2, false);
    let sends = a.take_updates();
    assert_eq!(
        sends,
        vec![Outgoing::Del {
            to: icp(1),
            keys: vec![key2]
        }]
    );
    assert!(b.on_update(now, from(0), icp(0), false, &[key2]));
    assert_eq!(b.entries(), 1);
}

#[test]
fn strangers_and_members_speaking_for_others_are_refused() {
    let now = Instant::now();
    let key = [9u8; 16];
    let (mut b, _) = node(1, DirectoryConfig::default());
    let stranger: SocketAddr = "127.0.0.99:3130".parse().expect("addr");
    assert!(!b.on_update(now, stranger, icp(0), true, &[key]));
    // c claims that a holds it.
    assert!(!b.on_update(now, from(2), icp(0), true, &[key]));
    assert!(b
        .on_get(now, stranger, icp(0), 1, false, false, 1, URL, &key)
        .is_empty());
    // a asks on c's behalf.
    assert!(b
        .on_get(now, from(0), icp(2), 1, false, false, 1, URL, &key)
        .is_empty());
    assert_eq!(b.entries(), 0);
    assert_eq!(b.stats().rejected, 4);
    // A forwarded query from a stranger, or naming one, is not redirected.
    assert_eq!(b.forwarded_reply_to(stranger, icp(0)), None);
    let other = SocketAddrV4::new([127, 0, 0, 99].into(), 3130);
    assert_eq!(b.forwarded_reply_to(from(0), other), None);
}

#[test]
fn the_directory_is_bounded_lru_or_lfu() {
    let now = Instant::now();
    // Keys 1–3 enter; key 1 is then used twice more and key 3 once; keys 4 and 5 enter.
    // LRU flushes the least recently used (2, then 1); LFU the least used (2, then the
    // newcomer 4, used once, against 1 and 3).
    for (flush, kept) in [(Flush::Lru, [3u8, 4, 5]), (Flush::Lfu, [1u8, 3, 5])] {
        let config = DirectoryConfig {
            max_entries: 3,
            flush,
            ..DirectoryConfig::default()
        };
        let (mut b, _) = node(1, config);
        for k in 1..=3u8 {
            assert!(b.on_update(now, from(0), icp(0), true, &[[k; 16]]));
        }
        b.on_update(now, from(2), icp(2), true, &[[1; 16]]);
        b.on_update(now, from(3), icp(3), true, &[[1; 16]]);
        b.on_update(now, from(2), icp(2), true, &[[3; 16]]);
        b.on_update(now, from(0), icp(0), true, &[[4; 16]]);
        b.on_update(now, from(0), icp(0), true, &[[5; 16]]);
        assert_eq!(b.entries(), 3);
        assert_eq!(b.stats().flushed, 2);
        for k in kept {
            assert!(
                b.table.entries.contains_key(&[k; 16]),
                "{flush:?} keeps {k}"
            );
        }
    }
}

#[test]
fn holder_records_expire() {
    let now = Instant::now();
    let config = DirectoryConfig {
        ttl: Duration::from_secs(10),
        ..DirectoryConfig::default()
    };
    let key = key_owned_by(0, 10);
    let (mut a, mut mesh) = node(0, config);
    assert!(a.on_update(now, from(1), icp(1), true, &[key]));
    let s = a.begin(
        now + Duration::from_secs(5),
        &mut mesh,
        URL,
        &key,
        "o.test",
        true,
    );
    assert_eq!(s.sends.len(), 1);
    a.abandon(s.reqnum);
    let s = a.begin(
        now + Duration::from_secs(11),
        &mut mesh,
        URL,
        &key,
        "o.test",
        true,
    );
    assert!(s.sends.is_empty());
    assert_eq!(a.stats().expired, 1);
    assert_eq!(a.entries(), 0);
}

#[test]
fn a_silent_owner_ends_in_a_timeout_then_is_not_waited_for() {
    let now = Instant::now();
    let key = key_owned_by(1, 11);
    let (mut a, mut mesh) = node(0, DirectoryConfig::default());
    let s = a.begin(now, &mut mesh, URL, &key, "o.test", true);
    let Outcome::Wait { deadline } = s.outcome else {
        panic!("waits")
    };
    let route = a
        .on_deadline(deadline, &mut mesh, s.reqnum)
        .expect("undecided");
    assert!(route.timed_out);
    assert_eq!(a.stats().timeouts, 1);
    // Silent past dead_after since that lookup: the next miss does not wait for it.
    let later = now + Duration::from_secs(11);
    let s = a.begin(later, &mut mesh, URL, &key, "o.test", true);
    assert_eq!(s.sends.len(), 1, "the lookup still goes out, as a probe");
    assert!(matches!(s.outcome, Outcome::Decided(_)));
    assert_eq!(a.stats().owner_down, 1);
    // Its late answer revives it.
    a.on_data(later, &mut mesh, from(1), s.reqnum, false, &[]);
    let s = a.begin(later, &mut mesh, URL, &key, "o.test", true);
    assert!(wait(&s.outcome));
}

#[test]
fn an_owner_never_heard_from_is_asked_but_not_waited_for() {
    let now = Instant::now();
    let key = key_owned_by(1, 17);
    let (mut a, _) = node(0, DirectoryConfig::default());
    let specs = (1..4)
        .map(|j| {
            PeerSpec::new(
                NAMES[j],
                Role::Sibling,
                SocketAddr::V4(SocketAddrV4::new(*icp(j).ip(), 3128)),
                Some(from(j)),
            )
        })
        .collect();
    let mut fresh = IcpMesh::new(specs, IcpConfig::default());
    let s = a.begin(now, &mut fresh, URL, &key, "o.test", true);
    assert_eq!(s.sends.len(), 1);
    assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
}

#[test]
fn updates_cancel_and_batch_per_owner() {
    let now = Instant::now();
    let (mut a, _) = node(0, DirectoryConfig::default());
    let k1 = key_owned_by(1, 12);
    let k2 = key_owned_by(1, 13);
    let k3 = key_owned_by(2, 14);
    let mine = key_owned_by(0, 15);
    a.on_admitted(now, k1);
    a.on_admitted(now, k2);
    a.on_removed(now, k2);
    a.on_admitted(now, k3);
    a.on_admitted(now, mine);
    assert_eq!(a.queued_updates(), 3);
    let mut sends = a.take_updates();
    sends.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(sends.len(), 3, "{sends:?}");
    assert!(sends.contains(&Outgoing::Add {
        to: icp(1),
        keys: vec![k1]
    }));
    assert!(sends.contains(&Outgoing::Del {
        to: icp(1),
        keys: vec![k2]
    }));
    assert!(sends.contains(&Outgoing::Add {
        to: icp(2),
        keys: vec![k3]
    }));
    // Our own entry is kept locally.
    assert_eq!(a.entries(), 1);
    assert!(a.take_updates().is_empty());
}

#[test]
fn non_hierarchical_requests_skip_the_directory() {
    let (mut a, mut mesh) = node(0, DirectoryConfig::default());
    let key = key_owned_by(1, 16);
    let s = a.begin(Instant::now(), &mut mesh, URL, &key, "o.test", false);
    assert!(s.sends.is_empty());
    assert_eq!(a.stats().searches, 0);
}

#[test]
fn settings_that_cannot_work_are_named() {
    let ok = DirectoryConfig::check(Duration::from_secs(1), ENTRY_BYTES as u64);
    assert_eq!(ok, Ok(()));
    assert_eq!(
        DirectoryConfig::check(Duration::from_millis(999), DEFAULT_MEMORY),
        Err(BadSetting::Ttl)
    );
    assert_eq!(
        DirectoryConfig::check(Duration::from_secs(60), ENTRY_BYTES as u64 - 1),
        Err(BadSetting::Memory)
    );
    assert!(BadSetting::Memory
        .reason()
        .contains(&format!("({ENTRY_BYTES} B)")));
}

/// The number of keys in `DIR_ADD` (`add`) or `DIR_DEL` messages among `sends`.
fn keys_in(sends: &[Outgoing], add: bool) -> usize {
    sends
        .iter()
        .map(|s| match (s, add) {
            (Outgoing::Add { keys, .. }, true) | (Outgoing::Del { keys, .. }, false) => keys.len(),
            _ => 0,
        })
        .sum()
}

#[test]
fn upkeep_drains_a_burst_once_and_renews_the_whole_store() {
    let (mut dir, _) = node(0, DirectoryConfig::default());
    let start = Instant::now();
    let ttl = Duration::from_secs(60);
    let mut upkeep = Upkeep::new(start, ttl);
    assert_eq!(
        upkeep.next_wake(),
        start + ttl / 2,
        "idle: only the renewal"
    );
    let (k1, k2) = (key_owned_by(1, 1), key_owned_by(2, 2));
    let ms = Duration::from_millis;
    // The first event of a burst sets the drain; the rest join it.
    assert_eq!(
        upkeep.note(start + ms(1), [(k1, true)], 0),
        Some(start + ms(1) + DRAIN_INTERVAL)
    );
    assert_eq!(upkeep.note(start + ms(4), [(k2, true)], 0), None);
    assert_eq!(upkeep.next_wake(), start + ms(11));
    assert!(
        upkeep.wake(start + ms(5), &mut dir, Vec::new).is_none(),
        "not due yet"
    );
    let (sends, renewed) = upkeep
        .wake(start + ms(11), &mut dir, Vec::new)
        .expect("the drain");
    assert!(!renewed);
    assert_eq!(keys_in(&sends, true), 2, "{sends:?}");
    assert_eq!(upkeep.next_wake(), start + ttl / 2);
    // The renewal announces every key the store holds, and sets the next one.
    let (sends, renewed) = upkeep
        .wake(start + ttl / 2, &mut dir, || vec![k1, k2])
        .expect("the renewal");
    assert!(renewed);
    assert_eq!(keys_in(&sends, true), 2);
    assert_eq!(upkeep.renew_at(), start + ttl);
    // Lost events: the next drain announces the store again.
    let t = start + ttl / 2 + ms(1);
    assert_eq!(upkeep.lost(t), Some(t + DRAIN_INTERVAL));
    let (sends, renewed) = upkeep
        .wake(t + DRAIN_INTERVAL, &mut dir, || vec![k1])
        .expect("the resync");
    assert!(!renewed);
    assert_eq!(keys_in(&sends, true), 1);
    assert_eq!(keys_in(&sends, false), 0);
}
