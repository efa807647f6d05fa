//! Search by summaries: Summary Cache (SC-ICP) and Squid's Cache Digests, without I/O.
//!
//! Two halves, both driven by the proxy (or the simulator) with explicit time:
//!
//! - [`LocalSummary`] is our own summary: a counting Bloom filter over the store's keys, fed by
//!   the store-event stream (admitted → add; evicted or invalidated → remove). It remembers
//!   which bits changed since the last update it published and how many documents changed;
//!   when that share passes the threshold (the paper's 1 % by default), [`LocalSummary::take_updates`]
//!   returns the `ICP_OP_DIRUPDATE` messages to send, each with the next sequence number and
//!   the new value of every changed bit (idempotent set/clear words, so a duplicate or
//!   reordered message does no harm). [`LocalSummary::full_array`] is the whole array for a
//!   peer that starts, restarts or lost deltas, and [`LocalSummary::digest`] the same filter as
//!   a Squid Cache Digest.
//! - [`PeerSummaries`] holds what the neighbours told us: one bit array per peer, from a full
//!   array (or a Cache Digest) and the deltas that followed. A delta that does not follow the
//!   last one (a gap: lost deltas; a jump back: the peer restarted, its numbering starts at a
//!   random point) or that uses other hash parameters asks for a full fetch
//!   ([`PeerSummaries::fetch_due`]); deltas that arrive while it is under way are kept and
//!   replayed. A summary that fails the checks is dropped with a counted reason: that peer is
//!   then a miss for everything, never a hit for everything.
//!
//! On a miss, [`PeerSummaries::candidates`] names the peers whose summary says "maybe":
//! Summary Cache asks just those by ICP, one at a time ([`Walk`]); Cache Digests goes straight
//! to them. Every lookup, summary hit and false hit is counted per peer, so the false-positive
//! rate can be compared with the Bloom formula.

use std::cmp::Reverse;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshcache_summary::hashing::Positions;
use meshcache_summary::{BitChange, BloomArray, CacheDigest, CountingBloom, Hashing};
use meshcache_wire::summary::{DirUpdate, FullArray, HashParams, Update, MAX_UPDATES_PER_DATAGRAM};
use serde::Serialize;

use crate::icp::{IcpMesh, Search};
use crate::peer::{PeerId, Role};
use crate::select::{Hop, Route};

pub mod exchange;
pub mod pace;

/// The paper's default share of changed documents that triggers an update (1 %).
pub const DEFAULT_THRESHOLD: f64 = 0.01;

/// Our own summary and the changes not yet published.
#[derive(Debug)]
pub struct LocalSummary {
    filter: CountingBloom,
    /// Bits changed since the last update (in the order they changed, possibly more than once;
    /// their current value is the filter's). Deduplicated when taken, or when it grows past
    /// twice the number of bits (a protocol that never takes updates): at most one sort of
    /// `bits` entries per `bits` changes.
    pending: Vec<u32>,
    /// Reused for the bits one admission or removal changes.
    scratch: Vec<BitChange>,
    /// Documents added and removed since the last update.
    added_docs: u64,
    removed_docs: u64,
    threshold: f64,
    /// Sequence number of the last update published.
    seq: u32,
    sender: Ipv4Addr,
    /// Counts the changes to what [`LocalSummary::full_array`] returns.
    version: u64,
    stats: LocalStats,
}

/// Counters of our own summary.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LocalStats {
    /// Update messages produced.
    pub updates: u64,
    /// Bytes of those messages.
    pub update_bytes: u64,
    /// Bit changes they carried.
    pub bit_changes: u64,
    /// Times the filter was rebuilt from the store (resize, or lost store events).
    pub rebuilds: u64,
}

/// Adds every key to a counting filter.
pub fn add_all<'a>(filter: &mut CountingBloom, keys: impl IntoIterator<Item = &'a [u8; 16]>) {
    let mut sink = Vec::new();
    for key in keys {
        filter.add(key, &mut sink);
        sink.clear();
    }
}

impl LocalSummary {
    /// An empty summary sized for `capacity` documents at `bits_per_entry`, publishing
    /// updates when `threshold` (a share, e.g. 0.01) of its documents changed. `first_seq` is
    /// where update numbering starts: pick it at random, so a restart shows as a jump.
    pub fn new(
        capacity: u32,
        bits_per_entry: u8,
        hashing: Hashing,
        threshold: f64,
        first_seq: u32,
    ) -> LocalSummary {
        LocalSummary {
            filter: CountingBloom::with_hashing(capacity, bits_per_entry, hashing),
            pending: Vec::new(),
            scratch: Vec::new(),
            added_docs: 0,
            removed_docs: 0,
            threshold,
            seq: first_seq,
            sender: Ipv4Addr::UNSPECIFIED,
            version: 0,
            stats: LocalStats::default(),
        }
    }

    /// Sets the address put in the sender field of updates.
    pub fn set_sender(&mut self, sender: Ipv4Addr) {
        self.sender = sender;
    }

    /// A store event: the object with `key` was stored (`admitted`) or left the store.
    pub fn change(&mut self, key: &[u8; 16], admitted: bool) {
        if admitted {
            self.admitted(key);
        } else {
            self.removed(key);
        }
    }

    /// An object was stored.
    pub fn admitted(&mut self, key: &[u8; 16]) {
        let mut changes = std::mem::take(&mut self.scratch);
        self.filter.add(key, &mut changes);
        self.added_docs += 1;
        self.note(&mut changes);
        self.scratch = changes;
    }

    /// An object left the store (evicted or invalidated).
    pub fn removed(&mut self, key: &[u8; 16]) {
        let mut changes = std::mem::take(&mut self.scratch);
        self.filter.remove(key, &mut changes);
        self.removed_docs += 1;
        self.note(&mut changes);
        self.scratch = changes;
    }

    /// Records the bits in `changes` as pending, and empties it.
    fn note(&mut self, changes: &mut Vec<BitChange>) {
        self.version += 1;
        // Bit indexes fit the wire's 32 bits: the array's size is a u32 there.
        self.pending.extend(
            changes
                .drain(..)
                .map(|c| u32::try_from(c.bit).unwrap_or(u32::MAX)),
        );
        if self.pending.len() as u64 > 2 * self.filter.bits().max(64) {
            self.pending.sort_unstable();
            self.pending.dedup();
        }
    }

    /// Whether the filter no longer fits the store: more documents than it was sized for by
    /// a quarter (its fill, and so its false hits, climb), or far fewer. Returns the capacity
    /// to rebuild with.
    pub fn resize_to(&self, min_capacity: u32) -> Option<u32> {
        let entries = self.filter.entries();
        let capacity = u64::from(self.filter.capacity());
        let want = (entries + entries / 2).max(u64::from(min_capacity));
        let want = u32::try_from(want).unwrap_or(u32::MAX);
        if entries > capacity + capacity / 4 || (capacity > 4 * u64::from(want)) {
            Some(want)
        } else {
            None
        }
    }

    /// Rebuilds the filter from the store's keys (after a resize, or when store events were
    /// lost). Peers notice a jump in the update numbering and fetch the whole array.
    pub fn rebuild<'a>(&mut self, capacity: u32, keys: impl IntoIterator<Item = &'a [u8; 16]>) {
        let mut filter = self.empty_like(capacity);
        add_all(&mut filter, keys);
        self.install(filter);
    }

    /// An empty filter of our kind (bits per entry, hashing) sized for `capacity`: for a
    /// caller that fills it ([`add_all`]) without holding us, then [`LocalSummary::install`]s it.
    pub fn empty_like(&self, capacity: u32) -> CountingBloom {
        CountingBloom::with_hashing(
            capacity,
            self.filter.bits_per_entry(),
            self.filter.hashing(),
        )
    }

    /// Replaces the filter with one rebuilt from the store (see [`LocalSummary::empty_like`]).
    /// Peers notice a jump in the update numbering and fetch the whole array.
    pub fn install(&mut self, filter: CountingBloom) {
        self.version += 1;
        self.filter = filter;
        self.pending.clear();
        self.added_docs = 0;
        self.removed_docs = 0;
        // Skip a number: receivers see a gap and fetch the whole (new) array.
        self.seq = self.seq.wrapping_add(2);
        self.stats.rebuilds += 1;
    }

    /// Whether enough documents changed since the last update to publish one: the paper's
    /// share of "new" documents (not yet in the published summary) reached the threshold.
    /// Removals count on their own, not on top: a full cache admits one document for each it
    /// evicts, and the update that announces the new ones clears the evicted ones' bits too;
    /// a cache that only loses documents (purges) still publishes. The share is of the
    /// documents cached, or of the documents the summary is sized for while the cache is
    /// still filling (an empty cache would otherwise send an update for every one of its first
    /// hundred documents, and about 100·ln(N) updates on its way to N).
    pub fn due(&self) -> bool {
        let entries = self
            .filter
            .entries()
            .max(u64::from(self.filter.capacity()))
            .max(1) as f64;
        !self.pending.is_empty() && self.changed_docs() as f64 >= self.threshold * entries
    }

    /// The hash parameters as the wire carries them.
    pub fn params(&self) -> HashParams {
        let h = self.filter.hashing();
        HashParams {
            functions: h.functions(),
            function_bits: h.function_bits(),
            bits: u32::try_from(self.filter.bits()).unwrap_or(u32::MAX),
        }
    }

    /// The pending changes as update messages (at most [`MAX_UPDATES_PER_DATAGRAM`] changes
    /// each, one sequence number each); the pending list is emptied.
    pub fn take_updates(&mut self) -> Vec<DirUpdate> {
        let params = self.params();
        self.version += 1;
        let mut bits = std::mem::take(&mut self.pending);
        bits.sort_unstable();
        bits.dedup();
        let updates: Vec<Update> = bits
            .into_iter()
            .map(|bit| Update {
                bit,
                set: self.filter.is_set(u64::from(bit)),
            })
            .collect();
        self.added_docs = 0;
        self.removed_docs = 0;
        updates
            .chunks(MAX_UPDATES_PER_DATAGRAM)
            .map(|chunk| {
                self.seq = self.seq.wrapping_add(1);
                self.stats.updates += 1;
                self.stats.update_bytes += 32 + 4 * chunk.len() as u64;
                self.stats.bit_changes += chunk.len() as u64;
                DirUpdate {
                    seq: self.seq,
                    sender: self.sender,
                    params,
                    updates: chunk.to_vec(),
                }
            })
            .collect()
    }

    /// The whole array as it is now, numbered with the last update published (the deltas
    /// still pending are in it already; applying them again changes nothing).
    pub fn full_array(&self) -> FullArray {
        FullArray {
            seq: self.seq,
            params: self.params(),
            entries: u32::try_from(self.filter.entries()).unwrap_or(u32::MAX),
            mask: self.filter.mask(),
        }
    }

    /// A number that changes whenever [`LocalSummary::full_array`] (and so the digest) would:
    /// a driver that serves one encoding to many readers keeps it until then.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The filter as a Squid Cache Digest (meaningful to Squid with [`Hashing::DIGEST`]).
    pub fn digest(&self) -> CacheDigest {
        self.filter.snapshot()
    }

    /// Whether the summary may hold `key`.
    pub fn contains(&self, key: &[u8; 16]) -> bool {
        self.filter.contains(key)
    }

    /// The counting filter.
    pub fn filter(&self) -> &CountingBloom {
        &self.filter
    }

    /// Counters.
    pub fn stats(&self) -> &LocalStats {
        &self.stats
    }

    /// Documents changed since the last update, as the threshold counts them: the larger of
    /// the documents added and the documents removed.
    pub fn changed_docs(&self) -> u64 {
        self.added_docs.max(self.removed_docs)
    }
}

/// Summary Cache's search of one miss: the peers whose summary says "maybe", asked by ICP one
/// at a time.
///
/// A summary hit is nearly always a real one (a false hit is as rare as the Bloom filter's
/// false-positive rate, about 1 % a lookup at 8 bits per entry), and an object that several
/// peers hold is in several summaries. Asking every candidate at once would cost a query and a
/// reply per holder to find one copy (in the lab's four-sibling workload with remote hits, a
/// quarter of the queries). So the sibling with the shortest ICP round trip is asked first, and
/// the next only after a MISS: a false hit falls through to the next candidate, and after the
/// last to the parents or the origin. The last step also asks the parents whose summary says
/// "maybe" (their MISSes rank them, as in ICP), so a walk that finds nothing ends on the route
/// ICP would take. A timeout ends the walk: the wait it allowed is spent.
///
/// The driver calls [`Walk::step`] and runs the search it returns, until [`Walk::ends`] says
/// the route it got is final.
#[derive(Clone, Debug)]
pub struct Walk {
    /// Sibling candidates not asked yet; the next one last.
    siblings: Vec<PeerId>,
    /// Parent candidates, asked with the last sibling.
    parents: Vec<PeerId>,
    /// The sibling the current step asks.
    asked: Option<PeerId>,
}

impl Walk {
    /// The walk over `hits`, the candidates of a miss. Siblings are asked only for
    /// `hierarchical` requests (as [`IcpMesh::begin`] does).
    pub fn new(mesh: &IcpMesh, hits: &[PeerId], hierarchical: bool) -> Walk {
        let peers = mesh.peers();
        let role = |id: &PeerId| peers.get(id.0).map(|p| p.spec.role);
        let mut siblings: Vec<PeerId> = hits
            .iter()
            .filter(|id| hierarchical && role(id) == Some(Role::Sibling))
            .copied()
            .collect();
        // Fastest last, so that `pop` takes it; peers never heard from after every measured one.
        siblings.sort_by_key(|id| Reverse((peers[id.0].rtt_ms.unwrap_or(u32::MAX), id.0)));
        let parents = hits
            .iter()
            .filter(|id| role(id) == Some(Role::Parent))
            .copied()
            .collect();
        Walk {
            siblings,
            parents,
            asked: None,
        }
    }

    /// Starts the next step: the next sibling alone, or the last one with the parent
    /// candidates. With nothing left to ask, the search is decided at once (the parents or the
    /// origin).
    pub fn step(
        &mut self,
        mesh: &mut IcpMesh,
        now: Instant,
        url: &str,
        host: &str,
        hierarchical: bool,
    ) -> Search {
        self.asked = self.siblings.pop();
        let mut among: Vec<PeerId> = self.asked.into_iter().collect();
        if self.siblings.is_empty() {
            among.extend_from_slice(&self.parents);
        }
        mesh.begin_among(now, url, host, hierarchical, &among)
    }

    /// Whether `route`, what the step just taken decided, is the search's answer: the sibling
    /// it asked has the object, the step timed out, or nobody is left to ask.
    pub fn ends(&self, route: &Route) -> bool {
        let first = match route.hops.first() {
            Some(Hop::Peer { peer, .. }) => Some(*peer),
            _ => None,
        };
        self.siblings.is_empty() || route.timed_out || (first.is_some() && first == self.asked)
    }
}

/// What became of a delta update from a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateVerdict {
    /// Applied: it followed the previous one.
    Applied,
    /// A duplicate or older than the array we hold: nothing to do.
    Stale,
    /// Kept until the whole array arrives (a fetch is due or under way).
    Held,
    /// Not from a peer that exchanges summaries.
    Unknown,
}

/// Why a peer's summary was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    /// The body did not decode (truncated, wrong size, unknown version, bad parameters).
    Malformed,
    /// More than 65 % of its bits are set: it would call almost everything a hit.
    TooFull,
    /// The fetch failed or the peer answered with an error.
    FetchFailed,
}

/// Counters of one peer's summary.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SummaryStats {
    /// Misses looked up in its summary.
    pub lookups: u64,
    /// Lookups its summary answered "maybe".
    pub summary_hits: u64,
    /// Summary hits the peer did not have (ICP MISS, or 504 to `only-if-cached`).
    pub false_hits: u64,
    /// The false hits the Bloom formula expects, summed over lookups: each lookup adds
    /// `(1 − e^(−kn/m))^k` for the summary as it was then.
    pub expected_false_hits: f64,
    /// Whole arrays (or digests) installed.
    pub full_fetches: u64,
    /// Bytes of those.
    pub full_bytes: u64,
    /// Delta messages received.
    pub updates: u64,
    /// Bytes of those.
    pub update_bytes: u64,
    /// Deltas that showed a gap or a restart (a full fetch followed).
    pub gaps: u64,
    /// Summaries refused, by reason.
    pub rejected_malformed: u64,
    /// Summaries refused as more than 65 % full.
    pub rejected_too_full: u64,
    /// Fetches that failed.
    pub fetch_failures: u64,
}

impl SummaryStats {
    /// The observed false-positive rate: false hits over lookups of objects the peer did not
    /// hold (every lookup but the true hits). `None` before any such lookup.
    pub fn observed_fp_rate(&self) -> Option<f64> {
        let true_hits = self.summary_hits.saturating_sub(self.false_hits);
        let negatives = self.lookups.saturating_sub(true_hits);
        (negatives > 0).then(|| self.false_hits as f64 / negatives as f64)
    }
}

#[derive(Debug, Default)]
struct PeerSummary {
    /// Shared with other readers of the same version where the driver shares them
    /// ([`Deltas`]); the proxy's are its own.
    array: Option<Arc<BloomArray>>,
    /// The Bloom formula's false-positive rate for `array` as it is (kept for the lookups'
    /// expected-false-hit count: a `powf` per lookup showed in profiles).
    formula_fp_rate: f64,
    /// Sequence number the array is current to (None for a Cache Digest: no deltas).
    seq: Option<u32>,
    received: Option<Instant>,
    /// A full fetch is wanted.
    want_full: bool,
    /// When the next full fetch may start.
    next_fetch: Option<Instant>,
    failures: u32,
    /// Deltas received while a full fetch was due.
    held: Vec<DirUpdate>,
    stats: SummaryStats,
}

impl PeerSummary {
    /// Sets `want_full`, keeping `wanted` (the count of peers with it set) true.
    fn want(&mut self, flag: bool, wanted: &mut usize) {
        if self.want_full != flag {
            self.want_full = flag;
            if flag {
                *wanted += 1;
            } else {
                *wanted -= 1;
            }
        }
    }

    fn set_array(&mut self, array: Option<Arc<BloomArray>>) {
        self.formula_fp_rate = array.as_deref().map_or(0.0, BloomArray::formula_fp_rate);
        self.array = array;
    }
}

/// How a delta reaches a peer's array. The proxy reads each peer's summary once and changes
/// its array in place ([`InPlace`]); the simulator holds a thousand nodes that read the same
/// sender's summary, and lets every reader of one version share one array.
pub trait Deltas {
    /// Makes `array` (the sender's as of the version before `update`) the array after it.
    fn apply(&mut self, array: &mut Arc<BloomArray>, update: &DirUpdate);
}

/// Deltas applied to the reader's own array (copied first only if someone else holds it).
#[derive(Debug, Default, Clone, Copy)]
pub struct InPlace;

impl Deltas for InPlace {
    fn apply(&mut self, array: &mut Arc<BloomArray>, update: &DirUpdate) {
        apply_delta(Arc::make_mut(array), update);
    }
}

/// Applies `update`'s bit changes to `array`. Deltas carry no document count: it is estimated
/// from the bits set.
pub fn apply_delta(array: &mut BloomArray, update: &DirUpdate) {
    for u in &update.updates {
        array.put(u64::from(u.bit), u.set);
    }
    let estimate = array.estimated_entries();
    array.set_entries(estimate);
}

/// The array a whole summary describes; `None` when its hash parameters are not ones we know.
pub fn array_of(full: FullArray) -> Option<BloomArray> {
    let hashing = Hashing::new(full.params.functions, full.params.function_bits)?;
    Some(BloomArray::from_mask(
        hashing,
        u64::from(full.params.bits),
        full.mask,
        u64::from(full.entries),
    ))
}

/// The most deltas kept while waiting for a whole array.
const MAX_HELD: usize = 256;

/// The neighbours' summaries.
#[derive(Debug)]
pub struct PeerSummaries {
    peers: Vec<PeerSummary>,
    /// How many peers' whole summary is wanted.
    wanted: usize,
    /// The shortest wait between two full fetches from one peer.
    min_interval: Duration,
}

/// One peer's summary, as `/stats` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerSummaryReport {
    /// Whether we hold a usable summary.
    pub valid: bool,
    /// Its size in bits.
    pub bits: u64,
    /// Documents it summarises (as the peer counts them).
    pub entries: u64,
    /// Share of bits set.
    pub fill: f64,
    /// The false-positive rate the Bloom formula gives for its entries and size now.
    pub formula_fp_rate: f64,
    /// The formula's rate averaged over the lookups made (summaries change as caches fill).
    pub formula_fp_rate_over_lookups: Option<f64>,
    /// The false-positive rate its fill implies (`fill^k`).
    pub fill_fp_rate: f64,
    /// The false-positive rate observed (false hits over lookups of absent objects).
    pub observed_fp_rate: Option<f64>,
    /// Seconds since it was last updated.
    pub age_s: Option<f64>,
    /// Counters.
    pub stats: SummaryStats,
}

impl PeerSummaries {
    /// No summaries yet for `peers` peers; every one is due for a full fetch.
    pub fn new(peers: usize, min_interval: Duration) -> PeerSummaries {
        PeerSummaries {
            peers: (0..peers)
                .map(|_| PeerSummary {
                    want_full: true,
                    ..PeerSummary::default()
                })
                .collect(),
            wanted: peers,
            min_interval,
        }
    }

    /// Peers (among `exchanging`) whose summary may hold `key`; counts the lookups.
    pub fn candidates(
        &mut self,
        key: &[u8; 16],
        exchanging: impl Fn(PeerId) -> bool,
    ) -> Vec<PeerId> {
        let mut hits = Vec::new();
        // The key's positions, computed once for each shape of array (most peers' are alike).
        let mut shape: Option<(Hashing, u64, Positions)> = None;
        for (i, p) in self.peers.iter_mut().enumerate() {
            let Some(array) = &p.array else { continue };
            if !exchanging(PeerId(i)) {
                continue;
            }
            p.stats.lookups += 1;
            p.stats.expected_false_hits += p.formula_fp_rate;
            let (hashing, bits) = (array.hashing(), array.bits());
            let positions = match &shape {
                Some((h, b, at)) if *h == hashing && *b == bits => at,
                _ => {
                    &shape
                        .insert((hashing, bits, hashing.positions(key, bits)))
                        .2
                }
            };
            if array.contains_at(positions) {
                p.stats.summary_hits += 1;
                hits.push(PeerId(i));
            }
        }
        hits
    }

    /// A summary hit turned out false: the peer did not have the object.
    pub fn false_hit(&mut self, peer: PeerId) {
        if let Some(p) = self.peers.get_mut(peer.0) {
            p.stats.false_hits += 1;
        }
    }

    /// Installs a Cache Digest fetched from `peer` (`bytes` long).
    pub fn install_digest(&mut self, now: Instant, peer: PeerId, digest: &CacheDigest, bytes: u64) {
        let array = Arc::new(BloomArray::from_digest(digest));
        self.install_array(now, peer, array, None, bytes);
    }

    /// Installs a whole summary array fetched from `peer` (`bytes` long), then replays the
    /// deltas that came while it was on its way.
    pub fn install_full(&mut self, now: Instant, peer: PeerId, full: FullArray, bytes: u64) {
        let seq = full.seq;
        match array_of(full) {
            Some(array) => self.install_array(now, peer, Arc::new(array), Some(seq), bytes),
            None => self.refuse_hashing(peer),
        }
    }

    /// A whole summary from `peer` named hash parameters we do not know ([`array_of`] gave
    /// `None`): counted as malformed, and the peer is a miss for everything until the next.
    pub fn refuse_hashing(&mut self, peer: PeerId) {
        if let Some(p) = self.peers.get_mut(peer.0) {
            p.stats.rejected_malformed += 1;
            p.set_array(None);
        }
    }

    /// Installs `array` as `peer`'s summary (`bytes` long on the wire): a whole summary current
    /// to `seq` ([`array_of`]), whose held deltas are then replayed, or a Cache Digest
    /// (`seq` `None`: no deltas follow). For a driver that shares one array among its readers;
    /// [`install_full`] and [`install_digest`] build their own.
    ///
    /// [`install_full`]: PeerSummaries::install_full
    /// [`install_digest`]: PeerSummaries::install_digest
    pub fn install_array(
        &mut self,
        now: Instant,
        peer: PeerId,
        array: Arc<BloomArray>,
        seq: Option<u32>,
        bytes: u64,
    ) {
        let Some(p) = self.peers.get_mut(peer.0) else {
            return;
        };
        p.set_array(Some(array));
        p.seq = seq;
        p.received = Some(now);
        p.want(false, &mut self.wanted);
        p.failures = 0;
        p.stats.full_fetches += 1;
        p.stats.full_bytes += bytes;
        let Some(seq) = seq else {
            return;
        };
        let mut held = std::mem::take(&mut p.held);
        held.sort_by_key(|u| u.seq.wrapping_sub(seq));
        for u in held {
            if u.seq.wrapping_sub(seq) as i32 > 0 {
                let _ = self.on_update(now, peer, u, 0);
            }
        }
    }

    /// A delta update from `peer` (`bytes` on the wire), applied to our own copy.
    pub fn on_update(
        &mut self,
        now: Instant,
        peer: PeerId,
        update: DirUpdate,
        bytes: u64,
    ) -> UpdateVerdict {
        self.on_update_with(now, peer, update, bytes, &mut InPlace)
    }

    /// A delta update from `peer` (`bytes` on the wire), applied by `deltas`.
    pub fn on_update_with(
        &mut self,
        now: Instant,
        peer: PeerId,
        update: DirUpdate,
        bytes: u64,
        deltas: &mut impl Deltas,
    ) -> UpdateVerdict {
        let Some(p) = self.peers.get_mut(peer.0) else {
            return UpdateVerdict::Unknown;
        };
        if bytes > 0 {
            p.stats.updates += 1;
            p.stats.update_bytes += bytes;
        }
        let same_params = p.array.as_ref().is_some_and(|a| {
            let h = a.hashing();
            h.functions() == update.params.functions
                && h.function_bits() == update.params.function_bits
                && a.bits() == u64::from(update.params.bits)
        });
        let follows = match p.seq {
            Some(seq) => {
                let ahead = update.seq.wrapping_sub(seq) as i32;
                if same_params && ahead <= 0 && ahead > -(MAX_HELD as i32) {
                    return UpdateVerdict::Stale;
                }
                same_params && ahead == 1
            }
            None => false,
        };
        if p.want_full || !follows {
            if !p.want_full {
                p.stats.gaps += 1;
                p.want(true, &mut self.wanted);
            }
            if p.held.len() < MAX_HELD {
                p.held.push(update);
            }
            return UpdateVerdict::Held;
        }
        if let Some(array) = &mut p.array {
            deltas.apply(array, &update);
            p.formula_fp_rate = array.formula_fp_rate();
        }
        p.seq = Some(update.seq);
        p.received = Some(now);
        UpdateVerdict::Applied
    }

    /// A summary from `peer` was refused, or could not be fetched: it no longer counts (the
    /// peer is a miss for everything) and the next fetch waits, longer after each failure.
    pub fn reject(&mut self, now: Instant, peer: PeerId, why: Rejection) {
        let Some(p) = self.peers.get_mut(peer.0) else {
            return;
        };
        match why {
            Rejection::Malformed => p.stats.rejected_malformed += 1,
            Rejection::TooFull => p.stats.rejected_too_full += 1,
            Rejection::FetchFailed => p.stats.fetch_failures += 1,
        }
        if why != Rejection::FetchFailed {
            p.set_array(None);
            p.seq = None;
        }
        p.want(true, &mut self.wanted);
        p.failures = p.failures.saturating_add(1);
        let backoff = self.min_interval * 2u32.saturating_pow(p.failures.min(6));
        p.next_fetch = Some(now + backoff);
    }

    /// Peers whose whole summary should be fetched now; each is then not due again for the
    /// minimum interval (the caller reports the result with an `install_*` or [`reject`]).
    ///
    /// [`reject`]: PeerSummaries::reject
    pub fn fetch_due(&mut self, now: Instant) -> Vec<PeerId> {
        let mut due = Vec::new();
        for (i, p) in self.peers.iter_mut().enumerate() {
            if p.want_full && p.next_fetch.is_none_or(|t| now >= t) {
                p.next_fetch = Some(now + self.min_interval);
                due.push(PeerId(i));
            }
        }
        due
    }

    /// Asks for a fresh whole summary from `peer` (a Cache Digest's refresh time came, or the
    /// peer restarted).
    pub fn want_full(&mut self, peer: PeerId) {
        if let Some(p) = self.peers.get_mut(peer.0) {
            p.want(true, &mut self.wanted);
        }
    }

    /// Whether some peer's whole summary is wanted (fetched, refused or not yet due again).
    pub fn any_wanted(&self) -> bool {
        self.wanted > 0
    }

    /// Whether we hold a summary of `peer`.
    pub fn has(&self, peer: PeerId) -> bool {
        self.peers.get(peer.0).is_some_and(|p| p.array.is_some())
    }

    /// Memory of the peers' arrays, in bytes.
    pub fn memory(&self) -> usize {
        self.peers
            .iter()
            .filter_map(|p| p.array.as_deref())
            .map(BloomArray::memory)
            .sum()
    }

    /// Per-peer figures.
    pub fn reports(&self, now: Instant) -> Vec<PeerSummaryReport> {
        self.peers
            .iter()
            .map(|p| {
                let a = p.array.as_deref();
                PeerSummaryReport {
                    valid: a.is_some(),
                    bits: a.map_or(0, BloomArray::bits),
                    entries: a.map_or(0, BloomArray::entries),
                    fill: a.map_or(0.0, BloomArray::fill),
                    formula_fp_rate: a.map_or(0.0, BloomArray::formula_fp_rate),
                    fill_fp_rate: a.map_or(0.0, BloomArray::fill_fp_rate),
                    observed_fp_rate: p.stats.observed_fp_rate(),
                    formula_fp_rate_over_lookups: (p.stats.lookups > 0)
                        .then(|| p.stats.expected_false_hits / p.stats.lookups as f64),
                    age_s: p
                        .received
                        .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                    stats: p.stats.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Well-mixed stand-ins for MD5 keys (splitmix64).
    fn key(i: u32) -> [u8; 16] {
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let a = mix(u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let b = mix(a ^ 0x5851_f42d_4c95_7f2d);
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&a.to_be_bytes());
        k[8..].copy_from_slice(&b.to_be_bytes());
        k
    }

    fn local(threshold: f64) -> LocalSummary {
        LocalSummary::new(1000, 8, Hashing::DIGEST, threshold, 100)
    }

    #[test]
    fn updates_follow_the_threshold_and_carry_the_changes() {
        let mut l = local(0.01);
        for i in 0..200 {
            l.admitted(&key(i));
        }
        assert!(l.due());
        let ups = l.take_updates();
        assert_eq!(ups.len(), 3, "about 800 changed bits in 360-bit messages");
        assert_eq!(
            ups.iter().map(|u| u.seq).collect::<Vec<_>>(),
            vec![101, 102, 103]
        );
        assert!(!l.due());
        // 1 % of the 1,000 documents it is sized for (more than the 200 it holds): ten
        // new documents make the next update due, nine do not; an eviction for each does
        // not count on top.
        for i in 0..9 {
            l.removed(&key(i));
            l.admitted(&key(500 + i));
        }
        assert_eq!(l.changed_docs(), 9);
        assert!(!l.due());
        l.admitted(&key(600));
        assert!(l.due());
        l.take_updates();
        // Removals alone publish too.
        for i in 10..20 {
            l.removed(&key(i));
        }
        assert!(l.due());
    }

    #[test]
    fn a_peer_follows_through_deltas_and_a_full_array() {
        let mut l = local(0.01);
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        let now = Instant::now();
        let p = PeerId(0);
        assert_eq!(peers.fetch_due(now), vec![p]);
        for i in 0..100 {
            l.admitted(&key(i));
        }
        peers.install_full(now, p, l.full_array(), 100);
        assert!((0..100).all(|i| peers.candidates(&key(i), |_| true) == vec![p]));
        for i in 100..150 {
            l.admitted(&key(i));
        }
        for i in 0..50 {
            l.removed(&key(i));
        }
        for u in l.take_updates() {
            assert_eq!(peers.on_update(now, p, u, 1), UpdateVerdict::Applied);
        }
        let mine = l.full_array();
        let theirs = peers.peers[0].array.as_ref().expect("array");
        assert_eq!(
            theirs.mask(),
            &mine.mask[..],
            "deltas reproduce the array exactly"
        );
        assert!(peers.fetch_due(now).is_empty());
    }

    #[test]
    fn changes_never_taken_stay_bounded_and_still_reproduce_the_array() {
        // A Cache Digests node follows the store but never sends deltas: thousands of
        // admissions and evictions through a 100-document filter.
        let mut l = LocalSummary::new(100, 8, Hashing::DIGEST, 0.01, 7);
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        let now = Instant::now();
        let p = PeerId(0);
        for i in 0..80 {
            l.admitted(&key(i));
        }
        peers.install_full(now, p, l.full_array(), 100);
        let bits = l.filter().bits();
        for i in 80..20_080 {
            l.admitted(&key(i));
            l.removed(&key(i - 80));
            assert!(
                l.pending.len() as u64 <= 2 * bits.max(64) + 8,
                "{}",
                l.pending.len()
            );
        }
        let ups = l.take_updates();
        let changed: Vec<u32> = ups
            .iter()
            .flat_map(|u| u.updates.iter().map(|c| c.bit))
            .collect();
        assert!(
            changed.windows(2).all(|w| w[0] < w[1]),
            "each bit once, in order"
        );
        for u in ups {
            assert_eq!(peers.on_update(now, p, u, 1), UpdateVerdict::Applied);
        }
        let theirs = peers.peers[0].array.as_ref().expect("array");
        assert_eq!(theirs.mask(), &l.full_array().mask[..]);
    }

    #[test]
    fn a_lost_delta_asks_for_the_whole_array_and_replays_what_came_meanwhile() {
        let mut l = local(0.0);
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        let p = PeerId(0);
        peers.install_full(t0, p, l.full_array(), 0);
        l.admitted(&key(1));
        let lost = l.take_updates();
        assert_eq!(lost.len(), 1);
        l.admitted(&key(2));
        let next = l.take_updates().remove(0);
        assert_eq!(peers.on_update(t0, p, next.clone(), 1), UpdateVerdict::Held);
        assert_eq!(peers.peers[0].stats.gaps, 1);
        // The fetch started before `next` and the array it returns predates it.
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(peers.fetch_due(t1), vec![p]);
        let mut old = l.full_array();
        old.seq = next.seq - 1;
        peers.install_full(t1, p, old, 0);
        assert_eq!(
            peers.peers[0].seq,
            Some(next.seq),
            "the held delta was replayed"
        );
        // A duplicate is harmless.
        assert_eq!(peers.on_update(t1, p, next, 1), UpdateVerdict::Stale);
    }

    #[test]
    fn a_restart_or_new_parameters_ask_for_the_whole_array() {
        let mut l = local(0.0);
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        let now = Instant::now();
        let p = PeerId(0);
        peers.install_full(now, p, l.full_array(), 0);
        let mut restarted = LocalSummary::new(1000, 8, Hashing::DIGEST, 0.0, 9_000_000);
        restarted.admitted(&key(3));
        let u = restarted.take_updates().remove(0);
        assert_eq!(peers.on_update(now, p, u, 1), UpdateVerdict::Held);
        // A rebuild skips a number.
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        peers.install_full(now, p, l.full_array(), 0);
        l.rebuild(3000, [key(1), key(2)].iter());
        l.admitted(&key(4));
        let u = l.take_updates().remove(0);
        assert_eq!(peers.on_update(now, p, u, 1), UpdateVerdict::Held);
    }

    #[test]
    fn rejected_summaries_make_the_peer_a_miss_and_back_off() {
        let mut l = local(0.0);
        l.admitted(&key(1));
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        let now = Instant::now();
        let p = PeerId(0);
        peers.install_full(now, p, l.full_array(), 0);
        assert_eq!(peers.candidates(&key(1), |_| true), vec![p]);
        peers.reject(now, p, Rejection::TooFull);
        assert!(peers.candidates(&key(1), |_| true).is_empty());
        assert!(peers.fetch_due(now + Duration::from_secs(1)).is_empty());
        assert_eq!(peers.fetch_due(now + Duration::from_secs(3)), vec![p]);
    }

    #[test]
    fn the_observed_false_positive_rate_matches_the_formula() {
        // 2,000 documents at 8 bits each, 4 functions: the formula says 2.4 %.
        let mut l = LocalSummary::new(2000, 8, Hashing::DIGEST, 0.01, 1);
        for i in 0..2000 {
            l.admitted(&key(i));
        }
        let mut peers = PeerSummaries::new(1, Duration::from_secs(1));
        peers.install_full(Instant::now(), PeerId(0), l.full_array(), 0);
        for i in 1_000_000..1_020_000 {
            if !peers.candidates(&key(i), |_| true).is_empty() {
                peers.false_hit(PeerId(0));
            }
        }
        let r = &peers.reports(Instant::now())[0];
        let observed = r.observed_fp_rate.expect("lookups");
        assert!(
            (observed - r.formula_fp_rate).abs() < 0.2 * r.formula_fp_rate,
            "{observed} vs {}",
            r.formula_fp_rate
        );
    }

    #[test]
    fn resize_when_the_store_outgrows_the_filter() {
        let mut l = LocalSummary::new(100, 8, Hashing::DIGEST, 0.01, 1);
        for i in 0..120 {
            l.admitted(&key(i));
        }
        assert_eq!(l.resize_to(10), None);
        for i in 120..130 {
            l.admitted(&key(i));
        }
        assert_eq!(l.resize_to(10), Some(195));
    }

    mod walk {
        use std::net::SocketAddr;

        use super::super::*;
        use crate::icp::{IcpConfig, Outcome, Reply, ReplyKind};
        use crate::peer::PeerSpec;
        use crate::HierCode;

        const URL: &str = "http://a.test/x";

        fn addr(last: u8, port: u16) -> SocketAddr {
            SocketAddr::from(([127, 0, 0, last], port))
        }

        /// Peers on 127.0.0.2 and up: `roles[i]` is peer i's role. Each has answered a first
        /// search, peer i after i + 1 ms (peer 0 is the fastest), except the ones `slow` names,
        /// which took 20 ms.
        fn mesh(roles: &[Role], slow: &[usize], now: Instant) -> IcpMesh {
            let specs = roles
                .iter()
                .enumerate()
                .map(|(i, &role)| {
                    let n = 2 + i as u8;
                    PeerSpec::new(&format!("p{i}"), role, addr(n, 3128), Some(addr(n, 3130)))
                })
                .collect();
            let mut mesh = IcpMesh::new(specs, IcpConfig::default());
            let first = mesh.begin(now, "http://warm/", "warm", true);
            for (i, (id, a)) in first.queries.into_iter().enumerate() {
                let ms = if slow.contains(&id.0) {
                    20
                } else {
                    i as u64 + 1
                };
                let reply = answer(ReplyKind::Miss, first.reqnum, "http://warm/");
                mesh.on_reply(now + Duration::from_millis(ms), a, reply);
            }
            mesh
        }

        fn answer(kind: ReplyKind, reqnum: u32, url: &str) -> Reply<'_> {
            Reply {
                kind,
                reqnum,
                url,
                src_rtt_ms: None,
            }
        }

        /// Peer `peer`'s reply of `kind` to search `reqnum` for [`URL`], at `at`: the route, when
        /// it decides the search.
        fn reply(
            mesh: &mut IcpMesh,
            at: Instant,
            peer: u8,
            kind: ReplyKind,
            reqnum: u32,
        ) -> Option<Route> {
            let from = addr(2 + peer, 3130);
            mesh.on_reply(at, from, answer(kind, reqnum, URL))
                .map(|(_, route)| route)
        }

        fn asked(search: &Search) -> Vec<usize> {
            search.queries.iter().map(|(id, _)| id.0).collect()
        }

        #[test]
        fn candidates_are_asked_one_at_a_time_fastest_first() {
            let now = Instant::now();
            let roles = [Role::Sibling; 3];
            let mut mesh = mesh(&roles, &[0], now);
            let mut walk = Walk::new(&mesh, &[PeerId(0), PeerId(1)], true);
            let first = walk.step(&mut mesh, now, URL, "a.test", true);
            assert_eq!(asked(&first), vec![1], "the faster candidate alone");
            assert!(matches!(first.outcome, Outcome::Wait { .. }));
            // A false hit: its MISS decides the step, and the walk goes on.
            let route = reply(&mut mesh, now, 1, ReplyKind::Miss, first.reqnum)
                .expect("the only expected reply decides");
            assert_eq!(route, Route::direct());
            assert!(!walk.ends(&route));
            let second = walk.step(&mut mesh, now, URL, "a.test", true);
            assert_eq!(asked(&second), vec![0]);
            let route =
                reply(&mut mesh, now, 0, ReplyKind::Hit, second.reqnum).expect("a hit decides");
            assert_eq!(
                route.hops[0],
                Hop::Peer {
                    peer: PeerId(0),
                    code: HierCode::SiblingHit
                }
            );
            assert!(walk.ends(&route));
            assert_eq!(mesh.in_flight(), 0);
        }

        #[test]
        fn a_hit_ends_the_walk_after_one_query() {
            let now = Instant::now();
            let mut mesh = mesh(&[Role::Sibling; 3], &[], now);
            let mut walk = Walk::new(&mesh, &[PeerId(2), PeerId(0), PeerId(1)], true);
            let first = walk.step(&mut mesh, now, URL, "a.test", true);
            assert_eq!(asked(&first), vec![0]);
            let route =
                reply(&mut mesh, now, 0, ReplyKind::Hit, first.reqnum).expect("a hit decides");
            assert!(walk.ends(&route));
        }

        #[test]
        fn the_last_step_asks_the_parent_candidates_too() {
            let now = Instant::now();
            let roles = [Role::Sibling, Role::Sibling, Role::Parent, Role::Parent];
            let mut mesh = mesh(&roles, &[], now);
            let hits = [PeerId(0), PeerId(1), PeerId(2), PeerId(3)];
            let mut walk = Walk::new(&mesh, &hits, true);
            let first = walk.step(&mut mesh, now, URL, "a.test", true);
            assert_eq!(asked(&first), vec![0], "parents wait for the last sibling");
            let route = reply(&mut mesh, now, 0, ReplyKind::Miss, first.reqnum).expect("decided");
            assert!(!walk.ends(&route));
            let last = walk.step(&mut mesh, now, URL, "a.test", true);
            assert_eq!(asked(&last), vec![1, 2, 3]);
            for peer in [1, 2] {
                assert_eq!(
                    reply(&mut mesh, now, peer, ReplyKind::Miss, last.reqnum),
                    None
                );
            }
            let t = now + Duration::from_millis(1);
            let route = reply(&mut mesh, t, 3, ReplyKind::Miss, last.reqnum).expect("all in");
            // The parent whose MISS came first leads, as in ICP.
            assert_eq!(
                route.hops[0],
                Hop::Peer {
                    peer: PeerId(2),
                    code: HierCode::FirstParentMiss
                }
            );
            assert!(walk.ends(&route));
            // Without sibling candidates, the parents are asked at once.
            let mut walk = Walk::new(&mesh, &[PeerId(2), PeerId(3)], true);
            assert_eq!(
                asked(&walk.step(&mut mesh, now, URL, "a.test", true)),
                vec![2, 3]
            );
        }

        #[test]
        fn a_timeout_ends_the_walk() {
            let now = Instant::now();
            let mut mesh = mesh(&[Role::Sibling; 2], &[], now);
            let mut walk = Walk::new(&mesh, &[PeerId(0), PeerId(1)], true);
            let first = walk.step(&mut mesh, now, URL, "a.test", true);
            let Outcome::Wait { deadline } = first.outcome else {
                panic!("waits for the reply")
            };
            let route = mesh.on_deadline(deadline, first.reqnum).expect("undecided");
            assert!(route.timed_out);
            assert!(walk.ends(&route), "the second candidate is not asked");
        }

        #[test]
        fn a_sibling_nobody_waits_for_passes_the_turn_at_once() {
            let now = Instant::now();
            let mut mesh = mesh(&[Role::Sibling; 2], &[], now);
            // Peer 0 stays silent past the dead-peer time: queried, not waited for.
            let later = now + IcpConfig::default().dead_after + Duration::from_secs(1);
            let probe = mesh.begin(now, "http://probe/", "probe", true);
            mesh.on_reply(
                now,
                addr(3, 3130),
                answer(ReplyKind::Miss, probe.reqnum, "http://probe/"),
            );
            let mut walk = Walk::new(&mesh, &[PeerId(0), PeerId(1)], true);
            let first = walk.step(&mut mesh, later, URL, "a.test", true);
            assert_eq!(asked(&first), vec![0]);
            let Outcome::Decided(route) = first.outcome else {
                panic!("nobody to wait for")
            };
            assert!(!walk.ends(&route));
            let second = walk.step(&mut mesh, later, URL, "a.test", true);
            assert_eq!(asked(&second), vec![1]);
        }

        #[test]
        fn requests_that_must_not_ask_siblings_do_not() {
            let now = Instant::now();
            let mut mesh = mesh(&[Role::Sibling; 2], &[], now);
            let mut walk = Walk::new(&mesh, &[PeerId(0), PeerId(1)], false);
            let s = walk.step(&mut mesh, now, URL, "a.test", false);
            assert!(s.queries.is_empty());
            let Outcome::Decided(route) = s.outcome else {
                panic!("decided at once")
            };
            assert!(walk.ends(&route));
        }
    }
}
