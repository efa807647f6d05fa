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
//!
//! Layers, each importing only those below it: the messages ([`msg`], plain data) and the
//! shared arrays at the bottom; [`cx`] (the view and its effects); each protocol's upkeep,
//! which gets a `Cx` over its own part of the state ([`Cx::part`]: the summaries, the
//! directory's upkeep) and names no other protocol; this file on top, holding the whole state
//! and dispatching the engine's calls.

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
mod msg;
pub(crate) mod multicast;
mod shared_arrays;
pub(crate) mod summary;

pub(crate) use cx::{Cx, Effect};
pub(crate) use msg::{McMsg, Msg};

/// The simulation as the upkeep's dispatch sees it: all of the protocols' state.
pub(crate) type Upkeep<'s> = Cx<'s, State>;

/// The protocols' per-node state.
pub(crate) struct State {
    /// Directory: each leaf's upkeep — events to drain, renewal (its share of the directory
    /// is its engine's `Directory`; empty for other protocols).
    pub(crate) directory: Vec<directory::DirNode>,
    /// Summary Cache and Cache Digests: each node's summaries, and the peers' arrays they
    /// share (none for other protocols).
    pub(crate) summary: summary::Summaries,
    /// CARP: each object's ranking, once per distinct array (empty for other protocols).
    pub(crate) carp: carp::Rankings,
}

impl State {
    /// The state `spec`'s protocol needs for `nodes`.
    pub(crate) fn new(spec: &SimSpec, nodes: &[Node], objects: usize, start: Instant) -> State {
        State {
            carp: carp::Rankings::new(nodes, objects),
            directory: directory::new_state(spec, nodes, start),
            summary: summary::Summaries::new(spec, nodes),
        }
    }
}

/// Before the first request: initial exchanges and timers.
pub(crate) fn start(cx: &mut Upkeep<'_>) {
    match cx.spec.protocol.name {
        Protocol::Directory => directory::start(&mut cx.part(|s| &mut s.directory)),
        Protocol::Summary | Protocol::Digest => summary::start(&mut cx.part(|s| &mut s.summary)),
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

/// Sends a search's directory datagrams for `obj` from `node`, from `t` on its CPU.
pub(crate) fn send_directory(
    cx: &mut Upkeep<'_>,
    node: NodeIx,
    obj: u32,
    sends: Vec<Outgoing>,
    t: u64,
) {
    directory::send(
        &mut cx.part(|s| &mut s.directory),
        node,
        Some(obj),
        sends,
        t,
    );
}

/// An ICP reply of `kind` reached `to` from `from`: with Summary Cache, which asks only the
/// peers whose summary said "maybe", a MISS is a false hit of that summary.
pub(crate) fn on_icp_reply(cx: &mut Upkeep<'_>, to: NodeIx, from: NodeIx, kind: ReplyKind) {
    if cx.spec.protocol.name != Protocol::Summary
        || !matches!(kind, ReplyKind::Miss | ReplyKind::MissNoFetch)
    {
        return;
    }
    if let Some(peer) = cx.nodes[to as usize].engine.mesh().peer_at(icp_addr(from)) {
        cx.proto.summary.nodes[to as usize].false_hit(peer);
    }
}

/// A protocol message arrived.
pub(crate) fn on_message(cx: &mut Upkeep<'_>, to: NodeIx, from: NodeIx, msg: Msg, t: u64) {
    match msg {
        Msg::Directory(m) => {
            directory::on_message(&mut cx.part(|s| &mut s.directory), to, from, m, t)
        }
        Msg::Multicast(m) => multicast::on_message(cx, to, from, m, t),
        Msg::Summary(m) => summary::on_message(&mut cx.part(|s| &mut s.summary), to, from, m, t),
    }
}

/// `peer` answered 504 to an `only-if-cached` request for `obj` (a false hit). A false
/// directory entry changes nothing here, as in the proxy: the holder's `DIR_DEL` corrects it.
pub(crate) fn on_refused(cx: &mut Upkeep<'_>, node: NodeIx, peer: PeerId, _obj: u32) {
    if matches!(cx.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        summary::on_refused(&mut cx.part(|s| &mut s.summary), node, peer);
    }
}

/// `node` fetched `obj` and its store did `events` with it.
pub(crate) fn on_store_events(
    cx: &mut Upkeep<'_>,
    node: NodeIx,
    obj: u32,
    events: &[StoreEvent],
    t: u64,
) {
    match cx.spec.protocol.name {
        Protocol::Directory => {
            directory::on_store_events(&mut cx.part(|s| &mut s.directory), node, obj, events)
        }
        Protocol::Summary | Protocol::Digest => {
            summary::on_store_events(&mut cx.part(|s| &mut s.summary), node, events, t)
        }
        _ => {}
    }
}

/// A timer set by the protocol fired at `node`.
pub(crate) fn on_tick(cx: &mut Upkeep<'_>, node: NodeIx) {
    match cx.spec.protocol.name {
        Protocol::Directory => directory::on_tick(&mut cx.part(|s| &mut s.directory), node),
        Protocol::Summary | Protocol::Digest => {
            summary::on_tick(&mut cx.part(|s| &mut s.summary), node)
        }
        _ => {}
    }
}

/// The protocols' own counters, added to the results of a run.
pub(crate) fn report(cx: &mut Upkeep<'_>, results: &mut crate::results::Results) {
    if matches!(cx.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        results.summary = Some(summary::report(&cx.proto.summary, cx.at(cx.now)));
    }
}
