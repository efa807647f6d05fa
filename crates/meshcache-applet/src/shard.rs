//! Per-thread slots for what every run writes: counters, the ticker's count of runs, an
//! applet's instances kept ready.
//!
//! A word that two cores both write moves between their caches at each write, and a `null`
//! run wrote about ten of them (counters, the ticker's count, the ready list's lock). On two
//! cores running the same applet that made each run take 540 ns instead of 340
//! (`cargo bench -p meshcache-applet -- "on every core"`). Each thread now writes its own slot,
//! which starts a cache line and shares none with another slot; readers, which are rare
//! (`/stats`, the ticker every tick), add the slots up.
//!
//! Threads get slots in the order they first ask, wrapping after [`SHARDS`]: a proxy's worker
//! threads (one per core) each get their own up to that many cores; beyond it, threads share
//! slots, which stays correct and only costs what sharing costs.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Slots per sharded value.
pub(crate) const SHARDS: usize = 8;

/// A value on cache lines of its own (aligned to 128 bytes: some cores fetch lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The slot of the calling thread.
pub(crate) fn mine() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<Option<usize>> = const { Cell::new(None) };
    }
    SLOT.with(|slot| match slot.get() {
        Some(s) => s,
        None => {
            let s = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            slot.set(Some(s));
            s
        }
    })
}

/// One slot per thread group, each on lines of its own.
#[derive(Debug)]
pub(crate) struct Sharded<T>([Padded<T>; SHARDS]);

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Sharded(std::array::from_fn(|_| Padded::default()))
    }
}

impl<T> Sharded<T> {
    /// Slot `i` (any index: taken modulo [`SHARDS`]).
    pub fn at(&self, i: usize) -> &T {
        &self.0[i % SHARDS]
    }

    /// The calling thread's slot.
    pub fn mine(&self) -> &T {
        self.at(mine())
    }

    /// Every slot, from slot `first` on (wrapping): where to look for something any slot may
    /// hold, one's own first.
    pub fn from(&self, first: usize) -> impl Iterator<Item = &T> {
        (0..SHARDS).map(move |k| self.at(first + k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_lines_of_their_own() {
        let s: Sharded<std::sync::atomic::AtomicU64> = Sharded::default();
        let a = s.at(0) as *const _ as usize;
        let b = s.at(1) as *const _ as usize;
        assert_eq!(b - a, 128);
        assert_eq!(a % 128, 0);
        assert!(std::ptr::eq(s.at(SHARDS + 1), s.at(1)));
    }

    #[test]
    fn a_thread_keeps_its_slot() {
        assert_eq!(mine(), mine());
        let other = std::thread::spawn(mine).join().expect("thread");
        assert!(other < SHARDS);
    }
}
