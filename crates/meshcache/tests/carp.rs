//! CARP hash routing between meshcache nodes: three nodes that list each other as parents and
//! are members of the array themselves split the URL space. Every URL is fetched from the origin
//! once, by the member that wins it, whichever node a client asks; no ICP at all.

mod common;

use std::net::SocketAddr;

use common::{full_mesh, get, hier_of};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::Protocol;
use meshcache_wire::carp::{carp_key, CarpArray};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carp_mesh_fetches_each_url_once_at_its_owner() {
    let origin = Origin::start().await.expect("origin");
    let names = ["a", "b", "c"];
    let nodes = full_mesh(&names, false, Role::Parent, |_, c| {
        c.cooperation.protocol = Protocol::Carp;
        c.cooperation.carp_member = true;
    });
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    // Who wins each URL, computed independently: the array in name order, weights equal.
    let array = CarpArray::new(names.iter().map(|n| (n.as_bytes(), 1)));
    let urls: Vec<String> = (0..24)
        .map(|i| origin.url(&format!("/carp{i}?size=100&cc=max-age=600")))
        .collect();
    let mut won = [0usize; 3];
    for u in &urls {
        let owner = array.order(carp_key(u).as_bytes())[0];
        won[owner] += 1;
        let r = get(nodes[0].addr, u).await;
        assert_eq!(r.status, 200);
        let hier = hier_of(&nodes[0], u).await;
        if owner == 0 {
            assert!(hier.starts_with("HIER_DIRECT/"), "{u}: {hier}");
        } else {
            assert_eq!(hier, format!("CARP/{}", addrs[owner].ip()), "{u}");
            // The owner fetched it itself.
            assert!(hier_of(&nodes[owner], u).await.starts_with("HIER_DIRECT/"));
        }
    }
    assert!(
        won.iter().all(|&w| w > 0),
        "every member wins some: {won:?}"
    );
    // Through b and c now: every URL is somewhere already, so the origin sees none again.
    for node in &nodes[1..] {
        for u in &urls {
            assert_eq!(get(node.addr, u).await.status, 200);
        }
    }
    for (i, u) in urls.iter().enumerate() {
        let path = &u[u.find("/carp").expect("path")..];
        assert_eq!(origin.hits(path), 1, "url {i} fetched from the origin once");
    }
    let s = nodes[0].stats().await;
    assert_eq!(s["icp"]["queries_sent"], 0, "{s}");
    for node in nodes {
        node.stop().await;
    }
}
