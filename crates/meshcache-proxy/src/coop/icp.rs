//! The UDP side of cooperation: answers peers' ICP queries from the store, feeds replies to
//! the engine, and hands the protocols' own datagrams (directory messages, summary updates,
//! multicast queries) to their modules.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use meshcache_dcm::{Reply, ReplyKind};
use meshcache_wire::icp;
use tokio::net::UdpSocket;

use super::host::Host;
use super::link::{icp_allowed, Link};
use super::upkeep::Upkeep;
use crate::cache::Cache;
use crate::efficiency::Category;

/// The UDP side of ICP: answers queries from the store, feeds replies to searches.
pub(crate) async fn run_icp<H: Host>(
    host: Arc<H>,
    upkeep: Arc<Upkeep>,
    socket: Arc<UdpSocket>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::with_capacity(1024);
    let efficiency = host.efficiency();
    let link = host.link();
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
                link.counters.bytes_received.fetch_add(x.0 as u64, Relaxed);
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
            link.counters.directory_received.fetch_add(1, Relaxed);
            let directory = upkeep.directory.as_deref();
            let sends = super::directory::on_datagram(link, directory, &buf[..len], from);
            if let (Some(d), false) = (directory, sends.is_empty()) {
                super::directory::send(&*host, d, sends).await;
            }
            efficiency.add(Category::Peer, start.elapsed());
            continue;
        }
        out.clear();
        let (reply_to, category) =
            handle_datagram(link, host.cache(), &upkeep, &buf[..len], from, &mut out);
        if let Some(reply_to) = reply_to {
            if socket.send_to(&out, reply_to).await.is_ok() {
                link.counters.replies_sent.fetch_add(1, Relaxed);
                link.counters
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
    coop: &Link,
    cache: &Cache,
    upkeep: &Upkeep,
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
        super::summary::on_update_datagram(coop, upkeep.summaries.as_deref(), datagram, from);
        return (None, Category::Search);
    }
    let opcode = datagram.first().and_then(|&b| icp::Opcode::from_u8(b));
    let category = match opcode {
        Some(icp::Opcode::Query | icp::Opcode::Secho | icp::Opcode::HitObj) | None => {
            Category::Peer
        }
        Some(_) => Category::Search,
    };
    (respond(coop, cache, upkeep, datagram, from, out), category)
}

/// Decodes and handles one datagram; returns where to send `out` when it holds a reply.
fn respond(
    coop: &Link,
    cache: &Cache,
    upkeep: &Upkeep,
    datagram: &[u8],
    from: SocketAddr,
    out: &mut Vec<u8>,
) -> Option<SocketAddr> {
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
                return super::multicast::answer(coop, cache, &message, from, out);
            }
            let requester = match &message.payload {
                icp::Payload::Query { requester, .. } => *requester,
                _ => std::net::Ipv4Addr::UNSPECIFIED,
            };
            // A forwarded directory query is answered at the member it names.
            let reply_to = super::directory::reply_address(
                coop,
                from,
                message.options,
                message.option_data,
                requester,
            )?;
            let child = icp_allowed(&coop.config().icp_allow, reply_to.ip());
            let asker = coop.mesh().on_query(reply_to, child);
            let url = message
                .url_str()
                .filter(|u| !u.contains(char::is_whitespace));
            let holding =
                if url.is_some_and(|u| cache.fresh_for(u, coop.config().icp_hit_min_fresh)) {
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
            if let (Some(s), ReplyKind::Miss | ReplyKind::MissNoFetch) = (&upkeep.summaries, kind) {
                // Summary Cache asks only peers whose summary said hit: a miss is a false hit.
                if let Some(peer) = coop.peer_at(from) {
                    s.false_hit(peer);
                }
            }
            let moved = coop.engine().on_reply(Instant::now(), from, reply);
            if let Some((reqnum, progress)) = moved {
                coop.moved(reqnum, progress);
            }
            None
        }
    }
}
