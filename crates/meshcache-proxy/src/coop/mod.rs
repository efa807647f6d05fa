//! The cooperation driver: runs the node's `meshcache-dcm` engine with real sockets.
//!
//! [`Coop::route`] answers "where should this miss go?": the engine gives the search's first
//! step, `route` sends what the step sends and waits for the route — a reply or the deadline
//! moves the search on, perhaps to a next step (Summary Cache asks its candidates one at a
//! time), until it is decided. `crate::forward` then walks the route's hops.
//!
//! Layout, from the bottom: [`link`] (the engine, the ICP socket, the waiters, the counters)
//! and [`host`] (what cooperation uses of the node: the node implements it), the protocols'
//! upkeep ([`summary`], [`directory`], [`multicast`]: their own messages and timers, reaching
//! their machines through the link and the node through a host), [`upkeep`] (their states
//! together), [`icp`] (the UDP side), and this file (building the engine, following
//! searches). No file here imports one above it, nor the node. No protocol is named here but
//! in building the engine ([`configured_search`]).

use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap};
use meshcache_dcm::engine::{Engine, Miss, NoSearch, Progress, SearchProtocol, Send, Step};
use meshcache_dcm::icp::Outcome;
use meshcache_dcm::multicast::Destination;
use meshcache_dcm::protocols::{CarpSearch, DigestSearch, IcpSearch, SummarySearch};
use meshcache_dcm::{HierCode, Hop, IcpConfig, IcpMesh, PeerId, PeerSpec, Role, Route};
use serde::Serialize;

use crate::config::{CooperationConfig, PeerConfig, Protocol};

pub(crate) mod directory;
pub(crate) mod host;
mod icp;
mod link;
pub(crate) mod multicast;
pub(crate) mod summary;
mod upkeep;

pub(crate) use upkeep::Upkeep;

pub(crate) use icp::run_icp;
pub use link::{icp_allowed, Link};

/// The cooperation state of a node: its link (engine, socket, waiters) and each protocol's
/// upkeep state.
pub struct Coop {
    link: Link,
    specs: Vec<PeerSpec>,
    /// Each protocol's upkeep state.
    upkeep: Arc<Upkeep>,
    /// Whether any peer is a parent.
    has_parents: bool,
}

impl Deref for Coop {
    type Target = Link;

    fn deref(&self) -> &Link {
        &self.link
    }
}

impl Coop {
    /// Builds the peer table and the configured protocol's search. Queries go out once an
    /// ICP socket is attached.
    #[cfg(test)]
    pub fn new(full: &crate::Config) -> Self {
        Coop::with_search(full, None)
    }

    /// As [`Coop::new`], searching by `search` when given instead of by the configured
    /// protocol (which still says whether the node speaks ICP, and which upkeep runs).
    pub fn with_search(full: &crate::Config, search: Option<Box<dyn SearchProtocol>>) -> Self {
        let config: &CooperationConfig = &full.cooperation;
        let peers: &[PeerConfig] = &full.peers;
        let speaks_icp = config.protocol.uses_icp();
        let specs: Vec<PeerSpec> = peers
            .iter()
            .map(|p| PeerSpec {
                name: p.name.clone(),
                role: p.role,
                http: p.http,
                icp: if speaks_icp { p.icp } else { None },
                no_query: p.no_query,
                default: p.default,
                round_robin: p.round_robin,
                proxy_only: p.proxy_only,
                weight: p.weight,
                domains: p.domains.clone(),
            })
            .collect();
        let icp_config = IcpConfig {
            timeout_floor: config.icp_timeout_floor,
            timeout_ceiling: config.icp_timeout_ceiling,
            dead_after: config.dead_peer_timeout,
            query_lone_parent: config.query_lone_parent,
        };
        let has_parents = specs.iter().any(|p| p.role == Role::Parent);
        let (directory, directory_machine) = match (config.protocol == Protocol::Directory)
            .then(|| directory::DirectoryState::new(full))
            .flatten()
        {
            Some((state, machine)) => (Some(state), Some(machine)),
            None => (None, None),
        };
        let protocol = search.unwrap_or_else(|| configured_search(full, &specs, directory_machine));
        let engine = Engine::new(IcpMesh::new(specs.clone(), icp_config), protocol);
        Coop {
            link: Link::new(engine, config.clone()),
            specs,
            upkeep: Arc::new(Upkeep {
                summaries: summary::Summaries::new(full).map(Arc::new),
                directory: directory.map(Arc::new),
                multicast: multicast::MulticastState::new(full).map(Arc::new),
            }),
            has_parents,
        }
    }

    /// The summary state, when the protocol keeps summaries.
    pub fn summaries(&self) -> Option<&summary::Summaries> {
        self.upkeep.summaries.as_deref()
    }

    /// The summary state as the store's follower.
    pub(crate) fn summary_follower(&self) -> Option<Arc<summary::Summaries>> {
        self.upkeep.summaries.clone()
    }

    /// Each protocol's upkeep state, for the node's tasks.
    pub(crate) fn upkeep(&self) -> Arc<Upkeep> {
        self.upkeep.clone()
    }

    /// The directory state, when the protocol is `directory`.
    pub fn directory(&self) -> Option<&directory::DirectoryState> {
        self.upkeep.directory.as_deref()
    }

    /// The multicast state, when the protocol is `multicast`.
    pub fn multicast(&self) -> Option<&multicast::MulticastState> {
        self.upkeep.multicast.as_deref()
    }

    /// The parents that may take a request for `host` and whose HTTP side is up, in
    /// configuration order.
    pub(crate) fn parents_up(&self, host: &str) -> Vec<PeerId> {
        let now = Instant::now();
        let mesh = self.mesh();
        let peers = mesh.peers();
        mesh.parents()
            .iter()
            .copied()
            .filter(|id| peers[id.0].spec.serves(host) && peers[id.0].http_up(now))
            .collect()
    }

    /// `route` for a request that must not go to the origin (`never_direct`): its hops to
    /// peers that are up, and when none of them is a parent, every parent that is up.
    pub(crate) fn without_origin(&self, route: Route, host: &str) -> Route {
        let now = Instant::now();
        let mut hops: Vec<Hop> = {
            let mesh = self.mesh();
            route
                .hops
                .into_iter()
                .filter(
                    |h| matches!(h, Hop::Peer { peer, .. } if mesh.peers()[peer.0].http_up(now)),
                )
                .collect()
        };
        let has_parent = hops.iter().any(
            |h| matches!(h, Hop::Peer { peer, .. } if self.specs[peer.0].role == Role::Parent),
        );
        if !has_parent {
            hops.extend(self.parents_up(host).into_iter().map(|peer| Hop::Peer {
                peer,
                code: HierCode::FirstUpParent,
            }));
        }
        Route {
            hops,
            timed_out: route.timed_out,
        }
    }

    /// Decides where a miss of `url` goes. `hierarchical`: may siblings be asked.
    pub async fn route(&self, url: &str, host: &str, hierarchical: bool) -> Route {
        if self.specs.is_empty() {
            return Route::direct();
        }
        let key = meshcache_store::StoreKey::get(url).0;
        // What the peers' summaries say, read before the engine is locked (a request that may
        // not ask siblings, with no parent to ask, needs none).
        let mut candidates = self.summaries().map(|s| {
            s.read_inbox(self, meshcache_dcm::summary::pace::INBOX_POLL);
            if hierarchical || self.has_parents {
                s.candidates(&key)
            } else {
                Vec::new()
            }
        });
        let mut summaries_say = || candidates.take().unwrap_or_default();
        let mut miss = Miss::new(url, &key, host, hierarchical);
        miss.candidates = Some(&mut summaries_say);
        let step = self.engine().begin(Instant::now(), miss);
        self.follow(url, step).await
    }

    /// Follows a search from `step` to its route: each step's messages go out once its waiter
    /// is registered (a fast answer must find it), then a reply or the deadline decides it or
    /// gives the next step. A requester that goes away leaves no search behind.
    async fn follow(&self, url: &str, mut step: Step) -> Route {
        loop {
            let Step {
                reqnum,
                sends,
                outcome,
            } = step;
            let deadline = match outcome {
                Outcome::Decided(route) => {
                    self.send(url, sends).await;
                    return route;
                }
                Outcome::Wait { deadline } => deadline,
            };
            let mut rx = self.wait(reqnum);
            let _forget = Forget { link: self, reqnum };
            self.send(url, sends).await;
            let deadline = tokio::time::Instant::from_std(deadline);
            let progress = tokio::select! {
                moved = &mut rx => moved.unwrap_or_else(|_| Progress::Decided(Route::direct())),
                _ = tokio::time::sleep_until(deadline) => {
                    let progress = self.engine().on_deadline(Instant::now(), reqnum);
                    match progress {
                        Some(progress) => progress,
                        // A reply moved it just now.
                        None => rx
                            .try_recv()
                            .unwrap_or_else(|_| Progress::Decided(Route::direct())),
                    }
                }
            };
            step = match progress {
                Progress::Decided(route) => return route,
                Progress::Next(next) => next,
            };
        }
    }

    /// Sends a step's messages from the ICP socket: each search's datagram encoded once for
    /// all its destinations.
    async fn send(&self, url: &str, sends: Vec<Send>) {
        let mut queries: Vec<(u32, Vec<SocketAddr>)> = Vec::new();
        let mut group: Vec<(u32, Vec<Destination>)> = Vec::new();
        let mut directory = Vec::new();
        for send in sends {
            match send {
                Send::Query { reqnum, addr, .. } => match queries.last_mut() {
                    Some((n, to)) if *n == reqnum => to.push(addr),
                    _ => queries.push((reqnum, vec![addr])),
                },
                Send::Multicast { reqnum, to } => match group.last_mut() {
                    Some((n, all)) if *n == reqnum => all.push(to),
                    _ => group.push((reqnum, vec![to])),
                },
                Send::Directory(out) => directory.push(out),
            }
        }
        for (reqnum, to) in queries {
            self.send_queries(reqnum, url, &to).await;
        }
        if let Some(m) = self.multicast() {
            for (reqnum, to) in group {
                multicast::send_queries(self, m, reqnum, url, &to).await;
            }
        }
        if let (Some(d), false) = (self.directory(), directory.is_empty()) {
            directory::send_from(self, d, directory).await;
        }
    }

    /// Whether an HTTP request comes from a peer: the last hop of its `Via` names a configured
    /// peer, or it came through a cache (it has a `Via`) from an address in `icp_allow` (a
    /// child cache). Costs one header lookup for a request without `Via`.
    pub fn is_peer_request(&self, from: IpAddr, headers: &HeaderMap) -> bool {
        let Some(via) = headers.get_all(header::VIA).iter().next_back() else {
            return false;
        };
        let last_by = via
            .to_str()
            .ok()
            .and_then(|v| v.rsplit(',').map(str::trim).find(|hop| !hop.is_empty()))
            .and_then(|hop| hop.split_whitespace().nth(1));
        if last_by.is_some_and(|by| self.specs.iter().any(|s| s.name == by)) {
            return true;
        }
        icp_allowed(&self.config().icp_allow, from)
    }

    /// Whether any peer is configured.
    pub(crate) fn has_peers(&self) -> bool {
        !self.specs.is_empty()
    }

    /// The spec of a peer.
    pub fn spec(&self, id: PeerId) -> &PeerSpec {
        &self.specs[id.0]
    }

    pub(crate) fn fetch_result(&self, id: PeerId, ok: bool) {
        let mut mesh = self.mesh();
        if ok {
            mesh.fetch_ok(id);
        } else {
            mesh.fetch_failed(Instant::now(), id);
        }
    }

    /// Per-peer figures for `/stats` and `/metrics`.
    pub fn peer_stats(&self) -> Vec<PeerReport> {
        let now = Instant::now();
        let mesh = self.mesh();
        mesh.peers()
            .iter()
            .map(|p| PeerReport {
                name: p.spec.name.clone(),
                role: match p.spec.role {
                    Role::Parent => "parent",
                    Role::Sibling => "sibling",
                },
                up: p.http_up(now),
                icp_alive: p.icp_alive(now, self.config().dead_peer_timeout),
                rtt_ms: p.rtt_ms,
                stats: p.stats.clone(),
            })
            .collect()
    }
}

/// The search `full` configures over the peer table `specs` (`directory`: the directory's
/// machine, when the protocol is `directory` and the node has an IPv4 ICP address).
fn configured_search(
    full: &crate::Config,
    specs: &[PeerSpec],
    directory: Option<meshcache_dcm::directory::Directory>,
) -> Box<dyn SearchProtocol> {
    match full.cooperation.protocol {
        Protocol::None => Box::new(NoSearch),
        Protocol::Icp => Box::new(IcpSearch),
        Protocol::Summary => Box::new(SummarySearch::default()),
        Protocol::Digest => Box::new(DigestSearch),
        Protocol::Carp if full.cooperation.carp_member => Box::new(CarpSearch::new(
            meshcache_dcm::CarpRouter::with_self(specs, &full.name, 1),
            true,
        )),
        Protocol::Carp => Box::new(CarpSearch::new(
            meshcache_dcm::CarpRouter::new(specs),
            false,
        )),
        Protocol::Directory => match directory {
            Some(machine) => Box::new(machine),
            // No IPv4 ICP address to be known by: plain ICP.
            None => Box::new(IcpSearch),
        },
        Protocol::Multicast => Box::new(multicast::machine(full)),
    }
}

/// Forgets a search whose requester went away.
struct Forget<'a> {
    link: &'a Link,
    reqnum: u32,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.link.forget(self.reqnum);
    }
}

/// One peer, as `/stats` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerReport {
    /// Name.
    pub name: String,
    /// `parent` or `sibling`.
    pub role: &'static str,
    /// Its HTTP side may be used.
    pub up: bool,
    /// It answers ICP.
    pub icp_alive: bool,
    /// Mean ICP round trip.
    pub rtt_ms: Option<u32>,
    /// Counters.
    pub stats: meshcache_dcm::peer::PeerStats,
}
