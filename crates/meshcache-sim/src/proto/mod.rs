//! The protocols whose search is more than ICP's: Summary Cache and Cache Digests
//! ([`summary`]), the directory ([`directory`]) and multicast ([`multicast`]). Each keeps its
//! per-node state here and is called by the engine at the same points the proxy's drivers
//! call `meshcache-dcm` (see `meshcache-proxy`'s `coop.rs`, `summary.rs`, `directory.rs`,
//! `multicast.rs`): the search of a miss, a datagram, a deadline, the store's events, a peer
//! that did not have what it was asked for, and timers.

use meshcache_dcm::{PeerId, ReplyKind, Route};
use meshcache_store::StoreEvent;

use crate::engine::Sim;
use crate::mesh::{Node, NodeIx};
use crate::spec::{Protocol, SimSpec};

/// A protocol message between nodes.
#[derive(Debug)]
pub(crate) enum Msg {}

/// The protocols' per-node state.
pub(crate) struct State {}

impl State {
    /// The state `spec`'s protocol needs for `nodes`.
    pub(crate) fn new(_spec: &SimSpec, _nodes: &[Node]) -> State {
        State {}
    }
}

/// Whether the engine can run `spec`'s protocol.
pub(crate) fn check(spec: &SimSpec) -> Result<(), String> {
    match spec.protocol.name {
        Protocol::None | Protocol::Icp | Protocol::Carp => Ok(()),
        other => Err(format!(
            "protocol {}: not simulated yet (none, icp and carp are)",
            other.as_str()
        )),
    }
}

/// Before the first request: initial exchanges and timers.
pub(crate) fn start(_sim: &mut Sim<'_>) {}

/// The search of a miss of `obj` by `job` at `node`, for the protocols ICP's own search does
/// not cover. Ends with [`Sim::start_search`] (or [`Sim::follow`]-equivalent decisions).
pub(crate) fn search(_sim: &mut Sim<'_>, _job: u32, _node: NodeIx, _obj: u32, _t: u64) {
    unreachable!("refused by check")
}

/// An ICP reply for a protocol that routes them itself (directory, multicast).
#[allow(clippy::too_many_arguments)]
pub(crate) fn on_icp_reply(
    _sim: &mut Sim<'_>,
    _to: NodeIx,
    _from: NodeIx,
    _obj: u32,
    _reqnum: u32,
    _kind: ReplyKind,
    _t: u64,
) {
}

/// A protocol message arrived.
pub(crate) fn on_message(_sim: &mut Sim<'_>, _to: NodeIx, _from: NodeIx, msg: Msg, _t: u64) {
    match msg {}
}

/// The deadline of search `reqnum` at `node` passed: its route, if still undecided.
pub(crate) fn on_deadline(_sim: &mut Sim<'_>, _node: NodeIx, _reqnum: u32) -> Option<Route> {
    None
}

/// `peer` answered 504 to an `only-if-cached` request for `obj` (a false hit).
pub(crate) fn on_refused(_sim: &mut Sim<'_>, _node: NodeIx, _peer: PeerId, _obj: u32) {}

/// `node` fetched `obj` and its store did `events` with it.
pub(crate) fn on_store_events(
    _sim: &mut Sim<'_>,
    _node: NodeIx,
    _obj: u32,
    _events: &[StoreEvent],
    _t: u64,
) {
}

/// A timer set by the protocol fired at `node`.
pub(crate) fn on_tick(_sim: &mut Sim<'_>, _node: NodeIx) {}
