//! One array per version of a sender's summary, however many nodes read it.
//!
//! In a mesh of N caches every node keeps every peer's summary: N × (N − 1) arrays, 21 GB at
//! 1,000 caches of the default size. But the readers of one sender all hold the same bits
//! most of the time: they fetched the same whole summary (its sender encodes it once per
//! version) and applied the same deltas to it. So arrays are shared:
//!
//! - a fetched body decodes once: readers of the same body (the same bytes, by address) get
//!   the same array;
//! - a delta applied to an array makes one new array: readers that apply the same delta
//!   (by sequence number) to the same array (by address) get the same result.
//!
//! Both are exact — the same input gives the same array — so results do not change. A reader
//! whose array is its own (nobody else holds it) changes it in place. Entries are weak: an
//! array lives as long as some reader holds it, and a dead entry is dropped at the next prune.

use std::sync::{Arc, Weak};

use meshcache_dcm::summary::exchange::Arrays;
use meshcache_dcm::summary::{apply_delta, array_of, Deltas};
use meshcache_summary::{BloomArray, CacheDigest, DigestError};
use meshcache_wire::summary::{self as wire, DirUpdate};
use meshcache_wire::WireError;
use rustc_hash::FxHashMap;

/// What a fetched body decoded to.
#[derive(Clone)]
struct Decoded {
    /// Keeps the body's allocation, so its address names it while the entry lives.
    body: Weak<[u8]>,
    array: Weak<BloomArray>,
    /// A whole summary's sequence number (none for a digest).
    seq: Option<u32>,
}

/// A delta's result.
struct Derived {
    /// Keeps the base's allocation, so its address names it while the entry lives.
    base: Weak<BloomArray>,
    array: Weak<BloomArray>,
}

/// The arrays shared among the nodes of one simulation.
#[derive(Default)]
pub(crate) struct SharedArrays {
    /// Keyed by address: FxHash, not SipHash (nothing here comes from outside the run).
    decoded: FxHashMap<usize, Decoded>,
    derived: FxHashMap<(usize, u32), Derived>,
    /// Entries at the last prune: the next comes when there are twice as many.
    pruned_at: usize,
}

/// A whole summary, decoded: its array and sequence number, or `None` when its hash parameters
/// are not ones a reader knows.
type Full = Option<(Arc<BloomArray>, u32)>;

impl SharedArrays {
    /// The live entry for `body`, if any.
    fn cached(&self, body: &Arc<[u8]>) -> Option<Decoded> {
        let d = self.decoded.get(&address(body))?;
        let same = d.body.upgrade().is_some_and(|b| Arc::ptr_eq(&b, body));
        (same && d.array.strong_count() > 0).then(|| d.clone())
    }

    fn remember(&mut self, body: &Arc<[u8]>, array: &Arc<BloomArray>, seq: Option<u32>) {
        let entry = Decoded {
            body: Arc::downgrade(body),
            array: Arc::downgrade(array),
            seq,
        };
        self.decoded.insert(address(body), entry);
        self.prune();
    }

    /// Drops the entries whose array nobody holds any more, once they have doubled.
    fn prune(&mut self) {
        let len = self.decoded.len() + self.derived.len();
        if len < 1024 || len < 2 * self.pruned_at {
            return;
        }
        self.decoded.retain(|_, d| d.array.strong_count() > 0);
        self.derived
            .retain(|_, d| d.array.strong_count() > 0 && d.base.strong_count() > 0);
        self.pruned_at = self.decoded.len() + self.derived.len();
    }
}

impl Arrays for SharedArrays {
    /// The whole summary in `body` (a `GET /meshcache-internal/summary` response).
    fn full(&mut self, body: &Arc<[u8]>) -> Result<Full, WireError> {
        if let Some(d) = self.cached(body) {
            if let (Some(array), Some(seq)) = (d.array.upgrade(), d.seq) {
                return Ok(Some((array, seq)));
            }
        }
        let full = wire::decode_full(body)?;
        let seq = full.seq;
        let Some(array) = array_of(full) else {
            return Ok(None);
        };
        let array = Arc::new(array);
        self.remember(body, &array, Some(seq));
        Ok(Some((array, seq)))
    }

    /// The Cache Digest in `body`.
    fn digest(&mut self, body: &Arc<[u8]>) -> Result<Arc<BloomArray>, DigestError> {
        if let Some(array) = self.cached(body).and_then(|d| d.array.upgrade()) {
            return Ok(array);
        }
        let array = Arc::new(BloomArray::from_digest(&CacheDigest::decode(body)?));
        self.remember(body, &array, None);
        Ok(array)
    }
}

impl Deltas for SharedArrays {
    fn apply(&mut self, array: &mut Arc<BloomArray>, update: &DirUpdate) {
        if let Some(own) = Arc::get_mut(array) {
            // No other reader, and no entry names it as a base: change it in place.
            apply_delta(own, update);
            return;
        }
        let key = (address(array), update.seq);
        if let Some(d) = self.derived.get(&key) {
            let same = d.base.upgrade().is_some_and(|b| Arc::ptr_eq(&b, array));
            if let (true, Some(after)) = (same, d.array.upgrade()) {
                *array = after;
                return;
            }
        }
        let mut after = BloomArray::clone(array);
        apply_delta(&mut after, update);
        let after = Arc::new(after);
        let entry = Derived {
            base: Arc::downgrade(array),
            array: Arc::downgrade(&after),
        };
        self.derived.insert(key, entry);
        *array = after;
        self.prune();
    }
}

/// An allocation's address, which names it while a weak reference keeps it.
fn address<T: ?Sized>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a).cast::<u8>() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcache_dcm::summary::{InPlace, LocalSummary, PeerSummaries};
    use meshcache_dcm::PeerId;
    use meshcache_summary::Hashing;
    use std::time::{Duration, Instant};

    fn key(i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        for (j, b) in k.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761).rotate_left(j as u32 * 5) >> (j % 4 * 8)) as u8;
        }
        k
    }

    /// Readers that share arrays see exactly what readers with their own copies see, and
    /// hold one array per version between them.
    #[test]
    fn shared_readers_agree_with_private_ones_and_share_one_array() {
        let mut sender = LocalSummary::new(2000, 8, Hashing::DIGEST, 0.01, 7);
        for i in 0..500 {
            sender.admitted(&key(i));
        }
        let body: Arc<[u8]> = wire::encode_full(&sender.full_array()).unwrap().into();
        let now = Instant::now();
        let mut shared = SharedArrays::default();
        let mut readers: Vec<PeerSummaries> = (0..4)
            .map(|_| PeerSummaries::new(1, Duration::from_secs(1)))
            .collect();
        let mut private = PeerSummaries::new(1, Duration::from_secs(1));
        let p = PeerId(0);
        private.install_full(now, p, wire::decode_full(&body).unwrap(), 1);
        for r in &mut readers {
            let (array, seq) = shared.full(&body).unwrap().unwrap();
            r.install_array(now, p, array, Some(seq), 1);
        }
        let arrays = |shared: &SharedArrays| {
            shared
                .decoded
                .values()
                .filter(|d| d.array.strong_count() > 0)
                .count()
                + shared
                    .derived
                    .values()
                    .filter(|d| d.array.strong_count() > 0)
                    .count()
        };
        assert_eq!(arrays(&shared), 1);
        for round in 0..5u32 {
            for i in 0..60 {
                sender.admitted(&key(1000 + round * 100 + i));
                sender.removed(&key(round * 60 + i));
            }
            for u in sender.take_updates() {
                private.on_update_with(now, p, u.clone(), 1, &mut InPlace);
                for r in &mut readers {
                    r.on_update_with(now, p, u.clone(), 1, &mut shared);
                }
            }
            // Every reader is at the same version: one live array between them.
            assert_eq!(arrays(&shared), 1, "round {round}");
        }
        for i in 0..3000 {
            let want = private.candidates(&key(i), |_| true);
            for r in &mut readers {
                assert_eq!(r.candidates(&key(i), |_| true), want, "key {i}");
            }
        }
        assert_eq!(
            readers[0].reports(now)[0].entries,
            private.reports(now)[0].entries
        );
    }

    /// A reader that holds the only reference, with no entry naming it, changes it in place.
    #[test]
    fn an_own_array_changes_in_place() {
        let mut sender = LocalSummary::new(1000, 8, Hashing::DIGEST, 0.01, 1);
        let body: Arc<[u8]> = wire::encode_full(&sender.full_array()).unwrap().into();
        let mut shared = SharedArrays::default();
        let (mut array, _) = shared.full(&body).unwrap().unwrap();
        let before = Arc::as_ptr(&array);
        drop(body);
        for i in 0..50 {
            sender.admitted(&key(i));
        }
        let update = sender.take_updates().remove(0);
        // Once no entry names it (the body's entry is dropped here), the array is its own.
        shared.decoded.clear();
        shared.apply(&mut array, &update);
        assert_eq!(Arc::as_ptr(&array), before, "changed in place");
        assert!(array.bits_set() > 0);
    }
}
