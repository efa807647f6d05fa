//! A disk's index: which objects it holds, where, within what budget, and what to do next.
//!
//! The index is a plain data structure; the cache that owns the disk keeps it under the same
//! lock as its memory store, so that a key's membership in the whole store (memory or disk) is
//! decided in one place. Every change is recorded as a [`StoreEvent`], as the memory store
//! reports its own, for the owner to drain after each locked section
//! ([`DiskIndex::take_changes`]) and publish; every record that
//! left the index is queued for the writer to remove from the disk ([`DiskIndex::take_garbage`]).
//!
//! Writes are matched to the index by serial: the owner announces a write
//! ([`DiskIndex::expect`]) when it queues it, and the writer's [`DiskIndex::commit`] admits the
//! record only if it is still the newest one announced for its key. An invalidation or a newer
//! version in between makes the older write garbage as soon as it lands.

use std::collections::{HashMap, HashSet};

use meshcache_store::{Catalog, EvictCause, InvalidateCause, StoreConfig, StoreEvent, StoreKey};

use crate::entry::{DiskEntry, Location};
use crate::space::{Space, UNIT};

/// Why an object left a disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gone {
    /// The store dropped it: the replacement policy made room, a newer version came, its
    /// record was found damaged, or the disk went away.
    Evicted(EvictCause),
    /// The cache invalidated it.
    Invalidated(InvalidateCause),
}

impl Gone {
    fn event(self, key: StoreKey, size: u64) -> StoreEvent {
        match self {
            Gone::Evicted(cause) => StoreEvent::Evicted { key, size, cause },
            Gone::Invalidated(cause) => StoreEvent::Invalidated { key, size, cause },
        }
    }
}

/// A record to take off the disk: its key (for a file's name) and where it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Garbage {
    /// The record's key.
    pub key: StoreKey,
    /// Where it lies.
    pub location: Location,
}

/// What became of a record the rebuild found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Indexed.
    Indexed,
    /// Garbage: this run wrote, removed or invalidated its key, so it is outdated.
    Superseded,
    /// The rebuild found another record of the key before (a crash between writing a new
    /// version and killing the old one): the caller reads that one's serial and calls
    /// [`DiskIndex::settle`]. Nothing was changed yet.
    Twin(DiskEntry),
}

/// A disk's index; see the module's documentation.
#[derive(Debug)]
pub struct DiskIndex {
    catalog: Catalog<DiskEntry>,
    space: Space,
    /// The newest write announced per key and not yet landed.
    pending: HashMap<StoreKey, u64>,
    /// While the rebuild runs: keys written, removed or invalidated by this run, which the
    /// rebuild must not bring back from older records.
    touched: Option<HashSet<StoreKey>>,
    changes: Vec<StoreEvent>,
    garbage: Vec<Garbage>,
}

impl DiskIndex {
    /// An index of `budget` bytes for a slab of `slab_units` units. With `rebuilding`, the
    /// slab's space is all taken until the rebuild frees what it finds unused, and keys this run
    /// touches are remembered so that the rebuild does not bring older records back.
    pub fn new(config: StoreConfig, slab_units: u64, rebuilding: bool) -> DiskIndex {
        DiskIndex {
            catalog: Catalog::new(config),
            space: Space::new(slab_units, !rebuilding),
            pending: HashMap::new(),
            touched: rebuilding.then(HashSet::new),
            changes: Vec::new(),
            garbage: Vec::new(),
        }
    }

    fn touch_key(&mut self, key: StoreKey) {
        if let Some(t) = &mut self.touched {
            t.insert(key);
        }
    }

    /// The entry for `key`, counted as a hit.
    pub fn get(&mut self, key: &StoreKey) -> Option<DiskEntry> {
        self.catalog.get(key).copied()
    }

    /// The entry for `key`, not counted as a hit.
    pub fn peek(&self, key: &StoreKey) -> Option<DiskEntry> {
        self.catalog.peek(key).copied()
    }

    /// Whether the disk holds `key`.
    pub fn contains(&self, key: &StoreKey) -> bool {
        self.catalog.contains(key)
    }

    /// Objects indexed.
    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Bytes charged to the budget.
    pub fn bytes(&self) -> u64 {
        self.catalog.bytes()
    }

    /// The budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.catalog.capacity()
    }

    /// The largest charge an object may have.
    pub fn admission_limit(&self) -> u64 {
        self.catalog.admission_limit()
    }

    /// Every key held; order unspecified.
    pub fn keys(&self) -> impl Iterator<Item = StoreKey> + '_ {
        self.catalog.records().map(DiskEntry::key)
    }

    /// The slab's free-space map.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// A write of `key` numbered `serial` is queued: it supersedes any earlier one.
    pub fn expect(&mut self, key: StoreKey, serial: u64) {
        self.pending.insert(key, serial);
        self.touch_key(key);
    }

    /// The write of `key` numbered `serial` was dropped (queue full, disk faulty).
    pub fn abandon(&mut self, key: &StoreKey, serial: u64) {
        if self.pending.get(key) == Some(&serial) {
            self.pending.remove(key);
        }
    }

    /// Writes announced and not yet landed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes `units` free units of the slab, page-aligned or not; `None` when the slab has no
    /// such run. Nothing is evicted here: the writer asks [`DiskIndex::evict_one`] for room and
    /// frees the victim's record before it tries again.
    pub fn allocate(&mut self, units: u64) -> Option<u64> {
        self.space.allocate(units)
    }

    /// Gives units back to the slab's free space (their record was killed first).
    pub fn release(&mut self, unit: u64, units: u64) {
        self.space.release(unit, units);
    }

    /// Evicts the policy's next victim to make room in the slab, and queues its record as
    /// garbage; `false` when nothing is left to evict.
    pub fn evict_one(&mut self) -> bool {
        let Some(victim) = self.catalog.evict() else {
            return false;
        };
        self.drop_entry(victim, Gone::Evicted(EvictCause::Capacity));
        true
    }

    fn drop_entry(&mut self, entry: DiskEntry, why: Gone) {
        let key = entry.key();
        self.changes.push(why.event(key, entry.location().charge()));
        self.garbage.push(Garbage {
            key,
            location: entry.location(),
        });
    }

    /// A written record landed. It is indexed (evicting for the budget as needed) if `serial`
    /// is still the newest write announced for its key; otherwise, or if it cannot be indexed,
    /// it is queued as garbage at once. Returns whether it was indexed.
    pub fn commit(&mut self, entry: DiskEntry, serial: u64) -> bool {
        let key = entry.key();
        if self.pending.get(&key) != Some(&serial) {
            self.garbage.push(Garbage {
                key,
                location: entry.location(),
            });
            return false;
        }
        self.pending.remove(&key);
        self.admit(entry)
    }

    /// Indexes `entry`, evicting for the budget; garbage if it exceeds the admission limit.
    fn admit(&mut self, entry: DiskEntry) -> bool {
        let key = entry.key();
        let size = entry.location().charge();
        let mut removed = Vec::new();
        let admitted = self
            .catalog
            .insert(entry, |old, cause| removed.push((old, cause)))
            .is_ok();
        for (old, cause) in removed {
            self.drop_entry(old, Gone::Evicted(cause));
        }
        if admitted {
            self.changes.push(StoreEvent::Admitted { key, size });
        } else {
            self.garbage.push(Garbage {
                key,
                location: entry.location(),
            });
        }
        admitted
    }

    /// Removes `key` (an invalidation, a newer version kept elsewhere, a damaged record) and
    /// queues its record as garbage. Returns the entry it had.
    pub fn remove(&mut self, key: &StoreKey, why: Gone) -> Option<DiskEntry> {
        self.touch_key(*key);
        // A write still queued for the key is outdated too.
        self.pending.remove(key);
        let entry = self.catalog.remove(key)?;
        self.drop_entry(entry, why);
        Some(entry)
    }

    /// Removes `key` only if it is still at `location` (a damaged record found by a reader that
    /// may have raced with a newer version).
    pub fn remove_if_at(&mut self, key: &StoreKey, location: Location, why: Gone) -> bool {
        if self.peek(key).is_some_and(|e| e.location() == location) {
            self.remove(key, why);
            true
        } else {
            false
        }
    }

    /// The rebuild found a valid record of `entry`'s key. Slab records' units are marked used
    /// whether or not the record is indexed (one not indexed is garbage, freed by the writer).
    pub fn found(&mut self, entry: DiskEntry) -> Found {
        let key = entry.key();
        if let Location::Slab { unit, len } = entry.location() {
            self.space.occupy(unit, u64::from(len).div_ceil(UNIT));
        }
        if self.touched.as_ref().is_some_and(|t| t.contains(&key)) {
            self.garbage.push(Garbage {
                key,
                location: entry.location(),
            });
            return Found::Superseded;
        }
        if let Some(twin) = self.peek(&key) {
            // Rare (a crash window): the caller compares serials, without this lock held.
            return Found::Twin(twin);
        }
        if self.admit(entry) {
            Found::Indexed
        } else {
            Found::Superseded
        }
    }

    /// Settles a `Found::Twin`: `newer` is the one of the two records of the key with the
    /// larger serial. If `older` is still the one indexed, the newer replaces it; the record
    /// not indexed becomes garbage.
    pub fn settle(&mut self, found: DiskEntry, indexed: DiskEntry, found_is_newer: bool) {
        let key = found.key();
        let still = self.peek(&key) == Some(indexed);
        if still && found_is_newer {
            self.admit(found);
        } else {
            self.garbage.push(Garbage {
                key,
                location: found.location(),
            });
        }
    }

    /// The rebuild read `unit..unit + units` of the slab and found no live record there.
    pub fn found_free(&mut self, unit: u64, units: u64) {
        self.space.release(unit, units);
    }

    /// The rebuild is over: forget what it needed.
    pub fn rebuilt(&mut self) {
        self.touched = None;
    }

    /// Whether the rebuild is still running.
    pub fn rebuilding(&self) -> bool {
        self.touched.is_some()
    }

    /// Drops everything (the disk went away): every object is reported removed; nothing is
    /// queued as garbage (there is no disk to clean).
    pub fn clear(&mut self) {
        while let Some(entry) = self.catalog.evict() {
            self.changes.push(StoreEvent::Evicted {
                key: entry.key(),
                size: entry.location().charge(),
                cause: EvictCause::Lost,
            });
        }
        self.pending.clear();
        self.garbage.clear();
    }

    /// Forgets everything (as [`DiskIndex::clear`]) and starts over on an empty slab of
    /// `slab_units` units: the disk's directory was made again.
    pub fn reset(&mut self, slab_units: u64) {
        self.clear();
        self.space = Space::new(slab_units, true);
        self.touched = None;
    }

    /// The changes since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<StoreEvent> {
        std::mem::take(&mut self.changes)
    }

    /// Whether changes wait to be taken.
    pub fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// The records to take off the disk since the last call, in order.
    pub fn take_garbage(&mut self) -> Vec<Garbage> {
        std::mem::take(&mut self.garbage)
    }

    /// Bytes of memory the index takes per object for `replacement`, not counting spare room:
    /// the catalog's bookkeeping (see [`Catalog::metadata_bytes_per_entry_for`]).
    pub fn bytes_per_entry(replacement: meshcache_store::Replacement) -> usize {
        Catalog::<DiskEntry>::metadata_bytes_per_entry_for(replacement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcache_store::Replacement;

    fn index(budget: u64) -> DiskIndex {
        DiskIndex::new(
            StoreConfig {
                capacity: budget,
                max_object_size: budget,
                replacement: Replacement::Lru,
            },
            1000,
            false,
        )
    }

    fn key(n: u32) -> StoreKey {
        StoreKey::get(&format!("http://a.test/{n}"))
    }

    fn slab(n: u32, unit: u64) -> DiskEntry {
        DiskEntry::new(key(n), Location::Slab { unit, len: 256 }, false, 0).expect("entry")
    }

    #[test]
    fn only_the_newest_announced_write_is_indexed() {
        let mut ix = index(10_000);
        ix.expect(key(1), 1);
        ix.expect(key(1), 2);
        assert!(!ix.commit(slab(1, 0), 1), "superseded by write 2");
        assert_eq!(ix.take_garbage().len(), 1);
        assert!(ix.commit(slab(1, 1), 2));
        assert_eq!(
            ix.take_changes(),
            [StoreEvent::Admitted {
                key: key(1),
                size: 256
            }]
        );
        // An invalidation before the write lands makes the write garbage.
        ix.expect(key(2), 3);
        assert_eq!(
            ix.remove(&key(2), Gone::Invalidated(InvalidateCause::UnsafeMethod)),
            None
        );
        assert!(!ix.commit(slab(2, 2), 3));
        assert_eq!(ix.pending(), 0);
    }

    #[test]
    fn the_budget_evicts_and_queues_garbage() {
        let mut ix = index(512);
        for n in 0..3 {
            ix.expect(key(n), u64::from(n));
            assert!(ix.commit(slab(n, u64::from(n)), u64::from(n)));
        }
        assert_eq!(ix.len(), 2);
        let garbage = ix.take_garbage();
        assert_eq!(garbage.len(), 1);
        assert_eq!(garbage[0].key, key(0));
        assert!(ix
            .take_changes()
            .iter()
            .any(|c| matches!(c, StoreEvent::Evicted { key: k, cause: EvictCause::Capacity, .. } if *k == key(0))));
    }

    #[test]
    fn the_rebuild_keeps_the_newest_record_and_what_this_run_wrote() {
        let mut ix = DiskIndex::new(
            StoreConfig {
                capacity: 1 << 20,
                max_object_size: 1 << 20,
                replacement: Replacement::Lru,
            },
            1000,
            true,
        );
        assert_eq!(
            ix.allocate(1),
            None,
            "nothing is free before the rebuild says so"
        );
        assert_eq!(ix.found(slab(1, 0)), Found::Indexed);
        assert_eq!(ix.found(slab(1, 1)), Found::Twin(slab(1, 0)));
        ix.settle(slab(1, 1), slab(1, 0), false);
        assert_eq!(ix.found(slab(1, 2)), Found::Twin(slab(1, 0)));
        ix.settle(slab(1, 2), slab(1, 0), true);
        assert_eq!(
            ix.peek(&key(1)).map(|e| e.location()),
            Some(Location::Slab { unit: 2, len: 256 })
        );
        // This run invalidated key 2: an old record of it stays gone.
        ix.remove(&key(2), Gone::Invalidated(InvalidateCause::Explicit));
        assert_eq!(ix.found(slab(2, 3)), Found::Superseded);
        ix.found_free(4, 996);
        assert_eq!(ix.space().free_units(), 996);
        ix.rebuilt();
        assert!(!ix.rebuilding());
        let garbage: Vec<_> = ix.take_garbage().into_iter().map(|g| g.location).collect();
        assert_eq!(garbage.len(), 3, "{garbage:?}");
    }

    #[test]
    fn clear_reports_every_object_lost() {
        let mut ix = index(10_000);
        for n in 0..3 {
            ix.expect(key(n), 1);
            ix.commit(slab(n, u64::from(n)), 1);
        }
        ix.take_changes();
        ix.clear();
        let changes = ix.take_changes();
        assert_eq!(changes.len(), 3);
        assert!(changes.iter().all(|c| matches!(
            c,
            StoreEvent::Evicted {
                cause: EvictCause::Lost,
                ..
            }
        )));
        assert!(ix.is_empty());
    }
}
