//! Store events: what changed in the store, and why.
//!
//! Every mutation of a [`MemoryStore`](crate::MemoryStore) reports what it did
//! as a list of [`StoreEvent`]s instead of calling back into the rest of the
//! program. The caller (the proxy) publishes them to whoever keeps a view of
//! the store's contents — a cache digest, a directory of neighbours' objects,
//! metrics. Replaying the events in order onto an empty set of keys yields
//! exactly the store's current key set.

use std::fmt;

use crate::StoreKey;

/// One change to the set of objects in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreEvent {
    /// An object was stored under `key`; it weighs `size` bytes.
    Admitted {
        /// The object's key.
        key: StoreKey,
        /// The object's weight in bytes ([`Weigh::weight`](crate::Weigh::weight)).
        size: u64,
    },
    /// An object was dropped by the store itself.
    Evicted {
        /// The dropped object's key.
        key: StoreKey,
        /// The dropped object's weight in bytes.
        size: u64,
        /// Why it was dropped.
        cause: EvictCause,
    },
    /// An object was dropped because the caller said it is no longer valid.
    Invalidated {
        /// The dropped object's key.
        key: StoreKey,
        /// The dropped object's weight in bytes.
        size: u64,
        /// Why it was invalidated.
        cause: InvalidateCause,
    },
}

impl StoreEvent {
    /// The key the event is about.
    pub fn key(&self) -> StoreKey {
        match *self {
            StoreEvent::Admitted { key, .. }
            | StoreEvent::Evicted { key, .. }
            | StoreEvent::Invalidated { key, .. } => key,
        }
    }

    /// The weight in bytes of the object the event is about.
    pub fn size(&self) -> u64 {
        match *self {
            StoreEvent::Admitted { size, .. }
            | StoreEvent::Evicted { size, .. }
            | StoreEvent::Invalidated { size, .. } => size,
        }
    }

    /// `true` for [`StoreEvent::Admitted`], `false` for the two removals.
    pub fn is_admission(&self) -> bool {
        matches!(self, StoreEvent::Admitted { .. })
    }

    /// Lower-case name of the event kind: `"admitted"`, `"evicted"` or
    /// `"invalidated"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreEvent::Admitted { .. } => "admitted",
            StoreEvent::Evicted { .. } => "evicted",
            StoreEvent::Invalidated { .. } => "invalidated",
        }
    }
}

impl fmt::Display for StoreEvent {
    /// For logs, e.g. `evicted 329CA687BE79CAC3C412013B6F70C45D 1200 bytes (capacity)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} bytes", self.as_str(), self.key(), self.size())?;
        match self {
            StoreEvent::Admitted { .. } => Ok(()),
            StoreEvent::Evicted { cause, .. } => write!(f, " ({cause})"),
            StoreEvent::Invalidated { cause, .. } => write!(f, " ({cause})"),
        }
    }
}

/// Why the store dropped an object on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvictCause {
    /// The replacement policy chose it to make room for a new object.
    Capacity,
    /// An object was stored again under the same key, superseding it.
    Replaced,
    /// Its stored copy was found damaged (a disk record failing its checksums) and dropped.
    Damaged,
    /// The medium holding it went away (a disk's directory was removed).
    Lost,
}

impl EvictCause {
    /// Lower-case name: `"capacity"`, `"replaced"`, `"damaged"` or `"lost"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EvictCause::Capacity => "capacity",
            EvictCause::Replaced => "replaced",
            EvictCause::Damaged => "damaged",
            EvictCause::Lost => "lost",
        }
    }
}

impl fmt::Display for EvictCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the caller removed an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidateCause {
    /// A request with an unsafe method (POST, PUT, DELETE, …) was made on the
    /// URL (RFC 9111 §4.4).
    UnsafeMethod,
    /// Revalidation found the object changed or gone.
    Stale,
    /// A later response for the URL forbade storing it.
    NoStore,
    /// An operator asked for it (purge).
    Explicit,
}

impl InvalidateCause {
    /// Lower-case name: `"unsafe_method"`, `"stale"`, `"no_store"` or
    /// `"explicit"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            InvalidateCause::UnsafeMethod => "unsafe_method",
            InvalidateCause::Stale => "stale",
            InvalidateCause::NoStore => "no_store",
            InvalidateCause::Explicit => "explicit",
        }
    }
}

impl fmt::Display for InvalidateCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_accessors() {
        let key = StoreKey([7; 16]);
        let admitted = StoreEvent::Admitted { key, size: 3 };
        let evicted = StoreEvent::Evicted {
            key,
            size: 4,
            cause: EvictCause::Capacity,
        };
        let invalidated = StoreEvent::Invalidated {
            key,
            size: 5,
            cause: InvalidateCause::UnsafeMethod,
        };
        assert_eq!(admitted.as_str(), "admitted");
        assert_eq!(evicted.as_str(), "evicted");
        assert_eq!(invalidated.as_str(), "invalidated");
        assert!(admitted.is_admission() && !evicted.is_admission());
        assert_eq!(
            [admitted.size(), evicted.size(), invalidated.size()],
            [3, 4, 5]
        );
        assert_eq!(invalidated.key(), key);
        assert_eq!(EvictCause::Replaced.as_str(), "replaced");
        assert_eq!(InvalidateCause::NoStore.to_string(), "no_store");
        assert_eq!(InvalidateCause::Stale.as_str(), "stale");
        assert_eq!(InvalidateCause::Explicit.as_str(), "explicit");
        assert_eq!(
            evicted.to_string(),
            format!("evicted {key} 4 bytes (capacity)")
        );
        assert_eq!(admitted.to_string(), format!("admitted {key} 3 bytes"));
    }
}
