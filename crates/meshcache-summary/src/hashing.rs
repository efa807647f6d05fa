//! Where a key's bits go: the Summary Cache paper's hash functions over the MD5 store key.
//!
//! The paper builds its `k` hash functions from disjoint groups of bits of the URL's MD5: hash
//! function `i` is bits `i·M … (i+1)·M − 1` of the hash, modulo the array size. We hash the
//! 16-byte store key the store already computed (`MD5(method ‖ URL)`, Squid's), so a key costs
//! no further hashing for the first 128 bits. When `k·M` exceeds 128 bits the stream goes on
//! with `MD5(key ‖ key)`, then `MD5(key ‖ key ‖ key)` and so on (the paper: "MD5 of the URL
//! concatenated with itself").
//!
//! Bits are read most significant first: with `k = 4, M = 32` the four functions are the four
//! big-endian words of the key, which is exactly Squid's Cache Digest ([`Hashing::DIGEST`]).

use md5::{Digest, Md5};

/// The most hash functions a summary may use.
pub const MAX_FUNCTIONS: u16 = 32;
/// The most bits one hash function may take.
pub const MAX_FUNCTION_BITS: u16 = 32;

/// A summary's hash functions: how many, and how many bits of the hash stream each takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hashing {
    functions: u16,
    function_bits: u16,
}

/// A key's bit positions (one per hash function; two functions may name the same bit).
#[derive(Clone, Copy, Debug)]
pub struct Positions {
    at: [u64; MAX_FUNCTIONS as usize],
    len: usize,
}

impl Positions {
    /// The positions, in hash-function order.
    pub fn as_slice(&self) -> &[u64] {
        &self.at[..self.len]
    }

    /// The positions, each once.
    pub fn distinct(&self) -> impl Iterator<Item = u64> + '_ {
        let s = self.as_slice();
        (0..s.len())
            .filter(move |&i| !s[..i].contains(&s[i]))
            .map(move |i| s[i])
    }
}

impl Hashing {
    /// Squid's Cache Digest: four functions of 32 bits (the key's four big-endian words).
    pub const DIGEST: Hashing = Hashing {
        functions: 4,
        function_bits: 32,
    };

    /// `functions` hash functions of `function_bits` bits each; `None` outside 1..=32 for
    /// either.
    pub fn new(functions: u16, function_bits: u16) -> Option<Hashing> {
        ((1..=MAX_FUNCTIONS).contains(&functions)
            && (1..=MAX_FUNCTION_BITS).contains(&function_bits))
        .then_some(Hashing {
            functions,
            function_bits,
        })
    }

    /// `functions` hash functions of 32 bits each (`None` outside 1..=32).
    pub fn with_functions(functions: u16) -> Option<Hashing> {
        Hashing::new(functions, 32)
    }

    /// Number of hash functions (`k`).
    pub fn functions(&self) -> u16 {
        self.functions
    }

    /// Bits of the hash stream each function takes (`M`).
    pub fn function_bits(&self) -> u16 {
        self.function_bits
    }

    /// The bit positions of `key` in an array of `bits` bits (`bits` > 0).
    pub fn positions(&self, key: &[u8; 16], bits: u64) -> Positions {
        let bits = bits.max(1);
        let mut at = [0u64; MAX_FUNCTIONS as usize];
        let k = usize::from(self.functions);
        let m = u32::from(self.function_bits);
        if m == 32 && k <= 4 {
            // The common case (and Squid's): whole big-endian words of the key.
            for (i, slot) in at.iter_mut().enumerate().take(k) {
                let w = u32::from_be_bytes([
                    key[4 * i],
                    key[4 * i + 1],
                    key[4 * i + 2],
                    key[4 * i + 3],
                ]);
                *slot = u64::from(w) % bits;
            }
            return Positions { at, len: k };
        }
        let need = (k * m as usize).div_ceil(8);
        // 16 bytes of key, then whole MD5 blocks, plus 8 bytes of slack for the window reads.
        let mut stream = [0u8; 16 * 33 + 8];
        stream[..16].copy_from_slice(key);
        let mut have = 16;
        let mut repeat = 2;
        while have < need {
            let mut h = Md5::new();
            for _ in 0..repeat {
                h.update(key);
            }
            stream[have..have + 16].copy_from_slice(&h.finalize());
            have += 16;
            repeat += 1;
        }
        for (i, slot) in at.iter_mut().enumerate().take(k) {
            let offset = i * m as usize;
            let byte = offset / 8;
            let mut window = [0u8; 8];
            window.copy_from_slice(&stream[byte..byte + 8]);
            let v = u64::from_be_bytes(window) << (offset % 8);
            *slot = (v >> (64 - m)) % bits;
        }
        Positions { at, len: k }
    }
}

impl Default for Hashing {
    fn default() -> Self {
        Hashing::DIGEST
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 16] = [
        0x32, 0x9C, 0xA6, 0x87, 0xBE, 0x79, 0xCA, 0xC3, 0xC4, 0x12, 0x01, 0x3B, 0x6F, 0x70, 0xC4,
        0x5D,
    ];

    #[test]
    fn digest_hashing_is_squids_word_rule() {
        let p = Hashing::DIGEST.positions(&KEY, 256);
        assert_eq!(p.as_slice(), &[135, 195, 59, 93]);
        assert_eq!(
            p.as_slice(),
            crate::digest::bit_positions(&KEY, 256).as_slice()
        );
    }

    #[test]
    fn the_general_path_agrees_with_the_word_path() {
        // Eight 16-bit functions read the same stream as the halves of the four words.
        let h = Hashing::new(8, 16).expect("valid");
        let p = h.positions(&KEY, 1 << 16);
        assert_eq!(
            p.as_slice(),
            &[0x329C, 0xA687, 0xBE79, 0xCAC3, 0xC412, 0x013B, 0x6F70, 0xC45D]
        );
        // Odd widths cross byte boundaries: 12 bits each.
        let h = Hashing::new(3, 12).expect("valid");
        assert_eq!(
            h.positions(&KEY, 1 << 20).as_slice(),
            &[0x329, 0xCA6, 0x87B]
        );
    }

    #[test]
    fn beyond_128_bits_the_stream_continues_with_md5_of_the_doubled_key() {
        let h = Hashing::new(6, 32).expect("valid");
        let p = h.positions(&KEY, u64::from(u32::MAX) + 1);
        let mut doubled = Md5::new();
        doubled.update(KEY);
        doubled.update(KEY);
        let ext = doubled.finalize();
        let w = |b: &[u8]| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        assert_eq!(p.as_slice()[4], w(&ext[0..4]));
        assert_eq!(p.as_slice()[5], w(&ext[4..8]));
        // The most the stream can need: 32 functions of 32 bits.
        let h = Hashing::new(32, 32).expect("valid");
        assert_eq!(h.positions(&KEY, 1000).as_slice().len(), 32);
    }

    #[test]
    fn bounds() {
        assert!(Hashing::new(0, 32).is_none());
        assert!(Hashing::new(33, 32).is_none());
        assert!(Hashing::new(4, 0).is_none());
        assert!(Hashing::new(4, 33).is_none());
        assert!(Hashing::new(32, 1).is_some());
    }
}
