//! The bottom of the cooperation driver: the node's engine (its peer table and protocol), its
//! ICP socket, the requesters waiting for a search, and the counters. Everything above — the
//! search (`mod.rs`), the UDP side (`icp.rs`), each protocol's upkeep (`summary.rs`,
//! `directory.rs`, `multicast.rs`) — reaches sockets and machines through a [`Link`], and
//! nothing here knows a protocol.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ipnet::IpNet;
use meshcache_dcm::engine::{Engine, Progress, SearchProtocol};
use meshcache_dcm::{IcpMesh, PeerId, Route};
use meshcache_wire::icp;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

use crate::config::CooperationConfig;

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

/// The engine, the socket and the waiters of a node.
pub struct Link {
    /// The peer table and the protocol's search.
    engine: Mutex<Engine>,
    icp: OnceLock<Arc<UdpSocket>>,
    /// The requesters waiting for a search, by the request number of its current step.
    waiters: Mutex<HashMap<u32, oneshot::Sender<Progress>>>,
    config: CooperationConfig,
    /// Counters.
    pub counters: IcpCounters,
}

impl Link {
    /// A link around `engine`, with no socket yet.
    pub(super) fn new(engine: Engine, config: CooperationConfig) -> Link {
        Link {
            engine: Mutex::new(engine),
            icp: OnceLock::new(),
            waiters: Mutex::new(HashMap::new()),
            config,
            counters: IcpCounters::default(),
        }
    }

    /// The engine, locked.
    pub(super) fn engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock()
    }

    /// The peer table.
    pub(crate) fn mesh(&self) -> MappedMutexGuard<'_, IcpMesh> {
        MutexGuard::map(self.engine.lock(), Engine::mesh_mut)
    }

    /// Runs `f` on the peer table and the protocol, when the protocol is a `P` (its upkeep:
    /// the directory's messages, a multicast query to answer).
    pub(crate) fn with_protocol<P: SearchProtocol, R>(
        &self,
        f: impl FnOnce(&mut IcpMesh, &mut P) -> R,
    ) -> Option<R> {
        let mut engine = self.engine.lock();
        let (mesh, protocol) = engine.parts_mut::<P>()?;
        Some(f(mesh, protocol))
    }

    /// Attaches the bound ICP socket (once).
    pub fn attach(&self, socket: Arc<UdpSocket>) {
        let _ = self.icp.set(socket);
    }

    /// The ICP socket, once attached.
    pub(crate) fn icp_socket(&self) -> Option<&Arc<UdpSocket>> {
        self.icp.get()
    }

    /// The ICP socket's address, when ICP is on.
    pub fn icp_addr(&self) -> Option<SocketAddr> {
        self.icp.get().and_then(|s| s.local_addr().ok())
    }

    /// The cooperation settings.
    pub(crate) fn config(&self) -> &CooperationConfig {
        &self.config
    }

    /// Who is asking, for a query that arrives from (or is answered at) `addr`.
    pub(crate) fn mesh_on_query(&self, addr: SocketAddr) -> meshcache_dcm::Asker {
        let child = icp_allowed(&self.config.icp_allow, addr.ip());
        self.mesh().on_query(addr, child)
    }

    /// The peer whose ICP address is `addr`.
    pub fn peer_at(&self, addr: SocketAddr) -> Option<PeerId> {
        self.mesh().peer_at(addr)
    }

    /// The peer at ICP address `addr` sent us something: it is alive.
    pub(crate) fn heard_from_addr(&self, addr: SocketAddr) {
        let mut mesh = self.mesh();
        if let Some(id) = mesh.peer_at(addr) {
            mesh.heard_from(Instant::now(), id);
        }
    }

    /// `peer` sent a summary update: its ICP side is alive.
    pub(crate) fn heard_from(&self, peer: PeerId) {
        self.mesh().heard_from(Instant::now(), peer);
    }

    /// Registers the requester of search `reqnum`: what moves the search on reaches it.
    pub(super) fn wait(&self, reqnum: u32) -> oneshot::Receiver<Progress> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(reqnum, tx);
        rx
    }

    /// The requester of search `reqnum` went away: nothing of the search is kept.
    pub(super) fn forget(&self, reqnum: u32) {
        self.waiters.lock().remove(&reqnum);
        self.engine.lock().abandon(reqnum);
    }

    /// A search was decided outside a reply (a directory answer): wake its requester.
    pub(crate) fn decided(&self, reqnum: u32, route: Route) {
        self.moved(reqnum, Progress::Decided(route));
    }

    /// Search `reqnum` moved on (a reply, a directory answer): its requester takes it from
    /// there. A next step nobody waits for any more is dropped.
    pub(super) fn moved(&self, reqnum: u32, progress: Progress) {
        let waiter = self.waiters.lock().remove(&reqnum);
        match (waiter, progress) {
            (Some(tx), progress) => {
                if let Err(Progress::Next(step)) = tx.send(progress) {
                    self.engine.lock().abandon(step.reqnum);
                }
            }
            (None, Progress::Next(step)) => self.engine.lock().abandon(step.reqnum),
            (None, Progress::Decided(_)) => {}
        }
    }

    /// Sends one ICP query for `url`, search `reqnum`, to each of `to`.
    pub(super) async fn send_queries(&self, reqnum: u32, url: &str, to: &[SocketAddr]) {
        let Some(socket) = self.icp.get() else { return };
        let mut datagram = Vec::with_capacity(64 + url.len());
        if let Err(e) = icp::encode(&icp::Message::query(reqnum, url.as_bytes()), &mut datagram) {
            tracing::debug!(%url, error = %e, "URL cannot be sent by ICP");
            return;
        }
        for addr in to {
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

/// Whether `ip` may query us without being a peer.
pub fn icp_allowed(allow: &[IpNet], ip: IpAddr) -> bool {
    allow.iter().any(|n| n.contains(&ip))
}
