//! The client emulator against real servers: the origin emulator, and hand-made servers for
//! the odd cases (HTTP/1.0, a close after every answer, a stall).

use std::net::SocketAddr;
use std::time::Duration;

use meshcache_lab::client::{self, Classifier, Job, Outcome, Target};
use meshcache_lab::Origin;
use meshcache_workload::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn req(client: u32, url: String) -> Request {
    Request {
        time_ms: 0,
        client,
        size: 0,
        url,
    }
}

fn job(target: Target, streams: Vec<Vec<Request>>) -> Job {
    Job {
        target,
        streams,
        outstanding: 1,
        think: None,
        timeout: Duration::from_secs(5),
        deadline: None,
        classifier: Classifier {
            local: "c0".into(),
            parents: vec!["p0".into()],
        },
    }
}

#[tokio::test]
async fn replays_streams_and_classifies_by_x_cache() {
    let origin = Origin::start().await.expect("origin");
    let addr = origin.addr();
    let url = |q: &str| format!("http://{addr}/x?{q}");
    let streams = vec![
        vec![
            req(0, url("size=100&hdr=X-Cache:HIT%20from%20c0")),
            req(
                0,
                url("size=200&hdr=X-Cache:HIT%20from%20p0&hdr=X-Cache:MISS%20from%20c0"),
            ),
        ],
        vec![
            req(
                1,
                url("size=300&hdr=X-Cache:HIT%20from%20c1&hdr=X-Cache:MISS%20from%20c0"),
            ),
            req(1, url("size=70000&chunked=1")),
            req(1, url("size=0&status=304")),
        ],
    ];
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = client::run(&job(Target::Origin(addr), streams), Some(progress.clone())).await;
    assert_eq!(r.requests, 5);
    assert_eq!(r.errors.total(), 0, "{:?}", r.errors);
    assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), 5);
    assert_eq!(r.bytes, 100 + 200 + 300 + 70_000);
    assert_eq!(r.count(Outcome::LocalHit), 1);
    assert_eq!(r.count(Outcome::ParentHit), 1);
    assert_eq!(r.count(Outcome::SiblingHit), 1);
    assert_eq!(r.count(Outcome::Miss), 2);
    assert_eq!(r.bytes_of(Outcome::SiblingHit), 300);
    assert_eq!(r.latency.len(), 5);
    // One persistent connection per client and outstanding request: 2 here.
    assert_eq!(origin.total(), 5);
}

#[tokio::test]
async fn outstanding_requests_bound_the_connections() {
    let origin = Origin::start().await.expect("origin");
    let addr = origin.addr();
    let stream: Vec<Request> = (0..40)
        .map(|i| req(0, format!("http://{addr}/o{i}?size=10&delay_ms=5")))
        .collect();
    // A counting proxy in front of the origin tells how many connections were opened.
    let front = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let front_addr = front.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = front.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(async move {
                if let Ok(mut o) = tokio::net::TcpStream::connect(addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut o).await;
                }
            });
        }
    });
    let mut j = job(Target::Origin(front_addr), vec![stream]);
    j.outstanding = 4;
    let r = client::run(&j, None).await;
    assert_eq!(r.requests, 40);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::Relaxed), 4);
}

/// A server that answers every request with `answer`, then closes if `close`.
async fn odd_server(answer: &'static [u8], close: bool) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match c.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    if c.write_all(answer).await.is_err() {
                        return;
                    }
                    if close {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn http10_and_closing_servers_and_failures_are_counted() {
    // HTTP/1.0 without a length: the body ends with the connection.
    let a = odd_server(b"HTTP/1.0 200 OK\r\n\r\nhello", true).await;
    // HTTP/1.1 with Connection: close after each answer.
    let b = odd_server(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        true,
    )
    .await;
    // A proxy error.
    let c = odd_server(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        false,
    )
    .await;
    for (addr, bytes) in [(a, 5u64), (b, 3)] {
        let s = vec![(0..3)
            .map(|i| req(0, format!("http://{addr}/{i}")))
            .collect()];
        let r = client::run(&job(Target::Proxy(addr), s), None).await;
        assert_eq!(
            (r.requests, r.errors.total()),
            (3, 0),
            "{addr}: {:?}",
            r.errors
        );
        assert_eq!(r.bytes, 3 * bytes);
    }
    let s = vec![vec![req(0, format!("http://{c}/x"))]];
    let r = client::run(&job(Target::Proxy(c), s), None).await;
    assert_eq!((r.requests, r.errors.status_5xx), (0, 1));
    // Nobody listening: connection errors, counted, never fatal.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let s = vec![(0..2)
        .map(|i| req(0, format!("http://{closed}/{i}")))
        .collect()];
    let r = client::run(&job(Target::Proxy(closed), s), None).await;
    assert_eq!((r.requests, r.errors.connect), (0, 2));
    // A stalled answer: a timeout.
    let origin = Origin::start().await.expect("origin");
    let o = origin.addr();
    let s = vec![vec![req(0, format!("http://{o}/slow?delay_ms=2000"))]];
    let mut j = job(Target::Origin(o), s);
    j.timeout = Duration::from_millis(200);
    let r = client::run(&j, None).await;
    assert_eq!((r.requests, r.errors.timeout), (0, 1));
}

#[tokio::test]
async fn hammer_mode_counts_what_it_did() {
    let origin = Origin::start().await.expect("origin");
    let url = origin.url("/h?size=64");
    let r = client::hammer(
        Target::Origin(origin.addr()),
        &[url],
        4,
        Duration::from_millis(300),
        Duration::from_secs(5),
        None,
    )
    .await;
    assert!(r.requests > 0);
    assert_eq!(r.errors.total(), 0);
    assert_eq!(r.bytes, 64 * r.requests);
    assert_eq!(origin.total(), r.requests);
}

#[tokio::test]
async fn a_silently_closed_idle_connection_is_reopened_and_order_is_kept() {
    // Answers keep-alive style, then closes without saying so: the next request on that
    // connection finds it closed before any answer, and is sent again on a fresh one.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&got)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                log.lock().expect("log").push(line);
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                // Give the client time to put the connection back in use, then drop it.
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
        }
    });
    let stream: Vec<Request> = (0..5)
        .map(|i| req(0, format!("http://{addr}/r{i}")))
        .collect();
    let r = client::run(&job(Target::Proxy(addr), vec![stream]), None).await;
    assert_eq!((r.requests, r.errors.total()), (5, 0), "{:?}", r.errors);
    let seen = seen.lock().expect("log").clone();
    let expected: Vec<String> = (0..5)
        .map(|i| format!("GET http://{addr}/r{i} HTTP/1.1"))
        .collect();
    assert_eq!(
        seen, expected,
        "one outstanding request: the stream's order"
    );
}
