//! meshcache-dcm: distributed cache management, as sans-IO state machines.
//!
//! The directory-based DCM paper (§2) splits cooperation between caches into five
//! algorithms; this crate is organised around them:
//! - **admission**: which cache a client talks to; the lab assigns clients, a node accepts.
//! - **search**: how a miss looks for a copy among neighbours ([`icp`]: query every eligible
//!   peer in parallel; [`summary`]: ask only the peers whose summary says "maybe" — Summary
//!   Cache's ICP queries, one peer at a time, or Cache Digests' straight fetch; [`directory`]:
//!   ask the URL's directory owner, then α holders; [`multicast`]: one query to a multicast
//!   group, answered by holders only).
//! - **decision**: which neighbour serves it ([`select`]: first HIT; else the first or closest
//!   parent MISS, weighted; else other parents, the default parent, then the origin; [`carp`]:
//!   no search at all, CARP hashing of the URL picks the parent).
//! - **termination**: when to stop searching ([`icp`]: all expected replies in, a HIT, or an
//!   adaptive timeout; never a query whose answer cannot change the route; dead peers are
//!   not waited for; [`multicast`]: misses are never answered, so the adaptive deadline is the
//!   normal end of a miss).
//! - **replication**: whether the requesting cache keeps a copy (`proxy-only` peers).
//!
//! Nothing here does I/O or reads a clock: every call takes `now`, and every effect is returned
//! (datagrams to send, a route to take). The proxy drives these machines with real sockets; the
//! simulator drives the same code with a virtual clock.
//!
//! Layout: [`peer`] (configuration, liveness and statistics of each neighbour, domain
//! matching), `hier` (Squid's hierarchy codes), [`select`] (ordering the candidates of a
//! request), [`carp`] (CARP hash routing over the parents), [`icp`] (the ICP search and
//! responder logic), [`summary`] (our own summary and its delta updates; the neighbours'
//! summaries), [`directory`] (dbDCM: the shared directory, its search variants and upkeep),
//! [`multicast`] (the Berkeley protocol: the multicast search, its adaptive deadline and its
//! silent responder). Above them, [`engine`] is one node's cooperation as a driver sees it —
//! the peer table and one protocol's search behind a handful of entry points that return what
//! to do — and [`protocols`] maps each protocol's machine onto it, one file per protocol.

pub mod carp;
pub mod directory;
pub mod engine;
mod hier;
pub mod icp;
pub mod multicast;
pub mod peer;
pub mod protocols;
pub mod select;
pub mod summary;

pub use carp::CarpRouter;
pub use hier::HierCode;
pub use icp::{answer, Asker, Holding, IcpConfig, IcpMesh, Outcome, Reply, ReplyKind, Search};
pub use peer::{PeerId, PeerSpec, Role};
pub use select::{Hop, Route};
