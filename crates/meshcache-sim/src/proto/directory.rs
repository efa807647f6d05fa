//! The directory protocol (dbDCM) in the simulator: every leaf runs `meshcache-dcm`'s
//! [`Directory`] against its own peer table, called at the points `meshcache-proxy` calls it.
//!
//! | proxy (`meshcache-proxy`) | here |
//! |---|---|
//! | `DirectoryState::new`: the members are the siblings with an IPv4 ICP address; the entry budget is `directory_memory / ENTRY_BYTES`; the seed comes from the ICP address | [`directory`], [`new_state`] |
//! | the engine's search (`Directory` as a `SearchProtocol`): `directory::send_from` | [`send`] |
//! | `directory::on_datagram`: `DIR_GET` → `on_get`; `DIR_DATA` → `on_data`, then `Link::decided`; `DIR_ADD` / `DIR_DEL` → `on_update`, then `heard_from_addr` | [`on_message`] |
//! | `directory::encode`: candidate queries (a forwarded one names its requester), a forwarded query to ourselves answered from the store straight to the requester, updates cut into `encode_batches`' datagrams | [`send`] |
//! | `coop/icp.rs`'s `respond`: a forwarded query is answered at `forwarded_reply_to` | [`on_message`] |
//! | `service::relay_response` → `Directory::fetch_done` (stored or not) | [`on_store_events`] |
//! | `directory::run_updates`: the store's events and wake-ups through dcm's `directory::Upkeep` (drained 10 ms after the first of a burst, the whole store announced again every `ttl / 2`) | [`on_store_events`], [`on_tick`] |
//!
//! Replies and deadlines go to the node's engine, which gives them to its `Directory`.
//!
//! A 504 from a holder (a false entry) changes nothing in the directory, in the proxy as here:
//! the entry is corrected by the holder's own `DIR_DEL`, or expires.
//!
//! Sizes are the proxy's datagrams' (`meshcache_wire::directory` and `icp`). `DIR_*` count as
//! directory messages; candidate queries and their replies count as ICP's, as the proxy's
//! counters count them.

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Instant;

use meshcache_dcm::directory::{Directory, DirectoryConfig, Member, Outgoing, Upkeep};
use meshcache_dcm::icp::answer;
use meshcache_dcm::{IcpMesh, PeerId, Role};
use meshcache_store::StoreEvent;
use meshcache_wire::directory::{DEFAULT_BATCH_LEN, KEY_LEN, NODE_ADDR_LEN};
use meshcache_wire::icp::HEADER_LEN;

use super::cx::Cx;
use super::msg::{DirMsg, Msg};
use crate::counters::Kind;
use crate::mesh::{self, icp_addr, node_at, Node, NodeIx};
use crate::spec::{Protocol, SimSpec};

/// Keys in one `DIR_ADD` / `DIR_DEL` datagram, as `encode_batches` packs them into
/// [`DEFAULT_BATCH_LEN`] bytes.
const KEYS_PER_DATAGRAM: usize = (DEFAULT_BATCH_LEN - HEADER_LEN - NODE_ADDR_LEN) / KEY_LEN;

/// A leaf's directory upkeep, the proxy's machine (its share of the directory is its
/// engine's `Directory`).
pub(crate) struct DirNode {
    upkeep: Upkeep,
}

/// `DIR_GET` bytes for `url`.
pub(crate) fn get_len(url: &str) -> u64 {
    (HEADER_LEN + NODE_ADDR_LEN + url.len() + 1) as u64
}

/// `DIR_DATA` bytes listing `holders` for `url`.
pub(crate) fn data_len(holders: usize, url: &str) -> u64 {
    (HEADER_LEN + 2 + NODE_ADDR_LEN * holders + url.len() + 1) as u64
}

/// `DIR_ADD` / `DIR_DEL` bytes for `keys` keys.
pub(crate) fn update_len(keys: usize) -> u64 {
    (HEADER_LEN + NODE_ADDR_LEN + KEY_LEN * keys) as u64
}

/// ICP query bytes for `url`, forwarded or not.
pub(crate) fn icp_query_len(url: &str) -> u64 {
    crate::net::icp_query_bytes(url.len())
}

/// Node `node`'s ICP address, as directory messages name it.
fn icp_v4(node: NodeIx) -> SocketAddrV4 {
    SocketAddrV4::new(mesh::ip(node), 3130)
}

/// The node at a member's address.
fn node_of(addr: SocketAddrV4) -> NodeIx {
    node_at(SocketAddr::V4(addr)).expect("members have virtual addresses")
}

/// The proxy's `DirectoryConfig` from `spec`.
pub(crate) fn config(spec: &SimSpec) -> DirectoryConfig {
    let p = &spec.protocol;
    DirectoryConfig {
        alpha: p.directory_alpha,
        choice: p.directory_choice,
        variant: p.directory_variant,
        mode: p.directory_updates,
        ttl: p.directory_ttl,
        max_entries: DirectoryConfig::entries_in(p.directory_memory.as_u64()),
        flush: p.directory_flush,
    }
}

/// Leaf `node`'s share of the directory, over its peer table: the members are its siblings
/// with an IPv4 ICP address.
pub(crate) fn directory(spec: &SimSpec, node: NodeIx, mesh: &IcpMesh) -> Directory {
    let me = icp_v4(node);
    let members = mesh
        .peers()
        .iter()
        .enumerate()
        .filter(|(_, p)| p.spec.role == Role::Sibling)
        .filter_map(|(i, p)| match p.spec.icp {
            Some(SocketAddr::V4(icp)) => Some(Member {
                name: p.spec.name.clone(),
                icp,
                peer: PeerId(i),
            }),
            _ => None,
        })
        .collect();
    let seed = (u64::from(u32::from(*me.ip())) << 16) | u64::from(me.port());
    let name = mesh::name(node, spec.mesh.caches);
    Directory::new(&name, me, members, config(spec), seed)
}

/// Every leaf's directory upkeep (none for parents, which never search), or nothing when the
/// protocol is another.
pub(crate) fn new_state(spec: &SimSpec, nodes: &[Node], start: Instant) -> Vec<DirNode> {
    if spec.protocol.name != Protocol::Directory {
        return Vec::new();
    }
    let ttl = spec.protocol.directory_ttl;
    nodes
        .iter()
        .take_while(|n| !n.is_parent)
        .map(|_| DirNode {
            upkeep: Upkeep::new(start, ttl),
        })
        .collect()
}

/// Before the first request: each leaf's renewal timer (the proxy's first is at `ttl / 2`).
pub(crate) fn start(cx: &mut Cx<'_, Vec<DirNode>>) {
    for node in 0..cx.proto.len() {
        let at = cx.virtual_ns(cx.proto[node].upkeep.renew_at());
        cx.timer(at, node as NodeIx);
    }
}

/// Sends what the directory of `node` asked for, from `t` on its CPU (`directory::encode`).
/// `obj` is the object of the search messages among them (updates name keys).
pub(crate) fn send(
    cx: &mut Cx<'_, Vec<DirNode>>,
    node: NodeIx,
    obj: Option<u32>,
    sends: Vec<Outgoing>,
    t: u64,
) {
    let me = icp_v4(node);
    for s in sends {
        match s {
            Outgoing::Get {
                to,
                reqnum,
                optimistic,
                forward,
                alpha,
                url,
            } => {
                let Some(obj) = obj else { continue };
                let msg = DirMsg::Get {
                    obj,
                    reqnum,
                    optimistic,
                    forward,
                    alpha,
                };
                let bytes = get_len(&url);
                cx.send_proto(
                    node,
                    node_of(to),
                    bytes,
                    Kind::Directory,
                    Msg::Directory(msg),
                    t,
                );
            }
            Outgoing::Data {
                to,
                reqnum,
                forwarded,
                holders,
                url,
            } => {
                let Some(obj) = obj else { continue };
                let bytes = data_len(holders.len(), &url);
                let msg = DirMsg::Data {
                    obj,
                    reqnum,
                    forwarded,
                    holders,
                };
                cx.send_proto(
                    node,
                    node_of(to),
                    bytes,
                    Kind::Directory,
                    Msg::Directory(msg),
                    t,
                );
            }
            Outgoing::Query {
                to,
                reqnum,
                url,
                on_behalf_of,
            } => {
                let Some(obj) = obj else { continue };
                if to == me {
                    // Variant 2, the owner holds it too: answered from our store, straight to
                    // the requester.
                    if let Some(requester) = on_behalf_of {
                        answer_query(cx, node, SocketAddr::V4(requester), obj, reqnum, t);
                    }
                    continue;
                }
                match on_behalf_of {
                    None => {
                        let peer = cx.nodes[node as usize]
                            .engine
                            .mesh()
                            .peer_at(SocketAddr::V4(to));
                        if let Some(peer) = peer {
                            let query = [(peer, SocketAddr::V4(to))];
                            cx.send_icp_queries(node, obj, reqnum, &query, t);
                        }
                    }
                    Some(requester) => {
                        let msg = DirMsg::ForwardedQuery {
                            obj,
                            reqnum,
                            requester,
                        };
                        let bytes = icp_query_len(&url);
                        let to = node_of(to);
                        cx.send_proto(node, to, bytes, Kind::IcpQuery, Msg::Directory(msg), t);
                    }
                }
            }
            Outgoing::Add { to, keys } => send_batches(cx, node, true, node_of(to), &keys, t),
            Outgoing::Del { to, keys } => send_batches(cx, node, false, node_of(to), &keys, t),
        }
    }
}

/// `DIR_ADD` (`add`) or `DIR_DEL` datagrams for `keys`, as many as `encode_batches` makes.
fn send_batches(
    cx: &mut Cx<'_, Vec<DirNode>>,
    node: NodeIx,
    add: bool,
    to: NodeIx,
    keys: &[[u8; 16]],
    t: u64,
) {
    let holder = icp_v4(node);
    for chunk in keys.chunks(KEYS_PER_DATAGRAM) {
        let msg = DirMsg::Update {
            add,
            holder,
            keys: chunk.to_vec(),
        };
        let bytes = update_len(chunk.len());
        cx.send_proto(node, to, bytes, Kind::Directory, Msg::Directory(msg), t);
    }
}

/// Our ICP answer to a query for `obj` (search `reqnum`) answered at `reply_to`, sent after
/// `t` (`coop/icp.rs`'s `respond`, query branch, and `directory::holding_reply`).
fn answer_query(
    cx: &mut Cx<'_, Vec<DirNode>>,
    node: NodeIx,
    reply_to: SocketAddr,
    obj: u32,
    reqnum: u32,
    t: u64,
) {
    let trace = cx.trace;
    let n = &mut cx.nodes[node as usize];
    let asker = n.engine.mesh_mut().on_query(reply_to, false);
    let holding = n.holding(&trace.objects[obj as usize].key);
    let kind = answer(asker, holding);
    let Some(to) = node_at(reply_to) else { return };
    cx.send_icp_reply(node, to, obj, reqnum, kind, Kind::IcpReply, t);
}

/// A directory datagram reached `to` (`directory::on_datagram`, and `coop/icp.rs`'s `respond` for a
/// forwarded query).
pub(crate) fn on_message(
    cx: &mut Cx<'_, Vec<DirNode>>,
    to: NodeIx,
    from: NodeIx,
    msg: DirMsg,
    t: u64,
) {
    let trace = cx.trace;
    let at = cx.at(cx.now);
    let from_addr = icp_addr(from);
    let Some((mesh, dir)) = cx.nodes[to as usize].engine.parts_mut::<Directory>() else {
        // A node without a directory drops directory datagrams, and forwarded queries.
        return;
    };
    match msg {
        DirMsg::Get {
            obj,
            reqnum,
            optimistic,
            forward,
            alpha,
        } => {
            let o = &trace.objects[obj as usize];
            let sends = dir.on_get(
                at,
                from_addr,
                icp_v4(from),
                reqnum,
                optimistic,
                forward,
                alpha,
                &o.url,
                &o.key.0,
            );
            send(cx, to, Some(obj), sends, t);
        }
        DirMsg::Data {
            obj,
            reqnum,
            forwarded,
            holders,
        } => {
            let (sends, route) = dir.on_data(at, mesh, from_addr, reqnum, forwarded, &holders);
            if let Some(route) = route {
                cx.decided(to, reqnum, route, t);
            }
            send(cx, to, Some(obj), sends, t);
        }
        DirMsg::Update { add, holder, keys } => {
            if dir.on_update(at, from_addr, holder, add, &keys) {
                if let Some(id) = mesh.peer_at(from_addr) {
                    mesh.heard_from(at, id);
                }
            }
        }
        DirMsg::ForwardedQuery {
            obj,
            reqnum,
            requester,
        } => {
            // Honoured only when the sender and the requester are both members; else dropped.
            if let Some(reply_to) = dir.forwarded_reply_to(from_addr, requester) {
                answer_query(cx, to, reply_to, obj, reqnum, t);
            }
        }
    }
}

/// `node`'s fetch of `obj` ended and its store did `events`: the fetch is done, stored or
/// not (`fetch_done`, at once, as the proxy calls it when the response comes), and the events
/// wait for the next drain.
pub(crate) fn on_store_events(
    cx: &mut Cx<'_, Vec<DirNode>>,
    node: NodeIx,
    obj: u32,
    events: &[StoreEvent],
) {
    let trace = cx.trace;
    let now = cx.now;
    let at = cx.at(now);
    let Some(d) = cx.proto.get_mut(node as usize) else {
        return;
    };
    let Some((_, dir)) = cx.nodes[node as usize].engine.parts_mut::<Directory>() else {
        return;
    };
    let key = trace.objects[obj as usize].key;
    let stored = events.iter().any(|e| e.is_admission() && e.key() == key);
    dir.fetch_done(at, key.0, stored);
    // A drain 10 ms after there is something to drain (an event, or an optimistic entry
    // `fetch_done` took back); nothing while there is nothing.
    let changes = events.iter().map(|e| (e.key().0, e.is_admission()));
    if let Some(due) = d.upkeep.note(at, changes, dir.queued_updates()) {
        let due = cx.virtual_ns(due);
        cx.tick(due, node);
    }
}

/// A timer of `node`: the drain of its store events, or the renewal of its whole store, or
/// both (one round of `directory::run_updates`).
pub(crate) fn on_tick(cx: &mut Cx<'_, Vec<DirNode>>, node: NodeIx) {
    let now = cx.now;
    let at = cx.at(now);
    let Some(d) = cx.proto.get_mut(node as usize) else {
        return;
    };
    let n = &mut cx.nodes[node as usize];
    let Some((_, dir)) = n.engine.parts_mut::<Directory>() else {
        return;
    };
    let store = &n.store;
    // Nothing due: a drain already done by a renewal.
    let Some((sends, renewed)) = d.upkeep.wake(at, dir, || store.keys().map(|k| k.0)) else {
        return;
    };
    let renew_at = d.upkeep.renew_at();
    if renewed {
        let renew_at = cx.virtual_ns(renew_at);
        cx.timer(renew_at, node);
    }
    send(cx, node, None, sends, now);
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use meshcache_wire::directory::{
        encode_batches, DirData, DirGet, DirMessage, HolderOp, HolderUpdate,
    };
    use meshcache_wire::icp;

    use super::*;

    /// The sizes the simulator counts are the proxy's encoders' output lengths.
    #[test]
    fn sizes_are_the_encoders() {
        let me = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 3130);
        let url = "http://group1.lab/o/12345?size=3072";
        let get = DirMessage::Get(DirGet {
            reqnum: 7,
            optimistic: true,
            forward: true,
            alpha: 2,
            sender: *me.ip(),
            requester: me,
            url: url.as_bytes(),
        });
        assert_eq!(get.to_bytes().unwrap().len() as u64, get_len(url));
        for n in [0, 1, 5] {
            let data = DirMessage::Data(DirData {
                reqnum: 7,
                forwarded: false,
                sender: *me.ip(),
                nodes: vec![me; n],
                url: url.as_bytes(),
            });
            assert_eq!(data.to_bytes().unwrap().len() as u64, data_len(n, url));
        }
        let update = DirMessage::Add(HolderUpdate {
            seq: 1,
            sender: *me.ip(),
            holder: me,
            keys: vec![[3; 16]; 4],
        });
        assert_eq!(update.to_bytes().unwrap().len() as u64, update_len(4));
        let mut forwarded = icp::Message::query(7, url.as_bytes())
            .with_options(meshcache_wire::directory::FORWARDED_QUERY);
        forwarded.option_data = 3130;
        forwarded.payload = icp::Payload::Query {
            requester: *me.ip(),
            url: url.as_bytes().to_vec(),
        };
        assert_eq!(
            forwarded.to_bytes().unwrap().len() as u64,
            icp_query_len(url)
        );
    }

    /// Updates are cut as `encode_batches` cuts them.
    #[test]
    fn batches_are_the_encoders() {
        let me = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 3130);
        for n in [1, 89, 90, 91, 500] {
            let keys = vec![[9u8; 16]; n];
            let mut out = Vec::new();
            encode_batches(
                HolderOp::Add,
                1,
                *me.ip(),
                me,
                &keys,
                DEFAULT_BATCH_LEN,
                &mut out,
            )
            .unwrap();
            let ours: Vec<u64> = keys
                .chunks(KEYS_PER_DATAGRAM)
                .map(|c| update_len(c.len()))
                .collect();
            let theirs: Vec<u64> = out.iter().map(|d| d.len() as u64).collect();
            assert_eq!(ours, theirs, "{n} keys");
        }
    }

    #[test]
    fn leaves_are_members_parents_have_no_directory() {
        let mut spec = SimSpec::default();
        spec.protocol.name = Protocol::Directory;
        spec.mesh.caches = 3;
        spec.mesh.parents = 1;
        let nodes = mesh::build(&spec, |node, mesh| {
            super::super::search_protocol(&spec, node, mesh)
        });
        let state = new_state(&spec, &nodes, Instant::now());
        assert_eq!(state.len(), 3);
        let dir = |n: usize| nodes[n].engine.protocol::<Directory>();
        assert_eq!(dir(1).map(|d| d.members().len()), Some(2));
        assert_eq!(dir(1).map(Directory::me), Some(icp_v4(1)));
        assert!(dir(3).is_none(), "a parent has no directory");
        assert_eq!(
            config(&spec).max_entries,
            16 * 1024 * 1024 / meshcache_dcm::directory::ENTRY_BYTES,
            "the proxy's default budget"
        );
        spec.protocol.name = Protocol::Icp;
        assert!(new_state(&spec, &nodes, Instant::now()).is_empty());
    }
}
