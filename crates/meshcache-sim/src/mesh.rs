//! The simulated mesh: one [`Node`] per cache, with the peer table a real meshcache node of
//! that topology would be configured with, its store and its protocol state.
//!
//! Nodes are numbered: the leaf caches (the ones clients use) first, `0..caches`, then the
//! parents; they are named `n0`… and `p0`… ([`name`]). Each has a virtual address on 127.0.0.0/8 (never bound: only the protocol code's
//! peer tables see it) — ICP on port 3130, HTTP on 3128 — so the `meshcache-dcm` machines run
//! unchanged, keyed by socket address as in the proxy.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use meshcache_dcm::engine::{Engine, SearchProtocol};
use meshcache_dcm::{IcpConfig, IcpMesh, PeerSpec, Role};
use meshcache_store::{MemoryStore, StoreConfig, Weigh};
use rustc_hash::{FxBuildHasher, FxHashMap};

pub use crate::counters::NodeStats;
use crate::spec::{Protocol, SimSpec};

/// A node's index in the mesh.
pub type NodeIx = u32;

/// The body of a stored object: only its size matters here.
#[derive(Debug)]
pub struct Body(pub u64);

impl Weigh for Body {
    fn weight(&self) -> u64 {
        self.0
    }
}

/// A node's store. Keys are hashed with FxHash rather than the proxy's keyed SipHash: they
/// are MD5 digests of a trace's URLs, which nobody picks against the table.
pub type Store = MemoryStore<Body, FxBuildHasher>;

/// The node's ICP address.
pub fn icp_addr(node: NodeIx) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip(node), 3130))
}

/// The node's HTTP address.
pub fn http_addr(node: NodeIx) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip(node), 3128))
}

/// The node's virtual IPv4 address: 127.x.y.z, unique for up to 16 million nodes.
pub fn ip(node: NodeIx) -> Ipv4Addr {
    let n = node + 1;
    Ipv4Addr::new(127, (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

/// The node whose virtual address is `addr`, if any.
pub fn node_at(addr: SocketAddr) -> Option<NodeIx> {
    match addr {
        SocketAddr::V4(a) => {
            let [o, x, y, z] = a.ip().octets();
            let n = (u32::from(x) << 16) | (u32::from(y) << 8) | u32::from(z);
            (o == 127 && n > 0).then(|| n - 1)
        }
        SocketAddr::V6(_) => None,
    }
}

/// A node's name, as peers list it: `n0`, `n1`… for leaves, `p0`… for parents — as the
/// lab names the nodes of its `N.0` topologies, so that CARP among equals (which hashes the
/// members' names) splits URLs exactly as a lab run does.
pub fn name(node: NodeIx, caches: u32) -> String {
    if node < caches {
        format!("n{node}")
    } else {
        format!("p{}", node - caches)
    }
}

/// One cache.
pub struct Node {
    /// Leaf or parent.
    pub is_parent: bool,
    /// The store, with the configured size and policy.
    pub store: Store,
    /// The cooperation engine: the peer table and the protocol's search, as the proxy runs
    /// them.
    pub engine: Engine,
    /// The node behind each peer of the table.
    pub peer_nodes: Vec<NodeIx>,
    /// Searches in flight: request number → job.
    pub searches: FxHashMap<u32, u32>,
    /// Collapsed forwarding: object → the jobs waiting for its fetch (the first is the leader).
    pub fetching: FxHashMap<u32, smallvec::SmallVec<[u32; 2]>>,
    /// When its CPU is next free (ns of virtual time).
    pub cpu_free: u64,
    /// Its interface.
    pub(crate) nic: crate::net::Link,
    /// Counters.
    pub stats: NodeStats,
}

impl Node {
    /// Books `cost` ns of CPU from `t` (after what it is busy with): when it is done.
    pub(crate) fn book_cpu(&mut self, t: u64, cost: u64) -> u64 {
        let start = t.max(self.cpu_free);
        self.cpu_free = start + cost;
        self.stats.cpu_ns += cost;
        self.cpu_free
    }

    /// What this node answers a query for `key` with: a copy, or nothing.
    pub fn holding(&self, key: &meshcache_store::StoreKey) -> meshcache_dcm::Holding {
        if self.store.contains(key) {
            meshcache_dcm::Holding::Fresh
        } else {
            meshcache_dcm::Holding::Nothing
        }
    }
}

/// Builds every node of the mesh `spec` describes; `protocol` gives each node's search, given
/// its index and peer table.
pub fn build(
    spec: &SimSpec,
    mut protocol: impl FnMut(NodeIx, &IcpMesh) -> Box<dyn SearchProtocol>,
) -> Vec<Node> {
    let m = &spec.mesh;
    let p = &spec.protocol;
    let total = m.caches + m.parents;
    let speaks_icp = matches!(
        p.name,
        Protocol::Icp
            | Protocol::Summary
            | Protocol::Digest
            | Protocol::Directory
            | Protocol::Multicast
    );
    let icp_config = IcpConfig {
        timeout_floor: p.icp_timeout_floor,
        timeout_ceiling: p.icp_timeout_ceiling,
        dead_after: p.dead_peer_timeout,
        query_lone_parent: false,
    };
    // A CARP mesh of equals: no parents, the leaves list each other as parents.
    let carp_equals = carp_among_equals(spec);
    (0..total)
        .map(|node| {
            let is_parent = node >= m.caches;
            let mut specs = Vec::new();
            let mut peer_nodes = Vec::new();
            if !is_parent {
                if m.siblings || carp_equals {
                    for other in (0..m.caches).filter(|&o| o != node) {
                        let role = if carp_equals {
                            Role::Parent
                        } else {
                            Role::Sibling
                        };
                        specs.push(peer_spec(other, m.caches, role, speaks_icp));
                        peer_nodes.push(other);
                    }
                }
                for k in 0..m.parents {
                    let other = m.caches + k;
                    let mut s = peer_spec(other, m.caches, Role::Parent, speaks_icp);
                    if let Some(domains) = m.parent_domains.get(k as usize) {
                        s.domains = domains.clone();
                    }
                    specs.push(s);
                    peer_nodes.push(other);
                }
            }
            let mesh = IcpMesh::new(specs, icp_config.clone());
            let search = protocol(node, &mesh);
            let size = if is_parent {
                m.parent_size
            } else {
                m.cache_size
            };
            Node {
                is_parent,
                store: MemoryStore::with_hasher(
                    StoreConfig {
                        capacity: size.as_u64(),
                        max_object_size: m.max_object_size.as_u64(),
                        replacement: m.replacement,
                    },
                    FxBuildHasher,
                ),
                engine: Engine::new(mesh, search),
                peer_nodes,
                searches: FxHashMap::default(),
                fetching: FxHashMap::default(),
                cpu_free: 0,
                nic: crate::net::Link::default(),
                stats: NodeStats::default(),
            }
        })
        .collect()
}

/// Whether `spec` is a CARP mesh of equals: no parents, every leaf a member of one array.
pub fn carp_among_equals(spec: &SimSpec) -> bool {
    spec.protocol.name == Protocol::Carp && spec.mesh.parents == 0
}

fn peer_spec(node: NodeIx, caches: u32, role: Role, speaks_icp: bool) -> PeerSpec {
    PeerSpec::new(
        &name(node, caches),
        role,
        http_addr(node),
        speaks_icp.then(|| icp_addr(node)),
    )
}

/// A stored body of `size` bytes.
pub fn body(size: u64) -> Arc<Body> {
    Arc::new(Body(size))
}

/// One body per object, shared by every store that keeps it: an insert costs a reference
/// count, not an allocation (and an eviction not a free).
pub struct Bodies(Vec<Option<Arc<Body>>>);

impl Bodies {
    /// Room for `objects` objects.
    pub fn new(objects: usize) -> Bodies {
        Bodies(vec![None; objects])
    }

    /// The body of object `obj` at `size` bytes (a request whose size differs from the
    /// object's last gets a body of its own, which then becomes the object's).
    pub fn get(&mut self, obj: u32, size: u64) -> Arc<Body> {
        match &self.0[obj as usize] {
            Some(b) if b.0 == size => Arc::clone(b),
            _ => {
                let b = body(size);
                self.0[obj as usize] = Some(Arc::clone(&b));
                b
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for n in [0, 1, 254, 255, 256, 65_535, 65_536, 999_999] {
            assert_eq!(node_at(icp_addr(n)), Some(n));
        }
        assert_eq!(ip(0), Ipv4Addr::new(127, 0, 0, 1));
        assert_eq!(node_at("127.0.0.0:3130".parse().unwrap()), None);
    }

    #[test]
    fn leaves_list_siblings_then_parents() {
        let mut spec = SimSpec::default();
        spec.mesh.caches = 3;
        spec.mesh.parents = 2;
        let nodes = build(&spec, |_, _| Box::new(meshcache_dcm::engine::NoSearch));
        assert_eq!(nodes.len(), 5);
        assert_eq!(nodes[1].peer_nodes, vec![0, 2, 3, 4]);
        let roles: Vec<Role> = nodes[1]
            .engine
            .mesh()
            .peers()
            .iter()
            .map(|p| p.spec.role)
            .collect();
        assert_eq!(
            roles,
            [Role::Sibling, Role::Sibling, Role::Parent, Role::Parent]
        );
        assert!(nodes[3].is_parent && nodes[3].peer_nodes.is_empty());
    }
}
