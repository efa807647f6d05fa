//! The multicast search (the Berkeley protocol) in the simulator: every node runs
//! `meshcache-dcm`'s [`Multicast`] against its own peer table, called at the points
//! `meshcache-proxy` calls it.
//!
//! | proxy (`meshcache-proxy`) | here |
//! |---|---|
//! | `MulticastState::new`, then `multicast::start` settles the mode | [`machine`]: `protocol.multicast_mode`, `ip` by default (what `auto` settles on where the network carries the group) |
//! | the engine's search (`Multicast` as a `SearchProtocol`): `multicast::send_queries` | the engine's `Sim::send_multicast_query` |
//! | `run_group` (by the group) and `coop/icp.rs`'s `respond` (unicast) → `multicast::answer` → `Multicast::on_query`: `ICP_OP_HIT` or silence | [`on_message`] |
//!
//! Replies and deadlines go to the node's engine, which gives them to its `Multicast`.
//!
//! **The group.** Every node of the mesh has joined it. A query sent to the group is one
//! datagram: one message counted, one send on the sender's CPU and interface, one crossing of
//! the network, and a copy delivered to every other node at the same time, each of which
//! spends a receive on it (a node that does not list the sender drops it). In logical mode
//! each unicast copy is a message. HIT replies count as multicast messages too.
//!
//! With `protocol.icp_model = "aggregate"` only the copy of a group query to the holder whose
//! HIT comes first is an event; the other members' receives and the other holders' HITs are
//! background work (`Fanout::group_query`, `Fanout::first_reply` in `fanout.rs`).
//!
//! Sizes are the proxy's datagrams': `meshcache_wire::multicast::query` and its ICP reply.

use meshcache_dcm::multicast::{Answer, Multicast, MulticastConfig};
use meshcache_dcm::ReplyKind;

use super::cx::Cx;
use super::msg::McMsg;
use crate::counters::Kind;
use crate::mesh::{icp_addr, NodeIx};
use crate::spec::SimSpec;

/// Query bytes for `url`: an ICP query with the flag (a flag bit, no extra byte).
pub(crate) fn query_len(url: &str) -> u64 {
    crate::net::icp_query_bytes(url.len())
}

/// `ICP_OP_HIT` bytes for `url`.
pub(crate) fn reply_len(url: &str) -> u64 {
    crate::net::icp_reply_bytes(url.len())
}

/// A node's multicast machine: `protocol.multicast_mode`, `ip` by default.
pub(crate) fn machine(spec: &SimSpec) -> Multicast {
    let p = &spec.protocol;
    let config = MulticastConfig {
        timeout_floor: p.multicast_timeout_floor,
        timeout_ceiling: p.icp_timeout_ceiling,
    };
    Multicast::new(config, p.multicast_mode)
}

/// A multicast message reached `to` from `from` (`multicast::answer`): a member's query is
/// answered `ICP_OP_HIT` when we hold the object, and not at all otherwise.
pub(crate) fn on_message<S>(cx: &mut Cx<'_, S>, to: NodeIx, from: NodeIx, msg: McMsg, t: u64) {
    let McMsg::Query { obj, reqnum } = msg;
    let trace = cx.trace;
    let n = &mut cx.nodes[to as usize];
    let holding = n.holding(&trace.objects[obj as usize].key);
    let Some((mesh, m)) = n.engine.parts_mut::<Multicast>() else {
        return;
    };
    if m.on_query(mesh, icp_addr(from), holding) != Answer::Hit {
        return;
    }
    cx.send_icp_reply(to, from, obj, reqnum, ReplyKind::Hit, Kind::Multicast, t);
}

#[cfg(test)]
mod tests {
    use meshcache_dcm::multicast::Mode;
    use meshcache_wire::icp;

    use super::*;
    use crate::mesh::Node;
    use crate::spec::Protocol;

    /// The sizes the simulator counts are the proxy's encoders' output lengths.
    #[test]
    fn sizes_are_the_encoders() {
        let url = "http://group1.lab/o/12345?size=3072";
        let query = meshcache_wire::multicast::query(7, url.as_bytes());
        assert_eq!(query.to_bytes().unwrap().len() as u64, query_len(url));
        let hit = icp::Message::reply(icp::Opcode::Hit, &query).unwrap();
        assert_eq!(hit.to_bytes().unwrap().len() as u64, reply_len(url));
    }

    #[test]
    fn every_node_has_a_machine_in_the_configured_mode() {
        let mut spec = SimSpec::default();
        spec.protocol.name = Protocol::Multicast;
        spec.mesh.parents = 1;
        let build = |spec: &SimSpec| {
            crate::mesh::build(spec, |node, mesh| {
                super::super::search_protocol(spec, node, mesh)
            })
        };
        let mode = |n: &Node| n.engine.protocol::<Multicast>().map(Multicast::mode);
        let nodes = build(&spec);
        assert_eq!(nodes.len(), 5);
        assert!(
            nodes.iter().all(|n| mode(n) == Some(Mode::Ip)),
            "the default"
        );
        spec.protocol.multicast_mode = Mode::Logical;
        assert_eq!(mode(&build(&spec)[3]), Some(Mode::Logical));
        spec.protocol.name = Protocol::Directory;
        assert_eq!(mode(&build(&spec)[0]), None);
    }
}
