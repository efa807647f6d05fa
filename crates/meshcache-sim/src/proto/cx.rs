//! What the protocols' upkeep sees of a simulation, and where it leaves what it does: the
//! engine lends a [`Cx`] (the spec, the trace, the clock, the nodes and the protocols' state),
//! the upkeep reads and changes them and lists its sends and timers as [`Effect`]s, and the
//! engine carries those out in order once the upkeep returns — so no protocol file reaches
//! into the engine.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshcache_dcm::{PeerId, ReplyKind, Route};

use super::msg::Msg;
use crate::counters::Kind;
use crate::mesh::{Node, NodeIx};
use crate::spec::SimSpec;
use crate::trace::Trace;

/// Something the upkeep asks the engine to do.
#[derive(Debug)]
pub(crate) enum Effect {
    /// A protocol timer of `node` at `at`, as work the run waits for.
    Tick { node: NodeIx, at: u64 },
    /// A periodic protocol timer of `node` at `at`, which does not keep the run going.
    Timer { node: NodeIx, at: u64 },
    /// A protocol datagram of `bytes` from `node` to `to`, after `t` on its CPU.
    Datagram {
        node: NodeIx,
        to: NodeIx,
        bytes: u64,
        kind: Kind,
        msg: Msg,
        t: u64,
    },
    /// A protocol HTTP message from `node` to `to` at `t`, with `body` bytes.
    Http {
        node: NodeIx,
        to: NodeIx,
        body: u64,
        msg: Msg,
        t: u64,
    },
    /// `bytes` of traffic of `kind`, counted.
    Count { kind: Kind, bytes: u64 },
    /// An ICP query for `obj` (search `reqnum`) from `node` to `peer`, after `t` on its CPU.
    IcpQuery {
        node: NodeIx,
        obj: u32,
        reqnum: u32,
        peer: (PeerId, SocketAddr),
        t: u64,
    },
    /// An ICP reply of `reply` for `obj` (search `reqnum`) from `node` to `to`, after `t` on its
    /// CPU, counted as `counted`.
    IcpReply {
        node: NodeIx,
        to: NodeIx,
        obj: u32,
        reqnum: u32,
        reply: ReplyKind,
        counted: Kind,
        t: u64,
    },
    /// Search `reqnum` of `node` is decided (a directory's answer).
    Decided {
        node: NodeIx,
        reqnum: u32,
        route: Route,
        t: u64,
    },
}

/// The simulation as the protocols' upkeep sees it, with `S`: the protocols' state (the
/// engine lends all of it; each protocol's upkeep gets its own part, [`Cx::part`]).
pub(crate) struct Cx<'s, S> {
    pub(crate) spec: &'s SimSpec,
    pub(crate) trace: &'s Trace,
    /// The virtual time (ns).
    pub(crate) now: u64,
    base: Instant,
    pub(crate) nodes: &'s mut [Node],
    pub(crate) proto: &'s mut S,
    out: &'s mut Vec<Effect>,
}

impl<'s, S> Cx<'s, S> {
    /// The engine's view, lent for one call; effects go to `out`. `base` is the `Instant` of
    /// virtual time 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        spec: &'s SimSpec,
        trace: &'s Trace,
        now: u64,
        base: Instant,
        nodes: &'s mut [Node],
        proto: &'s mut S,
        out: &'s mut Vec<Effect>,
    ) -> Cx<'s, S> {
        Cx {
            spec,
            trace,
            now,
            base,
            nodes,
            proto,
            out,
        }
    }

    /// The same view, with only the part of the protocols' state `part` picks.
    pub(crate) fn part<T>(&mut self, part: impl FnOnce(&mut S) -> &mut T) -> Cx<'_, T> {
        Cx {
            spec: self.spec,
            trace: self.trace,
            now: self.now,
            base: self.base,
            nodes: &mut *self.nodes,
            proto: part(&mut *self.proto),
            out: &mut *self.out,
        }
    }

    /// Virtual time `t` as the `Instant` the dcm machines take.
    pub(crate) fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    /// The virtual time (ns) of an `Instant` the dcm machines returned.
    pub(crate) fn virtual_ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A timer of `node` at `at`, as work.
    pub(crate) fn tick(&mut self, at: u64, node: NodeIx) {
        self.out.push(Effect::Tick { node, at });
    }

    /// A periodic timer of `node` at `at`, in the background.
    pub(crate) fn timer(&mut self, at: u64, node: NodeIx) {
        self.out.push(Effect::Timer { node, at });
    }

    /// A protocol datagram from `node` to `to` after `t` on its CPU.
    pub(crate) fn send_proto(
        &mut self,
        node: NodeIx,
        to: NodeIx,
        bytes: u64,
        kind: Kind,
        msg: Msg,
        t: u64,
    ) {
        self.out.push(Effect::Datagram {
            node,
            to,
            bytes,
            kind,
            msg,
            t,
        });
    }

    /// A protocol HTTP message from `node` to `to` at `t` (the caller counts it).
    pub(crate) fn send_http(&mut self, node: NodeIx, to: NodeIx, body: u64, msg: Msg, t: u64) {
        self.out.push(Effect::Http {
            node,
            to,
            body,
            msg,
            t,
        });
    }

    /// Counts `bytes` of `kind`.
    pub(crate) fn count(&mut self, kind: Kind, bytes: u64) {
        self.out.push(Effect::Count { kind, bytes });
    }

    /// ICP queries for `obj` (search `reqnum`) from `node` to `peers`, one after the other on
    /// its CPU from `t`.
    pub(crate) fn send_icp_queries(
        &mut self,
        node: NodeIx,
        obj: u32,
        reqnum: u32,
        peers: &[(PeerId, SocketAddr)],
        t: u64,
    ) {
        for &peer in peers {
            self.out.push(Effect::IcpQuery {
                node,
                obj,
                reqnum,
                peer,
                t,
            });
        }
    }

    /// An ICP reply from `node` to `to`, counted as `counted`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_icp_reply(
        &mut self,
        node: NodeIx,
        to: NodeIx,
        obj: u32,
        reqnum: u32,
        reply: ReplyKind,
        counted: Kind,
        t: u64,
    ) {
        self.out.push(Effect::IcpReply {
            node,
            to,
            obj,
            reqnum,
            reply,
            counted,
            t,
        });
    }

    /// Search `reqnum` of `node` is decided.
    pub(crate) fn decided(&mut self, node: NodeIx, reqnum: u32, route: Route, t: u64) {
        self.out.push(Effect::Decided {
            node,
            reqnum,
            route,
            t,
        });
    }
}
