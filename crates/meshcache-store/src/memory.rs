//! The byte-budgeted in-memory store.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::chunked::ChunkVec;
use crate::policy::AnyPolicy;
use crate::{AdmitError, EvictCause, InvalidateCause, Replacement, StoreEvent, StoreKey};

/// What a stored value costs in bytes (body + headers + anything it owns).
///
/// The store calls this once, when the value is inserted, and charges that
/// figure against its capacity until the value leaves; the weight of a stored
/// value must therefore not change while it is stored (values are behind an
/// [`Arc`] and immutable in practice). The `Arc`'s own two reference counts
/// (16 bytes on 64-bit targets) are not counted by the store; include them
/// here if you want them charged.
pub trait Weigh {
    /// The value's cost in bytes.
    fn weight(&self) -> u64;
}

impl Weigh for Vec<u8> {
    fn weight(&self) -> u64 {
        self.len() as u64
    }
}

impl Weigh for Box<[u8]> {
    fn weight(&self) -> u64 {
        self.len() as u64
    }
}

impl Weigh for String {
    fn weight(&self) -> u64 {
        self.len() as u64
    }
}

/// Sizing and policy of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Byte budget: the sum of the stored values' weights never exceeds it.
    pub capacity: u64,
    /// Values weighing more than this are refused.
    pub max_object_size: u64,
    /// Which replacement policy chooses victims.
    pub replacement: Replacement,
}

/// One stored object. 32 bytes on 64-bit targets; `Option<Entry>` is the same
/// size thanks to the `Arc`'s non-null niche.
struct Entry<V> {
    key: StoreKey,
    value: Arc<V>,
    /// `value.weight()` at insertion.
    size: u64,
}

/// Highest number of entries: slots are `u32` and `u32::MAX` means "none".
const MAX_ENTRIES: usize = (u32::MAX - 1) as usize;

/// A byte-budgeted in-memory object index with a selectable replacement
/// policy. See the [crate documentation](crate) for an overview.
///
/// Entries live in a slab (chunked array of slots plus a free list) and are found
/// through a hash table of slot numbers (hashed and compared by the key in the slot, so
/// the 16-byte key is stored once); the policy keeps its
/// own per-slot bookkeeping. Nothing here is thread-safe or time-aware on its
/// own: wrap it in a mutex and pass times in.
///
/// `S` hashes keys in the index: by default the standard library's keyed
/// SipHash, because a proxy's keys come from its clients' URLs. A simulator
/// replaying a trace, where nobody chooses keys against the table, may take a
/// cheaper one.
pub struct MemoryStore<V, S = RandomState> {
    /// Slot numbers of the occupied slots, hashed by their entries' keys.
    index: HashTable<u32>,
    hasher: S,
    slots: ChunkVec<Option<Entry<V>>>,
    /// Vacant slots, reused before the slab grows.
    free: Vec<u32>,
    policy: AnyPolicy,
    bytes: u64,
    config: StoreConfig,
    /// Entry-count limit; [`MAX_ENTRIES`] except in tests.
    max_entries: usize,
}

impl<V, S> fmt::Debug for MemoryStore<V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.index.len())
            .field("bytes", &self.bytes)
            .field("capacity", &self.config.capacity)
            .field("max_object_size", &self.config.max_object_size)
            .field("replacement", &self.config.replacement)
            .finish()
    }
}

impl<V: Weigh> MemoryStore<V> {
    /// An empty store.
    pub fn new(config: StoreConfig) -> Self {
        Self::with_hasher(config, RandomState::new())
    }
}

impl<V: Weigh, S: BuildHasher> MemoryStore<V, S> {
    /// An empty store whose index hashes keys with `hasher`.
    pub fn with_hasher(config: StoreConfig, hasher: S) -> Self {
        Self::with_max_entries(config, MAX_ENTRIES, hasher)
    }

    fn with_max_entries(config: StoreConfig, max_entries: usize, hasher: S) -> Self {
        MemoryStore {
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
                slots[slot as usize].as_ref().is_some_and(|e| e.key == *key)
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
                .map_or(0, |e| hasher.hash_one(e.key))
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

    /// Look up and count a hit for the replacement policy.
    pub fn get(&mut self, key: &StoreKey) -> Option<&Arc<V>> {
        let slot = self.find(key)?;
        let entry = self.slots[slot as usize].as_ref()?;
        self.policy.touch(slot, entry.size);
        Some(&entry.value)
    }

    /// Look up without touching replacement state (for peers' queries).
    pub fn peek(&self, key: &StoreKey) -> Option<&Arc<V>> {
        let slot = self.find(key)?;
        self.slots[slot as usize].as_ref().map(|entry| &entry.value)
    }

    /// Whether a value is stored under `key` (does not count as a hit).
    pub fn contains(&self, key: &StoreKey) -> bool {
        self.find(key).is_some()
    }

    /// Admit a value.
    ///
    /// Returns the events in order: `Evicted { cause: Replaced }` for an old
    /// value under the same key (if any), `Evicted { cause: Capacity }` for
    /// each victim the policy chose, then `Admitted`. The caller publishes
    /// them. Only as many victims are evicted as are needed to fit the value.
    ///
    /// # Errors
    ///
    /// [`AdmitError::TooLarge`] if the value weighs more than
    /// `min(max_object_size, capacity)`; the store is then left unchanged
    /// (an old value under the same key stays).
    pub fn insert(&mut self, key: StoreKey, value: Arc<V>) -> Result<Vec<StoreEvent>, AdmitError> {
        let mut events = Vec::with_capacity(2);
        self.insert_into(key, value, &mut events)?;
        Ok(events)
    }

    /// As [`MemoryStore::insert`], appending the events to `events` (a buffer the caller
    /// reuses: a simulator inserting millions of objects allocates no list per insert).
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::insert`]; nothing is appended then.
    pub fn insert_into(
        &mut self,
        key: StoreKey,
        value: Arc<V>,
        events: &mut Vec<StoreEvent>,
    ) -> Result<(), AdmitError> {
        let size = value.weight();
        let max = self.admission_limit();
        if size > max {
            return Err(AdmitError::TooLarge { size, max });
        }

        if let Some(old) = self.remove(&key) {
            events.push(StoreEvent::Evicted {
                key,
                size: old.size,
                cause: EvictCause::Replaced,
            });
        }

        // `bytes <= capacity` always holds, so the subtraction cannot wrap.
        while size > self.config.capacity - self.bytes || self.index.len() >= self.max_entries {
            let Some(slot) = self.policy.evict() else {
                // Unreachable: an empty store has room for any admissible value.
                debug_assert!(false, "policy has no victim but the store is full");
                break;
            };
            if let Some(victim) = &self.slots[slot as usize] {
                let key = victim.key;
                self.unindex_slot(&key, slot);
            }
            let victim = self.release(slot);
            events.push(StoreEvent::Evicted {
                key: victim.key,
                size: victim.size,
                cause: EvictCause::Capacity,
            });
        }

        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(Entry { key, value, size });
                slot
            }
            None => {
                // slots.len() <= max_entries < u32::MAX, so this fits.
                let slot = self.slots.len() as u32;
                self.slots.push(Some(Entry { key, value, size }));
                slot
            }
        };
        self.index_slot(&key, slot);
        self.policy.admit(slot, size);
        self.bytes += size;
        events.push(StoreEvent::Admitted { key, size });
        Ok(())
    }

    /// Remove the value under `key` and report an `Invalidated` event with
    /// `cause`, or `None` if nothing is stored under `key`.
    pub fn invalidate(&mut self, key: &StoreKey, cause: InvalidateCause) -> Option<StoreEvent> {
        let entry = self.remove(key)?;
        Some(StoreEvent::Invalidated {
            key: entry.key,
            size: entry.size,
            cause,
        })
    }

    /// Unlink `key` from the index, the policy and the slab.
    fn remove(&mut self, key: &StoreKey) -> Option<Entry<V>> {
        let slots = &self.slots;
        let found = self
            .index
            .find_entry(self.hasher.hash_one(key), |&slot| {
                slots[slot as usize].as_ref().is_some_and(|e| e.key == *key)
            })
            .ok()?;
        let (slot, _) = found.remove();
        self.policy.forget(slot);
        Some(self.release(slot))
    }

    /// Vacate `slot` (already gone from the policy) and uncharge its bytes.
    fn release(&mut self, slot: u32) -> Entry<V> {
        let entry = self.slots[slot as usize]
            .take()
            .expect("policy and index only name occupied slots");
        self.free.push(slot);
        self.bytes -= entry.size;
        entry
    }

    /// The largest weight [`insert`](Self::insert) accepts:
    /// `min(max_object_size, capacity)`.
    pub fn admission_limit(&self) -> u64 {
        self.config.max_object_size.min(self.config.capacity)
    }

    /// Number of stored values.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the store holds no values.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Sum of the stored values' weights (bookkeeping memory not included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.config.capacity
    }

    /// The configured maximum object size.
    pub fn max_object_size(&self) -> u64 {
        self.config.max_object_size
    }

    /// The replacement policy.
    pub fn replacement(&self) -> Replacement {
        self.config.replacement
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> StoreConfig {
        self.config
    }

    /// Iterate over keys (for building digests); order unspecified.
    pub fn keys(&self) -> impl Iterator<Item = &StoreKey> + '_ {
        self.slots.iter().flatten().map(|entry| &entry.key)
    }

    /// Iterate over keys and values without touching replacement state;
    /// order unspecified.
    pub fn iter(&self) -> impl Iterator<Item = (&StoreKey, &Arc<V>)> + '_ {
        self.slots
            .iter()
            .flatten()
            .map(|entry| (&entry.key, &entry.value))
    }

    /// Bytes of index/bookkeeping memory this store spends per entry, for
    /// documenting metadata overhead: the worst case over all replacement
    /// policies of [`metadata_bytes_per_entry_for`](Self::metadata_bytes_per_entry_for).
    pub fn metadata_bytes_per_entry() -> usize {
        Replacement::ALL
            .into_iter()
            .map(Self::metadata_bytes_per_entry_for)
            .max()
            .unwrap_or(0)
    }

    /// Bytes of index/bookkeeping memory per entry with `replacement`,
    /// measured with [`std::mem::size_of`]:
    ///
    /// * the index's bucket, a `u32` slot number, plus hashbrown's one control byte,
    /// * the slab slot `Option<Entry>` (the key, `Arc` pointer, cached weight),
    /// * the policy's per-entry node (LRU: two `u32` links; GDSF/LFUDA: a heap
    ///   item with priority, tie-break sequence and slot, plus the slot's heap
    ///   position and frequency).
    ///
    /// Not included: spare capacity — the hash table keeps its load factor at
    /// or below 7/8 with a power-of-two bucket count (1.14–2.3 buckets per
    /// entry), and the per-slot arrays grow by chunks of 4,096 and do not
    /// shrink — and the
    /// `Arc`'s 16-byte reference counts, which belong to the value (see
    /// [`Weigh`]). Even with every one of those at its worst the total stays
    /// well below 256 bytes per entry.
    pub fn metadata_bytes_per_entry_for(replacement: Replacement) -> usize {
        std::mem::size_of::<u32>()
            + 1
            + std::mem::size_of::<Option<Entry<V>>>()
            + replacement.policy_bytes_per_entry()
    }
}

#[cfg(test)]
impl<V: Weigh> MemoryStore<V> {
    /// A store that holds at most `max_entries` entries (to exercise the
    /// entry-count limit without four billion objects).
    pub(crate) fn with_entry_limit(config: StoreConfig, max_entries: usize) -> Self {
        Self::with_max_entries(config, max_entries, RandomState::new())
    }

    /// Panic unless index, slab, free list, byte count and policy agree.
    pub(crate) fn check_consistency(&self) {
        assert!(self.bytes <= self.config.capacity, "over budget");
        let mut bytes = 0;
        let mut occupied = 0;
        for (slot, entry) in self.slots.iter().enumerate() {
            if let Some(entry) = entry {
                occupied += 1;
                bytes += entry.size;
                assert_eq!(self.find(&entry.key), Some(slot as u32));
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
