//! Greedy-Dual-Size-Frequency (Cherkasova, 1998; Squid's `heap GDSF`).
//!
//! Every entry has priority `K = L + freq × cost / size` with `cost = 1`
//! (so `K = L + freq / size`); the entry with the lowest `K` is evicted and
//! `L` becomes its `K`. A hit increments `freq` and recomputes `K` with the
//! current `L`. Small, popular objects therefore stay longest: the policy
//! optimises the object hit ratio at the expense of the byte hit ratio.
//! Zero-byte objects are treated as one byte.

use super::heap::{HeapPolicy, Priority};

/// The GDSF priority function.
#[derive(Debug)]
pub(crate) struct GdsfPriority;

impl Priority for GdsfPriority {
    fn priority(age: f64, freq: u32, size: u64) -> f64 {
        // u64 -> f64 rounds above 2^53 bytes, which is harmless here.
        age + f64::from(freq) / size.max(1) as f64
    }
}

/// GDSF bookkeeping.
pub(crate) type Gdsf = HeapPolicy<GdsfPriority>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn small_popular_beats_large() {
        let mut gdsf = Gdsf::new();
        gdsf.admit(0, 60); // K = 1/60
        gdsf.admit(1, 10); // K = 1/10
        gdsf.admit(2, 10);
        gdsf.touch(2, 10); // K = 2/10
        assert_eq!(gdsf.evict(), Some(0));
        assert!((gdsf.age() - 1.0 / 60.0).abs() < 1e-12);
        assert_eq!(gdsf.evict(), Some(1));
        assert_eq!(gdsf.evict(), Some(2));
    }

    #[test]
    fn priority_formula() {
        assert_eq!(GdsfPriority::priority(0.5, 3, 6), 1.0);
        assert_eq!(GdsfPriority::priority(0.0, 1, 0), 1.0);
    }
}
