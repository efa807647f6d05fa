//! # meshcache-store
//!
//! The object store of meshcache, a cooperative web proxy cache: a
//! byte-budgeted in-memory index of cached responses with a selectable
//! replacement policy, reporting every change as a [`StoreEvent`].
//!
//! ## For a newcomer
//!
//! A caching proxy keeps responses it may serve again. Each is identified by
//! a [`StoreKey`]: the MD5 of the request method and URL (and of the request's
//! `Vary`-selected header values, for variants), computed exactly as Squid
//! does, so that keys can be exchanged with Squid peers in cache digests and
//! ICP/HTCP. The store holds values behind [`Arc`](std::sync::Arc)s; what
//! a value costs is told by the [`Weigh`] trait, and the sum of the stored
//! weights never exceeds the configured capacity.
//!
//! When a new value does not fit, the store's replacement policy chooses
//! victims ([`Replacement`]):
//!
//! * `lru` — least recently used;
//! * `gdsf` — Greedy-Dual-Size-Frequency, favouring small popular objects
//!   (best object hit ratio);
//! * `lfuda` — LFU with dynamic aging, favouring popular objects of any size
//!   (best byte hit ratio).
//!
//! Every mutation returns what it did as events — `Admitted`, `Evicted`
//! (with an [`EvictCause`]) and `Invalidated` (with an [`InvalidateCause`]).
//! The store never calls anyone: the proxy publishes the returned events to
//! the cooperation protocols (cache digests, directories) that mirror the
//! store's contents. Replaying all events in order onto an empty key set
//! gives exactly [`MemoryStore::keys`].
//!
//! The crate is a plain data structure: no threads, no locks, no clock, no
//! I/O. Anything time-based takes `now` as a parameter; the proxy wraps the
//! store in a mutex.
//!
//! ## Example
//!
//! ```
//! use std::sync::Arc;
//! use meshcache_store::{
//!     EvictCause, InvalidateCause, MemoryStore, Replacement, StoreConfig, StoreEvent, StoreKey,
//! };
//!
//! let mut store = MemoryStore::<Vec<u8>>::new(StoreConfig {
//!     capacity: 100,
//!     max_object_size: 80,
//!     replacement: Replacement::Lru,
//! });
//! let a = StoreKey::get("http://example.com/a");
//! let b = StoreKey::get("http://example.com/b");
//!
//! assert_eq!(
//!     store.insert(a, Arc::new(vec![0; 60]))?,
//!     [StoreEvent::Admitted { key: a, size: 60 }]
//! );
//! // `b` does not fit next to `a`: the policy evicts `a` first.
//! assert_eq!(
//!     store.insert(b, Arc::new(vec![0; 50]))?,
//!     [
//!         StoreEvent::Evicted { key: a, size: 60, cause: EvictCause::Capacity },
//!         StoreEvent::Admitted { key: b, size: 50 },
//!     ]
//! );
//! assert!(store.get(&b).is_some());
//! assert_eq!(store.bytes(), 50);
//!
//! // A POST to the URL invalidates the stored GET response.
//! assert_eq!(
//!     store.invalidate(&b, InvalidateCause::UnsafeMethod),
//!     Some(StoreEvent::Invalidated { key: b, size: 50, cause: InvalidateCause::UnsafeMethod })
//! );
//! assert!(store.is_empty());
//!
//! // Too large for max_object_size: refused, nothing changes.
//! assert!(store.insert(a, Arc::new(vec![0; 90])).is_err());
//! # Ok::<(), meshcache_store::AdmitError>(())
//! ```
//!
//! ## Layout
//!
//! * `key.rs` — [`StoreKey`], Squid-compatible MD5 keys and hex formatting.
//! * `event.rs` — [`StoreEvent`], [`EvictCause`], [`InvalidateCause`].
//! * `catalog.rs` — [`Catalog`] and the [`Record`] trait: a byte-budgeted set
//!   of records (a slab plus free list, indexed by a hash table of slot
//!   numbers) with a replacement policy. The memory store is one; a disk's
//!   index of what its files hold is another.
//! * `memory.rs` — [`MemoryStore`], [`StoreConfig`], the [`Weigh`] trait: a
//!   catalog of values behind `Arc`s that reports its changes as events.
//! * `policy/` — [`Replacement`] and the policies, each tracking entries by
//!   slab slot: `lru.rs` (intrusive linked list, O(1)), `heap.rs` (indexed
//!   binary min-heap shared by the Greedy-Dual policies, O(log n)),
//!   `gdsf.rs` and `lfuda.rs` (their priority functions).
//! * `error.rs` — [`AdmitError`], [`ParseReplacementError`].
//!
//! ## Metadata overhead
//!
//! [`MemoryStore::metadata_bytes_per_entry_for`] reports the bookkeeping
//! bytes per object, measured with `size_of`: 45 for LRU and 61 for GDSF
//! and LFUDA on 64-bit targets, before the hash table's spare buckets (5
//! bytes each, 1.14–2.3 per entry) and at most one spare chunk per per-slot
//! array (`chunked.rs`). The weights the store accounts
//! ([`MemoryStore::bytes`]) cover values only.

mod catalog;
mod chunked;
mod error;
mod event;
mod key;
mod memory;
mod policy;

pub use catalog::{Catalog, Record};
pub use error::{AdmitError, ParseReplacementError};
pub use event::{EvictCause, InvalidateCause, StoreEvent};
pub use key::StoreKey;
pub use memory::{MemoryStore, StoreConfig, Weigh};
pub use policy::Replacement;

#[cfg(test)]
mod tests;
