//! Which parts of the slab file are free: one bit per 256-byte unit.
//!
//! Records are placed next-fit: the search for a free run starts where the last one was placed
//! and wraps around once. On an empty slab that writes the file front to back like a log; once
//! objects are evicted, their runs are reused as the search comes round to them. The map costs
//! one bit per unit, 1/2048 of the slab's length (10 MiB for 20 GiB); nothing per object.
//!
//! A new slab's map starts all *used*: at a restart nothing is known to be free until the
//! rebuild has read that part of the file and found no live record there (see `scan`).

/// Bytes per unit: the slab's allocation grain and the alignment of its records.
pub const UNIT: u64 = 256;

/// The free-space map of a slab; see the module's documentation.
#[derive(Clone, Debug)]
pub struct Space {
    /// Bit set: the unit is used (or not known to be free).
    words: Vec<u64>,
    units: u64,
    /// Where the next search starts.
    rover: u64,
    free: u64,
}

impl Space {
    /// A map of `units` units, all used (`free = false`) or all free.
    pub fn new(units: u64, free: bool) -> Space {
        let words = units.div_ceil(64) as usize;
        let mut space = Space {
            words: vec![u64::MAX; words],
            units,
            rover: 0,
            free: 0,
        };
        if free {
            space.release(0, units);
        }
        space
    }

    /// Units in the map.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Units free now.
    pub fn free_units(&self) -> u64 {
        self.free
    }

    /// Bytes of memory the map takes.
    pub fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    fn used(&self, unit: u64) -> bool {
        self.words[(unit / 64) as usize] >> (unit % 64) & 1 == 1
    }

    /// Whether units `unit..unit + n` are all free.
    pub fn is_free(&self, unit: u64, n: u64) -> bool {
        unit.checked_add(n).is_some_and(|end| end <= self.units)
            && (unit..unit + n).all(|u| !self.used(u))
    }

    /// The first run of `n` free units starting in `from..to` and ending by `to`.
    fn find(&self, from: u64, to: u64, n: u64) -> Option<u64> {
        let mut start = from;
        let mut run = 0;
        let mut u = from;
        while u < to {
            let (w, b) = ((u / 64) as usize, u % 64);
            let bits = self.words[w] >> b;
            let left = 64 - b;
            if bits & 1 == 1 {
                // Skip this stretch of used units.
                let ones = u64::from((!bits).trailing_zeros()).min(left);
                u += ones;
                start = u;
                run = 0;
            } else {
                let zeros = if bits == 0 {
                    left
                } else {
                    u64::from(bits.trailing_zeros()).min(left)
                };
                run += zeros;
                u += zeros;
                if run >= n {
                    return (start + n <= to).then_some(start);
                }
            }
        }
        None
    }

    /// Takes a run of `n` free units and returns its first unit; `None` when there is no such
    /// run (the map is full or too fragmented).
    pub fn allocate(&mut self, n: u64) -> Option<u64> {
        if n == 0 || n > self.free {
            return None;
        }
        let rover = self.rover.min(self.units);
        let found = self
            .find(rover, self.units, n)
            .or_else(|| self.find(0, (rover + n).min(self.units), n))?;
        self.set(found, n, true);
        self.rover = found + n;
        Some(found)
    }

    /// Marks units `unit..unit + n` used (a record the rebuild found there). Out-of-range
    /// units are ignored.
    pub fn occupy(&mut self, unit: u64, n: u64) {
        self.set(unit, n, true);
    }

    /// Marks units `unit..unit + n` free. Out-of-range units are ignored.
    pub fn release(&mut self, unit: u64, n: u64) {
        self.set(unit, n, false);
    }

    fn set(&mut self, unit: u64, n: u64, used: bool) {
        let end = unit.saturating_add(n).min(self.units);
        let mut u = unit;
        while u < end {
            let (w, b) = ((u / 64) as usize, u % 64);
            let k = (64 - b).min(end - u);
            let mask = if k == 64 {
                u64::MAX
            } else {
                ((1u64 << k) - 1) << b
            };
            let before = (self.words[w] & mask).count_ones() as u64;
            if used {
                self.words[w] |= mask;
                self.free -= k - before;
            } else {
                self.words[w] &= !mask;
                self.free += before;
            }
            u += k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn next_fit_writes_like_a_log_then_reuses_holes() {
        let mut s = Space::new(1000, true);
        assert_eq!(s.free_units(), 1000);
        assert_eq!(s.allocate(10), Some(0));
        assert_eq!(s.allocate(10), Some(10));
        s.release(0, 10);
        // The search goes on from where it was before coming back to the hole.
        assert_eq!(s.allocate(500), Some(20));
        assert_eq!(s.allocate(480), Some(520));
        assert_eq!(s.allocate(11), None, "only the 10-unit hole is left");
        assert_eq!(s.allocate(10), Some(0));
        assert_eq!(s.free_units(), 0);
        assert_eq!(s.allocate(1), None);
    }

    #[test]
    fn a_new_map_is_all_used_until_released() {
        let mut s = Space::new(130, false);
        assert_eq!(s.allocate(1), None);
        s.release(64, 66);
        assert_eq!(s.free_units(), 66);
        assert_eq!(s.allocate(66), Some(64));
        s.release(100, 1000);
        assert_eq!(s.free_units(), 30, "out-of-range units are ignored");
        assert!(s.is_free(100, 30) && !s.is_free(99, 2));
    }

    proptest! {
        /// Allocations never overlap, stay in range, and the free count is exact.
        #[test]
        fn matches_a_model(units in 1u64..700, ops in proptest::collection::vec((any::<bool>(), 1u64..80, any::<usize>()), 1..200)) {
            let mut s = Space::new(units, true);
            let mut model = vec![false; units as usize];
            let mut held: Vec<(u64, u64)> = Vec::new();
            for (alloc, n, pick) in ops {
                if alloc || held.is_empty() {
                    match s.allocate(n) {
                        Some(at) => {
                            prop_assert!(at + n <= units);
                            for u in at..at + n {
                                prop_assert!(!model[u as usize], "unit {} given twice", u);
                                model[u as usize] = true;
                            }
                            held.push((at, n));
                        }
                        None => {
                            // Refused only when no run of n free units exists.
                            let free_run = model.windows(n as usize).any(|w| w.iter().all(|u| !u));
                            prop_assert!(!free_run || n as usize > model.len(), "a run of {} was free", n);
                        }
                    }
                } else {
                    let (at, n) = held.swap_remove(pick % held.len());
                    s.release(at, n);
                    for u in at..at + n {
                        model[u as usize] = false;
                    }
                }
                prop_assert_eq!(s.free_units(), model.iter().filter(|u| !**u).count() as u64);
            }
        }
    }
}
