//! A client connection's socket that sends spans of registered mappings with sendfile(2).

use std::fs::File;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::regions::{self, SendCounters};
use crate::interim::Interim;

/// A client connection's socket that sends spans of registered mappings with sendfile(2);
/// everything else is passed to the [`TcpStream`] unchanged, after the interim responses and
/// the status-line version its [`Interim`] has for it. See the
/// [module documentation](super).
#[derive(Debug)]
pub struct ZeroCopyStream {
    stream: TcpStream,
    interim: Arc<Interim>,
}

impl ZeroCopyStream {
    /// Bytes written to the socket that the client has not acknowledged yet (`SIOCOUTQ`), or
    /// `None` where that cannot be read. A write can wait for room long after the client began
    /// reading again (the kernel wakes a writer only once much of a full buffer has drained);
    /// this is how the idle timeout tells such a client from one that stopped reading.
    pub fn unsent(&self) -> Option<u32> {
        unsent(&self.stream)
    }

    /// Wraps `stream`, whose interim responses and status-line version `interim` keeps.
    pub(crate) fn new(stream: TcpStream, interim: Arc<Interim>) -> Self {
        ZeroCopyStream { stream, interim }
    }

    /// Sends `head` (buffers outside any mapping) with `MSG_MORE`, then `span` bytes of `file`
    /// from `offset`, as far as the socket takes them now.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        (file, offset, counters): (Arc<File>, u64, Arc<SendCounters>),
        head: &[IoSlice<'_>],
        span: usize,
    ) -> Poll<io::Result<usize>> {
        let head_len: usize = head.iter().map(|b| b.len()).sum();
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            let sent = self.stream.try_io(Interest::WRITABLE, || {
                let mut sent = 0;
                if head_len > 0 {
                    sent = rustix::net::sendmsg(
                        &self.stream,
                        head,
                        &mut rustix::net::SendAncillaryBuffer::default(),
                        rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL,
                    )?;
                    if sent < head_len {
                        return Ok(sent);
                    }
                }
                let mut at = offset;
                match rustix::fs::sendfile(&self.stream, &*file, Some(&mut at), span) {
                    Ok(0) if sent == 0 => Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        counters.bytes.fetch_add(n as u64, Relaxed);
                        counters.sends.fetch_add(1, Relaxed);
                        Ok(sent + n)
                    }
                    // The head went: report it; the error (or the full buffer) recurs next call.
                    Err(_) if sent > 0 => Ok(sent),
                    Err(e) => Err(e.into()),
                }
            });
            match sent {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for ZeroCopyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ZeroCopyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(n) = ready!(this.interim.poll_before_write(&mut this.stream, cx, buf))? {
            return Poll::Ready(Ok(n));
        }
        if let Some(source) = regions::locate(buf) {
            return this.poll_send(cx, source, &[], buf.len());
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let head = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if let Some(n) = ready!(this.interim.poll_before_write(&mut this.stream, cx, head))? {
            return Poll::Ready(Ok(n));
        }
        let first = bufs
            .iter()
            .enumerate()
            .find_map(|(i, b)| regions::locate(b).map(|source| (i, source)));
        if let Some((i, source)) = first {
            return this.poll_send(cx, source, &bufs[..i], bufs[i].len());
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.interim.poll_before_flush(&mut this.stream, cx))?;
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        this.interim.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Drop for ZeroCopyStream {
    fn drop(&mut self) {
        // Before the socket closes: nothing is relayed to it after this.
        self.interim.closed();
    }
}

/// See [`ZeroCopyStream::unsent`]. `SIOCOUTQ` is 0x5411 (as `TIOCOUTQ`) on these
/// architectures; elsewhere the queue is not read.
#[allow(unsafe_code)]
pub(crate) fn unsent(stream: &TcpStream) -> Option<u32> {
    let known = cfg!(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "x86",
            target_arch = "aarch64",
            target_arch = "arm",
            target_arch = "riscv64"
        )
    ));
    if !known {
        return None;
    }
    const SIOCOUTQ: rustix::ioctl::Opcode = 0x5411;
    // SAFETY: for a TCP socket, SIOCOUTQ writes one `int`: the bytes in its send queue not yet
    // acknowledged. The getter gives the kernel room for exactly that.
    let getter = unsafe { rustix::ioctl::Getter::<SIOCOUTQ, std::ffi::c_int>::new() };
    // SAFETY: the descriptor is a live TCP socket and the request matches the getter's type.
    let n = unsafe { rustix::ioctl::ioctl(stream, getter) }.ok()?;
    u32::try_from(n).ok()
}
