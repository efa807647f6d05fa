//! CARP: no search, a route per miss from the URL's hash ranking (`meshcache_dcm::carp`), as
//! the proxy's `coop.rs` routes it.
//!
//! Scoring a URL costs O(members × URL length) — Squid rehashes the URL once per member — and
//! the ranking depends only on the CARP array, which every node of a simulated mesh shares (a
//! mesh of equals lists the same names; leaves list the same parents). So each distinct array
//! ranks each object once, and every node routes from that ranking: 1,000 members would
//! otherwise score a thousand members twice per miss (the requester, then the winner).

use meshcache_dcm::{CarpRouter, Outcome, Route};

use crate::engine::Sim;
use crate::mesh::{Node, NodeIx};

/// Each object's ranking, per distinct CARP array, computed on first use.
pub(crate) struct Rankings {
    /// Each node's array, as an index into `by_array` (`None`: the node has no router).
    array_of: Vec<Option<u32>>,
    /// Per distinct array, per object of the trace.
    by_array: Vec<Vec<Option<Box<[usize]>>>>,
}

impl Rankings {
    /// Empty rankings for `nodes`' routers and `objects` objects (nothing when no node routes
    /// by CARP).
    pub(crate) fn new(nodes: &[Node], objects: usize) -> Rankings {
        let mut arrays: Vec<&CarpRouter> = Vec::new();
        let array_of = nodes
            .iter()
            .map(|n| {
                let router = n.carp.as_ref()?;
                let i = match arrays.iter().position(|a| a.array() == router.array()) {
                    Some(i) => i,
                    None => {
                        arrays.push(router);
                        arrays.len() - 1
                    }
                };
                Some(i as u32)
            })
            .collect();
        Rankings {
            array_of,
            by_array: vec![vec![None; objects]; arrays.len()],
        }
    }

    /// `obj`'s ranking on `node`'s array, ranked by `router` (that node's) the first time.
    fn get(&mut self, node: NodeIx, obj: u32, router: &CarpRouter, url: &str) -> &[usize] {
        let array = self.array_of[node as usize].expect("a CARP node has a router") as usize;
        self.by_array[array][obj as usize].get_or_insert_with(|| router.ranking(url).into())
    }
}

/// The route of a miss of `obj` by `job` at `node`: the URL's parents best first, then the
/// origin; when no parent may take it and the mesh has a hierarchy, what the ICP-less
/// selection picks among the parents.
pub(crate) fn search(sim: &mut Sim<'_>, job: u32, node: NodeIx, obj_ix: u32, t: u64) {
    let obj = &sim.trace.objects[obj_ix as usize];
    let at = sim.at(t);
    let n = &mut sim.nodes[node as usize];
    let Some(router) = &n.carp else {
        unreachable!("CARP searches start only at nodes with a router")
    };
    let ranking = sim.proto.carp.get(node, obj_ix, router, &obj.url);
    let peers = n.mesh.peers();
    let mut route: Route =
        router.route_ranked(&obj.url, ranking, &obj.host, |id| peers[id.0].http_up(at));
    if route.hops.len() == 1 && sim.spec.mesh.parents > 0 {
        if let Outcome::Decided(r) = n.mesh.begin(at, &obj.url, &obj.host, false).outcome {
            route = r;
        }
    }
    sim.follow(job, route, t);
}
