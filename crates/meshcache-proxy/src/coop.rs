//! The cooperation driver: runs the `meshcache-dcm` machines with real sockets.
//!
//! [`Coop::route`] answers "where should this miss go?": it starts the search (ICP queries to
//! the peers worth asking, or none), waits for the decision (a HIT, all replies in, or the
//! adaptive deadline) and returns the ordered hops. `forward` then tries the hops in order:
//! a sibling is asked with `only-if-cached` (its 504 means "gone since", and the next hop is
//! tried), and a peer that refuses the connection or sends no response head within
//! `cooperation.peer_response_timeout` of the request's last byte is marked down and skipped,
//! so a dead or stalled parent costs at most that bound and never the request. `run_icp` is
//! the UDP side: it answers peers' queries from the store and feeds replies to the search.
//!
//! Per protocol, `route` hands the search to its own driver: [`crate::directory`] (a lookup
//! at the URL's owner, then α holders), [`crate::multicast`] (one query to the group, or to
//! each member, answered by holders only), CARP (no search), the summaries (queries only where
//! a summary says hit, one peer at a time, or none for digests), or plain ICP.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use ipnet::IpNet;
use meshcache_dcm::icp::{Outcome, Search};
use meshcache_dcm::summary::Walk;
use meshcache_dcm::{
    HierCode, Hop, IcpConfig, IcpMesh, PeerId, PeerSpec, Reply, ReplyKind, Role, Route,
};
use meshcache_wire::icp;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

use crate::config::{CooperationConfig, PeerConfig, Protocol};
use crate::efficiency::{Category, Source, Timed};
use crate::error::UpstreamError;
use crate::headers;
use crate::routing::Directness;
use crate::target::Target;
use crate::upstream::{Lease, UpBody};
use crate::Shared;

/// Node-wide ICP counters.
#[derive(Debug, Default)]
pub struct IcpCounters {
    /// Queries sent.
    pub queries_sent: AtomicU64,
    /// Replies received (from peers).
    pub replies_received: AtomicU64,
    /// Queries received.
    pub queries_received: AtomicU64,
    /// Replies sent.
    pub replies_sent: AtomicU64,
    /// Queries from strangers, answered DENIED.
    pub denied: AtomicU64,
    /// Datagrams that did not decode, or came from nobody we know.
    pub dropped: AtomicU64,
    /// Bytes of every datagram sent from the ICP socket (queries, replies, summary updates).
    pub bytes_sent: AtomicU64,
    /// Bytes of every datagram received on it.
    pub bytes_received: AtomicU64,
    /// Directory datagrams sent (`DIR_*`, and the candidate queries the directory made).
    pub directory_sent: AtomicU64,
    /// Directory datagrams received.
    pub directory_received: AtomicU64,
    /// Directory datagrams refused: malformed, from a non-member, or a member speaking for
    /// another.
    pub directory_bad: AtomicU64,
}

/// The cooperation state of a node.
pub struct Coop {
    pub(crate) mesh: Mutex<IcpMesh>,
    specs: Vec<PeerSpec>,
    config: CooperationConfig,
    icp: OnceLock<Arc<UdpSocket>>,
    waiters: Mutex<HashMap<u32, oneshot::Sender<Route>>>,
    /// Our summary and the peers' (summary and digest protocols).
    summaries: Option<Arc<crate::summary::Summaries>>,
    /// Our share of the directory (directory protocol).
    directory: Option<crate::directory::DirectoryState>,
    /// The parents as a CARP array (carp protocol).
    carp: Option<meshcache_dcm::CarpRouter>,
    /// Whether any peer is a parent.
    has_parents: bool,
    /// The multicast search (multicast protocol).
    multicast: Option<crate::multicast::MulticastState>,
    /// Counters.
    pub counters: IcpCounters,
}

/// What a forwarded request went through.
pub struct Forwarded {
    /// The response head and body.
    pub response: Response<Incoming>,
    /// The connection, to release when the body is done.
    pub lease: Lease,
    /// How the hop was chosen.
    pub hier: HierCode,
    /// The ICP wait ended by timeout.
    pub timed_out: bool,
    /// Do not store what came back (a `proxy_only` peer served it).
    pub proxy_only: bool,
}

impl Coop {
    /// Builds the peer table. Queries go out once an ICP socket is attached.
    pub fn new(full: &crate::Config) -> Self {
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
        let carp = (config.protocol == Protocol::Carp).then(|| {
            if config.carp_member {
                meshcache_dcm::CarpRouter::with_self(&specs, &full.name, 1)
            } else {
                meshcache_dcm::CarpRouter::new(&specs)
            }
        });
        Coop {
            mesh: Mutex::new(IcpMesh::new(specs.clone(), icp_config)),
            specs,
            config: config.clone(),
            icp: OnceLock::new(),
            waiters: Mutex::new(HashMap::new()),
            summaries: crate::summary::Summaries::new(full).map(Arc::new),
            directory: (config.protocol == Protocol::Directory)
                .then(|| crate::directory::DirectoryState::new(full))
                .flatten(),
            carp,
            has_parents,
            multicast: crate::multicast::MulticastState::new(full),
            counters: IcpCounters::default(),
        }
    }

    /// Attaches the bound ICP socket (once).
    pub fn attach(&self, socket: Arc<UdpSocket>) {
        let _ = self.icp.set(socket);
    }

    /// The summary state, when the protocol keeps summaries.
    pub fn summaries(&self) -> Option<&crate::summary::Summaries> {
        self.summaries.as_deref()
    }

    /// The summary state as the store's follower.
    pub(crate) fn summary_follower(&self) -> Option<Arc<crate::summary::Summaries>> {
        self.summaries.clone()
    }

    /// The directory state, when the protocol is `directory`.
    pub fn directory(&self) -> Option<&crate::directory::DirectoryState> {
        self.directory.as_ref()
    }

    /// The multicast state, when the protocol is `multicast`.
    pub fn multicast(&self) -> Option<&crate::multicast::MulticastState> {
        self.multicast.as_ref()
    }

    /// The cooperation settings.
    pub(crate) fn config(&self) -> &CooperationConfig {
        &self.config
    }

    /// Who is asking, for a query that arrives from (or is answered at) `addr`.
    pub(crate) fn mesh_on_query(&self, addr: SocketAddr) -> meshcache_dcm::Asker {
        let child = icp_allowed(&self.config.icp_allow, addr.ip());
        self.mesh.lock().on_query(addr, child)
    }

    /// A search was decided outside a reply (a directory answer): wake its requester.
    pub(crate) fn decided(&self, reqnum: u32, route: Route) {
        if let Some(tx) = self.waiters.lock().remove(&reqnum) {
            let _ = tx.send(route);
        }
    }

    /// The peer at ICP address `addr` sent us something: it is alive.
    pub(crate) fn heard_from_addr(&self, addr: SocketAddr) {
        let mut mesh = self.mesh.lock();
        if let Some(id) = mesh.peer_at(addr) {
            mesh.heard_from(Instant::now(), id);
        }
    }

    /// The ICP socket, once attached.
    pub(crate) fn icp_socket(&self) -> Option<&Arc<UdpSocket>> {
        self.icp.get()
    }

    /// The peer whose ICP address is `addr`.
    pub fn peer_at(&self, addr: SocketAddr) -> Option<PeerId> {
        self.mesh.lock().peer_at(addr)
    }

    /// `peer` sent a summary update: its ICP side is alive.
    pub(crate) fn heard_from(&self, peer: PeerId) {
        self.mesh.lock().heard_from(Instant::now(), peer);
    }

    /// The ICP socket's address, when ICP is on.
    pub fn icp_addr(&self) -> Option<SocketAddr> {
        self.icp.get().and_then(|s| s.local_addr().ok())
    }

    /// The parents that may take a request for `host` and whose HTTP side is up, in
    /// configuration order.
    pub(crate) fn parents_up(&self, host: &str) -> Vec<PeerId> {
        let now = Instant::now();
        let mesh = self.mesh.lock();
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
            let mesh = self.mesh.lock();
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
        if let Some(carp) = &self.carp {
            let now = Instant::now();
            let mesh = self.mesh.lock();
            let peers = mesh.peers();
            let mut route = carp.route(url, host, |id| peers[id.0].http_up(now));
            if route.hops.len() == 1 && !self.config.carp_member {
                // Every CARP parent is down (or none serves the host): the other parents in
                // Squid's order, then the origin. (A member of its own array fetches what it
                // wins itself.)
                drop(mesh);
                if let Outcome::Decided(r) = self.mesh.lock().begin(now, url, host, false).outcome {
                    route = r;
                }
            }
            return route;
        }
        if let Some(d) = &self.directory {
            let key = meshcache_store::StoreKey::get(url).0;
            let search = {
                let mut mesh = self.mesh.lock();
                d.dir
                    .lock()
                    .begin(Instant::now(), &mut mesh, url, &key, host, hierarchical)
            };
            let meshcache_dcm::directory::DirSearch {
                reqnum,
                sends,
                outcome,
            } = search;
            return self
                .search(reqnum, outcome, async {
                    if !sends.is_empty() {
                        crate::directory::send_from(self, sends).await;
                    }
                })
                .await;
        }
        if let Some(m) = &self.multicast {
            let search = {
                let mut mesh = self.mesh.lock();
                m.dcm
                    .lock()
                    .begin(Instant::now(), &mut mesh, url, host, hierarchical)
            };
            let meshcache_dcm::multicast::McSearch {
                reqnum,
                queries,
                outcome,
            } = search;
            return self
                .search(reqnum, outcome, async {
                    if !queries.is_empty() {
                        crate::multicast::send_queries(self, reqnum, url, &queries).await;
                    }
                })
                .await;
        }
        let search = match &self.summaries {
            None => self
                .mesh
                .lock()
                .begin(Instant::now(), url, host, hierarchical),
            Some(s) => {
                s.read_inbox(self, meshcache_dcm::summary::pace::INBOX_POLL);
                let hits = if hierarchical || self.has_parents {
                    s.candidates(&meshcache_store::StoreKey::get(url).0)
                } else {
                    Vec::new()
                };
                if hits.is_empty() && !self.has_parents {
                    // No summary says "maybe" and no parent could take it: the origin, with no
                    // search to set up (the common case of a summary mesh).
                    return Route::direct();
                }
                let now = Instant::now();
                if self.config.protocol == Protocol::Digest {
                    return self
                        .mesh
                        .lock()
                        .digest_route(now, host, hierarchical, &hits);
                }
                return self.walk(url, host, hierarchical, &hits).await;
            }
        };
        let Search {
            reqnum,
            queries,
            outcome,
        } = search;
        self.search(reqnum, outcome, async {
            if !queries.is_empty() {
                self.send_queries(reqnum, url, &queries).await;
            }
        })
        .await
    }

    /// Summary Cache's search: the candidates `hits` asked one at a time ([`Walk`]).
    async fn walk(&self, url: &str, host: &str, hierarchical: bool, hits: &[PeerId]) -> Route {
        let mut walk = Walk::new(&self.mesh.lock(), hits, hierarchical);
        loop {
            let Search {
                reqnum,
                queries,
                outcome,
            } = walk.step(
                &mut self.mesh.lock(),
                Instant::now(),
                url,
                host,
                hierarchical,
            );
            let route = self
                .search(reqnum, outcome, async {
                    if !queries.is_empty() {
                        self.send_queries(reqnum, url, &queries).await;
                    }
                })
                .await;
            if walk.ends(&route) {
                return route;
            }
        }
    }

    /// Runs search `reqnum`: registers its waiter before `send` sends its messages (a fast
    /// answer must find it), then waits for the decision. From the waiter on, a requester that
    /// goes away leaves no search behind.
    async fn search(&self, reqnum: u32, outcome: Outcome, send: impl Future<Output = ()>) -> Route {
        let waiter = self.wait_for_decision(&outcome, reqnum);
        let _forget = waiter.as_ref().map(|_| Forget { coop: self, reqnum });
        send.await;
        self.decision(outcome, waiter, reqnum).await
    }

    /// A waiter for search `reqnum`, when it is not decided yet.
    fn wait_for_decision(
        &self,
        outcome: &Outcome,
        reqnum: u32,
    ) -> Option<oneshot::Receiver<Route>> {
        match outcome {
            Outcome::Wait { .. } => {
                let (tx, rx) = oneshot::channel();
                self.waiters.lock().insert(reqnum, tx);
                Some(rx)
            }
            Outcome::Decided(_) => None,
        }
    }

    /// The route of search `reqnum`: decided already, decided by a reply, or what stands at
    /// its deadline.
    async fn decision(
        &self,
        outcome: Outcome,
        waiter: Option<oneshot::Receiver<Route>>,
        reqnum: u32,
    ) -> Route {
        match (outcome, waiter) {
            (Outcome::Decided(route), _) => route,
            (Outcome::Wait { deadline }, Some(mut rx)) => {
                let deadline = tokio::time::Instant::from_std(deadline);
                tokio::select! {
                    decided = &mut rx => decided.unwrap_or_else(|_| Route::direct()),
                    _ = tokio::time::sleep_until(deadline) => {
                        let route = {
                            let mut mesh = self.mesh.lock();
                            let now = Instant::now();
                            match (&self.directory, &self.multicast) {
                                (Some(d), _) => d.dir.lock().on_deadline(now, &mut mesh, reqnum),
                                (None, Some(m)) => m.dcm.lock().on_deadline(now, &mut mesh, reqnum),
                                (None, None) => mesh.on_deadline(now, reqnum),
                            }
                        };
                        match route {
                            Some(route) => route,
                            // A reply decided it just now.
                            None => rx.try_recv().unwrap_or_else(|_| Route::direct()),
                        }
                    }
                }
            }
            (Outcome::Wait { .. }, None) => Route::direct(),
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
        icp_allowed(&self.config.icp_allow, from)
    }

    /// The spec of a peer.
    pub fn spec(&self, id: PeerId) -> &PeerSpec {
        &self.specs[id.0]
    }

    pub(crate) fn fetch_result(&self, id: PeerId, ok: bool) {
        let mut mesh = self.mesh.lock();
        if ok {
            mesh.fetch_ok(id);
        } else {
            mesh.fetch_failed(Instant::now(), id);
        }
    }

    /// Per-peer figures for `/stats` and `/metrics`.
    pub fn peer_stats(&self) -> Vec<PeerReport> {
        let now = Instant::now();
        let mesh = self.mesh.lock();
        mesh.peers()
            .iter()
            .map(|p| PeerReport {
                name: p.spec.name.clone(),
                role: match p.spec.role {
                    Role::Parent => "parent",
                    Role::Sibling => "sibling",
                },
                up: p.http_up(now),
                icp_alive: p.icp_alive(now, self.config.dead_peer_timeout),
                rtt_ms: p.rtt_ms,
                stats: p.stats.clone(),
            })
            .collect()
    }
}

/// Forgets a search whose requester went away.
struct Forget<'a> {
    coop: &'a Coop,
    reqnum: u32,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.coop.waiters.lock().remove(&self.reqnum);
        self.coop.mesh.lock().abandon(self.reqnum);
        if let Some(d) = &self.coop.directory {
            d.dir.lock().abandon(self.reqnum);
        }
        if let Some(m) = &self.coop.multicast {
            m.dcm.lock().abandon(self.reqnum);
        }
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

/// Sends a request along its route: each hop in turn until one answers.
///
/// `retryable` requests (no body) move to the next hop when one fails; others get one try.
pub(crate) async fn forward(
    shared: &Shared,
    method: &Method,
    headers: &HeaderMap,
    target: &Target,
    mut body: Option<Incoming>,
    hierarchical: bool,
) -> Result<Forwarded, UpstreamError> {
    let route = if shared.coop.specs.is_empty() || target.directness == Directness::Always {
        Route::direct()
    } else {
        let search = shared.coop.route(&target.url, &target.host, hierarchical);
        tokio::pin!(search);
        Timed::new(
            search,
            &shared.metrics.efficiency,
            Source::Fixed(Category::Search),
        )
        .await
    };
    let route = if target.directness == Directness::Never {
        shared.coop.without_origin(route, &target.host)
    } else {
        route
    };
    if route.hops.is_empty() {
        return Err(UpstreamError::NoRoute {
            host: target.host.clone(),
        });
    }
    let mut last_error = None;
    let hops = route.hops.len();
    for (i, hop) in route.hops.iter().enumerate() {
        let last = i + 1 == hops || body.is_some();
        let (up_body, body_sent) = match body.take() {
            Some(b) => {
                let (up, sent) = UpBody::client_watched(b);
                (up, Some(sent))
            }
            None => (crate::upstream::no_body(), None),
        };
        match *hop {
            Hop::Direct => {
                let req = crate::target::upstream_request(
                    shared,
                    method.clone(),
                    headers,
                    target,
                    up_body,
                );
                match shared.upstream.send(&target.host, target.port, req).await {
                    Ok((response, lease)) => {
                        return Ok(Forwarded {
                            response,
                            lease,
                            hier: HierCode::Direct,
                            timed_out: route.timed_out,
                            proxy_only: false,
                        })
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            Hop::Peer { peer, code } => {
                let spec = shared.coop.spec(peer);
                if headers::via_contains(headers, &spec.name) {
                    // The request already passed through that peer: sending it back would loop.
                    continue;
                }
                let req = peer_request(
                    shared,
                    peer,
                    method,
                    headers,
                    target,
                    spec.role == Role::Sibling,
                    up_body,
                );
                let host = spec.http.ip().to_string();
                shared.coop.mesh.lock().fetch_started(peer);
                // The peer has `peer_response_timeout` to answer once it has the whole request:
                // an upload that takes longer is the client's time, not a stalled peer.
                let stalled = async {
                    if let Some(sent) = body_sent {
                        let _ = sent.await;
                    }
                    tokio::time::sleep(shared.config.cooperation.peer_response_timeout).await;
                };
                let sent = tokio::select! {
                    sent = shared.upstream.send(&host, spec.http.port(), req) => Ok(sent),
                    () = stalled => Err(()),
                };
                match sent {
                    Ok(Ok((response, lease))) => {
                        shared.coop.fetch_result(peer, true);
                        let false_hit = match code {
                            HierCode::CdSiblingHit => {
                                response.status() == StatusCode::GATEWAY_TIMEOUT
                            }
                            HierCode::CdParentHit => response
                                .headers()
                                .get("x-cache")
                                .and_then(|v| v.to_str().ok())
                                .is_some_and(|v| v.starts_with("MISS")),
                            _ => false,
                        };
                        if false_hit {
                            if let Some(s) = shared.coop.summaries() {
                                s.false_hit(peer);
                            }
                        }
                        if spec.role == Role::Sibling
                            && response.status() == StatusCode::GATEWAY_TIMEOUT
                            && !last
                        {
                            // only-if-cached: the sibling no longer has it.
                            continue;
                        }
                        return Ok(Forwarded {
                            response,
                            lease,
                            hier: code,
                            timed_out: route.timed_out,
                            proxy_only: spec.proxy_only,
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::info!(peer = %spec.name, error = %e, "peer failed; trying the next hop");
                        shared.coop.fetch_result(peer, false);
                        last_error = Some(e);
                    }
                    Err(_) => {
                        tracing::warn!(peer = %spec.name, "peer stalled; trying the next hop");
                        shared.coop.fetch_result(peer, false);
                        last_error = Some(UpstreamError::ReadTimeout {
                            host: spec.name.clone(),
                        });
                    }
                }
            }
        }
        if last {
            break;
        }
    }
    if target.directness == Directness::Never {
        // Every peer failed, and the origin is not an option: 503, as for no peer at all.
        if let Some(e) = last_error {
            tracing::info!(url = %target.url, error = %e, "never_direct: every peer failed");
        }
        return Err(UpstreamError::NoRoute {
            host: target.host.clone(),
        });
    }
    Err(last_error.unwrap_or_else(|| UpstreamError::ReadTimeout {
        host: target.host.clone(),
    }))
}

/// A request to a peer: absolute-form, our Via, and `only-if-cached` for a sibling.
fn peer_request(
    shared: &Shared,
    peer: PeerId,
    method: &Method,
    headers: &HeaderMap,
    target: &Target,
    sibling: bool,
    body: UpBody,
) -> Request<UpBody> {
    let mut req = crate::target::upstream_request(shared, method.clone(), headers, target, body);
    *req.uri_mut() = target.url.parse().unwrap_or_else(|_| Uri::from_static("/"));
    *req.version_mut() = Version::HTTP_11;
    if sibling {
        req.headers_mut().append(
            header::CACHE_CONTROL,
            HeaderValue::from_static("only-if-cached"),
        );
    }
    if let Some(credentials) = passed_credentials(shared, peer, headers) {
        req.headers_mut()
            .insert(header::PROXY_AUTHORIZATION, credentials.clone());
    }
    req
}

/// The client's `Proxy-Authorization`, when `peer` is configured with `login = "pass"`.
pub(crate) fn passed_credentials<'h>(
    shared: &Shared,
    peer: PeerId,
    headers: &'h HeaderMap,
) -> Option<&'h HeaderValue> {
    let login = shared.config.peers.get(peer.0).and_then(|p| p.login);
    match login {
        Some(crate::config::PeerLogin::Pass) => headers.get(header::PROXY_AUTHORIZATION),
        None => None,
    }
}

/// Whether `ip` may query us without being a peer.
pub fn icp_allowed(allow: &[IpNet], ip: IpAddr) -> bool {
    allow.iter().any(|n| n.contains(&ip))
}

impl Coop {
    /// Sends one ICP query for `url` to each peer, all with `reqnum`.
    async fn send_queries(&self, reqnum: u32, url: &str, to: &[(PeerId, SocketAddr)]) {
        let Some(socket) = self.icp.get() else { return };
        let mut datagram = Vec::with_capacity(64 + url.len());
        if let Err(e) = icp::encode(&icp::Message::query(reqnum, url.as_bytes()), &mut datagram) {
            tracing::debug!(%url, error = %e, "URL cannot be sent by ICP");
            return;
        }
        for (_, addr) in to {
            match socket.send_to(&datagram, addr).await {
                Ok(_) => {
                    self.counters.queries_sent.fetch_add(1, Relaxed);
                    self.counters
                        .bytes_sent
                        .fetch_add(datagram.len() as u64, Relaxed);
                }
                Err(e) => tracing::debug!(%addr, error = %e, "ICP send failed"),
            }
        }
    }
}

/// The UDP side of ICP: answers queries from the store, feeds replies to searches.
pub(crate) async fn run_icp(
    shared: Arc<Shared>,
    socket: Arc<UdpSocket>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::with_capacity(1024);
    let efficiency = &shared.metrics.efficiency;
    loop {
        tokio::select! {
            r = socket.readable() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "ICP socket failed");
                    continue;
                }
            }
            _ = stop.changed() => return,
        }
        // Timed from the receive to the reply sent: our searches' replies are search work,
        // everything else (queries, junk) is work for other nodes.
        let start = Instant::now();
        let (len, from) = match socket.try_recv_from(&mut buf) {
            Ok(x) => {
                shared
                    .coop
                    .counters
                    .bytes_received
                    .fetch_add(x.0 as u64, Relaxed);
                x
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::debug!(error = %e, "ICP receive failed");
                continue;
            }
        };
        if buf
            .first()
            .is_some_and(|&op| meshcache_wire::directory::is_directory_opcode(op))
        {
            shared
                .coop
                .counters
                .directory_received
                .fetch_add(1, Relaxed);
            let sends = crate::directory::on_datagram(&shared, &buf[..len], from);
            if !sends.is_empty() {
                crate::directory::send(&shared, sends).await;
            }
            efficiency.add(Category::Peer, start.elapsed());
            continue;
        }
        out.clear();
        let (reply_to, category) = handle_datagram(&shared, &buf[..len], from, &mut out);
        if let Some(reply_to) = reply_to {
            if socket.send_to(&out, reply_to).await.is_ok() {
                shared.coop.counters.replies_sent.fetch_add(1, Relaxed);
                shared
                    .coop
                    .counters
                    .bytes_sent
                    .fetch_add(out.len() as u64, Relaxed);
            }
        }
        efficiency.add(category, start.elapsed());
    }
}

/// Handles one datagram; returns where to send `out` when it holds a reply, and what kind of
/// work it was (a reply to our search, or anything else: work for others).
fn handle_datagram(
    shared: &Shared,
    datagram: &[u8],
    from: SocketAddr,
    out: &mut Vec<u8>,
) -> (Option<SocketAddr>, Category) {
    if datagram
        .first()
        .is_some_and(|&op| meshcache_wire::directory::is_directory_opcode(op))
    {
        // Handled by the caller (it may send several datagrams).
        return (None, Category::Peer);
    }
    if datagram.first() == Some(&meshcache_wire::summary::OPCODE_DIRUPDATE) {
        // Summary upkeep serves our own searches.
        crate::summary::on_update_datagram(&shared.coop, datagram, from);
        return (None, Category::Search);
    }
    let opcode = datagram.first().and_then(|&b| icp::Opcode::from_u8(b));
    let category = match opcode {
        Some(icp::Opcode::Query | icp::Opcode::Secho | icp::Opcode::HitObj) | None => {
            Category::Peer
        }
        Some(_) => Category::Search,
    };
    (respond(shared, datagram, from, out), category)
}

/// Decodes and handles one datagram; returns where to send `out` when it holds a reply.
fn respond(
    shared: &Shared,
    datagram: &[u8],
    from: SocketAddr,
    out: &mut Vec<u8>,
) -> Option<SocketAddr> {
    let coop = &shared.coop;
    let message = match icp::decode(datagram) {
        Ok(m) => m,
        Err(e) => {
            coop.counters.dropped.fetch_add(1, Relaxed);
            tracing::debug!(%from, error = %e, "bad ICP datagram");
            // Squid answers a malformed query with ICP_OP_ERR; everything else is dropped.
            let err = e.err_reply()?;
            icp::encode(&err, out).ok()?;
            return Some(from);
        }
    };
    match message.opcode {
        icp::Opcode::Query => {
            coop.counters.queries_received.fetch_add(1, Relaxed);
            if meshcache_wire::multicast::is_multicast_query(&message) {
                // Hits only: a miss, a stranger or a malformed URL get silence.
                return crate::multicast::answer(shared, &message, from, out);
            }
            let requester = match &message.payload {
                icp::Payload::Query { requester, .. } => *requester,
                _ => std::net::Ipv4Addr::UNSPECIFIED,
            };
            // A forwarded directory query is answered at the member it names.
            let reply_to = crate::directory::reply_address(
                shared,
                from,
                message.options,
                message.option_data,
                requester,
            )?;
            let child = icp_allowed(&coop.config.icp_allow, reply_to.ip());
            let asker = coop.mesh.lock().on_query(reply_to, child);
            let url = message
                .url_str()
                .filter(|u| !u.contains(char::is_whitespace));
            let holding =
                if url.is_some_and(|u| shared.cache.fresh_for(u, coop.config.icp_hit_min_fresh)) {
                    meshcache_dcm::Holding::Fresh
                } else {
                    meshcache_dcm::Holding::Nothing
                };
            let kind = if url.is_none() {
                ReplyKind::Err
            } else {
                meshcache_dcm::answer(asker, holding)
            };
            if kind == ReplyKind::Denied {
                let n = coop.counters.denied.fetch_add(1, Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(%from, denied = n, "ICP query from a source that is not a peer");
                }
            }
            let opcode = match kind {
                ReplyKind::Hit => icp::Opcode::Hit,
                ReplyKind::Miss => icp::Opcode::Miss,
                ReplyKind::MissNoFetch => icp::Opcode::MissNoFetch,
                ReplyKind::Denied => icp::Opcode::Denied,
                ReplyKind::Err => icp::Opcode::Err,
            };
            icp::encode(&icp::Message::reply(opcode, &message).ok()?, out).ok()?;
            Some(reply_to)
        }
        op => {
            let kind = match op {
                icp::Opcode::Hit => ReplyKind::Hit,
                icp::Opcode::Miss | icp::Opcode::Decho => ReplyKind::Miss,
                icp::Opcode::MissNoFetch => ReplyKind::MissNoFetch,
                icp::Opcode::Denied => ReplyKind::Denied,
                icp::Opcode::Err => ReplyKind::Err,
                _ => {
                    coop.counters.dropped.fetch_add(1, Relaxed);
                    return None;
                }
            };
            coop.counters.replies_received.fetch_add(1, Relaxed);
            let url = message.url_str()?;
            let reply = Reply {
                kind,
                reqnum: message.reqnum,
                url,
                src_rtt_ms: message.src_rtt().map(|r| r.rtt_ms),
            };
            if let (Some(s), ReplyKind::Miss | ReplyKind::MissNoFetch) = (&coop.summaries, kind) {
                // Summary Cache asks only peers whose summary said hit: a miss is a false hit.
                if let Some(peer) = coop.peer_at(from) {
                    s.false_hit(peer);
                }
            }
            let decided = {
                let now = Instant::now();
                let mut mesh = coop.mesh.lock();
                let mine = coop
                    .directory
                    .as_ref()
                    .and_then(|d| d.dir.lock().on_reply(now, &mut mesh, from, reply))
                    .or_else(|| {
                        coop.multicast
                            .as_ref()
                            .and_then(|m| m.dcm.lock().on_reply(now, &mut mesh, from, reply))
                    });
                match mine {
                    Some(route) => route.map(|r| (reply.reqnum, r)),
                    None => mesh.on_reply(now, from, reply),
                }
            };
            if let Some((reqnum, route)) = decided {
                if let Some(tx) = coop.waiters.lock().remove(&reqnum) {
                    let _ = tx.send(route);
                }
            }
            None
        }
    }
}
