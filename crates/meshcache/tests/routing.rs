//! Routing rules over real sockets: `never_direct` sends requests and CONNECT tunnels through a
//! parent (meshcache, or a real Squid) and never to the origin; with every parent down the
//! child answers 503 at once; `always_direct` wins over `never_direct`.

mod common;
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{dead_port, get, node, Node};
use meshcache_dcm::Role;
use meshcache_lab::Origin;
use meshcache_policy::{Action, RuleConfig};
use meshcache_proxy::config::PeerConfig;
use meshcache_proxy::Config;
use support::{tool, Squid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A child whose only peer is the parent at `parent` (no ICP), with `never_direct` for
/// everything and CONNECT allowed to `connect_port`.
async fn child(parent: SocketAddr, connect_port: u16, tweak: impl FnOnce(&mut Config)) -> Node {
    node(move |c: &mut Config| {
        c.name = "child".into();
        c.peers = vec![PeerConfig::new("parent", Role::Parent, parent, None)];
        c.never_direct = vec![RuleConfig::new(Action::Allow)];
        c.http.connect_ports = vec![connect_port];
        tweak(c);
    })
    .await
}

/// The access-log fields code/status (3) and hierarchy/peer (8) of the child's last line.
async fn last_line(node: &Node) -> (String, String) {
    let lines = node.log_lines(1).await;
    let line = lines.last().expect("a line");
    let field = |i: usize| line.split_whitespace().nth(i).unwrap_or("").to_owned();
    (field(3), field(8))
}

/// The fields code/status and hierarchy/peer of the node's first access-log line whose code
/// is `code`, waiting (at most 5 s: a tunnel is logged when it closes).
async fn line_with(node: &Node, code: &str) -> (String, String) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        for line in text.lines() {
            let field = |i: usize| line.split_whitespace().nth(i).unwrap_or("").to_owned();
            if field(3) == code {
                return (field(3), field(8));
            }
        }
        assert!(Instant::now() < until, "no {code} line in:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens a tunnel through `proxy` to `authority`, sends one HTTP/1.1 GET of `path` through it
/// and returns the CONNECT status line and the whole origin response.
async fn tunnel_get(proxy: SocketAddr, authority: &str, path: &str) -> (String, String) {
    let exchange = async {
        let mut s = TcpStream::connect(proxy).await.expect("connect");
        s.write_all(
            format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.expect("read") == 0 {
                break;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let status = head.lines().next().unwrap_or("").to_owned();
        if !status.contains(" 200") {
            return (status, String::new());
        }
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        (status, String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .expect("tunnel finished in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_direct_goes_through_the_parent_and_fails_fast_without_one() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let parent = node(|c: &mut Config| {
        c.name = "parent".into();
        c.http.connect_ports = vec![port];
    })
    .await;
    let kid = child(parent.addr, port, |_| {}).await;
    let path = "/via-parent?size=100&cc=max-age%3D60";
    let r = get(kid.addr, &origin.url(path)).await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits(path), 1);
    let (code, hier) = last_line(&kid).await;
    assert_eq!(code, "TCP_MISS/200");
    assert!(hier.starts_with("SINGLE_PARENT/"), "{hier}");
    assert!(
        r.header("via").contains("parent"),
        "the parent handled it: {:?}",
        r.header("via")
    );

    // CONNECT goes through the parent too.
    let (status, response) = tunnel_get(
        kid.addr,
        &format!("127.0.0.1:{port}"),
        "/tunnelled?size=5&text=hello",
    )
    .await;
    assert!(status.contains(" 200"), "{status}");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("hello"), "{response}");
    let (_, hier) = line_with(&kid, "TCP_TUNNEL/200").await;
    assert!(hier.starts_with("FIRSTUP_PARENT/"), "{hier}");
    // The parent opened the tunnel.
    line_with(&parent, "TCP_TUNNEL/200").await;
    kid.stop().await;
    parent.stop().await;

    // No parent up: 503 at once, and the origin never sees the request.
    let kid = child(dead_port().await, port, |_| {}).await;
    let path = "/no-parent?size=100";
    let started = Instant::now();
    let r = get(kid.addr, &origin.url(path)).await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    // The dead parent is marked down: the next request fails without trying it.
    let r = get(kid.addr, &origin.url(path)).await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.header("x-meshcache-error"), "no-route");
    let (status, _) = tunnel_get(kid.addr, &format!("127.0.0.1:{port}"), "/").await;
    assert!(status.contains(" 503"), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(origin.hits(path), 0, "never direct");
    kid.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_direct_wins_over_never_direct() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let dead = dead_port().await;
    let kid = child(dead, port, |c: &mut Config| {
        let mut direct = RuleConfig::new(Action::Allow);
        direct.url_regex = vec!["/direct".into()];
        c.always_direct = vec![direct];
    })
    .await;
    let r = get(kid.addr, &origin.url("/direct?size=10")).await;
    assert_eq!(r.status, 200);
    let (_, hier) = last_line(&kid).await;
    assert!(hier.starts_with("HIER_DIRECT/"), "{hier}");
    let r = get(kid.addr, &origin.url("/elsewhere?size=10")).await;
    assert_ne!(r.status, 200, "never_direct with a dead parent");
    assert_eq!(origin.hits("/elsewhere?size=10"), 0);
    kid.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_goes_through_a_squid_parent() {
    let Some(squid_bin) = tool("squid") else {
        panic!("squid is not installed: scripts/test.sh installs it");
    };
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let mut squid = Squid::new("routing", Ipv4Addr::new(127, 0, 0, 150));
    squid.start(&squid_bin, "").await;
    let kid = child(squid.http, port, |c: &mut Config| {
        c.http.listen = vec![SocketAddr::new(IpAddr::from([127, 0, 0, 151]), 0)];
    })
    .await;
    let (status, response) = tunnel_get(
        kid.addr,
        &format!("127.0.0.1:{port}"),
        "/through-squid?size=5&text=squid",
    )
    .await;
    assert!(status.contains(" 200"), "{status}\n{}", squid.diagnostics());
    assert!(response.ends_with("squid"), "{response}");
    let line = squid
        .log_line(|l| l.contains("CONNECT") && l.contains(&format!("127.0.0.1:{port}")))
        .await;
    assert!(line.contains("TCP_TUNNEL/200"), "{line}");
    let path = "/get-through-squid?size=10";
    let r = get(kid.addr, &origin.url(path)).await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits(path), 1);
    // The GET's line, not the tunnel's: a tunnel is logged when it closes, which may come
    // after the GET.
    let (_, hier) = line_with(&kid, "TCP_MISS/200").await;
    assert!(hier.starts_with("SINGLE_PARENT/"), "{hier}");
    kid.stop().await;
}
