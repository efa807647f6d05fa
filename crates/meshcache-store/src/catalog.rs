//! The catalog: a byte-budgeted set of records, found by key, with a replacement policy.
//!
//! Both tiers of the cache keep one: the memory store ([`MemoryStore`](crate::MemoryStore))
//! catalogues values held in memory, a disk catalogues where its objects lie in its files. A
//! [`Record`] names its key and its weight; everything else it carries is the holder's business.
//!
//! Records live in a slab (chunked array of slots plus a free list) and are found through a hash
//! table of slot numbers, hashed and compared by the key in the slot, so the 16-byte key is stored
//! once. The policy keeps its own per-slot bookkeeping. Nothing here is thread-safe or time-aware
//! on its own: wrap it in a mutex and pass times in.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::chunked::ChunkVec;
use crate::policy::AnyPolicy;
use crate::{AdmitError, EvictCause, Replacement, StoreConfig, StoreKey};

/// What a catalog keeps per object: its key and its weight, plus whatever its holder needs.
///
/// The weight must not change while the record is catalogued: the catalog charges it at
/// insertion and uncharges the same figure when the record leaves.
pub trait Record {
    /// The object's key.
    fn key(&self) -> &StoreKey;
    /// The object's weight in bytes.
    fn size(&self) -> u64;
}

/// Highest number of records: slots are `u32` and `u32::MAX` means "none".
const MAX_ENTRIES: usize = (u32::MAX - 1) as usize;

/// A byte-budgeted set of records with a selectable replacement policy; see the
/// module's documentation.
///
/// `S` hashes keys in the index: by default the standard library's keyed SipHash, because a
/// proxy's keys come from its clients' URLs. A simulator replaying a trace, where nobody chooses
/// keys against the table, may take a cheaper one.
pub struct Catalog<R, S = RandomState> {
    /// Slot numbers of the occupied slots, hashed by their records' keys.
    index: HashTable<u32>,
    hasher: S,
    slots: ChunkVec<Option<R>>,
    /// Vacant slots, reused before the slab grows.
    free: Vec<u32>,
    policy: AnyPolicy,
    bytes: u64,
    config: StoreConfig,
    /// Record-count limit; [`MAX_ENTRIES`] except in tests.
    max_entries: usize,
}

impl<R, S> fmt::Debug for Catalog<R, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("len", &self.index.len())
            .field("bytes", &self.bytes)
            .field("capacity", &self.config.capacity)
            .field("max_object_size", &self.config.max_object_size)
            .field("replacement", &self.config.replacement)
            .finish()
    }
}

impl<R, S> Catalog<R, S> {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the catalog is empty.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Sum of the records' weights (bookkeeping memory not included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.config.capacity
    }

    /// The configuration the catalog was built with.
    pub fn config(&self) -> StoreConfig {
        self.config
    }
}

impl<R: Record> Catalog<R> {
    /// An empty catalog.
    pub fn new(config: StoreConfig) -> Self {
        Self::with_hasher(config, RandomState::new())
    }
}

impl<R: Record, S: BuildHasher> Catalog<R, S> {
    /// An empty catalog whose index hashes keys with `hasher`.
    pub fn with_hasher(config: StoreConfig, hasher: S) -> Self {
        Self::with_max_entries(config, MAX_ENTRIES, hasher)
    }

    pub(crate) fn with_max_entries(config: StoreConfig, max_entries: usize, hasher: S) -> Self {
        Catalog {
            index: HashTable::new(),
            hasher,
            slots: ChunkVec::new(),
            free: Vec::new(),
            policy: AnyPolicy::new(config.replacement),
            bytes: 0,
            config,
            max_entries: max_entries.clamp(1, MAX_ENTRIES),
        }
    }

    /// The slot holding `key`.
    fn find(&self, key: &StoreKey) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hasher.hash_one(key), |&slot| {
                slots[slot as usize]
                    .as_ref()
                    .is_some_and(|r| r.key() == key)
            })
            .copied()
    }

    /// Adds occupied `slot` to the index.
    fn index_slot(&mut self, key: &StoreKey, slot: u32) {
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hasher.hash_one(key), slot, |&s| {
            // The index names only occupied slots.
            slots[s as usize]
                .as_ref()
                .map_or(0, |r| hasher.hash_one(r.key()))
        });
    }

    /// Removes `slot`, which holds `key`, from the index.
    fn unindex_slot(&mut self, key: &StoreKey, slot: u32) {
        if let Ok(found) = self
            .index
            .find_entry(self.hasher.hash_one(key), |&s| s == slot)
        {
            found.remove();
        }
    }

    /// Looks `key` up and counts a hit for the replacement policy.
    pub fn get(&mut self, key: &StoreKey) -> Option<&R> {
        let slot = self.find(key)?;
        let record = self.slots[slot as usize].as_ref()?;
        self.policy.touch(slot, record.size());
        Some(record)
    }

    /// Looks `key` up without touching replacement state (for peers' queries).
    pub fn peek(&self, key: &StoreKey) -> Option<&R> {
        let slot = self.find(key)?;
        self.slots[slot as usize].as_ref()
    }

    /// The record under `key`, to change what it carries besides its key and weight (which must
    /// stay as they are); replacement state is not touched.
    pub fn peek_mut(&mut self, key: &StoreKey) -> Option<&mut R> {
        let slot = self.find(key)?;
        self.slots[slot as usize].as_mut()
    }

    /// Whether a record is catalogued under `key` (does not count as a hit).
    pub fn contains(&self, key: &StoreKey) -> bool {
        self.find(key).is_some()
    }

    /// Admits `record`. Whatever leaves to make room is handed to `removed` in order, with its
    /// cause: first an older record under the same key ([`EvictCause::Replaced`]), then each
    /// victim the policy chose ([`EvictCause::Capacity`]), only as many as are needed.
    ///
    /// # Errors
    ///
    /// [`AdmitError::TooLarge`] if the record weighs more than
    /// `min(max_object_size, capacity)`; nothing changes then (an older record under the same
    /// key stays).
    pub fn insert(
        &mut self,
        record: R,
        mut removed: impl FnMut(R, EvictCause),
    ) -> Result<(), AdmitError> {
        let size = record.size();
        let max = self.admission_limit();
        if size > max {
            return Err(AdmitError::TooLarge { size, max });
        }
        let key = *record.key();
        if let Some(old) = self.remove(&key) {
            removed(old, EvictCause::Replaced);
        }
        // `bytes <= capacity` always holds, so the subtraction cannot wrap.
        while size > self.config.capacity - self.bytes || self.index.len() >= self.max_entries {
            let Some(victim) = self.evict() else {
                // Unreachable: an empty catalog has room for any admissible record.
                debug_assert!(false, "policy has no victim but the catalog is full");
                break;
            };
            removed(victim, EvictCause::Capacity);
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(record);
                slot
            }
            None => {
                // slots.len() <= max_entries < u32::MAX, so this fits.
                let slot = self.slots.len() as u32;
                self.slots.push(Some(record));
                slot
            }
        };
        self.index_slot(&key, slot);
        self.policy.admit(slot, size);
        self.bytes += size;
        Ok(())
    }

    /// The policy's next victim, removed; `None` when the catalog is empty.
    pub fn evict(&mut self) -> Option<R> {
        let slot = self.policy.evict()?;
        if let Some(victim) = &self.slots[slot as usize] {
            let key = *victim.key();
            self.unindex_slot(&key, slot);
        }
        Some(self.release(slot))
    }

    /// Removes the record under `key`: from the index, the policy and the slab.
    pub fn remove(&mut self, key: &StoreKey) -> Option<R> {
        let slots = &self.slots;
        let found = self
            .index
            .find_entry(self.hasher.hash_one(key), |&slot| {
                slots[slot as usize]
                    .as_ref()
                    .is_some_and(|r| r.key() == key)
            })
            .ok()?;
        let (slot, _) = found.remove();
        self.policy.forget(slot);
        Some(self.release(slot))
    }

    /// Vacates `slot` (already gone from the policy and the index) and uncharges its bytes.
    fn release(&mut self, slot: u32) -> R {
        let record = self.slots[slot as usize]
            .take()
            .expect("policy and index only name occupied slots");
        self.free.push(slot);
        self.bytes -= record.size();
        record
    }

    /// The largest weight [`insert`](Self::insert) accepts: `min(max_object_size, capacity)`.
    pub fn admission_limit(&self) -> u64 {
        self.config.max_object_size.min(self.config.capacity)
    }

    /// Every record, without touching replacement state; order unspecified.
    pub fn records(&self) -> impl Iterator<Item = &R> + '_ {
        self.slots.iter().flatten()
    }

    /// Bytes of index and policy bookkeeping per record with `replacement`, measured with
    /// [`std::mem::size_of`]: the index's bucket (a `u32` slot number plus hashbrown's control
    /// byte), the slab slot `Option<R>`, and the policy's per-entry node (LRU: two `u32` links;
    /// GDSF/LFUDA: a heap item with priority, tie-break sequence and slot, plus the slot's heap
    /// position and frequency).
    ///
    /// Not included: spare capacity. The hash table keeps its load factor at or below 7/8 with
    /// a power-of-two bucket count (1.14–2.3 buckets per record), and the per-slot arrays grow
    /// by chunks of 4,096 and do not shrink.
    pub fn metadata_bytes_per_entry_for(replacement: Replacement) -> usize {
        std::mem::size_of::<u32>()
            + 1
            + std::mem::size_of::<Option<R>>()
            + replacement.policy_bytes_per_entry()
    }

    /// Panics unless index, slab, free list, byte count and policy agree.
    #[cfg(test)]
    pub(crate) fn check_consistency(&self) {
        assert!(self.bytes <= self.config.capacity, "over budget");
        let mut bytes = 0;
        let mut occupied = 0;
        for (slot, record) in self.slots.iter().enumerate() {
            if let Some(record) = record {
                occupied += 1;
                bytes += record.size();
                assert_eq!(self.find(record.key()), Some(slot as u32));
            } else {
                assert!(self.free.contains(&(slot as u32)), "leaked slot {slot}");
            }
        }
        assert_eq!(occupied, self.index.len());
        assert_eq!(occupied + self.free.len(), self.slots.len());
        assert_eq!(bytes, self.bytes);
        assert_eq!(self.policy.len(), self.index.len());
        self.policy.check();
    }
}
