//! A node's side of the summary exchange, without I/O: what it publishes ([`Sender`]) and what
//! it holds of its peers ([`Receiver`]), for Summary Cache and for Squid's Cache Digests.
//!
//! The proxy (`coop/summary.rs`: tasks, an ICP socket, HTTP) and the simulator
//! (`proto/summary.rs`: a virtual clock and network) drive these two with their own timers and
//! transport. The rules are here, once:
//!
//! - who we exchange with ([`exchanges`]);
//! - how our filter is sized (the store's bytes at [`pace::AVG_OBJECT_SIZE`] an object, unless
//!   configured), when a store change makes work for the sender ([`Sender::change`]), when the
//!   next update may go ([`Sender::drain_at`]: [`pace::UPDATE_SPACING`] after the last) and
//!   what it carries ([`Sender::drain`]: the encoded datagrams, and a resize when the store
//!   outgrew the filter), when a digest is rebuilt after a resize ([`Sender::resized`]), what
//!   we serve ([`Sender::digest`], [`Sender::full`]: encoded once per version of the filter);
//! - what a peer's update does ([`Receiver::on_update`]: a stranger or a malformed datagram is
//!   refused; one that shows a gap asks for a fetch), which fetches are due
//!   ([`Receiver::fetch_due`]: wanted ones, and digests whose `Expires` came), what a fetched
//!   body does ([`Receiver::fetched`]: installed, or refused with a reason; a digest is fetched
//!   again when it expires, between a second and the rebuild period).
//!
//! Each half sits behind a lock of its own in the proxy: the store's events reach the sender
//! under the store's lock, while lookups read the receiver.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meshcache_summary::{BloomArray, CacheDigest, DigestError, Hashing};
use meshcache_wire::summary::{self as wire, DirUpdate};
use meshcache_wire::WireError;

use super::{
    array_of, pace, Deltas, InPlace, LocalSummary, PeerSummaries, Rejection, UpdateVerdict,
};
use crate::peer::PeerId;

/// Which summary protocol a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Summary Cache: whole arrays over HTTP, deltas by ICP (`ICP_OP_DIRUPDATE`), candidates
    /// asked by ICP.
    Summary,
    /// Squid's Cache Digests: whole digests over HTTP, rebuilt periodically, candidates
    /// fetched from directly.
    Digest,
}

/// How a node's own summary is made.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Which protocol.
    pub flavor: Flavor,
    /// Documents the filter is sized for; 0: from `store_bytes`.
    pub capacity: u32,
    /// The store's byte budget (memory and disks).
    pub store_bytes: u64,
    /// Counting-filter bits per document.
    pub bits_per_entry: u8,
    /// Hash functions (4: Squid's digest hashing).
    pub hash_functions: u16,
    /// The share of changed documents that makes an update due.
    pub threshold: f64,
    /// How long a digest we build is good for (it is rebuilt that often).
    pub digest_period: Duration,
}

/// Whether a node running `flavor` exchanges summaries with a peer: not with one marked
/// `no_digest`, and with Summary Cache only over ICP (the deltas travel by it).
pub fn exchanges(flavor: Flavor, no_digest: bool, has_icp: bool) -> bool {
    !no_digest && (flavor != Flavor::Summary || has_icp)
}

/// A digest we built, as we serve it.
#[derive(Clone, Debug)]
pub struct Published {
    /// The encoded digest.
    pub body: Arc<[u8]>,
    /// When it was built.
    pub built: SystemTime,
    /// When it should be fetched again (`Expires`).
    pub expires: SystemTime,
}

/// What a wake-up of the sender has to do.
#[derive(Debug, Default)]
pub struct Drained {
    /// Update datagrams (`ICP_OP_DIRUPDATE`), each to go to every peer we exchange with.
    pub updates: Vec<Arc<[u8]>>,
    /// The filter no longer fits the store: rebuild it from the store's keys for this many
    /// documents ([`Sender::rebuild`], or [`LocalSummary::empty_like`] and
    /// [`LocalSummary::install`] by a caller that fills it without holding us), then call
    /// [`Sender::resized`].
    pub resize: Option<u32>,
}

/// Our own summary: the counting filter over the store's keys, the updates it publishes and
/// the digest or whole array it serves.
#[derive(Debug)]
pub struct Sender {
    flavor: Flavor,
    summary: LocalSummary,
    /// The smallest capacity a resize picks (from the store's bytes).
    min_capacity: u32,
    digest_period: Duration,
    /// No update goes out before this.
    next_update: Option<Instant>,
    /// Wake-ups that sent updates.
    rounds: u64,
    published: Option<Published>,
    /// The whole array encoded, and the filter's version it encodes.
    served_full: Option<(u64, Arc<[u8]>)>,
}

impl Sender {
    /// An empty summary made as `settings` say, numbering its updates from `first_seq` (pick
    /// it at random: a restart then shows as a jump), naming `sender` in them.
    pub fn new(settings: &Settings, first_seq: u32, sender: Option<Ipv4Addr>) -> Sender {
        let min_capacity = pace::min_capacity(settings.store_bytes);
        let capacity = if settings.capacity > 0 {
            settings.capacity
        } else {
            min_capacity
        };
        let hashing = Hashing::with_functions(settings.hash_functions).unwrap_or(Hashing::DIGEST);
        let mut summary = LocalSummary::new(
            capacity,
            settings.bits_per_entry,
            hashing,
            settings.threshold,
            first_seq,
        );
        if let Some(ip) = sender {
            summary.set_sender(ip);
        }
        Sender {
            flavor: settings.flavor,
            summary,
            min_capacity,
            digest_period: settings.digest_period,
            next_update: None,
            rounds: 0,
            published: None,
            served_full: None,
        }
    }

    /// The protocol.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// A store event: the object with `key` was stored (`admitted`) or left the store.
    pub fn change(&mut self, key: &[u8; 16], admitted: bool) {
        self.summary.change(key, admitted);
    }

    /// Whether the sender has work: an update is due (Summary Cache; a digest is rebuilt on
    /// its schedule only) or the filter no longer fits the store.
    pub fn has_work(&self) -> bool {
        (self.flavor == Flavor::Summary && self.summary.due())
            || self.summary.resize_to(self.min_capacity).is_some()
    }

    /// When work found at `now` is done: at once, or for Summary Cache's updates not before
    /// [`pace::UPDATE_SPACING`] after the last.
    pub fn drain_at(&self, now: Instant) -> Instant {
        match (self.flavor, self.next_update) {
            (Flavor::Summary, Some(next)) => now.max(next),
            _ => now,
        }
    }

    /// The work due at `now`: the updates to send (encoded), and a resize to make.
    pub fn drain(&mut self, now: Instant) -> Drained {
        let mut drained = Drained::default();
        if self.flavor == Flavor::Summary && self.summary.due() {
            let updates = self.summary.take_updates();
            drained.updates = updates.iter().filter_map(encode).collect();
            if !updates.is_empty() {
                self.rounds += 1;
                self.next_update = Some(now + pace::UPDATE_SPACING);
            }
        }
        drained.resize = self.summary.resize_to(self.min_capacity);
        drained
    }

    /// Rebuilds the filter for `capacity` documents from the store's `keys`, then does what
    /// follows a resize ([`Sender::resized`]).
    pub fn rebuild<'a>(
        &mut self,
        now: SystemTime,
        capacity: u32,
        keys: impl IntoIterator<Item = &'a [u8; 16]>,
    ) {
        self.summary.rebuild(capacity, keys);
        self.resized(now);
    }

    /// The filter was rebuilt: a digest is republished at once (its peers would otherwise
    /// read the old size until the next period).
    pub fn resized(&mut self, now: SystemTime) {
        if self.flavor == Flavor::Digest {
            self.publish(now);
        }
    }

    /// Rebuilds the digest we serve from the filter, good for the digest period from `now`.
    pub fn publish(&mut self, now: SystemTime) {
        self.published = Some(Published {
            body: self.summary.digest().encode().into(),
            built: now,
            expires: now + self.digest_period,
        });
    }

    /// The digest we serve: none before the first [`Sender::publish`], or when our hashing is
    /// not Squid's.
    pub fn digest(&self) -> Option<&Published> {
        (self.summary.filter().hashing() == Hashing::DIGEST)
            .then_some(self.published.as_ref())
            .flatten()
    }

    /// Our whole array, encoded (once per version of the filter, however many peers read it);
    /// `None` when it does not encode (a filter too large for the wire).
    pub fn full(&mut self) -> Option<Arc<[u8]>> {
        let version = self.summary.version();
        if self.served_full.as_ref().is_none_or(|(v, _)| *v != version) {
            self.served_full = wire::encode_full(&self.summary.full_array())
                .ok()
                .map(|body| (version, body.into()));
        }
        self.served_full.as_ref().map(|(_, body)| body.clone())
    }

    /// The summary itself (counters, the filter).
    pub fn summary(&self) -> &LocalSummary {
        &self.summary
    }

    /// The summary, for a caller that rebuilds it without holding us
    /// ([`LocalSummary::empty_like`], [`LocalSummary::install`]).
    pub fn summary_mut(&mut self) -> &mut LocalSummary {
        &mut self.summary
    }

    /// Wake-ups that sent updates.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }
}

/// One update as its datagram. Updates [`LocalSummary::take_updates`] makes always encode
/// (at most [`meshcache_wire::summary::MAX_UPDATES_PER_DATAGRAM`] changes each).
fn encode(update: &DirUpdate) -> Option<Arc<[u8]>> {
    let mut datagram = Vec::with_capacity(wire::DIRUPDATE_HEADER + 4 * update.updates.len());
    wire::encode_dirupdate(update, &mut datagram).ok()?;
    Some(datagram.into())
}

/// How fetched bodies become arrays. [`InPlace`] decodes each on its own; the simulator lets
/// the readers of one body share its array.
pub trait Arrays: Deltas {
    /// A whole summary (`GET /meshcache-internal/summary`): its array and sequence number, or
    /// `None` when its hash parameters are not ones we know.
    fn full(&mut self, body: &Arc<[u8]>) -> Result<Option<(Arc<BloomArray>, u32)>, WireError>;
    /// A Cache Digest (`GET /squid-internal-periodic/store_digest`).
    fn digest(&mut self, body: &Arc<[u8]>) -> Result<Arc<BloomArray>, DigestError>;
}

impl Arrays for InPlace {
    fn full(&mut self, body: &Arc<[u8]>) -> Result<Option<(Arc<BloomArray>, u32)>, WireError> {
        let full = wire::decode_full(body)?;
        let seq = full.seq;
        Ok(array_of(full).map(|array| (Arc::new(array), seq)))
    }

    fn digest(&mut self, body: &Arc<[u8]>) -> Result<Arc<BloomArray>, DigestError> {
        let digest = CacheDigest::decode(body)?;
        Ok(Arc::new(BloomArray::from_digest(&digest)))
    }
}

/// Why a peer's update datagram was refused.
#[derive(Debug, thiserror::Error)]
pub enum BadUpdate {
    /// It came from an address that is none of the peers we exchange summaries with.
    #[error("from a source we exchange no summaries with")]
    Stranger,
    /// It did not decode.
    #[error("malformed: {0}")]
    Malformed(#[from] WireError),
}

/// A fetched summary that was refused, and why (for the log).
#[derive(Debug)]
pub struct Refused {
    /// The reason counted.
    pub why: Rejection,
    /// The decoder's words.
    pub error: String,
}

/// What we hold of our peers' summaries, and when to fetch them.
#[derive(Debug)]
pub struct Receiver {
    flavor: Flavor,
    peers: PeerSummaries,
    /// Per peer: whether we exchange summaries with it (fixed).
    exchanging: Vec<bool>,
    /// Digests: when each peer's is fetched again.
    refresh: Refresh,
    digest_period: Duration,
}

impl Receiver {
    /// Nothing held yet of the peers (`exchanging[i]`: whether we exchange with peer `i`,
    /// [`exchanges`]); every summary is wanted.
    pub fn new(settings: &Settings, exchanging: Vec<bool>) -> Receiver {
        let peers = exchanging.len();
        Receiver {
            flavor: settings.flavor,
            peers: PeerSummaries::new(peers, pace::MIN_FETCH_INTERVAL),
            exchanging,
            refresh: Refresh::new(peers),
            digest_period: settings.digest_period,
        }
    }

    /// Whether we exchange summaries with `peer`.
    pub fn exchanging(&self, peer: PeerId) -> bool {
        self.exchanging.get(peer.0).copied().unwrap_or(false)
    }

    /// The peers whose summary may hold `key`, among those we exchange with (counted as
    /// lookups).
    pub fn candidates(&mut self, key: &[u8; 16]) -> Vec<PeerId> {
        let exchanging = &self.exchanging;
        self.peers
            .candidates(key, |p| exchanging.get(p.0).copied().unwrap_or(false))
    }

    /// `peer` did not have what its summary promised.
    pub fn false_hit(&mut self, peer: PeerId) {
        self.peers.false_hit(peer);
    }

    /// An update datagram from `peer` (the peer at its source address, if any), its deltas
    /// applied by `deltas`. One that does not follow the last is held and asks for a fetch
    /// ([`UpdateVerdict::Held`]).
    pub fn on_update(
        &mut self,
        now: Instant,
        peer: Option<PeerId>,
        datagram: &[u8],
        deltas: &mut impl Deltas,
    ) -> Result<UpdateVerdict, BadUpdate> {
        let peer = peer
            .filter(|&p| self.exchanging(p))
            .ok_or(BadUpdate::Stranger)?;
        let update = wire::decode_dirupdate(datagram)?;
        Ok(self
            .peers
            .on_update_with(now, peer, update, datagram.len() as u64, deltas))
    }

    /// The peers whose whole summary (or digest) should be fetched now, in order: those
    /// wanted (from the start, after a gap, a restart or a refusal's back-off), and digests
    /// whose refresh time came. Report each with [`Receiver::fetched`] or
    /// [`Receiver::failed`].
    pub fn fetch_due(&mut self, now: Instant) -> Vec<PeerId> {
        if self.flavor == Flavor::Digest {
            while let Some(peer) = self.refresh.take_due(now) {
                self.peers.want_full(peer);
            }
        }
        let mut due = self.peers.fetch_due(now);
        due.retain(|&p| self.exchanging(p));
        due
    }

    /// `peer`'s fetch brought `body`, with the `Expires` a digest carries as a time from now
    /// (`None`: absent or past). Decoded by `arrays` and installed, or refused (the peer is
    /// then a miss for everything until a later fetch).
    pub fn fetched(
        &mut self,
        now: Instant,
        peer: PeerId,
        body: &Arc<[u8]>,
        expires_in: Option<Duration>,
        arrays: &mut impl Arrays,
    ) -> Result<(), Refused> {
        let bytes = body.len() as u64;
        let refused = match self.flavor {
            Flavor::Digest => match arrays.digest(body) {
                Ok(array) => {
                    self.peers.install_array(now, peer, array, None, bytes);
                    let ttl = expires_in.unwrap_or(self.digest_period).clamp(
                        Duration::from_secs(1),
                        self.digest_period.max(Duration::from_secs(1)),
                    );
                    self.refresh.set(peer, now + ttl);
                    return Ok(());
                }
                Err(e) => Refused {
                    why: match e {
                        DigestError::TooFull { .. } => Rejection::TooFull,
                        _ => Rejection::Malformed,
                    },
                    error: e.to_string(),
                },
            },
            Flavor::Summary => match arrays.full(body) {
                Ok(Some((array, seq))) => {
                    self.peers.install_array(now, peer, array, Some(seq), bytes);
                    return Ok(());
                }
                Ok(None) => {
                    // Counted as malformed; still wanted.
                    self.peers.refuse_hashing(peer);
                    return Err(Refused {
                        why: Rejection::Malformed,
                        error: "hash parameters we do not know".into(),
                    });
                }
                Err(e) => Refused {
                    why: match e {
                        WireError::TooFull { .. } => Rejection::TooFull,
                        _ => Rejection::Malformed,
                    },
                    error: e.to_string(),
                },
            },
        };
        self.peers.reject(now, peer, refused.why);
        Err(refused)
    }

    /// `peer`'s fetch failed (no answer, or an error status): tried again after a back-off.
    pub fn failed(&mut self, now: Instant, peer: PeerId) {
        self.peers.reject(now, peer, Rejection::FetchFailed);
    }

    /// Whether some peer's whole summary is wanted: a later fetch check has work.
    pub fn any_wanted(&self) -> bool {
        self.peers.any_wanted()
    }

    /// The earliest time a digest is to be fetched again.
    pub fn next_refresh(&mut self) -> Option<Instant> {
        self.refresh.first()
    }

    /// The peers' summaries (counters, reports).
    pub fn peers(&self) -> &PeerSummaries {
        &self.peers
    }
}

/// When each peer's digest is to be fetched again, in time order: a heap of plans, of which
/// only those that match `at` count (a plan replaced or taken leaves a stale entry behind,
/// dropped when it reaches the top). A heap is a flat array: a thousand nodes planning a
/// thousand refreshes each fill it in a tenth of the time a tree takes.
#[derive(Debug)]
struct Refresh {
    at: Vec<Option<Instant>>,
    order: BinaryHeap<Reverse<(Instant, usize)>>,
}

impl Refresh {
    fn new(peers: usize) -> Refresh {
        Refresh {
            at: vec![None; peers],
            order: BinaryHeap::new(),
        }
    }

    /// `peer`'s digest is fetched again at `when` (instead of any earlier plan).
    fn set(&mut self, peer: PeerId, when: Instant) {
        if let Some(slot) = self.at.get_mut(peer.0) {
            *slot = Some(when);
            self.order.push(Reverse((when, peer.0)));
            if self.order.len() > 2 * self.at.len() + 16 {
                let at = &self.at;
                self.order
                    .retain(|&Reverse((when, peer))| at[peer] == Some(when));
            }
        }
    }

    /// Drops stale plans from the top.
    fn settle(&mut self) {
        while let Some(&Reverse((when, peer))) = self.order.peek() {
            if self.at[peer] == Some(when) {
                return;
            }
            self.order.pop();
        }
    }

    /// The earliest refresh time planned.
    fn first(&mut self) -> Option<Instant> {
        self.settle();
        self.order.peek().map(|&Reverse((when, _))| when)
    }

    /// A peer whose refresh time has come by `now`, taken out of the plan.
    fn take_due(&mut self, now: Instant) -> Option<PeerId> {
        let when = self.first()?;
        if when > now {
            return None;
        }
        let Reverse((_, peer)) = self.order.pop()?;
        self.at[peer] = None;
        Some(PeerId(peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(flavor: Flavor) -> Settings {
        Settings {
            flavor,
            // Sized from the store: 1,000 documents, the least a resize picks.
            capacity: 0,
            store_bytes: 1000 * pace::AVG_OBJECT_SIZE,
            bits_per_entry: 8,
            hash_functions: 4,
            threshold: 0.01,
            digest_period: Duration::from_secs(60),
        }
    }

    fn key(i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k[4..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9).to_le_bytes());
        k[8..12].copy_from_slice(&i.rotate_left(13).wrapping_mul(0x85eb_ca6b).to_le_bytes());
        k[12..].copy_from_slice(&(!i).wrapping_mul(0xc2b2_ae35).to_le_bytes());
        k
    }

    #[test]
    fn updates_wait_for_the_spacing_and_reach_a_receiver_that_fetched_the_whole_array() {
        let t0 = Instant::now();
        let s = settings(Flavor::Summary);
        let mut sender = Sender::new(&s, 7, Some(Ipv4Addr::new(127, 0, 0, 2)));
        let mut receiver = Receiver::new(&s, vec![true, false]);
        assert_eq!(
            receiver.fetch_due(t0),
            vec![PeerId(0)],
            "exchanging peers only"
        );
        let full = sender.full().expect("encodes");
        assert!(
            Arc::ptr_eq(&full, &sender.full().expect("encodes")),
            "encoded once per version"
        );
        receiver
            .fetched(t0, PeerId(0), &full, None, &mut InPlace)
            .expect("installed");
        assert!(
            receiver.any_wanted(),
            "peer 1 is never fetched: we do not exchange with it"
        );

        for i in 0..9 {
            sender.change(&key(i), true);
        }
        assert!(!sender.has_work(), "1 % of 1,000 is ten documents");
        sender.change(&key(9), true);
        assert!(sender.has_work());
        assert_eq!(sender.drain_at(t0), t0, "the first update goes at once");
        let first = sender.drain(t0);
        assert_eq!(first.updates.len(), 1);
        assert_eq!(first.resize, None);
        assert_eq!(sender.rounds(), 1);
        assert_eq!(sender.drain_at(t0), t0 + pace::UPDATE_SPACING);
        let from = Some(PeerId(0));
        let v = receiver.on_update(t0, from, &first.updates[0], &mut InPlace);
        assert_eq!(v.expect("accepted"), UpdateVerdict::Applied);
        assert_eq!(receiver.candidates(&key(3)), vec![PeerId(0)]);

        // The second update is lost on the way: the third shows a gap and asks for a fetch.
        for i in 10..20 {
            sender.change(&key(i), true);
        }
        assert_eq!(sender.drain(t0 + pace::UPDATE_SPACING).updates.len(), 1);
        for i in 20..40 {
            sender.change(&key(i), true);
        }
        let third = sender.drain(t0 + 2 * pace::UPDATE_SPACING);
        let v = receiver.on_update(t0, from, &third.updates[0], &mut InPlace);
        assert_eq!(v.expect("accepted"), UpdateVerdict::Held);
        let at = t0 + pace::MIN_FETCH_INTERVAL;
        assert_eq!(receiver.fetch_due(at), vec![PeerId(0)]);
        let whole = sender.full().expect("encodes");
        assert!(!Arc::ptr_eq(&whole, &full), "a new version, encoded anew");
        receiver
            .fetched(at, PeerId(0), &whole, None, &mut InPlace)
            .expect("installed");
        assert_eq!(receiver.candidates(&key(15)), vec![PeerId(0)]);
        assert_eq!(receiver.candidates(&key(39)), vec![PeerId(0)]);
    }

    #[test]
    fn strangers_and_garbage_are_refused_and_leave_nothing_behind() {
        let t0 = Instant::now();
        let s = settings(Flavor::Summary);
        let mut receiver = Receiver::new(&s, vec![true, false]);
        for (peer, datagram) in [
            (None, &b"anything"[..]),
            (Some(PeerId(1)), b"from a peer we do not exchange with"),
            (Some(PeerId(5)), b"from no peer at all"),
        ] {
            assert!(matches!(
                receiver.on_update(t0, peer, datagram, &mut InPlace),
                Err(BadUpdate::Stranger)
            ));
        }
        assert!(matches!(
            receiver.on_update(t0, Some(PeerId(0)), b"\x00\x01", &mut InPlace),
            Err(BadUpdate::Malformed(_))
        ));
        let garbage: Arc<[u8]> = Arc::from(&b"not a summary"[..]);
        let refused = receiver
            .fetched(t0, PeerId(0), &garbage, None, &mut InPlace)
            .expect_err("refused");
        assert_eq!(refused.why, Rejection::Malformed);
        assert!(!receiver.peers().has(PeerId(0)));
        assert!(receiver.fetch_due(t0).is_empty(), "backing off");
        assert!(receiver.any_wanted());
    }

    #[test]
    fn a_digest_is_fetched_again_when_it_expires_within_a_second_and_the_period() {
        let t0 = Instant::now();
        let s = settings(Flavor::Digest);
        let mut sender = Sender::new(&s, 1, None);
        assert!(sender.digest().is_none(), "not before the first publish");
        sender.change(&key(1), true);
        assert!(
            !sender.has_work(),
            "a digest is rebuilt on its schedule only"
        );
        sender.publish(SystemTime::UNIX_EPOCH);
        let published = sender.digest().expect("published").clone();
        assert_eq!(published.expires, SystemTime::UNIX_EPOCH + s.digest_period);

        let mut receiver = Receiver::new(&s, vec![true]);
        assert_eq!(receiver.fetch_due(t0), vec![PeerId(0)]);
        receiver
            .fetched(
                t0,
                PeerId(0),
                &published.body,
                Some(Duration::from_millis(10)),
                &mut InPlace,
            )
            .expect("installed");
        assert_eq!(receiver.candidates(&key(1)), vec![PeerId(0)]);
        assert!(!receiver.any_wanted());
        assert_eq!(receiver.next_refresh(), Some(t0 + Duration::from_secs(1)));
        assert!(receiver
            .fetch_due(t0 + Duration::from_millis(999))
            .is_empty());
        assert_eq!(
            receiver.fetch_due(t0 + Duration::from_secs(1)),
            vec![PeerId(0)]
        );
        receiver
            .fetched(
                t0,
                PeerId(0),
                &published.body,
                Some(Duration::from_secs(3600)),
                &mut InPlace,
            )
            .expect("installed");
        assert_eq!(receiver.next_refresh(), Some(t0 + s.digest_period));

        // A hashing that is not Squid's serves no digest.
        let mut other = settings(Flavor::Digest);
        other.hash_functions = 5;
        let mut sender = Sender::new(&other, 1, None);
        sender.publish(SystemTime::UNIX_EPOCH);
        assert!(sender.digest().is_none());
    }

    #[test]
    fn a_store_that_outgrows_the_filter_asks_for_a_resize_and_a_digest_is_republished() {
        let s = settings(Flavor::Digest);
        let mut sender = Sender::new(&s, 1, None);
        let keys: Vec<[u8; 16]> = (0..1300).map(key).collect();
        for k in &keys {
            sender.change(k, true);
        }
        assert!(sender.has_work());
        let drained = sender.drain(Instant::now());
        assert!(drained.updates.is_empty(), "digests send no updates");
        let capacity = drained.resize.expect("resize");
        assert!(capacity >= 1300);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(5);
        sender.rebuild(at, capacity, keys.iter());
        assert!(!sender.has_work());
        assert_eq!(sender.digest().expect("republished").built, at);
        assert_eq!(sender.summary().filter().entries(), 1300);
    }

    #[test]
    fn who_we_exchange_with() {
        assert!(exchanges(Flavor::Summary, false, true));
        assert!(!exchanges(Flavor::Summary, false, false), "deltas need ICP");
        assert!(exchanges(Flavor::Digest, false, false));
        assert!(!exchanges(Flavor::Digest, true, true), "no_digest");
    }
}
