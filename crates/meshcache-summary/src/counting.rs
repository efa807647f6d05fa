//! The counting Bloom filter a node keeps over its own store: the Summary
//! Cache paper's local summary.
//!
//! One 4-bit counter per bit of the published summary (the paper shows 4
//! bits suffice: at the optimal number of hash functions the chance that a
//! counter ever reaches 16 is about 1.4 × 10⁻¹⁵). Adding a key increments
//! its four counters, removing one decrements them; a bit of the summary is
//! set while its counter is non-zero. A counter that reaches 15 saturates:
//! it is never decremented again (removing could otherwise clear a bit other
//! keys still need, a false miss), and saturations are counted.
//!
//! Bit positions come from a [`Hashing`] over the MD5 store key. With the
//! default ([`Hashing::DIGEST`]: the key's four big-endian words, modulo the
//! number of bits) a snapshot is directly a [`CacheDigest`] that Squid can
//! read. Every change of a bit (0→1 or 1→0) is reported, for the delta
//! updates a summary protocol sends.

use crate::digest::CacheDigest;
use crate::hashing::Hashing;

/// The largest counter value; a counter there is stuck.
pub const SATURATED: u8 = 15;

/// A bit of the summary that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitChange {
    /// The bit's index.
    pub bit: u64,
    /// Its new value.
    pub set: bool,
}

/// A counting Bloom filter with 4-bit counters (two per byte).
#[derive(Clone, Debug)]
pub struct CountingBloom {
    /// Packed counters: bit `b`'s counter is the low nibble of byte `b / 2` for even `b`.
    counters: Vec<u8>,
    bits: u64,
    hashing: Hashing,
    capacity: u32,
    bits_per_entry: u8,
    entries: u64,
    saturated: u64,
}

impl CountingBloom {
    /// A filter sized for `capacity` entries at `bits_per_entry` bits each (the mask is rounded
    /// up to whole bytes, as a Cache Digest's is).
    pub fn new(capacity: u32, bits_per_entry: u8) -> CountingBloom {
        CountingBloom::with_hashing(capacity, bits_per_entry, Hashing::DIGEST)
    }

    /// As [`CountingBloom::new`], with other hash functions.
    pub fn with_hashing(capacity: u32, bits_per_entry: u8, hashing: Hashing) -> CountingBloom {
        let empty = CacheDigest::new(capacity, bits_per_entry);
        let bits = empty.mask().len() as u64 * 8;
        CountingBloom {
            counters: vec![0; bits.div_ceil(2) as usize],
            bits,
            hashing,
            capacity: empty.capacity(),
            bits_per_entry: empty.bits_per_entry(),
            entries: 0,
            saturated: 0,
        }
    }

    fn counter(&self, bit: u64) -> u8 {
        let byte = self.counters[(bit / 2) as usize];
        if bit % 2 == 0 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    }

    fn set_counter(&mut self, bit: u64, v: u8) {
        let byte = &mut self.counters[(bit / 2) as usize];
        if bit % 2 == 0 {
            *byte = (*byte & 0xF0) | v;
        } else {
            *byte = (*byte & 0x0F) | (v << 4);
        }
    }

    /// Adds a key; `changed` receives the bits that went from 0 to 1.
    pub fn add(&mut self, key: &[u8; 16], changed: &mut Vec<BitChange>) {
        self.entries += 1;
        for bit in self.hashing.positions(key, self.bits).distinct() {
            let c = self.counter(bit);
            match c {
                0 => {
                    self.set_counter(bit, 1);
                    changed.push(BitChange { bit, set: true });
                }
                SATURATED => {}
                _ => {
                    self.set_counter(bit, c + 1);
                    if c + 1 == SATURATED {
                        self.saturated += 1;
                    }
                }
            }
        }
    }

    /// Removes a key that was added; `changed` receives the bits that went from 1 to 0.
    /// Removing a key that was never added corrupts nothing that is not already wrong: a
    /// counter at 0 stays at 0.
    pub fn remove(&mut self, key: &[u8; 16], changed: &mut Vec<BitChange>) {
        self.entries = self.entries.saturating_sub(1);
        for bit in self.hashing.positions(key, self.bits).distinct() {
            match self.counter(bit) {
                0 | SATURATED => {}
                1 => {
                    self.set_counter(bit, 0);
                    changed.push(BitChange { bit, set: false });
                }
                c => self.set_counter(bit, c - 1),
            }
        }
    }

    /// Whether the key may be present.
    pub fn contains(&self, key: &[u8; 16]) -> bool {
        self.hashing
            .positions(key, self.bits)
            .as_slice()
            .iter()
            .all(|&b| self.counter(b) != 0)
    }

    /// Keys currently counted.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Counters that reached 15 and are stuck there.
    pub fn saturated(&self) -> u64 {
        self.saturated
    }

    /// Bits in the summary.
    pub fn bits(&self) -> u64 {
        self.bits
    }

    /// Memory of the counters, in bytes.
    pub fn memory(&self) -> usize {
        self.counters.len()
    }

    /// Entries the filter was sized for.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Bits per entry the filter was sized with.
    pub fn bits_per_entry(&self) -> u8 {
        self.bits_per_entry
    }

    /// The hash functions.
    pub fn hashing(&self) -> Hashing {
        self.hashing
    }

    /// Whether bit `b` of the summary is set (its counter is non-zero).
    pub fn is_set(&self, bit: u64) -> bool {
        bit < self.bits && self.counter(bit) != 0
    }

    /// The summary's bit mask (bit set where the counter is non-zero), least significant bit
    /// first in each byte.
    pub fn mask(&self) -> Vec<u8> {
        let mut mask = vec![0u8; self.bits.div_ceil(8) as usize];
        let mut put = |i: usize, pair: u8| {
            if pair & 0x0F != 0 {
                let bit = 2 * i as u64;
                mask[(bit >> 3) as usize] |= 1 << (bit & 7);
            }
            if pair & 0xF0 != 0 {
                let bit = 2 * i as u64 + 1;
                mask[(bit >> 3) as usize] |= 1 << (bit & 7);
            }
        };
        // Sixteen counters (eight bytes) at a time: a cache far from full has mostly zero
        // counters, and a zero word sets no bit.
        let mut words = self.counters.chunks_exact(8);
        for (w, word) in words.by_ref().enumerate() {
            if word.iter().fold(0, |acc, &b| acc | b) == 0 {
                continue;
            }
            for (j, &pair) in word.iter().enumerate() {
                put(8 * w + j, pair);
            }
        }
        let done = self.counters.len() - words.remainder().len();
        for (j, &pair) in words.remainder().iter().enumerate() {
            put(done + j, pair);
        }
        mask
    }

    /// The summary as a Cache Digest (bit set where the counter is non-zero). Squid reads it
    /// only when the hashing is [`Hashing::DIGEST`].
    pub fn snapshot(&self) -> CacheDigest {
        let count = u32::try_from(self.entries).unwrap_or(u32::MAX);
        CacheDigest::from_parts(self.capacity, count, self.bits_per_entry, self.mask())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        // Spread the words so the positions differ.
        for (j, chunk) in k.chunks_mut(4).enumerate() {
            chunk.copy_from_slice(
                &(i.wrapping_mul(2_654_435_761).rotate_left(j as u32 * 7)).to_be_bytes(),
            );
        }
        k
    }

    #[test]
    fn the_mask_has_a_bit_for_each_counter_that_is_not_zero() {
        // Sizes whose counters end in a partial word, filled sparsely and densely.
        for (capacity, docs) in [(7, 3), (100, 5), (100, 300), (333, 40)] {
            let mut f = CountingBloom::new(capacity, 5);
            let mut changes = Vec::new();
            for i in 0..docs {
                f.add(&key(i), &mut changes);
            }
            let mask = f.mask();
            assert_eq!(mask.len() as u64, f.bits().div_ceil(8));
            for b in 0..mask.len() as u64 * 8 {
                let in_mask = mask[(b >> 3) as usize] & (1 << (b & 7)) != 0;
                assert_eq!(in_mask, f.is_set(b), "capacity {capacity}, bit {b}");
            }
        }
    }

    #[test]
    fn add_remove_round_trip_and_changes() {
        let mut f = CountingBloom::new(100, 8);
        let mut changes = Vec::new();
        for i in 0..50 {
            f.add(&key(i), &mut changes);
        }
        let set: usize = changes.iter().filter(|c| c.set).count();
        assert_eq!(set as u64, f.snapshot().bits_set());
        assert!((0..50).all(|i| f.contains(&key(i))));
        changes.clear();
        for i in 0..50 {
            f.remove(&key(i), &mut changes);
        }
        assert_eq!(changes.len(), set, "every set bit is cleared once");
        assert!(changes.iter().all(|c| !c.set));
        assert_eq!(f.snapshot().bits_set(), 0);
        assert_eq!(f.entries(), 0);
    }

    #[test]
    fn snapshot_is_the_digest_of_the_same_keys() {
        let mut f = CountingBloom::new(64, 5);
        let mut d = CacheDigest::new(64, 5);
        let mut sink = Vec::new();
        for i in 0..64 {
            f.add(&key(i), &mut sink);
            d.add(&key(i));
        }
        assert_eq!(f.snapshot(), d);
    }

    #[test]
    fn saturated_counters_never_clear() {
        let mut f = CountingBloom::new(1, 8);
        let k = key(7);
        let mut sink = Vec::new();
        for _ in 0..20 {
            f.add(&k, &mut sink);
        }
        assert!(f.saturated() > 0);
        for _ in 0..20 {
            f.remove(&k, &mut sink);
        }
        assert!(f.contains(&k), "a saturated counter keeps its bit");
    }
}
