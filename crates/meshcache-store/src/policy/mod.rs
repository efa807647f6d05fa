//! Replacement policies: which object to drop when the store is full.
//!
//! A policy never sees keys or values. The store gives every live entry a
//! *slot* (a `u32` index into its slab) and tells the policy about admissions,
//! hits and removals by slot; when it needs room it asks the policy for a
//! victim slot. Each policy keeps its own per-slot bookkeeping in vectors
//! indexed by slot, so the memory it costs per entry is exact and
//! policy-specific (see [`Replacement::policy_bytes_per_entry`] and
//! [`MemoryStore::metadata_bytes_per_entry_for`](crate::MemoryStore::metadata_bytes_per_entry_for)).
//!
//! The implementations are private, one file per algorithm:
//!
//! * `lru.rs` — least recently used, an intrusive doubly linked list: O(1).
//! * `gdsf.rs` — Greedy-Dual-Size-Frequency, `K = L + freq / size`: O(log n).
//! * `lfuda.rs` — LFU with dynamic aging, `K = L + freq`: O(log n).
//!
//! GDSF and LFUDA differ only in their priority function and share the
//! indexed binary min-heap in `heap.rs`. The store dispatches to them through
//! an enum (no boxing).

use std::fmt;
use std::str::FromStr;

use crate::error::ParseReplacementError;

pub(crate) mod gdsf;
pub(crate) mod heap;
pub(crate) mod lfuda;
pub(crate) mod lru;

/// The replacement policy a store uses, as named in configuration.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Replacement {
    /// Least recently used (Squid's default `lru`).
    #[default]
    Lru,
    /// Greedy-Dual-Size-Frequency (Squid's `heap GDSF`): keeps many small
    /// popular objects, maximising the object hit ratio.
    Gdsf,
    /// Least frequently used with dynamic aging (Squid's `heap LFUDA`): keeps
    /// popular objects regardless of size, maximising the byte hit ratio.
    Lfuda,
}

impl Replacement {
    /// Every policy, in declaration order.
    pub const ALL: [Replacement; 3] = [Replacement::Lru, Replacement::Gdsf, Replacement::Lfuda];

    /// The configuration name: `"lru"`, `"gdsf"` or `"lfuda"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Replacement::Lru => "lru",
            Replacement::Gdsf => "gdsf",
            Replacement::Lfuda => "lfuda",
        }
    }

    /// The accepted names, comma-separated (for error messages and help).
    pub fn allowed() -> String {
        Self::ALL
            .iter()
            .map(Replacement::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Bytes of bookkeeping this policy's own structures spend per entry (its
    /// per-slot node and, for the heap policies, the heap slot).
    pub fn policy_bytes_per_entry(&self) -> usize {
        match self {
            Replacement::Lru => lru::Lru::BYTES_PER_ENTRY,
            Replacement::Gdsf => gdsf::Gdsf::BYTES_PER_ENTRY,
            Replacement::Lfuda => lfuda::Lfuda::BYTES_PER_ENTRY,
        }
    }
}

impl fmt::Display for Replacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Replacement {
    type Err = ParseReplacementError;

    /// Parses `"lru"`, `"gdsf"` or `"lfuda"`, ignoring ASCII case and
    /// surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        Self::ALL
            .into_iter()
            .find(|policy| policy.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| ParseReplacementError {
                value: s.to_owned(),
            })
    }
}

/// What the store needs from a replacement policy. Slots are the store's slab
/// indices; the store guarantees it only touches or forgets tracked slots and
/// never admits a slot twice.
pub(crate) trait Policy {
    /// Bookkeeping bytes per tracked entry.
    const BYTES_PER_ENTRY: usize;
    /// Start tracking `slot`, just admitted, weighing `size` bytes.
    fn admit(&mut self, slot: u32, size: u64);
    /// Count a hit on tracked `slot`, which weighs `size` bytes.
    fn touch(&mut self, slot: u32, size: u64);
    /// Stop tracking `slot` (removed for a reason other than eviction).
    fn forget(&mut self, slot: u32);
    /// Choose the victim, stop tracking it, update any aging state, and
    /// return its slot; `None` when nothing is tracked.
    fn evict(&mut self) -> Option<u32>;
    /// Number of tracked slots.
    #[cfg(test)]
    fn len(&self) -> usize;
    /// Panic if the internal structure is inconsistent (tests only).
    #[cfg(test)]
    fn check(&self);
}

/// Enum dispatch over the three policies (no boxing, no virtual calls).
pub(crate) enum AnyPolicy {
    Lru(lru::Lru),
    Gdsf(gdsf::Gdsf),
    Lfuda(lfuda::Lfuda),
}

macro_rules! dispatch {
    ($self:expr, $p:ident => $e:expr) => {
        match $self {
            AnyPolicy::Lru($p) => $e,
            AnyPolicy::Gdsf($p) => $e,
            AnyPolicy::Lfuda($p) => $e,
        }
    };
}

impl AnyPolicy {
    pub(crate) fn new(replacement: Replacement) -> Self {
        match replacement {
            Replacement::Lru => AnyPolicy::Lru(lru::Lru::new()),
            Replacement::Gdsf => AnyPolicy::Gdsf(gdsf::Gdsf::new()),
            Replacement::Lfuda => AnyPolicy::Lfuda(lfuda::Lfuda::new()),
        }
    }

    pub(crate) fn admit(&mut self, slot: u32, size: u64) {
        dispatch!(self, p => p.admit(slot, size))
    }

    pub(crate) fn touch(&mut self, slot: u32, size: u64) {
        dispatch!(self, p => p.touch(slot, size))
    }

    pub(crate) fn forget(&mut self, slot: u32) {
        dispatch!(self, p => p.forget(slot))
    }

    pub(crate) fn evict(&mut self) -> Option<u32> {
        dispatch!(self, p => p.evict())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        dispatch!(self, p => p.len())
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        dispatch!(self, p => p.check())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        for policy in Replacement::ALL {
            assert_eq!(policy.to_string().parse::<Replacement>(), Ok(policy));
        }
        assert_eq!("GDSF".parse::<Replacement>(), Ok(Replacement::Gdsf));
        assert_eq!(" lfuda ".parse::<Replacement>(), Ok(Replacement::Lfuda));
        assert_eq!(Replacement::default(), Replacement::Lru);
    }

    #[test]
    fn parse_error_names_value_and_choices() {
        let err = "heap-lru"
            .parse::<Replacement>()
            .expect_err("heap-lru is not a policy");
        assert_eq!(err.value, "heap-lru");
        assert_eq!(
            err.to_string(),
            "unknown replacement policy \"heap-lru\": expected one of lru, gdsf, lfuda"
        );
        assert!("".parse::<Replacement>().is_err());
    }

    #[test]
    fn serde_names_are_lowercase() {
        use serde::de::value::{Error, StrDeserializer};
        use serde::de::{Deserialize, IntoDeserializer};
        for policy in Replacement::ALL {
            let de: StrDeserializer<'_, Error> = policy.as_str().into_deserializer();
            assert_eq!(Replacement::deserialize(de), Ok(policy));
        }
        let de: StrDeserializer<'_, Error> = "Gdsf".into_deserializer();
        assert!(Replacement::deserialize(de).is_err());
    }
}
