//! What outlives one run: each origin's key/value store and the log records waiting for delivery.
//!
//! Both are bounded. A run sees the store through an overlay of its own writes; the overlay is
//! committed only when the run completes normally, and all at once ([`KvStore::commit`]). Log
//! records wait in a [`LogSpool`], one queue per destination URL, until the proxy's delivery
//! task takes a batch; a batch that failed goes back to the front of its queue. Whatever does
//! not fit is dropped *and counted*.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// The longest key an applet may store.
pub const MAX_KEY: usize = 256;

/// One origin's key/value store.
#[derive(Debug, Default)]
pub struct KvStore {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: u64,
}

/// Every origin's store, created on first use.
#[derive(Debug, Default)]
pub struct KvStores {
    stores: Mutex<HashMap<String, Arc<Mutex<KvStore>>>>,
}

impl KvStores {
    /// The store of `origin`.
    pub fn of(&self, origin: &str) -> Arc<Mutex<KvStore>> {
        let mut stores = self.stores.lock();
        match stores.get(origin) {
            Some(s) => s.clone(),
            None => stores.entry(origin.to_owned()).or_default().clone(),
        }
    }

    /// Bytes the store of `origin` holds.
    pub fn bytes(&self, origin: &str) -> u64 {
        let store = self.stores.lock().get(origin).cloned();
        store.map_or(0, |s| s.lock().bytes())
    }
}

/// A run's pending writes: `Some(value)` to set, `None` to delete.
pub type KvWrites = HashMap<Vec<u8>, Option<Vec<u8>>>;

impl KvStore {
    /// The committed value of a key.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    /// Bytes held (keys plus values).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What the store would hold after `writes`.
    pub fn bytes_after(&self, writes: &KvWrites) -> u64 {
        let mut total = self.bytes as i64;
        for (k, v) in writes {
            if let Some(old) = self.map.get(k) {
                total -= (k.len() + old.len()) as i64;
            }
            if let Some(v) = v {
                total += (k.len() + v.len()) as i64;
            }
        }
        total.max(0) as u64
    }

    /// Applies a run's writes if the result fits in `max` bytes; else applies none.
    pub fn commit(&mut self, writes: KvWrites, max: u64) -> bool {
        if self.bytes_after(&writes) > max {
            return false;
        }
        for (k, v) in writes {
            if let Some(old) = self.map.remove(&k) {
                self.bytes -= (k.len() + old.len()) as u64;
            }
            if let Some(v) = v {
                self.bytes += (k.len() + v.len()) as u64;
                self.map.insert(k, v);
            }
        }
        true
    }
}

/// A batch of log records taken for delivery.
#[derive(Debug)]
pub struct LogBatch {
    /// Where it goes (an absolute `http://` URL).
    pub destination: String,
    /// The records, concatenated in order.
    pub body: Bytes,
    /// How many records.
    pub records: u64,
    /// The records, kept apart so a failed batch can be put back.
    parts: Vec<Bytes>,
}

/// Counters of the log spool.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Records accepted into a queue.
    pub queued: AtomicU64,
    /// Records dropped because their queue was full.
    pub dropped: AtomicU64,
    /// Records delivered (their batch got a 2xx).
    pub delivered: AtomicU64,
}

#[derive(Debug, Default)]
struct Queue {
    records: VecDeque<Bytes>,
    bytes: u64,
}

/// Log records waiting for delivery, one bounded queue per destination.
#[derive(Debug)]
pub struct LogSpool {
    queues: Mutex<HashMap<String, Queue>>,
    max_bytes: u64,
    /// Counters.
    pub counters: LogCounters,
}

impl LogSpool {
    /// A spool holding at most `max_bytes` per destination.
    pub fn new(max_bytes: u64) -> Self {
        LogSpool {
            queues: Mutex::new(HashMap::new()),
            max_bytes,
            counters: LogCounters::default(),
        }
    }

    /// Queues records for `destination`; those that do not fit are dropped and counted.
    /// Returns how many were dropped.
    pub fn push(&self, destination: &str, records: impl IntoIterator<Item = Bytes>) -> u64 {
        let mut queues = self.queues.lock();
        let queue = match queues.get_mut(destination) {
            Some(q) => q,
            None => queues.entry(destination.to_owned()).or_default(),
        };
        let (mut queued, mut dropped) = (0, 0);
        for r in records {
            if queue.bytes + r.len() as u64 > self.max_bytes {
                dropped += 1;
                continue;
            }
            queue.bytes += r.len() as u64;
            queue.records.push_back(r);
            queued += 1;
        }
        self.counters.queued.fetch_add(queued, Relaxed);
        self.counters.dropped.fetch_add(dropped, Relaxed);
        dropped
    }

    /// Destinations with records waiting.
    pub fn destinations(&self) -> Vec<String> {
        let queues = self.queues.lock();
        queues
            .iter()
            .filter(|(_, q)| !q.records.is_empty())
            .map(|(d, _)| d.clone())
            .collect()
    }

    /// Records waiting for a destination.
    pub fn pending(&self, destination: &str) -> usize {
        self.queues
            .lock()
            .get(destination)
            .map_or(0, |q| q.records.len())
    }

    /// Takes up to `max_bytes` of records (at least one) for `destination`.
    pub fn take(&self, destination: &str, max_bytes: u64) -> Option<LogBatch> {
        let mut queues = self.queues.lock();
        let queue = queues.get_mut(destination)?;
        let mut parts = Vec::new();
        let mut size = 0u64;
        while let Some(r) = queue.records.front() {
            if !parts.is_empty() && size + r.len() as u64 > max_bytes {
                break;
            }
            size += r.len() as u64;
            parts.extend(queue.records.pop_front());
        }
        queue.bytes -= size;
        if parts.is_empty() {
            return None;
        }
        let mut body = BytesMut::with_capacity(size as usize);
        for p in &parts {
            body.extend_from_slice(p);
        }
        Some(LogBatch {
            destination: destination.to_owned(),
            body: body.freeze(),
            records: parts.len() as u64,
            parts,
        })
    }

    /// A batch was delivered.
    pub fn delivered(&self, batch: LogBatch) {
        self.counters.delivered.fetch_add(batch.records, Relaxed);
    }

    /// A batch failed: its records go back to the front of their queue, in order, as far as
    /// they fit beside what arrived since; the rest are dropped and counted.
    pub fn put_back(&self, batch: LogBatch) -> u64 {
        let mut queues = self.queues.lock();
        let queue = queues.entry(batch.destination).or_default();
        let mut dropped = 0;
        for r in batch.parts.into_iter().rev() {
            if queue.bytes + r.len() as u64 > self.max_bytes {
                dropped += 1;
                continue;
            }
            queue.bytes += r.len() as u64;
            queue.records.push_front(r);
        }
        // They were counted as queued once already.
        self.counters.dropped.fetch_add(dropped, Relaxed);
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(pairs: &[(&str, Option<&str>)]) -> KvWrites {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn kv_commits_all_or_nothing_within_its_bound() {
        let mut kv = KvStore::default();
        assert!(kv.commit(w(&[("a", Some("123")), ("b", Some("4"))]), 100));
        assert_eq!(kv.bytes(), 6);
        assert_eq!(kv.get(b"a"), Some(&b"123"[..]));
        // Replacing and deleting account for the old bytes.
        assert!(kv.commit(w(&[("a", Some("1")), ("b", None)]), 100));
        assert_eq!(kv.bytes(), 2);
        assert_eq!(kv.get(b"b"), None);
        // Over the bound: nothing applied.
        assert!(!kv.commit(w(&[("c", Some("x")), ("d", Some(&"y".repeat(200)))]), 100));
        assert_eq!(kv.get(b"c"), None);
        assert_eq!(kv.bytes(), 2);
    }

    #[test]
    fn spool_bounds_batches_and_puts_failures_back_in_order() {
        let spool = LogSpool::new(12);
        let rec = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert_eq!(
            spool.push("d", ["aaa", "bbb", "ccc", "ddd", "eee"].map(rec)),
            1
        );
        assert_eq!(spool.counters.dropped.load(Relaxed), 1);
        let batch = spool.take("d", 6).expect("records wait");
        assert_eq!(&batch.body[..], b"aaabbb");
        assert_eq!(spool.pending("d"), 2);
        assert_eq!(spool.put_back(batch), 0);
        let all = spool.take("d", 100).expect("records wait");
        assert_eq!(&all.body[..], b"aaabbbcccddd");
        assert_eq!(all.records, 4);
        // What arrived while a batch was out has room first; the batch's overflow is counted.
        spool.push("d", ["fff", "ggg", "hhh"].map(rec));
        assert_eq!(spool.put_back(all), 3);
        assert_eq!(spool.counters.dropped.load(Relaxed), 4);
        let left = spool.take("d", 100).expect("records wait");
        assert_eq!(&left.body[..], b"dddfffggghhh");
        spool.delivered(left);
        assert_eq!(spool.counters.delivered.load(Relaxed), 4);
        assert!(spool.take("d", 100).is_none());
        assert!(spool.destinations().is_empty());
    }

    #[test]
    fn a_record_larger_than_a_batch_still_goes_alone() {
        let spool = LogSpool::new(100);
        spool.push("d", [Bytes::from(vec![b'x'; 50])]);
        let b = spool.take("d", 10).expect("taken");
        assert_eq!(b.body.len(), 50);
    }
}
