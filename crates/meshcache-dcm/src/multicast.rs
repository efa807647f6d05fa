//! The multicast search (the Berkeley protocol of the directory-based DCM paper, §2), without
//! I/O.
//!
//! **Search.** A local miss sends *one* ICP query for the URL to an IP multicast group that
//! every cooperating cache has joined ([`Mode::Ip`]), or, where the network cannot carry the
//! group, the same query to each member in turn ([`Mode::Logical`], the paper's footnote 3:
//! "logical multicast that actually sends N unicast messages"). The query carries
//! `meshcache_wire::multicast::MULTICAST_QUERY`: a member answers `ICP_OP_HIT` when it holds a
//! fresh copy and **stays silent otherwise**. The searcher cannot know how many members
//! received the query, nor wait for "all replies in": a miss is never answered.
//!
//! **Decision.** The first HIT decides: the request goes to that member (`SIBLING_HIT`, or
//! `PARENT_HIT` for a parent that answers), then the usual parent order and the origin
//! ([`crate::select::route`]). The paper's Berkeley caches redirect the client to the holder;
//! we fetch from it, as after an ICP hit, so the client sees one proxy.
//!
//! **Termination.** Nobody answers a miss, so the deadline is the normal end of one: the
//! request then goes to the parents or the origin (logged `TIMEOUT_…`). The wait therefore
//! matters on every miss and adapts: [`RTT_FACTOR`] times the largest mean HIT round trip
//! among the members asked (the slowest holder should still be heard), clamped to
//! [`MulticastConfig::timeout_floor`]..[`MulticastConfig::timeout_ceiling`]. Round trips are
//! measured on HITs only — the only answers there are — including HITs that arrive after the
//! deadline (the last searches that timed out are remembered for that), so a wait too short
//! for a far holder grows by itself. Until a first HIT gives a round trip, the wait is
//! [`COLD_FACTOR`] times the floor.
//!
//! **Members** of a search are the peers we may query for the host (an ICP address, not
//! `no_query`, its `domains` admit the host), siblings and parents alike: a parent that joined
//! the group and holds the object is a hit like any other. A search is made only for a
//! hierarchical request and only with at least one sibling among the members; otherwise (and
//! this is ICP's rule too) the request goes to the parents or the origin without a query.
//! Silence is normal here, so it never marks a peer dead: ICP's liveness is not consulted.
//!
//! **Responder.** [`Multicast::on_query`]: a query from a configured peer's ICP address is
//! answered `ICP_OP_HIT` when we hold a fresh copy, and not at all otherwise; a query from
//! anyone else (the group is open to any host that joins it) is dropped and counted.
//!
//! A local hit never reaches this module. Time is a parameter of every call; the caller sends
//! the queries (`meshcache-proxy`'s `multicast` driver).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::icp::{Holding, IcpMesh, Outcome, Reply, ReplyKind};
use crate::peer::{Peer, PeerId, Role};
use crate::select::Route;

/// The wait is this many times the largest mean HIT round trip of the members asked.
pub const RTT_FACTOR: u32 = 3;

/// Before any HIT round trip is known, the wait is this many times the floor.
pub const COLD_FACTOR: u32 = 5;

/// Searches that ended at their deadline and are still remembered, so that a late HIT
/// measures its round trip.
const REMEMBERED: usize = 256;

/// Tuning of the multicast search.
#[derive(Clone, Debug, PartialEq)]
pub struct MulticastConfig {
    /// Shortest wait for a HIT.
    pub timeout_floor: Duration,
    /// Longest wait for a HIT (the ICP ceiling).
    pub timeout_ceiling: Duration,
}

impl Default for MulticastConfig {
    fn default() -> Self {
        MulticastConfig {
            timeout_floor: Duration::from_millis(20),
            timeout_ceiling: Duration::from_secs(2),
        }
    }
}

/// How a query reaches the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One datagram to the IP multicast group; the network copies it to every member.
    Ip,
    /// One datagram per member, unicast (logical multicast).
    Logical,
}

impl Mode {
    /// The name `/stats` shows: `"ip"` or `"logical"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ip => "ip",
            Mode::Logical => "logical",
        }
    }
}

/// Where one query datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The multicast group (whose address the driver knows).
    Group,
    /// One member's ICP address (logical multicast).
    Peer {
        /// Which member.
        peer: PeerId,
        /// Its ICP address.
        addr: SocketAddr,
    },
}

/// What a search start gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McSearch {
    /// Its request number (0 when decided without a query).
    pub reqnum: u32,
    /// The query datagrams to send: one to the group, or one per member.
    pub queries: Vec<Destination>,
    /// Decided, or wait for a HIT until the deadline.
    pub outcome: Outcome,
}

/// What to do with a multicast query that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answer `ICP_OP_HIT`.
    Hit,
    /// Send nothing: we hold no fresh copy.
    Silent,
    /// Send nothing: the sender is not a member.
    Foreign,
}

/// Counters of the multicast search.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MulticastStats {
    /// Searches that sent a query.
    pub searches: u64,
    /// Misses decided without a query (not hierarchical, or no sibling to ask).
    pub unsearched: u64,
    /// Query datagrams the searches asked for (1 a search in IP mode, one per member in
    /// logical mode).
    pub datagrams: u64,
    /// Searches decided by a HIT.
    pub hits: u64,
    /// Searches that ended at the deadline: the normal end of a miss.
    pub timeouts: u64,
    /// HITs that came after the deadline (their round trip still counts).
    pub late_hits: u64,
    /// Multicast queries received from members.
    pub queries_received: u64,
    /// Queries we answered `ICP_OP_HIT`.
    pub hits_answered: u64,
    /// Queries we let pass in silence (no fresh copy).
    pub silent_misses: u64,
    /// Queries from senders that are not members, dropped.
    pub foreign_dropped: u64,
}

/// A search in flight. Its members are not kept: whether a peer is one is a function of the
/// peer's configuration and the host ([`Multicast::is_member`]), so a thousand-peer mesh does
/// not store a thousand ids per search.
struct Pending {
    url: String,
    host: String,
    sent: Instant,
}

/// The multicast search state of one node.
pub struct Multicast {
    config: MulticastConfig,
    mode: Mode,
    pending: HashMap<u32, Pending>,
    /// Searches that timed out, newest last, by request number.
    expired: VecDeque<(u32, Pending)>,
    stats: MulticastStats,
}

impl Multicast {
    /// A node sending its queries in `mode`.
    pub fn new(config: MulticastConfig, mode: Mode) -> Self {
        Multicast {
            config,
            mode,
            pending: HashMap::new(),
            expired: VecDeque::new(),
            stats: MulticastStats::default(),
        }
    }

    /// How queries are sent.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sends further queries in `mode` (the driver learns at start whether the network
    /// carries the group).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// Counters.
    pub fn stats(&self) -> &MulticastStats {
        &self.stats
    }

    /// Searches in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Whether `reqnum` is one of our searches in flight.
    pub fn is_searching(&self, reqnum: u32) -> bool {
        self.pending.contains_key(&reqnum)
    }

    /// The members a search for `host` asks: peers with an ICP address we may query and whose
    /// domains admit the host.
    pub fn members(peers: &[Peer], host: &str) -> Vec<PeerId> {
        peers
            .iter()
            .enumerate()
            .filter(|(_, p)| Self::is_member(p, host))
            .map(|(i, _)| PeerId(i))
            .collect()
    }

    /// Whether a search for `host` asks `peer` ([`Multicast::members`]).
    fn is_member(peer: &Peer, host: &str) -> bool {
        peer.spec.queried() && peer.spec.serves(host)
    }

    /// How long a search asking `members` waits for a HIT: [`RTT_FACTOR`] times the largest
    /// mean round trip among them, or [`COLD_FACTOR`] times the floor while none is known,
    /// within the floor and the ceiling.
    pub fn wait_for(&self, peers: &[Peer], members: &[PeerId]) -> Duration {
        let slowest = members
            .iter()
            .filter_map(|id| peers.get(id.0).and_then(|p| p.rtt_ms))
            .max();
        self.wait_after(slowest)
    }

    /// [`Multicast::wait_for`], given the largest mean round trip of the members, if any.
    fn wait_after(&self, slowest: Option<u32>) -> Duration {
        let wait = match slowest {
            Some(ms) => Duration::from_millis(u64::from(ms) * u64::from(RTT_FACTOR)),
            None => self.config.timeout_floor * COLD_FACTOR,
        };
        wait.clamp(
            self.config.timeout_floor,
            self.config.timeout_ceiling.max(self.config.timeout_floor),
        )
    }

    /// Starts the search for a miss of `url` (host `host`). Requests that may not consult
    /// siblings (`hierarchical` false), and searches with no sibling to ask, go to the parents
    /// or the origin at once, without a query.
    pub fn begin(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        url: &str,
        host: &str,
        hierarchical: bool,
    ) -> McSearch {
        // Whether a sibling is among the members, and the slowest: kept by the mesh when the
        // members are the same for every host, else one pass over the table.
        let (any_sibling, slowest) = mesh.queried_everywhere().unwrap_or_else(|| {
            let mut any_sibling = false;
            let mut slowest = None;
            for p in mesh.peers().iter().filter(|p| Self::is_member(p, host)) {
                any_sibling |= p.spec.role == Role::Sibling;
                slowest = slowest.max(p.rtt_ms);
            }
            (any_sibling, slowest)
        });
        if !hierarchical || !any_sibling {
            self.stats.unsearched += 1;
            return McSearch {
                reqnum: 0,
                queries: Vec::new(),
                outcome: Outcome::Decided(mesh.route(now, host, None, false)),
            };
        }
        let reqnum = mesh.next_reqnum();
        let queries: Vec<Destination> = match self.mode {
            Mode::Ip => vec![Destination::Group],
            Mode::Logical => Self::members(mesh.peers(), host)
                .into_iter()
                .filter_map(|peer| {
                    let addr = mesh.peers()[peer.0].spec.icp?;
                    Some(Destination::Peer { peer, addr })
                })
                .collect(),
        };
        for q in &queries {
            if let Destination::Peer { peer, .. } = q {
                mesh.peers_mut()[peer.0].stats.queries += 1;
            }
        }
        self.stats.searches += 1;
        self.stats.datagrams += queries.len() as u64;
        let deadline = now + self.wait_after(slowest);
        self.pending.insert(
            reqnum,
            Pending {
                url: url.to_owned(),
                host: host.to_owned(),
                sent: now,
            },
        );
        McSearch {
            reqnum,
            queries,
            outcome: Outcome::Wait { deadline },
        }
    }

    /// An ICP reply arrived from `from`. `None`: not one of our searches (the caller may give
    /// it to ICP). `Some(route)`: ours, and `route` is set when it decides the search.
    pub fn on_reply(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<Option<Route>> {
        let Some(p) = self.pending.get(&reply.reqnum) else {
            return self.on_late_reply(now, mesh, from, reply);
        };
        if p.url != reply.url {
            return None;
        }
        let Some(id) = mesh
            .peer_at(from)
            .filter(|id| Self::is_member(&mesh.peers()[id.0], &p.host))
        else {
            return Some(None);
        };
        let sent = p.sent;
        mesh.note_reply(now, id, reply.kind, reply.reqnum);
        if reply.kind != ReplyKind::Hit {
            // A responder that does not know the flag (Squid) answers misses too: ignored.
            return Some(None);
        }
        let p = self.pending.remove(&reply.reqnum)?;
        mesh.record_rtt(id, now.saturating_duration_since(sent));
        self.stats.hits += 1;
        Some(Some(mesh.hit_route(now, &p.host, id)))
    }

    /// A reply to a search that already ended: a HIT from one of its members still measures
    /// that member's round trip.
    fn on_late_reply(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<Option<Route>> {
        let (_, p) = self.expired.iter().find(|e| e.0 == reply.reqnum)?;
        if p.url != reply.url {
            return None;
        }
        let Some(id) = mesh
            .peer_at(from)
            .filter(|id| Self::is_member(&mesh.peers()[id.0], &p.host))
        else {
            return Some(None);
        };
        let sent = p.sent;
        mesh.note_reply(now, id, reply.kind, reply.reqnum);
        if reply.kind == ReplyKind::Hit {
            self.stats.late_hits += 1;
            mesh.peers_mut()[id.0].stats.late += 1;
            mesh.record_rtt(id, now.saturating_duration_since(sent));
        }
        Some(None)
    }

    /// The deadline of search `reqnum` passed: the parents or the origin, if still undecided.
    pub fn on_deadline(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        let p = self.pending.remove(&reqnum)?;
        self.stats.timeouts += 1;
        if self.expired.len() >= REMEMBERED {
            self.expired.pop_front();
        }
        let route = mesh.route(now, &p.host, None, true);
        self.expired.push_back((reqnum, p));
        Some(route)
    }

    /// The requester went away: forget the search.
    pub fn abandon(&mut self, reqnum: u32) {
        self.pending.remove(&reqnum);
    }

    /// A multicast query arrived from `from` (by the group, or unicast with the flag); we hold
    /// `holding` of its URL. Only members are answered, and only on a hit.
    pub fn on_query(&mut self, mesh: &mut IcpMesh, from: SocketAddr, holding: Holding) -> Answer {
        if mesh.peer_at(from).is_none() {
            self.stats.foreign_dropped += 1;
            return Answer::Foreign;
        }
        // Counts the query on the peer, as for any ICP query.
        mesh.on_query(from, false);
        self.stats.queries_received += 1;
        match holding {
            Holding::Fresh => {
                self.stats.hits_answered += 1;
                Answer::Hit
            }
            Holding::Nothing => {
                self.stats.silent_misses += 1;
                Answer::Silent
            }
        }
    }
}

#[cfg(test)]
mod tests;
