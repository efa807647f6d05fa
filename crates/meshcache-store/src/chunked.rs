//! A vector that grows by fixed chunks instead of doubling.
//!
//! The store's per-slot arrays (the slab of entries, the policies' links and heap) grow with the
//! number of objects. A `Vec` doubles: just past a power of two, almost half its memory is spare
//! room, and each growth copies everything while the store's lock is held (hundreds of
//! megabytes at tens of millions of objects). [`ChunkVec`] keeps elements in chunks of
//! [`CHUNK`] that never move; only the first grows by doubling (so a small store stays small),
//! and the spare room is at most one chunk.

use std::ops::{Index, IndexMut};

/// log2 of the chunk length.
const SHIFT: u32 = 12;
/// Elements per chunk.
pub(crate) const CHUNK: usize = 1 << SHIFT;
const MASK: usize = CHUNK - 1;

/// A growable array of `T` stored in fixed chunks; see the [module documentation](self).
pub(crate) struct ChunkVec<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for ChunkVec<T> {
    fn default() -> Self {
        ChunkVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> ChunkVec<T> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn push(&mut self, value: T) {
        let c = self.len >> SHIFT;
        if c == self.chunks.len() {
            self.chunks.push(if c == 0 {
                Vec::new()
            } else {
                Vec::with_capacity(CHUNK)
            });
        }
        let chunk = &mut self.chunks[c];
        if chunk.len() == chunk.capacity() {
            // Only the first chunk grows (later ones start full-sized): double, up to CHUNK.
            let more = chunk.capacity().max(4).min(CHUNK - chunk.len());
            chunk.reserve_exact(more);
        }
        chunk.push(value);
        self.len += 1;
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        let last = self.len.checked_sub(1)?;
        let value = self.chunks[last >> SHIFT].pop();
        self.len = last;
        value
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        while self.len > len {
            self.pop();
        }
    }

    pub(crate) fn swap(&mut self, a: usize, b: usize) {
        let (ca, cb) = (a >> SHIFT, b >> SHIFT);
        if ca == cb {
            self.chunks[ca].swap(a & MASK, b & MASK);
        } else {
            let (lo, hi, lo_i, hi_i) = if ca < cb {
                (ca, cb, a & MASK, b & MASK)
            } else {
                (cb, ca, b & MASK, a & MASK)
            };
            let (left, right) = self.chunks.split_at_mut(hi);
            std::mem::swap(&mut left[lo][lo_i], &mut right[0][hi_i]);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// Bytes reserved for elements (spare room included).
    #[cfg(test)]
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>() * std::mem::size_of::<T>()
    }
}

impl<T: Clone> ChunkVec<T> {
    /// Grows to `len` elements, filling with `value` (never shrinks).
    pub(crate) fn resize(&mut self, len: usize, value: T) {
        while self.len < len {
            self.push(value.clone());
        }
    }
}

impl<T> std::fmt::Debug for ChunkVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkVec")
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl<T> Index<usize> for ChunkVec<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> SHIFT][i & MASK]
    }
}

impl<T> IndexMut<usize> for ChunkVec<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i >> SHIFT][i & MASK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Behaves as a `Vec` under any sequence of pushes, pops, swaps, truncations and writes.
        #[test]
        fn matches_a_vec(ops in proptest::collection::vec((0u8..5, 0usize..20_000, 0usize..20_000), 1..400)) {
            let mut model: Vec<u64> = Vec::new();
            let mut chunked = ChunkVec::new();
            let mut next = 0u64;
            for (op, a, b) in ops {
                match op {
                    0 => {
                        // A run of pushes, to cross chunk boundaries.
                        for _ in 0..(a % 3000) {
                            model.push(next);
                            chunked.push(next);
                            next += 1;
                        }
                    }
                    1 => prop_assert_eq!(model.pop(), chunked.pop()),
                    2 if !model.is_empty() => {
                        let (a, b) = (a % model.len(), b % model.len());
                        model.swap(a, b);
                        chunked.swap(a, b);
                    }
                    3 => {
                        let len = model.len().saturating_sub(a % 500);
                        model.truncate(len);
                        chunked.truncate(len);
                    }
                    4 if !model.is_empty() => {
                        let i = a % model.len();
                        model[i] = next;
                        chunked[i] = next;
                        next += 1;
                    }
                    _ => {}
                }
                prop_assert_eq!(model.len(), chunked.len());
            }
            prop_assert!(chunked.iter().eq(model.iter()));
            for (i, v) in model.iter().enumerate() {
                prop_assert_eq!(&chunked[i], v);
            }
        }
    }

    #[test]
    fn spare_room_is_at_most_one_chunk() {
        let mut v = ChunkVec::new();
        for i in 0..3 {
            v.push(i as u32);
        }
        assert!(v.reserved_bytes() <= 4 * 4, "a small vector stays small");
        let n = 2 * CHUNK + 1;
        for i in 3..n {
            v.push(i as u32);
        }
        assert_eq!(v.reserved_bytes(), 3 * CHUNK * 4);
        v.resize(n + 10, 7);
        assert_eq!(v[n + 9], 7);
        assert!(!v.is_empty());
    }
}
