//! The node-level engine: one node's peer table and its protocol's search, behind the few
//! entry points a driver calls.
//!
//! A driver (the proxy over sockets, the simulator over a virtual clock and network) owns one
//! [`Engine`] per node and calls it at four points, each of which returns what to do instead of
//! doing it:
//! - a miss to route: [`Engine::begin`] gives a [`Step`] — messages to send ([`Send`]) and
//!   either a route decided already or a deadline to wait until;
//! - an ICP reply: [`Engine::on_reply`] gives the search it moved on, if any, and its
//!   [`Progress`] — the route decided, or the next step (more messages, a new deadline);
//! - a deadline: [`Engine::on_deadline`], the same;
//! - a requester gone: [`Engine::abandon`].
//!
//! Which protocol searches, and how a reply or a deadline moves its search on, is the
//! [`SearchProtocol`] the engine was built with: ICP ([`crate::protocols::IcpSearch`]), none
//! ([`NoSearch`]), CARP ([`crate::protocols::CarpSearch`]), Summary Cache and Cache Digests
//! ([`crate::protocols::SummarySearch`], [`crate::protocols::DigestSearch`]), the directory
//! ([`crate::directory::Directory`]) and multicast ([`crate::multicast::Multicast`]), each
//! mapped onto the trait in a file of [`crate::protocols`]. A protocol is one implementation of
//! that trait; neither driver's control flow names one.
//! The protocols' upkeep (the directory's updates, the summaries' exchange, answering a
//! multicast query) is reached through [`Engine::parts_mut`].

use std::any::Any;
use std::net::SocketAddr;
use std::time::Instant;

use crate::directory::Outgoing;
use crate::icp::{IcpMesh, Outcome, Reply, Search};
use crate::multicast::Destination;
use crate::peer::PeerId;
use crate::select::Route;

/// What the driver knows of a miss when it asks for its route.
pub struct Miss<'a> {
    /// The URL.
    pub url: &'a str,
    /// Its store key.
    pub key: &'a [u8; 16],
    /// Its host (peers may be restricted to domains).
    pub host: &'a str,
    /// Siblings may be asked (false for requests that must not consult them).
    pub hierarchical: bool,
    /// The peers whose summary or digest says they may hold it. The driver keeps the peers'
    /// summaries (the simulator shares one copy per sender between its nodes), so it answers;
    /// called only by the protocols that search by summary, and at most once. `None`: no
    /// summaries kept, no candidate.
    pub candidates: Option<&'a mut dyn FnMut() -> Vec<PeerId>>,
    /// The URL's CARP ranking, when the driver keeps them (the simulator ranks each object
    /// once per distinct array); computed by the CARP search when absent.
    pub ranking: Option<&'a [usize]>,
}

impl<'a> Miss<'a> {
    /// The peers whose summary says they may hold it ([`Miss::candidates`]).
    pub fn take_candidates(&mut self) -> Vec<PeerId> {
        self.candidates.take().map(|c| c()).unwrap_or_default()
    }

    /// A miss with no summary candidates and no ranking given.
    pub fn new(url: &'a str, key: &'a [u8; 16], host: &'a str, hierarchical: bool) -> Self {
        Miss {
            url,
            key,
            host,
            hierarchical,
            candidates: None,
            ranking: None,
        }
    }
}

/// A message a search sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Send {
    /// An ICP query for the miss's URL to one peer.
    Query {
        /// The search's request number.
        reqnum: u32,
        /// The peer.
        peer: PeerId,
        /// Its ICP address.
        addr: SocketAddr,
    },
    /// A multicast query for the miss's URL.
    Multicast {
        /// The search's request number.
        reqnum: u32,
        /// The group, or one member.
        to: Destination,
    },
    /// A directory datagram.
    Directory(Outgoing),
}

/// A search's step: what to send, and whether the route is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The request number to wait on (0 when decided).
    pub reqnum: u32,
    /// What to send, in order.
    pub sends: Vec<Send>,
    /// The route now, or a deadline.
    pub outcome: Outcome,
}

impl Step {
    /// A step that sends nothing and takes `route`.
    pub fn decided(route: Route) -> Step {
        Step {
            reqnum: 0,
            sends: Vec::new(),
            outcome: Outcome::Decided(route),
        }
    }
}

impl From<Search> for Step {
    fn from(s: Search) -> Step {
        let reqnum = s.reqnum;
        Step {
            reqnum,
            sends: s
                .queries
                .into_iter()
                .map(|(peer, addr)| Send::Query { reqnum, peer, addr })
                .collect(),
            outcome: s.outcome,
        }
    }
}

/// Where a search stands after a reply or a deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Its route.
    Decided(Route),
    /// It goes on: the next step, under its own request number.
    Next(Step),
}

/// One protocol's search. Every call gets the node's peer table; only [`begin`] must be
/// written, the rest defaults to ICP's own searches (which the peer table runs).
///
/// [`begin`]: SearchProtocol::begin
pub trait SearchProtocol: Any + std::marker::Send {
    /// Starts the search of a miss.
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step;

    /// An ICP reply from `from`. `None`: not one of this protocol's own searches (ICP's
    /// search takes it); `Some` of the route when it decides one.
    fn on_reply(
        &mut self,
        _now: Instant,
        _mesh: &mut IcpMesh,
        _from: SocketAddr,
        _reply: Reply<'_>,
    ) -> Option<Option<Route>> {
        None
    }

    /// The deadline of search `reqnum` passed: its route, if still undecided.
    fn on_deadline(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        mesh.on_deadline(now, reqnum)
    }

    /// Step `reqnum` decided `route`: the search's answer, or its next step.
    fn decided(
        &mut self,
        _now: Instant,
        _mesh: &mut IcpMesh,
        _reqnum: u32,
        route: Route,
    ) -> Progress {
        Progress::Decided(route)
    }

    /// The requester of search `reqnum` went away.
    fn abandon(&mut self, _reqnum: u32) {}
}

/// No search: the parents in Squid's order, then the origin.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSearch;

impl SearchProtocol for NoSearch {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        Step::decided(mesh.route(now, miss.host, None, false))
    }
}

/// One node's cooperation: its peer table and its protocol.
pub struct Engine {
    mesh: IcpMesh,
    protocol: Box<dyn SearchProtocol>,
}

impl Engine {
    /// The engine of a node with peer table `mesh`, searching by `protocol`.
    pub fn new(mesh: IcpMesh, protocol: Box<dyn SearchProtocol>) -> Engine {
        Engine { mesh, protocol }
    }

    /// The peer table.
    pub fn mesh(&self) -> &IcpMesh {
        &self.mesh
    }

    /// The peer table, to change.
    pub fn mesh_mut(&mut self) -> &mut IcpMesh {
        &mut self.mesh
    }

    /// The protocol, when it is a `P`.
    pub fn protocol<P: SearchProtocol>(&self) -> Option<&P> {
        (self.protocol.as_ref() as &dyn Any).downcast_ref()
    }

    /// The peer table and the protocol, when it is a `P` (for the protocol's upkeep).
    pub fn parts_mut<P: SearchProtocol>(&mut self) -> Option<(&mut IcpMesh, &mut P)> {
        let p = (self.protocol.as_mut() as &mut dyn Any).downcast_mut()?;
        Some((&mut self.mesh, p))
    }

    /// Starts the search of a miss.
    pub fn begin(&mut self, now: Instant, miss: Miss<'_>) -> Step {
        self.protocol.begin(now, &mut self.mesh, miss)
    }

    /// An ICP reply arrived from `from`: the search it moved on (by the request number the
    /// driver waits on), and how.
    pub fn on_reply(
        &mut self,
        now: Instant,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<(u32, Progress)> {
        let (reqnum, route) = match self.protocol.on_reply(now, &mut self.mesh, from, reply) {
            Some(route) => route.map(|r| (reply.reqnum, r)),
            None => self.mesh.on_reply(now, from, reply),
        }?;
        Some((
            reqnum,
            self.protocol.decided(now, &mut self.mesh, reqnum, route),
        ))
    }

    /// The deadline of search `reqnum` passed: how it goes on, if it was still waiting.
    pub fn on_deadline(&mut self, now: Instant, reqnum: u32) -> Option<Progress> {
        let route = self.protocol.on_deadline(now, &mut self.mesh, reqnum)?;
        Some(self.protocol.decided(now, &mut self.mesh, reqnum, route))
    }

    /// The requester of search `reqnum` went away: nothing of it is kept.
    pub fn abandon(&mut self, reqnum: u32) {
        self.mesh.abandon(reqnum);
        self.protocol.abandon(reqnum);
    }
}
