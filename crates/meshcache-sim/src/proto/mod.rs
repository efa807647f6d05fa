//! The protocols' state the simulator keeps beside each node's engine, and their upkeep.
//!
//! Every node's search is its `meshcache_dcm::engine::Engine`, built here
//! ([`search_protocol`]) and driven by the engine module exactly as the proxy drives its own.
//! What is left here is what the protocols do besides searching, at the points the proxy does
//! it: Summary Cache's and Cache Digests' exchange ([`summary`], with the peers' arrays shared
//! between nodes, [`shared_arrays`]), the directory's messages and upkeep ([`directory`]),
//! answering a multicast query ([`multicast`]), and CARP's rankings shared between nodes
//! ([`carp`]). The upkeep never reaches into the engine: it gets a [`Cx`] and lists what to
//! send and when to be woken as [`Effect`]s ([`cx`]).

use std::time::Instant;

use meshcache_dcm::directory::Outgoing;
use meshcache_dcm::engine::{NoSearch, SearchProtocol};
use meshcache_dcm::protocols::{DigestSearch, IcpSearch, SummarySearch};
use meshcache_dcm::{IcpMesh, PeerId, ReplyKind};
use meshcache_store::StoreEvent;

use crate::mesh::{icp_addr, Node, NodeIx};
use crate::spec::{Protocol, SimSpec};

pub(crate) mod carp;
mod cx;
mod directory;
pub(crate) mod multicast;
mod shared_arrays;
pub(crate) mod summary;

pub(crate) use cx::{Cx, Effect};

/// A protocol message between nodes.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Directory datagrams (and the queries an owner forwards).
    Directory(directory::DirMsg),
    /// Multicast queries.
    Multicast(multicast::McMsg),
    /// Summary Cache updates, and whole summaries or digests fetched.
    Summary(summary::Msg),
}

/// The protocols' per-node state.
pub(crate) struct State {
    /// Directory: each leaf's upkeep — events to drain, renewal (its share of the directory
    /// is its engine's `Directory`; empty for other protocols).
    pub(crate) directory: Vec<directory::DirNode>,
    /// Summary Cache and Cache Digests: each node's summaries (empty for other protocols).
    pub(crate) summary: Vec<summary::NodeState>,
    /// Summary Cache and Cache Digests: the peers' arrays, one per sender and version.
    pub(crate) summary_arrays: shared_arrays::SharedArrays,
    /// CARP: each object's ranking, once per distinct array (empty for other protocols).
    pub(crate) carp: carp::Rankings,
}

impl State {
    /// The state `spec`'s protocol needs for `nodes`.
    pub(crate) fn new(spec: &SimSpec, nodes: &[Node], objects: usize, start: Instant) -> State {
        State {
            carp: carp::Rankings::new(nodes, objects),
            directory: directory::new_state(spec, nodes, start),
            summary: match spec.protocol.name {
                Protocol::Summary | Protocol::Digest => (0..)
                    .zip(nodes)
                    .map(|(i, n)| summary::NodeState::new(spec, i, n))
                    .collect(),
                _ => Vec::new(),
            },
            summary_arrays: shared_arrays::SharedArrays::default(),
        }
    }
}

/// Before the first request: initial exchanges and timers.
pub(crate) fn start(cx: &mut Cx<'_>) {
    match cx.spec.protocol.name {
        Protocol::Directory => directory::start(cx),
        Protocol::Summary | Protocol::Digest => summary::start(cx),
        _ => {}
    }
}

/// Node `node`'s search, given its peer table. Parents search only with ICP (and answer
/// multicast queries); they never need a directory or a CARP array.
pub(crate) fn search_protocol(
    spec: &SimSpec,
    node: NodeIx,
    mesh: &IcpMesh,
) -> Box<dyn SearchProtocol> {
    let leaf = node < spec.mesh.caches;
    match spec.protocol.name {
        Protocol::None => Box::new(NoSearch),
        Protocol::Icp => Box::new(IcpSearch),
        Protocol::Summary => Box::new(SummarySearch::default()),
        Protocol::Digest => Box::new(DigestSearch),
        Protocol::Multicast => Box::new(multicast::machine(spec)),
        Protocol::Carp if leaf => Box::new(carp::search(spec, node, mesh)),
        Protocol::Directory if leaf => Box::new(directory::directory(spec, node, mesh)),
        Protocol::Carp | Protocol::Directory => Box::new(NoSearch),
    }
}

/// The peers whose summary says `node` may find `key` there (none when the protocol keeps no
/// summaries).
pub(crate) fn candidates(
    summaries: &mut [summary::NodeState],
    node: NodeIx,
    key: &[u8; 16],
) -> Vec<PeerId> {
    summaries
        .get_mut(node as usize)
        .map(|s| s.candidates(key))
        .unwrap_or_default()
}

/// Sends a search's directory datagrams for `obj` from `node`, from `t` on its CPU.
pub(crate) fn send_directory(
    cx: &mut Cx<'_>,
    node: NodeIx,
    obj: u32,
    sends: Vec<Outgoing>,
    t: u64,
) {
    directory::send(cx, node, Some(obj), sends, t);
}

/// An ICP reply of `kind` reached `to` from `from`: with Summary Cache, which asks only the
/// peers whose summary said "maybe", a MISS is a false hit of that summary.
pub(crate) fn on_icp_reply(cx: &mut Cx<'_>, to: NodeIx, from: NodeIx, kind: ReplyKind) {
    if cx.spec.protocol.name != Protocol::Summary
        || !matches!(kind, ReplyKind::Miss | ReplyKind::MissNoFetch)
    {
        return;
    }
    if let Some(peer) = cx.nodes[to as usize].engine.mesh().peer_at(icp_addr(from)) {
        cx.proto.summary[to as usize].false_hit(peer);
    }
}

/// A protocol message arrived.
pub(crate) fn on_message(cx: &mut Cx<'_>, to: NodeIx, from: NodeIx, msg: Msg, t: u64) {
    match msg {
        Msg::Directory(m) => directory::on_message(cx, to, from, m, t),
        Msg::Multicast(m) => multicast::on_message(cx, to, from, m, t),
        Msg::Summary(m) => summary::on_message(cx, to, from, m, t),
    }
}

/// `peer` answered 504 to an `only-if-cached` request for `obj` (a false hit). A false
/// directory entry changes nothing here, as in the proxy: the holder's `DIR_DEL` corrects it.
pub(crate) fn on_refused(cx: &mut Cx<'_>, node: NodeIx, peer: PeerId, _obj: u32) {
    if matches!(cx.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        summary::on_refused(cx, node, peer);
    }
}

/// `node` fetched `obj` and its store did `events` with it.
pub(crate) fn on_store_events(
    cx: &mut Cx<'_>,
    node: NodeIx,
    obj: u32,
    events: &[StoreEvent],
    t: u64,
) {
    match cx.spec.protocol.name {
        Protocol::Directory => directory::on_store_events(cx, node, obj, events),
        Protocol::Summary | Protocol::Digest => summary::on_store_events(cx, node, events, t),
        _ => {}
    }
}

/// A timer set by the protocol fired at `node`.
pub(crate) fn on_tick(cx: &mut Cx<'_>, node: NodeIx) {
    match cx.spec.protocol.name {
        Protocol::Directory => directory::on_tick(cx, node),
        Protocol::Summary | Protocol::Digest => summary::on_tick(cx, node),
        _ => {}
    }
}

/// The protocols' own counters, added to the results of a run.
pub(crate) fn report(cx: &mut Cx<'_>, results: &mut crate::results::Results) {
    if matches!(cx.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        results.summary = Some(summary::report(&cx.proto.summary, cx.at(cx.now)));
    }
}
