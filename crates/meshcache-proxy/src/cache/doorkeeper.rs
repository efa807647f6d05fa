//! Which disk objects earn a copy in memory: those read from disk twice within a while, one
//! in four of them.
//!
//! Copying every small object read from disk back into memory costs a memory insert and an
//! eviction per disk hit, paid in full when the disk's working set is much larger than memory
//! and most objects are read once in a long while (9 % of the CPU of a 1 KiB disk hit, in a
//! profile of uniformly random hits over 50,000 objects). An object read a second time is
//! likelier to be read again (the doorkeeper of TinyLFU); and of those, one in four is promoted,
//! so that an object read often gets into memory within a few reads while a large set read
//! uniformly costs a quarter of the inserts. The filter is a fixed bitmap indexed by bits of the
//! key (an MD5, already uniform), cleared once half full, so "within a while" is the last few
//! hundred thousand disk reads; a false positive only promotes an object early.

use meshcache_store::StoreKey;

/// Bits in the filter: 2^20 (128 KiB).
const BITS: usize = 1 << 20;

/// The filter; see the [module documentation](self).
pub(crate) struct Doorkeeper {
    words: Box<[u64]>,
    set: usize,
    /// Second reads so far: every fourth promotes.
    again: u64,
}

impl Doorkeeper {
    pub(crate) fn new() -> Doorkeeper {
        Doorkeeper {
            words: vec![0; BITS / 64].into_boxed_slice(),
            set: 0,
            again: 0,
        }
    }

    /// Notes a disk read of `key`; whether it earns a copy in memory (read before, within the
    /// filter's memory, and its turn among such reads).
    pub(crate) fn admit(&mut self, key: &StoreKey) -> bool {
        if !self.seen_again(key) {
            return false;
        }
        self.again += 1;
        self.again % 4 == 0
    }

    /// Notes a disk read of `key`; whether it was read before (within the filter's memory).
    fn seen_again(&mut self, key: &StoreKey) -> bool {
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
    fn one_second_read_in_four_is_admitted() {
        let mut d = Doorkeeper::new();
        let keys: Vec<StoreKey> = (0..8)
            .map(|i| StoreKey::get(&format!("http://a.test/{i}")))
            .collect();
        for k in &keys {
            assert!(!d.admit(k), "a first read");
        }
        let admitted = keys.iter().filter(|k| d.admit(k)).count();
        assert_eq!(admitted, 2);
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
