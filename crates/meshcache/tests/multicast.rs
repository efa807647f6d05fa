//! The multicast search (the Berkeley protocol) between meshcache nodes: real nodes, real UDP
//! and HTTP on loopback, a real origin. An object one node holds is a `SIBLING_HIT` for
//! another; a miss nobody holds draws no reply at all, ends at the deadline and goes to the
//! origin; strangers' queries get silence. The nodes run in whichever mode the machine gives
//! (IP multicast on loopback, or logical multicast), and the datagram counts follow the mode;
//! logical mode is also forced once, so both paths run wherever IP multicast works.

mod common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use common::{full_mesh, get, hier_of, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::{MulticastMode, Protocol};
use meshcache_wire::icp;

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A group of this test's own: a free UDP port and an address derived from it, so that
/// concurrent runs on one host never hear each other.
fn own_group() -> SocketAddrV4 {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port();
    let [hi, lo] = port.to_be_bytes();
    SocketAddrV4::new(Ipv4Addr::new(239, 255, hi, lo), port)
}

/// Three multicast members a, b, c, each the others' sibling.
fn mesh(mode: MulticastMode) -> Vec<Node> {
    let group = own_group();
    full_mesh(&["a", "b", "c"], true, Role::Sibling, |_, c| {
        c.cooperation.protocol = Protocol::Multicast;
        c.cooperation.multicast_group = group;
        c.cooperation.multicast_mode = mode;
        // Generous for a loaded machine: a first search waits five floors (1 s) for a hit
        // that takes well under a millisecond on an idle one.
        c.cooperation.multicast_timeout_floor = Duration::from_millis(200);
    })
}

/// The mode all three report, and the query datagrams one search sends in it.
async fn mode_of(nodes: &[Node]) -> (String, u64) {
    let mut modes = Vec::new();
    for node in nodes {
        let s = node.stats().await;
        modes.push(s["multicast"]["mode"].as_str().unwrap_or("").to_owned());
    }
    assert!(
        modes.iter().all(|m| m == &modes[0]),
        "one machine, one mode: {modes:?}"
    );
    let per_search = match modes[0].as_str() {
        "ip" => 1,
        "logical" => 2,
        other => panic!("unknown mode {other:?}"),
    };
    (modes[0].clone(), per_search)
}

/// Waits until `node`'s `/stats` satisfies `done` (10 s at most).
async fn eventually(node: &Node, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = node.stats().await;
        if done(&s) {
            return;
        }
        assert!(Instant::now() < until, "{what}: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn holders_answer_and_misses_time_out(mode: MulticastMode) {
    let origin = Origin::start().await.expect("origin");
    let nodes = mesh(mode);
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let (mode_name, per_search) = mode_of(&nodes).await;
    eprintln!("multicast mode on this machine: {mode_name}");
    if mode == MulticastMode::Logical {
        assert_eq!(mode_name, "logical");
        let s = a.stats().await;
        assert_eq!(
            s["multicast"]["why_logical"],
            "multicast_mode = \"logical\""
        );
    }

    // c fetches an object: nobody holds it yet, so its own search times out.
    let path = "/m?size=400&cc=max-age=600";
    let url = origin.url(path);
    assert_eq!(get(c.addr, &url).await.status, 200);
    let hier = hier_of(c, &url).await;
    assert!(hier.starts_with("TIMEOUT_HIER_DIRECT/"), "{hier}");

    // a misses it: one query, c answers HIT, b stays silent.
    let before = (a.stats().await, b.stats().await, c.stats().await);
    let r = get(a.addr, &url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, meshcache_lab::expected_body(400));
    let hier = hier_of(a, &url).await;
    assert!(hier.starts_with("SIBLING_HIT/"), "{hier}");
    assert_eq!(origin.hits(path), 1, "the origin served it once, to c");
    let after = a.stats().await;
    let delta = |k: &str| n(&after["multicast"][k]) - n(&before.0["multicast"][k]);
    assert_eq!(delta("searches"), 1, "{after}");
    assert_eq!(delta("hits"), 1, "{after}");
    assert_eq!(delta("queries_sent"), per_search, "{mode_name}: {after}");
    assert_eq!(
        n(&after["icp"]["queries_sent"]) - n(&before.0["icp"]["queries_sent"]),
        per_search,
        "every query datagram counts once as an ICP query: {after}"
    );
    assert_eq!(
        n(&after["icp"]["replies_received"]) - n(&before.0["icp"]["replies_received"]),
        1,
        "only the holder answered: {after}"
    );
    eventually(c, "c answered the hit", |s| {
        n(&s["multicast"]["hits_answered"]) > n(&before.2["multicast"]["hits_answered"])
    })
    .await;
    eventually(b, "b let the query pass in silence", |s| {
        n(&s["multicast"]["silent_misses"]) > n(&before.1["multicast"]["silent_misses"])
    })
    .await;
    let b_now = b.stats().await;
    assert_eq!(
        b_now["icp"]["replies_sent"], before.1["icp"]["replies_sent"],
        "b sent nothing: {b_now}"
    );

    // A miss nobody holds: no reply at all, the deadline, then the origin.
    let before = a.stats().await;
    let nobody = origin.url("/nobody?size=10&cc=no-store");
    let t0 = Instant::now();
    assert_eq!(get(a.addr, &nobody).await.status, 200);
    let waited = t0.elapsed();
    let hier = hier_of(a, &nobody).await;
    assert!(hier.starts_with("TIMEOUT_HIER_DIRECT/"), "{hier}");
    let after = a.stats().await;
    let delta = |k: &str| n(&after["multicast"][k]) - n(&before["multicast"][k]);
    assert_eq!(delta("timeouts"), 1, "{after}");
    assert_eq!(delta("hits"), 0, "{after}");
    assert_eq!(delta("queries_sent"), per_search, "{after}");
    assert_eq!(
        after["icp"]["replies_received"], before["icp"]["replies_received"],
        "nobody answers a miss: {after}"
    );
    let floor = a.proxy.config().cooperation.multicast_timeout_floor;
    assert!(
        waited >= floor,
        "the miss waited {waited:?}, under the floor"
    );
    // The deadline adapted to the measured hit: three round trips, within the bounds.
    let wait_ms = after["multicast"]["wait_ms"].as_f64().unwrap_or(0.0);
    assert!(
        wait_ms >= floor.as_millis() as f64 && wait_ms <= 2000.0,
        "{after}"
    );
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_answer_and_misses_time_out_in_the_machines_mode() {
    holders_answer_and_misses_time_out(MulticastMode::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_multicast_unicasts_the_query_to_every_member() {
    holders_answer_and_misses_time_out(MulticastMode::Logical).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_get_silence() {
    let origin = Origin::start().await.expect("origin");
    let nodes = mesh(MulticastMode::Auto);
    let a = &nodes[0];
    let url = origin.url("/held?size=50&cc=max-age=600");
    assert_eq!(get(a.addr, &url).await.status, 200);
    let a_icp = a.proxy.config().cooperation.icp_listen;
    let group = a.proxy.config().cooperation.multicast_group;
    let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let query = meshcache_wire::multicast::query(5, url.as_bytes())
        .to_bytes()
        .expect("encode");
    // Unicast to a's ICP socket, and to the group (which reaches a in IP mode).
    stranger.send_to(&query, a_icp).await.expect("send");
    stranger
        .send_to(&query, SocketAddr::V4(group))
        .await
        .expect("send");
    eventually(a, "a dropped the stranger's query", |s| {
        n(&s["multicast"]["foreign_dropped"]) >= 1
    })
    .await;
    let metrics = a.admin_get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("meshcache_multicast_mode{mode=\"")
            && text.contains("meshcache_multicast_foreign_dropped_total ")
            && text.contains("meshcache_multicast_wait_ms "),
        "{text}"
    );
    let mut buf = [0u8; 2048];
    let heard =
        tokio::time::timeout(Duration::from_millis(300), stranger.recv_from(&mut buf)).await;
    assert!(heard.is_err(), "a stranger got an answer: {heard:?}");
    // An ordinary ICP query from the stranger is still refused out loud, as ICP does.
    let plain = icp::Message::query(6, url.as_bytes())
        .to_bytes()
        .expect("encode");
    stranger.send_to(&plain, a_icp).await.expect("send");
    let (len, _) = tokio::time::timeout(Duration::from_secs(5), stranger.recv_from(&mut buf))
        .await
        .expect("an answer")
        .expect("recv");
    let reply = icp::decode(&buf[..len]).expect("decodes");
    assert_eq!(reply.opcode, icp::Opcode::Denied);
    for node in nodes {
        node.stop().await;
    }
}
