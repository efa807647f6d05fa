//! Squid's Cache Digest: a Bloom filter over a cache's store keys, in the
//! exact format Squid 5 serves at `/squid-internal-periodic/store_digest`.
//!
//! * **Bits.** A store key (16 bytes, `MD5(method ‖ URL)`) is read as four
//!   big-endian 32-bit words; each, modulo the number of bits in the mask,
//!   names one bit. Bit `b` is `mask[b >> 3] & (1 << (b & 7))` (least
//!   significant bit first). Four hash functions, always.
//! * **Size.** The mask holds `(capacity × bits_per_entry + 7) / 8` bytes;
//!   Squid's default is 5 bits per entry.
//! * **Wire.** A 128-byte control block (big-endian: version 5, required
//!   version 3, capacity, count, del_count, mask size, bits per entry, hash
//!   function count 4, the rest zero) followed by the mask.
//!
//! [`CacheDigest::decode`] applies Squid's receiver checks, in Squid's
//! order, and one more: a digest with more than 65 % of its bits set is
//! useless (it says "hit" for almost everything) and is refused, so a bad
//! summary can never make a peer look like it holds everything. Decoding is
//! pure and never panics.

use std::fmt;

/// Length of the control block.
pub const CBLOCK_LEN: usize = 128;
/// The digest version we write (Squid 5's).
pub const VERSION: u16 = 5;
/// The oldest version that can read what we write.
pub const REQUIRED_VERSION: u16 = 3;
/// Hash functions per key, always.
pub const HASH_FUNCS: u8 = 4;
/// Squid's default bits per entry.
pub const DEFAULT_BITS_PER_ENTRY: u8 = 5;
/// Digests with more bits set than this share are refused.
pub const MAX_FILL: f64 = 0.65;
/// The largest capacity Squid accepts for a given bits per entry is `(2^31 − 9) / bpe`.
const MAX_CAPACITY_BITS: u64 = (1 << 31) - 9;

/// Why a digest was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DigestError {
    /// Shorter than the control block.
    #[error("truncated control block: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A version we cannot read, or one that cannot read us.
    #[error("unsupported digest version {current} (requires {required}); we read 3..=5")]
    Version {
        /// The sender's version.
        current: u16,
        /// The oldest version that can read it.
        required: u16,
    },
    /// A field that cannot be right.
    #[error("corrupt digest: {0}")]
    Corrupt(&'static str),
    /// `mask_size` disagrees with capacity and bits per entry.
    #[error("mask size {got} does not match capacity {capacity} × {bits_per_entry} bits (expected {expected})")]
    MaskSize {
        /// The field's value.
        got: u32,
        /// What the formula gives.
        expected: u64,
        /// The capacity field.
        capacity: u32,
        /// The bits-per-entry field.
        bits_per_entry: u8,
    },
    /// Not four hash functions.
    #[error("digest uses {0} hash functions; only 4 are supported")]
    HashFuncs(u8),
    /// The mask is shorter or longer than announced.
    #[error("mask is {have} bytes, the control block announces {need}")]
    MaskLength {
        /// Announced.
        need: usize,
        /// Present.
        have: usize,
    },
    /// Too many bits set to be of use.
    #[error("useless digest: {:.1}% of its bits are set (at most 65%)", fill * 100.0)]
    TooFull {
        /// Share of bits set.
        fill: f64,
    },
}

/// A Cache Digest: a bit mask and the control block's figures.
#[derive(Clone, PartialEq, Eq)]
pub struct CacheDigest {
    capacity: u32,
    count: u32,
    del_count: u32,
    bits_per_entry: u8,
    mask: Vec<u8>,
}

impl fmt::Debug for CacheDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheDigest")
            .field("capacity", &self.capacity)
            .field("count", &self.count)
            .field("del_count", &self.del_count)
            .field("bits_per_entry", &self.bits_per_entry)
            .field("mask_bytes", &self.mask.len())
            .field("fill", &self.fill())
            .finish()
    }
}

/// The mask length Squid computes for a capacity and bits per entry.
pub fn mask_size(capacity: u32, bits_per_entry: u8) -> u64 {
    (u64::from(capacity) * u64::from(bits_per_entry)).div_ceil(8)
}

/// The four bit positions of `key` in a mask of `bits` bits.
pub fn bit_positions(key: &[u8; 16], bits: u64) -> [u64; 4] {
    let word = |i: usize| {
        u64::from(u32::from_be_bytes([
            key[i],
            key[i + 1],
            key[i + 2],
            key[i + 3],
        ]))
    };
    [
        word(0) % bits,
        word(4) % bits,
        word(8) % bits,
        word(12) % bits,
    ]
}

impl CacheDigest {
    /// An empty digest sized for `capacity` entries (at least 1) at `bits_per_entry` (at least
    /// 1), capped where Squid caps it.
    pub fn new(capacity: u32, bits_per_entry: u8) -> CacheDigest {
        let bits_per_entry = bits_per_entry.max(1);
        let max = (MAX_CAPACITY_BITS / u64::from(bits_per_entry)) as u32;
        let capacity = capacity.clamp(1, max);
        CacheDigest {
            capacity,
            count: 0,
            del_count: 0,
            bits_per_entry,
            mask: vec![0; mask_size(capacity, bits_per_entry) as usize],
        }
    }

    /// A digest from a mask built elsewhere (a counting filter's snapshot).
    pub(crate) fn from_parts(capacity: u32, count: u32, bits_per_entry: u8, mask: Vec<u8>) -> Self {
        CacheDigest {
            capacity,
            count,
            del_count: 0,
            bits_per_entry,
            mask,
        }
    }

    fn bits(&self) -> u64 {
        self.mask.len() as u64 * 8
    }

    /// Adds a key.
    pub fn add(&mut self, key: &[u8; 16]) {
        for b in bit_positions(key, self.bits()) {
            self.mask[(b >> 3) as usize] |= 1 << (b & 7);
        }
        self.count = self.count.saturating_add(1);
    }

    /// Whether the key may be present (all four bits set).
    pub fn contains(&self, key: &[u8; 16]) -> bool {
        bit_positions(key, self.bits())
            .iter()
            .all(|&b| self.mask[(b >> 3) as usize] & (1 << (b & 7)) != 0)
    }

    /// Entries the mask was sized for.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries added (as the sender counted them).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Deletions the sender saw since its last rebuild.
    pub fn del_count(&self) -> u32 {
        self.del_count
    }

    /// Bits per entry the mask was sized with.
    pub fn bits_per_entry(&self) -> u8 {
        self.bits_per_entry
    }

    /// The mask.
    pub fn mask(&self) -> &[u8] {
        &self.mask
    }

    /// Bits set.
    pub fn bits_set(&self) -> u64 {
        self.mask.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// Share of bits set.
    pub fn fill(&self) -> f64 {
        self.bits_set() as f64 / self.bits() as f64
    }

    /// The false-positive rate the fill implies: `fill^4`.
    pub fn observed_fp_rate(&self) -> f64 {
        self.fill().powi(i32::from(HASH_FUNCS))
    }

    /// The Bloom formula's false-positive rate for `count` entries in this mask:
    /// `(1 − e^(−k·n/m))^k`.
    pub fn expected_fp_rate(&self) -> f64 {
        bloom_fp_rate(u64::from(self.count), self.bits(), u32::from(HASH_FUNCS))
    }

    /// The digest as Squid serves it: control block, then mask.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CBLOCK_LEN + self.mask.len());
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&REQUIRED_VERSION.to_be_bytes());
        out.extend_from_slice(&self.capacity.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.del_count.to_be_bytes());
        out.extend_from_slice(&(self.mask.len() as u32).to_be_bytes());
        out.push(self.bits_per_entry);
        out.push(HASH_FUNCS);
        out.resize(CBLOCK_LEN, 0);
        out.extend_from_slice(&self.mask);
        out
    }

    /// Reads a digest as Squid's receiver does (see the module docs).
    pub fn decode(body: &[u8]) -> Result<CacheDigest, DigestError> {
        let header = body.get(..CBLOCK_LEN).ok_or(DigestError::Truncated {
            need: CBLOCK_LEN,
            have: body.len(),
        })?;
        let u16_at = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
        let u32_at =
            |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let current = u16_at(0);
        let required = u16_at(2);
        if required > VERSION || current < REQUIRED_VERSION {
            return Err(DigestError::Version { current, required });
        }
        if required > current {
            return Err(DigestError::Corrupt(
                "required version above current version",
            ));
        }
        // On the wire these are signed 32-bit: a value with the top bit set is negative.
        let (capacity, count, del_count, mask_len) = (u32_at(4), u32_at(8), u32_at(12), u32_at(16));
        let (bits_per_entry, hash_funcs) = (header[20], header[21]);
        if mask_len == 0 || mask_len > i32::MAX as u32 {
            return Err(DigestError::Corrupt("mask size is not positive"));
        }
        if capacity == 0 || capacity > i32::MAX as u32 {
            return Err(DigestError::Corrupt("capacity is not positive"));
        }
        if bits_per_entry == 0 {
            return Err(DigestError::Corrupt("bits per entry is zero"));
        }
        if hash_funcs == 0 {
            return Err(DigestError::Corrupt("hash function count is zero"));
        }
        let expected = mask_size(capacity, bits_per_entry);
        if u64::from(mask_len) != expected {
            return Err(DigestError::MaskSize {
                got: mask_len,
                expected,
                capacity,
                bits_per_entry,
            });
        }
        if hash_funcs != HASH_FUNCS {
            return Err(DigestError::HashFuncs(hash_funcs));
        }
        let mask = &body[CBLOCK_LEN..];
        if mask.len() != mask_len as usize {
            return Err(DigestError::MaskLength {
                need: mask_len as usize,
                have: mask.len(),
            });
        }
        let digest = CacheDigest {
            capacity,
            count,
            del_count,
            bits_per_entry,
            mask: mask.to_vec(),
        };
        let fill = digest.fill();
        if fill > MAX_FILL {
            return Err(DigestError::TooFull { fill });
        }
        Ok(digest)
    }
}

/// `(1 − e^(−k·n/m))^k`: the false-positive rate of a Bloom filter of `m` bits holding `n`
/// entries with `k` hash functions.
pub fn bloom_fp_rate(n: u64, m: u64, k: u32) -> f64 {
    if m == 0 {
        return 1.0;
    }
    let k = f64::from(k);
    (1.0 - (-k * n as f64 / m as f64).exp()).powf(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_spec() {
        // Key 329CA687 BE79CAC3 C412013B 6F70C45D in a 256-bit mask → bits 135, 195, 59, 93.
        let key = [
            0x32, 0x9C, 0xA6, 0x87, 0xBE, 0x79, 0xCA, 0xC3, 0xC4, 0x12, 0x01, 0x3B, 0x6F, 0x70,
            0xC4, 0x5D,
        ];
        assert_eq!(bit_positions(&key, 256), [135, 195, 59, 93]);
        let mut d = CacheDigest::new(51, 5);
        assert_eq!(d.mask().len(), 32);
        d.add(&key);
        assert!(d.contains(&key));
        assert_eq!(d.mask()[135 >> 3], 1 << (135 & 7));
        assert_eq!(d.bits_set(), 4);
    }

    #[test]
    fn control_block_matches_squid() {
        // Squid 5.7's own block for capacity 51, count 52, 32-byte mask.
        let mut d = CacheDigest::new(51, 5);
        d.count = 52;
        let wire = d.encode();
        assert_eq!(
            &wire[..24],
            &[0, 5, 0, 3, 0, 0, 0, 0x33, 0, 0, 0, 0x34, 0, 0, 0, 0, 0, 0, 0, 0x20, 5, 4, 0, 0]
        );
        assert!(wire[24..CBLOCK_LEN].iter().all(|&b| b == 0));
        assert_eq!(wire.len(), CBLOCK_LEN + 32);
        assert_eq!(CacheDigest::decode(&wire), Ok(d));
    }

    #[test]
    fn receiver_checks() {
        let good = CacheDigest::new(100, 5).encode();
        let with = |i: usize, v: &[u8]| {
            let mut w = good.clone();
            w[i..i + v.len()].copy_from_slice(v);
            CacheDigest::decode(&w)
        };
        assert!(matches!(
            CacheDigest::decode(&good[..100]),
            Err(DigestError::Truncated {
                need: 128,
                have: 100
            })
        ));
        assert!(matches!(with(2, &[0, 6]), Err(DigestError::Version { .. })));
        assert!(matches!(with(0, &[0, 2]), Err(DigestError::Version { .. })));
        assert!(matches!(
            with(0, &[0, 3, 0, 4]),
            Err(DigestError::Corrupt(_))
        ));
        assert!(matches!(
            with(4, &[0, 0, 0, 0]),
            Err(DigestError::Corrupt(_))
        ));
        assert!(matches!(
            with(4, &[0x80, 0, 0, 1]),
            Err(DigestError::Corrupt(_))
        ));
        assert!(matches!(with(20, &[0]), Err(DigestError::Corrupt(_))));
        assert!(matches!(
            with(16, &[0, 0, 0, 64]),
            Err(DigestError::MaskSize { expected: 63, .. })
        ));
        assert!(matches!(with(21, &[3]), Err(DigestError::HashFuncs(3))));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            CacheDigest::decode(&long),
            Err(DigestError::MaskLength { .. })
        ));
        assert!(matches!(
            CacheDigest::decode(&good[..good.len() - 1]),
            Err(DigestError::MaskLength { .. })
        ));
        let mut full = good.clone();
        for b in &mut full[CBLOCK_LEN..] {
            *b = 0xFF;
        }
        assert!(matches!(
            CacheDigest::decode(&full),
            Err(DigestError::TooFull { .. })
        ));
    }

    #[test]
    fn bloom_formula() {
        // 91 entries, 464 bits, 4 hashes: 8.7 % (the vector's README).
        let p = bloom_fp_rate(91, 464, 4);
        assert!((p - 0.087).abs() < 0.001, "{p}");
    }
}
