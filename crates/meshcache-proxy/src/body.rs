//! Response bodies and the end of a transaction.
//!
//! [`ProxyBody`] is what every response carries: nothing, a stored object's bytes (a cheap
//! `Bytes` clone), or an upstream body streamed through. A streamed body may also *capture* a
//! copy for the store: chunks are kept as they pass (or, past the memory store's limit, written
//! to a disk as they pass) and admitted only when the body ended complete and within the size
//! limit, so a truncated or oversized response is never cached.
//! When the body is done (or dropped half-way) the upstream connection goes back to the pool or
//! is closed, and the [`Transaction`] is finished: one access-log line and the metrics.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use meshcache_disk::DiskStream;

use crate::accesslog::AccessRecord;
use crate::cache::FetchGuard;
use crate::outcome::{HierCode, ResultCode};
use crate::upstream::Lease;
use crate::Shared;

/// The error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One client request from arrival to its last byte: what the access log and metrics record.
pub struct Transaction {
    shared: Arc<Shared>,
    start: Instant,
    start_wall: SystemTime,
    client: IpAddr,
    method: Method,
    url: String,
    /// Squid result code.
    pub result: ResultCode,
    /// Status sent.
    pub status: u16,
    /// Where the response came from.
    pub hierarchy: HierCode,
    /// The ICP wait timed out.
    pub timed_out: bool,
    /// The upstream host, when one was used.
    pub peer: Option<String>,
    /// Response content type.
    pub content_type: Option<HeaderValue>,
    /// Size of the response head, estimated from its fields.
    pub head_bytes: u64,
    /// The user the request's credentials named, for the log.
    pub user: Option<Arc<str>>,
    finished: bool,
}

impl Transaction {
    /// The client's address.
    pub fn client(&self) -> IpAddr {
        self.client
    }

    /// Starts a transaction.
    pub(crate) fn new(shared: Arc<Shared>, client: IpAddr, method: Method, url: String) -> Self {
        Transaction {
            shared,
            start: Instant::now(),
            start_wall: SystemTime::now(),
            client,
            method,
            url,
            result: ResultCode::NoneNone,
            status: 0,
            hierarchy: HierCode::None,
            timed_out: false,
            peer: None,
            content_type: None,
            head_bytes: 0,
            user: None,
            finished: false,
        }
    }

    /// The URL as logged.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The request's method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Logs and counts the transaction; later calls do nothing.
    pub fn finish(&mut self, body_bytes: u64) {
        self.end(body_bytes, false);
    }

    /// As [`Transaction::finish`], for a response not sent whole (`aborted`): logged with
    /// Squid's `_ABORTED` suffix and counted.
    pub fn end(&mut self, body_bytes: u64, aborted: bool) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let elapsed = self.start.elapsed();
        let bytes = self.head_bytes + body_bytes;
        self.shared.metrics.record(self.result, bytes, elapsed);
        if aborted {
            self.shared.metrics.aborted.fetch_add(1, Relaxed);
        }
        if let Some(log) = &self.shared.log {
            log.log(&AccessRecord {
                start: self.start_wall,
                elapsed,
                client: self.client,
                result: self.result,
                status: self.status,
                bytes,
                method: self.method.as_str(),
                url: &self.url,
                hierarchy: self.hierarchy,
                timed_out: self.timed_out,
                aborted,
                peer: self.peer.as_deref(),
                content_type: self.content_type.as_ref().and_then(|v| v.to_str().ok()),
                user: self.user.as_deref(),
            });
        }
    }
}

impl Drop for Transaction {
    /// A transaction dropped unfinished never got its response out: the client went away
    /// while it waited (for the origin, a peer, a collapsed fetch). Squid logs that as
    /// `…_ABORTED/000`, and so do we: nothing passes unlogged.
    fn drop(&mut self) {
        if !self.finished {
            self.status = 0;
            self.head_bytes = 0;
            self.end(0, true);
        }
    }
}

/// Where a captured body goes when it ended complete: the store, with the collapsed fetch's
/// guard (held until the object can be found).
pub type Sink = Box<dyn FnOnce(Bytes, Option<FetchGuard>) + Send>;

/// Starts writing the body to a disk, for a body too large for the memory store.
pub type Spill = Box<dyn FnOnce() -> Option<DiskStream> + Send>;

/// A copy of a streamed body being taken for the store.
///
/// The copy is kept in memory up to the memory store's limit. A body larger than that (or
/// announced larger) is written to a disk as it arrives instead, when there is a [`Spill`]; the
/// memory copy is then given up. Either way it is stored only if it ended complete.
pub struct Capture {
    chunks: Vec<Bytes>,
    size: u64,
    limit: u64,
    memory_limit: u64,
    expected: Option<u64>,
    sink: Sink,
    spill: Option<Spill>,
    stream: Option<DiskStream>,
    /// Waiters of a collapsed fetch wake when this drops: after the object is stored.
    guard: Option<FetchGuard>,
}

impl Capture {
    /// Captures up to `limit` bytes, in memory up to `memory_limit` and on a disk beyond it
    /// (with `spill`); `expected` is the Content-Length, if any.
    pub fn new(
        limit: u64,
        memory_limit: u64,
        expected: Option<u64>,
        sink: Sink,
        spill: Option<Spill>,
        guard: Option<FetchGuard>,
    ) -> Self {
        Capture {
            chunks: Vec::new(),
            size: 0,
            limit,
            memory_limit,
            expected,
            sink,
            spill,
            stream: None,
            guard,
        }
    }

    /// Keeps a chunk; false once the copy is given up (the body outgrew the limit, or a disk
    /// could not take it).
    fn push(&mut self, chunk: &Bytes) -> bool {
        self.size += chunk.len() as u64;
        if self.size > self.limit {
            return false;
        }
        if let Some(stream) = &mut self.stream {
            return stream.push(chunk.clone());
        }
        let too_large =
            self.size > self.memory_limit || self.expected.is_some_and(|n| n > self.memory_limit);
        if !too_large {
            self.chunks.push(chunk.clone());
            return true;
        }
        let Some(mut stream) = self.spill.take().and_then(|spill| spill()) else {
            return false;
        };
        for piece in self.chunks.drain(..).chain(std::iter::once(chunk.clone())) {
            if !stream.push(piece) {
                return false;
            }
        }
        self.stream = Some(stream);
        true
    }

    fn complete(self) {
        if self.expected.is_some_and(|n| n != self.size) {
            return;
        }
        if let Some(stream) = self.stream {
            stream.finish(self.guard.map(|g| Box::new(g) as Box<dyn Send>));
            return;
        }
        let body = match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.into_iter().next().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::with_capacity(self.size as usize);
                for c in &self.chunks {
                    all.extend_from_slice(c);
                }
                all.freeze()
            }
        };
        (self.sink)(body, self.guard);
    }
}

/// A body streamed from upstream.
pub struct Relay {
    inner: Incoming,
    capture: Option<Capture>,
    lease: Option<Lease>,
    done: bool,
}

impl Relay {
    /// Relays `inner`, optionally capturing it, returning `lease` to the pool at its end.
    pub fn new(inner: Incoming, capture: Option<Capture>, lease: Lease) -> Self {
        let mut relay = Relay {
            inner,
            capture,
            lease: Some(lease),
            done: false,
        };
        // An empty body (Content-Length: 0, 304, HEAD) may never be polled: finish it now.
        if relay.inner.is_end_stream() {
            relay.end();
        }
        relay
    }

    fn end(&mut self) {
        self.done = true;
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
        if let Some(capture) = self.capture.take() {
            capture.complete();
        }
    }
}

enum Kind {
    Empty,
    Full(Option<Bytes>),
    /// Pieces sent one after the other (an applet's response: slices of cached bodies and its
    /// own bytes), with the length of what is left.
    Parts(std::collections::VecDeque<Bytes>, u64),
    Relay(Box<Relay>),
}

/// The body of every response the proxy sends.
pub struct ProxyBody {
    kind: Kind,
    sent: u64,
    /// The upstream body broke off: what the client got is short.
    broken: bool,
    txn: Option<Box<Transaction>>,
}

impl ProxyBody {
    /// No body.
    pub fn empty() -> Self {
        ProxyBody {
            kind: Kind::Empty,
            sent: 0,
            broken: false,
            txn: None,
        }
    }

    /// A complete body in memory.
    pub fn full(bytes: Bytes) -> Self {
        ProxyBody {
            kind: Kind::Full(Some(bytes)),
            sent: 0,
            broken: false,
            txn: None,
        }
    }

    /// A body sent in pieces, in order.
    pub fn parts(parts: Vec<Bytes>) -> Self {
        let parts: std::collections::VecDeque<Bytes> =
            parts.into_iter().filter(|p| !p.is_empty()).collect();
        let len = parts.iter().map(|p| p.len() as u64).sum();
        ProxyBody {
            kind: Kind::Parts(parts, len),
            sent: 0,
            broken: false,
            txn: None,
        }
    }

    /// A body relayed from upstream.
    pub fn relay(relay: Relay) -> Self {
        ProxyBody {
            kind: Kind::Relay(Box::new(relay)),
            sent: 0,
            broken: false,
            txn: None,
        }
    }

    /// Finishes `txn` when this body is done.
    pub fn with_transaction(mut self, txn: Transaction) -> Self {
        self.txn = Some(Box::new(txn));
        self
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // A body dropped before its end was not sent whole: the client went away mid-body
        // (or hyper gave up writing to it). HEAD responses are dropped unsent by design.
        let short = self.broken || !self.is_end_stream();
        if let Some(txn) = &mut self.txn {
            let aborted = short && txn.method != Method::HEAD;
            txn.end(self.sent, aborted);
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match &mut this.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(bytes) => match bytes.take() {
                Some(b) if !b.is_empty() => {
                    this.sent += b.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                _ => Poll::Ready(None),
            },
            Kind::Parts(parts, left) => match parts.pop_front() {
                Some(b) => {
                    this.sent += b.len() as u64;
                    *left -= b.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                None => Poll::Ready(None),
            },
            Kind::Relay(relay) => {
                if relay.done {
                    return Poll::Ready(None);
                }
                match Pin::new(&mut relay.inner).poll_frame(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(None) => {
                        relay.end();
                        Poll::Ready(None)
                    }
                    Poll::Ready(Some(Err(e))) => {
                        // Truncated: nothing is stored and the connection is not reused.
                        this.broken = true;
                        relay.capture = None;
                        relay.lease = None;
                        relay.done = true;
                        Poll::Ready(Some(Err(e.into())))
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            this.sent += data.len() as u64;
                            if let Some(txn) = &this.txn {
                                txn.shared
                                    .metrics
                                    .bytes_from_upstream
                                    .fetch_add(data.len() as u64, Relaxed);
                            }
                            if let Some(capture) = &mut relay.capture {
                                if !capture.push(data) {
                                    relay.capture = None;
                                }
                            }
                        }
                        if relay.inner.is_end_stream() {
                            relay.end();
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full(b) => b.as_ref().is_none_or(Bytes::is_empty),
            Kind::Parts(p, _) => p.is_empty(),
            Kind::Relay(r) => r.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Parts(_, left) => SizeHint::with_exact(*left),
            Kind::Relay(r) if r.done => SizeHint::with_exact(0),
            Kind::Relay(r) => r.inner.size_hint(),
        }
    }
}
