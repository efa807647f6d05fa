//! The rebuild's progress, which the writer waits on when it has nowhere to put a record.
//!
//! While the rebuild runs, only the slab it has already read is free; a store that finds no
//! room there must not evict (what is not read yet is not free, and evicting would not make it
//! so) and must not be dropped either: on a new or emptied disk the rebuild frees the whole
//! slab within moments of starting. So the writer waits for the rebuild's next batch (or its
//! end) and tries again.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A count of the rebuild's batches, with a condition to wait for the next.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    batches: Mutex<u64>,
    moved: Condvar,
}

impl Progress {
    /// The rebuild handed the index another batch (or finished).
    pub(crate) fn advance(&self) {
        *self.batches.lock() += 1;
        self.moved.notify_all();
    }

    /// How many batches so far.
    pub(crate) fn now(&self) -> u64 {
        *self.batches.lock()
    }

    /// Waits until there have been more than `seen` batches, `timeout` at most.
    pub(crate) fn wait_past(&self, seen: u64, timeout: Duration) {
        let mut batches = self.batches.lock();
        if *batches <= seen {
            let _ = self.moved.wait_for(&mut batches, timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_waiter_wakes_when_the_rebuild_advances() {
        let progress = Arc::new(Progress::default());
        let seen = progress.now();
        let other = progress.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.advance();
        });
        let started = Instant::now();
        progress.wait_past(seen, Duration::from_secs(30));
        assert!(progress.now() > seen);
        assert!(started.elapsed() < Duration::from_secs(30));
        t.join().expect("joined");
    }

    #[test]
    fn a_waiter_past_the_count_does_not_wait() {
        let progress = Progress::default();
        progress.advance();
        progress.wait_past(0, Duration::from_secs(30));
        assert_eq!(progress.now(), 1);
    }
}
