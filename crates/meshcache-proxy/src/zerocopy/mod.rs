//! Cache hits without the copy: bodies that live in mapped files go to clients with sendfile(2).
//!
//! A hit's body normally reaches the socket through write(2), which copies it from our memory
//! into the kernel's socket buffers; at 100 KiB that copy was over a quarter of the proxy's CPU
//! per hit (`perf`, `scripts/bench-hits.sh --perf`). nginx avoids it by serving its cache files
//! with sendfile(2). We do the same:
//!
//! * Large bodies are kept in files mapped read-only: the memory store's [`BodyArena`] (one
//!   memfd, anonymous shared memory) and a disk's files of large objects ([`mapped::map`]). The
//!   rest of the proxy sees each body as ordinary [`Bytes`](bytes::Bytes): applets, ranges and
//!   revalidation use it as before.
//! * Each mapping is entered in one registry of [`regions`] while it exists: its addresses, its
//!   file and that file's offset.
//! * [`ZeroCopyStream`], under hyper on client connections: when a write's buffer lies inside a
//!   registered mapping, that span goes out with sendfile(2) from the file, so the socket takes
//!   references to the file's pages instead of a copy (the response head before it is sent with
//!   `MSG_MORE`, so head and body still share packets).
//!
//! **Pages in flight.** A socket keeps references to the pages it was given until the peer has
//! read them, possibly after the body's last `Bytes` is gone, so a file's bytes must never change
//! under it. The arena punches a hole before reusing a range (see `arena.rs`); a disk's files
//! are never written once in place (a new version is a new file renamed over the old one, whose
//! pages live on for whoever still holds them).

mod arena;
pub mod mapped;
pub mod regions;
mod stream;

pub use arena::{ArenaStats, BodyArena};
pub(crate) use stream::unsent;
pub use stream::ZeroCopyStream;

/// Bodies at least this long are kept in the arena (and a disk gives them a file of their own).
/// Below it, the copy costs less than sendfile's per-page bookkeeping and a page's rounding
/// would waste a larger share.
pub const MIN_SIZE: usize = 32 * 1024;

/// The arena's page (the unit of allocation and of hole punching).
const PAGE: u64 = 4096;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charged_rounds_arena_sized_bodies_to_pages() {
        assert_eq!(charged(1000), 1000);
        assert_eq!(charged(MIN_SIZE), MIN_SIZE as u64);
        assert_eq!(charged(MIN_SIZE + 1), MIN_SIZE as u64 + PAGE);
        assert_eq!(charged(102_400), 102_400);
        assert_eq!(
            MIN_SIZE as u64,
            meshcache_disk::LARGE_BODY,
            "a disk gives a file of its own to exactly the bodies the arena takes"
        );
    }
}
