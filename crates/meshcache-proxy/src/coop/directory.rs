//! The directory protocol's driver: runs `meshcache_dcm::directory` with the ICP socket.
//!
//! Searches start in `Coop::route` (`mod.rs`); this module sends what the state machine
//! asks for (`DIR_GET`, `DIR_DATA`, candidate queries, batched `DIR_ADD` / `DIR_DEL`), takes
//! the directory datagrams that arrive on the ICP socket, and follows the store's events so
//! that the owners of our objects' entries hear of every admission and eviction.
//!
//! A forwarded query (search variant 2) is an ordinary ICP query with the
//! [`FORWARDED`](meshcache_wire::directory::FORWARDED_QUERY) flag: its requester field and
//! option data name the member that asked, and the answer goes there, not to the sender. It is
//! honoured only when both the sender and the named requester are members.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use meshcache_dcm::directory::{Directory, DirectoryConfig, Member, Outgoing, Upkeep};
use meshcache_dcm::{PeerId, Role};
use meshcache_store::{StoreEvent, StoreKey};
use meshcache_wire::directory::{self as wire, DirMessage, HolderOp};
use meshcache_wire::icp;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio::sync::Notify;

use super::host::Host;
use super::link::Link;
use crate::cache::Cache;
use crate::config::Config;

/// The directory upkeep of a node (the state machine is the engine's protocol).
pub struct DirectoryState {
    /// Our ICP address: our identity in directory messages.
    me: SocketAddrV4,
    /// Sequence number of our next `DIR_ADD` / `DIR_DEL`.
    seq: AtomicU32,
    /// Wakes the upkeep task when an update was queued other than by a store event.
    queued: Notify,
}

impl DirectoryState {
    /// The directory of a node configured with `protocol = "directory"`, and its machine for
    /// the engine: its members are the sibling peers with an IPv4 ICP address.
    pub fn new(config: &Config) -> Option<(DirectoryState, Directory)> {
        let c = &config.cooperation;
        let SocketAddr::V4(me) = c.icp_listen else {
            return None;
        };
        let members = config
            .peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.role == Role::Sibling)
            .filter_map(|(i, p)| match p.icp {
                Some(SocketAddr::V4(icp)) => Some(Member {
                    name: p.name.clone(),
                    icp,
                    peer: PeerId(i),
                }),
                _ => None,
            })
            .collect();
        let dconfig = DirectoryConfig {
            alpha: c.directory_alpha,
            choice: c.directory_choice,
            variant: c.directory_variant,
            mode: c.directory_updates,
            ttl: c.directory_ttl,
            max_entries: DirectoryConfig::entries_in(c.directory_memory),
            flush: c.directory_flush,
        };
        // Seeded from the address: reproducible runs, different choices per member.
        let seed = u64::from(u32::from(*me.ip())) << 16 | u64::from(me.port());
        let state = DirectoryState {
            me,
            seq: AtomicU32::new(1),
            queued: Notify::new(),
        };
        Some((
            state,
            Directory::new(&config.name, me, members, dconfig, seed),
        ))
    }

    /// A miss of `key` ended, `stored` or not: an optimistic entry for what we will not hold
    /// is taken back, by the next drain.
    pub(crate) fn fetch_done(&self, coop: &Link, key: [u8; 16], stored: bool) {
        let queued = coop.with_protocol(|_, dir: &mut Directory| {
            dir.fetch_done(Instant::now(), key, stored);
            dir.queued_updates()
        });
        if queued.unwrap_or(0) > 0 {
            self.queued.notify_one();
        }
    }

    /// `/stats`: counters, entries, members, searches in flight and queued updates.
    pub fn report(&self, coop: &Link) -> serde_json::Value {
        coop.with_protocol(|_, d: &mut Directory| Self::report_of(d))
            .unwrap_or_default()
    }

    fn report_of(d: &Directory) -> serde_json::Value {
        let mut v = serde_json::to_value(d.stats()).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("entries".into(), d.entries().into());
            o.insert(
                "entry_budget_bytes".into(),
                (d.entries() * meshcache_dcm::directory::ENTRY_BYTES).into(),
            );
            o.insert("members".into(), (d.members().len() + 1).into());
            o.insert("in_flight".into(), d.in_flight().into());
            o.insert("queued_updates".into(), d.queued_updates().into());
        }
        v
    }
}

/// Encodes `sends` and sends them from the ICP socket. A candidate query addressed to
/// ourselves (variant 2, when the owner holds the object too) is answered here, straight to
/// the requester.
pub(crate) async fn send(host: &impl Host, d: &DirectoryState, sends: Vec<Outgoing>) {
    send_with(host.link(), d, Some(host.cache()), sends).await;
}

/// As [`send`], for a search's own messages (never a query to ourselves).
pub(crate) async fn send_from(link: &Link, d: &DirectoryState, sends: Vec<Outgoing>) {
    send_with(link, d, None, sends).await;
}

async fn send_with(link: &Link, d: &DirectoryState, cache: Option<&Cache>, sends: Vec<Outgoing>) {
    let coop = link;
    let Some(socket) = coop.icp_socket() else {
        return;
    };
    for (to, datagram) in encode(coop, cache, d, sends) {
        match socket.send_to(&datagram, to).await {
            Ok(_) => {
                coop.counters
                    .bytes_sent
                    .fetch_add(datagram.len() as u64, Relaxed);
                // Candidate queries and our own answers count as ICP queries and replies.
                if datagram
                    .first()
                    .is_some_and(|&op| wire::is_directory_opcode(op))
                {
                    coop.counters.directory_sent.fetch_add(1, Relaxed);
                }
            }
            Err(e) => tracing::debug!(%to, error = %e, "directory send failed"),
        }
    }
}

/// The datagrams for `sends`; a query to ourselves is answered from `cache`.
fn encode(
    coop: &Link,
    cache: Option<&Cache>,
    d: &DirectoryState,
    sends: Vec<Outgoing>,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut out = Vec::new();
    let sender = *d.me.ip();
    for s in sends {
        let mut datagram = Vec::new();
        let (to, ok) = match s {
            Outgoing::Get {
                to,
                reqnum,
                optimistic,
                forward,
                alpha,
                url,
            } => {
                let m = DirMessage::Get(wire::DirGet {
                    reqnum,
                    optimistic,
                    forward,
                    alpha,
                    sender,
                    requester: d.me,
                    url: url.as_bytes(),
                });
                (to, wire::encode(&m, &mut datagram).is_ok())
            }
            Outgoing::Data {
                to,
                reqnum,
                forwarded,
                holders,
                url,
            } => {
                let m = DirMessage::Data(wire::DirData {
                    reqnum,
                    forwarded,
                    sender,
                    nodes: holders,
                    url: url.as_bytes(),
                });
                (to, wire::encode(&m, &mut datagram).is_ok())
            }
            Outgoing::Query {
                to,
                reqnum,
                url,
                on_behalf_of,
            } => {
                if to == d.me {
                    if let (Some(requester), Some(cache)) = (on_behalf_of, cache) {
                        let query = icp::Message::query(reqnum, url.as_bytes());
                        let kind = holding_reply(coop, cache, SocketAddr::V4(requester), &url);
                        if let Ok(reply) = icp::Message::reply(kind, &query) {
                            let ok = icp::encode(&reply, &mut datagram).is_ok();
                            if ok {
                                coop.counters.replies_sent.fetch_add(1, Relaxed);
                                out.push((SocketAddr::V4(requester), datagram));
                            }
                        }
                    }
                    continue;
                }
                let mut m = icp::Message::query(reqnum, url.as_bytes());
                if let Some(r) = on_behalf_of {
                    m = m.with_options(wire::FORWARDED_QUERY);
                    m.option_data = u32::from(r.port());
                    m.payload = icp::Payload::Query {
                        requester: *r.ip(),
                        url: url.into_bytes(),
                    };
                }
                let ok = icp::encode(&m, &mut datagram).is_ok();
                if ok {
                    coop.counters.queries_sent.fetch_add(1, Relaxed);
                }
                (to, ok)
            }
            Outgoing::Add { to, keys } => {
                batches(d, HolderOp::Add, to, &keys, &mut out);
                continue;
            }
            Outgoing::Del { to, keys } => {
                batches(d, HolderOp::Del, to, &keys, &mut out);
                continue;
            }
        };
        if ok {
            out.push((SocketAddr::V4(to), datagram));
        }
    }
    out
}

fn batches(
    d: &DirectoryState,
    op: HolderOp,
    to: SocketAddrV4,
    keys: &[[u8; 16]],
    out: &mut Vec<(SocketAddr, Vec<u8>)>,
) {
    let mut datagrams = Vec::new();
    let first = d.seq.load(Relaxed);
    if let Ok(b) = wire::encode_batches(
        op,
        first,
        *d.me.ip(),
        d.me,
        keys,
        wire::DEFAULT_BATCH_LEN,
        &mut datagrams,
    ) {
        d.seq.store(b.next_seq, Relaxed);
    }
    out.extend(datagrams.into_iter().map(|g| (SocketAddr::V4(to), g)));
}

/// Our answer to a query about `url` from `asker`.
fn holding_reply(coop: &Link, cache: &Cache, asker: SocketAddr, url: &str) -> icp::Opcode {
    let who = coop.mesh_on_query(asker);
    let holding = if cache.fresh_for(url, coop.config().icp_hit_min_fresh) {
        meshcache_dcm::Holding::Fresh
    } else {
        meshcache_dcm::Holding::Nothing
    };
    match meshcache_dcm::answer(who, holding) {
        meshcache_dcm::ReplyKind::Hit => icp::Opcode::Hit,
        meshcache_dcm::ReplyKind::Miss => icp::Opcode::Miss,
        meshcache_dcm::ReplyKind::MissNoFetch => icp::Opcode::MissNoFetch,
        meshcache_dcm::ReplyKind::Denied => icp::Opcode::Denied,
        meshcache_dcm::ReplyKind::Err => icp::Opcode::Err,
    }
}

/// Where to answer a query from `from` carrying `options`, `option_data` and `requester`:
/// `Some(from)` for an ordinary query, the requester for an honoured forwarded one, `None`
/// for a forwarded query we must not honour (dropped and counted).
pub(crate) fn reply_address(
    link: &Link,
    from: SocketAddr,
    options: icp::Options,
    option_data: u32,
    requester: Ipv4Addr,
) -> Option<SocketAddr> {
    if !options.contains(wire::FORWARDED_QUERY) {
        return Some(from);
    }
    let port = u16::try_from(option_data).ok()?;
    let to = link
        .with_protocol(|_, d: &mut Directory| {
            d.forwarded_reply_to(from, SocketAddrV4::new(requester, port))
        })
        .flatten();
    if to.is_none() {
        link.counters.dropped.fetch_add(1, Relaxed);
        tracing::debug!(%from, "forwarded query from or for a non-member, dropped");
    }
    to
}

/// A directory datagram arrived from `from`: returns what to send in answer.
pub(crate) fn on_datagram(
    link: &Link,
    d: Option<&DirectoryState>,
    datagram: &[u8],
    from: SocketAddr,
) -> Vec<Outgoing> {
    if d.is_none() {
        link.counters.dropped.fetch_add(1, Relaxed);
        return Vec::new();
    }
    let now = Instant::now();
    let msg = match wire::decode(datagram) {
        Ok(m) => m,
        Err(e) => {
            link.counters.dropped.fetch_add(1, Relaxed);
            let n = link.counters.directory_bad.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(%from, error = %e, bad = n, "malformed directory message dropped");
            }
            return Vec::new();
        }
    };
    match msg {
        DirMessage::Get(g) => {
            let Ok(url) = std::str::from_utf8(g.url) else {
                return Vec::new();
            };
            let key = StoreKey::get(url).0;
            link.with_protocol(|_, d: &mut Directory| {
                d.on_get(
                    now,
                    from,
                    g.requester,
                    g.reqnum,
                    g.optimistic,
                    g.forward,
                    g.alpha,
                    url,
                    &key,
                )
            })
            .unwrap_or_default()
        }
        DirMessage::Data(data) => {
            let (sends, route) = link
                .with_protocol(|mesh, d: &mut Directory| {
                    d.on_data(now, mesh, from, data.reqnum, data.forwarded, &data.nodes)
                })
                .unwrap_or_default();
            if let Some(route) = route {
                link.decided(data.reqnum, route);
            }
            sends
        }
        DirMessage::Add(u) | DirMessage::Del(u) => {
            let add = datagram.first() == Some(&wire::OPCODE_DIR_ADD);
            let accepted = link
                .with_protocol(|_, d: &mut Directory| {
                    d.on_update(now, from, u.holder, add, &u.keys)
                })
                .unwrap_or(false);
            if accepted {
                link.heard_from_addr(from);
            } else {
                let n = link.counters.directory_bad.fetch_add(1, Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(%from, bad = n, "directory update from a non-member or for another member, dropped");
                }
            }
            Vec::new()
        }
    }
}

/// Follows the store: every admission and removal reaches the owner of the object's entry,
/// through dcm's [`Upkeep`] (drained 10 ms after the first event of a burst, the whole store
/// announced again every `ttl / 2`, and after events were lost).
pub(crate) async fn run_updates<H: Host>(
    host: Arc<H>,
    d: Arc<DirectoryState>,
    mut events: tokio::sync::broadcast::Receiver<StoreEvent>,
    mut stop: watch::Receiver<bool>,
) {
    let mut upkeep = Upkeep::new(Instant::now(), host.config().cooperation.directory_ttl);
    loop {
        let wake = tokio::time::Instant::from_std(upkeep.next_wake());
        // Asleep until there is something to do: a store event, an update queued by a miss's
        // end, a drain or the renewal.
        tokio::select! {
            ev = events.recv() => match ev {
                Ok(ev) => {
                    upkeep.note(Instant::now(), [(ev.key().0, ev.is_admission())], 0);
                }
                Err(RecvError::Lagged(_)) => {
                    tracing::warn!(
                        "directory upkeep fell behind the store; announcing the store again"
                    );
                    upkeep.lost(Instant::now());
                }
                Err(RecvError::Closed) => return,
            },
            () = d.queued.notified() => {
                upkeep.note(Instant::now(), [], 1);
            }
            () = tokio::time::sleep_until(wake) => {
                let woken = host.link().with_protocol(|_, dir: &mut Directory| {
                    let keys = || host.cache().keys().into_iter().map(|k| k.0);
                    upkeep.wake(Instant::now(), dir, keys)
                });
                match woken {
                    // No directory machine to keep.
                    None => return,
                    Some(None) => {}
                    Some(Some((sends, _))) => {
                        if !sends.is_empty() {
                            send(&*host, &d, sends).await;
                        }
                    }
                }
            }
            _ = stop.changed() => return,
        }
    }
}
