//! Least recently used: an intrusive doubly linked list threaded through a
//! per-slot vector of links. Admission and hits move the entry to the front;
//! the victim is the back. Every operation is O(1).

use super::Policy;
use crate::chunked::ChunkVec;

/// "No slot" in a link. The store never hands out slot `u32::MAX`.
pub(crate) const NIL: u32 = u32::MAX;

/// Per-slot list links, 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Link {
    /// Towards the most recently used end.
    prev: u32,
    /// Towards the least recently used end.
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

/// LRU bookkeeping.
#[derive(Debug)]
pub(crate) struct Lru {
    links: ChunkVec<Link>,
    /// Most recently used slot.
    head: u32,
    /// Least recently used slot: the next victim.
    tail: u32,
    #[cfg(test)]
    len: usize,
}

impl Lru {
    pub(crate) fn new() -> Self {
        Lru {
            links: ChunkVec::new(),
            head: NIL,
            tail: NIL,
            #[cfg(test)]
            len: 0,
        }
    }

    fn push_front(&mut self, slot: u32) {
        let old_head = self.head;
        self.links[slot as usize] = Link {
            prev: NIL,
            next: old_head,
        };
        if old_head == NIL {
            self.tail = slot;
        } else {
            self.links[old_head as usize].prev = slot;
        }
        self.head = slot;
    }

    fn unlink(&mut self, slot: u32) {
        let Link { prev, next } = self.links[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[slot as usize] = UNLINKED;
    }
}

impl Policy for Lru {
    const BYTES_PER_ENTRY: usize = std::mem::size_of::<Link>();

    fn admit(&mut self, slot: u32, _size: u64) {
        debug_assert_ne!(slot, NIL);
        let index = slot as usize;
        if index >= self.links.len() {
            self.links.resize(index + 1, UNLINKED);
        }
        self.push_front(slot);
        #[cfg(test)]
        {
            self.len += 1;
        }
    }

    fn touch(&mut self, slot: u32, _size: u64) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    fn forget(&mut self, slot: u32) {
        self.unlink(slot);
        #[cfg(test)]
        {
            self.len -= 1;
        }
    }

    fn evict(&mut self) -> Option<u32> {
        let victim = self.tail;
        if victim == NIL {
            return None;
        }
        self.forget(victim);
        Some(victim)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    fn check(&self) {
        let mut count = 0;
        let mut prev = NIL;
        let mut cur = self.head;
        while cur != NIL {
            let link = self.links[cur as usize];
            assert_eq!(link.prev, prev, "broken prev link at slot {cur}");
            prev = cur;
            cur = link.next;
            count += 1;
            assert!(count <= self.links.len(), "cycle in LRU list");
        }
        assert_eq!(self.tail, prev, "tail is not the last node");
        assert_eq!(count, self.len, "list length");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lru: &Lru) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = lru.head;
        while cur != NIL {
            out.push(cur);
            cur = lru.links[cur as usize].next;
        }
        out
    }

    #[test]
    fn evicts_least_recently_used_and_touch_protects() {
        let mut lru = Lru::new();
        for slot in 0..4 {
            lru.admit(slot, 1);
        }
        assert_eq!(order(&lru), [3, 2, 1, 0]);
        lru.touch(0, 1);
        lru.touch(2, 1);
        assert_eq!(order(&lru), [2, 0, 3, 1]);
        lru.check();
        assert_eq!(lru.evict(), Some(1));
        lru.forget(0);
        lru.check();
        assert_eq!(order(&lru), [2, 3]);
        assert_eq!(lru.evict(), Some(3));
        lru.touch(2, 1);
        assert_eq!(lru.evict(), Some(2));
        assert_eq!(lru.evict(), None);
        lru.check();
        // Slots are reusable after removal.
        lru.admit(1, 1);
        lru.admit(7, 1);
        assert_eq!(order(&lru), [7, 1]);
        lru.check();
    }
}
