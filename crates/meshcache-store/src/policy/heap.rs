//! An indexed binary min-heap of priorities, shared by the Greedy-Dual
//! family of policies ([`gdsf`](super::gdsf), [`lfuda`](super::lfuda)).
//!
//! Each heap item carries its priority `K`, a sequence number for
//! tie-breaking, its slot and its reference count. A per-slot vector maps a
//! slot to its position in the heap so that hits and removals of arbitrary
//! entries are O(log n). The policy's "inflation" value `L` (Squid's
//! `heap_age`) is raised to the victim's `K` on every eviction; new and hit
//! entries get `K = L + f(freq, size)`, which lets long-idle entries age out.
//!
//! Priorities are `f64` compared with [`f64::total_cmp`]; they are always
//! finite and non-negative because `freq ≥ 1` and sizes are clamped to at
//! least one byte. Equal priorities are broken by the sequence number: the
//! entry admitted or hit longest ago goes first.

use std::cmp::Ordering;
use std::marker::PhantomData;

use super::Policy;
use crate::chunked::ChunkVec;

/// "Not in the heap" in the position vector.
const ABSENT: u32 = u32::MAX;

/// How a Greedy-Dual policy prioritises an entry.
pub(crate) trait Priority {
    /// `K` for an entry with `freq` references weighing `size` bytes, given
    /// the current inflation value `age` (`L`).
    fn priority(age: f64, freq: u32, size: u64) -> f64;
}

/// One heap item: 16 bytes.
#[derive(Clone, Copy, Debug)]
struct Item {
    priority: f64,
    /// Tie-breaker: value of the policy's counter at admission or last hit. When the counter
    /// runs out, the items are renumbered in the same order (see `next_seq`).
    seq: u32,
    slot: u32,
}

/// What the policy keeps per slot besides its heap item: 8 bytes.
#[derive(Clone, Copy, Debug)]
struct SlotState {
    /// Index of the slot's item in the heap, or `ABSENT`.
    pos: u32,
    /// Reference count: 1 at admission, +1 per hit (saturating).
    freq: u32,
}

const UNTRACKED: SlotState = SlotState {
    pos: ABSENT,
    freq: 0,
};

impl Item {
    /// Whether `self` should be evicted before `other`.
    fn before(&self, other: &Item) -> bool {
        match self.priority.total_cmp(&other.priority) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => self.seq < other.seq,
        }
    }
}

/// Greedy-Dual bookkeeping parameterised by the priority function.
pub(crate) struct HeapPolicy<P> {
    heap: ChunkVec<Item>,
    /// Per slot: its item's position and its reference count.
    slots: ChunkVec<SlotState>,
    /// The inflation value `L`.
    age: f64,
    /// Next tie-breaking sequence number.
    seq: u32,
    _priority: PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for HeapPolicy<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapPolicy")
            .field("len", &self.heap.len())
            .field("age", &self.age)
            .finish_non_exhaustive()
    }
}

impl<P: Priority> HeapPolicy<P> {
    pub(crate) fn new() -> Self {
        HeapPolicy {
            heap: ChunkVec::new(),
            slots: ChunkVec::new(),
            age: 0.0,
            seq: 0,
            _priority: PhantomData,
        }
    }

    /// The current inflation value `L`.
    #[cfg(test)]
    pub(crate) fn age(&self) -> f64 {
        self.age
    }

    fn next_seq(&mut self) -> u32 {
        if self.seq == u32::MAX {
            self.renumber();
        }
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// Gives the items sequence numbers 0, 1, … in their current order. The order of the heap
    /// is unchanged, so it needs no repair; it happens once per four billion admissions and
    /// hits.
    fn renumber(&mut self) {
        let mut order: Vec<(u32, usize)> = self
            .heap
            .iter()
            .enumerate()
            .map(|(index, item)| (item.seq, index))
            .collect();
        order.sort_unstable();
        for (rank, &(_, index)) in order.iter().enumerate() {
            // rank < heap length <= u32::MAX - 1.
            self.heap[index].seq = rank as u32;
        }
        self.seq = order.len() as u32;
    }

    /// Sets the sequence counter (to test renumbering without four billion operations).
    #[cfg(test)]
    fn set_seq(&mut self, seq: u32) {
        self.seq = seq;
    }

    /// Put `item` at heap index `index` and record its position.
    fn place(&mut self, index: usize, item: Item) {
        // Heap indices are < number of slots <= u32::MAX - 1.
        self.slots[item.slot as usize].pos = index as u32;
        self.heap[index] = item;
    }

    /// Move the item at `index` towards the root; returns its final index.
    fn sift_up(&mut self, mut index: usize) -> usize {
        let item = self.heap[index];
        while index > 0 {
            let parent = (index - 1) / 2;
            let above = self.heap[parent];
            if !item.before(&above) {
                break;
            }
            self.place(index, above);
            index = parent;
        }
        self.place(index, item);
        index
    }

    /// Move the item at `index` towards the leaves.
    fn sift_down(&mut self, mut index: usize) {
        let item = self.heap[index];
        let len = self.heap.len();
        loop {
            let left = 2 * index + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.heap[right].before(&self.heap[left]) {
                right
            } else {
                left
            };
            let below = self.heap[child];
            if !below.before(&item) {
                break;
            }
            self.place(index, below);
            index = child;
        }
        self.place(index, item);
    }

    /// Restore the heap property around `index` after its item changed.
    fn fix(&mut self, index: usize) {
        if self.sift_up(index) == index {
            self.sift_down(index);
        }
    }

    /// Remove and return the item at heap index `index`.
    fn remove_at(&mut self, index: usize) -> Item {
        let last = self.heap.len() - 1;
        self.heap.swap(index, last);
        let removed = self.heap[last];
        self.heap.truncate(last);
        self.slots[removed.slot as usize] = UNTRACKED;
        if index < last {
            self.fix(index);
        }
        removed
    }
}

impl<P: Priority> Policy for HeapPolicy<P> {
    const BYTES_PER_ENTRY: usize = std::mem::size_of::<Item>() + std::mem::size_of::<SlotState>();

    fn admit(&mut self, slot: u32, size: u64) {
        let index = slot as usize;
        if index >= self.slots.len() {
            self.slots.resize(index + 1, UNTRACKED);
        }
        debug_assert_eq!(self.slots[index].pos, ABSENT, "slot {slot} admitted twice");
        self.slots[index].freq = 1;
        let item = Item {
            priority: P::priority(self.age, 1, size),
            seq: self.next_seq(),
            slot,
        };
        self.heap.push(item);
        self.sift_up(self.heap.len() - 1);
    }

    fn touch(&mut self, slot: u32, size: u64) {
        let seq = self.next_seq();
        let state = &mut self.slots[slot as usize];
        state.freq = state.freq.saturating_add(1);
        let (index, freq) = (state.pos as usize, state.freq);
        let item = &mut self.heap[index];
        item.priority = P::priority(self.age, freq, size);
        item.seq = seq;
        self.fix(index);
    }

    fn forget(&mut self, slot: u32) {
        let index = self.slots[slot as usize].pos as usize;
        self.remove_at(index);
    }

    fn evict(&mut self) -> Option<u32> {
        if self.heap.is_empty() {
            return None;
        }
        let victim = self.remove_at(0);
        // L only grows: every remaining K was computed from an L no larger
        // than the victim's K, so the victim is the smallest of them.
        self.age = self.age.max(victim.priority);
        Some(victim.slot)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }

    #[cfg(test)]
    fn check(&self) {
        for (index, item) in self.heap.iter().enumerate() {
            assert_eq!(
                self.slots[item.slot as usize].pos as usize, index,
                "pos of slot"
            );
            assert!(self.slots[item.slot as usize].freq >= 1, "freq of slot");
            assert!(
                item.priority.is_finite() && item.priority >= self.age,
                "K below L"
            );
            if index > 0 {
                let parent = self.heap[(index - 1) / 2];
                assert!(!item.before(&parent), "heap order violated at {index}");
            }
        }
        let tracked = self.slots.iter().filter(|s| s.pos != ABSENT).count();
        assert_eq!(tracked, self.heap.len(), "stale positions");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Priority = L + freq, like LFUDA, to test the heap mechanics.
    struct Count;
    impl Priority for Count {
        fn priority(age: f64, freq: u32, _size: u64) -> f64 {
            age + f64::from(freq)
        }
    }

    #[test]
    fn ties_go_to_the_oldest_and_age_inflates() {
        let mut heap = HeapPolicy::<Count>::new();
        for slot in 0..5 {
            heap.admit(slot, 1);
        }
        heap.check();
        heap.touch(0, 1); // K = 2
        heap.touch(3, 1); // K = 2, hit after 0
        heap.check();
        assert_eq!(heap.evict(), Some(1)); // K = 1, oldest
        assert_eq!(heap.age(), 1.0);
        assert_eq!(heap.evict(), Some(2));
        assert_eq!(heap.evict(), Some(4));
        heap.admit(9, 1); // K = L + 1 = 2, newest
        assert_eq!(heap.evict(), Some(0));
        assert_eq!(heap.evict(), Some(3));
        assert_eq!(heap.evict(), Some(9));
        assert_eq!(heap.age(), 2.0);
        assert_eq!(heap.evict(), None);
        heap.check();
    }

    #[test]
    fn ties_still_go_to_the_oldest_across_a_renumbering() {
        for start in [0, u32::MAX - 1, u32::MAX - 4, u32::MAX - 9] {
            let mut heap = HeapPolicy::<Count>::new();
            heap.set_seq(start);
            for slot in 0..5 {
                heap.admit(slot, 1);
            }
            heap.touch(0, 1); // K = 2
            heap.touch(3, 1); // K = 2, hit after 0
            heap.check();
            assert_eq!(heap.evict(), Some(1), "from {start}");
            assert_eq!(heap.evict(), Some(2), "from {start}");
            assert_eq!(heap.evict(), Some(4), "from {start}");
            heap.admit(9, 1); // K = L + 1 = 2, newest
            assert_eq!(heap.evict(), Some(0), "from {start}");
            assert_eq!(heap.evict(), Some(3), "from {start}");
            assert_eq!(heap.evict(), Some(9), "from {start}");
            heap.check();
        }
    }

    #[test]
    fn forget_anywhere_keeps_the_heap_valid() {
        let mut heap = HeapPolicy::<Count>::new();
        for slot in 0..64 {
            heap.admit(slot, 1);
            for _ in 0..(slot * 7 % 11) {
                heap.touch(slot, 1);
            }
        }
        heap.check();
        for slot in (0..64).step_by(3) {
            heap.forget(slot);
            heap.check();
        }
        let mut last_age = heap.age();
        let mut evicted = 0;
        while let Some(slot) = heap.evict() {
            assert_ne!(slot % 3, 0, "forgotten slot {slot} evicted");
            assert!(heap.age() >= last_age, "L decreased");
            last_age = heap.age();
            evicted += 1;
            heap.check();
        }
        assert_eq!(evicted, 64 - 22);
        assert_eq!(heap.len(), 0);
    }
}
