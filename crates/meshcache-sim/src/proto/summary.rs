//! Summary Cache (`summary`) and Squid's Cache Digests (`digest`) on the virtual clock: the
//! proxy's summary driver (`meshcache-proxy/src/coop/summary.rs`), calling the same
//! `meshcache-dcm` machines ([`LocalSummary`], [`PeerSummaries`]) and the same wire codecs.
//!
//! Per node, [`NodeState`] holds what the proxy's `Summaries` holds. Its life, function by
//! function of the proxy:
//!
//! - `Summaries::new`: the filter is sized for `summary_capacity` documents, or the store's
//!   bytes at 13 KiB an object (Squid's `store_avg_object_size`), at least 100; the digest is
//!   published at once.
//! - `StoreFollower::changed`: store events are folded into the filter as the store makes
//!   them; when that makes an update due (`summary`) or the filter no longer fits the store,
//!   `run_local` is woken.
//! - `run_local`: with `summary`, it waits until 250 ms after its last update
//!   (`UPDATE_SPACING`), then the updates [`LocalSummary::due`] says are due go by ICP
//!   (`ICP_OP_DIRUPDATE`, encoded once, one datagram per peer and message); a filter that no
//!   longer fits the store is rebuilt from the store's keys (and, with `digest`, republished);
//!   with `digest`, it is rebuilt every `digest_interval`.
//! - `on_update_datagram`: a decoded update goes to [`PeerSummaries::on_update`]; its sender is
//!   alive for ICP (`heard_from`); one that is held (a gap, a restart) asks for a fetch.
//! - `run_fetch`: a check every second (from the start: every summary is wanted then) turns the
//!   digests whose `Expires` came into wanted ones, then fetches what
//!   [`PeerSummaries::fetch_due`] names, one after the other, each an HTTP exchange whose body
//!   is the encoded full array or digest; `fetch_one` decodes it with the wire decoders and
//!   installs it or rejects it. A digest is fetched again when it expires (its `Expires`, whole
//!   seconds, clamped to 1 s..`digest_interval`).
//! - The search: the peers whose summary may hold the object ([`NodeState::candidates`]) go to
//!   the node's engine, whose `SummarySearch` or `DigestSearch` (`meshcache_dcm::protocols`)
//!   runs it as in the proxy. An ICP MISS from a queried peer, or a 504 from a digest's
//!   sibling, is a false hit ([`NodeState::false_hit`]).
//!
//! Timers: `run_local`'s wake-ups and the checks that follow startup or a gap are ticks (work
//! a serial replay waits for, [`Cx::tick`]); digest rebuilds, refreshes and retries after a
//! refused summary are background timers ([`Cx::timer`]), which nothing waits for (the run ends
//! when only they are left).
//! Virtual time 0 is taken to fall on a whole second (HTTP dates have whole seconds).
//!
//! Not modelled: failed or timed-out fetches (`peer_response_timeout` × 2 in the proxy; here
//! a fetch always arrives), the update inbox (a live node applies its peers' updates at its
//! next summary lookup, at most every 50 ms, or within a second when idle; here on arrival),
//! and the false hit a parent's `X-Cache: MISS` makes of a digest's parent hit
//! (the engine tells a protocol of a sibling's 504, not of a parent's miss). With `summary`
//! the proxy also rebuilds a digest for Squid peers; nobody fetches it here, so it is not built.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use meshcache_dcm::summary::{pace, LocalSummary, PeerSummaries, Rejection, UpdateVerdict};
use meshcache_dcm::PeerId;
use meshcache_store::StoreEvent;
use meshcache_summary::{DigestError, Hashing};
use meshcache_wire::summary as wire;
use meshcache_wire::WireError;

use super::Cx;
use crate::mesh::{self, icp_addr, Node, NodeIx};
use crate::net::ns;
use crate::results::{Kind, SummaryReport};
use crate::spec::{Protocol, SimSpec};

/// The pace of the proxy's summary work, in virtual ns.
const UPDATE_SPACING: u64 = pace::UPDATE_SPACING.as_nanos() as u64;
const FETCH_CHECK_INTERVAL: u64 = pace::FETCH_CHECK_INTERVAL.as_nanos() as u64;
/// One second, in ns.
const SECOND: u64 = 1_000_000_000;

/// Encoded bytes, shared by every copy of a message.
#[derive(Clone)]
pub(crate) struct Body(Arc<[u8]>);

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

/// A summary message between nodes.
#[derive(Debug)]
pub(crate) enum Msg {
    /// An `ICP_OP_DIRUPDATE` datagram, as the sender encoded it.
    Update(Body),
    /// `GET /meshcache-internal/summary` (summary) or
    /// `/squid-internal-periodic/store_digest` (digest).
    Fetch,
    /// Its response: the body of a 200 (`None`: an error status), and a digest's `Expires`
    /// (virtual ns, whole seconds).
    Fetched {
        body: Option<Body>,
        expires: Option<u64>,
    },
}

/// One node's summaries: its own and its peers'.
pub(crate) struct NodeState {
    local: LocalSummary,
    peers: PeerSummaries,
    /// The store's bytes at 13 KiB an object, at least 100: the smallest capacity a resize
    /// picks.
    min_capacity: u32,
    /// No update goes out before this (virtual ns).
    next_update: u64,
    /// The digest we serve (digest protocol): its encoding and when it expires.
    published: Option<(Body, u64)>,
    /// The whole summary we serve (summary protocol), encoded once for every reader of its
    /// version ([`LocalSummary::version`]).
    served_full: Option<(u64, Body)>,
    /// Digests: when each peer's digest should be fetched again.
    refresh: Refresh,
    /// Per peer: a whole summary is wanted (what `PeerSummaries` keeps as `want_full`).
    wanting: Wanting,
    /// Per peer: whether we exchange summaries with it (fixed for the run).
    exchanging: Vec<bool>,
    /// Fetches to make, one after the other, and the one under way.
    queue: VecDeque<PeerId>,
    fetching: Option<PeerId>,
    /// A check came while fetches were under way: it runs when they end.
    check_missed: bool,
    /// When `run_local` runs next (it was woken), the next fetch check and digest rebuild.
    drain_at: Option<u64>,
    check_at: Option<u64>,
    rebuild_at: Option<u64>,
    /// Updates published (each one or more messages to every peer).
    update_rounds: u64,
    /// Counters the proxy keeps in `SummaryCounters`.
    updates_sent: u64,
    update_bytes_sent: u64,
    bad_updates: u64,
    served: u64,
    served_bytes: u64,
}

impl NodeState {
    /// The peers whose summary says they may hold `key`, among those we exchange with.
    pub(crate) fn candidates(&mut self, key: &[u8; 16]) -> Vec<PeerId> {
        let exchanging = &self.exchanging;
        self.peers.candidates(key, |p| exchanging[p.0])
    }

    /// `peer` did not have what its summary promised.
    pub(crate) fn false_hit(&mut self, peer: PeerId) {
        self.peers.false_hit(peer);
    }

    /// What `Summaries::new` sets up for `node`.
    pub(crate) fn new(spec: &SimSpec, node: NodeIx, n: &Node) -> NodeState {
        let p = &spec.protocol;
        let memory = if n.is_parent {
            spec.mesh.parent_size
        } else {
            spec.mesh.cache_size
        };
        let min_capacity = pace::min_capacity(memory.as_u64());
        let capacity = if p.summary_capacity > 0 {
            p.summary_capacity
        } else {
            min_capacity
        };
        let hashing = Hashing::with_functions(p.summary_hash_functions).unwrap_or(Hashing::DIGEST);
        // The proxy starts its numbering at a random point; any odd number will do here.
        let first_seq = node.wrapping_mul(0x9e37_79b9).rotate_left(16) | 1;
        let mut local = LocalSummary::new(
            capacity,
            u8::try_from(p.bits_per_entry).unwrap_or(u8::MAX),
            hashing,
            p.summary_threshold,
            first_seq,
        );
        local.set_sender(mesh::ip(node));
        let peers = n.peer_nodes.len();
        let mut s = NodeState {
            local,
            peers: PeerSummaries::new(peers, pace::MIN_FETCH_INTERVAL),
            min_capacity,
            next_update: 0,
            published: None,
            served_full: None,
            refresh: Refresh::new(peers),
            wanting: Wanting::all(peers),
            exchanging: (0..peers).map(|i| exchanging(spec, n, PeerId(i))).collect(),
            queue: VecDeque::new(),
            fetching: None,
            check_missed: false,
            drain_at: None,
            check_at: None,
            rebuild_at: None,
            update_rounds: 0,
            updates_sent: 0,
            update_bytes_sent: 0,
            bad_updates: 0,
            served: 0,
            served_bytes: 0,
        };
        if p.name == Protocol::Digest {
            s.publish(0, ns(p.digest_interval));
        }
        s
    }

    /// Rebuilds the digest we serve from the counting filter (`Summaries::publish`). Only
    /// the digest protocol's peers fetch it, so the summary protocol does not build it.
    fn publish(&mut self, now: u64, period: u64) {
        let body = self.local.digest().encode();
        self.published = Some((Body(body.into()), now + period));
    }
}

/// The peers a node wants a whole summary from, and how many (asked after every fetch).
struct Wanting {
    flags: Vec<bool>,
    count: usize,
}

impl Wanting {
    fn all(peers: usize) -> Wanting {
        Wanting {
            flags: vec![true; peers],
            count: peers,
        }
    }

    fn set(&mut self, peer: PeerId, wanted: bool) {
        if let Some(f) = self.flags.get_mut(peer.0) {
            if *f != wanted {
                *f = wanted;
                if wanted {
                    self.count += 1;
                } else {
                    self.count -= 1;
                }
            }
        }
    }

    fn any(&self) -> bool {
        self.count > 0
    }
}

/// When each peer's digest is to be fetched again, in time order.
struct Refresh {
    at: Vec<Option<u64>>,
    order: BTreeSet<(u64, usize)>,
}

impl Refresh {
    fn new(peers: usize) -> Refresh {
        Refresh {
            at: vec![None; peers],
            order: BTreeSet::new(),
        }
    }

    /// `peer`'s digest is fetched again at `when` (instead of any earlier plan).
    fn set(&mut self, peer: PeerId, when: u64) {
        if let Some(slot) = self.at.get_mut(peer.0) {
            if let Some(old) = slot.replace(when) {
                self.order.remove(&(old, peer.0));
            }
            self.order.insert((when, peer.0));
        }
    }

    /// The earliest refresh time planned.
    fn first(&self) -> Option<u64> {
        self.order.first().map(|&(when, _)| when)
    }

    /// A peer whose refresh time has come by `now`, taken out of the plan.
    fn take_due(&mut self, now: u64) -> Option<PeerId> {
        let &(when, peer) = self.order.first()?;
        if when > now {
            return None;
        }
        self.order.pop_first();
        self.at[peer] = None;
        Some(PeerId(peer))
    }
}

/// Whether `node` exchanges summaries with `peer` (`Summaries::exchanging`: with `summary`,
/// only over ICP; the sim's peers all keep digests).
fn exchanging(spec: &SimSpec, n: &Node, peer: PeerId) -> bool {
    spec.protocol.name != Protocol::Summary || n.engine.mesh().peers()[peer.0].spec.icp.is_some()
}

/// The first multiple of `every` after `t`.
fn after(t: u64, every: u64) -> u64 {
    (t / every + 1) * every
}

/// Before the first request: the first fetch check (every summary is wanted) and, with
/// digests, the rebuild timer.
pub(crate) fn start(cx: &mut Cx<'_>) {
    let period = ns(cx.spec.protocol.digest_interval);
    for node in 0..cx.nodes.len() as NodeIx {
        if !cx.nodes[node as usize].peer_nodes.is_empty() {
            set_check(cx, node, 0, false);
        }
        if cx.spec.protocol.name == Protocol::Digest {
            cx.proto.summary[node as usize].rebuild_at = Some(period);
            cx.timer(period, node);
        }
    }
}

/// `peer` answered 504 to `node`'s `only-if-cached` request. Digest routes list siblings only
/// as digest hits (`CD_SIBLING_HIT`), so with digests that is a false hit; with summaries a
/// sibling is tried after an ICP HIT, and its 504 is no false hit of the summary.
pub(crate) fn on_refused(cx: &mut Cx<'_>, node: NodeIx, peer: PeerId) {
    if cx.spec.protocol.name == Protocol::Digest {
        cx.proto.summary[node as usize].false_hit(peer);
    }
}

/// `node`'s store did `events` (`Summaries::changed`): folded in now; `run_local` is woken
/// when an update is due or the filter no longer fits the store.
pub(crate) fn on_store_events(cx: &mut Cx<'_>, node: NodeIx, events: &[StoreEvent], t: u64) {
    let summary = cx.spec.protocol.name == Protocol::Summary;
    let s = &mut cx.proto.summary[node as usize];
    for e in events {
        s.local.change(&e.key().0, e.is_admission());
    }
    let work = (summary && s.local.due()) || s.local.resize_to(s.min_capacity).is_some();
    if work && s.drain_at.is_none() {
        let at = if summary { t.max(s.next_update) } else { t };
        set_drain(cx, node, at);
    }
}

/// A summary message arrived at `to` (its CPU is done with it at `t`).
pub(crate) fn on_message(cx: &mut Cx<'_>, to: NodeIx, from: NodeIx, msg: Msg, t: u64) {
    match msg {
        Msg::Update(body) => on_update(cx, to, from, &body, t),
        Msg::Fetch => serve(cx, to, from, t),
        Msg::Fetched { body, expires } => fetched(cx, to, body, expires, t),
    }
}

/// A timer of `node` fired: one of its rebuild, drain and fetch check that are due now (each
/// due one has an event of its own, so none waits for another node's at the same instant:
/// every rebuild set for a time comes before the fetches that time's checks make).
pub(crate) fn on_tick(cx: &mut Cx<'_>, node: NodeIx) {
    let now = cx.now;
    let s = &mut cx.proto.summary[node as usize];
    if s.rebuild_at == Some(now) {
        let period = ns(cx.spec.protocol.digest_interval);
        s.publish(now, period);
        s.rebuild_at = Some(now + period);
        cx.timer(now + period, node);
    } else if s.drain_at == Some(now) {
        drain(cx, node);
    } else if s.check_at == Some(now) {
        check(cx, node);
    }
}

/// Wants a drain tick at `at` (the earliest wanted wins; a later tick finds nothing due).
fn set_drain(cx: &mut Cx<'_>, node: NodeIx, at: u64) {
    let s = &mut cx.proto.summary[node as usize];
    if s.drain_at.is_none_or(|d| at < d) {
        s.drain_at = Some(at);
        cx.tick(at, node);
    }
}

/// Wants a fetch check at `at`: as work, or in the background (a timer the run does not wait
/// for).
fn set_check(cx: &mut Cx<'_>, node: NodeIx, at: u64, background: bool) {
    let s = &mut cx.proto.summary[node as usize];
    if s.check_at.is_none_or(|c| at < c) {
        s.check_at = Some(at);
        if background {
            cx.timer(at, node);
        } else {
            cx.tick(at, node);
        }
    }
}

/// `run_local`'s loop body after a wake-up: sends the updates that are due and resizes the
/// filter if the store outgrew it.
fn drain(cx: &mut Cx<'_>, node: NodeIx) {
    let now = cx.now;
    let protocol = cx.spec.protocol.name;
    let s = &mut cx.proto.summary[node as usize];
    s.drain_at = None;
    let updates = if protocol == Protocol::Summary && s.local.due() {
        s.local.take_updates()
    } else {
        Vec::new()
    };
    if !updates.is_empty() {
        s.update_rounds += 1;
        s.next_update = now + UPDATE_SPACING;
        send_updates(cx, node, &updates, now);
    }
    let s = &mut cx.proto.summary[node as usize];
    if let Some(capacity) = s.local.resize_to(s.min_capacity) {
        let store = &cx.nodes[node as usize].store;
        s.local.rebuild(capacity, store.keys().map(|k| &k.0));
        if protocol == Protocol::Digest {
            s.publish(now, ns(cx.spec.protocol.digest_interval));
        }
    }
}

/// Sends each update to every peer we exchange summaries with (`send_updates`).
fn send_updates(cx: &mut Cx<'_>, node: NodeIx, updates: &[wire::DirUpdate], t: u64) {
    let spec = cx.spec;
    let n = &cx.nodes[node as usize];
    let targets: Vec<NodeIx> = (0..n.peer_nodes.len())
        .filter(|&i| {
            exchanging(spec, n, PeerId(i)) && n.engine.mesh().peers()[i].spec.icp.is_some()
        })
        .map(|i| n.peer_nodes[i])
        .collect();
    for u in updates {
        let mut datagram = Vec::with_capacity(wire::DIRUPDATE_HEADER + 4 * u.updates.len());
        if wire::encode_dirupdate(u, &mut datagram).is_err() {
            continue;
        }
        let bytes = datagram.len() as u64;
        let body = Body(datagram.into());
        for &to in &targets {
            let s = &mut cx.proto.summary[node as usize];
            s.updates_sent += 1;
            s.update_bytes_sent += bytes;
            let msg = crate::proto::Msg::Summary(Msg::Update(body.clone()));
            cx.send_proto(node, to, bytes, Kind::Summary, msg, t);
        }
    }
}

/// An update datagram from `from` (`on_update_datagram`).
fn on_update(cx: &mut Cx<'_>, to: NodeIx, from: NodeIx, body: &Body, t: u64) {
    let at = cx.at(t);
    let n = &mut cx.nodes[to as usize];
    let s = &mut cx.proto.summary[to as usize];
    let peer = n
        .engine
        .mesh()
        .peer_at(icp_addr(from))
        .filter(|&p| s.exchanging[p.0]);
    let Some(peer) = peer else {
        // A node that does not list the sender (a parent, for its children).
        s.bad_updates += 1;
        return;
    };
    let Ok(update) = wire::decode_dirupdate(&body.0) else {
        s.bad_updates += 1;
        return;
    };
    n.engine.mesh_mut().heard_from(at, peer);
    let shared = &mut cx.proto.summary_arrays;
    let verdict = s
        .peers
        .on_update_with(at, peer, update, body.0.len() as u64, shared);
    if verdict == UpdateVerdict::Held {
        s.wanting.set(peer, true);
        set_check(cx, to, after(t, FETCH_CHECK_INTERVAL), false);
    }
}

/// A fetch check (`run_fetch`'s loop body): expired digests are wanted again, and what is due
/// is fetched, one peer after the other.
fn check(cx: &mut Cx<'_>, node: NodeIx) {
    let now = cx.now;
    let at = cx.at(now);
    let spec = cx.spec;
    let s = &mut cx.proto.summary[node as usize];
    s.check_at = None;
    if s.fetching.is_some() {
        s.check_missed = true;
        return;
    }
    if spec.protocol.name == Protocol::Digest {
        while let Some(peer) = s.refresh.take_due(now) {
            s.peers.want_full(peer);
            s.wanting.set(peer, true);
        }
    }
    let due = s.peers.fetch_due(at);
    let exchanging = &s.exchanging;
    s.queue.extend(due.into_iter().filter(|p| exchanging[p.0]));
    next_fetch(cx, node, now);
}

/// Starts the next fetch of the check under way or, when none is left, plans the next check.
fn next_fetch(cx: &mut Cx<'_>, node: NodeIx, t: u64) {
    let s = &mut cx.proto.summary[node as usize];
    if let Some(peer) = s.queue.pop_front() {
        s.fetching = Some(peer);
        let to = cx.nodes[node as usize].peer_nodes[peer.0];
        cx.send_http(node, to, 0, crate::proto::Msg::Summary(Msg::Fetch), t);
        return;
    }
    if std::mem::take(&mut s.check_missed) {
        // The checks missed while fetching come at once (tokio's `Burst`).
        set_check(cx, node, t, false);
        return;
    }
    let retry = s.wanting.any();
    let refresh = s.refresh.first();
    if retry {
        // A refused summary, waiting for its back-off: try again at the next check.
        set_check(cx, node, after(t, FETCH_CHECK_INTERVAL), true);
    }
    if let Some(first) = refresh {
        // The first check at or after the earliest digest's refresh time.
        let at = first.div_ceil(FETCH_CHECK_INTERVAL) * FETCH_CHECK_INTERVAL;
        set_check(cx, node, at.max(after(t, FETCH_CHECK_INTERVAL)), true);
    }
}

/// A peer asks for our whole summary or digest (`serve`).
fn serve(cx: &mut Cx<'_>, node: NodeIx, to: NodeIx, t: u64) {
    let s = &mut cx.proto.summary[node as usize];
    let (body, expires, kind) = match cx.spec.protocol.name {
        Protocol::Digest => match &s.published {
            Some((body, expires)) if s.local.filter().hashing() == Hashing::DIGEST => (
                Some(body.clone()),
                Some(expires / SECOND * SECOND),
                Kind::Digest,
            ),
            _ => (None, None, Kind::Digest),
        },
        _ => {
            let version = s.local.version();
            if s.served_full.as_ref().is_none_or(|(v, _)| *v != version) {
                s.served_full = wire::encode_full(&s.local.full_array())
                    .ok()
                    .map(|body| (version, Body(body.into())));
            }
            let body = s.served_full.as_ref().map(|(_, body)| body.clone());
            (body, None, Kind::SummaryFetch)
        }
    };
    let bytes = body.as_ref().map_or(0, |b| b.0.len() as u64);
    if body.is_some() {
        s.served += 1;
        s.served_bytes += bytes;
        cx.count(kind, bytes);
    }
    let msg = crate::proto::Msg::Summary(Msg::Fetched { body, expires });
    cx.send_http(node, to, bytes, msg, t);
}

/// The response to our fetch arrived (`fetch_one`): installed or refused, then the next.
fn fetched(cx: &mut Cx<'_>, node: NodeIx, body: Option<Body>, expires: Option<u64>, t: u64) {
    let at = cx.at(t);
    let period = ns(cx.spec.protocol.digest_interval);
    let protocol = cx.spec.protocol.name;
    let s = &mut cx.proto.summary[node as usize];
    let Some(peer) = s.fetching.take() else {
        return;
    };
    match body {
        None => {
            s.peers.reject(at, peer, Rejection::FetchFailed);
            s.wanting.set(peer, true);
        }
        Some(body) => {
            let bytes = body.0.len() as u64;
            let shared = &mut cx.proto.summary_arrays;
            if protocol == Protocol::Digest {
                match shared.digest(&body.0) {
                    Ok(array) => {
                        s.peers.install_array(at, peer, array, None, bytes);
                        s.wanting.set(peer, false);
                        // `Expires` minus now, as `SystemTime::duration_since`: none when
                        // already past (then the whole period).
                        let ttl = expires
                            .and_then(|e| e.checked_sub(t))
                            .unwrap_or(period)
                            .clamp(SECOND, period.max(SECOND));
                        s.refresh.set(peer, t + ttl);
                    }
                    Err(e) => {
                        let why = match e {
                            DigestError::TooFull { .. } => Rejection::TooFull,
                            _ => Rejection::Malformed,
                        };
                        s.peers.reject(at, peer, why);
                        s.wanting.set(peer, true);
                    }
                }
            } else {
                match shared.full(&body.0) {
                    Ok(full) => {
                        match full {
                            Some((array, seq)) => {
                                s.peers.install_array(at, peer, array, Some(seq), bytes);
                            }
                            None => s.peers.refuse_hashing(peer),
                        }
                        // Refused for unknown hash parameters, it is still wanted.
                        s.wanting.set(peer, !s.peers.has(peer));
                    }
                    Err(e) => {
                        let why = match e {
                            WireError::TooFull { .. } => Rejection::TooFull,
                            _ => Rejection::Malformed,
                        };
                        s.peers.reject(at, peer, why);
                        s.wanting.set(peer, true);
                    }
                }
            }
        }
    }
    next_fetch(cx, node, t);
}

/// Every node's summary counters, summed.
pub(crate) fn report(states: &[NodeState], now: std::time::Instant) -> SummaryReport {
    let mut r = SummaryReport::default();
    for s in states {
        let local = s.local.stats();
        r.update_messages += local.updates;
        r.update_rounds += s.update_rounds;
        r.bit_changes += local.bit_changes;
        r.rebuilds += local.rebuilds;
        r.updates_sent += s.updates_sent;
        r.update_bytes_sent += s.update_bytes_sent;
        r.bad_updates += s.bad_updates;
        r.served += s.served;
        r.served_bytes += s.served_bytes;
        for p in s.peers.reports(now) {
            let st = p.stats;
            r.lookups += st.lookups;
            r.summary_hits += st.summary_hits;
            r.false_hits += st.false_hits;
            r.expected_false_hits += st.expected_false_hits;
            r.full_fetches += st.full_fetches;
            r.full_bytes += st.full_bytes;
            r.updates_received += st.updates;
            r.gaps += st.gaps;
            r.rejected += st.rejected_malformed + st.rejected_too_full;
            r.fetch_failures += st.fetch_failures;
        }
    }
    let true_hits = r.summary_hits.saturating_sub(r.false_hits);
    let negatives = r.lookups.saturating_sub(true_hits);
    r.observed_fp_rate = (negatives > 0).then(|| r.false_hits as f64 / negatives as f64);
    r.formula_fp_rate = (r.lookups > 0).then(|| r.expected_false_hits / r.lookups as f64);
    r
}
