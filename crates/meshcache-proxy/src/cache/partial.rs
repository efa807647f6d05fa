//! Partial responses (RFC 9111 §3.3, §3.4): the byte ranges of a representation that 206
//! responses brought, kept until they can answer a later range or be completed into the whole.
//!
//! Only what can be combined safely is kept: single-part 206s with a complete length
//! (`Content-Range: bytes a-b/N`) and a strong `ETag`. Pieces of one representation (same
//! strong ETag and length) are merged; a piece of another replaces them all. Once the pieces
//! cover `0..N` the cache turns them into a whole 200 object, stored as any other.
//!
//! Partials live in memory only, in a table bounded in bytes (least recently used first out),
//! and are not announced to peers: a peer's HIT means the whole object.

use std::collections::{BTreeMap, HashMap};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use meshcache_store::StoreKey;

use crate::semantics::Freshness;

/// The pieces of one representation.
#[derive(Clone, Debug)]
pub struct Partial {
    /// The newest piece's end-to-end headers, without `Content-Range` and `Content-Length`.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Its strong entity tag.
    pub etag: HeaderValue,
    /// The representation's length.
    pub total: u64,
    /// The newest piece's freshness (a piece refreshes the whole, as a 304 would).
    pub freshness: Freshness,
    /// Non-overlapping, non-adjacent byte runs by first byte.
    runs: BTreeMap<u64, Bytes>,
    /// When it was last used, for eviction.
    used: u64,
}

impl Partial {
    /// The bytes held.
    pub fn held(&self) -> u64 {
        self.runs.values().map(|b| b.len() as u64).sum()
    }

    /// Bytes `start..=end`, when held in one run.
    pub fn slice(&self, start: u64, end: u64) -> Option<Bytes> {
        let (&first, run) = self.runs.range(..=start).next_back()?;
        let last = first + run.len() as u64 - 1;
        (end <= last && start <= end)
            .then(|| run.slice((start - first) as usize..=(end - first) as usize))
    }

    /// The held prefix (`0..len`), if the first run starts at byte 0.
    pub fn prefix(&self) -> Option<&Bytes> {
        self.runs.get(&0)
    }

    /// The whole representation, once one run covers it.
    pub fn whole(&self) -> Option<Bytes> {
        self.prefix()
            .filter(|b| b.len() as u64 == self.total)
            .cloned()
    }

    /// Adds bytes from `start`, merging with the runs they touch or overlap (the bytes are
    /// of one representation, so where they overlap they are the same).
    fn add(&mut self, start: u64, bytes: Bytes) {
        let mut from = start;
        let mut to = start + bytes.len() as u64; // exclusive
        let touching: Vec<u64> = self
            .runs
            .range(..=to)
            .filter(|(&s, b)| s + b.len() as u64 >= from)
            .map(|(&s, _)| s)
            .collect();
        if touching.is_empty() {
            self.runs.insert(start, bytes);
            return;
        }
        for s in &touching {
            let b = &self.runs[s];
            from = from.min(*s);
            to = to.max(s + b.len() as u64);
        }
        let mut merged = BytesMut::zeroed((to - from) as usize);
        for s in touching {
            if let Some(b) = self.runs.remove(&s) {
                let at = (s - from) as usize;
                merged[at..at + b.len()].copy_from_slice(&b);
            }
        }
        let at = (start - from) as usize;
        merged[at..at + bytes.len()].copy_from_slice(&bytes);
        self.runs.insert(from, merged.freeze());
    }
}

/// A 206's piece, ready to keep.
pub struct Piece {
    /// End-to-end headers, without `Content-Range` and `Content-Length`.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Its strong entity tag.
    pub etag: HeaderValue,
    /// First byte.
    pub start: u64,
    /// The representation's length.
    pub total: u64,
    /// The bytes.
    pub body: Bytes,
    /// Its freshness.
    pub freshness: Freshness,
}

/// Every partial response kept, bounded in bytes.
#[derive(Debug)]
pub struct Partials {
    map: HashMap<StoreKey, Partial>,
    bytes: u64,
    capacity: u64,
    clock: u64,
}

impl Partials {
    /// An empty table that holds at most `capacity` bytes of pieces.
    pub fn new(capacity: u64) -> Self {
        Partials {
            map: HashMap::new(),
            bytes: 0,
            capacity,
            clock: 0,
        }
    }

    /// Keeps a piece under `key` (merged with earlier pieces of the same representation) and
    /// returns the partial as it now is. A piece larger than the table is refused.
    pub fn add(&mut self, key: StoreKey, piece: Piece) -> Option<&Partial> {
        let len = piece.body.len() as u64;
        if len == 0 || len > self.capacity || piece.start.saturating_add(len) > piece.total {
            return None;
        }
        self.clock += 1;
        let same = self
            .map
            .get(&key)
            .is_some_and(|p| p.etag == piece.etag && p.total == piece.total);
        if !same {
            self.remove(&key);
            self.map.insert(
                key,
                Partial {
                    headers: Vec::new(),
                    etag: piece.etag.clone(),
                    total: piece.total,
                    freshness: piece.freshness,
                    runs: BTreeMap::new(),
                    used: self.clock,
                },
            );
        }
        let partial = self.map.get_mut(&key)?;
        let before = partial.held();
        partial.headers = piece.headers;
        partial.freshness = piece.freshness;
        partial.used = self.clock;
        partial.add(piece.start, piece.body);
        self.bytes = self.bytes - before + partial.held();
        self.evict_beyond(&key);
        self.map.get(&key)
    }

    /// The partial under `key`, marked used.
    pub fn get(&mut self, key: &StoreKey) -> Option<&Partial> {
        self.clock += 1;
        let clock = self.clock;
        let p = self.map.get_mut(key)?;
        p.used = clock;
        Some(p)
    }

    /// Forgets the partial under `key` (completed, replaced or invalidated).
    pub fn remove(&mut self, key: &StoreKey) {
        if let Some(p) = self.map.remove(key) {
            self.bytes -= p.held();
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Evicts the least recently used partials other than `keep` until within capacity.
    fn evict_beyond(&mut self, keep: &StoreKey) {
        while self.bytes > self.capacity {
            let Some(victim) = self
                .map
                .iter()
                .filter(|(k, _)| *k != keep)
                .min_by_key(|(_, p)| p.used)
                .map(|(k, _)| *k)
            else {
                return;
            };
            self.remove(&victim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directives::ResponseDirectives;

    fn piece(etag: &str, start: u64, body: &[u8], total: u64) -> Piece {
        Piece {
            headers: Vec::new(),
            etag: HeaderValue::from_str(etag).expect("etag"),
            start,
            total,
            body: Bytes::copy_from_slice(body),
            freshness: Freshness {
                response_time: 0,
                initial_age: 0,
                lifetime: 60,
                directives: ResponseDirectives::default(),
            },
        }
    }

    fn key(n: u8) -> StoreKey {
        StoreKey::get(&format!("http://partial.test/{n}"))
    }

    #[test]
    fn pieces_merge_until_whole() {
        let mut t = Partials::new(1 << 20);
        let p = t.add(key(1), piece("\"a\"", 0, b"0123", 10)).expect("kept");
        assert_eq!(p.slice(1, 2).as_deref(), Some(&b"12"[..]));
        assert!(p.slice(3, 4).is_none());
        assert!(p.whole().is_none());
        let p = t.add(key(1), piece("\"a\"", 6, b"6789", 10)).expect("kept");
        assert!(p.slice(4, 6).is_none(), "a gap");
        assert_eq!(t.bytes(), 8);
        // Overlapping both runs: one run now, the whole.
        let p = t
            .add(key(1), piece("\"a\"", 2, b"234567", 10))
            .expect("kept");
        assert_eq!(p.whole().as_deref(), Some(&b"0123456789"[..]));
        assert_eq!(t.bytes(), 10);
    }

    #[test]
    fn another_representation_replaces_the_pieces() {
        let mut t = Partials::new(1 << 20);
        t.add(key(1), piece("\"a\"", 0, b"0123", 10));
        let p = t.add(key(1), piece("\"b\"", 4, b"xy", 10)).expect("kept");
        assert!(p.prefix().is_none());
        assert_eq!(p.slice(4, 5).as_deref(), Some(&b"xy"[..]));
        assert_eq!(t.bytes(), 2);
        // A piece past the stated length is refused.
        assert!(t.add(key(2), piece("\"a\"", 8, b"abc", 10)).is_none());
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let mut t = Partials::new(10);
        t.add(key(1), piece("\"a\"", 0, b"aaaa", 100));
        t.add(key(2), piece("\"a\"", 0, b"bbbb", 100));
        assert!(t.get(&key(1)).is_some());
        t.add(key(3), piece("\"a\"", 0, b"cccc", 100));
        assert!(t.get(&key(2)).is_none(), "least recently used");
        assert!(t.get(&key(1)).is_some() && t.get(&key(3)).is_some());
        assert_eq!(t.bytes(), 8);
        assert!(t.add(key(4), piece("\"a\"", 0, &[0; 11], 100)).is_none());
    }
}
