//! The directory protocol (dbDCM) between meshcache nodes: real nodes, real UDP and HTTP on
//! loopback, a real origin. What one node stores is found by another through the directory
//! (a `DIR_GET` to the URL's owner, then a query to a holder) and fetched from the holder; a
//! miss nobody holds costs no candidate query; messages from strangers or members speaking
//! for others change nothing.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{full_mesh, get, hier_of, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::{DirUpdateMode, DirVariant, Protocol};

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Three directory members a, b, c, each the others' sibling.
async fn mesh(variant: DirVariant, updates: DirUpdateMode) -> Vec<Node> {
    let nodes = full_mesh(&["a", "b", "c"], true, Role::Sibling, |_, c| {
        c.cooperation.protocol = Protocol::Directory;
        c.cooperation.directory_variant = variant;
        c.cooperation.directory_updates = updates;
    });
    // Every member hears from every other before the test starts: a directory lookup sent to
    // an owner never heard from is not waited for (as an ICP query to a silent peer).
    let warm = Origin::start().await.expect("origin");
    let until = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        let mut all = true;
        for node in &nodes {
            let s = node.stats().await;
            all &= s["peers"]
                .as_array()
                .is_some_and(|p| p.iter().all(|p| p["icp_alive"] == true));
        }
        if all {
            break;
        }
        assert!(
            Instant::now() < until,
            "members never heard from each other"
        );
        for node in &nodes {
            get(
                node.addr,
                &warm.url(&format!("/warm{i}?size=1&cc=no-store")),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes
}

/// Waits until the members' directories list `want` holder records in all, three polls in a
/// row (updates still in flight could make the count pass through `want`).
async fn wait_entries(nodes: &[Node], want: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    let mut steady = 0;
    loop {
        let mut total = 0;
        for node in nodes {
            total += n(&node.stats().await["directory"]["entries"]);
        }
        steady = if total == want { steady + 1 } else { 0 };
        if steady == 3 {
            return;
        }
        assert!(
            Instant::now() < until,
            "directory entries: {total}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn holders_are_found(variant: DirVariant, updates: DirUpdateMode) {
    let origin = Origin::start().await.expect("origin");
    let nodes = mesh(variant, updates).await;
    let (a, c) = (&nodes[0], &nodes[2]);
    let urls: Vec<String> = (0..12)
        .map(|i| origin.url(&format!("/d{i}?size=300&cc=max-age=600")))
        .collect();
    for u in &urls {
        assert_eq!(get(c.addr, u).await.status, 200);
    }
    // c's admissions reach the owners of the twelve entries.
    wait_entries(&nodes, 12).await;

    let before = a.stats().await;
    for u in &urls {
        let r = get(a.addr, u).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, meshcache_lab::expected_body(300));
        let hier = hier_of(a, u).await;
        assert!(hier.starts_with("SIBLING_HIT/"), "{u}: {hier}");
        let path = &u[u.find("/d").expect("path")..];
        assert_eq!(origin.hits(path), 1, "the origin served {u} once, to c");
    }
    let after = a.stats().await;
    let delta = |k: &str| n(&after["directory"][k]) - n(&before["directory"][k]);
    let d = &after["directory"];
    assert_eq!(delta("searches"), 12, "{d}");
    assert_eq!(delta("gets_sent") + delta("owned_locally"), 12, "{d}");
    assert_eq!(delta("hits"), 12, "{d}");
    // One candidate query per search (α = 1), sent by a (variant 1) or for a (variant 2).
    let queried = n(&after["icp"]["queries_sent"]) - n(&before["icp"]["queries_sent"]);
    match variant {
        DirVariant::Requester => assert_eq!(queried, 12, "{after}"),
        DirVariant::Owner => assert!(queried <= 12, "{after}"),
    }

    // Local hits never reach the directory: a has the twelve now.
    let before = a.stats().await;
    for u in &urls {
        assert_eq!(get(a.addr, u).await.x_cache(), "HIT");
    }
    let after = a.stats().await;
    assert_eq!(
        after["directory"]["searches"], before["directory"]["searches"],
        "{after}"
    );
    // (Directory datagrams may still go out meanwhile: the DIR_ADDs for what a just stored.)
    assert_eq!(
        after["directory"]["gets_sent"], before["directory"]["gets_sent"],
        "{after}"
    );

    // Misses nobody holds: the owner answers "nobody", no candidate is queried.
    let before = a.stats().await;
    for i in 0..10 {
        let u = origin.url(&format!("/nobody{i}?size=10&cc=no-store"));
        assert_eq!(get(a.addr, &u).await.status, 200);
        assert!(hier_of(a, &u).await.starts_with("HIER_DIRECT/"));
    }
    let after = a.stats().await;
    assert_eq!(
        after["icp"]["queries_sent"], before["icp"]["queries_sent"],
        "{after}"
    );
    let d = &after["directory"];
    assert_eq!(n(&d["empty"]) - n(&before["directory"]["empty"]), 10, "{d}");
    // Optimistic owners entered a as a holder of the misses they own; nothing was stored, so
    // a takes each back: a DIR_DEL with no store event behind it, from a node otherwise idle.
    wait_entries(&nodes, 12).await;
    let dels = n(&a.stats().await["directory"]["dels_sent"]) - n(&before["directory"]["dels_sent"]);
    match updates {
        DirUpdateMode::Optimistic => assert!(dels > 0, "no optimistic entry taken back"),
        DirUpdateMode::Pessimistic => assert_eq!(dels, 0),
    }
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variant_1_finds_holders_through_the_directory() {
    holders_are_found(DirVariant::Requester, DirUpdateMode::Pessimistic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variant_2_owners_query_holders_for_the_requester() {
    holders_are_found(DirVariant::Owner, DirUpdateMode::Optimistic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_impostors_change_nothing() {
    use meshcache_wire::directory::{self as wire, DirMessage, HolderUpdate};
    let nodes = mesh(DirVariant::Requester, DirUpdateMode::Pessimistic).await;
    let a = &nodes[0];
    let a_icp = a.proxy.config().cooperation.icp_listen;
    let b_icp = nodes[1].proxy.config().cooperation.icp_listen;
    let SocketAddr::V4(b_v4) = b_icp else {
        panic!("IPv4")
    };
    let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let keys: Vec<[u8; 16]> = (0..8u8).map(|i| [i; 16]).collect();
    // A stranger claims to be b; then garbage with a directory opcode.
    let forged = DirMessage::Add(HolderUpdate {
        seq: 1,
        sender: *b_v4.ip(),
        holder: b_v4,
        keys: keys.clone(),
    })
    .to_bytes()
    .expect("encode");
    stranger.send_to(&forged, a_icp).await.expect("send");
    stranger
        .send_to(&[wire::OPCODE_DIR_DATA, 2, 0, 9, 1], a_icp)
        .await
        .expect("send");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = a.stats().await;
        if n(&s["icp"]["directory_bad"]) >= 2 {
            assert_eq!(n(&s["directory"]["entries"]), 0, "{s}");
            assert!(n(&s["directory"]["rejected"]) >= 1, "{s}");
            break;
        }
        assert!(Instant::now() < until, "{s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The node still serves.
    let origin = Origin::start().await.expect("origin");
    assert_eq!(get(a.addr, &origin.url("/after?size=5")).await.status, 200);
    for node in nodes {
        node.stop().await;
    }
}
