//! Least Frequently Used with Dynamic Aging (Arlitt et al.; Squid's
//! `heap LFUDA`).
//!
//! Every entry has priority `K = L + freq`, independent of size and cost;
//! the entry with the lowest `K` is evicted and `L` becomes its `K`, so
//! entries that were popular long ago eventually age out. Large popular
//! objects are kept as readily as small ones, which favours the byte hit
//! ratio.

use super::heap::{HeapPolicy, Priority};

/// The LFUDA priority function.
#[derive(Debug)]
pub(crate) struct LfudaPriority;

impl Priority for LfudaPriority {
    fn priority(age: f64, freq: u32, _size: u64) -> f64 {
        age + f64::from(freq)
    }
}

/// LFUDA bookkeeping.
pub(crate) type Lfuda = HeapPolicy<LfudaPriority>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn frequent_beats_recent_and_size_is_ignored() {
        let mut lfuda = Lfuda::new();
        lfuda.admit(0, 1_000_000);
        lfuda.touch(0, 1_000_000); // K = 2
        lfuda.admit(1, 1); // K = 1
        lfuda.admit(2, 1); // K = 1
        assert_eq!(lfuda.evict(), Some(1));
        assert_eq!(lfuda.age(), 1.0);
        lfuda.admit(3, 1); // K = 2, newer than slot 0's hit
        assert_eq!(lfuda.evict(), Some(2));
        assert_eq!(lfuda.evict(), Some(0));
        assert_eq!(lfuda.evict(), Some(3));
    }
}
