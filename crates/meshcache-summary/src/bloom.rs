//! A neighbour's summary as we keep it: a plain Bloom bit array with its hash functions.
//!
//! It is built from whatever the neighbour sent — a Squid Cache Digest, or a Summary Cache
//! full array — and then kept current by delta updates (idempotent "set bit b to v" words). A
//! lookup is "maybe present" when every one of the key's positions is set.

use crate::digest::{bloom_fp_rate, CacheDigest};
use crate::hashing::{Hashing, Positions};

/// A Bloom filter bit array (least significant bit first in each byte, as Squid's).
#[derive(Clone, PartialEq, Eq)]
pub struct BloomArray {
    hashing: Hashing,
    bits: u64,
    mask: Vec<u8>,
    entries: u64,
    set: u64,
}

impl std::fmt::Debug for BloomArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BloomArray")
            .field("hashing", &self.hashing)
            .field("bits", &self.bits)
            .field("entries", &self.entries)
            .field("fill", &self.fill())
            .finish()
    }
}

impl BloomArray {
    /// An array of `bits` bits from `mask` (which must hold at least `bits` bits; extra bits
    /// are ignored), summarising `entries` documents.
    pub fn from_mask(hashing: Hashing, bits: u64, mut mask: Vec<u8>, entries: u64) -> BloomArray {
        let bits = bits.max(1);
        mask.resize(bits.div_ceil(8) as usize, 0);
        if bits % 8 != 0 {
            if let Some(last) = mask.last_mut() {
                *last &= (1u8 << (bits % 8)) - 1;
            }
        }
        let set = mask.iter().map(|b| u64::from(b.count_ones())).sum();
        BloomArray {
            hashing,
            bits,
            mask,
            entries,
            set,
        }
    }

    /// The array a Cache Digest describes.
    pub fn from_digest(d: &CacheDigest) -> BloomArray {
        BloomArray::from_mask(
            Hashing::DIGEST,
            d.mask().len() as u64 * 8,
            d.mask().to_vec(),
            u64::from(d.count()),
        )
    }

    /// Whether `key` may be present.
    pub fn contains(&self, key: &[u8; 16]) -> bool {
        self.contains_at(&self.hashing.positions(key, self.bits))
    }

    /// Whether the key at `positions` (its [`Hashing::positions`] for this array's hashing
    /// and size: a caller looking one key up in many arrays of one shape computes them once)
    /// may be present.
    pub fn contains_at(&self, positions: &Positions) -> bool {
        positions.as_slice().iter().all(|&b| self.get(b))
    }

    /// Bit `b` (false beyond the array).
    pub fn get(&self, b: u64) -> bool {
        b < self.bits && self.mask[(b >> 3) as usize] & (1 << (b & 7)) != 0
    }

    /// Sets bit `b` to `value`; false (and no change) when `b` is beyond the array.
    pub fn put(&mut self, b: u64, value: bool) -> bool {
        if b >= self.bits {
            return false;
        }
        let byte = &mut self.mask[(b >> 3) as usize];
        let bit = 1u8 << (b & 7);
        let was = *byte & bit != 0;
        if value && !was {
            *byte |= bit;
            self.set += 1;
        } else if !value && was {
            *byte &= !bit;
            self.set -= 1;
        }
        true
    }

    /// The number of documents the bits set imply: `−(m/k)·ln(1 − X/m)` for `X` of `m` bits
    /// set (the usual estimate; exact while no two documents share a bit).
    pub fn estimated_entries(&self) -> u64 {
        let m = self.bits as f64;
        let k = f64::from(self.hashing.functions());
        let x = (self.set as f64).min(m - 1.0);
        (-(m / k) * (1.0 - x / m).ln()).round() as u64
    }

    /// Updates the number of documents the sender says it summarises.
    pub fn set_entries(&mut self, entries: u64) {
        self.entries = entries;
    }

    /// The hash functions.
    pub fn hashing(&self) -> Hashing {
        self.hashing
    }

    /// Size in bits.
    pub fn bits(&self) -> u64 {
        self.bits
    }

    /// The mask bytes.
    pub fn mask(&self) -> &[u8] {
        &self.mask
    }

    /// Documents summarised, as the sender counted them.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bits set.
    pub fn bits_set(&self) -> u64 {
        self.set
    }

    /// Share of bits set.
    pub fn fill(&self) -> f64 {
        self.set as f64 / self.bits as f64
    }

    /// The false-positive rate the fill implies: `fill^k`.
    pub fn fill_fp_rate(&self) -> f64 {
        self.fill().powi(i32::from(self.hashing.functions()))
    }

    /// The Bloom formula's false-positive rate, `(1 − e^(−k·n/m))^k`, for the entries the
    /// sender reported.
    pub fn formula_fp_rate(&self) -> f64 {
        bloom_fp_rate(self.entries, self.bits, u32::from(self.hashing.functions()))
    }

    /// Memory held, in bytes.
    pub fn memory(&self) -> usize {
        self.mask.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_reads_the_same_through_the_array() {
        let mut d = CacheDigest::new(100, 8);
        let keys: Vec<[u8; 16]> = (0u8..60).map(|i| [i.wrapping_mul(37); 16]).collect();
        for (i, k) in keys.iter().enumerate() {
            let mut k = *k;
            k[3] = i as u8;
            d.add(&k);
        }
        let a = BloomArray::from_digest(&d);
        assert_eq!(a.bits_set(), d.bits_set());
        for i in 0u32..2000 {
            let mut k = [0u8; 16];
            k[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
            k[4..8].copy_from_slice(&i.rotate_left(9).to_be_bytes());
            k[8..12].copy_from_slice(&(!i).to_be_bytes());
            k[12..].copy_from_slice(&i.wrapping_mul(40503).to_be_bytes());
            assert_eq!(a.contains(&k), d.contains(&k));
        }
    }

    #[test]
    fn put_counts_and_ignores_out_of_range() {
        let mut a = BloomArray::from_mask(Hashing::DIGEST, 10, vec![0xFF, 0xFF], 0);
        assert_eq!(
            a.bits_set(),
            10,
            "padding bits beyond the array are dropped"
        );
        assert!(a.put(3, false));
        assert!(a.put(3, false), "idempotent");
        assert_eq!(a.bits_set(), 9);
        assert!(!a.put(10, true));
        assert!(!a.get(10));
        assert!(a.put(3, true));
        assert_eq!(a.bits_set(), 10);
    }
}
