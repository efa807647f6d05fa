//! Summary Cache (`summary`) and Squid's Cache Digests (`digest`) on the virtual clock: the
//! same exchange as the proxy's (`meshcache-proxy/src/coop/summary.rs`), both driving
//! `meshcache-dcm`'s [`Sender`] (our summary: sizing, when an update goes and what it carries,
//! resizes, the digest or whole array served) and [`Receiver`] (the peers': updates, which
//! fetches are due, what a fetched body does, digest refresh times). What is left here is the
//! transport and the timers:
//!
//! - store events go to the sender as the store makes them; when it has work, a drain tick is
//!   set at [`Sender::drain_at`] (the proxy's `run_local` wake-up), and the drain sends the
//!   encoded updates (one message per peer we exchange with) and rebuilds a filter the store
//!   outgrew from the store's keys;
//! - an update message goes to the receiver; one held for a gap sets a fetch check at the next
//!   whole second (the proxy's `run_fetch` ticks every [`pace::FETCH_CHECK_INTERVAL`]);
//! - a fetch check takes what [`Receiver::fetch_due`] names and fetches it, one peer after the
//!   other, each an HTTP exchange whose body is what the peer's sender serves; checks go on
//!   in the background while a summary is still wanted or a digest is to be refreshed;
//! - with `digest`, the digest is rebuilt every `digest_interval`.
//!
//! The search itself is the node's engine: the peers whose summary may hold the object
//! ([`NodeState::candidates`]) go to its `SummarySearch` or `DigestSearch`
//! (`meshcache_dcm::protocols`). An ICP MISS from a queried peer, or a 504 from a digest's
//! sibling, is a false hit ([`NodeState::false_hit`]).
//!
//! Timers: drains and the checks that follow startup or a gap are ticks (work a serial replay
//! waits for, [`Cx::tick`]); digest rebuilds, refreshes and retries after a refused summary are
//! background timers ([`Cx::timer`]), which nothing waits for (the run ends when only they are
//! left). Virtual time 0 is taken to fall on a whole second (HTTP dates have whole seconds).
//!
//! Not modelled: failed or timed-out fetches (`peer_response_timeout` × 2 in the proxy; here
//! a fetch always arrives), the update inbox (a live node applies its peers' updates at its
//! next summary lookup, at most every 50 ms, or within a second when idle; here on arrival),
//! and the false hit a parent's `X-Cache: MISS` makes of a digest's parent hit
//! (the engine tells a protocol of a sibling's 504, not of a parent's miss). With `summary`
//! the proxy also rebuilds a digest for Squid peers; nobody fetches it here, so it is not built.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshcache_dcm::summary::exchange::{exchanges, Flavor, Receiver, Sender, Settings};
use meshcache_dcm::summary::{pace, UpdateVerdict};
use meshcache_dcm::PeerId;
use meshcache_store::StoreEvent;

use super::cx::Cx;
use super::msg::{Body, Msg, SummaryMsg};
use super::shared_arrays::SharedArrays;
use crate::counters::Kind;
use crate::mesh::{self, icp_addr, Node, NodeIx};
use crate::net::ns;
use crate::results::SummaryReport;
use crate::spec::{Protocol, SimSpec};

/// The pace of the proxy's fetch checks, in virtual ns.
const FETCH_CHECK_INTERVAL: u64 = pace::FETCH_CHECK_INTERVAL.as_nanos() as u64;
/// One second, in ns.
const SECOND: u64 = 1_000_000_000;

/// Every node's summaries, and the peers' arrays they share.
#[derive(Default)]
pub(crate) struct Summaries {
    /// Per node (none when the protocol keeps no summaries).
    pub(crate) nodes: Vec<NodeState>,
    /// The peers' arrays, one per sender and version.
    arrays: SharedArrays,
}

impl Summaries {
    /// What `Summaries::new` sets up for every node, when `spec`'s protocol keeps summaries.
    pub(crate) fn new(spec: &SimSpec, nodes: &[Node]) -> Summaries {
        if !matches!(spec.protocol.name, Protocol::Summary | Protocol::Digest) {
            return Summaries::default();
        }
        Summaries {
            nodes: (0..)
                .zip(nodes)
                .map(|(i, n)| NodeState::new(spec, i, n))
                .collect(),
            arrays: SharedArrays::default(),
        }
    }

    /// The peers whose summary says `node` may find `key` there (none when the protocol keeps
    /// no summaries).
    pub(crate) fn candidates(&mut self, node: NodeIx, key: &[u8; 16]) -> Vec<PeerId> {
        self.nodes
            .get_mut(node as usize)
            .map(|s| s.candidates(key))
            .unwrap_or_default()
    }
}

/// One node's summaries: its own and its peers', and the timers and fetches that run them.
pub(crate) struct NodeState {
    sender: Sender,
    receiver: Receiver,
    /// Fetches to make, one after the other, and the one under way.
    queue: VecDeque<PeerId>,
    fetching: Option<PeerId>,
    /// A check came while fetches were under way: it runs when they end.
    check_missed: bool,
    /// When `run_local` runs next (it was woken), the next fetch check and digest rebuild.
    drain_at: Option<u64>,
    check_at: Option<u64>,
    rebuild_at: Option<u64>,
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
        self.receiver.candidates(key)
    }

    /// `peer` did not have what its summary promised.
    pub(crate) fn false_hit(&mut self, peer: PeerId) {
        self.receiver.false_hit(peer);
    }

    /// What `Summaries::new` sets up for `node`.
    pub(crate) fn new(spec: &SimSpec, node: NodeIx, n: &Node) -> NodeState {
        let p = &spec.protocol;
        let memory = if n.is_parent {
            spec.mesh.parent_size
        } else {
            spec.mesh.cache_size
        };
        let flavor = flavor(p.name);
        let settings = Settings {
            flavor,
            capacity: p.summary_capacity,
            store_bytes: memory.as_u64(),
            bits_per_entry: u8::try_from(p.bits_per_entry).unwrap_or(u8::MAX),
            hash_functions: p.summary_hash_functions,
            threshold: p.summary_threshold,
            digest_period: p.digest_interval,
        };
        // The proxy starts its numbering at a random point; any odd number will do here.
        let first_seq = node.wrapping_mul(0x9e37_79b9).rotate_left(16) | 1;
        let exchanging = n
            .engine
            .mesh()
            .peers()
            .iter()
            .map(|peer| exchanges(flavor, false, peer.spec.icp.is_some()))
            .collect();
        let mut s = NodeState {
            sender: Sender::new(&settings, first_seq, Some(mesh::ip(node))),
            receiver: Receiver::new(&settings, exchanging),
            queue: VecDeque::new(),
            fetching: None,
            check_missed: false,
            drain_at: None,
            check_at: None,
            rebuild_at: None,
            updates_sent: 0,
            update_bytes_sent: 0,
            bad_updates: 0,
            served: 0,
            served_bytes: 0,
        };
        // Only the digest protocol's peers fetch a digest, so the summary protocol builds none.
        if flavor == Flavor::Digest {
            s.sender.publish(system(0));
        }
        s
    }
}

/// The summary flavour of a simulated protocol (only called for the two that keep summaries).
fn flavor(protocol: Protocol) -> Flavor {
    match protocol {
        Protocol::Digest => Flavor::Digest,
        _ => Flavor::Summary,
    }
}

/// Virtual time as the wall-clock time HTTP dates are made of (virtual 0 on the epoch).
fn system(t: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t)
}

/// The first multiple of `every` after `t`.
fn after(t: u64, every: u64) -> u64 {
    (t / every + 1) * every
}

/// Before the first request: the first fetch check (every summary is wanted) and, with
/// digests, the rebuild timer.
pub(crate) fn start(cx: &mut Cx<'_, Summaries>) {
    let period = ns(cx.spec.protocol.digest_interval);
    for node in 0..cx.nodes.len() as NodeIx {
        if !cx.nodes[node as usize].peer_nodes.is_empty() {
            set_check(cx, node, 0, false);
        }
        if cx.spec.protocol.name == Protocol::Digest {
            cx.proto.nodes[node as usize].rebuild_at = Some(period);
            cx.timer(period, node);
        }
    }
}

/// `peer` answered 504 to `node`'s `only-if-cached` request. Digest routes list siblings only
/// as digest hits (`CD_SIBLING_HIT`), so with digests that is a false hit; with summaries a
/// sibling is tried after an ICP HIT, and its 504 is no false hit of the summary.
pub(crate) fn on_refused(cx: &mut Cx<'_, Summaries>, node: NodeIx, peer: PeerId) {
    if cx.spec.protocol.name == Protocol::Digest {
        cx.proto.nodes[node as usize].false_hit(peer);
    }
}

/// `node`'s store did `events` (`Summaries::changed`): folded in now; `run_local` is woken
/// when that makes work for it.
pub(crate) fn on_store_events(
    cx: &mut Cx<'_, Summaries>,
    node: NodeIx,
    events: &[StoreEvent],
    t: u64,
) {
    let now = cx.at(t);
    let s = &mut cx.proto.nodes[node as usize];
    for e in events {
        s.sender.change(&e.key().0, e.is_admission());
    }
    if s.sender.has_work() && s.drain_at.is_none() {
        let at = s.sender.drain_at(now);
        let at = cx.virtual_ns(at);
        set_drain(cx, node, at);
    }
}

/// A summary message arrived at `to` (its CPU is done with it at `t`).
pub(crate) fn on_message(
    cx: &mut Cx<'_, Summaries>,
    to: NodeIx,
    from: NodeIx,
    msg: SummaryMsg,
    t: u64,
) {
    match msg {
        SummaryMsg::Update(body) => on_update(cx, to, from, &body, t),
        SummaryMsg::Fetch => serve(cx, to, from, t),
        SummaryMsg::Fetched { body, expires } => fetched(cx, to, body, expires, t),
    }
}

/// A timer of `node` fired: one of its rebuild, drain and fetch check that are due now (each
/// due one has an event of its own, so none waits for another node's at the same instant:
/// every rebuild set for a time comes before the fetches that time's checks make).
pub(crate) fn on_tick(cx: &mut Cx<'_, Summaries>, node: NodeIx) {
    let now = cx.now;
    let s = &mut cx.proto.nodes[node as usize];
    if s.rebuild_at == Some(now) {
        let period = ns(cx.spec.protocol.digest_interval);
        s.sender.publish(system(now));
        s.rebuild_at = Some(now + period);
        cx.timer(now + period, node);
    } else if s.drain_at == Some(now) {
        drain(cx, node);
    } else if s.check_at == Some(now) {
        check(cx, node);
    }
}

/// Wants a drain tick at `at` (the earliest wanted wins; a later tick finds nothing due).
fn set_drain(cx: &mut Cx<'_, Summaries>, node: NodeIx, at: u64) {
    let s = &mut cx.proto.nodes[node as usize];
    if s.drain_at.is_none_or(|d| at < d) {
        s.drain_at = Some(at);
        cx.tick(at, node);
    }
}

/// Wants a fetch check at `at`: as work, or in the background (a timer the run does not wait
/// for).
fn set_check(cx: &mut Cx<'_, Summaries>, node: NodeIx, at: u64, background: bool) {
    let s = &mut cx.proto.nodes[node as usize];
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
fn drain(cx: &mut Cx<'_, Summaries>, node: NodeIx) {
    let now = cx.now;
    let at = cx.at(now);
    let s = &mut cx.proto.nodes[node as usize];
    s.drain_at = None;
    let drained = s.sender.drain(at);
    if let Some(capacity) = drained.resize {
        let store = &cx.nodes[node as usize].store;
        s.sender
            .rebuild(system(now), capacity, store.keys().map(|k| &k.0));
    }
    send_updates(cx, node, &drained.updates, now);
}

/// Sends each update to every peer we exchange summaries with (`send_updates`).
fn send_updates(cx: &mut Cx<'_, Summaries>, node: NodeIx, updates: &[Arc<[u8]>], t: u64) {
    if updates.is_empty() {
        return;
    }
    let n = &cx.nodes[node as usize];
    let s = &cx.proto.nodes[node as usize];
    let targets: Vec<NodeIx> = (0..n.peer_nodes.len())
        .filter(|&i| s.receiver.exchanging(PeerId(i)))
        .map(|i| n.peer_nodes[i])
        .collect();
    for datagram in updates {
        let bytes = datagram.len() as u64;
        for &to in &targets {
            let s = &mut cx.proto.nodes[node as usize];
            s.updates_sent += 1;
            s.update_bytes_sent += bytes;
            let msg = Msg::Summary(SummaryMsg::Update(Body(datagram.clone())));
            cx.send_proto(node, to, bytes, Kind::Summary, msg, t);
        }
    }
}

/// An update datagram from `from` (`on_update_datagram`).
fn on_update(cx: &mut Cx<'_, Summaries>, to: NodeIx, from: NodeIx, body: &Body, t: u64) {
    let at = cx.at(t);
    let n = &mut cx.nodes[to as usize];
    let s = &mut cx.proto.nodes[to as usize];
    let peer = n.engine.mesh().peer_at(icp_addr(from));
    let shared = &mut cx.proto.arrays;
    match (peer, s.receiver.on_update(at, peer, &body.0, shared)) {
        (Some(peer), Ok(verdict)) => {
            n.engine.mesh_mut().heard_from(at, peer);
            if verdict == UpdateVerdict::Held {
                set_check(cx, to, after(t, FETCH_CHECK_INTERVAL), false);
            }
        }
        // A node that does not list the sender (a parent, for its children), or garbage.
        _ => s.bad_updates += 1,
    }
}

/// A fetch check (`run_fetch`'s loop body): what is due (wanted, or a digest whose refresh
/// time came) is fetched, one peer after the other.
fn check(cx: &mut Cx<'_, Summaries>, node: NodeIx) {
    let now = cx.now;
    let at = cx.at(now);
    let s = &mut cx.proto.nodes[node as usize];
    s.check_at = None;
    if s.fetching.is_some() {
        s.check_missed = true;
        return;
    }
    let due = s.receiver.fetch_due(at);
    s.queue.extend(due);
    next_fetch(cx, node, now);
}

/// Starts the next fetch of the check under way or, when none is left, plans the next check.
fn next_fetch(cx: &mut Cx<'_, Summaries>, node: NodeIx, t: u64) {
    let s = &mut cx.proto.nodes[node as usize];
    if let Some(peer) = s.queue.pop_front() {
        s.fetching = Some(peer);
        let to = cx.nodes[node as usize].peer_nodes[peer.0];
        cx.send_http(node, to, 0, Msg::Summary(SummaryMsg::Fetch), t);
        return;
    }
    if std::mem::take(&mut s.check_missed) {
        // The checks missed while fetching come at once (tokio's `Burst`).
        set_check(cx, node, t, false);
        return;
    }
    let retry = s.receiver.any_wanted();
    let refresh = s.receiver.next_refresh().map(|at| cx.virtual_ns(at));
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
fn serve(cx: &mut Cx<'_, Summaries>, node: NodeIx, to: NodeIx, t: u64) {
    let s = &mut cx.proto.nodes[node as usize];
    let (body, expires, kind) = match s.sender.flavor() {
        Flavor::Digest => match s.sender.digest() {
            Some(p) => {
                let expires = p.expires.duration_since(SystemTime::UNIX_EPOCH);
                // HTTP dates carry whole seconds.
                let expires = expires.map_or(0, |e| e.as_secs() * SECOND);
                (Some(p.body.clone()), Some(expires), Kind::Digest)
            }
            None => (None, None, Kind::Digest),
        },
        Flavor::Summary => (s.sender.full(), None, Kind::SummaryFetch),
    };
    let bytes = body.as_ref().map_or(0, |b| b.len() as u64);
    if body.is_some() {
        s.served += 1;
        s.served_bytes += bytes;
        cx.count(kind, bytes);
    }
    let msg = Msg::Summary(SummaryMsg::Fetched {
        body: body.map(Body),
        expires,
    });
    cx.send_http(node, to, bytes, msg, t);
}

/// The response to our fetch arrived (`fetch_one`): installed or refused, then the next.
fn fetched(
    cx: &mut Cx<'_, Summaries>,
    node: NodeIx,
    body: Option<Body>,
    expires: Option<u64>,
    t: u64,
) {
    let at = cx.at(t);
    let s = &mut cx.proto.nodes[node as usize];
    let Some(peer) = s.fetching.take() else {
        return;
    };
    match body {
        None => s.receiver.failed(at, peer),
        Some(body) => {
            // `Expires` minus now, as `SystemTime::duration_since`: none when already past.
            let expires_in = expires
                .and_then(|e| e.checked_sub(t))
                .map(Duration::from_nanos);
            let shared = &mut cx.proto.arrays;
            // A refusal is counted by the receiver; the peer is a miss until the next fetch.
            let _ = s.receiver.fetched(at, peer, &body.0, expires_in, shared);
        }
    }
    next_fetch(cx, node, t);
}

/// Every node's summary counters, summed.
pub(crate) fn report(summaries: &Summaries, now: std::time::Instant) -> SummaryReport {
    let mut r = SummaryReport::default();
    for s in &summaries.nodes {
        let local = s.sender.summary().stats();
        r.update_messages += local.updates;
        r.update_rounds += s.sender.rounds();
        r.bit_changes += local.bit_changes;
        r.rebuilds += local.rebuilds;
        r.updates_sent += s.updates_sent;
        r.update_bytes_sent += s.update_bytes_sent;
        r.bad_updates += s.bad_updates;
        r.served += s.served;
        r.served_bytes += s.served_bytes;
        for p in s.receiver.peers().reports(now) {
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
