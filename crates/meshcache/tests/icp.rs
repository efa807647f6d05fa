//! Cooperation between meshcache nodes by ICP: siblings, parents, the single-parent short-cut,
//! failover from dead and stalled parents, and refusal of strangers. Real nodes, real UDP and
//! TCP on loopback, a real origin.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{bind, get, start, wait_icp_alive, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::PeerConfig;
use meshcache_wire::icp;

fn peer(name: &str, role: Role, http: SocketAddr, icp: Option<SocketAddr>) -> PeerConfig {
    PeerConfig::new(name, role, http, icp)
}

/// The hierarchy field (`HIER/peer`) of access-log line `n`.
async fn hier(node: &Node, n: usize) -> String {
    let lines = node.log_lines(n).await;
    lines[n - 1]
        .split_whitespace()
        .nth(8)
        .expect("hierarchy field")
        .to_owned()
}

async fn stats(node: &Node) -> serde_json::Value {
    node.stats().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_serve_each_others_hits() {
    let origin = Origin::start().await.expect("origin");
    let a = bind(true, |c| c.name = "a".into());
    let b = bind(true, |c| c.name = "b".into());
    let (a_http, a_icp, b_http, b_icp) = (a.addr, a.icp, b.addr, b.icp);
    let a = start(a, |c| {
        c.peers = vec![peer("b", Role::Sibling, b_http, b_icp)]
    });
    let b = start(b, |c| {
        c.peers = vec![peer("a", Role::Sibling, a_http, a_icp)]
    });

    // b caches an object.
    let url = origin.url("/shared?size=500&cc=max-age=600");
    assert_eq!(get(b.addr, &url).await.x_cache(), "MISS");
    // A first miss through a wakes b up as a peer (a peer never heard from is not waited for).
    get(a.addr, &origin.url("/warmup?size=1")).await;
    wait_icp_alive(&a, 0).await;

    let r = get(a.addr, &url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, meshcache_lab::expected_body(500));
    assert_eq!(
        origin.hits("/shared?size=500&cc=max-age=600"),
        1,
        "served by the sibling, not the origin"
    );
    assert!(
        hier(&a, 2).await.starts_with("SIBLING_HIT/"),
        "{:?}",
        a.log_lines(2).await
    );
    // a kept a copy.
    assert_eq!(get(a.addr, &url).await.x_cache(), "HIT");

    // What b lacks, b answers MISS_NOFETCH for, and a goes to the origin itself.
    let r = get(a.addr, &origin.url("/only-origin?size=3")).await;
    assert_eq!(r.status, 200);
    assert!(
        hier(&a, 4).await.starts_with("HIER_DIRECT/"),
        "{:?}",
        a.log_lines(4).await
    );
    let s = stats(&a).await;
    assert!(
        s["peers"][0]["stats"]["miss_nofetch"].as_u64().expect("n") >= 1,
        "{s}"
    );
    assert!(
        s["peers"][0]["stats"]["hits"].as_u64().expect("n") >= 1,
        "{s}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_parent_is_never_polled() {
    let origin = Origin::start().await.expect("origin");
    let p = bind(true, |c| c.name = "parent".into());
    let (p_http, p_icp) = (p.addr, p.icp);
    let child = bind(true, |c| c.name = "child".into());
    let child_icp = child.icp;
    let p = start(p, |c| {
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")]
    });
    let child = start(child, |c| {
        c.peers = vec![peer("parent", Role::Parent, p_http, p_icp)]
    });
    let _ = child_icp;
    for i in 0..3 {
        let r = get(
            child.addr,
            &origin.url(&format!("/via-parent{i}?size=10&cc=max-age=60")),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    assert!(
        hier(&child, 1).await.starts_with("SINGLE_PARENT/"),
        "{:?}",
        child.log_lines(1).await
    );
    let s = stats(&child).await;
    assert_eq!(s["icp"]["queries_sent"], 0, "{s}");
    assert_eq!(stats(&p).await["icp"]["queries_received"], 0);
    // The parent fetched and cached them.
    assert_eq!(p.log_code(1).await, "TCP_MISS/200");
    child.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_stalled_parent_costs_no_request() {
    let origin = Origin::start().await.expect("origin");
    let good = bind(true, |c| c.name = "good".into());
    let (good_http, good_icp) = (good.addr, good.icp);
    let good = start(good, |c| {
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")]
    });
    // A stalled parent: accepts connections, never answers (like a SIGSTOPped process).
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let stalled_http = stalled.local_addr().expect("addr");
    let stalled_icp = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let stalled_icp_addr = stalled_icp.local_addr().expect("addr");
    let child = bind(true, |c| {
        c.name = "child".into();
        c.cooperation.peer_response_timeout = Duration::from_millis(300);
        c.cooperation.icp_timeout_ceiling = Duration::from_millis(200);
    });
    let child = start(child, |c| {
        c.peers = vec![
            PeerConfig {
                no_query: true,
                ..peer(
                    "stalled",
                    Role::Parent,
                    stalled_http,
                    Some(stalled_icp_addr),
                )
            },
            peer("good", Role::Parent, good_http, good_icp),
        ];
    });
    let started = std::time::Instant::now();
    for i in 0..6 {
        let r = get(child.addr, &origin.url(&format!("/fo{i}?size=10"))).await;
        assert_eq!(r.status, 200, "request {i} failed");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failover took {:?}",
        started.elapsed()
    );
    let s = stats(&child).await;
    let stalled_stats = &s["peers"][0];
    let failures = stalled_stats["stats"]["fetch_failures"]
        .as_u64()
        .expect("n");
    assert!(
        (1..=2).contains(&failures),
        "tried, then skipped while backing off: {s}"
    );
    assert_eq!(stalled_stats["up"], false, "{s}");
    drop(stalled);
    child.stop().await;
    good.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_get_denied() {
    let a = bind(true, |c| c.name = "a".into());
    let a_icp = a.icp.expect("icp");
    let a = start(a, |_| {});
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let mut q = Vec::new();
    icp::encode(&icp::Message::query(7, "http://x.test/"), &mut q).expect("encode");
    sock.send_to(&q, a_icp).await.expect("send");
    let mut buf = [0u8; 2048];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf))
        .await
        .expect("reply")
        .expect("recv");
    let reply = icp::decode(&buf[..n]).expect("decode");
    assert_eq!(reply.opcode, icp::Opcode::Denied);
    assert_eq!(reply.reqnum, 7);
    // Garbage is counted and dropped, never answered with a crash.
    sock.send_to(b"\x01\x02\x00\x05garbage", a_icp)
        .await
        .expect("send");
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let s = loop {
        let s = a.stats().await;
        if s["icp"]["dropped"].as_u64().unwrap_or(0) >= 1 || std::time::Instant::now() >= until {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(s["icp"]["denied"], 1, "{s}");
    assert!(s["icp"]["dropped"].as_u64().expect("n") >= 1, "{s}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_icp_query_command_prints_the_reply() {
    let origin = Origin::start().await.expect("origin");
    let a = bind(true, |c| {
        c.name = "a".into();
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")];
        c.cooperation.icp_hit_min_fresh = Duration::from_secs(1);
    });
    let a_icp = a.icp.expect("icp").to_string();
    let a = start(a, |_| {});
    let url = origin.url("/cli?size=5&cc=max-age=600");
    get(a.addr, &url).await;
    let bin = env!("CARGO_BIN_EXE_meshcache");
    let run = |u: String| {
        let addr = a_icp.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .args(["icp", "query", &addr, &u, "--from", "127.0.0.1:0"])
                .output()
                .expect("run")
        })
    };
    let out = run(url.clone()).await.expect("join");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.starts_with("ICP_OP_HIT from "),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(origin.url("/never")).await.expect("join");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ICP_OP_MISS from "));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_parents_do_not_loop() {
    let origin = Origin::start().await.expect("origin");
    let a = bind(false, |c| c.name = "a".into());
    let b = bind(false, |c| c.name = "b".into());
    let (a_http, b_http) = (a.addr, b.addr);
    // Each names the other as its only parent: a request would ping-pong without Via checks.
    let a = start(a, |c| c.peers = vec![peer("b", Role::Parent, b_http, None)]);
    let b = start(b, |c| c.peers = vec![peer("a", Role::Parent, a_http, None)]);
    let r = get(a.addr, &origin.url("/loop?size=4")).await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits("/loop?size=4"), 1);
    // b saw the request from a and went to the origin itself rather than back to a.
    assert!(
        hier(&b, 1).await.starts_with("HIER_DIRECT/"),
        "{:?}",
        b.log_lines(1).await
    );
    assert!(
        hier(&a, 1).await.starts_with("SINGLE_PARENT/"),
        "{:?}",
        a.log_lines(1).await
    );
    a.stop().await;
    b.stop().await;
}

/// An upload through a parent that takes longer than `peer_response_timeout` is not a stalled
/// parent: the wait for the parent's answer counts from the request's last byte. 12 pieces,
/// one every 100 ms, against a 300 ms limit; the parent stays up and the origin gets it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_through_a_parent_is_not_a_stalled_parent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PIECES: usize = 12;
    let origin = Origin::start().await.expect("origin");
    let p = bind(true, |c| c.name = "parent".into());
    let (p_http, p_icp) = (p.addr, p.icp);
    let p = start(p, |_| {});
    let child = bind(true, |c| {
        c.name = "child".into();
        c.cooperation.peer_response_timeout = Duration::from_millis(300);
    });
    let child = start(child, |c| {
        c.peers = vec![peer("parent", Role::Parent, p_http, p_icp)]
    });
    let a = origin.addr();
    let mut s = tokio::net::TcpStream::connect(child.addr)
        .await
        .expect("connect");
    let head = format!(
        "PUT http://{a}/up HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        PIECES * 1000
    );
    s.write_all(head.as_bytes()).await.expect("head");
    for _ in 0..PIECES {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(&[b'u'; 1000]).await.expect("piece");
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(
        text.contains(&format!("x-request-body-bytes: {}", PIECES * 1000)),
        "{text}"
    );
    let hier = hier(&child, 1).await;
    assert!(hier.contains("PARENT/"), "{hier}");
    let s = stats(&child).await;
    assert_eq!(s["peers"][0]["up"], true, "{s}");
    assert_eq!(s["peers"][0]["stats"]["fetch_failures"], 0, "{s}");
    child.stop().await;
    p.stop().await;
}
