//! Cache hits without the copy: large bodies live in shared memory and go to clients with
//! sendfile(2).
//!
//! A hit's body normally reaches the socket through write(2), which copies it from our memory
//! into the kernel's socket buffers; at 100 KiB that copy was over a quarter of the proxy's CPU
//! per hit (`perf`, `scripts/bench-hits.sh --perf`). nginx avoids it by serving its cache files
//! with sendfile(2). We do the same without files:
//!
//! * [`BodyArena`]: bodies of at least [`MIN_SIZE`] bytes are copied, when they are stored, into
//!   one memfd (anonymous shared memory) that is mapped once, read-only. The rest of the proxy
//!   still sees each body as ordinary [`Bytes`]: applets, ranges and revalidation read it as
//!   before.
//! * [`ZeroCopyStream`], under hyper on client connections: when a write's buffer lies inside
//!   the arena's mapping, that span goes out with sendfile(2) from the memfd, so the socket takes
//!   references to the pages instead of a copy (the response head before it is sent with
//!   `MSG_MORE`, so head and body still share packets).
//!
//! **Pages in flight.** A socket keeps references to the pages it was given until the peer has
//! read them, possibly after the body's last [`Bytes`] is gone. So an extent is never written
//! while it is held, and freeing it punches a hole in the file (`fallocate(PUNCH_HOLE)`), which
//! detaches its pages: pages a socket still references keep their content, and an object later
//! stored at that offset gets fresh pages. If the hole cannot be punched the extent is never
//! reused (counted in `leaked`). `tests/zerocopy.rs` checks that a slow client still receives
//! the original bytes after the object was replaced and its extent reused.
//!
//! Where the arena cannot be created (no memfd), or is full or too fragmented for a body, the
//! body stays on the heap and is written as before (counted in `fallbacks`).

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use offset_allocator::{Allocation, Allocator};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Bodies at least this long are kept in the arena. Below it, the copy costs less than
/// sendfile's per-page bookkeeping and a page's rounding would waste a larger share.
pub const MIN_SIZE: usize = 32 * 1024;

/// The arena's page (the unit of allocation and of hole punching).
const PAGE: u64 = 4096;

/// The arena's virtual size for a store budget: twice the budget (evicted bodies still being
/// sent hold their extents; fragmentation), at least 64 MiB, at most what `u32` page numbers
/// address. Virtual only: pages exist while a body occupies them.
fn arena_bytes(budget: u64) -> u64 {
    budget
        .saturating_mul(2)
        .clamp(64 << 20, u64::from(u32::MAX - 1) * PAGE)
        .next_multiple_of(PAGE)
}

/// What a body of `len` bytes costs the store's byte budget: its length, rounded up to whole
/// pages when it is large enough to live in the arena (heap allocations that large are whole
/// pages too).
pub fn charged(len: usize) -> u64 {
    let len = len as u64;
    if len >= MIN_SIZE as u64 {
        len.next_multiple_of(PAGE)
    } else {
        len
    }
}

/// Shared memory holding large cached bodies; see the [module documentation](self).
pub struct BodyArena {
    file: File,
    map: MmapRaw,
    alloc: Mutex<Allocator>,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    placed: AtomicU64,
    fallbacks: AtomicU64,
    held_extents: AtomicU64,
    held_bytes: AtomicU64,
    leaked: AtomicU64,
    sent_bytes: AtomicU64,
    sends: AtomicU64,
}

/// The arena's counters, for `/stats` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArenaStats {
    /// Virtual size of the arena in bytes.
    pub size: u64,
    /// Bodies copied into the arena since start.
    pub placed: u64,
    /// Bodies large enough that stayed on the heap (arena full or fragmented).
    pub fallbacks: u64,
    /// Extents in use now (stored bodies, and evicted ones still being sent).
    pub held_extents: u64,
    /// Bytes in those extents, in whole pages.
    pub held_bytes: u64,
    /// Extents never reused because their pages could not be released.
    pub leaked: u64,
    /// Bytes sent to clients with sendfile(2).
    pub sent_bytes: u64,
    /// sendfile(2) calls that sent something.
    pub sends: u64,
}

impl std::fmt::Debug for BodyArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyArena")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl BodyArena {
    /// An arena sized for a store whose byte budget is `budget`.
    pub fn new(budget: u64) -> io::Result<Arc<BodyArena>> {
        let size = arena_bytes(budget);
        let fd = rustix::fs::memfd_create("meshcache-bodies", rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(size)?;
        let len = usize::try_from(size).map_err(|_| io::Error::other("arena too large"))?;
        let map = MmapOptions::new().len(len).map_raw_read_only(&file)?;
        let pages = u32::try_from(size / PAGE).map_err(|_| io::Error::other("arena too large"))?;
        // The allocator's node table is allocated up front (about 32 bytes a node): one node per
        // extent and per free region between them. The store holds at most `budget / MIN_SIZE`
        // bodies, plus evicted ones still being sent; when the nodes run out, bodies stay on the
        // heap.
        let max_allocs = (budget / MIN_SIZE as u64)
            .saturating_mul(2)
            .saturating_add(1024)
            .min(u64::from(u32::MAX - 3)) as u32;
        Ok(Arc::new(BodyArena {
            file,
            map,
            alloc: Mutex::new(Allocator::with_max_allocs(pages, max_allocs)),
            counters: Counters::default(),
        }))
    }

    /// A copy of `body` in the arena, or `None` when it is too short to belong there, the arena
    /// has no room, or the copy failed (the caller keeps `body`).
    pub fn place(self: &Arc<Self>, body: &[u8]) -> Option<Bytes> {
        if body.len() < MIN_SIZE || self.holds(body) {
            return None;
        }
        let pages = u32::try_from((body.len() as u64).div_ceil(PAGE)).ok();
        let Some(allocation) = pages.and_then(|p| self.alloc.lock().allocate(p)) else {
            self.counters.fallbacks.fetch_add(1, Relaxed);
            return None;
        };
        let extent = Extent {
            arena: self.clone(),
            allocation,
            offset: u64::from(allocation.offset) * PAGE,
            len: body.len(),
        };
        self.counters.held_extents.fetch_add(1, Relaxed);
        self.counters
            .held_bytes
            .fetch_add(extent.pages_len(), Relaxed);
        if let Err(e) = self.file.write_all_at(body, extent.offset) {
            tracing::warn!(error = %e, "could not copy a body into the arena; it stays on the heap");
            self.counters.fallbacks.fetch_add(1, Relaxed);
            return None;
        }
        self.counters.placed.fetch_add(1, Relaxed);
        Some(Bytes::from_owner(extent))
    }

    /// Whether `buf` lies in the arena (a body placed here, or part of one).
    pub fn holds(&self, buf: &[u8]) -> bool {
        self.file_offset(buf).is_some()
    }

    /// The file offset of `buf` when it lies in the arena.
    fn file_offset(&self, buf: &[u8]) -> Option<u64> {
        let base = self.map.as_ptr() as usize;
        let start = buf.as_ptr() as usize;
        let inside = !buf.is_empty()
            && start >= base
            && start
                .checked_add(buf.len())
                .is_some_and(|end| end <= base + self.map.len());
        inside.then(|| (start - base) as u64)
    }

    /// The arena's counters.
    pub fn stats(&self) -> ArenaStats {
        let c = &self.counters;
        ArenaStats {
            size: self.map.len() as u64,
            placed: c.placed.load(Relaxed),
            fallbacks: c.fallbacks.load(Relaxed),
            held_extents: c.held_extents.load(Relaxed),
            held_bytes: c.held_bytes.load(Relaxed),
            leaked: c.leaked.load(Relaxed),
            sent_bytes: c.sent_bytes.load(Relaxed),
            sends: c.sends.load(Relaxed),
        }
    }

    /// Bytes of memory the arena's file holds now (pages written and not yet released), from
    /// the file's allocated blocks.
    pub fn resident_bytes(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks() * 512)
    }
}

/// One body's pages in the arena; freed when the body's last [`Bytes`] is dropped.
struct Extent {
    arena: Arc<BodyArena>,
    allocation: Allocation,
    /// Byte offset in the file (and the mapping), page-aligned.
    offset: u64,
    len: usize,
}

impl Extent {
    fn pages_len(&self) -> u64 {
        (self.len as u64).next_multiple_of(PAGE)
    }
}

impl AsRef<[u8]> for Extent {
    #[allow(unsafe_code)]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `offset + len` lies within the mapping (the allocator hands out page ranges of
        // the file, which is exactly as long as the mapping), and the mapping lives as long as
        // the arena, which this extent keeps alive. The bytes were written before the extent
        // became a `Bytes` and nothing writes them again while it exists: the arena writes
        // only into extents it has just allocated, the memfd is private to this process, and
        // the mapping is read-only.
        unsafe {
            std::slice::from_raw_parts(self.arena.map.as_ptr().add(self.offset as usize), self.len)
        }
    }
}

impl Drop for Extent {
    fn drop(&mut self) {
        let arena = &self.arena;
        let pages = self.pages_len();
        arena.counters.held_extents.fetch_sub(1, Relaxed);
        arena.counters.held_bytes.fetch_sub(pages, Relaxed);
        let punched = rustix::fs::fallocate(
            &arena.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            self.offset,
            pages,
        );
        match punched {
            Ok(()) => arena.alloc.lock().free(self.allocation),
            Err(e) => {
                // Reusing the range could change bytes a socket has yet to send: keep it.
                arena.counters.leaked.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "could not release a body's pages; its range is not reused");
            }
        }
    }
}

/// A client connection's socket that sends arena spans with sendfile(2); everything else is
/// passed to the [`TcpStream`] unchanged. See the [module documentation](self).
#[derive(Debug)]
pub struct ZeroCopyStream {
    stream: TcpStream,
    arena: Option<Arc<BodyArena>>,
}

impl ZeroCopyStream {
    /// Bytes written to the socket that the client has not acknowledged yet (`SIOCOUTQ`), or
    /// `None` where that cannot be read. A write can wait for room long after the client began
    /// reading again (the kernel wakes a writer only once much of a full buffer has drained);
    /// this is how the idle timeout tells such a client from one that stopped reading.
    pub fn unsent(&self) -> Option<u32> {
        unsent(&self.stream)
    }

    /// Wraps `stream`; without an arena it is a plain pass-through.
    pub fn new(stream: TcpStream, arena: Option<Arc<BodyArena>>) -> Self {
        ZeroCopyStream { stream, arena }
    }

    /// Sends `head` (buffers outside the arena) with `MSG_MORE`, then `span` of the arena
    /// starting at file offset `offset`, as far as the socket takes them now.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        arena: &BodyArena,
        head: &[IoSlice<'_>],
        offset: u64,
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
                match rustix::fs::sendfile(&self.stream, &arena.file, Some(&mut at), span) {
                    Ok(0) if sent == 0 => Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        arena.counters.sent_bytes.fetch_add(n as u64, Relaxed);
                        arena.counters.sends.fetch_add(1, Relaxed);
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
        if let Some(arena) = &this.arena {
            if let Some(offset) = arena.file_offset(buf) {
                return this.poll_send(cx, arena, &[], offset, buf.len());
            }
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(arena) = &this.arena {
            let first = bufs
                .iter()
                .enumerate()
                .find_map(|(i, b)| arena.file_offset(b).map(|offset| (i, offset)));
            if let Some((i, offset)) = first {
                return this.poll_send(cx, arena, &bufs[..i], offset, bufs[i].len());
            }
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn small_bodies_stay_out() {
        let arena = BodyArena::new(1 << 20).expect("arena");
        assert!(arena.place(&pattern(MIN_SIZE - 1, 1)).is_none());
        assert_eq!(arena.stats().fallbacks, 0);
    }

    #[test]
    fn placed_bodies_read_back_and_release_their_pages() {
        let arena = BodyArena::new(1 << 20).expect("arena");
        let a = pattern(100_000, 1);
        let placed = arena.place(&a).expect("room");
        assert_eq!(&placed[..], &a[..]);
        assert!(arena.holds(&placed[10..20]));
        assert!(!arena.holds(&a));
        assert!(arena.place(&placed).is_none(), "already in the arena");
        let s = arena.stats();
        assert_eq!((s.placed, s.held_extents, s.held_bytes), (1, 1, 102_400));
        assert!(arena.resident_bytes().expect("fstat") >= 100_000);
        let slice = placed.slice(4096..8192);
        drop(placed);
        assert_eq!(arena.stats().held_extents, 1, "a slice keeps the extent");
        assert_eq!(&slice[..], &a[4096..8192]);
        drop(slice);
        let s = arena.stats();
        assert_eq!((s.held_extents, s.held_bytes, s.leaked), (0, 0, 0));
        assert_eq!(arena.resident_bytes().expect("fstat"), 0, "hole punched");
    }

    #[test]
    fn a_full_arena_falls_back_and_freed_room_is_reused() {
        // The smallest arena is 64 MiB: 8 bodies of 8 MiB fill it.
        let arena = BodyArena::new(0).expect("arena");
        let body = pattern(8 << 20, 7);
        let held: Vec<Bytes> = (0..8).map(|_| arena.place(&body).expect("room")).collect();
        assert!(arena.place(&body).is_none());
        assert_eq!(arena.stats().fallbacks, 1);
        let other = pattern(8 << 20, 9);
        drop(held);
        let again = arena.place(&other).expect("room again");
        assert_eq!(&again[..], &other[..], "fresh pages, new content");
    }

    #[test]
    fn charged_rounds_arena_sized_bodies_to_pages() {
        assert_eq!(charged(1000), 1000);
        assert_eq!(charged(MIN_SIZE), MIN_SIZE as u64);
        assert_eq!(charged(MIN_SIZE + 1), MIN_SIZE as u64 + PAGE);
        assert_eq!(charged(102_400), 102_400);
    }
}
