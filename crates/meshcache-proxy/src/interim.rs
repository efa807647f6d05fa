//! What a client connection's socket carries besides hyper's responses: the interim (1xx)
//! responses an upstream server sent before its answer, and our own HTTP-version in the status
//! line of a response to an HTTP/1.0 client.
//!
//! - **Interim responses.** A proxy MUST forward the 1xx responses it receives (RFC 9110
//!   §15.2) — a `103 Early Hints` lets a browser fetch a page's style sheet while the page is
//!   still on its way — but never to an HTTP/1.0 client, and never stores them. hyper's server
//!   sends exactly one response per request (and its own `100 Continue`), so the 1xx go out
//!   here, on the socket under hyper: the upstream client's callback
//!   (`hyper::ext::on_informational`) hands each to [`Interim::relay`], which writes it at once
//!   when hyper has nothing half-sent on the socket, or keeps the rest to go ahead of hyper's
//!   next write. The final response's head cannot be before it: the upstream client reads
//!   the 1xx before it returns the final head, and only then is a response handed to hyper.
//!   While hyper is still sending an earlier message, a 1xx is dropped (counted in the log):
//!   bytes written then would land inside that message.
//! - **Our own version.** An intermediary sends its own HTTP-version (RFC 9110 §6.2); hyper
//!   writes `HTTP/1.0` in the status line of every response to an HTTP/1.0 client. A request
//!   that came as HTTP/1.0 ([`Interim::begin`]) has the first nine bytes of its
//!   response's head, `HTTP/1.0 `, sent as `HTTP/1.1 `. hyper keeps HTTP/1.0's framing (no
//!   chunked coding, the connection closed or kept alive as 1.0 does), which the client reads.
//!
//! A 1xx is relayed only while the request it answers is the one in flight and hyper has
//! written nothing since it arrived ([`InterimRelay`]): an upstream request that outlives its
//! client's answer (a background revalidation, a fetch finished for the cache after the client
//! left) relays nothing. (So neither does one after hyper's own `100 Continue` to the same
//! request: rare, as interim responses go.)
//!
//! Until a request of the connection asks for either, the socket's writes only read one
//! flag; after, each write and flush takes an uncontended lock.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, HeaderValue, StatusCode, Version};
use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use crate::headers;

/// The status line prefix hyper writes to an HTTP/1.0 client, and ours in its place.
const THEIRS: &[u8] = b"HTTP/1.0 ";
const OURS: &[u8] = b"HTTP/1.1 ";

/// One client connection's interim responses and status-line version; see the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct Interim {
    /// Set once a request asked for either: until then the socket's writes take no lock.
    armed: AtomicBool,
    /// Whether everything hyper gave the socket has gone out: nothing was written since the
    /// last completed flush (hyper flushes the socket only once its own buffer is empty). Kept
    /// on every write, armed or not: a connection armed later may still be sending an earlier
    /// response.
    clean: AtomicBool,
    /// The request in flight, before hyper wrote anything for it (0: none), and the last
    /// number given.
    current: AtomicU64,
    numbered: AtomicU64,
    state: Mutex<State>,
}

/// Where the interim responses to one request go: its connection, while that request is the
/// one in flight and not yet answered.
#[derive(Clone, Debug)]
pub(crate) struct InterimRelay {
    interim: Arc<Interim>,
    request: u64,
}

#[derive(Debug)]
struct State {
    /// The connection's socket, while it is open (cleared under this lock before it closes).
    fd: Option<RawFd>,
    /// Interim bytes the socket did not take at once: they go ahead of hyper's next write.
    pending: Vec<u8>,
    /// The next head hyper writes is a response to an HTTP/1.0 client: send our version.
    own_version: bool,
    /// Interim responses dropped because hyper was still sending.
    dropped: u64,
}

impl Interim {
    /// The state of the connection on `stream`.
    pub(crate) fn new(stream: &TcpStream) -> Self {
        Interim {
            armed: AtomicBool::new(false),
            clean: AtomicBool::new(true),
            current: AtomicU64::new(0),
            numbered: AtomicU64::new(0),
            state: Mutex::new(State {
                fd: Some(stream.as_raw_fd()),
                pending: Vec::new(),
                own_version: false,
                dropped: 0,
            }),
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// A request sent as `version` arrived: it is the one in flight until hyper writes (its
    /// answer). Its relay, for an HTTP/1.1 client (RFC 9110 §15.2: none for an HTTP/1.0 one,
    /// whose response's status line is to carry our HTTP-version instead).
    pub(crate) fn begin(self: &Arc<Self>, version: Version) -> Option<InterimRelay> {
        // Only the connection's task numbers its requests: no read-modify-write needed.
        let request = self.numbered.load(Ordering::Relaxed) + 1;
        self.numbered.store(request, Ordering::Relaxed);
        self.current.store(request, Ordering::Release);
        if version == Version::HTTP_10 {
            self.arm();
            self.state.lock().own_version = true;
        }
        accepts_interim(version).then(|| InterimRelay {
            interim: self.clone(),
            request,
        })
    }

    /// Interim response `status` with `fields` for `request`, with `via` our `Via` entry for
    /// it: to the client now, or ahead of the final response; never a `100` (hyper answers
    /// `Expect` itself) or a `101` (not interim: the connection changes protocol).
    #[allow(unsafe_code)]
    fn relay(&self, request: u64, status: StatusCode, fields: &HeaderMap, via: &HeaderValue) {
        if !status.is_informational()
            || status == StatusCode::CONTINUE
            || status == StatusCode::SWITCHING_PROTOCOLS
        {
            return;
        }
        let bytes = encode(status, fields, via);
        let mut st = self.state.lock();
        if self.current.load(Ordering::Acquire) != request {
            // Answered already (or another request is in flight): too late for the client.
            return;
        }
        if !self.clean.load(Ordering::Acquire) {
            st.dropped += 1;
            if st.dropped.is_power_of_two() {
                tracing::debug!(
                    status = status.as_u16(),
                    dropped = st.dropped,
                    "interim response dropped: the client's connection is still sending"
                );
            }
            return;
        }
        if !st.pending.is_empty() {
            st.pending.extend_from_slice(&bytes);
            return;
        }
        let Some(fd) = st.fd else {
            return;
        };
        // SAFETY: `fd` is the connection's socket, and it is open: the stream that owns it
        // clears `fd` under this lock, which we hold, before the socket is closed.
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
        match rustix::net::send(socket, &bytes, flags) {
            Ok(n) => st.pending.extend_from_slice(&bytes[n..]),
            Err(rustix::io::Errno::AGAIN) => st.pending.extend_from_slice(&bytes),
            // The connection is broken: hyper's next write finds out.
            Err(_) => {}
        }
    }

    /// Before hyper writes `first` (its buffer, or the first of its buffers) to `stream`:
    /// sends what is pending, and our version in place of `HTTP/1.0 ` when that is due.
    /// `Some(n)`: `n` bytes of hyper's buffer are accounted for (the caller returns it);
    /// `None`: write hyper's buffer as usual.
    pub(crate) fn poll_before_write(
        &self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
        first: &[u8],
    ) -> Poll<io::Result<Option<usize>>> {
        // Whatever hyper writes now is the answer to the request in flight (or the rest of an
        // earlier one): its 1xx are too late from here, whether or not it asked for any yet (a
        // background revalidation may).
        self.current.store(0, Ordering::Release);
        if !self.armed.load(Ordering::Acquire) {
            self.clean.store(false, Ordering::Release);
            return Poll::Ready(Ok(None));
        }
        let mut st = self.state.lock();
        ready!(poll_pending(&mut st, stream, cx))?;
        let clean = self.clean.load(Ordering::Acquire);
        let rewrite = st.own_version && clean && first.starts_with(THEIRS);
        if rewrite {
            let n = ready!(Pin::new(&mut *stream).poll_write(cx, OURS))?;
            st.pending.extend_from_slice(&OURS[n..]);
        }
        // The first write after the request asked decides: the head, or nothing to change.
        st.own_version = false;
        self.clean.store(false, Ordering::Release);
        Poll::Ready(Ok(rewrite.then_some(THEIRS.len())))
    }

    /// hyper flushes `stream`: what is pending goes first.
    pub(crate) fn poll_before_flush(
        &self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.armed.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        poll_pending(&mut self.state.lock(), stream, cx)
    }

    /// hyper's flush completed: everything it wrote has gone to the socket.
    pub(crate) fn flushed(&self) {
        self.clean.store(true, Ordering::Release);
    }

    /// The socket is about to close: nothing more is written to it from here.
    pub(crate) fn closed(&self) {
        self.state.lock().fd = None;
    }
}

impl InterimRelay {
    /// The interim response (`status`, `fields`) an upstream server sent (`via`: our `Via`
    /// entry for the version it came in).
    pub(crate) fn relay(&self, status: StatusCode, fields: &HeaderMap, via: &HeaderValue) {
        self.interim.relay(self.request, status, fields, via);
    }

    /// Makes the connection's writes look at what this relays (before the upstream request
    /// goes: a 1xx may come back at once).
    pub(crate) fn arm(&self) {
        self.interim.arm();
    }
}

/// Writes the pending interim bytes to `stream`.
fn poll_pending(
    st: &mut State,
    stream: &mut TcpStream,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while !st.pending.is_empty() {
        let n = ready!(Pin::new(&mut *stream).poll_write(cx, &st.pending))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        st.pending.drain(..n);
    }
    Poll::Ready(Ok(()))
}

/// An interim response as it goes to the client: our HTTP-version, its fields but the
/// hop-by-hop ones, and our `Via` entry.
fn encode(status: StatusCode, fields: &HeaderMap, via: &HeaderValue) -> Vec<u8> {
    let mut fields = fields.clone();
    headers::strip_hop_by_hop(&mut fields);
    fields.append(http::header::VIA, via.clone());
    let mut out = Vec::with_capacity(64 + fields.len() * 48);
    out.extend_from_slice(OURS);
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Whether a client that sent `version` may be sent interim responses (RFC 9110 §15.2: not
/// an HTTP/1.0 one).
pub(crate) fn accepts_interim(version: Version) -> bool {
    version >= Version::HTTP_11
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interim_response_is_ours_without_hop_by_hop_fields_and_with_our_via() {
        let mut fields = HeaderMap::new();
        fields.append("link", HeaderValue::from_static("</a.css>; rel=preload"));
        fields.append("connection", HeaderValue::from_static("x-secret"));
        fields.append("x-secret", HeaderValue::from_static("1"));
        fields.append("keep-alive", HeaderValue::from_static("timeout=5"));
        let via = HeaderValue::from_static("1.1 n (meshcache/0)");
        let got = encode(StatusCode::from_u16(103).expect("103"), &fields, &via);
        assert_eq!(
            String::from_utf8(got).expect("text"),
            "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\nvia: 1.1 n (meshcache/0)\r\n\r\n"
        );
    }

    #[test]
    fn only_an_http_1_1_client_gets_them() {
        assert!(!accepts_interim(Version::HTTP_10));
        assert!(!accepts_interim(Version::HTTP_09));
        assert!(accepts_interim(Version::HTTP_11));
    }
}
