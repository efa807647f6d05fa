//! Which disk objects earn a copy in memory: those read from disk twice within a while.
//!
//! Copying every small object read from disk back into memory costs a memory insert and an
//! eviction per disk hit, paid in full when the disk's working set is much larger than memory
//! and most objects are read once in a long while (9 % of the CPU of a 1 KiB disk hit, in a
//! profile of uniformly random hits over 50,000 objects). An object read a second time is
//! likelier to be read again: it is promoted then (the doorkeeper of TinyLFU). The filter is a
//! fixed bitmap indexed by bits of the key (an MD5, already uniform), cleared once half full, so
//! "within a while" is the last few hundred thousand disk reads; a false positive only promotes
//! an object one read early.

use meshcache_store::StoreKey;

/// Bits in the filter: 2^20 (128 KiB).
const BITS: usize = 1 << 20;

/// The filter; see the [module documentation](self).
pub(crate) struct Doorkeeper {
    words: Box<[u64]>,
    set: usize,
}

impl Doorkeeper {
    pub(crate) fn new() -> Doorkeeper {
        Doorkeeper {
            words: vec![0; BITS / 64].into_boxed_slice(),
            set: 0,
        }
    }

    /// Notes a disk read of `key`; whether it was read before (within the filter's memory).
    pub(crate) fn seen_again(&mut self, key: &StoreKey) -> bool {
        let mut word = [0u8; 8];
        word.copy_from_slice(&key.0[8..]);
        let bit = (u64::from_le_bytes(word) as usize) & (BITS - 1);
        let (w, mask) = (bit / 64, 1u64 << (bit % 64));
        if self.words[w] & mask != 0 {
            return true;
        }
        self.words[w] |= mask;
        self.set += 1;
        if self.set > BITS / 2 {
            self.words.fill(0);
            self.set = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_read_is_let_in() {
        let mut d = Doorkeeper::new();
        let k = StoreKey::get("http://a.test/");
        assert!(!d.seen_again(&k));
        assert!(d.seen_again(&k));
        let other = StoreKey::get("http://a.test/other");
        assert!(!d.seen_again(&other));
    }

    #[test]
    fn it_forgets_once_half_full() {
        let mut d = Doorkeeper::new();
        let k = StoreKey::get("http://a.test/");
        d.seen_again(&k);
        for i in 0..BITS {
            d.seen_again(&StoreKey::get(&format!("http://a.test/{i}")));
        }
        assert!(d.set <= BITS / 2);
    }
}
