//! The client emulator: many HTTP clients in one process, as the papers'
//! benchmarks had them — each client replays its own stream of requests in
//! order, keeping a bounded number outstanding (one persistent connection
//! per outstanding request), with no think time or a given one.
//!
//! It speaks just enough HTTP/1.1 to be fast and exact: one `write` per
//! request, the response head parsed with `httparse`, bodies framed by
//! `Content-Length`, chunked coding or the connection's end, read into a
//! reused buffer and counted, never kept. A connection the server closed
//! while idle is reopened and the request sent again, once.
//!
//! Every response is classified by its `X-Cache` headers (each cache on the
//! path adds `X-Cache: HIT from NAME` or `MISS from NAME`, as Squid does):
//! the client's own cache says HIT → [`Outcome::LocalHit`]; another cache
//! says HIT → [`Outcome::ParentHit`] if it is one of the client's cache's
//! parents, else [`Outcome::SiblingHit`]; otherwise [`Outcome::Miss`].
//! Failures (connect, timeout, malformed answer, a 5xx) are counted by kind
//! and never stop the run. Latency is recorded per request in microseconds
//! in an HDR histogram, overall and per outcome.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use meshcache_workload::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a response was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// By the client's own cache.
    LocalHit,
    /// By a sibling of the client's cache.
    SiblingHit,
    /// By a parent of the client's cache.
    ParentHit,
    /// By the origin.
    Miss,
}

impl Outcome {
    /// All outcomes, in report order.
    pub const ALL: [Outcome; 4] = [
        Outcome::LocalHit,
        Outcome::SiblingHit,
        Outcome::ParentHit,
        Outcome::Miss,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::LocalHit => "local_hit",
            Outcome::SiblingHit => "sibling_hit",
            Outcome::ParentHit => "parent_hit",
            Outcome::Miss => "miss",
        }
    }
}

/// Tells outcomes from `X-Cache` headers.
#[derive(Clone, Debug, Default)]
pub struct Classifier {
    /// The name the client's own cache puts in `X-Cache`.
    pub local: String,
    /// The names of its parents.
    pub parents: Vec<String>,
}

impl Classifier {
    /// The outcome given the `X-Cache` values of one response.
    pub fn classify<'a>(&self, x_cache: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
        let mut remote = None;
        for v in x_cache {
            let v = std::str::from_utf8(v).unwrap_or("").trim();
            let Some(rest) = v.strip_prefix("HIT from ") else {
                continue;
            };
            let name = rest.trim();
            if !self.local.is_empty() && name == self.local {
                return Outcome::LocalHit;
            }
            let kind = if self.parents.iter().any(|p| p == name) {
                Outcome::ParentHit
            } else {
                Outcome::SiblingHit
            };
            remote = Some(remote.map_or(kind, |k: Outcome| k.min_by_parent(kind)));
        }
        remote.unwrap_or(Outcome::Miss)
    }
}

impl Outcome {
    /// Of two remote hits on one path, the cache nearest the client decides; a parent's HIT
    /// seen alongside a sibling's means the sibling fetched through it, so the sibling counts.
    fn min_by_parent(self, other: Outcome) -> Outcome {
        if self == Outcome::SiblingHit || other == Outcome::SiblingHit {
            Outcome::SiblingHit
        } else {
            self
        }
    }
}

/// How requests are addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Absolute-URI requests to a proxy at this address.
    Proxy(SocketAddr),
    /// Origin-form requests to this address (the URL's authority goes in `Host`).
    Origin(SocketAddr),
}

impl Target {
    fn addr(self) -> SocketAddr {
        match self {
            Target::Proxy(a) | Target::Origin(a) => a,
        }
    }
}

/// One job: a set of emulated clients using one cache (or origin).
#[derive(Clone, Debug)]
pub struct Job {
    /// Where the clients connect.
    pub target: Target,
    /// One stream per client, replayed in order.
    pub streams: Vec<Vec<Request>>,
    /// Outstanding requests per client (each its own persistent connection).
    pub outstanding: usize,
    /// Pause after each response before the client's next request.
    pub think: Option<Duration>,
    /// A request taking longer fails (and its connection is closed).
    pub timeout: Duration,
    /// Stop starting requests after this long.
    pub deadline: Option<Duration>,
    /// How responses are classified.
    pub classifier: Classifier,
}

/// Failures by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Errors {
    /// Could not connect.
    pub connect: u64,
    /// No complete answer within the timeout.
    pub timeout: u64,
    /// A malformed answer, or the connection broke mid-answer.
    pub protocol: u64,
    /// A 5xx status.
    pub status_5xx: u64,
}

impl Errors {
    /// All failures.
    pub fn total(&self) -> u64 {
        self.connect + self.timeout + self.protocol + self.status_5xx
    }
}

/// What a job measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Requests answered (any status below 500).
    pub requests: u64,
    /// Failures.
    pub errors: Errors,
    /// Body bytes received.
    pub bytes: u64,
    /// Wall time from the first request to the last answer.
    pub wall: Duration,
    /// Latency of answered requests, microseconds.
    pub latency: Histogram<u64>,
    /// Per outcome (index: [`Outcome::ALL`] order): answered requests.
    pub outcomes: [u64; 4],
    /// Per outcome: body bytes.
    pub outcome_bytes: [u64; 4],
    /// Per outcome: latency, microseconds.
    pub outcome_latency: [Histogram<u64>; 4],
}

/// A latency histogram: 1 µs to 10 minutes, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("constant bounds are valid")
}

impl Report {
    fn new() -> Report {
        Report {
            requests: 0,
            errors: Errors::default(),
            bytes: 0,
            wall: Duration::ZERO,
            latency: histogram(),
            outcomes: [0; 4],
            outcome_bytes: [0; 4],
            outcome_latency: [histogram(), histogram(), histogram(), histogram()],
        }
    }

    /// Answered requests of one outcome.
    pub fn count(&self, o: Outcome) -> u64 {
        self.outcomes[o.index()]
    }

    /// Body bytes of one outcome.
    pub fn bytes_of(&self, o: Outcome) -> u64 {
        self.outcome_bytes[o.index()]
    }

    /// Adds `other` (wall time: the longer).
    pub fn merge(&mut self, other: &Report) {
        self.requests += other.requests;
        self.errors.connect += other.errors.connect;
        self.errors.timeout += other.errors.timeout;
        self.errors.protocol += other.errors.protocol;
        self.errors.status_5xx += other.errors.status_5xx;
        self.bytes += other.bytes;
        self.wall = self.wall.max(other.wall);
        let _ = self.latency.add(&other.latency);
        for i in 0..4 {
            self.outcomes[i] += other.outcomes[i];
            self.outcome_bytes[i] += other.outcome_bytes[i];
            let _ = self.outcome_latency[i].add(&other.outcome_latency[i]);
        }
    }

    /// Requests per second.
    pub fn rate(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s > 0.0 {
            self.requests as f64 / s
        } else {
            0.0
        }
    }

    fn record(&mut self, outcome: Outcome, bytes: u64, us: u64) {
        self.requests += 1;
        self.bytes += bytes;
        let us = us.clamp(1, 600_000_000);
        let _ = self.latency.record(us);
        self.outcomes[outcome.index()] += 1;
        self.outcome_bytes[outcome.index()] += bytes;
        let _ = self.outcome_latency[outcome.index()].record(us);
    }
}

/// Runs a job to the end (or its deadline); `progress` counts finished requests.
pub async fn run(job: &Job, progress: Option<Arc<AtomicU64>>) -> Report {
    let started = Instant::now();
    let stop_at = job.deadline.map(|d| started + d);
    let job = Arc::new(job.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for (c, stream) in job.streams.iter().enumerate() {
        if stream.is_empty() {
            continue;
        }
        let next = Arc::new(AtomicUsize::new(0));
        for _ in 0..job.outstanding.max(1).min(stream.len()) {
            let job = Arc::clone(&job);
            let next = Arc::clone(&next);
            let progress = progress.clone();
            tasks.spawn(async move {
                let stream = &job.streams[c];
                let mut conn = Conn::new(job.target, job.timeout);
                let mut report = Report::new();
                loop {
                    if stop_at.is_some_and(|t| Instant::now() >= t) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(req) = stream.get(i) else { break };
                    conn.exchange(&req.url, &job.classifier, &mut report).await;
                    if let Some(p) = &progress {
                        p.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(t) = job.think {
                        tokio::time::sleep(t).await;
                    }
                }
                report
            });
        }
    }
    sum_of(tasks, started).await
}

/// Throughput mode, like wrk: `connections` connections request `urls` round robin for
/// `duration`.
pub async fn hammer(
    target: Target,
    urls: &[String],
    connections: usize,
    duration: Duration,
    timeout: Duration,
    progress: Option<Arc<AtomicU64>>,
) -> Report {
    let started = Instant::now();
    let stop_at = started + duration;
    let urls: Arc<Vec<String>> = Arc::new(urls.to_vec());
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..connections.max(1) {
        let urls = Arc::clone(&urls);
        let progress = progress.clone();
        tasks.spawn(async move {
            let mut conn = Conn::new(target, timeout);
            let mut report = Report::new();
            let classifier = Classifier::default();
            let mut i = k;
            while Instant::now() < stop_at && !urls.is_empty() {
                conn.exchange(&urls[i % urls.len()], &classifier, &mut report)
                    .await;
                i += 1;
                if let Some(p) = &progress {
                    p.fetch_add(1, Ordering::Relaxed);
                }
            }
            report
        });
    }
    sum_of(tasks, started).await
}

/// Merges the connections' reports; the wall time runs from `started` to the last one.
async fn sum_of(mut tasks: tokio::task::JoinSet<Report>, started: Instant) -> Report {
    let mut total = Report::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok(r) = r {
            total.merge(&r);
        }
    }
    total.wall = started.elapsed();
    total
}

/// Why one exchange failed.
enum Failure {
    Connect,
    /// Broken or malformed; `retry` tells whether nothing of the answer arrived on a reused
    /// connection (an idle close: the request is sent again, once).
    Protocol {
        retry: bool,
    },
}

/// One persistent connection and its buffers.
struct Conn {
    target: Target,
    timeout: Duration,
    stream: Option<TcpStream>,
    /// Whether the connection has served a request (a failure then may be an idle close).
    used: bool,
    req: Vec<u8>,
    buf: Vec<u8>,
}

/// How a response body is framed.
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

impl Conn {
    fn new(target: Target, timeout: Duration) -> Conn {
        Conn {
            target,
            timeout,
            stream: None,
            used: false,
            req: Vec::with_capacity(512),
            buf: Vec::with_capacity(64 * 1024),
        }
    }

    /// Sends one GET and reads the answer, recording it in `report`.
    async fn exchange(&mut self, url: &str, classifier: &Classifier, report: &mut Report) {
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = tokio::time::timeout(self.timeout, self.once(url, classifier)).await;
            match result {
                Ok(Ok((status, outcome, bytes))) => {
                    let us = start.elapsed().as_micros() as u64;
                    if status >= 500 {
                        report.errors.status_5xx += 1;
                    } else {
                        report.record(outcome, bytes, us);
                    }
                    return;
                }
                Ok(Err(Failure::Protocol { retry: true })) if attempt == 1 => {
                    // The server closed the idle connection: send again on a fresh one.
                    self.stream = None;
                    continue;
                }
                Ok(Err(Failure::Connect)) => report.errors.connect += 1,
                Ok(Err(Failure::Protocol { .. })) => report.errors.protocol += 1,
                Err(_) => report.errors.timeout += 1,
            }
            self.stream = None;
            return;
        }
    }

    async fn once(
        &mut self,
        url: &str,
        classifier: &Classifier,
    ) -> Result<(u16, Outcome, u64), Failure> {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.target.addr())
                .await
                .map_err(|_| Failure::Connect)?;
            let _ = s.set_nodelay(true);
            self.stream = Some(s);
            self.used = false;
        }
        let reused = self.used;
        self.used = true;
        self.req.clear();
        let (authority, path) = split(url);
        let line_target = match self.target {
            Target::Proxy(_) => url,
            Target::Origin(_) => path,
        };
        self.req.extend_from_slice(b"GET ");
        self.req.extend_from_slice(line_target.as_bytes());
        self.req.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        self.req.extend_from_slice(authority.as_bytes());
        self.req.extend_from_slice(b"\r\n\r\n");
        let broken = |received: bool| {
            move |_| Failure::Protocol {
                retry: reused && !received,
            }
        };
        let stream = self.stream.as_mut().ok_or(Failure::Connect)?;
        stream.write_all(&self.req).await.map_err(broken(false))?;
        self.buf.clear();
        // Read the head.
        let (head_len, status, framing, close, outcome) = loop {
            let n = read_more(stream, &mut self.buf)
                .await
                .map_err(broken(false))?;
            if n == 0 {
                return Err(Failure::Protocol {
                    retry: reused && self.buf.is_empty(),
                });
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let status = resp.code.unwrap_or(0);
                    let mut framing = Framing::UntilClose;
                    let mut close = resp.version == Some(0);
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let n = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse().ok())
                                .ok_or(Failure::Protocol { retry: false })?;
                            if !matches!(framing, Framing::Chunked) {
                                framing = Framing::Length(n);
                            }
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            if contains_token(h.value, b"chunked") {
                                framing = Framing::Chunked;
                            }
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            if contains_token(h.value, b"close") {
                                close = true;
                            } else if contains_token(h.value, b"keep-alive") {
                                close = false;
                            }
                        }
                    }
                    if status == 304 || status == 204 || (100..200).contains(&status) {
                        framing = Framing::Length(0);
                    }
                    let outcome = classifier.classify(
                        resp.headers
                            .iter()
                            .filter(|h| h.name.eq_ignore_ascii_case("x-cache"))
                            .map(|h| h.value),
                    );
                    break (len, status, framing, close, outcome);
                }
                Ok(httparse::Status::Partial) => {
                    if self.buf.len() > 256 * 1024 {
                        return Err(Failure::Protocol { retry: false });
                    }
                }
                Err(_) => return Err(Failure::Protocol { retry: false }),
            }
        };
        let bad = |_| Failure::Protocol { retry: false };
        let body = match framing {
            Framing::Length(n) => {
                let mut have = (self.buf.len() - head_len) as u64;
                while have < n {
                    self.buf.clear();
                    let got = read_more(stream, &mut self.buf).await.map_err(bad)?;
                    if got == 0 {
                        return Err(Failure::Protocol { retry: false });
                    }
                    have += got as u64;
                }
                if have > n {
                    // Pipelining is not used: extra bytes mean a framing error.
                    return Err(Failure::Protocol { retry: false });
                }
                n
            }
            Framing::UntilClose => {
                let mut have = (self.buf.len() - head_len) as u64;
                loop {
                    self.buf.clear();
                    let got = read_more(stream, &mut self.buf).await.map_err(bad)?;
                    if got == 0 {
                        break;
                    }
                    have += got as u64;
                }
                self.stream = None;
                have
            }
            Framing::Chunked => {
                self.buf.drain(..head_len);
                read_chunked(stream, &mut self.buf).await?
            }
        };
        if close {
            self.stream = None;
        }
        Ok((status, outcome, body))
    }
}

/// Reads a chunked body whose first bytes are in `buf`; returns its decoded length.
async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<u64, Failure> {
    let bad = |_| Failure::Protocol { retry: false };
    let mut total = 0u64;
    let mut pos = 0usize;
    loop {
        // A chunk-size line.
        let line_end = loop {
            if let Some(i) = buf[pos..].windows(2).position(|w| w == b"\r\n") {
                break pos + i;
            }
            if buf.len() - pos > 4096 {
                return Err(Failure::Protocol { retry: false });
            }
            if read_more(stream, buf).await.map_err(bad)? == 0 {
                return Err(Failure::Protocol { retry: false });
            }
        };
        let line = std::str::from_utf8(&buf[pos..line_end])
            .map_err(|_| Failure::Protocol { retry: false })?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size =
            u64::from_str_radix(size_text, 16).map_err(|_| Failure::Protocol { retry: false })?;
        pos = line_end + 2;
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                if let Some(i) = buf[pos..].windows(2).position(|w| w == b"\r\n") {
                    if i == 0 {
                        return Ok(total);
                    }
                    pos += i + 2;
                    continue;
                }
                if read_more(stream, buf).await.map_err(bad)? == 0 {
                    return Err(Failure::Protocol { retry: false });
                }
            }
        }
        // The chunk and its CRLF.
        let mut need = size + 2;
        let have = (buf.len() - pos) as u64;
        if have >= need {
            pos += need as usize;
        } else {
            need -= have;
            buf.clear();
            pos = 0;
            while need > 0 {
                let got = read_more(stream, buf).await.map_err(bad)? as u64;
                if got == 0 {
                    return Err(Failure::Protocol { retry: false });
                }
                if got >= need {
                    pos = buf.len() - (got - need) as usize;
                    need = 0;
                } else {
                    need -= got;
                    buf.clear();
                }
            }
        }
        total += size;
        if pos > 64 * 1024 {
            buf.drain(..pos);
            pos = 0;
        }
    }
}

/// Appends what the socket has to `buf`; 0 at the end of the stream.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 16 * 1024 {
        buf.reserve(64 * 1024);
    }
    stream.read_buf(buf).await
}

fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// `http://authority/path` → (authority, /path).
fn split(url: &str) -> (&str, &str) {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let c = Classifier {
            local: "c0".into(),
            parents: vec!["p0".into()],
        };
        let h = |v: &[&'static str]| c.classify(v.iter().map(|s| s.as_bytes()));
        assert_eq!(h(&["HIT from c0"]), Outcome::LocalHit);
        assert_eq!(h(&["HIT from p0", "MISS from c0"]), Outcome::ParentHit);
        assert_eq!(h(&["HIT from c1", "MISS from c0"]), Outcome::SiblingHit);
        assert_eq!(h(&["MISS from p0", "MISS from c0"]), Outcome::Miss);
        assert_eq!(h(&[]), Outcome::Miss);
        assert_eq!(
            Classifier::default().classify([&b"HIT from x"[..]]),
            Outcome::SiblingHit
        );
    }

    #[test]
    fn url_split() {
        assert_eq!(split("http://a.b:81/x?y=1"), ("a.b:81", "/x?y=1"));
        assert_eq!(split("http://a.b"), ("a.b", "/"));
    }

    #[test]
    fn tokens() {
        assert!(contains_token(b"gzip, Chunked", b"chunked"));
        assert!(!contains_token(b"chunkedx", b"chunked"));
    }
}
