//! The request-framing guard: checks every request head on a client connection before the
//! HTTP parser sees it, so that smuggling attempts and malformed heads get a clear answer.
//!
//! hyper is lenient where RFC 9112 allows a choice (it reads a request carrying both
//! `Content-Length` and `Transfer-Encoding` as chunked and closes afterwards) and answers its own
//! parse errors with a bare 400. A forward proxy should refuse such requests outright and say
//! why. [`GuardedStream`] sits between the socket and hyper: it holds back each request head
//! until it is complete, parses it with `httparse`, checks the framing headers, and then follows
//! the body (by length, or chunk by chunk) to find where the next head starts. When a head is
//! bad it hands hyper no byte of it and ends the input; when hyper then closes the connection
//! the guard writes its own error response (status, a one-line reason) before the shutdown, and
//! records the [`Violation`] for the access log. A malformed chunk in the middle of a body ends
//! the body early, so the request fails instead of being relayed wrong.
//!
//! After a CONNECT head the guard steps aside: the rest is tunnel bytes.
//!
//! The guard also keeps the connection's time limits ([`GuardedStream::with_timeouts`]): a
//! connection on which nothing moves either way for the idle timeout is ended (see
//! [`crate::idle`]), and a head that has not arrived whole within the head timeout (counted from
//! the connection's start for its first request, from the head's first byte for the next ones)
//! is answered 408. One timer per connection serves both, and it is moved only when it fires
//! early or a nearer deadline appears (a head arriving in pieces): a timer reset per read and
//! per request, and hyper's own head timer, cost 3.5 % of a small hit's CPU
//! (docs/benchmarks.md).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Duration, Instant};

pub use crate::idle::SendQueue;
use crate::idle::{Expired, Timeouts};

/// The end of a request head (a searcher built once: a byte-by-byte comparison of every
/// window was 1 % of a small hit's CPU).
static HEAD_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// What was wrong with a request, for the response and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Status to answer with.
    pub status: u16,
    /// One-line reason.
    pub reason: String,
    /// Found inside a body (the head was already passed on).
    pub mid_body: bool,
}

/// Where a connection's guard reports its violation.
pub type ViolationSlot = Arc<Mutex<Option<Violation>>>;

/// Limits the guard enforces on request heads.
#[derive(Clone, Copy, Debug)]
pub struct HeadLimits {
    /// Bytes of a request head.
    pub max_bytes: usize,
    /// Header fields in one head.
    pub max_headers: usize,
}

enum State {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers,
    Tunnel,
    Failed,
}

/// A client stream whose request heads are checked before hyper reads them.
pub struct GuardedStream<S> {
    inner: S,
    state: State,
    /// Bytes of the current head, or of the current chunk-size / trailer line.
    pending: Vec<u8>,
    /// Checked bytes not yet handed to hyper.
    ready: Vec<u8>,
    ready_at: usize,
    limits: HeadLimits,
    slot: ViolationSlot,
    /// The error response still to write before shutdown.
    answer: Option<(Vec<u8>, usize)>,
    timeouts: Option<Timeouts>,
}

const MAX_LINE: usize = 4096;

impl<S> GuardedStream<S> {
    /// Guards `inner`, reporting into `slot`.
    pub fn new(inner: S, limits: HeadLimits, slot: ViolationSlot) -> Self {
        GuardedStream {
            inner,
            state: State::Head,
            pending: Vec::new(),
            ready: Vec::with_capacity(4096),
            ready_at: 0,
            limits,
            slot,
            answer: None,
            timeouts: None,
        }
    }

    /// Ends the connection when nothing moves either way for `idle`, and answers 408 to a head that takes
    /// longer than `head` to arrive (a silent connection's first head, longer than that: closed).
    pub fn with_timeouts(mut self, idle: Duration, head: Duration) -> Self {
        self.timeouts = Some(Timeouts::new(idle, head));
        self
    }

    /// A write's result under the idle timeout.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>>
    where
        S: SendQueue,
    {
        let Some(t) = &mut self.timeouts else {
            return r;
        };
        let inner = &self.inner;
        t.wrote(cx, r, || inner.unsent())
    }

    /// A flush's or shutdown's result under the idle timeout.
    fn flushed(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<()>>) -> Poll<io::Result<()>>
    where
        S: SendQueue,
    {
        let Some(t) = &mut self.timeouts else {
            return r;
        };
        let inner = &self.inner;
        t.flushed(cx, r, || inner.unsent())
    }

    fn fail(&mut self, status: u16, reason: impl Into<String>) {
        let reason = reason.into();
        let mid_body = !matches!(self.state, State::Head);
        if !mid_body {
            let body = format!("meshcache: {reason}\n");
            let (phrase, error) = match status {
                408 => ("Request Timeout", "request-timeout"),
                431 => ("Request Header Fields Too Large", "invalid-request"),
                _ => ("Bad Request", "invalid-request"),
            };
            let text = format!(
                "HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nx-meshcache-error: {error}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            self.answer = Some((text.into_bytes(), 0));
        }
        *self.slot.lock() = Some(Violation {
            status,
            reason,
            mid_body,
        });
        self.state = State::Failed;
        self.pending.clear();
    }

    /// Checks newly read bytes, moving what is sound to `ready`.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Failed => return,
                State::Tunnel => {
                    self.ready.extend_from_slice(data);
                    return;
                }
                State::Body(left) => {
                    let n = (left as usize).min(data.len());
                    self.ready.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    self.state = if left as usize == n {
                        State::Head
                    } else {
                        State::Body(left - n as u64)
                    };
                }
                State::ChunkData(left) => {
                    let n = (left as usize).min(data.len());
                    self.ready.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    self.state = if left as usize == n {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData(left - n as u64)
                    };
                }
                State::Head | State::ChunkSize | State::ChunkDataEnd | State::Trailers => {
                    let Some(used) = self.take_line_or_head(data) else {
                        return;
                    };
                    data = &data[used..];
                }
            }
        }
    }

    /// Accumulates a head or a line; when complete, checks it. Returns the bytes of `data`
    /// used, or `None` when all of it was used.
    fn take_line_or_head(&mut self, data: &[u8]) -> Option<usize> {
        let head = matches!(self.state, State::Head);
        let start = self.pending.len();
        // Look for the terminator across the boundary with what we already hold.
        let terminator: &[u8] = if head { b"\r\n\r\n" } else { b"\n" };
        self.pending.extend_from_slice(data);
        let from = start.saturating_sub(terminator.len() - 1);
        let rest = &self.pending[from..];
        let found = if head {
            HEAD_END.find(rest)
        } else {
            memchr::memchr(b'\n', rest)
        }
        .map(|p| from + p + terminator.len());
        let Some(end) = found else {
            let limit = if head {
                self.limits.max_bytes
            } else {
                MAX_LINE
            };
            if self.pending.len() > limit {
                if head {
                    self.fail(431, "the request head is larger than http.max_header_bytes");
                } else {
                    self.fail(400, "invalid chunked body: line too long");
                }
            }
            return None;
        };
        let used = end - start;
        let unit = std::mem::take(&mut self.pending);
        let (unit, _) = unit.split_at(end);
        match self.state {
            State::Head => self.check_head(unit),
            State::ChunkSize => self.check_chunk_size(unit),
            State::ChunkDataEnd => {
                if unit == b"\r\n" {
                    self.ready.extend_from_slice(unit);
                    self.state = State::ChunkSize;
                } else {
                    self.fail(400, "invalid chunked body: chunk data longer than its size");
                }
            }
            State::Trailers => {
                self.ready.extend_from_slice(unit);
                if unit == b"\r\n" {
                    self.state = State::Head;
                }
            }
            _ => {}
        }
        Some(used)
    }

    fn check_chunk_size(&mut self, line: &[u8]) {
        let Some(line_body) = line.strip_suffix(b"\r\n") else {
            return self.fail(400, "invalid chunked body: bare LF after a chunk size");
        };
        let size = line_body.split(|&b| b == b';').next().unwrap_or_default();
        let valid = !size.is_empty() && size.len() <= 16 && size.iter().all(u8::is_ascii_hexdigit);
        let parsed = std::str::from_utf8(size)
            .ok()
            .filter(|_| valid)
            .and_then(|s| u64::from_str_radix(s, 16).ok());
        match parsed {
            Some(0) => {
                self.ready.extend_from_slice(line);
                self.state = State::Trailers;
            }
            Some(n) => {
                self.ready.extend_from_slice(line);
                self.state = State::ChunkData(n);
            }
            None => self.fail(400, "invalid chunked body: bad chunk size"),
        }
    }

    fn check_head(&mut self, raw: &[u8]) {
        // Empty lines before a request line are allowed (RFC 9112 §2.2).
        let skip = raw
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .unwrap_or(raw.len());
        let mut headers = vec![httparse::EMPTY_HEADER; self.limits.max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&raw[skip..]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return self.fail(400, "malformed request head"),
            Err(httparse::Error::TooManyHeaders) => {
                return self.fail(431, "too many header fields (http.max_headers)")
            }
            Err(e) => return self.fail(400, format!("malformed request head: {e}")),
        }
        let mut length: Option<u64> = None;
        let mut chunked = None;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                for part in h.value.split(|&b| b == b',') {
                    let part = part.trim_ascii();
                    let n = std::str::from_utf8(part)
                        .ok()
                        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok());
                    match (n, length) {
                        (None, _) => return self.fail(400, "invalid Content-Length"),
                        (Some(n), Some(prev)) if n != prev => {
                            return self.fail(400, "conflicting Content-Length values")
                        }
                        (Some(n), _) => length = Some(n),
                    }
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let last = h
                    .value
                    .split(|&b| b == b',')
                    .next_back()
                    .unwrap_or_default()
                    .trim_ascii();
                chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
            }
        }
        if chunked.is_some() && length.is_some() {
            return self.fail(
                400,
                "both Content-Length and Transfer-Encoding: refused as a request-smuggling risk",
            );
        }
        if chunked.is_some() && req.version == Some(0) {
            return self.fail(400, "Transfer-Encoding in an HTTP/1.0 request");
        }
        if chunked == Some(false) {
            return self.fail(400, "Transfer-Encoding must end in chunked");
        }
        let connect = req
            .method
            .is_some_and(|m| m.eq_ignore_ascii_case("CONNECT"));
        self.ready.extend_from_slice(raw);
        self.state = if connect {
            State::Tunnel
        } else if chunked == Some(true) {
            State::ChunkSize
        } else {
            match length {
                Some(n) if n > 0 => State::Body(n),
                _ => State::Head,
            }
        };
    }
}

impl<S: AsyncRead + SendQueue + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.ready_at < this.ready.len() {
                let n = (this.ready.len() - this.ready_at).min(buf.remaining());
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if matches!(this.state, State::Failed) {
                // End of input for hyper: it finishes what it was doing and closes.
                return Poll::Ready(Ok(()));
            }
            // Uninitialised: zeroing 16 KiB on every read (twice a request, the second finding
            // nothing) cost more than the request's parsing.
            let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
            let mut rb = ReadBuf::uninit(&mut tmp);
            if Pin::new(&mut this.inner)
                .poll_read(cx, &mut rb)?
                .is_pending()
            {
                let Some(t) = &mut this.timeouts else {
                    return Poll::Pending;
                };
                t.read_wait.get_or_insert_with(Instant::now);
                let inner = &this.inner;
                match t.poll(cx, || inner.unsent()) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Expired::Head) if !this.pending.is_empty() => {
                        this.fail(
                            408,
                            "the request head took longer than http.header_read_timeout",
                        );
                        continue;
                    }
                    Poll::Ready(_) => return Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
                }
            }
            let filled = rb.filled();
            if filled.is_empty() {
                // The client closed; hand over any partial head so hyper sees it as such.
                let rest = std::mem::take(&mut this.pending);
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.ready.extend_from_slice(&rest);
                this.state = State::Failed;
                continue;
            }
            this.feed(filled);
            if let Some(t) = &mut this.timeouts {
                t.progressed();
                // A head still arriving keeps the clock it started (the first one: the
                // connection's); any other state stops it.
                let arriving = matches!(this.state, State::Head) && !this.pending.is_empty();
                t.head_wait = if arriving {
                    Some(t.head_wait.unwrap_or_else(Instant::now))
                } else {
                    None
                };
            }
        }
    }
}

impl<S: AsyncWrite + SendQueue + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        self.wrote(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.flushed(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = self.answer_and_shut(cx);
        self.flushed(cx, r)
    }
}

impl<S: AsyncWrite + Unpin> GuardedStream<S> {
    /// Writes our own answer to a refused head, if there is one, then shuts the socket down.
    fn answer_and_shut(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.answer {
            if *written == bytes.len() {
                self.answer = None;
                break;
            }
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..])) {
                Ok(0) | Err(_) => {
                    self.answer = None;
                    break;
                }
                Ok(n) => *written += n,
            }
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl SendQueue for tokio::io::Empty {}

    fn guard() -> GuardedStream<tokio::io::Empty> {
        GuardedStream::new(
            tokio::io::empty(),
            HeadLimits {
                max_bytes: 1024,
                max_headers: 8,
            },
            ViolationSlot::default(),
        )
    }

    /// Feeds `input` in pieces of `step` bytes; returns what passed and the violation.
    fn run(input: &[u8], step: usize) -> (Vec<u8>, Option<Violation>) {
        let mut g = guard();
        for piece in input.chunks(step.max(1)) {
            g.feed(piece);
        }
        let passed = g.ready.clone();
        let v = g.slot.lock().clone();
        (passed, v)
    }

    #[test]
    fn sound_requests_pass_unchanged_however_they_are_split() {
        let input: &[u8] = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nPOST http://a/p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloPUT http://a/c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET http://a/z HTTP/1.1\r\n\r\n";
        for step in [1, 2, 3, 7, 64, 4096] {
            let (passed, v) = run(input, step);
            assert_eq!(v, None, "step {step}");
            assert_eq!(passed, input, "step {step}");
        }
    }

    #[test]
    fn smuggling_and_bad_framing_are_refused() {
        let cases: [(&[u8], u16, &str); 8] = [
            (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "Transfer-Encoding"),
            (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", 400, "conflicting"),
            (b"POST / HTTP/1.1\r\nContent-Length: 4, 5\r\n\r\n", 400, "conflicting"),
            (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "invalid Content-Length"),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400, "end in chunked"),
            (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"),
            (b"GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", 400, "malformed"),
            (b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\nH: 1\r\nI: 1\r\n\r\n", 431, "too many"),
        ];
        for (input, status, words) in cases {
            let (passed, v) = run(input, 5);
            let v = v.unwrap_or_else(|| panic!("accepted {:?}", String::from_utf8_lossy(input)));
            assert_eq!(v.status, status, "{v:?}");
            assert!(v.reason.contains(words), "{v:?}");
            assert!(passed.is_empty(), "nothing of a refused head reaches hyper");
        }
        let (_, v) = run(&[b'a'; 2000], 100);
        assert_eq!(v.map(|v| v.status), Some(431));
    }

    #[test]
    fn bad_chunks_end_the_body() {
        let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\nabc\r\n0\r\n\r\n";
        let (passed, v) = run(input, 4);
        let v = v.expect("refused");
        assert!(v.mid_body && v.reason.contains("chunk size"), "{v:?}");
        assert!(
            passed.ends_with(b"abc\r\n"),
            "{:?}",
            String::from_utf8_lossy(&passed)
        );
        let (_, v) = run(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n",
            3,
        );
        assert!(v.expect("refused").reason.contains("longer than its size"));
    }

    #[test]
    fn connect_switches_to_a_tunnel() {
        let input =
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n\x16\x03\x01 not http at all \r\n\r\n";
        let (passed, v) = run(input, 6);
        assert_eq!(v, None);
        assert_eq!(passed, input);
    }

    /// A guard with the default limits (idle 120 s, head 30 s) over one end of a pipe.
    fn timed() -> (
        GuardedStream<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        ViolationSlot,
    ) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let slot = ViolationSlot::default();
        let limits = HeadLimits {
            max_bytes: 1024,
            max_headers: 8,
        };
        let g = GuardedStream::new(server, limits, slot.clone())
            .with_timeouts(Duration::from_secs(120), Duration::from_secs(30));
        (g, client, slot)
    }

    fn secs(since: Instant) -> u64 {
        since.elapsed().as_secs()
    }

    // Time is paused: it jumps to the next timer whenever every task waits.

    #[tokio::test(start_paused = true)]
    async fn a_head_in_pieces_is_answered_408_after_the_head_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut g, mut client, slot) = timed();
        let started = Instant::now();
        client
            .write_all(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 256];
        assert_eq!(g.read(&mut buf).await.expect("end of input"), 0);
        assert_eq!(secs(started), 30);
        g.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        assert!(
            answer.contains("x-meshcache-error: request-timeout"),
            "{answer}"
        );
        assert_eq!(slot.lock().as_ref().map(|v| v.status), Some(408));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_head_timeout() {
        use tokio::io::AsyncReadExt;
        let (mut g, _client, slot) = timed();
        let started = Instant::now();
        let e = g.read(&mut [0u8; 16]).await.expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 30);
        assert!(slot.lock().is_none(), "nothing to answer");
    }

    #[tokio::test(start_paused = true)]
    async fn between_requests_only_the_idle_timeout_applies() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut g, mut client, _slot) = timed();
        // A request every 100 s (longer than the head timeout, shorter than the idle one):
        // the connection lives on.
        let head = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut buf = [0u8; 256];
        for _ in 0..3 {
            client.write_all(head).await.expect("write");
            assert_eq!(g.read(&mut buf).await.expect("head"), head.len());
            let wait = tokio::time::timeout(Duration::from_secs(100), g.read(&mut buf)).await;
            assert!(wait.is_err(), "the read ended early: {wait:?}");
        }
        // Then silence after a request: 120 s.
        client.write_all(head).await.expect("write");
        assert_eq!(g.read(&mut buf).await.expect("head"), head.len());
        let started = Instant::now();
        let e = g.read(&mut buf).await.expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 120);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_takes_ends_after_the_idle_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut g, mut client, _slot) = timed();
        let head = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
        client.write_all(head).await.expect("write");
        assert_eq!(g.read(&mut [0u8; 256]).await.expect("head"), head.len());
        // The answer is larger than the pipe, and the client never reads it.
        let started = Instant::now();
        let e = g
            .write_all(&vec![b'x'; 1 << 20])
            .await
            .expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 120);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_slow_download_is_not_idle() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut g, mut client, _slot) = timed();
        let head = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
        client.write_all(head).await.expect("write");
        let mut buf = [0u8; 256];
        assert_eq!(g.read(&mut buf).await.expect("head"), head.len());
        // As hyper does while it answers, a read is left waiting for the next request.
        let wait = tokio::time::timeout(Duration::from_secs(1), g.read(&mut buf)).await;
        assert!(wait.is_err());
        // The client takes a 640 KiB answer 64 KiB at a time, every 30 s: 5 minutes, with the
        // answer moving all along and the client sending nothing.
        let started = Instant::now();
        let answer = vec![b'x'; 640 << 10];
        let slow_reader = async {
            let mut got = 0;
            let mut chunk = vec![0u8; 64 << 10];
            while got < answer.len() {
                tokio::time::sleep(Duration::from_secs(30)).await;
                got += client.read(&mut chunk).await.expect("read");
            }
            got
        };
        let (sent, got) = tokio::time::timeout(Duration::from_secs(1000), async {
            tokio::join!(g.write_all(&answer), slow_reader)
        })
        .await
        .expect("the download never completed");
        sent.expect("the download was cut as idle");
        assert_eq!(got, answer.len());
        assert!(secs(started) >= 270, "{}", secs(started));
    }

    /// A client that drains its socket slowly: every write waits for room, while the send
    /// queue goes down by one byte a second until `until` seconds, then stays put.
    struct Draining {
        head: Option<&'static [u8]>,
        start: Instant,
        until: u64,
    }

    impl AsyncRead for Draining {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            match self.head.take() {
                Some(head) => {
                    buf.put_slice(head);
                    Poll::Ready(Ok(()))
                }
                None => Poll::Pending,
            }
        }
    }

    impl AsyncWrite for Draining {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            _data: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Pending
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl SendQueue for Draining {
        fn unsent(&self) -> Option<u32> {
            Some(1_000_000 - self.start.elapsed().as_secs().min(self.until) as u32)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_while_the_client_drains_its_queue() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
        let draining = Draining {
            head: Some(head),
            start: Instant::now(),
            until: 300,
        };
        let limits = HeadLimits {
            max_bytes: 1024,
            max_headers: 8,
        };
        let mut g = GuardedStream::new(draining, limits, ViolationSlot::default())
            .with_timeouts(Duration::from_secs(120), Duration::from_secs(30));
        assert_eq!(g.read(&mut [0u8; 256]).await.expect("head"), head.len());
        // The queue goes down until 300 s: the checks at 120 and 240 s see it move, the one
        // at 360 s too (it moved until 300), the one at 480 s does not.
        let started = Instant::now();
        let e = g.write_all(b"answer").await.expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 480);
    }
}
