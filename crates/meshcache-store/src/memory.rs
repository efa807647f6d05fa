//! The byte-budgeted in-memory store.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::catalog::{Catalog, Record};
use crate::{AdmitError, InvalidateCause, Replacement, StoreEvent, StoreKey};

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

impl<V> Record for Entry<V> {
    fn key(&self) -> &StoreKey {
        &self.key
    }

    fn size(&self) -> u64 {
        self.size
    }
}

/// A byte-budgeted in-memory object store with a selectable replacement
/// policy: a [`Catalog`] of values behind [`Arc`]s that reports every change as
/// [`StoreEvent`]s. See the [crate documentation](crate) for an overview.
///
/// `S` hashes keys in the index (see [`Catalog`]).
pub struct MemoryStore<V, S = RandomState> {
    catalog: Catalog<Entry<V>, S>,
}

impl<V, S> fmt::Debug for MemoryStore<V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.catalog.config();
        f.debug_struct("MemoryStore")
            .field("len", &self.catalog.len())
            .field("bytes", &self.catalog.bytes())
            .field("capacity", &config.capacity)
            .field("max_object_size", &config.max_object_size)
            .field("replacement", &config.replacement)
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
        MemoryStore {
            catalog: Catalog::with_hasher(config, hasher),
        }
    }

    /// Look up and count a hit for the replacement policy.
    pub fn get(&mut self, key: &StoreKey) -> Option<&Arc<V>> {
        self.catalog.get(key).map(|entry| &entry.value)
    }

    /// Look up without touching replacement state (for peers' queries).
    pub fn peek(&self, key: &StoreKey) -> Option<&Arc<V>> {
        self.catalog.peek(key).map(|entry| &entry.value)
    }

    /// Whether a value is stored under `key` (does not count as a hit).
    pub fn contains(&self, key: &StoreKey) -> bool {
        self.catalog.contains(key)
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
        self.catalog
            .insert(Entry { key, value, size }, |old, cause| {
                events.push(StoreEvent::Evicted {
                    key: old.key,
                    size: old.size,
                    cause,
                });
            })?;
        events.push(StoreEvent::Admitted { key, size });
        Ok(())
    }

    /// Remove the value under `key` and report an `Invalidated` event with
    /// `cause`, or `None` if nothing is stored under `key`.
    pub fn invalidate(&mut self, key: &StoreKey, cause: InvalidateCause) -> Option<StoreEvent> {
        let entry = self.catalog.remove(key)?;
        Some(StoreEvent::Invalidated {
            key: entry.key,
            size: entry.size,
            cause,
        })
    }

    /// The largest weight [`insert`](Self::insert) accepts:
    /// `min(max_object_size, capacity)`.
    pub fn admission_limit(&self) -> u64 {
        self.catalog.admission_limit()
    }

    /// Number of stored values.
    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    /// Whether the store holds no values.
    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Sum of the stored values' weights (bookkeeping memory not included).
    pub fn bytes(&self) -> u64 {
        self.catalog.bytes()
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.catalog.capacity()
    }

    /// The configured maximum object size.
    pub fn max_object_size(&self) -> u64 {
        self.catalog.config().max_object_size
    }

    /// The replacement policy.
    pub fn replacement(&self) -> Replacement {
        self.catalog.config().replacement
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> StoreConfig {
        self.catalog.config()
    }

    /// Iterate over keys (for building digests); order unspecified.
    pub fn keys(&self) -> impl Iterator<Item = &StoreKey> + '_ {
        self.catalog.records().map(|entry| &entry.key)
    }

    /// Iterate over keys and values without touching replacement state;
    /// order unspecified.
    pub fn iter(&self) -> impl Iterator<Item = (&StoreKey, &Arc<V>)> + '_ {
        self.catalog
            .records()
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

    /// Bytes of index/bookkeeping memory per entry with `replacement`, measured with
    /// [`std::mem::size_of`] ([`Catalog::metadata_bytes_per_entry_for`]): the slab slot here
    /// holds the key, the `Arc` pointer and the cached weight. The `Arc`'s 16-byte reference
    /// counts belong to the value (see [`Weigh`]). Even with the catalog's spare capacity at
    /// its worst the total stays well below 256 bytes per entry.
    pub fn metadata_bytes_per_entry_for(replacement: Replacement) -> usize {
        Catalog::<Entry<V>, S>::metadata_bytes_per_entry_for(replacement)
    }
}

#[cfg(test)]
impl<V: Weigh> MemoryStore<V> {
    /// A store that holds at most `max_entries` entries (to exercise the
    /// entry-count limit without four billion objects).
    pub(crate) fn with_entry_limit(config: StoreConfig, max_entries: usize) -> Self {
        MemoryStore {
            catalog: Catalog::with_max_entries(config, max_entries, RandomState::new()),
        }
    }

    /// Panic unless index, slab, free list, byte count and policy agree.
    pub(crate) fn check_consistency(&self) {
        self.catalog.check_consistency();
    }
}
