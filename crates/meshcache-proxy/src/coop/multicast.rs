//! The multicast search's driver: runs `meshcache_dcm::multicast` with real sockets.
//!
//! **Sockets.** Queries go out of the ordinary ICP socket, so that the holders' `ICP_OP_HIT`
//! replies come back to it like any ICP reply; that socket is set to send multicast on the
//! loopback interface (`IP_MULTICAST_IF` 127.0.0.1, loop on, TTL `multicast_ttl`). A second
//! UDP socket is bound to the group's address and port (`SO_REUSEADDR`, so that every node on
//! the host can bind it) and joined to the group on loopback: the queries of the other members
//! arrive there (`run_group`), and are answered from the ICP socket.
//!
//! **Mode.** At start ([`bind`]) the node sends a probe to the group and waits up to
//! [`PROBE_WAIT`] to see it arrive on its own group socket. If it does, and every member's
//! ICP address is on loopback, queries go to the group: one datagram per search (`ip` mode).
//! Otherwise — the kernel drops group traffic on loopback, the group socket cannot be joined,
//! a member lives on another host, or `multicast_mode = "logical"` — each query is unicast to
//! every member's ICP address (`logical` mode, the paper's "logical multicast"). The group
//! socket is kept whenever it could be joined, so a node still hears members that do use the
//! group. The mode is logged once and shown in `/stats` (`multicast.mode`). Nothing here needs
//! privileges.
//!
//! **Answering.** A query with the `MULTICAST_QUERY` flag (by the group, or unicast in logical
//! mode) from a member is answered `ICP_OP_HIT` when the store holds a fresh copy, and not at
//! all otherwise; queries from non-members are dropped and counted. Our own queries, looped
//! back by the kernel to our group socket, and other nodes' probes are ignored uncounted.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshcache_dcm::multicast::{Answer, Destination, Mode, Multicast, MulticastConfig};
use meshcache_dcm::{Holding, IcpMesh};
use meshcache_wire::icp;
use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use super::host::Host;
use super::link::Link;
use crate::cache::Cache;
use crate::config::{Config, MulticastMode, Protocol};
use crate::efficiency::Category;
use crate::proxy_error::ProxyError;

/// How long the start-up probe waits to see its own datagram come back through the group.
pub const PROBE_WAIT: Duration = Duration::from_millis(200);

/// The first bytes of a probe datagram (then a nonce). Not an ICP opcode: receivers that do
/// not recognise it drop it as junk.
const PROBE_MAGIC: &[u8] = b"meshcache-multicast-probe ";

/// The group socket of a node, and what the start-up probe found.
pub struct GroupSocket {
    /// Bound to the group's address and port and joined to it on loopback; `None` when that
    /// failed.
    pub socket: Option<UdpSocket>,
    /// The probe came back: the kernel delivers the group's traffic on loopback.
    pub delivers: bool,
    /// Why IP multicast is not available, when it is not.
    pub why_not: Option<String>,
}

/// The multicast sockets' state of a node (the state machine is the engine's protocol).
pub struct MulticastState {
    group: SocketAddrV4,
    /// Why IP multicast is not used, when it is not.
    why_logical: Mutex<Option<String>>,
    /// Query datagrams actually sent (1 a search in IP mode, one per member in logical mode).
    queries_sent: AtomicU64,
}

impl MulticastState {
    /// The state of a node configured with `protocol = "multicast"`. It sends in logical mode
    /// until `start` has seen what the start-up probe found.
    pub fn new(config: &Config) -> Option<MulticastState> {
        let c = &config.cooperation;
        (c.protocol == Protocol::Multicast).then(|| MulticastState {
            group: c.multicast_group,
            why_logical: Mutex::new(Some("not started".into())),
            queries_sent: AtomicU64::new(0),
        })
    }

    /// How queries are sent now.
    #[cfg(test)]
    pub fn mode(coop: &Link) -> Option<Mode> {
        coop.with_protocol(|_, m: &mut Multicast| m.mode())
    }

    /// `/stats`: mode, group, the state machine's counters, datagrams sent, searches in flight
    /// and the wait a search for every member would have now.
    pub(crate) fn report(&self, coop: &Link) -> serde_json::Value {
        coop.with_protocol(|mesh, d: &mut Multicast| self.report_of(mesh, d))
            .unwrap_or_default()
    }

    fn report_of(&self, mesh: &IcpMesh, d: &Multicast) -> serde_json::Value {
        let mut v = serde_json::to_value(d.stats()).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("mode".into(), d.mode().as_str().into());
            o.insert("group".into(), self.group.to_string().into());
            if let Some(why) = self.why_logical.lock().as_ref() {
                o.insert("why_logical".into(), why.clone().into());
            }
            o.insert(
                "queries_sent".into(),
                self.queries_sent.load(Relaxed).into(),
            );
            o.insert("in_flight".into(), d.in_flight().into());
            let members: Vec<_> = (0..mesh.peers().len())
                .map(meshcache_dcm::PeerId)
                .filter(|id| mesh.peers()[id.0].spec.queried())
                .collect();
            let wait = d.wait_for(mesh.peers(), &members);
            o.insert("wait_ms".into(), (wait.as_secs_f64() * 1000.0).into());
        }
        v
    }
}

/// The multicast machine of a node configured with `protocol = "multicast"`: logical mode
/// until [`start`] has seen what the start-up probe found.
pub(crate) fn machine(config: &Config) -> Multicast {
    let c = &config.cooperation;
    Multicast::new(
        MulticastConfig {
            timeout_floor: c.multicast_timeout_floor,
            timeout_ceiling: c.icp_timeout_ceiling,
        },
        Mode::Logical,
    )
}

/// Prepares the ICP socket `icp` for sending to the group and binds the group socket, then
/// probes whether the kernel delivers group traffic on loopback. Nothing to do unless the
/// protocol is `multicast`. With `multicast_mode = "ip"`, a failure is an error.
pub fn bind(config: &Config, icp: &std::net::UdpSocket) -> Result<Option<GroupSocket>, ProxyError> {
    let c = &config.cooperation;
    if c.protocol != Protocol::Multicast {
        return Ok(None);
    }
    let group = c.multicast_group;
    let mut delivers = false;
    let mut why_not = None;
    let sender = socket2::SockRef::from(icp);
    let prepared = sender
        .set_multicast_if_v4(&Ipv4Addr::LOCALHOST)
        .and_then(|()| sender.set_multicast_loop_v4(true))
        .and_then(|()| sender.set_multicast_ttl_v4(c.multicast_ttl));
    let joined = match (prepared, join(group)) {
        (Err(e), joined) => {
            why_not = Some(format!("cannot send to the group on loopback: {e}"));
            joined.ok()
        }
        (Ok(()), Err(e)) => {
            why_not = Some(format!("cannot join the group on loopback: {e}"));
            None
        }
        (Ok(()), Ok(socket)) => {
            if c.multicast_mode != MulticastMode::Logical {
                delivers = probe(icp, &socket, group);
                if !delivers {
                    why_not = Some(format!(
                        "the kernel did not deliver a probe to the group within {} ms (does lo have the MULTICAST flag?)",
                        PROBE_WAIT.as_millis()
                    ));
                }
            }
            Some(socket)
        }
    };
    if c.multicast_mode == MulticastMode::Ip && !delivers {
        return Err(ProxyError::Multicast {
            group,
            reason: why_not.unwrap_or_else(|| "IP multicast unavailable".into()),
        });
    }
    let socket = match joined.map(|s| {
        s.set_read_timeout(None)
            .and_then(|()| s.set_nonblocking(true))
            .and_then(|()| UdpSocket::from_std(s))
    }) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            delivers = false;
            why_not = Some(format!("cannot use the group socket: {e}"));
            None
        }
        None => None,
    };
    Ok(Some(GroupSocket {
        socket,
        delivers,
        why_not,
    }))
}

/// A UDP socket bound to `group`'s address and port, joined to it on loopback.
fn join(group: SocketAddrV4) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // Every node on the host binds the same group and port; each gets its own copy.
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::V4(group).into())?;
    socket.join_multicast_v4(group.ip(), &Ipv4Addr::LOCALHOST)?;
    Ok(socket.into())
}

/// Sends a probe from `icp` to the group and waits up to [`PROBE_WAIT`] for it on `listen`.
fn probe(icp: &std::net::UdpSocket, listen: &std::net::UdpSocket, group: SocketAddrV4) -> bool {
    let nonce = format!(
        "{}:{}:{}",
        std::process::id(),
        icp.local_addr().map(|a| a.port()).unwrap_or(0),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut datagram = PROBE_MAGIC.to_vec();
    datagram.extend_from_slice(nonce.as_bytes());
    if icp.send_to(&datagram, SocketAddr::V4(group)).is_err() {
        return false;
    }
    let until = Instant::now() + PROBE_WAIT;
    let mut buf = vec![0u8; 2048];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || listen.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match listen.recv_from(&mut buf) {
            Ok((n, _)) if buf[..n] == datagram[..] => return true,
            // Another node's probe or query: not ours.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Settles the mode once the sockets are known: IP multicast when the probe came back and
/// every member is on loopback (or the config insists), logical multicast otherwise. Logs it.
pub(crate) fn start(coop: &Link, m: &MulticastState, config: &Config, group: Option<&GroupSocket>) {
    let c = &config.cooperation;
    let delivers = group.is_some_and(|g| g.delivers);
    let far: Option<&str> = config
        .peers
        .iter()
        .find(|p| p.icp.is_some_and(|a| !a.ip().is_loopback()))
        .map(|p| p.name.as_str());
    let why_logical: Option<String> = match (c.multicast_mode, delivers, far) {
        (MulticastMode::Logical, _, _) => Some("multicast_mode = \"logical\"".into()),
        (_, false, _) => Some(
            group
                .and_then(|g| g.why_not.clone())
                .unwrap_or_else(|| "IP multicast unavailable".into()),
        ),
        (_, true, Some(name)) => Some(format!(
            "peer {name:?} is not on loopback, where the group is joined"
        )),
        (_, true, None) => None,
    };
    let mode = if why_logical.is_some() {
        Mode::Logical
    } else {
        Mode::Ip
    };
    coop.with_protocol(|_, d: &mut Multicast| d.set_mode(mode));
    match &why_logical {
        None => tracing::info!(
            group = %m.group,
            mode = mode.as_str(),
            "multicast search: one query to the group per miss"
        ),
        Some(why) => tracing::info!(
            group = %m.group,
            mode = mode.as_str(),
            reason = %why,
            "multicast search: each query unicast to every member"
        ),
    }
    *m.why_logical.lock() = why_logical;
}

/// Sends search `reqnum`'s query for `url` from the ICP socket to each destination.
pub(crate) async fn send_queries(
    link: &Link,
    m: &MulticastState,
    reqnum: u32,
    url: &str,
    to: &[Destination],
) {
    let coop = link;
    let Some(socket) = coop.icp_socket() else {
        return;
    };
    let datagram = match meshcache_wire::multicast::query(reqnum, url.as_bytes()).to_bytes() {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(%url, error = %e, "URL cannot be sent by ICP");
            return;
        }
    };
    for d in to {
        let addr = match *d {
            Destination::Group => SocketAddr::V4(m.group),
            Destination::Peer { addr, .. } => addr,
        };
        match socket.send_to(&datagram, addr).await {
            Ok(_) => {
                // One IP multicast datagram is one message, however many members receive it.
                m.queries_sent.fetch_add(1, Relaxed);
                coop.counters.queries_sent.fetch_add(1, Relaxed);
                coop.counters
                    .bytes_sent
                    .fetch_add(datagram.len() as u64, Relaxed);
            }
            Err(e) => tracing::debug!(%addr, error = %e, "multicast query send failed"),
        }
    }
}

/// Our answer to a multicast `query` from `from` (by the group, or unicast with the flag):
/// where to send `out` when it holds a HIT; `None` for silence.
pub(crate) fn answer(
    coop: &Link,
    cache: &Cache,
    query: &icp::Message,
    from: SocketAddr,
    out: &mut Vec<u8>,
) -> Option<SocketAddr> {
    // A malformed URL gets no ICP_OP_ERR either: the sender asked for hits only.
    let url = query
        .url_str()
        .filter(|u| !u.is_empty() && !u.contains(char::is_whitespace))?;
    let holding = if cache.fresh_for(url, coop.config().icp_hit_min_fresh) {
        Holding::Fresh
    } else {
        Holding::Nothing
    };
    let answered = coop.with_protocol(|mesh, d: &mut Multicast| {
        (d.on_query(mesh, from, holding), d.stats().foreign_dropped)
    });
    let hit = match answered {
        Some((verdict, dropped)) => {
            if verdict == Answer::Foreign && dropped.is_power_of_two() {
                tracing::warn!(%from, dropped, "multicast query from a non-member, dropped");
            }
            verdict == Answer::Hit
        }
        // Not running the multicast search ourselves, but the flag still asks for silence on
        // a miss; who may be answered is ICP's rule.
        None => {
            let asker = coop.mesh_on_query(from);
            meshcache_dcm::answer(asker, holding) == meshcache_dcm::ReplyKind::Hit
        }
    };
    if !hit {
        return None;
    }
    icp::encode(&icp::Message::reply(icp::Opcode::Hit, query).ok()?, out).ok()?;
    Some(from)
}

/// Whether a datagram from `from` is our own, looped back by the kernel: sent from our ICP
/// socket at `own`.
fn is_own(from: SocketAddr, own: Option<SocketAddr>) -> bool {
    match own {
        Some(own) if own.ip().is_unspecified() => {
            from.port() == own.port() && from.ip() == std::net::IpAddr::V4(Ipv4Addr::LOCALHOST)
        }
        Some(own) => from == own,
        None => false,
    }
}

/// The group side: receives the members' queries and answers the hits from the ICP socket.
pub(crate) async fn run_group<H: Host>(
    host: Arc<H>,
    socket: Arc<UdpSocket>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; icp::MAX_DATAGRAM + 1];
    let mut out = Vec::with_capacity(1024);
    let coop = host.link();
    let own = coop.icp_addr();
    loop {
        tokio::select! {
            r = socket.readable() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "multicast group socket failed");
                    continue;
                }
            }
            _ = stop.changed() => return,
        }
        let start = Instant::now();
        let (len, from) = match socket.try_recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::debug!(error = %e, "multicast receive failed");
                continue;
            }
        };
        let datagram = &buf[..len];
        if datagram.starts_with(PROBE_MAGIC) || is_own(from, own) {
            continue;
        }
        coop.counters.bytes_received.fetch_add(len as u64, Relaxed);
        let query = match icp::decode(datagram) {
            Ok(m) if m.opcode == icp::Opcode::Query => m,
            _ => {
                // Nothing but queries belongs on the group; never answered (not even ERR).
                coop.counters.dropped.fetch_add(1, Relaxed);
                continue;
            }
        };
        coop.counters.queries_received.fetch_add(1, Relaxed);
        out.clear();
        if let Some(to) = answer(coop, host.cache(), &query, from, &mut out) {
            if let Some(icp_socket) = coop.icp_socket() {
                if icp_socket.send_to(&out, to).await.is_ok() {
                    coop.counters.replies_sent.fetch_add(1, Relaxed);
                    coop.counters
                        .bytes_sent
                        .fetch_add(out.len() as u64, Relaxed);
                }
            }
        }
        host.efficiency().add(Category::Peer, start.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coop::Coop;

    #[test]
    fn own_datagrams_are_recognised() {
        let own: SocketAddr = "127.0.0.5:3130".parse().expect("addr");
        assert!(is_own(own, Some(own)));
        assert!(!is_own("127.0.0.6:3130".parse().expect("addr"), Some(own)));
        let any: SocketAddr = "0.0.0.0:3130".parse().expect("addr");
        assert!(is_own("127.0.0.1:3130".parse().expect("addr"), Some(any)));
        assert!(!is_own("127.0.0.1:3131".parse().expect("addr"), Some(any)));
        assert!(!is_own(own, None));
    }

    fn node(peer_icp: &str, mode: MulticastMode) -> Config {
        let mut config = Config::default();
        config.cooperation.protocol = Protocol::Multicast;
        config.cooperation.multicast_mode = mode;
        let icp: SocketAddr = peer_icp.parse().expect("addr");
        config.peers = vec![crate::config::PeerConfig::new(
            "s",
            meshcache_dcm::Role::Sibling,
            SocketAddr::new(icp.ip(), 3128),
            Some(icp),
        )];
        config
    }

    fn mode_after(config: &Config, delivers: bool) -> (Mode, Option<String>) {
        let coop = Coop::new(config);
        let found = GroupSocket {
            socket: None,
            delivers,
            why_not: (!delivers).then(|| "probe lost".to_owned()),
        };
        start(
            &coop,
            coop.multicast().expect("multicast"),
            config,
            Some(&found),
        );
        let m = coop.multicast().expect("multicast");
        let why = m.why_logical.lock().clone();
        (
            MulticastState::mode(&coop).expect("a multicast machine"),
            why,
        )
    }

    #[test]
    fn the_mode_follows_the_probe_the_members_and_the_config() {
        let near = node("127.0.0.2:3130", MulticastMode::Auto);
        assert_eq!(mode_after(&near, true), (Mode::Ip, None));
        assert_eq!(
            mode_after(&near, false),
            (Mode::Logical, Some("probe lost".into()))
        );
        let far = node("10.0.0.2:3130", MulticastMode::Auto);
        let (mode, why) = mode_after(&far, true);
        assert_eq!(mode, Mode::Logical);
        assert!(why.is_some_and(|w| w.contains("not on loopback")));
        let logical = node("127.0.0.2:3130", MulticastMode::Logical);
        assert_eq!(mode_after(&logical, true).0, Mode::Logical);
        // Before start, nothing is assumed about the group.
        let coop = Coop::new(&near);
        assert_eq!(MulticastState::mode(&coop), Some(Mode::Logical));
    }

    #[tokio::test]
    async fn binding_reports_a_mode_whatever_the_kernel_allows() {
        let mut config = Config::default();
        config.cooperation.protocol = Protocol::Multicast;
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port();
        config.cooperation.multicast_group =
            SocketAddrV4::new(Ipv4Addr::new(239, 255, 77, 1), port);
        let icp = std::net::UdpSocket::bind("127.0.0.1:0").expect("icp");
        let found = bind(&config, &icp)
            .expect("auto never fails")
            .expect("multicast");
        assert_eq!(
            found.delivers,
            found.why_not.is_none(),
            "{:?}",
            found.why_not
        );
        // Logical by request: no probe, whatever the kernel does.
        config.cooperation.multicast_mode = MulticastMode::Logical;
        let found = bind(&config, &icp)
            .expect("logical never fails")
            .expect("multicast");
        assert!(!found.delivers);
        // Another protocol: nothing.
        config.cooperation.protocol = Protocol::Icp;
        assert!(bind(&config, &icp).expect("no-op").is_none());
    }
}
