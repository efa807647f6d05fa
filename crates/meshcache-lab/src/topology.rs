//! Topologies: which cache nodes an experiment runs and how they cooperate.
//!
//! The hierarchy-evaluation paper compares four ways to arrange four caches,
//! named by their clients-serving and parent levels:
//!
//! | name | nodes | relations |
//! | --- | --- | --- |
//! | `N.0` (e.g. `4.0`) | `n0`…`nN-1`, all with clients | every node a sibling of every other |
//! | `3.1` | children `c0`–`c2`, parent `p0` | children mutual siblings, `p0` their parent |
//! | `2.2` | children `c0`, `c1`, parents `p0`, `p1` | children siblings, both parents of both, parents siblings of each other |
//! | `2.2.dom` | as `2.2` | `p0` the parent for `.br` only, `p1` for everything else; parents not siblings |
//! | `pair` | `child`, `parent` | the trans-Pacific pair: a child and its lone parent |
//!
//! An experiment may also describe its own graph (`[[topology.NAME.node]]`).
//! Only nodes marked `clients` receive the emulated clients' requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node's relation to a neighbour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// We fetch only its hits.
    Sibling,
    /// It fetches our misses.
    Parent,
}

impl Role {
    /// "sibling" or "parent".
    pub fn name(self) -> &'static str {
        match self {
            Role::Sibling => "sibling",
            Role::Parent => "parent",
        }
    }
}

/// A neighbour of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// Index of the neighbour in [`Topology::nodes`].
    pub node: usize,
    /// Its role for us.
    pub role: Role,
    /// Domain entries in Squid's `cache_peer_domain` style (`.br`, `!.br`); empty: all.
    pub domains: Vec<String>,
}

/// A node of a topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoNode {
    /// Unique name (also the cache's visible name).
    pub name: String,
    /// Whether emulated clients send requests to it.
    pub clients: bool,
    /// Its neighbours.
    pub neighbours: Vec<Neighbour>,
}

impl TopoNode {
    /// Its role in the hierarchy, for reports: `parent` when some node has it as a parent,
    /// else `child` when it has parents, else `sibling`.
    pub fn role(&self, topo: &Topology) -> &'static str {
        let me = topo.nodes.iter().position(|n| n.name == self.name);
        let is_parent = topo.nodes.iter().any(|n| {
            n.neighbours
                .iter()
                .any(|nb| Some(nb.node) == me && nb.role == Role::Parent)
        });
        if is_parent {
            "parent"
        } else if self.neighbours.iter().any(|nb| nb.role == Role::Parent) {
            "child"
        } else {
            "sibling"
        }
    }
}

/// A set of nodes and their relations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Its name.
    pub name: String,
    /// The nodes.
    pub nodes: Vec<TopoNode>,
}

/// The most nodes a topology may have (addresses 127.0.0.10 … 127.0.0.209).
pub const MAX_NODES: usize = 200;

impl Topology {
    /// Builds a built-in topology or one of `custom` (an experiment's `[topology.NAME]`).
    pub fn build(
        name: &str,
        custom: &BTreeMap<String, CustomTopology>,
    ) -> Result<Topology, String> {
        if let Some(custom) = custom.get(name) {
            return Self::custom(name, custom);
        }
        let sib = |node| Neighbour {
            node,
            role: Role::Sibling,
            domains: vec![],
        };
        let par = |node, domains: &[&str]| Neighbour {
            node,
            role: Role::Parent,
            domains: domains.iter().map(|d| d.to_string()).collect(),
        };
        let node = |name: &str, clients, neighbours| TopoNode {
            name: name.into(),
            clients,
            neighbours,
        };
        let nodes = match name {
            "3.1" => vec![
                node("c0", true, vec![sib(1), sib(2), par(3, &[])]),
                node("c1", true, vec![sib(0), sib(2), par(3, &[])]),
                node("c2", true, vec![sib(0), sib(1), par(3, &[])]),
                node("p0", false, vec![]),
            ],
            "2.2" => vec![
                node("c0", true, vec![sib(1), par(2, &[]), par(3, &[])]),
                node("c1", true, vec![sib(0), par(2, &[]), par(3, &[])]),
                node("p0", false, vec![sib(3)]),
                node("p1", false, vec![sib(2)]),
            ],
            "2.2.dom" => vec![
                node(
                    "c0",
                    true,
                    vec![sib(1), par(2, &[".br"]), par(3, &["!.br"])],
                ),
                node(
                    "c1",
                    true,
                    vec![sib(0), par(2, &[".br"]), par(3, &["!.br"])],
                ),
                node("p0", false, vec![]),
                node("p1", false, vec![]),
            ],
            "pair" => vec![
                node("child", true, vec![par(1, &[])]),
                node("parent", false, vec![]),
            ],
            _ => {
                let n = name
                    .strip_suffix(".0")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_NODES).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "unknown topology {name:?}: use N.0 (N siblings, 1..={MAX_NODES}), \
                             3.1, 2.2, 2.2.dom, pair, or define [[topology.{name}.node]]"
                        )
                    })?;
                (0..n)
                    .map(|i| {
                        let peers = (0..n).filter(|&j| j != i).map(sib).collect();
                        node(&format!("n{i}"), true, peers)
                    })
                    .collect()
            }
        };
        Ok(Topology {
            name: name.into(),
            nodes,
        })
    }

    fn custom(name: &str, custom: &CustomTopology) -> Result<Topology, String> {
        if custom.node.is_empty() || custom.node.len() > MAX_NODES {
            return Err(format!("topology {name:?} needs 1..={MAX_NODES} nodes"));
        }
        let index = |n: &str| custom.node.iter().position(|x| x.name == n);
        let mut nodes = Vec::new();
        for (i, n) in custom.node.iter().enumerate() {
            if index(&n.name) != Some(i) {
                return Err(format!(
                    "topology {name:?}: node name {:?} is used twice",
                    n.name
                ));
            }
            if n.name.is_empty()
                || !n
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Err(format!(
                    "topology {name:?}: node name {:?} must be letters, digits and '-'",
                    n.name
                ));
            }
            let mut neighbours = Vec::new();
            for p in &n.peer {
                let node = index(&p.name).ok_or_else(|| {
                    format!(
                        "topology {name:?}: node {:?} names unknown peer {:?}",
                        n.name, p.name
                    )
                })?;
                if node == i {
                    return Err(format!(
                        "topology {name:?}: node {:?} peers with itself",
                        n.name
                    ));
                }
                let role = match p.role.as_str() {
                    "sibling" => Role::Sibling,
                    "parent" => Role::Parent,
                    r => {
                        return Err(format!(
                        "topology {name:?}: node {:?}: role {r:?} is neither sibling nor parent",
                        n.name
                    ))
                    }
                };
                let mut domains = p.domains.clone();
                domains.extend(p.except_domains.iter().map(|d| format!("!{d}")));
                neighbours.push(Neighbour {
                    node,
                    role,
                    domains,
                });
            }
            nodes.push(TopoNode {
                name: n.name.clone(),
                clients: n.clients,
                neighbours,
            });
        }
        if !nodes.iter().any(|n| n.clients) {
            return Err(format!("topology {name:?}: no node has clients"));
        }
        Ok(Topology {
            name: name.into(),
            nodes,
        })
    }

    /// Indices of the nodes that receive clients.
    pub fn client_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].clients)
            .collect()
    }

    /// Names of the nodes that are parents of node `i` (for classifying parent hits).
    pub fn parents_of(&self, i: usize) -> Vec<String> {
        self.nodes[i]
            .neighbours
            .iter()
            .filter(|nb| nb.role == Role::Parent)
            .map(|nb| self.nodes[nb.node].name.clone())
            .collect()
    }
}

/// A custom topology.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomTopology {
    /// Its nodes.
    pub node: Vec<CustomNode>,
}

/// A node of a custom topology.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomNode {
    /// Its name (unique in the topology).
    pub name: String,
    /// Whether emulated clients use it.
    #[serde(default = "clients_by_default")]
    pub clients: bool,
    /// Its neighbours.
    #[serde(default)]
    pub peer: Vec<CustomPeer>,
}

/// One neighbour of a custom node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomPeer {
    /// The neighbour's node name.
    pub name: String,
    /// "sibling" or "parent".
    pub role: String,
    /// Only these domains (suffixes like ".br"), or all when empty.
    #[serde(default)]
    pub domains: Vec<String>,
    /// With `domains`: all domains except these instead.
    #[serde(default)]
    pub except_domains: Vec<String>,
}

fn clients_by_default() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    // The experiment file is where custom topologies are written.
    use crate::experiment::Experiment;

    fn exp() -> Experiment {
        Experiment::from_toml(
            "name = \"t\"\n[workload]\n[[config]]\nname = \"a\"\ntopology = \"4.0\"\n",
        )
        .expect("minimal experiment")
    }

    #[test]
    fn builtins() {
        let e = exp();
        let flat = Topology::build("4.0", &e.topology).unwrap();
        assert_eq!(flat.nodes.len(), 4);
        assert!(flat
            .nodes
            .iter()
            .all(|n| n.neighbours.len() == 3 && n.clients));
        let t = Topology::build("3.1", &e.topology).unwrap();
        assert_eq!(t.client_nodes(), vec![0, 1, 2]);
        assert_eq!(t.parents_of(0), vec!["p0".to_string()]);
        assert_eq!(t.nodes[3].role(&t), "parent");
        assert_eq!(t.nodes[0].role(&t), "child");
        let d = Topology::build("2.2.dom", &e.topology).unwrap();
        assert_eq!(d.nodes[0].neighbours[1].domains, vec![".br".to_string()]);
        assert_eq!(d.nodes[0].neighbours[2].domains, vec!["!.br".to_string()]);
        assert!(Topology::build("5.5", &e.topology)
            .unwrap_err()
            .contains("unknown topology"));
        assert!(Topology::build("0.0", &e.topology).is_err());
    }

    #[test]
    fn custom_graph_errors_name_the_node() {
        let text = r#"
name = "t"
[workload]
[[topology.mine.node]]
name = "a"
peer = [{ name = "b", role = "parent", except_domains = [".br"] }]
[[topology.mine.node]]
name = "b"
clients = false
[[config]]
name = "x"
topology = "mine"
"#;
        let e = Experiment::from_toml(text).unwrap();
        let t = Topology::build("mine", &e.topology).unwrap();
        assert_eq!(t.nodes[0].neighbours[0].domains, vec!["!.br".to_string()]);
        let bad = text.replace("name = \"b\", role", "name = \"z\", role");
        let err = Experiment::from_toml(&bad).unwrap_err().to_string();
        assert!(
            err.contains("config[0].topology") && err.contains("unknown peer \"z\""),
            "{err}"
        );
    }
}
