//! CARP: no search, a route per miss from the URL's hash ranking (`meshcache_dcm::carp`, run by
//! each node's engine as `CarpSearch`); here, the rankings the nodes share.
//!
//! Scoring a URL costs O(members × URL length) — Squid rehashes the URL once per member — and
//! the ranking depends only on the CARP array, which every node of a simulated mesh shares (a
//! mesh of equals lists the same names; leaves list the same parents). So each distinct array
//! ranks each object once, and every node routes from that ranking: 1,000 members would
//! otherwise score a thousand members twice per miss (the requester, then the winner).

use meshcache_dcm::engine::Engine;
use meshcache_dcm::protocols::CarpSearch;
use meshcache_dcm::{CarpRouter, IcpMesh};

use crate::mesh::{self, Node, NodeIx};
use crate::spec::SimSpec;

/// Leaf `node`'s CARP routing over its peer table: the parents, or with no parents the other
/// leaves and itself (a mesh of equals, where what a leaf wins is its own to fetch).
pub(crate) fn search(spec: &SimSpec, node: NodeIx, mesh: &IcpMesh) -> CarpSearch {
    let specs = mesh.peers().iter().map(|p| &p.spec);
    if mesh::carp_among_equals(spec) {
        let me = mesh::name(node, spec.mesh.caches);
        CarpSearch::new(CarpRouter::with_self(specs, &me, 1), true)
    } else {
        CarpSearch::new(CarpRouter::new(specs), false)
    }
}

/// A node's CARP router, when it routes by CARP.
fn router(engine: &Engine) -> Option<&CarpRouter> {
    engine.protocol::<CarpSearch>().map(CarpSearch::router)
}

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
                let router = router(&n.engine)?;
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

    /// `obj`'s ranking on `node`'s array, ranked by that node's router the first time; `None`
    /// when the node does not route by CARP.
    pub(crate) fn get<'s>(
        &'s mut self,
        node: NodeIx,
        obj: u32,
        engine: &Engine,
        url: &str,
    ) -> Option<&'s [usize]> {
        let array = self.array_of.get(node as usize).copied().flatten()? as usize;
        let router = router(engine)?;
        let ranking =
            self.by_array[array][obj as usize].get_or_insert_with(|| router.ranking(url).into());
        Some(ranking)
    }
}
