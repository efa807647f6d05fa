//! Large disk objects kept open and mapped between hits, as nginx's `open_file_cache` keeps its
//! cache files open.
//!
//! A hit on a disk's large object otherwise opens its file, reads and checks its head, maps it
//! and unmaps it afterwards: about 8 µs of system calls on this kind of machine (`open`,
//! `pread`, `mmap`, `close`, `munmap`), a third of what the whole hit costs at 100 KiB. The
//! most recently hit ones stay open here, their heads decoded and their bodies mapped, so that
//! a hit on one is served like a memory hit. What they hold is page cache and address space,
//! not heap: the heads and one mapping each, bounded by count.
//!
//! Entries must never outlive the version they show: every change a disk reports for a key
//! drops its entry, and a reader that opened a file while the key changed does not keep it
//! (see `Tiers::begin_read`). Both happen under the tiers' lock.

use std::sync::Arc;

use meshcache_store::{MemoryStore, Replacement, StoreConfig, StoreKey, Weigh};

use super::object::Entry;

/// One open object: its entry, whose body is the mapped file.
struct Opened(Arc<Entry>);

impl Weigh for Opened {
    /// Counted by number: the bound is on open files and mappings, not bytes.
    fn weight(&self) -> u64 {
        1
    }
}

/// The open large objects; see the [module documentation](self).
pub(crate) struct OpenFiles {
    open: MemoryStore<Opened>,
}

impl OpenFiles {
    /// Keeps at most `capacity` objects open (0: none).
    pub(crate) fn new(capacity: u64) -> OpenFiles {
        OpenFiles {
            open: MemoryStore::new(StoreConfig {
                capacity,
                max_object_size: 1,
                replacement: Replacement::Lru,
            }),
        }
    }

    /// The open object under `key`, counted as a hit.
    pub(crate) fn get(&mut self, key: &StoreKey) -> Option<Arc<Entry>> {
        self.open.get(key).map(|o| o.0.clone())
    }

    /// Keeps `entry` open under `key`.
    pub(crate) fn keep(&mut self, key: StoreKey, entry: Arc<Entry>) {
        let _ = self.open.insert(key, Arc::new(Opened(entry)));
    }

    /// A disk's copy of `key` changed: what is open of it goes.
    pub(crate) fn changed(&mut self, key: &StoreKey) {
        self.open
            .invalidate(key, meshcache_store::InvalidateCause::Stale);
    }

    /// Objects open now.
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Arc<Entry> {
        Arc::new(Entry::Vary {
            names: Box::new([]),
            variants: Vec::new(),
        })
    }

    #[test]
    fn a_change_closes_what_is_open() {
        let mut open = OpenFiles::new(2);
        let k = StoreKey::get("http://a.test/");
        open.keep(k, entry());
        assert!(open.get(&k).is_some());
        open.changed(&k);
        assert!(open.get(&k).is_none());
    }

    #[test]
    fn the_least_recently_hit_is_closed_first() {
        let mut open = OpenFiles::new(2);
        let keys: Vec<StoreKey> = (0..3)
            .map(|i| StoreKey::get(&format!("http://a.test/{i}")))
            .collect();
        open.keep(keys[0], entry());
        open.keep(keys[1], entry());
        assert!(open.get(&keys[0]).is_some());
        open.keep(keys[2], entry());
        assert_eq!(open.len(), 2);
        assert!(open.get(&keys[1]).is_none());
    }
}
