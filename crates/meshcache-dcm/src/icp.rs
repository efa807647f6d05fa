//! Search by ICP (RFC 2186/2187), as Squid does it, without I/O.
//!
//! On a miss, [`IcpMesh::begin`] decides whether a query is worth sending at all. It is not when
//! no sibling could have the object and at most one parent could take the request: the answer
//! could not change the route, and on a long link the query costs a full round trip (the
//! trans-Pacific pair lost 0.278 s per request polling its only parent; set
//! [`IcpConfig::query_lone_parent`] to reproduce that on purpose). Otherwise it returns
//! the peers to query, all with one request number, and how long to wait: twice the mean ICP
//! round trip of the peers expected to answer, within a configured floor and ceiling. Peers
//! that have gone silent are still queried (a reply revives them) but not waited for.
//!
//! Replies go to [`IcpMesh::on_reply`]: the first HIT decides at once; a parent's MISS makes it
//! a candidate (the one whose MISS came first, divided by its weight, or the one reporting the
//! smallest RTT to the origin); when every expected reply is in, or at the deadline
//! ([`IcpMesh::on_deadline`]), the best candidate leads the route and the usual parent order
//! follows (see [`crate::select`]).
//!
//! The responder side is [`IcpMesh::on_query`] plus [`answer`]: only configured peers (and
//! explicitly allowed children) get an answer other than DENIED; a sibling gets MISS_NOFETCH for
//! what we do not hold, because siblings may fetch only hits through us.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::hier::HierCode;
use crate::peer::{Peer, PeerId, PeerSpec, Role};
use crate::select::{self, Hop, Route};

/// Tuning of the ICP search.
#[derive(Clone, Debug, PartialEq)]
pub struct IcpConfig {
    /// Shortest wait for replies.
    pub timeout_floor: Duration,
    /// Longest wait for replies (Squid: `maximum_icp_query_timeout`, 2 s).
    pub timeout_ceiling: Duration,
    /// A peer silent this long after a query is not waited for (Squid: `dead_peer_timeout`).
    pub dead_after: Duration,
    /// Query a lone parent anyway (no siblings, one queried parent), as Squid does when
    /// configured so. The answer cannot change the route; the lab turns this on to measure what
    /// that misconfiguration costs. Off by default.
    pub query_lone_parent: bool,
}

impl Default for IcpConfig {
    fn default() -> Self {
        IcpConfig {
            timeout_floor: Duration::from_millis(50),
            timeout_ceiling: Duration::from_secs(2),
            dead_after: Duration::from_secs(10),
            query_lone_parent: false,
        }
    }
}

/// What an ICP reply said, as far as peer selection cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// The peer holds a fresh copy.
    Hit,
    /// The peer does not hold it (a parent would fetch it).
    Miss,
    /// The peer does not hold it and will not fetch it for us.
    MissNoFetch,
    /// The peer refuses to answer us.
    Denied,
    /// The peer could not parse our query.
    Err,
}

/// A decoded ICP reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply<'a> {
    /// Its kind.
    pub kind: ReplyKind,
    /// The request number it echoes.
    pub reqnum: u32,
    /// The URL it echoes.
    pub url: &'a str,
    /// The peer's RTT to the origin, in ms, if it reported one (SRC_RTT).
    pub src_rtt_ms: Option<u16>,
}

/// The outcome of starting a search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search {
    /// Request number shared by every query of this search (0 when nothing is sent).
    pub reqnum: u32,
    /// Peers to send an ICP_OP_QUERY for the URL to, with their ICP addresses.
    pub queries: Vec<(PeerId, SocketAddr)>,
    /// Whether to wait for replies.
    pub outcome: Outcome,
}

/// Whether a search is decided already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Take this route now (queries, if any, are sent only to keep liveness fresh).
    Decided(Route),
    /// Wait for replies until `deadline`, then call [`IcpMesh::on_deadline`].
    Wait {
        /// When to give up waiting.
        deadline: Instant,
    },
}

/// Who sent us a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asker {
    /// A configured peer.
    Peer(PeerId, Role),
    /// Not a configured peer, but allowed to query us (a child cache).
    Child,
    /// Nobody we know: answer DENIED.
    Stranger,
}

/// What our store holds for a queried URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holding {
    /// A copy fresh enough to serve now.
    Fresh,
    /// Nothing usable.
    Nothing,
}

/// The reply the responder sends.
pub fn answer(asker: Asker, holding: Holding) -> ReplyKind {
    match (asker, holding) {
        (Asker::Stranger, _) => ReplyKind::Denied,
        (_, Holding::Fresh) => ReplyKind::Hit,
        // We are that peer's sibling: it may fetch only hits through us.
        (Asker::Peer(_, Role::Sibling), Holding::Nothing) => ReplyKind::MissNoFetch,
        (_, Holding::Nothing) => ReplyKind::Miss,
    }
}

struct Pending {
    host: String,
    url: String,
    sent: Instant,
    /// Per peer: [`EXPECTED`] and [`REPLIED`] bits (a search may ask hundreds of peers in the
    /// simulator: membership must not cost a scan).
    marks: Vec<u8>,
    /// Expected peers that have not replied yet.
    awaiting: usize,
    /// Best parent MISS so far: (peer, score, code); lower score is better.
    best_miss: Option<(PeerId, u64, HierCode)>,
}

/// [`Pending::marks`]: the peer's reply is waited for.
const EXPECTED: u8 = 1;
/// [`Pending::marks`]: the peer has replied.
const REPLIED: u8 = 2;

/// The ICP protocol state of one node: its peers and its searches in flight.
pub struct IcpMesh {
    peers: Vec<Peer>,
    /// The parents among them, in table order (roles never change).
    parents: Vec<PeerId>,
    /// Peers by ICP address.
    by_addr: HashMap<SocketAddr, PeerId>,
    config: IcpConfig,
    next_reqnum: u32,
    pending: HashMap<u32, Pending>,
    /// Every queried peer takes requests for every host (none has a domain list), so a search
    /// asks the same peers whatever its URL.
    queried_serve_all: bool,
    /// A sibling is among the queried peers.
    queried_sibling: bool,
    /// The largest mean round trip among the queried peers, and whose, kept as round trips
    /// are recorded ([`IcpMesh::record_rtt`]) so that a search need not scan the table.
    slowest: Option<(u32, PeerId)>,
}

impl IcpMesh {
    /// A mesh with these peers, none heard from yet.
    pub fn new(peers: Vec<PeerSpec>, config: IcpConfig) -> Self {
        let mut by_addr = HashMap::new();
        for (i, p) in peers.iter().enumerate() {
            if let Some(addr) = p.icp {
                by_addr.entry(addr).or_insert(PeerId(i));
            }
        }
        let peers: Vec<Peer> = peers.into_iter().map(Peer::new).collect();
        let queried = || peers.iter().filter(|p| p.spec.queried());
        IcpMesh {
            queried_serve_all: queried().all(|p| p.spec.domains.is_empty()),
            queried_sibling: queried().any(|p| p.spec.role == Role::Sibling),
            slowest: None,
            by_addr,
            parents: select::parents_of(&peers),
            peers,
            config,
            next_reqnum: 1,
            pending: HashMap::new(),
        }
    }

    /// The peer table.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// The parents in the peer table, in table order.
    pub fn parents(&self) -> &[PeerId] {
        &self.parents
    }

    /// The route of a request that asks nobody: `first` if given, then the parents in Squid's
    /// order, then the origin ([`select::route`]).
    pub fn route(
        &mut self,
        now: Instant,
        host: &str,
        first: Option<Hop>,
        timed_out: bool,
    ) -> Route {
        select::route_among(&mut self.peers, &self.parents, host, now, first, timed_out)
    }

    /// The route after peer `hit` answered HIT ([`select::hit_route_among`]).
    pub fn hit_route(&mut self, now: Instant, host: &str, hit: PeerId) -> Route {
        select::hit_route_among(&mut self.peers, &self.parents, hit, host, now)
    }

    /// Searches in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The peer whose ICP address is `addr` (address and port must both match, as in Squid).
    pub fn peer_at(&self, addr: SocketAddr) -> Option<PeerId> {
        self.by_addr.get(&addr).copied()
    }

    fn take_reqnum(&mut self) -> u32 {
        let n = self.next_reqnum;
        // Never 0 (Squid treats it as a protocol change), wrap at 2^31 - 1.
        self.next_reqnum = if n >= 0x7fff_ffff { 1 } else { n + 1 };
        n
    }

    /// How long to wait for the expected peers: twice their mean ICP round trip, clamped.
    pub fn wait_for(&self, expecting: &[PeerId]) -> Duration {
        let rtts: Vec<u32> = expecting
            .iter()
            .filter_map(|id| self.peers[id.0].rtt_ms)
            .collect();
        if rtts.len() < expecting.len() || rtts.is_empty() {
            return self.config.timeout_ceiling;
        }
        let mean = rtts.iter().map(|&r| u64::from(r)).sum::<u64>() / rtts.len() as u64;
        Duration::from_millis(2 * mean)
            .clamp(self.config.timeout_floor, self.config.timeout_ceiling)
    }

    /// Starts the search for a cache miss of `url` (whose host is `host`). `hierarchical` is
    /// false for requests that must not consult siblings (not GET, `no-cache`, credentials):
    /// those go to parents or the origin without ICP.
    pub fn begin(&mut self, now: Instant, url: &str, host: &str, hierarchical: bool) -> Search {
        self.begin_guided(now, url, host, hierarchical, |_| true)
    }

    /// As [`IcpMesh::begin`], querying only the peers `candidate` accepts (every peer of the
    /// table is offered to it). With no sibling and at most one parent left, nothing is sent.
    pub fn begin_guided(
        &mut self,
        now: Instant,
        url: &str,
        host: &str,
        hierarchical: bool,
        candidate: impl Fn(PeerId) -> bool,
    ) -> Search {
        let siblings: Vec<PeerId> = self
            .peers
            .iter()
            .enumerate()
            .filter(|(i, p)| candidate(PeerId(*i)) && p.asked_as_sibling(host))
            .map(|(i, _)| PeerId(i))
            .collect();
        self.begin_with(now, url, host, hierarchical, siblings, candidate)
    }

    /// As [`IcpMesh::begin_guided`] with the candidates named: `among` (in any order). For a
    /// search that asks a few of many peers without looking at the others: a step of Summary
    /// Cache's search ([`crate::summary::Walk`]), where a peer is asked only when its summary
    /// says it may hold the object.
    pub fn begin_among(
        &mut self,
        now: Instant,
        url: &str,
        host: &str,
        hierarchical: bool,
        among: &[PeerId],
    ) -> Search {
        let mut siblings: Vec<PeerId> = among
            .iter()
            .copied()
            .filter(|id| {
                self.peers
                    .get(id.0)
                    .is_some_and(|p| p.asked_as_sibling(host))
            })
            .collect();
        // In table order, as a scan of the table would find them.
        siblings.sort_unstable();
        siblings.dedup();
        self.begin_with(now, url, host, hierarchical, siblings, |id| {
            among.contains(&id)
        })
    }

    /// The search that asks `siblings` and the parents `candidate` accepts.
    fn begin_with(
        &mut self,
        now: Instant,
        url: &str,
        host: &str,
        hierarchical: bool,
        siblings: Vec<PeerId>,
        candidate: impl Fn(PeerId) -> bool,
    ) -> Search {
        let parents = select::eligible_among(&self.peers, &self.parents, host, now);
        let queried_parents: Vec<PeerId> = parents
            .iter()
            .copied()
            .filter(|id| self.peers[id.0].spec.queried() && candidate(*id))
            .collect();
        let lone_parent = self.config.query_lone_parent && queried_parents.len() == 1;
        let worth_asking =
            hierarchical && (!siblings.is_empty() || queried_parents.len() >= 2 || lone_parent);
        if !worth_asking {
            let route = self.route(now, host, None, false);
            return Search {
                reqnum: 0,
                queries: Vec::new(),
                outcome: Outcome::Decided(route),
            };
        }
        let reqnum = self.take_reqnum();
        let targets: Vec<PeerId> = siblings.into_iter().chain(queried_parents).collect();
        let mut queries = Vec::with_capacity(targets.len());
        let mut expecting = Vec::new();
        for id in targets {
            let peer = &mut self.peers[id.0];
            let Some(addr) = peer.spec.icp else { continue };
            if peer.icp_alive(now, self.config.dead_after) {
                expecting.push(id);
            }
            peer.stats.queries += 1;
            if peer.unanswered_since.is_none() {
                peer.unanswered_since = Some(now);
            }
            queries.push((id, addr));
        }
        let awaited = !expecting.is_empty();
        for (id, _) in &queries {
            self.peers[id.0].last_query = Some((reqnum, now, awaited));
        }
        if expecting.is_empty() {
            // Nobody is known to be alive: send (replies revive peers) but do not wait.
            let route = self.route(now, host, None, false);
            return Search {
                reqnum,
                queries,
                outcome: Outcome::Decided(route),
            };
        }
        let deadline = now + self.wait_for(&expecting);
        let mut marks = vec![0; self.peers.len()];
        for id in &expecting {
            marks[id.0] = EXPECTED;
        }
        self.pending.insert(
            reqnum,
            Pending {
                host: host.to_owned(),
                url: url.to_owned(),
                sent: now,
                marks,
                awaiting: expecting.len(),
                best_miss: None,
            },
        );
        Search {
            reqnum,
            queries,
            outcome: Outcome::Wait { deadline },
        }
    }

    /// An ICP reply arrived from `from`. Returns the request number and its route when this
    /// reply decides the search. Replies from addresses that are not peers are ignored.
    pub fn on_reply(
        &mut self,
        now: Instant,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<(u32, Route)> {
        let id = self.peer_at(from)?;
        let awaited = self.note_reply(now, id, reply.kind, reply.reqnum);
        let peer = &mut self.peers[id.0];
        let Some(pending) = self.pending.get_mut(&reply.reqnum) else {
            if awaited {
                peer.stats.late += 1;
            }
            return None;
        };
        if pending.url != reply.url || pending.marks[id.0] & REPLIED != 0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(pending.sent);
        if pending.marks[id.0] & EXPECTED != 0 {
            pending.awaiting -= 1;
        }
        pending.marks[id.0] |= REPLIED;
        let role = peer.spec.role;
        match (reply.kind, role) {
            (ReplyKind::Hit, _) => {
                let p = self.pending.remove(&reply.reqnum)?;
                let route = self.hit_route(now, &p.host, id);
                return Some((reply.reqnum, route));
            }
            (ReplyKind::Miss, Role::Parent) => {
                let candidate = match reply.src_rtt_ms.filter(|&r| r > 0 && r < u16::MAX) {
                    // A reported RTT to the origin ranks ahead of arrival order.
                    Some(rtt) => (id, u64::from(rtt), HierCode::ClosestParentMiss),
                    None => {
                        let weight = u64::from(peer.spec.weight.max(1));
                        (
                            id,
                            1_000_000 + elapsed.as_micros() as u64 / weight,
                            HierCode::FirstParentMiss,
                        )
                    }
                };
                if pending
                    .best_miss
                    .is_none_or(|(_, score, _)| candidate.1 < score)
                {
                    pending.best_miss = Some(candidate);
                }
            }
            _ => {}
        }
        if pending.awaiting == 0 {
            let route = self.decide(now, reply.reqnum, false)?;
            return Some((reply.reqnum, route));
        }
        None
    }

    /// Liveness, counters and round trip of a reply from `id` to request `reqnum`. Returns
    /// whether a search was waiting for that peer's answer.
    pub(crate) fn note_reply(
        &mut self,
        now: Instant,
        id: PeerId,
        kind: ReplyKind,
        reqnum: u32,
    ) -> bool {
        let awaited = self.note_alive(now, id, reqnum);
        let peer = &mut self.peers[id.0];
        match kind {
            ReplyKind::Hit => peer.stats.hits += 1,
            ReplyKind::Miss => peer.stats.misses += 1,
            ReplyKind::MissNoFetch => peer.stats.miss_nofetch += 1,
            ReplyKind::Denied => peer.stats.denied += 1,
            ReplyKind::Err => peer.stats.errors += 1,
        }
        awaited
    }

    /// `id` answered something of request `reqnum` (a reply, or a directory answer): it is
    /// alive, and the round trip counts if that was the last thing we asked it. Returns whether
    /// a search was waiting for it.
    pub(crate) fn note_alive(&mut self, now: Instant, id: PeerId, reqnum: u32) -> bool {
        let peer = &mut self.peers[id.0];
        peer.last_reply = Some(now);
        peer.unanswered_since = None;
        let mut awaited = true;
        if let Some((n, sent, waited)) = peer.last_query {
            if n == reqnum {
                peer.last_query = None;
                awaited = waited;
                self.record_rtt(id, now.saturating_duration_since(sent));
            }
        }
        awaited
    }

    /// Adds a round-trip sample to `id`'s running mean (`Peer::record_rtt`), keeping the
    /// slowest queried peer's up to date.
    pub fn record_rtt(&mut self, id: PeerId, sample: Duration) {
        let Some(peer) = self.peers.get_mut(id.0) else {
            return;
        };
        peer.record_rtt(sample);
        if !peer.spec.queried() {
            return;
        }
        let Some(ms) = peer.rtt_ms else {
            return;
        };
        match self.slowest {
            Some((top, _)) if ms >= top => self.slowest = Some((ms, id)),
            // The slowest got faster: another may be slowest now.
            Some((_, who)) if who == id => self.slowest = self.scan_slowest(),
            Some(_) => {}
            None => self.slowest = Some((ms, id)),
        }
    }

    fn scan_slowest(&self) -> Option<(u32, PeerId)> {
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.spec.queried())
            .filter_map(|(i, p)| Some((p.rtt_ms?, PeerId(i))))
            .max_by_key(|&(ms, PeerId(i))| (ms, std::cmp::Reverse(i)))
    }

    /// When every queried peer takes requests for every host: whether a sibling is among
    /// them, and the largest mean round trip among them. `None` when some have domain lists
    /// (what a search asks then depends on its host).
    pub fn queried_everywhere(&self) -> Option<(bool, Option<u32>)> {
        self.queried_serve_all
            .then(|| (self.queried_sibling, self.slowest.map(|(ms, _)| ms)))
    }

    /// A query for search `reqnum` goes to `id` now: counted, and its silence watched.
    pub(crate) fn note_query(&mut self, now: Instant, id: PeerId, reqnum: u32, awaited: bool) {
        let peer = &mut self.peers[id.0];
        peer.stats.queries += 1;
        if peer.unanswered_since.is_none() {
            peer.unanswered_since = Some(now);
        }
        peer.last_query = Some((reqnum, now, awaited));
    }

    /// The next request number (never 0).
    pub(crate) fn next_reqnum(&mut self) -> u32 {
        self.take_reqnum()
    }

    /// The peer table, to build routes from.
    pub(crate) fn peers_mut(&mut self) -> &mut [Peer] {
        &mut self.peers
    }

    /// The ICP tuning.
    pub(crate) fn config(&self) -> &IcpConfig {
        &self.config
    }

    /// The deadline of search `reqnum` passed. Returns its route if it was still undecided.
    pub fn on_deadline(&mut self, now: Instant, reqnum: u32) -> Option<Route> {
        if let Some(p) = self.pending.get(&reqnum) {
            for (peer, &mark) in self.peers.iter_mut().zip(&p.marks) {
                if mark == EXPECTED {
                    peer.stats.timeouts += 1;
                }
            }
        }
        self.decide(now, reqnum, true)
    }

    /// The route of a miss when summaries were consulted instead of queries (Squid's Cache
    /// Digest search): the peers in `hits` whose summary says they hold the object go first
    /// (`CD_SIBLING_HIT` / `CD_PARENT_HIT`; siblings only for hierarchical requests, only peers
    /// whose HTTP side is up and who serve the host), then the usual parent order and the
    /// origin. A false hit costs one hop: the sibling answers 504 to `only-if-cached` and the
    /// next hop is tried.
    pub fn digest_route(
        &mut self,
        now: Instant,
        host: &str,
        hierarchical: bool,
        hits: &[PeerId],
    ) -> Route {
        let usable: Vec<Hop> = hits
            .iter()
            .filter_map(|&id| {
                let p = self.peers.get(id.0)?;
                let ok = p.http_up(now)
                    && p.spec.serves(host)
                    && (hierarchical || p.spec.role == Role::Parent);
                ok.then_some(Hop::Peer {
                    peer: id,
                    code: match p.spec.role {
                        Role::Sibling => HierCode::CdSiblingHit,
                        Role::Parent => HierCode::CdParentHit,
                    },
                })
            })
            .collect();
        let first = usable.first().copied();
        let mut route = self.route(now, host, first, false);
        // Further digest hits come right after the first, before the parents.
        for (i, hop) in usable.into_iter().skip(1).enumerate() {
            route.hops.retain(|h| !matches!((h, &hop), (Hop::Peer { peer: a, .. }, Hop::Peer { peer: b, .. }) if a == b));
            route.hops.insert(1 + i, hop);
        }
        route
    }

    /// The route of a search whose replies were weighed outside this machine (the simulator's
    /// aggregate model, which computes when each reply would arrive instead of delivering
    /// them): `hit` is the peer whose HIT came first, else `best_miss` the parent whose MISS
    /// ranked best; `timed_out` when the wait ended first. The same routes as
    /// [`IcpMesh::on_reply`] and [`IcpMesh::on_deadline`] decide.
    pub fn route_after(
        &mut self,
        now: Instant,
        host: &str,
        hit: Option<PeerId>,
        best_miss: Option<PeerId>,
        timed_out: bool,
    ) -> Route {
        match hit {
            Some(id) => self.hit_route(now, host, id),
            None => {
                let first = best_miss.map(|peer| Hop::Peer {
                    peer,
                    code: HierCode::FirstParentMiss,
                });
                self.route(now, host, first, timed_out)
            }
        }
    }

    /// The client went away; forget the search.
    pub fn abandon(&mut self, reqnum: u32) {
        self.pending.remove(&reqnum);
    }

    fn decide(&mut self, now: Instant, reqnum: u32, timed_out: bool) -> Option<Route> {
        let p = self.pending.remove(&reqnum)?;
        let first = p.best_miss.map(|(peer, _, code)| Hop::Peer { peer, code });
        Some(self.route(now, &p.host, first, timed_out))
    }

    /// A query arrived from `from`: who is asking (for [`answer`]). `child` tells whether a
    /// non-peer source is allowed to query us.
    pub fn on_query(&mut self, from: SocketAddr, child: bool) -> Asker {
        match self.peer_at(from) {
            Some(id) => {
                let peer = &mut self.peers[id.0];
                peer.stats.queries_received += 1;
                Asker::Peer(id, peer.spec.role)
            }
            None if child => Asker::Child,
            None => Asker::Stranger,
        }
    }

    /// `peer` sent us something on its ICP address other than a reply (a summary update): it
    /// is alive, though this answers no query of ours.
    pub fn heard_from(&mut self, now: Instant, peer: PeerId) {
        if let Some(p) = self.peers.get_mut(peer.0) {
            if p.last_reply.is_none() {
                p.last_reply = Some(now);
            }
        }
    }

    /// A request was forwarded to `peer`.
    pub fn fetch_started(&mut self, peer: PeerId) {
        self.peers[peer.0].stats.fetches += 1;
    }

    /// Forwarding to `peer` failed (refused, timed out, stalled): it is skipped for a while.
    pub fn fetch_failed(&mut self, now: Instant, peer: PeerId) {
        self.peers[peer.0].fetch_failed(now);
    }

    /// Forwarding to `peer` worked: it is up.
    pub fn fetch_ok(&mut self, peer: PeerId) {
        self.peers[peer.0].fetch_ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], port))
    }

    fn peer(name: &str, role: Role, n: u8) -> PeerSpec {
        PeerSpec::new(name, role, addr(n, 3128), Some(addr(n, 3130)))
    }

    fn reply(kind: ReplyKind, reqnum: u32, url: &str) -> Reply<'_> {
        Reply {
            kind,
            reqnum,
            url,
            src_rtt_ms: None,
        }
    }

    /// Makes every peer alive by a reply to a first, throwaway search.
    fn warm(mesh: &mut IcpMesh, now: Instant) {
        let s = mesh.begin(now, "http://warm/", "warm", true);
        for (id, a) in s.queries {
            let _ = id;
            mesh.on_reply(now, a, reply(ReplyKind::Miss, s.reqnum, "http://warm/"));
        }
        mesh.pending.clear();
    }

    const URL: &str = "http://a.test/x";

    #[test]
    fn never_poll_the_only_parent() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(vec![peer("p", Role::Parent, 2)], IcpConfig::default());
        let s = mesh.begin(now, URL, "a.test", true);
        assert!(s.queries.is_empty());
        let Outcome::Decided(route) = s.outcome else {
            panic!("decided at once")
        };
        assert_eq!(
            route.hops[0],
            Hop::Peer {
                peer: PeerId(0),
                code: HierCode::SingleParent
            }
        );
    }

    #[test]
    fn the_only_parent_is_polled_when_asked_to() {
        let now = Instant::now();
        let config = IcpConfig {
            query_lone_parent: true,
            ..IcpConfig::default()
        };
        let mut mesh = IcpMesh::new(vec![peer("p", Role::Parent, 2)], config);
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", true);
        assert_eq!(s.queries, vec![(PeerId(0), addr(2, 3130))]);
        assert!(matches!(s.outcome, Outcome::Wait { .. }));
        let (_, route) = mesh
            .on_reply(now, addr(2, 3130), reply(ReplyKind::Miss, s.reqnum, URL))
            .expect("decided by the only reply");
        assert!(
            matches!(
                route.hops[0],
                Hop::Peer {
                    peer: PeerId(0),
                    ..
                }
            ),
            "{route:?}"
        );
        // Still no query for a request that must not be searched.
        assert!(mesh.begin(now, URL, "a.test", false).queries.is_empty());
    }

    #[test]
    fn no_peers_means_direct_without_queries() {
        let mut mesh = IcpMesh::new(vec![], IcpConfig::default());
        let s = mesh.begin(Instant::now(), URL, "a.test", true);
        assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
        assert!(s.queries.is_empty());
    }

    #[test]
    fn unheard_peers_are_queried_but_not_waited_for() {
        let mut mesh = IcpMesh::new(vec![peer("s", Role::Sibling, 2)], IcpConfig::default());
        let s = mesh.begin(Instant::now(), URL, "a.test", true);
        assert_eq!(s.queries.len(), 1);
        assert!(matches!(s.outcome, Outcome::Decided(_)));
        assert_ne!(s.reqnum, 0);
    }

    #[test]
    fn first_hit_wins() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(
            vec![peer("s1", Role::Sibling, 2), peer("s2", Role::Sibling, 3)],
            IcpConfig::default(),
        );
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", true);
        assert!(matches!(s.outcome, Outcome::Wait { .. }));
        assert_eq!(s.queries.len(), 2);
        let t = now + Duration::from_millis(3);
        assert_eq!(
            mesh.on_reply(t, addr(2, 3130), reply(ReplyKind::Miss, s.reqnum, URL)),
            None
        );
        let (n, route) = mesh
            .on_reply(t, addr(3, 3130), reply(ReplyKind::Hit, s.reqnum, URL))
            .expect("decided");
        assert_eq!(n, s.reqnum);
        assert_eq!(
            route.hops,
            vec![
                Hop::Peer {
                    peer: PeerId(1),
                    code: HierCode::SiblingHit
                },
                Hop::Direct
            ]
        );
        assert_eq!(mesh.in_flight(), 0);
    }

    #[test]
    fn all_miss_goes_to_the_first_parent_miss() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(
            vec![
                peer("s", Role::Sibling, 2),
                peer("p1", Role::Parent, 3),
                peer("p2", Role::Parent, 4),
            ],
            IcpConfig::default(),
        );
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", true);
        assert_eq!(s.queries.len(), 3);
        let ms = |n| now + Duration::from_millis(n);
        assert!(mesh
            .on_reply(
                ms(1),
                addr(2, 3130),
                reply(ReplyKind::MissNoFetch, s.reqnum, URL)
            )
            .is_none());
        assert!(mesh
            .on_reply(ms(5), addr(4, 3130), reply(ReplyKind::Miss, s.reqnum, URL))
            .is_none());
        let (_, route) = mesh
            .on_reply(ms(9), addr(3, 3130), reply(ReplyKind::Miss, s.reqnum, URL))
            .expect("all in");
        assert_eq!(
            route.hops[0],
            Hop::Peer {
                peer: PeerId(2),
                code: HierCode::FirstParentMiss
            }
        );
        assert_eq!(
            route.hops[1],
            Hop::Peer {
                peer: PeerId(1),
                code: HierCode::FirstUpParent
            }
        );
        assert_eq!(route.hops[2], Hop::Direct);
    }

    #[test]
    fn weights_and_reported_rtt_rank_parents() {
        let now = Instant::now();
        let mut p2 = peer("p2", Role::Parent, 4);
        p2.weight = 10;
        let mut mesh = IcpMesh::new(vec![peer("p1", Role::Parent, 3), p2], IcpConfig::default());
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", true);
        let ms = |n| now + Duration::from_millis(n);
        mesh.on_reply(ms(5), addr(3, 3130), reply(ReplyKind::Miss, s.reqnum, URL));
        let (_, route) = mesh
            .on_reply(ms(20), addr(4, 3130), reply(ReplyKind::Miss, s.reqnum, URL))
            .expect("all in");
        assert_eq!(
            route.hops[0],
            Hop::Peer {
                peer: PeerId(1),
                code: HierCode::FirstParentMiss
            },
            "20 ms / 10 beats 5 ms / 1"
        );
        let s = mesh.begin(now, URL, "a.test", true);
        mesh.on_reply(
            ms(5),
            addr(3, 3130),
            Reply {
                src_rtt_ms: Some(80),
                ..reply(ReplyKind::Miss, s.reqnum, URL)
            },
        );
        let (_, route) = mesh
            .on_reply(
                ms(6),
                addr(4, 3130),
                Reply {
                    src_rtt_ms: Some(30),
                    ..reply(ReplyKind::Miss, s.reqnum, URL)
                },
            )
            .expect("all in");
        assert_eq!(
            route.hops[0],
            Hop::Peer {
                peer: PeerId(1),
                code: HierCode::ClosestParentMiss
            }
        );
    }

    #[test]
    fn timeout_decides_with_what_came_and_counts_the_silent() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(
            vec![peer("p1", Role::Parent, 3), peer("p2", Role::Parent, 4)],
            IcpConfig::default(),
        );
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", true);
        let Outcome::Wait { deadline } = s.outcome else {
            panic!("waits")
        };
        mesh.on_reply(now, addr(4, 3130), reply(ReplyKind::Miss, s.reqnum, URL));
        let route = mesh
            .on_deadline(deadline, s.reqnum)
            .expect("undecided until now");
        assert!(route.timed_out);
        assert_eq!(
            route.hops[0],
            Hop::Peer {
                peer: PeerId(1),
                code: HierCode::FirstParentMiss
            }
        );
        assert_eq!(mesh.peers()[0].stats.timeouts, 1);
        assert_eq!(mesh.on_deadline(deadline, s.reqnum), None, "decided once");
        // A late reply is counted, not acted on.
        assert!(mesh
            .on_reply(
                deadline,
                addr(3, 3130),
                reply(ReplyKind::Miss, s.reqnum, URL)
            )
            .is_none());
        assert_eq!(mesh.peers()[0].stats.late, 1);
    }

    #[test]
    fn silent_peers_stop_being_waited_for() {
        let now = Instant::now();
        let cfg = IcpConfig::default();
        let dead_after = cfg.dead_after;
        let mut mesh = IcpMesh::new(
            vec![peer("s1", Role::Sibling, 2), peer("s2", Role::Sibling, 3)],
            cfg,
        );
        warm(&mut mesh, now);
        // s2 stops answering.
        let s = mesh.begin(now, URL, "a.test", true);
        mesh.on_reply(now, addr(2, 3130), reply(ReplyKind::Miss, s.reqnum, URL));
        mesh.on_deadline(now + Duration::from_secs(2), s.reqnum);
        let later = now + dead_after + Duration::from_secs(1);
        let s = mesh.begin(later, URL, "a.test", true);
        assert_eq!(s.queries.len(), 2, "still queried");
        let (_, route) = mesh
            .on_reply(later, addr(2, 3130), reply(ReplyKind::Miss, s.reqnum, URL))
            .expect("s2 not awaited");
        assert_eq!(route, Route::direct());
    }

    #[test]
    fn adaptive_timeout_follows_rtt() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(vec![peer("s1", Role::Sibling, 2)], IcpConfig::default());
        let s = mesh.begin(now, URL, "a.test", true);
        mesh.on_reply(
            now + Duration::from_millis(40),
            addr(2, 3130),
            reply(ReplyKind::Miss, s.reqnum, URL),
        );
        assert_eq!(mesh.wait_for(&[PeerId(0)]), Duration::from_millis(80));
        let mut fast = IcpMesh::new(vec![peer("s1", Role::Sibling, 2)], IcpConfig::default());
        let s = fast.begin(now, URL, "a.test", true);
        fast.on_reply(
            now + Duration::from_millis(1),
            addr(2, 3130),
            reply(ReplyKind::Miss, s.reqnum, URL),
        );
        assert_eq!(
            fast.wait_for(&[PeerId(0)]),
            Duration::from_millis(50),
            "floor"
        );
    }

    #[test]
    fn strangers_and_wrong_ports_are_not_peers() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(vec![peer("s1", Role::Sibling, 2)], IcpConfig::default());
        assert_eq!(mesh.on_query(addr(9, 3130), false), Asker::Stranger);
        assert_eq!(
            mesh.on_query(addr(2, 9999), false),
            Asker::Stranger,
            "port must match"
        );
        assert_eq!(mesh.on_query(addr(9, 3130), true), Asker::Child);
        assert_eq!(
            mesh.on_query(addr(2, 3130), false),
            Asker::Peer(PeerId(0), Role::Sibling)
        );
        assert!(mesh
            .on_reply(now, addr(9, 3130), reply(ReplyKind::Hit, 1, URL))
            .is_none());
    }

    #[test]
    fn responder_answers() {
        let sib = Asker::Peer(PeerId(0), Role::Sibling);
        let par = Asker::Peer(PeerId(0), Role::Parent);
        assert_eq!(answer(sib, Holding::Fresh), ReplyKind::Hit);
        assert_eq!(answer(sib, Holding::Nothing), ReplyKind::MissNoFetch);
        assert_eq!(answer(par, Holding::Nothing), ReplyKind::Miss);
        assert_eq!(answer(Asker::Child, Holding::Nothing), ReplyKind::Miss);
        assert_eq!(answer(Asker::Stranger, Holding::Fresh), ReplyKind::Denied);
    }

    #[test]
    fn non_hierarchical_requests_skip_icp() {
        let now = Instant::now();
        let mut mesh = IcpMesh::new(vec![peer("s1", Role::Sibling, 2)], IcpConfig::default());
        warm(&mut mesh, now);
        let s = mesh.begin(now, URL, "a.test", false);
        assert!(s.queries.is_empty());
        assert_eq!(s.outcome, Outcome::Decided(Route::direct()));
    }

    #[test]
    fn reqnums_skip_zero_and_wrap() {
        let mut mesh = IcpMesh::new(vec![], IcpConfig::default());
        mesh.next_reqnum = 0x7fff_ffff;
        assert_eq!(mesh.take_reqnum(), 0x7fff_ffff);
        assert_eq!(mesh.take_reqnum(), 1);
    }
}
