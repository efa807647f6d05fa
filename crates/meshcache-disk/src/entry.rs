//! What the index keeps in memory per object on disk: 28 bytes.
//!
//! The key (16 bytes), where the record lies, how long it is, whether it is a Vary marker, and
//! until when it is fresh (so that a peer's ICP query is answered without touching the disk).
//! Packed into three `u32`s after the key:
//!
//! ```text
//! lo       slab: the record's first unit (low 32 bits)   file: the record's length (low 32 bits)
//! word     bit 31: in a file of its own    bit 30: a Vary marker
//!          slab: bits 21..30 the unit's high 9 bits, bits 0..21 the record's length
//!          file: bits 0..29 the record's length >> 32
//! expires  fresh until, Unix seconds (0: not fresh)
//! ```
//!
//! A slab record is at most [`MAX_SLAB_RECORD`] bytes (21 bits), at a unit below 2^41 (with
//! 256-byte units, 512 TiB of slab); a file may be up to 2^61 bytes. `word` is never zero (a
//! slab record is at least a header long; a file sets bit 31), which gives `Option<DiskEntry>`
//! the same 28 bytes.

use std::num::NonZeroU32;

use meshcache_store::{Record, StoreKey};

use crate::space::UNIT;

/// The longest record kept in the slab; longer ones get a file of their own.
pub const MAX_SLAB_RECORD: u64 = (1 << 21) - 1;

const FILE: u32 = 1 << 31;
const VARY: u32 = 1 << 30;
const SLAB_LEN_BITS: u32 = 21;
const SLAB_LEN_MASK: u32 = (1 << SLAB_LEN_BITS) - 1;
const UNIT_HIGH_MASK: u32 = (1 << 9) - 1;
const FILE_LEN_HIGH_MASK: u32 = (1 << 29) - 1;

/// Where a record lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// In the slab, from unit `unit`, `len` bytes long.
    Slab {
        /// First unit.
        unit: u64,
        /// Record length in bytes.
        len: u32,
    },
    /// In a file of its own (named after the key), `len` bytes long.
    File {
        /// Record (file) length in bytes.
        len: u64,
    },
}

impl Location {
    /// The record's length in bytes.
    pub fn len(&self) -> u64 {
        match *self {
            Location::Slab { len, .. } => u64::from(len),
            Location::File { len } => len,
        }
    }

    /// Whether the record is empty (never: a record has a header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What it costs the disk's budget: slab records in whole units, files in whole 4 KiB
    /// blocks (what file systems allocate).
    pub fn charge(&self) -> u64 {
        match *self {
            Location::Slab { len, .. } => u64::from(len).next_multiple_of(UNIT),
            Location::File { len } => len.next_multiple_of(4096),
        }
    }
}

/// One object of the disk's index; see the module's documentation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DiskEntry {
    key: StoreKey,
    lo: u32,
    word: NonZeroU32,
    expires: u32,
}

impl std::fmt::Debug for DiskEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskEntry")
            .field("key", &self.key)
            .field("location", &self.location())
            .field("vary", &self.is_vary())
            .field("expires", &self.expires)
            .finish()
    }
}

/// A location that cannot be packed into a [`DiskEntry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a record at {0:?} cannot be indexed (too long or too far into the slab)")]
pub struct Unpackable(pub Location);

impl DiskEntry {
    /// The entry for a record of `key` at `location`.
    ///
    /// # Errors
    ///
    /// `Unpackable` for a slab record longer than `MAX_SLAB_RECORD` or shorter than a
    /// header, a unit at or beyond 2^41, or a file of 2^61 bytes or more.
    pub fn new(
        key: StoreKey,
        location: Location,
        vary: bool,
        expires: u32,
    ) -> Result<DiskEntry, Unpackable> {
        let flags = if vary { VARY } else { 0 };
        let (lo, word) = match location {
            Location::Slab { unit, len } => {
                let fits = unit >> 41 == 0
                    && u64::from(len) <= MAX_SLAB_RECORD
                    && len as usize >= crate::format::HEADER_LEN;
                if !fits {
                    return Err(Unpackable(location));
                }
                let high = ((unit >> 32) as u32) & UNIT_HIGH_MASK;
                (unit as u32, flags | (high << SLAB_LEN_BITS) | len)
            }
            Location::File { len } => {
                if len >> 61 != 0 {
                    return Err(Unpackable(location));
                }
                (
                    len as u32,
                    FILE | flags | ((len >> 32) as u32 & FILE_LEN_HIGH_MASK),
                )
            }
        };
        let word = NonZeroU32::new(word).ok_or(Unpackable(location))?;
        Ok(DiskEntry {
            key,
            lo,
            word,
            expires,
        })
    }

    /// The object's key.
    pub fn key(&self) -> StoreKey {
        self.key
    }

    /// Where its record lies.
    pub fn location(&self) -> Location {
        let word = self.word.get();
        if word & FILE != 0 {
            Location::File {
                len: (u64::from(word & FILE_LEN_HIGH_MASK) << 32) | u64::from(self.lo),
            }
        } else {
            Location::Slab {
                unit: (u64::from((word >> SLAB_LEN_BITS) & UNIT_HIGH_MASK) << 32)
                    | u64::from(self.lo),
                len: word & SLAB_LEN_MASK,
            }
        }
    }

    /// Whether it is a Vary marker rather than a response.
    pub fn is_vary(&self) -> bool {
        self.word.get() & VARY != 0
    }

    /// Fresh until (Unix seconds; 0: not fresh).
    pub fn expires(&self) -> u32 {
        self.expires
    }
}

impl Record for DiskEntry {
    fn key(&self) -> &StoreKey {
        &self.key
    }

    fn size(&self) -> u64 {
        self.location().charge()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn twenty_eight_bytes_with_or_without_option() {
        assert_eq!(std::mem::size_of::<DiskEntry>(), 28);
        assert_eq!(std::mem::size_of::<Option<DiskEntry>>(), 28);
    }

    #[test]
    fn out_of_range_locations_are_refused() {
        let k = StoreKey::get("http://a.test/");
        for bad in [
            Location::Slab {
                unit: 1 << 41,
                len: 100,
            },
            Location::Slab {
                unit: 0,
                len: MAX_SLAB_RECORD as u32 + 1,
            },
            Location::Slab { unit: 0, len: 10 },
            Location::File { len: 1 << 61 },
        ] {
            assert_eq!(DiskEntry::new(k, bad, false, 0), Err(Unpackable(bad)));
        }
    }

    #[test]
    fn charges_whole_units_and_blocks() {
        let slab = Location::Slab { unit: 3, len: 300 };
        assert_eq!(slab.charge(), 512);
        assert_eq!(Location::File { len: 4097 }.charge(), 8192);
    }

    proptest! {
        #[test]
        fn packs_and_unpacks(key: [u8; 16], unit in 0u64..(1 << 41), len in 64u32..=(MAX_SLAB_RECORD as u32),
                             file_len in 0u64..(1 << 61), in_file: bool, vary: bool, expires: u32) {
            let location = if in_file { Location::File { len: file_len } } else { Location::Slab { unit, len } };
            let e = DiskEntry::new(StoreKey(key), location, vary, expires).expect("packs");
            prop_assert_eq!(e.location(), location);
            prop_assert_eq!(e.is_vary(), vary);
            prop_assert_eq!(e.expires(), expires);
            prop_assert_eq!(e.key(), StoreKey(key));
        }
    }
}
