//! Idle limits on connections, with one timer each.
//!
//! A connection is idle only when nothing moves either way. Whoever drives an HTTP/1.1
//! connection leaves a read waiting while it writes (hyper does, on both sides: a server for
//! the next request, a client for the response or the peer's close), so a read that counted on
//! its own would end a long download because the client said nothing meanwhile, or a long
//! upload because the origin had not answered yet. Here every byte read or written starts every
//! wait again, and a write still waiting for room has moved if the socket's send queue went
//! down ([`SendQueue`]: the kernel wakes a writer only once much of a full buffer has drained,
//! long after a slow reader began taking it).
//!
//! The timer is armed once and moved only when it fires early: resetting a timer per read and
//! per write cost more than a small hit's parsing (docs/benchmarks.md).
//!
//! [`IdleStream`] puts that limit on any stream: upstream connections (`upstream.read_timeout`)
//! and the far side of CONNECT tunnels (`http.idle_timeout`). A connection can also be told,
//! through its [`Quiet`], that its silence is not its peer's fault: an upstream connection
//! sending a request body the client has not sent yet, or one waiting in the pool. The client
//! side keeps the same limits in [`crate::guard::GuardedStream`], with the head timeout beside.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant, Sleep};

/// What the idle timeout can ask a stream about its send queue.
pub trait SendQueue {
    /// Bytes written but not yet taken by the peer, when the stream can tell.
    fn unsent(&self) -> Option<u32> {
        None
    }
}

impl SendQueue for crate::zerocopy::ZeroCopyStream {
    fn unsent(&self) -> Option<u32> {
        crate::zerocopy::ZeroCopyStream::unsent(self)
    }
}

impl SendQueue for TcpStream {
    fn unsent(&self) -> Option<u32> {
        crate::zerocopy::unsent(self)
    }
}

/// Why a connection may be silent without its peer having stalled; shared between the
/// connection and whoever knows.
#[derive(Debug, Default)]
pub struct Quiet {
    /// The body being sent waits for bytes from our own client.
    awaiting_body: AtomicBool,
    /// The body being sent moved since the timer last looked.
    body_moved: AtomicBool,
    /// No exchange is under way: the connection waits in the pool.
    pooled: AtomicBool,
}

impl Quiet {
    /// The body being sent is waiting for (`true`) or has (`false`) its next bytes.
    pub fn awaiting_body(&self, waiting: bool) {
        if !waiting {
            self.body_moved.store(true, Relaxed);
        }
        self.awaiting_body.store(waiting, Relaxed);
    }

    /// The connection went into (`true`) or out of (`false`) the pool.
    pub fn pooled(&self, pooled: bool) {
        self.pooled.store(pooled, Relaxed);
    }

    /// Whether silence now is excused; clears what only excused the time since the last look.
    fn excused(&self) -> bool {
        let moved = self.body_moved.swap(false, Relaxed);
        moved || self.awaiting_body.load(Relaxed) || self.pooled.load(Relaxed)
    }
}

/// A connection's time limits, kept with one timer; see the [module documentation](self).
pub(crate) struct Timeouts {
    idle: Duration,
    head: Duration,
    timer: Pin<Box<Sleep>>,
    /// Since when a read has waited for bytes, if one is waiting.
    pub(crate) read_wait: Option<Instant>,
    /// Since when a write has waited for room, if one is waiting.
    write_wait: Option<Instant>,
    /// Since when the head now arriving has been on its way, if one is.
    pub(crate) head_wait: Option<Instant>,
    /// The socket's unsent bytes when the write wait began (or last went on).
    queued: Option<u32>,
    quiet: Option<Arc<Quiet>>,
}

/// Which limit passed.
pub(crate) enum Expired {
    /// A read or a write waited too long, or the first head never began.
    Idle,
    /// A head began but did not arrive whole in time.
    Head,
}

impl Timeouts {
    /// An idle limit and a head limit, the first head's counted from now.
    pub(crate) fn new(idle: Duration, head: Duration) -> Self {
        let now = Instant::now();
        Timeouts {
            idle,
            head,
            timer: Box::pin(tokio::time::sleep_until(now + head.min(idle))),
            read_wait: None,
            write_wait: None,
            head_wait: Some(now),
            queued: None,
            quiet: None,
        }
    }

    /// An idle limit only, waived while `quiet` excuses the silence.
    fn idle_only(idle: Duration, quiet: Option<Arc<Quiet>>) -> Self {
        Timeouts {
            idle,
            head: idle,
            timer: Box::pin(tokio::time::sleep_until(Instant::now() + idle)),
            read_wait: None,
            write_wait: None,
            head_wait: None,
            queued: None,
            quiet,
        }
    }

    /// Bytes moved, one way or the other: every wait starts again.
    pub(crate) fn progressed(&mut self) {
        self.read_wait = None;
        self.write_wait = None;
    }

    /// The nearest deadline in force, and what it limits.
    fn due(&self) -> Option<(Instant, Expired)> {
        let waits = [self.read_wait, self.write_wait].into_iter().flatten();
        let idle = waits.min().map(|t| (t + self.idle, Expired::Idle));
        let head = self.head_wait.map(|t| (t + self.head, Expired::Head));
        match (idle, head) {
            (Some(i), Some(h)) => Some(if h.0 < i.0 { h } else { i }),
            (i, h) => i.or(h),
        }
    }

    /// Ready with the limit that passed; otherwise the task is woken when the nearest one may
    /// have. A later deadline than the timer's leaves it alone: when it fires early, it is moved
    /// then. When the idle limit passes, a write still waiting has not stalled if the socket's
    /// send queue (`unsent`) went down meanwhile (the peer is reading, and the kernel has not
    /// yet let us write more), and no wait has if the connection's [`Quiet`] excuses it.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        unsent: impl Fn() -> Option<u32>,
    ) -> Poll<Expired> {
        loop {
            let Some((due, what)) = self.due() else {
                return Poll::Pending;
            };
            if due < self.timer.deadline() {
                self.timer.as_mut().reset(due);
            }
            ready!(Future::poll(self.timer.as_mut(), cx));
            if Instant::now() < due {
                self.timer.as_mut().reset(due);
                continue;
            }
            if matches!(what, Expired::Head) {
                return Poll::Ready(what);
            }
            let writing = self.write_wait.is_some();
            let drained = match (writing, self.queued) {
                (true, Some(before)) => unsent().filter(|&q| q < before),
                _ => None,
            };
            let excused = self.quiet.as_ref().is_some_and(|q| q.excused());
            if drained.is_none() && !excused {
                return Poll::Ready(what);
            }
            let now = Instant::now();
            let read = self.read_wait.map(|_| now);
            self.progressed();
            self.read_wait = read;
            if writing {
                self.write_wait = Some(now);
                self.queued = drained.or_else(&unsent);
            }
        }
    }

    /// A write's result under the idle limit: bytes taken are movement; a write that cannot go
    /// on starts (or continues) the write wait, and ends `TimedOut` when that lasted too long.
    pub(crate) fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
        unsent: impl Fn() -> Option<u32>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) if n > 0 => {
                self.progressed();
                r
            }
            Poll::Ready(_) => self.flushed(cx, r, unsent),
            Poll::Pending => self.write_waits(cx, unsent),
        }
    }

    /// A flush's or shutdown's result under the idle limit, as [`Timeouts::wrote`]. One that
    /// is ready at once moved nothing: hyper flushes on every turn of its loop, and that must
    /// not keep a silent connection alive.
    pub(crate) fn flushed<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
        unsent: impl Fn() -> Option<u32>,
    ) -> Poll<io::Result<T>> {
        if r.is_pending() {
            return self.write_waits(cx, unsent);
        }
        if self.write_wait.is_some() {
            self.progressed();
        }
        r
    }

    fn write_waits<T>(
        &mut self,
        cx: &mut Context<'_>,
        unsent: impl Fn() -> Option<u32>,
    ) -> Poll<io::Result<T>> {
        if self.write_wait.is_none() {
            self.write_wait = Some(Instant::now());
            self.queued = unsent();
        }
        match self.poll(cx, unsent) {
            Poll::Ready(_) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A read's result under the idle limit: bytes read (or the end of input) are movement; a
    /// read that waits for bytes starts (or continues) the read wait, as [`Timeouts::wrote`].
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<()>>,
        unsent: impl Fn() -> Option<u32>,
    ) -> Poll<io::Result<()>> {
        if r.is_ready() {
            self.progressed();
            return r;
        }
        self.read_wait.get_or_insert_with(Instant::now);
        match self.poll(cx, unsent) {
            Poll::Ready(_) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A stream ended with `TimedOut` once nothing has moved either way for its idle limit; see
/// the [module documentation](self).
pub struct IdleStream<S> {
    inner: S,
    timeouts: Timeouts,
}

impl<S> IdleStream<S> {
    /// Limits `inner` to `idle` without movement.
    pub fn new(inner: S, idle: Duration) -> Self {
        IdleStream {
            inner,
            timeouts: Timeouts::idle_only(idle, None),
        }
    }

    /// As [`IdleStream::new`], with the limit waived while `quiet` excuses the silence.
    pub fn with_quiet(inner: S, idle: Duration, quiet: Arc<Quiet>) -> Self {
        IdleStream {
            inner,
            timeouts: Timeouts::idle_only(idle, Some(quiet)),
        }
    }
}

impl<S: AsyncRead + SendQueue + Unpin> AsyncRead for IdleStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let inner = &this.inner;
        this.timeouts.read(cx, r, || inner.unsent())
    }
}

impl<S: AsyncWrite + SendQueue + Unpin> AsyncWrite for IdleStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        let inner = &this.inner;
        this.timeouts.wrote(cx, r, || inner.unsent())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        let inner = &this.inner;
        this.timeouts.wrote(cx, r, || inner.unsent())
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        let inner = &this.inner;
        this.timeouts.flushed(cx, r, || inner.unsent())
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        let inner = &this.inner;
        this.timeouts.flushed(cx, r, || inner.unsent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    impl SendQueue for DuplexStream {}

    const IDLE: Duration = Duration::from_secs(30);

    fn secs(since: Instant) -> u64 {
        since.elapsed().as_secs()
    }

    // Time is paused: it jumps to the next timer whenever every task waits.

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_after_the_idle_limit() {
        let (near, _far) = tokio::io::duplex(1024);
        let mut s = IdleStream::new(near, IDLE);
        let started = Instant::now();
        let e = s.read(&mut [0u8; 16]).await.expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 30);
    }

    #[tokio::test(start_paused = true)]
    async fn flushes_with_nothing_to_flush_are_not_movement() {
        let (near, _far) = tokio::io::duplex(1024);
        let mut s = IdleStream::new(near, IDLE);
        let started = Instant::now();
        // As hyper does: a read left waiting, and a flush on every turn of the loop.
        let e = loop {
            let mut buf = [0u8; 16];
            match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
                Ok(r) => break r.expect_err("timed out"),
                Err(_) => s.flush().await.expect("flush"),
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(secs(started), 30);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_waits_as_long_as_the_writes_move() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut s = IdleStream::new(near, IDLE);
        let started = Instant::now();
        let (mut r, mut w) = tokio::io::split(&mut s);
        let writer = async {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                w.write_all(b"piece").await.expect("write");
            }
            far.write_all(b"done").await.expect("answer");
            // Keep the far end open while the reader gets the answer.
            far.read_exact(&mut [0u8; 50]).await.expect("pieces");
            far
        };
        let reader = async {
            let mut buf = [0u8; 4];
            r.read_exact(&mut buf).await.map(|_| buf)
        };
        let (got, _far) = tokio::join!(reader, writer);
        assert_eq!(&got.expect("the read was cut as idle"), b"done");
        assert_eq!(secs(started), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_is_excused_while_the_body_waits_for_the_client_or_the_connection_is_pooled() {
        let (near, _far) = tokio::io::duplex(1024);
        let quiet = Arc::new(Quiet::default());
        let mut s = IdleStream::with_quiet(near, IDLE, quiet.clone());
        let started = Instant::now();
        quiet.awaiting_body(true);
        let release = async {
            tokio::time::sleep(Duration::from_secs(100)).await;
            quiet.awaiting_body(false);
            tokio::time::sleep(Duration::from_secs(15)).await;
            quiet.pooled(true);
            tokio::time::sleep(Duration::from_secs(200)).await;
            quiet.pooled(false);
        };
        let mut buf = [0u8; 16];
        let (e, ()) = tokio::join!(s.read(&mut buf), release);
        assert_eq!(e.expect_err("timed out").kind(), io::ErrorKind::TimedOut);
        // Waived until 100 s, then the body's last move counts as movement: the check at 120 s
        // passes; pooled from 115 to 315 s; the check after that, at 330 s, ends it.
        assert_eq!(secs(started), 330);
    }
}
