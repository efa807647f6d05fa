//! The protocols whose search is more than ICP's: Summary Cache and Cache Digests
//! ([`summary`]), the directory ([`directory`]), multicast ([`multicast`]) and CARP's routes
//! ([`carp`]). Each keeps its
//! per-node state here and is called by the engine at the same points the proxy's drivers
//! call `meshcache-dcm` (see `meshcache-proxy`'s `coop.rs`, `summary.rs`, `directory.rs`,
//! `multicast.rs`): the search of a miss, a datagram, a deadline, the store's events, a peer
//! that did not have what it was asked for, and timers.

use std::net::SocketAddr;
use std::time::Instant;

use meshcache_dcm::{IcpMesh, PeerId, Reply, ReplyKind, Route};
use meshcache_store::StoreEvent;

use crate::engine::Sim;
use crate::mesh::{icp_addr, Node, NodeIx};
use crate::spec::{Protocol, SimSpec};

pub(crate) mod carp;
mod directory;
mod multicast;
mod shared_arrays;
pub(crate) mod summary;

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
    /// Directory: each leaf's share of the directory (empty for other protocols).
    pub(crate) directory: Vec<directory::DirNode>,
    /// Multicast: each node's search (empty for other protocols).
    pub(crate) multicast: Vec<meshcache_dcm::multicast::Multicast>,
    /// Summary Cache and Cache Digests: each node's summaries (empty for other protocols).
    pub(crate) summary: Vec<summary::NodeState>,
    /// Summary Cache and Cache Digests: the peers' arrays, one per sender and version.
    pub(crate) summary_arrays: shared_arrays::SharedArrays,
    /// CARP: each object's ranking, once per distinct array (empty for other protocols).
    pub(crate) carp: carp::Rankings,
}

impl State {
    /// The state `spec`'s protocol needs for `nodes`.
    pub(crate) fn new(spec: &SimSpec, nodes: &[Node], objects: usize) -> State {
        State {
            carp: carp::Rankings::new(nodes, objects),
            directory: directory::new_state(spec, nodes),
            multicast: multicast::new_state(spec, nodes),
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
pub(crate) fn start(sim: &mut Sim<'_>) {
    match sim.spec.protocol.name {
        Protocol::Directory => directory::start(sim),
        Protocol::Summary | Protocol::Digest => summary::start(sim),
        _ => {}
    }
}

/// The search of a miss of `obj` by `job` at `node`, for the protocols ICP's own search does
/// not cover. Ends with [`Sim::start_search`] (or [`Sim::follow`]-equivalent decisions).
pub(crate) fn search(sim: &mut Sim<'_>, job: u32, node: NodeIx, obj: u32, t: u64) {
    match sim.spec.protocol.name {
        Protocol::Directory => directory::search(sim, job, node, obj, t),
        Protocol::Multicast => multicast::search(sim, job, node, obj, t),
        Protocol::Summary | Protocol::Digest => summary::search(sim, job, node, obj, t),
        Protocol::Carp => carp::search(sim, job, node, obj, t),
        // ICP and none search in the engine.
        Protocol::None | Protocol::Icp => {
            unreachable!(
                "the engine does not hand {:?} searches over",
                sim.spec.protocol.name
            )
        }
    }
}

/// An ICP reply for a protocol that routes them itself (summary, directory, multicast).
#[allow(clippy::too_many_arguments)]
pub(crate) fn on_icp_reply(
    sim: &mut Sim<'_>,
    to: NodeIx,
    from: NodeIx,
    obj: u32,
    reqnum: u32,
    kind: ReplyKind,
    t: u64,
) {
    let reply = IcpReply { obj, reqnum, kind };
    match sim.spec.protocol.name {
        Protocol::Directory => directory::on_icp_reply(sim, to, from, reply, t),
        Protocol::Multicast => multicast::on_icp_reply(sim, to, from, reply, t),
        Protocol::Summary => summary::on_icp_reply(sim, to, from, reply, t),
        _ => {}
    }
}

/// An ICP reply as it arrived: for `obj`, echoing search `reqnum`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IcpReply {
    pub(crate) obj: u32,
    pub(crate) reqnum: u32,
    pub(crate) kind: ReplyKind,
}

/// Routes an ICP reply that reached `to` from `from`: to the protocol's own search if `mine`
/// (given the protocols' state, the node's index, the time, its peer table, the sender's
/// address and the reply) says it is one of its searches — `Some` of its decision, if any —
/// else to ICP's search, as the proxy's reply handling does.
pub(crate) fn route_icp_reply(
    sim: &mut Sim<'_>,
    to: NodeIx,
    from: NodeIx,
    reply: IcpReply,
    t: u64,
    mine: impl FnOnce(
        &mut State,
        usize,
        Instant,
        &mut IcpMesh,
        SocketAddr,
        Reply<'_>,
    ) -> Option<Option<Route>>,
) {
    let trace = sim.trace;
    let at = sim.at(sim.now);
    let icp = Reply {
        kind: reply.kind,
        reqnum: reply.reqnum,
        url: &trace.objects[reply.obj as usize].url,
        src_rtt_ms: None,
    };
    let from = icp_addr(from);
    let mesh = &mut sim.nodes[to as usize].mesh;
    let decided = match mine(&mut sim.proto, to as usize, at, mesh, from, icp) {
        Some(route) => route.map(|r| (reply.reqnum, r)),
        None => mesh.on_reply(at, from, icp),
    };
    if let Some((reqnum, route)) = decided {
        sim.decided(to, reqnum, route, t);
    }
}

/// A protocol message arrived.
pub(crate) fn on_message(sim: &mut Sim<'_>, to: NodeIx, from: NodeIx, msg: Msg, t: u64) {
    match msg {
        Msg::Directory(m) => directory::on_message(sim, to, from, m, t),
        Msg::Multicast(m) => multicast::on_message(sim, to, from, m, t),
        Msg::Summary(m) => summary::on_message(sim, to, from, m, t),
    }
}

/// The deadline of search `reqnum` at `node` passed: its route, if still undecided.
pub(crate) fn on_deadline(sim: &mut Sim<'_>, node: NodeIx, reqnum: u32) -> Option<Route> {
    match sim.spec.protocol.name {
        Protocol::Directory => directory::on_deadline(sim, node, reqnum),
        Protocol::Multicast => multicast::on_deadline(sim, node, reqnum),
        _ => None,
    }
}

/// `peer` answered 504 to an `only-if-cached` request for `obj` (a false hit). A false
/// directory entry changes nothing here, as in the proxy: the holder's `DIR_DEL` corrects it.
pub(crate) fn on_refused(sim: &mut Sim<'_>, node: NodeIx, peer: PeerId, _obj: u32) {
    if matches!(sim.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        summary::on_refused(sim, node, peer);
    }
}

/// `node` fetched `obj` and its store did `events` with it.
pub(crate) fn on_store_events(
    sim: &mut Sim<'_>,
    node: NodeIx,
    obj: u32,
    events: &[StoreEvent],
    t: u64,
) {
    match sim.spec.protocol.name {
        Protocol::Directory => directory::on_store_events(sim, node, obj, events),
        Protocol::Summary | Protocol::Digest => summary::on_store_events(sim, node, events, t),
        _ => {}
    }
}

/// A timer set by the protocol fired at `node`.
pub(crate) fn on_tick(sim: &mut Sim<'_>, node: NodeIx) {
    match sim.spec.protocol.name {
        Protocol::Directory => directory::on_tick(sim, node),
        Protocol::Summary | Protocol::Digest => summary::on_tick(sim, node),
        _ => {}
    }
}

/// The protocols' own counters, added to the results of a run.
pub(crate) fn report(sim: &Sim<'_>, results: &mut crate::results::Results) {
    if matches!(sim.spec.protocol.name, Protocol::Summary | Protocol::Digest) {
        results.summary = Some(summary::report(&sim.proto.summary, sim.at(sim.now)));
    }
}
