//! The two tiers under one lock: the memory store and the disks' indexes, seen by everyone
//! else as one store.
//!
//! Each tier reports its own changes as store events. The cache publishes only the changes to
//! the *union*: an object counts as held while either tier holds it. So a tier's admission of a
//! key the other tier already holds is not news, nor is one tier dropping a key the other still
//! holds; the first admission and the last removal are. Cooperation protocols, which mirror the
//! store's key set from the events, see one set: what a peer may ask this node for.

use std::collections::HashMap;

use meshcache_disk::DiskIndex;
use meshcache_store::{MemoryStore, StoreEvent, StoreKey};

use super::doorkeeper::Doorkeeper;
use super::object::Entry;
use super::open::OpenFiles;

/// The memory store and the disks' indexes; see the [module documentation](self).
pub(crate) struct Tiers {
    pub(crate) memory: MemoryStore<Entry>,
    pub(crate) disks: Vec<DiskIndex>,
    /// Large disk objects kept open between hits.
    pub(crate) open: OpenFiles,
    /// Which small disk objects earn a copy in memory.
    pub(crate) doorkeeper: Doorkeeper,
    /// Keys being read from a disk now, and whether a disk's copy changed since the read began:
    /// what such a read returns is served, but neither copied into memory nor kept open.
    reads: HashMap<StoreKey, (u32, bool)>,
}

impl Tiers {
    /// The tiers, empty: a memory store, the disks' indexes and room for `open_files` open
    /// large objects.
    pub(crate) fn new(memory: MemoryStore<Entry>, disks: Vec<DiskIndex>, open_files: u64) -> Tiers {
        Tiers {
            memory,
            disks,
            open: OpenFiles::new(open_files),
            doorkeeper: Doorkeeper::new(),
            reads: HashMap::new(),
        }
    }

    /// A read of `key` from a disk begins.
    pub(crate) fn begin_read(&mut self, key: StoreKey) {
        self.reads.entry(key).or_insert((0, false)).0 += 1;
    }

    /// The read of `key` that [`Tiers::begin_read`] announced is over; whether no disk's copy
    /// of it changed meanwhile (what was read is still the indexed version).
    pub(crate) fn end_read(&mut self, key: &StoreKey) -> bool {
        let Some((readers, changed)) = self.reads.get_mut(key) else {
            return false;
        };
        let unchanged = !*changed;
        *readers -= 1;
        if *readers == 0 {
            self.reads.remove(key);
        }
        unchanged
    }

    /// A disk's copy of `key` changed.
    fn disk_changed(&mut self, key: &StoreKey) {
        self.open.changed(key);
        if let Some((_, changed)) = self.reads.get_mut(key) {
            *changed = true;
        }
    }

    /// Whether a disk holds `key`.
    pub(crate) fn on_disk(&self, key: &StoreKey) -> bool {
        self.disks.iter().any(|d| d.contains(key))
    }

    /// Whether either tier holds `key`.
    pub(crate) fn holds(&self, key: &StoreKey) -> bool {
        self.memory.contains(key) || self.on_disk(key)
    }

    /// The memory store's events that change the union (with the disks as they are now).
    pub(crate) fn memory_news(
        &self,
        events: impl IntoIterator<Item = StoreEvent>,
    ) -> Vec<StoreEvent> {
        events
            .into_iter()
            .filter(|e| !self.on_disk(&e.key()))
            .collect()
    }

    /// The changes disk `disk` recorded that change the union (with the memory store as it is
    /// now), taken from its index. What is open or being read of the keys that changed is
    /// forgotten.
    pub(crate) fn disk_news(&mut self, disk: usize) -> Vec<StoreEvent> {
        let changes = self.disks[disk].take_changes();
        for change in &changes {
            self.disk_changed(&change.key());
        }
        changes
            .into_iter()
            .filter(|e| {
                let key = e.key();
                !self.memory.contains(&key)
                    && !self
                        .disks
                        .iter()
                        .enumerate()
                        .any(|(i, d)| i != disk && d.contains(&key))
            })
            .collect()
    }

    /// Every disk's changes that change the union.
    pub(crate) fn all_disk_news(&mut self) -> Vec<StoreEvent> {
        (0..self.disks.len())
            .flat_map(|d| self.disk_news(d))
            .collect()
    }

    /// Every key held, once.
    pub(crate) fn keys(&self) -> Vec<StoreKey> {
        let mut keys: Vec<StoreKey> = self.memory.keys().copied().collect();
        for (i, disk) in self.disks.iter().enumerate() {
            keys.extend(disk.keys().filter(|k| {
                !self.memory.contains(k) && !self.disks[..i].iter().any(|d| d.contains(k))
            }));
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcache_disk::{DiskEntry, Gone, Location};
    use meshcache_store::{EvictCause, InvalidateCause, Replacement, StoreConfig};
    use std::sync::Arc;

    fn config() -> StoreConfig {
        StoreConfig {
            capacity: 1 << 20,
            max_object_size: 1 << 20,
            replacement: Replacement::Lru,
        }
    }

    fn tiers() -> Tiers {
        Tiers::new(
            MemoryStore::new(config()),
            vec![DiskIndex::new(config(), 1 << 12, false)],
            4,
        )
    }

    fn marker() -> Arc<Entry> {
        Arc::new(Entry::Vary {
            names: Box::new([]),
            variants: Vec::new(),
        })
    }

    fn on_disk(t: &mut Tiers, key: StoreKey, unit: u64) {
        t.disks[0].expect(key, unit);
        let entry =
            DiskEntry::new(key, Location::Slab { unit, len: 100 }, false, 0).expect("entry");
        t.disks[0].commit(entry, unit);
    }

    #[test]
    fn only_the_first_admission_and_the_last_removal_are_news() {
        let mut t = tiers();
        let k = StoreKey::get("http://a.test/");
        let events = t.memory.insert(k, marker()).expect("fits");
        assert_eq!(t.memory_news(events).len(), 1, "new to the union");
        on_disk(&mut t, k, 1);
        assert!(t.disk_news(0).is_empty(), "memory already holds it");
        let gone = t.memory.invalidate(&k, InvalidateCause::Explicit);
        assert!(t.memory_news(gone).is_empty(), "the disk still holds it");
        t.disks[0].remove(&k, Gone::Invalidated(InvalidateCause::Explicit));
        let news = t.disk_news(0);
        assert!(
            matches!(news[..], [StoreEvent::Invalidated { .. }]),
            "{news:?}"
        );
        assert!(!t.holds(&k));
    }

    #[test]
    fn a_read_that_raced_with_a_change_is_told_so() {
        let mut t = tiers();
        let k = StoreKey::get("http://a.test/");
        t.begin_read(k);
        on_disk(&mut t, k, 1);
        let _ = t.disk_news(0);
        assert!(!t.end_read(&k), "changed while it was read");
        t.begin_read(k);
        assert!(t.end_read(&k));
        assert!(!t.end_read(&k), "no read announced");
    }

    #[test]
    fn keys_are_listed_once() {
        let mut t = tiers();
        let (a, b) = (
            StoreKey::get("http://a.test/a"),
            StoreKey::get("http://a.test/b"),
        );
        t.memory.insert(a, marker()).expect("fits");
        on_disk(&mut t, a, 1);
        on_disk(&mut t, b, 2);
        let mut keys = t.keys();
        keys.sort();
        let mut want = vec![a, b];
        want.sort();
        assert_eq!(keys, want);
        let _ = t.all_disk_news();
        t.disks[0].remove(&b, Gone::Evicted(EvictCause::Capacity));
        assert_eq!(t.all_disk_news().len(), 1);
    }
}
