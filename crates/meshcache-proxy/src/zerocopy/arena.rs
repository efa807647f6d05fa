//! The memory store's shared memory for large bodies: one memfd, mapped once, read-only.
//!
//! Bodies of at least [`MIN_SIZE`] bytes are copied into it when they are stored, and its
//! mapping is registered (see [`regions`](super::regions)), so hits of them go out with
//! sendfile(2) from the memfd.
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
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use offset_allocator::{Allocation, Allocator};
use parking_lot::Mutex;
use serde::Serialize;

use super::regions::{self, Registration, SendCounters};
use super::{MIN_SIZE, PAGE};

/// The arena's virtual size for a store budget: twice the budget (evicted bodies still being
/// sent hold their extents; fragmentation), at least 64 MiB, at most what `u32` page numbers
/// address. Virtual only: pages exist while a body occupies them.
fn arena_bytes(budget: u64) -> u64 {
    budget
        .saturating_mul(2)
        .clamp(64 << 20, u64::from(u32::MAX - 1) * PAGE)
        .next_multiple_of(PAGE)
}

/// Shared memory holding large cached bodies; see the [module documentation](self).
pub struct BodyArena {
    file: Arc<File>,
    map: MmapRaw,
    alloc: Mutex<Allocator>,
    counters: Counters,
    sent: Arc<SendCounters>,
    _registration: Registration,
}

#[derive(Default)]
struct Counters {
    placed: AtomicU64,
    fallbacks: AtomicU64,
    held_extents: AtomicU64,
    held_bytes: AtomicU64,
    leaked: AtomicU64,
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
        let file = Arc::new(File::from(fd));
        file.set_len(size)?;
        let len = usize::try_from(size).map_err(|_| io::Error::other("arena too large"))?;
        let map = MmapOptions::new().len(len).map_raw_read_only(&*file)?;
        let pages = u32::try_from(size / PAGE).map_err(|_| io::Error::other("arena too large"))?;
        // The allocator's node table is allocated up front (about 32 bytes a node): one node per
        // extent and per free region between them. The store holds at most `budget / MIN_SIZE`
        // bodies, plus evicted ones still being sent; when the nodes run out, bodies stay on the
        // heap.
        let max_allocs = (budget / MIN_SIZE as u64)
            .saturating_mul(2)
            .saturating_add(1024)
            .min(u64::from(u32::MAX - 3)) as u32;
        let sent = Arc::new(SendCounters::default());
        let registration =
            regions::register(map.as_ptr(), len, file.clone(), 0, sent.clone(), true);
        Ok(Arc::new(BodyArena {
            file,
            map,
            alloc: Mutex::new(Allocator::with_max_allocs(pages, max_allocs)),
            counters: Counters::default(),
            sent,
            _registration: registration,
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
            sent_bytes: self.sent.bytes.load(Relaxed),
            sends: self.sent.sends.load(Relaxed),
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
            &*arena.file,
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
}
