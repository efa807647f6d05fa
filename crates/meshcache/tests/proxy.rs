//! The proxy's behaviour beyond the caching rules: collapsed forwarding, persistent upstream
//! connections, security limits, timeouts, tunnels, shutdown and metrics. Real sockets on
//! loopback, a real origin.

mod common;

use std::time::{Duration, Instant};

use common::{at_origin, dead_port, get, node, raw, request};
use meshcache_lab::Origin;
use meshcache_store::StoreEvent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_collapse_into_one_fetch() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let path = "/slow?delay_ms=300&size=5000&cc=max-age=60";
    let url = origin.url(path);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = url.clone();
        let addr = proxy.addr;
        tasks.push(tokio::spawn(async move { get(addr, &url).await }));
    }
    for t in tasks {
        let r = t.await.expect("task");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, meshcache_lab::expected_body(5000));
    }
    assert_eq!(
        origin.hits(path),
        1,
        "one upstream fetch for 20 concurrent misses"
    );
    let stats = proxy.stats().await;
    assert_eq!(stats["collapsed"], 19);
    proxy.stop().await;
}

#[tokio::test]
async fn upstream_connections_are_persistent() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    for i in 0..5 {
        let r = get(proxy.addr, &origin.url(&format!("/p{i}?size=10"))).await;
        assert_eq!(r.status, 200);
    }
    let stats = proxy.stats().await;
    assert_eq!(stats["upstream_connections_opened"], 1, "{stats}");
    assert_eq!(stats["upstream_connections_reused"], 4, "{stats}");
    proxy.stop().await;
}

#[tokio::test]
async fn clients_outside_the_acl_are_refused() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.http.allow = vec!["10.0.0.0/8".parse().expect("cidr")]).await;
    let r = get(proxy.addr, &origin.url("/x?size=10")).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-meshcache-error"), "access-denied");
    assert_eq!(origin.total(), 0);
    assert_eq!(proxy.log_code(1).await, "TCP_DENIED/403");
    proxy.stop().await;
}

#[tokio::test]
async fn connect_only_to_allowed_ports() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let proxy = node(|c| c.http.connect_ports = vec![port]).await;
    // Disallowed port.
    let out = raw(
        proxy.addr,
        b"CONNECT 127.0.0.1:25 HTTP/1.1\r\nHost: 127.0.0.1:25\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    // Allowed port: a tunnel to the origin carries a plain HTTP exchange.
    let req = format!(
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nGET /t?size=7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let out = raw(proxy.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("abcdefg"), "{out}");
    assert_eq!(origin.hits("/t?size=7"), 1);
    let lines = proxy.log_lines(2).await;
    assert!(
        lines.iter().any(|l| l.contains("TCP_DENIED/403")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("TCP_TUNNEL/200")),
        "{lines:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn smuggling_and_malformed_requests_are_refused_and_logged() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let a = origin.addr();
    let cases: Vec<(String, &str)> = vec![
        (format!("GET http://{a}/s HTTP/1.1\r\nHost: {a}\r\nX-Folded: a\r\n b\r\n\r\n"), "HTTP/1.1 400"),
        (format!("POST http://{a}/s HTTP/1.1\r\nHost: {a}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"), "HTTP/1.1 400"),
        (format!("GET http://{a}/s HTTP/1.1\r\nHost: {a}\r\nX-Big: {}\r\n\r\n", "a".repeat(70_000)), "HTTP/1.1 431"),
        (format!("GET http://{a}/s HTTP/1.1\r\nHost: {a}\r\n{}\r\n", "X-H: 1\r\n".repeat(150)), "HTTP/1.1 431"),
        ("GET /s HTTP/1.1\r\nHost: x\r\n\r\n".to_string(), "HTTP/1.1 400"),
        (format!("GET http://{a}/s HTTP/1.1\r\nHost: {a}\r\nVia: 1.1 testcache (meshcache/0)\r\n\r\n"), "HTTP/1.1 508"),
        (format!("GET ftp://{a}/s HTTP/1.1\r\nHost: {a}\r\n\r\n"), "HTTP/1.1 501"),
        ("BREW coffee\r\n\r\n".to_string(), "HTTP/1.1 400"),
    ];
    for (i, (req, want)) in cases.iter().enumerate() {
        let out = raw(proxy.addr, req.as_bytes()).await;
        assert!(
            out.starts_with(want),
            "case {i}: wanted {want}, got {out:?}"
        );
    }
    // Every refusal is logged, and the origin saw none of them.
    let lines = proxy.log_lines(cases.len()).await;
    assert_eq!(lines.len(), cases.len(), "{lines:?}");
    assert_eq!(origin.total(), 0);
    // Our own refusals explain themselves.
    let out = raw(proxy.addr, cases[0].0.as_bytes()).await;
    assert!(
        out.contains("obs-fold") || out.starts_with("HTTP/1.1 400"),
        "{out}"
    );
    let out = raw(proxy.addr, cases[4].0.as_bytes()).await;
    assert!(out.contains("absolute URL"), "{out}");
    proxy.stop().await;
}

/// Content-Length together with Transfer-Encoding is refused before anything is forwarded, so
/// bytes hidden after the chunked body can never be taken for a second request.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let a = origin.addr();
    let req = format!(
        "POST http://{a}/s HTTP/1.1\r\nHost: {a}\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET http://{a}/smuggled HTTP/1.1\r\nHost: {a}\r\n\r\n"
    );
    let out = raw(proxy.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("request-smuggling"), "{out}");
    assert_eq!(
        out.matches("HTTP/1.1 ").count(),
        1,
        "one response only: {out}"
    );
    assert_eq!(origin.total(), 0);
    assert_eq!(proxy.log_code(1).await, "NONE_NONE/400");
    proxy.stop().await;
}

#[tokio::test]
async fn a_bad_chunked_request_body_is_refused() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let a = origin.addr();
    let req = format!("POST http://{a}/c HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n");
    let out = raw(proxy.addr, req.as_bytes()).await;
    assert!(
        out.is_empty() || out.starts_with("HTTP/1.1 4") || out.starts_with("HTTP/1.1 5"),
        "{out}"
    );
    // Still serving.
    assert_eq!(
        get(proxy.addr, &origin.url("/after?size=3")).await.status,
        200
    );
    proxy.stop().await;
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    let proxy = node(|c| c.http.header_read_timeout = Duration::from_millis(500)).await;
    let started = Instant::now();
    let out = raw(proxy.addr, b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127").await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "connection held {took:?}: {out}"
    );
    // Answered, and logged as Squid logs a request that timed out.
    assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
    assert!(out.contains("http.header_read_timeout"), "{out}");
    assert_eq!(proxy.log_code(1).await, "NONE_NONE/408");
    proxy.stop().await;
}

#[tokio::test]
async fn slow_and_dead_origins_give_clear_errors() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.upstream.read_timeout = Duration::from_millis(300)).await;
    let r = get(proxy.addr, &origin.url("/slow?delay_ms=2000")).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("x-meshcache-error"), "upstream-timeout");
    let dead = dead_port().await;
    let r = get(proxy.addr, &format!("http://{dead}/x")).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-meshcache-error"), "connect-failed");
    assert!(String::from_utf8_lossy(&r.body).contains("cannot connect"));
    assert_eq!(proxy.log_code(1).await, "TCP_MISS/504");
    assert_eq!(proxy.log_code(2).await, "TCP_MISS/502");
    proxy.stop().await;
}

#[tokio::test]
async fn stale_if_error_serves_the_stale_copy_when_the_origin_dies() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let origin = Origin::spawn(listener, async {
        let _ = stop_rx.await;
    });
    let proxy = node(|_| {}).await;
    let url = origin.url("/sie?size=10&cc=max-age=1,stale-if-error=60");
    let no_fallback = origin.url("/plain?size=10&cc=max-age=1");
    assert_eq!(get(proxy.addr, &url).await.x_cache(), "MISS");
    assert_eq!(get(proxy.addr, &no_fallback).await.x_cache(), "MISS");
    let _ = stop_tx.send(());
    drop(origin);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(proxy.addr, &url).await;
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    assert_eq!(proxy.log_code(3).await, "TCP_REFRESH_FAIL_OLD/200");
    let r = get(proxy.addr, &no_fallback).await;
    assert_eq!(r.status, 502);
    assert_eq!(proxy.log_code(4).await, "TCP_REFRESH_FAIL_ERR/502");
    proxy.stop().await;
}

#[tokio::test]
async fn http_1_0_clients_are_served() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let req = format!(
        "GET {} HTTP/1.0\r\n\r\n",
        origin.url("/old?size=5&chunked=1&cc=max-age=60")
    );
    for _ in 0..2 {
        let out = raw(proxy.addr, req.as_bytes()).await;
        assert!(
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
            "{out}"
        );
        assert!(out.ends_with("abcde"), "{out}");
        assert!(
            !out.to_ascii_lowercase().contains("transfer-encoding"),
            "{out}"
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn accelerator_mode_serves_origin_form() {
    let origin = Origin::start().await.expect("origin");
    let accel = origin.addr().to_string();
    let proxy = node(move |c| c.http.accelerate = Some(accel)).await;
    let out = raw(
        proxy.addr,
        b"GET /acc?size=4&cc=max-age=60 HTTP/1.1\r\nHost: www\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("abcd"),
        "{out}"
    );
    assert_eq!(origin.hits("/acc?size=4&cc=max-age=60"), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn request_bodies_stream_to_the_origin() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let a = origin.addr();
    let body = "x".repeat(100_000);
    let req = format!("PUT http://{a}/put HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let out = raw(proxy.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("x-request-body-bytes: 100000"),
        "{out}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn store_events_reach_subscribers() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let mut events = proxy.proxy.cache().subscribe();
    get(proxy.addr, &origin.url("/ev?size=10&cc=max-age=60")).await;
    request(
        proxy.addr,
        "DELETE",
        &origin.url("/ev?size=10&cc=max-age=60"),
        &[],
    )
    .await;
    let first = tokio::time::timeout(Duration::from_secs(2), events.recv())
        .await
        .expect("event")
        .expect("recv");
    assert!(matches!(first, StoreEvent::Admitted { .. }), "{first:?}");
    let second = tokio::time::timeout(Duration::from_secs(2), events.recv())
        .await
        .expect("event")
        .expect("recv");
    assert!(
        matches!(second, StoreEvent::Invalidated { .. }),
        "{second:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn replacement_keeps_the_store_within_budget() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| {
        c.store.memory = 64 * 1024;
        c.store.max_object_size = 16 * 1024;
    })
    .await;
    for i in 0..20 {
        get(
            proxy.addr,
            &origin.url(&format!("/fill{i}?size=10000&cc=max-age=60")),
        )
        .await;
    }
    let stats = proxy.stats().await;
    let store = &stats["store"];
    assert!(
        store["bytes"].as_u64().expect("bytes") <= 64 * 1024,
        "{stats}"
    );
    assert!(store["evicted"].as_u64().expect("evicted") >= 14, "{stats}");
    // The most recent object is still there; the first was evicted.
    assert_eq!(
        get(proxy.addr, &origin.url("/fill19?size=10000&cc=max-age=60"))
            .await
            .x_cache(),
        "HIT"
    );
    assert_eq!(
        get(proxy.addr, &origin.url("/fill0?size=10000&cc=max-age=60"))
            .await
            .x_cache(),
        "MISS"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let url = origin.url("/inflight?delay_ms=500&size=100");
    let addr = proxy.addr;
    let pending = tokio::spawn(async move { get(addr, &url).await });
    at_origin(&origin, "/inflight?delay_ms=500&size=100").await;
    let stopping = tokio::spawn(proxy.stop());
    let r = pending.await.expect("request");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100);
    stopping.await.expect("stopped");
    // And nothing listens any more.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn metrics_and_stats_are_served() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    get(proxy.addr, &origin.url("/m?size=10&cc=max-age=60")).await;
    get(proxy.addr, &origin.url("/m?size=10&cc=max-age=60")).await;
    proxy.log_lines(2).await;
    let m = proxy.admin_get("/metrics").await;
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains("meshcache_requests_total{result=\"TCP_MEM_HIT\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("meshcache_requests_total{result=\"TCP_MISS\"} 1"),
        "{text}"
    );
    assert!(text.contains("meshcache_store_objects 1"), "{text}");
    let stats = proxy.stats().await;
    assert_eq!(stats["hits"], 1);
    assert_eq!(stats["requests"], 2);
    assert!(stats["latency_ms"]["p99"].as_f64().expect("p99") > 0.0);
    proxy.stop().await;
}

#[tokio::test]
async fn connection_limit_makes_extra_clients_wait() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.http.max_connections = 1).await;
    // The first client holds the only slot with an idle keep-alive connection.
    let held = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    // Accepted (and so holding the slot) before the second client comes.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while proxy.stats().await["client_connections"] != 1 {
        assert!(std::time::Instant::now() < until, "never accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let url = origin.url("/limit?size=3");
    let addr = proxy.addr;
    let waiting = tokio::spawn(async move { get(addr, &url).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "second client was served while the slot was taken"
    );
    drop(held);
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served after release")
        .expect("task");
    assert_eq!(r.status, 200);
    proxy.stop().await;
}

#[tokio::test]
async fn clients_keep_their_connection_across_requests() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let url = origin.url("/keep?size=2000&cc=max-age=600");
    let mut verdicts = Vec::new();
    for _ in 0..3 {
        let req = http::Request::get(url.as_str())
            .body(Empty::<bytes::Bytes>::new())
            .expect("request");
        // The same connection serves each request in turn: `send_request` fails if it closed.
        let resp = sender.send_request(req).await.expect("same connection");
        assert_eq!(resp.status(), 200);
        let x_cache = resp
            .headers()
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body, meshcache_lab::expected_body(2000));
        verdicts.push(x_cache.split_whitespace().next().unwrap_or("").to_owned());
    }
    assert_eq!(verdicts, ["MISS", "HIT", "HIT"]);
    let lines = proxy.log_lines(3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    proxy.stop().await;
}

#[tokio::test]
async fn a_truncated_origin_body_is_never_stored() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An origin that promises 1,000 bytes of a cacheable object, sends 500 and hangs up.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicU64::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        for _ in 0..10 {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            count.fetch_add(1, Ordering::SeqCst);
            let head =
                "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: max-age=600\r\n\r\n";
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&[b'x'; 500]).await;
            let _ = s.shutdown().await;
        }
    });
    let proxy = node(|_| {}).await;
    let url = format!("http://{addr}/cut");
    for round in 0..2 {
        let stream = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let mut stream = stream;
        let req = format!("GET {url} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        // The client never gets a complete 1,000-byte body it could take for the object.
        let body_len = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
        assert!(body_len < 1000, "round {round}: {body_len} body bytes");
        assert!(!text.contains("X-Cache: HIT"), "round {round}: {text}");
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "the cut object was not stored: the second request went to the origin again"
    );
    let stats = proxy.stats().await;
    assert_eq!(stats["store"]["objects"], 0, "{stats}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collapsed_request_waits_at_most_collapse_timeout_then_fetches_itself() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.cache.collapse_timeout = Duration::from_millis(200)).await;
    let path = "/collapse?delay_ms=1500&size=100&cc=max-age=60";
    let url = origin.url(path);
    let (addr, leader_url) = (proxy.addr, url.clone());
    let leader = tokio::spawn(async move { get(addr, &leader_url).await });
    for _ in 0..200 {
        if origin.hits(path) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The follower gives up waiting for the leader's slow fetch and asks the origin itself
    // (had it waited for the leader, the stored copy would have served it: one origin hit).
    let follower = get(proxy.addr, &url).await;
    assert_eq!(follower.status, 200);
    assert_eq!(origin.hits(path), 2, "the follower went upstream itself");
    assert_eq!(leader.await.expect("leader").status, 200);
    let stats = proxy.stats().await;
    assert_eq!(stats["collapsed"], 1, "{stats}");
    proxy.stop().await;
}

#[tokio::test]
async fn a_response_head_is_relayed_before_its_body_has_arrived() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    // The origin sends the head at once and the body two seconds later.
    let url = origin.url("/streamed?stall_ms=2000&size=1000");
    use tokio::io::AsyncReadExt;
    let mut s = open_get(proxy.addr, &url).await;
    let mut head = Vec::new();
    let got_head = tokio::time::timeout(Duration::from_millis(1500), async {
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early");
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(
        got_head.is_ok(),
        "the head waited for the body: {:?}",
        String::from_utf8_lossy(&head)
    );
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    proxy.stop().await;
}

#[tokio::test]
async fn hop_by_hop_response_headers_stop_at_the_proxy_on_misses_and_hits() {
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    // The origin names X-Secret as hop-by-hop in Connection, and sends Keep-Alive and
    // an end-to-end header beside them.
    let url = origin.url(
        "/hop?size=10&cc=max-age=60&hdr=Connection:x-secret&hdr=X-Secret:1&hdr=Keep-Alive:timeout=5&hdr=X-Kept:yes",
    );
    for expect in ["MISS", "HIT"] {
        let r = get(proxy.addr, &url).await;
        assert_eq!((r.status, r.x_cache()), (200, expect));
        assert_eq!(
            r.header("x-kept"),
            "yes",
            "{expect}: end-to-end headers pass"
        );
        assert!(
            r.headers.get("x-secret").is_none(),
            "{expect}: {:?}",
            r.headers
        );
        assert!(
            r.headers.get("keep-alive").is_none(),
            "{expect}: {:?}",
            r.headers
        );
        assert!(
            !r.header("connection").contains("x-secret"),
            "{expect}: {:?}",
            r.headers
        );
        assert!(r.header("via").contains("testcache"), "{expect}: Via added");
    }
    proxy.stop().await;
}

/// What `getsockopt` reports for a buffer size granted in full: Linux doubles it.
const SOCKOPT_REPORTED_FACTOR: u64 = if cfg!(target_os = "linux") { 2 } else { 1 };

/// Checks one side of `/stats` → `sockets` against the options asked for.
fn assert_socket_side(
    stats: &serde_json::Value,
    side: &str,
    asked: &meshcache_proxy::config::SocketOptions,
    connections: u64,
) {
    let s = &stats["sockets"][side];
    assert_eq!(s["connections"], connections, "{side}: {s}");
    let last = &s["last"];
    for (name, want) in [
        ("send_buffer", asked.send_buffer),
        ("recv_buffer", asked.recv_buffer),
    ] {
        let want = want.expect("asked") * SOCKOPT_REPORTED_FACTOR;
        assert_eq!(last[name], want, "{side}.{name}: {s}");
    }
    assert_eq!(last["nodelay"], asked.nodelay, "{side}.nodelay: {s}");
}

/// Each side's socket options reach the proxy's own end of the connection: the proxy reads them
/// back with getsockopt (`/stats` → `sockets`) for a client connection, a pooled origin
/// connection and a CONNECT tunnel. The sides get different buffer sizes, and TCP_NODELAY is
/// flipped between two runs, so an option left unapplied (the kernel's default) or taken from
/// the other side shows.
#[tokio::test]
async fn socket_options_are_applied_per_side() {
    use meshcache_proxy::config::SocketOptions;
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    for (client_nodelay, upstream_nodelay) in [(true, false), (false, true)] {
        let client = SocketOptions {
            nodelay: client_nodelay,
            send_buffer: Some(44 * 1024),
            recv_buffer: Some(56 * 1024),
        };
        let upstream = SocketOptions {
            nodelay: upstream_nodelay,
            send_buffer: Some(36 * 1024),
            recv_buffer: Some(68 * 1024),
        };
        let (c, u) = (client.clone(), upstream.clone());
        let proxy = node(move |cfg| {
            cfg.http.socket = c;
            cfg.upstream.socket = u;
            cfg.http.connect_ports = vec![port];
        })
        .await;
        let stats = proxy.stats().await;
        assert!(stats["sockets"]["client"]["last"].is_null(), "{stats}");
        let r = get(proxy.addr, &origin.url("/sockopt?size=10")).await;
        assert_eq!(r.status, 200);
        let stats = proxy.stats().await;
        assert_socket_side(&stats, "client", &client, 1);
        assert_socket_side(&stats, "upstream", &upstream, 1);
        // A tunnel's upstream connection is an upstream connection too.
        let req = format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nGET /t?size=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let out = raw(proxy.addr, req.as_bytes()).await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("abc"),
            "{out}"
        );
        let stats = proxy.stats().await;
        assert_socket_side(&stats, "client", &client, 2);
        assert_socket_side(&stats, "upstream", &upstream, 2);
        proxy.stop().await;
    }
}

/// `upstream.source_address` is the local address of every upstream connection: an origin sees
/// fetches and CONNECT tunnels come from it (without it, from the kernel's choice, 127.0.0.1).
#[tokio::test]
async fn upstream_connections_leave_from_the_source_address() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // A one-response-per-connection origin that reports who connected.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut conn, peer)) = listener.accept().await else {
                return;
            };
            let _ = tx.send(peer.ip());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    for source in [Some("127.0.0.7"), None] {
        let src = source.map(|s| s.parse().expect("ip"));
        let proxy = node(move |cfg| {
            cfg.upstream.source_address = src;
            cfg.http.connect_ports = vec![port];
        })
        .await;
        let want: std::net::IpAddr = source.unwrap_or("127.0.0.1").parse().expect("ip");
        let r = get(proxy.addr, &format!("http://127.0.0.1:{port}/s")).await;
        assert_eq!(r.status, 200);
        assert_eq!(rx.recv().await, Some(want), "fetch from {source:?}");
        let req = format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nGET /t HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        let out = raw(proxy.addr, req.as_bytes()).await;
        assert!(out.ends_with("ok"), "{out}");
        assert_eq!(rx.recv().await, Some(want), "tunnel from {source:?}");
        proxy.stop().await;
    }
    server.abort();
}

/// FNV-1a over a byte stream, fed in whatever pieces it arrives in.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// `len` pseudo-random bytes (xorshift), so that a lost, repeated or reordered piece shows.
fn noise(len: usize, seed: u64) -> bytes::Bytes {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out.into()
}

/// A raw connection to the proxy at `addr` on which `GET url` has been sent (nothing read).
async fn open_get(addr: std::net::SocketAddr, url: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("request");
    s
}

/// Everything the proxy sends back on `s` until it closes (within [`STREAM_WAIT`]), lower-case.
async fn answer_text(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    tokio::time::timeout(STREAM_WAIT, s.read_to_end(&mut out))
        .await
        .expect("response in time")
        .expect("read");
    String::from_utf8_lossy(&out).to_ascii_lowercase()
}

/// The in-process origin of the streaming tests.
///
/// A POST is read frame by frame, publishing how many body bytes have arrived so far, and is
/// answered once it ended with the count and FNV-1a hash of what arrived
/// (`X-Received-Bytes`, `X-Received-Fnv`). A GET is answered with `body` (with its length, or
/// chunked for `/chunked`), of which the second half is sent only after `go` fires.
#[derive(Clone, Default)]
struct StreamOrigin {
    addr: Option<std::net::SocketAddr>,
    body: bytes::Bytes,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    go: std::sync::Arc<tokio::sync::Notify>,
    /// Set when the origin has handed its last response byte to its connection.
    sent_all: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A response body fed through a channel, frame by frame.
struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    len: Option<u64>,
}

impl hyper::body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|piece| piece.map(|b| Ok(hyper::body::Frame::data(b))))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.len {
            Some(n) => hyper::body::SizeHint::with_exact(n),
            None => hyper::body::SizeHint::default(),
        }
    }
}

impl StreamOrigin {
    async fn start(body: bytes::Bytes) -> StreamOrigin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let origin = StreamOrigin {
            addr: Some(listener.local_addr().expect("addr")),
            body,
            ..StreamOrigin::default()
        };
        let shared = origin.clone();
        tokio::spawn(async move {
            for _ in 0..16 {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let shared = shared.clone();
                let svc = hyper::service::service_fn(move |req| shared.clone().answer(req));
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
                );
            }
        });
        origin
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.addr.expect("started")
    }

    fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn answer(
        self,
        req: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<ChannelBody>, std::convert::Infallible> {
        use http_body_util::BodyExt;
        use std::sync::atomic::Ordering;
        const PIECE: usize = 256 * 1024;
        if req.method() == http::Method::POST {
            let mut incoming = req.into_body();
            let mut hash = Fnv::new();
            while let Some(Ok(frame)) = incoming.frame().await {
                if let Some(data) = frame.data_ref() {
                    hash.update(data);
                    self.received.fetch_add(data.len() as u64, Ordering::SeqCst);
                }
            }
            let mut resp = http::Response::new(ChannelBody {
                rx: tokio::sync::mpsc::channel(1).1,
                len: Some(0),
            });
            let h = resp.headers_mut();
            h.insert("x-received-bytes", self.received().into());
            let fnv = format!("{:016x}", hash.0);
            h.insert("x-received-fnv", fnv.parse().expect("value"));
            return Ok(resp);
        }
        let chunked = req.uri().path() == "/chunked";
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let len = self.body.len();
        let mut resp = http::Response::new(ChannelBody {
            rx,
            len: (!chunked).then_some(len as u64),
        });
        resp.headers_mut().insert(
            "cache-control",
            http::HeaderValue::from_static("max-age=60"),
        );
        tokio::spawn(async move {
            let half = (len / 2).next_multiple_of(PIECE);
            for start in (0..len).step_by(PIECE) {
                if start == half {
                    self.go.notified().await;
                }
                let piece = self.body.slice(start..(start + PIECE).min(len));
                if tx.send(piece).await.is_err() {
                    return;
                }
            }
            self.sent_all.store(true, Ordering::SeqCst);
        });
        Ok(resp)
    }
}

/// How long a streaming test waits for bytes to come through before it calls the body held.
const STREAM_WAIT: Duration = Duration::from_secs(20);

/// A 64 MiB request body, chunked and with Content-Length, reaches the origin while the client
/// is still sending it: the client sends the first half, then waits (at most [`STREAM_WAIT`])
/// until the origin has all of it before sending the rest. A proxy that buffered the body would
/// hand the origin nothing until the client had finished. The origin gets exactly the bytes
/// sent (length and FNV-1a hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_bodies_reach_the_origin_while_the_client_still_sends() {
    use tokio::io::AsyncWriteExt;
    const LEN: usize = 64 << 20;
    const PIECE: usize = 1 << 20;
    let body = noise(LEN, 7);
    let mut want = Fnv::new();
    want.update(&body);
    let proxy = node(|_| {}).await;
    for chunked in [true, false] {
        let origin = StreamOrigin::start(bytes::Bytes::new()).await;
        let a = origin.addr();
        let framing = if chunked {
            "Transfer-Encoding: chunked".to_owned()
        } else {
            format!("Content-Length: {LEN}")
        };
        let mut s = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let head = format!(
            "POST http://{a}/upload HTTP/1.1\r\nHost: {a}\r\n{framing}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.expect("head");
        let mut sent = 0;
        for (i, piece) in body.chunks(PIECE).enumerate() {
            if i == LEN / PIECE / 2 {
                // Half sent: the origin must have it all before the client goes on.
                let until = Instant::now() + STREAM_WAIT;
                while origin.received() < sent as u64 && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(
                    origin.received(),
                    sent as u64,
                    "chunked={chunked}: the origin got {} of the {sent} bytes sent so far within {STREAM_WAIT:?}: the proxy holds the request body back",
                    origin.received()
                );
            }
            if chunked {
                s.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await
                    .expect("chunk size");
            }
            s.write_all(piece).await.expect("body");
            if chunked {
                s.write_all(b"\r\n").await.expect("chunk end");
            }
            sent += piece.len();
        }
        if chunked {
            s.write_all(b"0\r\n\r\n").await.expect("last chunk");
        }
        let text = answer_text(&mut s).await;
        assert!(
            text.starts_with("http/1.1 200"),
            "chunked={chunked}: {text}"
        );
        assert!(
            text.contains(&format!("x-received-bytes: {LEN}\r\n")),
            "chunked={chunked}: {text}"
        );
        assert!(
            text.contains(&format!("x-received-fnv: {:016x}\r\n", want.0)),
            "chunked={chunked}: the origin got other bytes than were sent: {text}"
        );
    }
    proxy.stop().await;
}

/// A 64 MiB response, with Content-Length and chunked (cacheable, so the chunked one is also
/// captured for the store until it outgrows `store.max_object_size`), reaches the client while
/// the origin is still sending it: the origin sends the first half and holds the second back
/// until the client has received the first (at most [`STREAM_WAIT`]). The client gets exactly
/// the bytes sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_reach_the_client_while_the_origin_still_sends() {
    use http_body_util::BodyExt;
    use std::sync::atomic::Ordering;
    const LEN: usize = 64 << 20;
    let body = noise(LEN, 11);
    let mut want = Fnv::new();
    want.update(&body);
    let proxy = node(|_| {}).await;
    for path in ["/length", "/chunked"] {
        let origin = StreamOrigin::start(body.clone()).await;
        let stream = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let url = format!("http://{}{path}", origin.addr());
        let req = http::Request::get(url.as_str())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = tokio::time::timeout(STREAM_WAIT, sender.send_request(req))
            .await
            .expect("head in time")
            .expect("response");
        assert_eq!(resp.status(), 200, "{path}");
        let mut incoming = resp.into_body();
        let (mut got, mut hash) = (0usize, Fnv::new());
        let first_half = tokio::time::timeout(STREAM_WAIT, async {
            while got < LEN / 2 {
                let frame = incoming.frame().await.expect("more body").expect("frame");
                if let Some(data) = frame.data_ref() {
                    got += data.len();
                    hash.update(data);
                }
            }
        })
        .await;
        assert!(
            first_half.is_ok() && !origin.sent_all.load(Ordering::SeqCst),
            "{path}: the client got {got} bytes of the {} the origin sent before holding back: the proxy holds the response back",
            LEN / 2
        );
        origin.go.notify_one();
        let rest = tokio::time::timeout(STREAM_WAIT, async {
            while let Some(frame) = incoming.frame().await {
                if let Some(data) = frame.expect("frame").data_ref() {
                    got += data.len();
                    hash.update(data);
                }
            }
        })
        .await;
        assert!(rest.is_ok(), "{path}: the rest did not come in time");
        assert_eq!(got, LEN, "{path}");
        assert!(origin.sent_all.load(Ordering::SeqCst), "{path}");
        assert_eq!(hash.0, want.0, "{path}: other bytes than the origin sent");
    }
    proxy.stop().await;
}

/// A request body that keeps arriving, slowly, for longer than `upstream.read_timeout` is sent
/// whole: the wait for the origin's answer counts from the last byte the proxy sent it, not
/// from the first. 24 pieces of 8 KiB, one every 100 ms (2.4 s), against a 600 ms timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_outlasting_the_upstream_read_timeout_is_not_cut() {
    use tokio::io::AsyncWriteExt;
    const PIECES: usize = 24;
    const PIECE: usize = 8 << 10;
    let body = noise(PIECES * PIECE, 3);
    let mut want = Fnv::new();
    want.update(&body);
    let proxy = node(|c| c.upstream.read_timeout = Duration::from_millis(600)).await;
    let origin = StreamOrigin::start(bytes::Bytes::new()).await;
    let a = origin.addr();
    let mut s = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST http://{a}/upload HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    for piece in body.chunks(PIECE) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if s.write_all(piece).await.is_err() {
            break;
        }
    }
    let text = answer_text(&mut s).await;
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(
        text.contains(&format!("x-received-fnv: {:016x}\r\n", want.0)),
        "{text}"
    );
    proxy.stop().await;
}

/// A tunnel that carries bytes one way only, for longer than `http.idle_timeout`, stays open:
/// the quiet direction is not idle while the other one moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_way_tunnel_outlasting_the_idle_timeout_is_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PIECES: usize = 24;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // The far end reads until the client says it is done, then answers with the count.
    let sink = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut n = 0u64;
        let mut buf = [0u8; 4096];
        loop {
            let k = s.read(&mut buf).await.expect("read");
            if k == 0 {
                break;
            }
            n += k as u64;
            if buf[..k].ends_with(b"end\n") {
                break;
            }
        }
        s.write_all(format!("got {n}\n").as_bytes())
            .await
            .expect("answer");
    });
    let proxy = node(|c| {
        c.http.connect_ports = vec![port];
        c.http.idle_timeout = Duration::from_millis(600);
    })
    .await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    s.write_all(
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .expect("connect request");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("connect answer");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for _ in 0..PIECES {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"0123456789").await.expect("piece");
    }
    s.write_all(b"end\n").await.expect("end");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(STREAM_WAIT, s.read_to_end(&mut out)).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("got {}\n", PIECES * 10 + 4)
    );
    sink.await.expect("sink");
    proxy.stop().await;
}

/// A kept-alive client connection that goes silent after its request is closed once
/// `http.idle_timeout` passes, and a pooled upstream connection outlives
/// `upstream.read_timeout` (the pool's own `upstream.idle_timeout` governs it there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_end_by_their_own_limits() {
    use tokio::io::AsyncReadExt;
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| {
        c.http.idle_timeout = Duration::from_millis(700);
        c.upstream.read_timeout = Duration::from_millis(300);
    })
    .await;
    let url = origin.url("/idle?size=5");
    let mut s = open_get(proxy.addr, &url).await;
    let started = Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(STREAM_WAIT, s.read_to_end(&mut out)).await;
    let held = started.elapsed();
    assert!(
        read.is_ok(),
        "the connection stayed open past {STREAM_WAIT:?}"
    );
    assert!(String::from_utf8_lossy(&out).ends_with("abcde"));
    assert!(
        held >= Duration::from_millis(600) && held < Duration::from_secs(5),
        "closed after {held:?}, the idle timeout being 700 ms"
    );
    // The upstream connection waited in the pool for more than its read timeout, and is reused.
    let r = get(proxy.addr, &origin.url("/idle2?size=5")).await;
    assert_eq!(r.status, 200);
    let stats = proxy.stats().await;
    assert_eq!(stats["upstream_connections_opened"], 1, "{stats}");
    assert_eq!(stats["upstream_connections_reused"], 1, "{stats}");
    proxy.stop().await;
}

/// A client that takes a large answer slowly, for longer than `upstream.read_timeout`, gets
/// all of it: the origin waiting for the proxy to read on is not a silent origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_download_outlasting_the_upstream_read_timeout_is_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LEN: usize = 8 << 20;
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|c| c.upstream.read_timeout = Duration::from_millis(300)).await;
    let url = origin.url(&format!("/big?size={LEN}&cc=no-store"));
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(64 << 10).expect("rcvbuf");
    let mut s = socket.connect(proxy.addr).await.expect("connect");
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let started = Instant::now();
    let mut got = 0usize;
    let mut buf = vec![0u8; 256 << 10];
    while started.elapsed() < STREAM_WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(
        started.elapsed() > Duration::from_millis(900),
        "the download took only {:?}: too fast to test the limit",
        started.elapsed()
    );
    assert!(
        got > LEN,
        "got {got} bytes of a {LEN}-byte body and its head"
    );
    proxy.stop().await;
}

/// A client that goes away before its answer is whole still gets its access-log line, with
/// Squid's `_ABORTED` suffix: `…_ABORTED/000` when it left while the proxy waited for the
/// origin, `…_ABORTED/200` with the bytes it got when it left mid-body. Both are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_leave_early_are_logged_as_aborted() {
    use tokio::io::AsyncReadExt;
    const LEN: usize = 32 << 20;
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    // Gone while the origin thinks.
    let slow = origin.url("/think?delay_ms=600&size=10");
    let s = open_get(proxy.addr, &slow).await;
    at_origin(&origin, "/think?delay_ms=600&size=10").await;
    drop(s);
    let lines = proxy.log_lines(1).await;
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(fields[3], "TCP_MISS_ABORTED/000", "{lines:?}");
    assert_eq!(fields[4], "0", "{lines:?}");
    // Gone mid-body.
    let big = origin.url(&format!("/big?size={LEN}&cc=no-store"));
    let mut s = open_get(proxy.addr, &big).await;
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < 256 << 10 {
        got += s.read(&mut buf).await.expect("read");
    }
    drop(s);
    let lines = proxy.log_lines(2).await;
    let fields: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(fields[3], "TCP_MISS_ABORTED/200", "{lines:?}");
    let bytes: usize = fields[4].parse().expect("bytes");
    assert!(bytes < LEN, "{lines:?}");
    // A whole answer is not aborted.
    let r = get(proxy.addr, &origin.url("/whole?size=10")).await;
    assert_eq!(r.status, 200);
    assert_eq!(proxy.log_code(3).await, "TCP_MISS/200");
    assert_eq!(proxy.stats().await["aborted"], 2);
    proxy.stop().await;
}
