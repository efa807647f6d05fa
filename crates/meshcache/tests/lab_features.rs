//! What the evaluation lab needs from a node: where its time goes (clients, peers, searches,
//! overhead), a static host table, non-persistent upstream connections, and polling a lone
//! parent on purpose. Real nodes, real sockets on loopback, real origins.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{bind, get, node, start, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_proxy::config::PeerConfig;
use meshcache_wire::icp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `/stats`, once `ready` holds (polled at most 100 times, 20 ms apart): time is added at the
/// end of a poll, which may come just after the client has read its response.
async fn stats_when(node: &Node, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let mut s = node.stats().await;
    for _ in 0..100 {
        if ready(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = node.stats().await;
    }
    panic!("/stats never got there: {s}");
}

/// The three categories never add up to more than the process's CPU time, beyond the
/// rounding of `/proc` times to clock ticks.
fn check_sum(s: &serde_json::Value) {
    let e = &s["efficiency"];
    let sum = f(&e["client_s"]) + f(&e["peer_s"]) + f(&e["search_s"]);
    let cpu = f(&e["cpu_s"]);
    assert!(sum <= cpu + 0.02, "categories {sum} s > cpu {cpu} s: {e}");
    let overhead = f(&e["overhead_s"]);
    assert!(overhead >= 0.0, "{e}");
    assert!(((cpu - sum).max(0.0) - overhead).abs() < 1e-6, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_requests_grow_client_time_only() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let before = proxy.stats().await;
    assert_eq!(f(&before["efficiency"]["client_s"]), 0.0, "{before}");
    for i in 0..4 {
        let url = origin.url(&format!("/e{}?size=2000&cc=max-age=60", i % 2));
        assert_eq!(get(proxy.addr, &url).await.status, 200);
    }
    let s = stats_when(&proxy, |s| f(&s["efficiency"]["client_s"]) > 0.0).await;
    assert_eq!(n(&s["requests_received"]["from_clients"]), 4, "{s}");
    assert_eq!(n(&s["requests_received"]["from_peers"]), 0, "{s}");
    assert_eq!(f(&s["efficiency"]["peer_s"]), 0.0, "{s}");
    // No peers: no search, not even a decision.
    assert_eq!(f(&s["efficiency"]["search_s"]), 0.0, "{s}");
    check_sum(&s);
    let text = String::from_utf8_lossy(&proxy.admin_get("/metrics").await.body).into_owned();
    assert!(
        text.contains("meshcache_work_seconds_total{category=\"client\"} ")
            && text.contains("meshcache_process_cpu_seconds_total ")
            && text.contains("meshcache_requests_received_total{from=\"client\"} 4"),
        "{text}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_requests_and_queries_are_peer_time_and_its_search_is_search_time() {
    let origin = Origin::start().await.expect("origin");
    let parent = bind(true, |c| {
        c.name = "parent".into();
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")];
    });
    let (p_http, p_icp) = (parent.addr, parent.icp);
    let parent = start(parent, |_| {});
    // The parent's ICP side alone first: a child's query is peer work.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let mut q = Vec::new();
    icp::encode(&icp::Message::query(9, "http://x.test/"), &mut q).expect("encode");
    sock.send_to(&q, p_icp.expect("icp")).await.expect("send");
    let mut buf = [0u8; 2048];
    let (len, _) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("reply in time")
        .expect("recv");
    assert_eq!(
        icp::decode(&buf[..len]).expect("decode").opcode,
        icp::Opcode::Miss
    );
    let s = stats_when(&parent, |s| f(&s["efficiency"]["peer_s"]) > 0.0).await;
    let icp_only = f(&s["efficiency"]["peer_s"]);

    // Then a child that polls it before each miss, and sends it its requests.
    let child = bind(true, |c| {
        c.name = "child".into();
        c.cooperation.query_lone_parent = true;
    });
    let child = start(child, |c| {
        c.peers = vec![PeerConfig::new("parent", Role::Parent, p_http, p_icp)]
    });
    for i in 0..3 {
        let r = get(child.addr, &origin.url(&format!("/c{i}?size=3000"))).await;
        assert_eq!(r.status, 200);
    }
    let s = stats_when(&parent, |s| {
        n(&s["requests_received"]["from_peers"]) == 3 && f(&s["efficiency"]["peer_s"]) > icp_only
    })
    .await;
    assert_eq!(n(&s["requests_received"]["from_clients"]), 0, "{s}");
    // Nothing the parent did was for a client of its own.
    assert_eq!(f(&s["efficiency"]["client_s"]), 0.0, "{s}");
    assert_eq!(f(&s["efficiency"]["search_s"]), 0.0, "{s}");
    check_sum(&s);

    let s = stats_when(&child, |s| {
        f(&s["efficiency"]["client_s"]) > 0.0 && f(&s["efficiency"]["search_s"]) > 0.0
    })
    .await;
    assert_eq!(n(&s["requests_received"]["from_clients"]), 3, "{s}");
    assert_eq!(f(&s["efficiency"]["peer_s"]), 0.0, "{s}");
    check_sum(&s);
    child.stop().await;
    parent.stop().await;
}

/// Binds two loopback addresses on one port, so that only the address tells them apart.
async fn two_origins() -> (Origin, Origin, u16) {
    for _ in 0..20 {
        let a = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), 0))
            .await
            .expect("bind");
        let port = a.local_addr().expect("addr").port();
        if let Ok(b) = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 3), port)).await {
            let a = Origin::spawn(a, std::future::pending());
            let b = Origin::spawn(b, std::future::pending());
            return (a, b, port);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_table_sends_named_urls_to_their_origin() {
    let (g0, g1, port) = two_origins().await;
    let proxy = node(|c| {
        c.dns.hosts = [
            ("www.g0.br".to_owned(), "127.0.0.2".parse().expect("ip")),
            ("WWW.G1.br".to_owned(), "127.0.0.3".parse().expect("ip")),
        ]
        .into_iter()
        .collect();
    })
    .await;
    let path = "/page?size=11&cc=max-age=60";
    let r = get(proxy.addr, &format!("http://www.g1.br:{port}{path}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, meshcache_lab::expected_body(11));
    assert_eq!((g0.hits(path), g1.hits(path)), (0, 1));
    // Names match regardless of case; the other name goes to the other address.
    let r = get(proxy.addr, &format!("http://WWW.G0.BR:{port}{path}")).await;
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert_eq!((g0.hits(path), g1.hits(path)), (1, 1));
    let r = get(proxy.addr, &format!("http://www.g1.br:{port}{path}")).await;
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    assert_eq!((g0.hits(path), g1.hits(path)), (1, 1));
    proxy.stop().await;
}

#[test]
fn the_host_table_is_validated() {
    use meshcache_proxy::Config;
    let c = Config::from_toml("[dns]\nhosts = { \"www.g0.br\" = \"127.0.2.1\" }\n").expect("ok");
    assert_eq!(c.dns.hosts.len(), 1);
    for (bad, key) in [
        ("[dns]\nhosts = { \"\" = \"127.0.2.1\" }\n", "dns.hosts"),
        ("[dns]\nhosts = { \"a b\" = \"127.0.2.1\" }\n", "dns.hosts"),
        (
            "[dns]\nhosts = { \"a\" = \"127.0.2.1\", \"A\" = \"127.0.2.2\" }\n",
            "dns.hosts",
        ),
        ("[dns]\nhosts = { \"a\" = \"127.0.2\" }\n", "127.0.2"),
        ("[dns]\nhost = {}\n", "host"),
    ] {
        let err = Config::from_toml(bad).expect_err(bad).to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_upstream_opens_a_connection_per_request() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.upstream.persistent = false).await;
    for i in 0..4 {
        assert_eq!(
            get(proxy.addr, &origin.url(&format!("/np{i}?size=10")))
                .await
                .status,
            200
        );
    }
    let s = proxy.stats().await;
    assert_eq!(n(&s["upstream_connections_opened"]), 4, "{s}");
    assert_eq!(n(&s["upstream_connections_reused"]), 0, "{s}");

    // The origin is told so: a hand-written one that would keep the connection open.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            let k = s.read(&mut buf).await.expect("read");
            if k == 0 {
                break;
            }
            head.extend_from_slice(&buf[..k]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .expect("write");
        String::from_utf8_lossy(&head).to_ascii_lowercase()
    });
    let r = get(proxy.addr, &format!("http://{addr}/raw")).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    let head = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("in time")
        .expect("join");
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_applies_to_peers_too() {
    let origin = Origin::start().await.expect("origin");
    let parent = node(|c| c.name = "parent".into()).await;
    let p_http = parent.addr;
    let child = node(|c| {
        c.name = "child".into();
        c.upstream.persistent = false;
        c.peers = vec![PeerConfig::new("parent", Role::Parent, p_http, None)];
    })
    .await;
    for i in 0..3 {
        let r = get(child.addr, &origin.url(&format!("/pp{i}?size=10"))).await;
        assert_eq!(r.status, 200);
    }
    let s = child.stats().await;
    assert_eq!(n(&s["upstream_connections_opened"]), 3, "{s}");
    assert_eq!(n(&s["upstream_connections_reused"]), 0, "{s}");
    // The parent itself pools its origin connections (the default).
    let s = parent.stats().await;
    assert_eq!(n(&s["upstream_connections_opened"]), 1, "{s}");
    child.stop().await;
    parent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_parent_is_polled_only_when_asked_to() {
    let origin = Origin::start().await.expect("origin");
    let parent = bind(true, |c| {
        c.name = "parent".into();
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")];
    });
    let (p_http, p_icp) = (parent.addr, parent.icp);
    let parent = start(parent, |_| {});
    let polling = start(
        bind(true, |c| {
            c.name = "polling".into();
            c.cooperation.query_lone_parent = true;
            // Replies decide at once; a long floor only keeps a busy machine from timing out.
            c.cooperation.icp_timeout_floor = Duration::from_secs(2);
        }),
        |c| c.peers = vec![PeerConfig::new("parent", Role::Parent, p_http, p_icp)],
    );
    let sensible = start(bind(true, |c| c.name = "sensible".into()), |c| {
        c.peers = vec![PeerConfig::new("parent", Role::Parent, p_http, p_icp)]
    });
    for i in 0..4 {
        let url = origin.url(&format!("/lone{i}?size=10"));
        assert_eq!(get(sensible.addr, &url).await.status, 200);
        assert_eq!(get(polling.addr, &url).await.status, 200);
    }
    let s = sensible.stats().await;
    assert_eq!(n(&s["icp"]["queries_sent"]), 0, "{s}");
    assert_eq!(n(&s["peers"][0]["stats"]["queries"]), 0, "{s}");
    let s = polling.stats().await;
    assert_eq!(n(&s["icp"]["queries_sent"]), 4, "one query per miss: {s}");
    assert_eq!(n(&s["peers"][0]["stats"]["queries"]), 4, "{s}");
    // The parent answered them (the first one is not waited for: it was never heard from).
    assert!(n(&s["peers"][0]["stats"]["misses"]) >= 3, "{s}");
    let s = stats_when(&parent, |s| {
        n(&s["icp"]["queries_received"]) == 4 && n(&s["icp"]["replies_sent"]) == 4
    })
    .await;
    assert_eq!(n(&s["icp"]["denied"]), 0, "{s}");
    // Only the polling child's log shows the search: a parent chosen by its MISS.
    let lines = polling.log_lines(4).await;
    assert!(
        lines[3].contains("FIRST_PARENT_MISS/") || lines[3].contains("CLOSEST_PARENT_MISS/"),
        "{lines:?}"
    );
    let lines = sensible.log_lines(4).await;
    assert!(
        lines.iter().all(|l| l.contains("SINGLE_PARENT/")),
        "{lines:?}"
    );
    polling.stop().await;
    sensible.stop().await;
    parent.stop().await;
}
