//! Tests of the origin emulator through a hand-written HTTP/1.1 client on a
//! raw TCP socket (loopback only, every read bounded in time).

use std::time::{Duration, Instant};

use meshcache_lab::origin::{Delay, OriginConfig, OriginError};
use meshcache_lab::{body_byte, expected_body, Origin};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LIMIT: Duration = Duration::from_secs(10);

/// One parsed response.
#[derive(Debug)]
struct Resp {
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The chunk sizes, when the body was chunked.
    chunks: Option<Vec<usize>>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn count(&self) -> Option<u64> {
        self.header("x-origin-count")?.parse().ok()
    }
}

/// A keep-alive connection to the origin.
struct Conn {
    io: BufReader<TcpStream>,
}

impl Conn {
    async fn open(origin: &Origin) -> Result<Conn> {
        let stream = timeout(LIMIT, TcpStream::connect(origin.addr())).await??;
        Ok(Conn {
            io: BufReader::new(stream),
        })
    }

    async fn send(&mut self, raw: &[u8]) -> Result {
        timeout(LIMIT, self.io.get_mut().write_all(raw)).await??;
        Ok(())
    }

    async fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let n = timeout(LIMIT, self.io.read_line(&mut line)).await??;
        if n == 0 {
            return Err("connection closed".into());
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_owned())
    }

    /// Reads the status line and headers.
    async fn head(&mut self) -> Result<Resp> {
        let status_line = self.line().await?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_owned();
        let status = parts.next().ok_or("no status")?.parse()?;
        let mut headers = Vec::new();
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').ok_or("bad header")?;
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        Ok(Resp {
            version,
            status,
            headers,
            body: Vec::new(),
            chunks: None,
        })
    }

    /// Reads the body that `resp`'s head announces.
    async fn body(&mut self, resp: &mut Resp, head_request: bool) -> Result {
        if head_request || resp.status == 304 || resp.status == 204 {
            return Ok(());
        }
        if resp
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
        {
            let mut chunks = Vec::new();
            loop {
                let size_line = self.line().await?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)?;
                if size == 0 {
                    // No trailers expected: the final empty line.
                    assert_eq!(self.line().await?, "");
                    break;
                }
                let start = resp.body.len();
                resp.body.resize(start + size, 0);
                timeout(LIMIT, self.io.read_exact(&mut resp.body[start..])).await??;
                assert_eq!(self.line().await?, "");
                chunks.push(size);
            }
            resp.chunks = Some(chunks);
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse()?;
            resp.body.resize(len, 0);
            timeout(LIMIT, self.io.read_exact(&mut resp.body)).await??;
        } else {
            timeout(LIMIT, self.io.read_to_end(&mut resp.body)).await??;
        }
        Ok(())
    }

    /// Sends `GET`/`HEAD` `target` with `extra` header lines, reads the
    /// response.
    async fn request(&mut self, method: &str, target: &str, extra: &str) -> Result<Resp> {
        let raw = format!("{method} {target} HTTP/1.1\r\nHost: origin\r\n{extra}\r\n");
        self.send(raw.as_bytes()).await?;
        let mut resp = self.head().await?;
        self.body(&mut resp, method == "HEAD").await?;
        Ok(resp)
    }
}

async fn get(origin: &Origin, target: &str, extra: &str) -> Result<Resp> {
    Conn::open(origin)
        .await?
        .request("GET", target, extra)
        .await
}

#[tokio::test]
async fn size_and_deterministic_body() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;

    let r = conn.request("GET", "/a", "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("0"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert!(r.header("date").is_some());

    for size in [1usize, 37, 1000, 100_000, 1 << 20, (3 << 20) + 11] {
        let r = conn.request("GET", &format!("/a?size={size}"), "").await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some(size.to_string().as_str()));
        assert_eq!(r.body.len(), size);
        assert!(r.body == expected_body(size), "body of size {size} differs");
        assert!(r
            .body
            .iter()
            .enumerate()
            .all(|(i, b)| *b == body_byte(i as u64)));
    }
    assert_eq!(
        &expected_body(40)[..],
        b"abcdefghijklmnopqrstuvwxyz0123456789\nabc"
    );

    // Over 1 GiB is refused; malformed values too.
    let r = conn.request("GET", "/a?size=1073741825", "").await?;
    assert_eq!(r.status, 400);
    let r = conn.request("GET", "/a?size=ten", "").await?;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("size"));

    // Range is ignored.
    let r = conn
        .request("GET", "/a?size=100", "Range: bytes=0-9\r\n")
        .await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100);
    assert!(r.header("content-range").is_none());
    Ok(())
}

#[tokio::test]
async fn headers_from_parameters() -> Result {
    let origin = Origin::start().await?;
    let r = get(
        &origin,
        "/h?cc=max-age%3D60%2C+public&etag=v1&vary=Accept-Encoding&ct=text/html&expires=120&lm=3600&setcookie=1&status=203&hdr=X-One:1&hdr=X-Two:%20two%20&hdr=X-One:uno",
        "",
    )
    .await?;
    assert_eq!(r.status, 203);
    assert_eq!(r.header("cache-control"), Some("max-age=60, public"));
    assert_eq!(r.header("etag"), Some("\"v1\""));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.header("set-cookie"), Some("lab=1; Path=/"));
    assert_eq!(r.header_all("x-one"), vec!["1", "uno"]);
    assert_eq!(r.header("x-two"), Some("two"));

    let date = httpdate::parse_http_date(r.header("date").ok_or("no date")?)?;
    let expires = httpdate::parse_http_date(r.header("expires").ok_or("no expires")?)?;
    let lm = httpdate::parse_http_date(r.header("last-modified").ok_or("no lm")?)?;
    assert_eq!(expires.duration_since(date)?, Duration::from_secs(120));
    assert_eq!(date.duration_since(lm)?, Duration::from_secs(3600));

    // Negative expires: already expired. Weak etags pass through; hdr
    // replaces the emulator's own header.
    let r = get(
        &origin,
        "/h?expires=-10&etag=W/%22w%22&hdr=Content-Type:x/y",
        "",
    )
    .await?;
    let date = httpdate::parse_http_date(r.header("date").ok_or("no date")?)?;
    let expires = httpdate::parse_http_date(r.header("expires").ok_or("no expires")?)?;
    assert_eq!(date.duration_since(expires)?, Duration::from_secs(10));
    assert_eq!(r.header("etag"), Some("W/\"w\""));
    assert_eq!(r.header_all("content-type"), vec!["x/y"]);
    Ok(())
}

#[tokio::test]
async fn conditional_requests() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    let target = "/c?size=500&etag=v1&cc=max-age=5&lm=100&expires=30&vary=Accept";

    let r = conn
        .request("GET", target, "If-None-Match: \"v1\"\r\n")
        .await?;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some("\"v1\""));
    assert_eq!(r.header("cache-control"), Some("max-age=5"));
    assert_eq!(r.header("vary"), Some("Accept"));
    assert!(r.header("last-modified").is_some());
    assert!(r.header("expires").is_some());
    assert!(r.header("date").is_some());
    assert_eq!(r.count(), Some(1));

    for inm in ["\"x\", W/\"v1\"", "*"] {
        let r = conn
            .request("GET", target, &format!("If-None-Match: {inm}\r\n"))
            .await?;
        assert_eq!(r.status, 304, "If-None-Match: {inm}");
    }
    let r = conn
        .request("GET", target, "If-None-Match: \"v2\"\r\n")
        .await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 500);

    // If-Modified-Since at or after Last-Modified (now - 100 s).
    let now = std::time::SystemTime::now();
    let recent = httpdate::fmt_http_date(now - Duration::from_secs(10));
    let old = httpdate::fmt_http_date(now - Duration::from_secs(1000));
    let r = conn
        .request("GET", target, &format!("If-Modified-Since: {recent}\r\n"))
        .await?;
    assert_eq!(r.status, 304);
    let r = conn
        .request("GET", target, &format!("If-Modified-Since: {old}\r\n"))
        .await?;
    assert_eq!(r.status, 200);
    // If-None-Match wins over If-Modified-Since.
    let r = conn
        .request(
            "GET",
            target,
            &format!("If-None-Match: \"v2\"\r\nIf-Modified-Since: {recent}\r\n"),
        )
        .await?;
    assert_eq!(r.status, 200);
    // HEAD is conditional too; error statuses are not.
    let r = conn
        .request("HEAD", target, "If-None-Match: \"v1\"\r\n")
        .await?;
    assert_eq!(r.status, 304);
    let r = conn
        .request(
            "GET",
            "/c?etag=v1&status=404&size=3",
            "If-None-Match: \"v1\"\r\n",
        )
        .await?;
    assert_eq!(r.status, 404);
    assert_eq!(r.body.len(), 3);
    Ok(())
}

#[tokio::test]
async fn head_has_no_body() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    let r = conn.request("HEAD", "/x?size=12345&etag=e", "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("12345"));
    assert_eq!(r.header("etag"), Some("\"e\""));
    // Had a body been sent, this response would be garbled.
    let r = conn.request("GET", "/x?size=5", "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"abcde");
    assert_eq!(origin.hits("/x?size=12345&etag=e"), 1);
    Ok(())
}

#[tokio::test]
async fn chunked_mode_is_chunked() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    let size = 200_000;
    let r = conn
        .request("GET", &format!("/ch?size={size}&chunked=1"), "")
        .await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.header("content-length").is_none());
    let chunks = r.chunks.as_ref().ok_or("not chunked")?;
    assert!(chunks.len() > 1, "chunks: {chunks:?}");
    assert!(r.body == expected_body(size));

    // Even an empty body is chunked; the connection stays usable.
    let r = conn.request("GET", "/ch?chunked=1", "").await?;
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.body.is_empty());
    let r = conn.request("GET", "/ch?size=3&chunked=0", "").await?;
    assert_eq!(r.header("content-length"), Some("3"));
    Ok(())
}

#[tokio::test]
async fn counting_per_path_and_query() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    for expected in 1..=3 {
        let r = conn.request("GET", "/p?size=1", "").await?;
        assert_eq!(r.count(), Some(expected));
    }
    let r = conn.request("GET", "/p?size=1&v=2", "").await?;
    assert_eq!(r.count(), Some(1));
    let r = conn.request("HEAD", "/p", "").await?;
    assert_eq!(r.count(), Some(1));
    // An absolute-form target counts under its path and query.
    let r = conn.request("GET", &origin.url("/p?size=1"), "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"a");
    assert_eq!(r.count(), Some(4));

    assert_eq!(origin.hits("/p?size=1"), 4);
    assert_eq!(origin.hits("/p?size=1&v=2"), 1);
    assert_eq!(origin.hits("/p"), 1);
    assert_eq!(origin.hits("/q"), 0);
    assert_eq!(origin.total(), 6);
    let clone = origin.clone();
    clone.reset();
    assert_eq!(origin.total(), 0);
    assert_eq!(origin.hits("/p?size=1"), 0);
    let r = conn.request("GET", "/p?size=1", "").await?;
    assert_eq!(r.count(), Some(1));
    assert_eq!(origin.total(), 1);
    Ok(())
}

#[tokio::test]
async fn other_methods_echo_body_length() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    let body = vec![b'x'; 1234];
    let mut raw =
        b"POST /post?size=99 HTTP/1.1\r\nHost: o\r\nContent-Length: 1234\r\n\r\n".to_vec();
    raw.extend_from_slice(&body);
    conn.send(&raw).await?;
    let mut r = conn.head().await?;
    conn.body(&mut r, false).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-body-bytes"), Some("1234"));
    assert_eq!(r.body, b"ok");
    assert_eq!(r.count(), Some(1));

    // A chunked request body, on the same connection.
    conn.send(b"PUT /put HTTP/1.1\r\nHost: o\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n")
        .await?;
    let mut r = conn.head().await?;
    conn.body(&mut r, false).await?;
    assert_eq!(r.header("x-request-body-bytes"), Some("8"));

    let r = conn.request("DELETE", "/del", "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-body-bytes"), Some("0"));
    assert_eq!(origin.total(), 3);
    Ok(())
}

#[tokio::test]
async fn delay_and_stall() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;

    let start = Instant::now();
    let r = conn.request("GET", "/d?delay_ms=200&size=10", "").await?;
    assert_eq!(r.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(200));

    // The head arrives at once, the body only after the stall.
    let start = Instant::now();
    conn.send(b"GET /s?stall_ms=1000&size=10 HTTP/1.1\r\nHost: o\r\n\r\n")
        .await?;
    let mut r = conn.head().await?;
    let head_at = start.elapsed();
    conn.body(&mut r, false).await?;
    let body_at = start.elapsed();
    assert!(
        head_at < Duration::from_millis(250),
        "head after {head_at:?}"
    );
    assert!(
        body_at >= Duration::from_millis(300),
        "body after {body_at:?}"
    );
    assert!(r.body == expected_body(10));
    Ok(())
}

#[tokio::test]
async fn http10_client() -> Result {
    let origin = Origin::start().await?;
    let mut conn = Conn::open(&origin).await?;
    conn.send(b"GET /old?size=50 HTTP/1.0\r\n\r\n").await?;
    let mut r = conn.head().await?;
    conn.body(&mut r, false).await?;
    assert_eq!(r.version, "HTTP/1.0");
    assert_eq!(r.status, 200);
    assert!(r.body == expected_body(50));
    // Chunked is impossible in HTTP/1.0: the body is delimited by close.
    let mut conn = Conn::open(&origin).await?;
    conn.send(b"GET /old?size=70000&chunked=1 HTTP/1.0\r\n\r\n")
        .await?;
    let mut r = conn.head().await?;
    assert!(r.header("transfer-encoding").is_none());
    conn.body(&mut r, false).await?;
    assert!(r.body == expected_body(70_000));
    Ok(())
}

/// Whether connecting to `addr` is refused within the time limit.
async fn refused_soon(addr: std::net::SocketAddr) -> bool {
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        if TcpStream::connect(addr).await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn stops_when_dropped_or_shut_down() -> Result {
    let origin = Origin::start().await?;
    let addr = origin.addr();
    assert_eq!(origin.url("/x?y=1"), format!("http://{addr}/x?y=1"));
    let mut idle = Conn::open(&origin).await?;
    idle.request("GET", "/", "").await?;
    let clone = origin.clone();
    drop(origin);
    get(&clone, "/still", "").await?;
    drop(clone);
    assert!(
        refused_soon(addr).await,
        "still accepting after the last drop"
    );
    // The idle keep-alive connection is closed too.
    let mut buf = [0u8; 1];
    assert_eq!(timeout(LIMIT, idle.io.read(&mut buf)).await??, 0);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let origin = Origin::spawn(listener, async move {
        let _ = rx.await;
    });
    let r = get(&origin, "/spawned?size=2", "").await?;
    assert_eq!(r.body, b"ab");
    let _ = tx.send(());
    assert!(
        refused_soon(origin.addr()).await,
        "still accepting after shutdown"
    );
    Ok(())
}

#[tokio::test]
async fn config_defaults_apply_when_the_url_is_silent() -> Result {
    // Without a config there is no Cache-Control, ETag or Last-Modified.
    let plain = Origin::start().await?;
    let r = get(&plain, "/a?size=10", "").await?;
    assert!(r.header("cache-control").is_none());
    assert!(r.header("etag").is_none());
    assert!(r.header("last-modified").is_none());

    let config = OriginConfig {
        cache_control: Some("max-age=86400".to_owned()),
        last_modified: Some(Duration::from_secs(3600)),
        etag: true,
        ..OriginConfig::default()
    };
    let origin = Origin::start_with(&config).await?;
    let mut conn = Conn::open(&origin).await?;
    let r = conn.request("GET", "/a?size=10", "").await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("cache-control"), Some("max-age=86400"));
    let date = httpdate::parse_http_date(r.header("date").ok_or("no date")?)?;
    let lm = httpdate::parse_http_date(r.header("last-modified").ok_or("no lm")?)?;
    assert_eq!(date.duration_since(lm)?, Duration::from_secs(3600));
    let etag = r.header("etag").ok_or("no etag")?.to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2);

    // The ETag is stable per path and query, and differs between URLs.
    let again = conn.request("GET", "/a?size=10", "").await?;
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    let other = conn.request("GET", "/b?size=10", "").await?;
    assert_ne!(other.header("etag"), Some(etag.as_str()));

    // Revalidation with it answers 304, with the default Cache-Control.
    let r = conn
        .request("GET", "/a?size=10", &format!("If-None-Match: {etag}\r\n"))
        .await?;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("cache-control"), Some("max-age=86400"));
    assert_eq!(r.header("etag"), Some(etag.as_str()));

    // The URL's parameters win over the defaults.
    let r = conn
        .request("GET", "/a?size=10&cc=no-store&etag=v1&lm=60", "")
        .await?;
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("etag"), Some("\"v1\""));
    let date = httpdate::parse_http_date(r.header("date").ok_or("no date")?)?;
    let lm = httpdate::parse_http_date(r.header("last-modified").ok_or("no lm")?)?;
    assert_eq!(date.duration_since(lm)?, Duration::from_secs(60));
    Ok(())
}

#[tokio::test]
async fn config_delay_is_applied_and_overridden() -> Result {
    // A fixed delay, on every reply (GET and others).
    let config = OriginConfig {
        delay: Delay::Fixed(Duration::from_millis(150)),
        ..OriginConfig::default()
    };
    let origin = Origin::start_with(&config).await?;
    let mut conn = Conn::open(&origin).await?;
    let start = Instant::now();
    let r = conn.request("GET", "/d?size=10", "").await?;
    assert_eq!(r.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(150));
    let start = Instant::now();
    let r = conn.request("DELETE", "/d", "").await?;
    assert_eq!(r.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(150));

    // The URL's delay_ms overrides the default: with a default of an hour,
    // `delay_ms=0` still answers (within the client's time limit).
    let config = OriginConfig {
        delay: Delay::Fixed(Duration::from_secs(3600)),
        ..OriginConfig::default()
    };
    let slow = Origin::start_with(&config).await?;
    let r = get(&slow, "/fast?delay_ms=0&size=3", "").await?;
    assert_eq!(r.body, b"abc");
    Ok(())
}

#[tokio::test]
async fn config_delay_distributions_are_honoured() -> Result {
    use rand::SeedableRng;
    // Each reply waits one seeded draw, in arrival order: the total time
    // of sequential requests is at least the sum of the same draws.
    let cases = [
        Delay::Uniform {
            min: Duration::from_millis(40),
            max: Duration::from_millis(80),
        },
        Delay::Exponential {
            mean: Duration::from_millis(50),
        },
        Delay::LogNormal {
            median: Duration::from_millis(40),
            sigma: 0.5,
        },
    ];
    for delay in cases {
        let config = OriginConfig {
            delay,
            seed: 9,
            ..OriginConfig::default()
        };
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        let draws: Vec<Duration> = (0..6).map(|_| delay.sample(&mut rng)).collect();
        assert!(
            draws.windows(2).any(|w| w[0] != w[1]),
            "{delay:?}: constant"
        );
        let origin = Origin::start_with(&config).await?;
        let mut conn = Conn::open(&origin).await?;
        let start = Instant::now();
        for _ in 0..draws.len() {
            assert_eq!(conn.request("GET", "/x", "").await?.status, 200);
        }
        let took = start.elapsed();
        let expected: Duration = draws.iter().sum();
        assert!(took >= expected, "{delay:?}: {took:?} < {expected:?}");
    }
    Ok(())
}

#[tokio::test]
async fn config_is_validated_and_parsed() -> Result {
    let bad = OriginConfig {
        cache_control: Some("bad\nvalue".to_owned()),
        ..OriginConfig::default()
    };
    match Origin::start_with(&bad).await {
        Err(OriginError::Invalid { key, .. }) => assert_eq!(key, "cache_control"),
        other => panic!("expected an invalid cache_control, got {other:?}"),
    }
    let bad = OriginConfig {
        delay: Delay::Uniform {
            min: Duration::from_secs(2),
            max: Duration::from_secs(1),
        },
        ..OriginConfig::default()
    };
    assert!(matches!(
        Origin::start_with(&bad).await,
        Err(OriginError::Invalid {
            key: "delay.min",
            ..
        })
    ));

    let c: OriginConfig = toml::from_str(
        "delay = { dist = \"exponential\", mean = \"1s\" }\ncache_control = \"max-age=86400\"\nlast_modified = \"1day\"\netag = true\nseed = 3\n",
    )?;
    assert_eq!(
        c.delay,
        Delay::Exponential {
            mean: Duration::from_secs(1)
        }
    );
    assert_eq!(c.last_modified, Some(Duration::from_secs(86_400)));
    assert!(c.etag);
    let c: OriginConfig = toml::from_str("delay = \"1s\"\n")?;
    assert_eq!(c.delay, Delay::Fixed(Duration::from_secs(1)));
    let c: OriginConfig =
        toml::from_str("delay = { dist = \"lognormal\", median = \"800ms\", sigma = 0.6 }\n")?;
    assert_eq!(
        c.delay,
        Delay::LogNormal {
            median: Duration::from_millis(800),
            sigma: 0.6
        }
    );
    // Round trip, and unknown keys or distributions are errors.
    let back: OriginConfig = toml::from_str(&toml::to_string(&c)?)?;
    assert_eq!(back, c);
    assert!(toml::from_str::<OriginConfig>("delays = \"1s\"\n").is_err());
    assert!(
        toml::from_str::<OriginConfig>("delay = { dist = \"pareto\", mean = \"1s\" }\n").is_err()
    );
    assert!(toml::from_str::<OriginConfig>(
        "delay = { dist = \"exponential\", mean = \"1s\", x = 1 }\n"
    )
    .is_err());
    assert_eq!(OriginConfig::default().delay, Delay::Fixed(Duration::ZERO));
    Ok(())
}
