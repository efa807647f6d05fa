//! Large cache hits go out with sendfile(2) from the body arena: the bytes are right, ranges
//! too, and a client that has not read its response yet keeps the bytes it was sent even after
//! the object was evicted and its pages' range reused for another object.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::{get, node, request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Distinct, reproducible content for each path (so a body served from another object's
/// pages cannot pass for this one).
fn content(path: &str, len: usize) -> Vec<u8> {
    let mut x = path.bytes().fold(0x9e37_79b9_7f4a_7c15_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 56) as u8
        })
        .collect()
}

/// An origin answering every GET for `/NAME?len=N` with `content("/NAME", N)`, cacheable for
/// ten minutes, on persistent connections.
async fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let n = match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
                        let len = query
                            .strip_prefix("len=")
                            .and_then(|l| l.parse().ok())
                            .unwrap_or(0);
                        let body = content(path, len);
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nCache-Control: max-age=600\r\n\r\n"
                        );
                        if s.write_all(head.as_bytes()).await.is_err()
                            || s.write_all(&body).await.is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn large_hits_are_sent_from_the_arena_with_the_right_bytes() {
    let origin = origin().await;
    let proxy = node(|_| {}).await;
    let len = 1_000_003;
    let url = format!("http://{origin}/big?len={len}");
    let want = content("/big", len);
    let miss = get(proxy.addr, &url).await;
    assert_eq!(miss.x_cache(), "MISS");
    assert!(miss.body == want, "miss body differs");
    for _ in 0..3 {
        let hit = get(proxy.addr, &url).await;
        assert_eq!(hit.x_cache(), "HIT");
        assert!(hit.body == want, "hit body differs");
    }
    let range = request(proxy.addr, "GET", &url, &[("range", "bytes=5000-299999")]).await;
    assert_eq!(range.status, 206);
    assert!(range.body == want[5000..300_000], "range body differs");
    // A small object stays on the heap and is written as before.
    let small = format!("http://{origin}/small?len=1000");
    get(proxy.addr, &small).await;
    assert!(get(proxy.addr, &small).await.body == content("/small", 1000));

    let arena = &proxy.stats().await["store"]["arena"];
    assert_eq!(arena["placed"], 1, "{arena}");
    assert_eq!(arena["held_extents"], 1, "{arena}");
    assert_eq!(arena["held_bytes"], 1_003_520, "{arena}"); // 245 pages
    assert_eq!(arena["fallbacks"], 0, "{arena}");
    // Three full hits and the range went out with sendfile; the miss streamed from the origin.
    assert_eq!(arena["sent_bytes"], 3 * len as u64 + 295_000, "{arena}");
    proxy.stop().await;
}

#[tokio::test]
async fn without_zero_copy_every_body_is_on_the_heap() {
    let origin = origin().await;
    let proxy = node(|c| c.store.zero_copy = false).await;
    let url = format!("http://{origin}/big?len=200000");
    get(proxy.addr, &url).await;
    let hit = get(proxy.addr, &url).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert!(hit.body == content("/big", 200_000));
    let stats = proxy.stats().await;
    assert!(stats["store"]["arena"].is_null(), "{stats}");
    proxy.stop().await;
}

/// The pages a socket was given stay what they were: the client reads its response only after
/// the object was evicted and two other objects were stored (the second into the range the
/// first one's pages had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reading_late_gets_the_bytes_it_was_sent() {
    let origin = origin().await;
    // Room for one object at a time: each new one evicts the last.
    let proxy = node(|c| {
        c.store.memory = 300 * 1024;
        c.store.max_object_size = 256 * 1024;
    })
    .await;
    let len = 192 * 1024;
    let url = |name: &str| format!("http://{origin}/{name}?len={len}");
    get(proxy.addr, &url("a")).await;

    // A client with a receive buffer large enough for the whole response asks for the hit
    // and does not read yet: the response sits in its socket, as pages of the arena.
    let addr = proxy.addr;
    let request = format!("GET {} HTTP/1.1\r\nHost: {origin}\r\n\r\n", url("a"));
    let mut late = tokio::task::spawn_blocking(move || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(1 << 20).expect("rcvbuf");
        socket.connect(&addr.into()).expect("connect");
        let mut s: std::net::TcpStream = socket.into();
        s.write_all(request.as_bytes()).expect("write");
        s
    })
    .await
    .expect("client");
    // The proxy logs the hit once the whole body is in the socket.
    let mut logged = false;
    for _ in 0..500 {
        let text = std::fs::read_to_string(&proxy.log).unwrap_or_default();
        if text.lines().filter(|l| l.contains("/a?")).count() == 2 {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(logged, "the late client's hit was not logged");

    // Evict it (b), then store c while b holds the other range: c gets a's old range.
    assert_eq!(get(proxy.addr, &url("b")).await.body, content("/b", len));
    assert_eq!(get(proxy.addr, &url("c")).await.body, content("/c", len));
    let arena = &proxy.stats().await["store"]["arena"];
    assert_eq!(arena["placed"], 3, "{arena}");
    assert_eq!(arena["held_extents"], 1, "{arena}");

    let got = tokio::task::spawn_blocking(move || {
        late.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut data = Vec::new();
        let mut buf = [0u8; 65536];
        while data.len() < len + 1 {
            let n = late.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                if data.len() >= end + 4 + len {
                    return data[end + 4..end + 4 + len].to_vec();
                }
            }
        }
        panic!("short response: {} bytes", data.len());
    })
    .await
    .expect("read");
    assert!(got == content("/a", len), "the late client got other bytes");
    proxy.stop().await;
}
