//! Experiment files: what `meshcache lab run EXPERIMENT.toml` reads.
//!
//! An experiment names a workload, the caches' topology and the
//! configurations to compare; the runner ([`crate::run`]) expands it into
//! runs: every configuration × every workload variant × every product ×
//! every repetition, each with fresh nodes and origins and the same seeds.
//!
//! ```toml
//! name = "icp-overhead"
//! description = "The Summary Cache paper's Table 2: four siblings, no remote hit possible"
//! seed = 1
//! repetitions = 1
//! products = ["meshcache", "squid"]   # every configuration runs once per product
//!
//! [workload]                          # a generator spec (meshcache-workload), or `trace = "FILE"`
//! clients = 40
//! requests_per_client = 100
//! inherent_hit_ratio = 0.25
//! groups = 4
//! disjoint = true
//!
//! [[variant]]                         # optional: workload variants, one table group each
//! name = "45%"
//! workload = { inherent_hit_ratio = 0.45 }
//!
//! [origins]                           # the origin emulators (one per host of the workload)
//! delay = "50ms"
//! cache_control = "max-age=86400"
//!
//! [nodes]                             # every cache node
//! memory = "auto"                     # 10% of the workload's unique bytes over the nodes
//! threads = 1
//!
//! [clients]
//! outstanding = 1                     # per emulated client
//!
//! [[config]]
//! name = "no ICP"
//! topology = "4.0"
//! protocol = "none"
//! baseline = true
//!
//! [[config]]
//! name = "ICP"
//! topology = "4.0"
//! protocol = "icp"
//! ```
//!
//! Topologies: `"N.0"` (N siblings, all with clients), `"3.1"`, `"2.2"`,
//! `"2.2.dom"` (the hierarchy paper's), `"pair"` (a child and its lone
//! parent), or a custom one given as `[[topology.NAME.node]]` tables.
//! Links between parties are emulated by `[[link]]` tables.
//!
//! Parsing is strict: an unknown key is an error naming it, and
//! [`Experiment::validate`] checks the values (names unique, a baseline per
//! group at most, known topologies, sensible numbers) with errors that name
//! the offending key.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::link::LinkConfig;
use crate::origin::OriginConfig;
use crate::topology::{CustomTopology, Topology};

/// An experiment file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Short name, used in file names and reports.
    pub name: String,
    /// One sentence on what it measures.
    #[serde(default)]
    pub description: String,
    /// Base seed of every workload (a variant may add its own).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// How many times every run is repeated (with the same seeds).
    #[serde(default = "one")]
    pub repetitions: u32,
    /// Products every configuration runs with, unless it names its own.
    #[serde(default = "default_products")]
    pub products: Vec<Product>,
    /// The workload: a generator spec (meshcache-workload's) or `trace = "FILE"`.
    pub workload: toml::Table,
    /// Workload variants; without any, the workload runs as given.
    #[serde(default)]
    pub variant: Vec<Variant>,
    /// The origin emulators' behaviour (delay, default Cache-Control, validators).
    #[serde(default)]
    pub origins: OriginConfig,
    /// The origins' port (each origin has its own 127.0.1.x address).
    #[serde(default = "default_origin_port")]
    pub origin_port: u16,
    /// Settings common to every cache node.
    #[serde(default)]
    pub nodes: Nodes,
    /// The emulated clients.
    #[serde(default)]
    pub clients: Clients,
    /// Custom topologies by name.
    #[serde(default)]
    pub topology: BTreeMap<String, CustomTopology>,
    /// Emulated links between parties.
    #[serde(default)]
    pub link: Vec<Link>,
    /// The configurations compared.
    pub config: Vec<RunConfig>,
}

fn default_seed() -> u64 {
    1
}
fn one() -> u32 {
    1
}
fn default_products() -> Vec<Product> {
    vec![Product::Meshcache]
}

/// The cache software of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Product {
    /// This project's proxy.
    Meshcache,
    /// Squid (Debian's `squid` package), driven with a generated squid.conf.
    Squid,
}

impl Product {
    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Product::Meshcache => "meshcache",
            Product::Squid => "squid",
        }
    }
}

/// A workload variant: the base workload with some keys replaced.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Its name: the table group of its runs.
    pub name: String,
    /// Keys that replace the base workload's.
    #[serde(default)]
    pub workload: toml::Table,
}

fn default_origin_port() -> u16 {
    8080
}

/// Settings of every cache node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nodes {
    /// Memory cache per node: a size ("32 MiB"), or "auto": `cache_share` of the workload's
    /// unique bytes, split evenly over the nodes (the hierarchy paper's scaling rule).
    #[serde(default = "auto")]
    pub memory: String,
    /// With `memory = "auto"`: the share of the unique bytes the whole mesh may hold.
    #[serde(default = "default_cache_share")]
    pub cache_share: f64,
    /// Largest object a node stores.
    #[serde(default = "default_max_object")]
    pub max_object_size: String,
    /// Worker threads of each meshcache node (Squid is single-threaded).
    #[serde(default = "one_usize")]
    pub threads: usize,
    /// CPU list the nodes are pinned to (`taskset -c`), e.g. "1"; empty: not pinned.
    #[serde(default)]
    pub cpus: String,
    /// Persistent connections to origins and peers.
    #[serde(default = "yes")]
    pub persistent: bool,
    /// Extra meshcache TOML appended to every meshcache node's config.
    #[serde(default)]
    pub meshcache_extra: String,
    /// Extra squid.conf lines appended to every Squid node's config.
    #[serde(default)]
    pub squid_extra: String,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            memory: auto(),
            cache_share: default_cache_share(),
            max_object_size: default_max_object(),
            threads: 1,
            cpus: String::new(),
            persistent: true,
            meshcache_extra: String::new(),
            squid_extra: String::new(),
        }
    }
}

fn auto() -> String {
    "auto".into()
}
fn default_cache_share() -> f64 {
    0.1
}
fn default_max_object() -> String {
    "8 MiB".into()
}
fn one_usize() -> usize {
    1
}
fn yes() -> bool {
    true
}

/// The emulated clients.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clients {
    /// Outstanding requests per emulated client.
    #[serde(default = "one_usize")]
    pub outstanding: usize,
    /// Pause between a response and the client's next request.
    #[serde(default, with = "humantime_serde")]
    pub think: Option<Duration>,
    /// A request taking longer has failed.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Replay the whole workload once, unmeasured, before the measured replay (the hierarchy
    /// paper's warm-up run).
    #[serde(default)]
    pub warmup_pass: bool,
    /// Stop a measured replay after this long (what was done is reported).
    #[serde(default = "default_deadline", with = "humantime_serde")]
    pub deadline: Duration,
    /// CPU list the lab's clients and origins are pinned to (`taskset -c`), e.g. "0".
    #[serde(default)]
    pub cpus: String,
    /// Replay the whole workload one request at a time, in trace order, each to its client's
    /// node (`outstanding` and `think` do not apply): a run the simulator can reproduce
    /// exactly.
    #[serde(default)]
    pub serial: bool,
    /// Serial replay: the pause after each answer before the next request, so that the nodes'
    /// periodic work (summary and directory upkeep) runs between requests.
    #[serde(default, with = "humantime_serde")]
    pub serial_gap: Option<Duration>,
}

impl Default for Clients {
    fn default() -> Self {
        Clients {
            outstanding: 1,
            think: None,
            timeout: default_timeout(),
            warmup_pass: false,
            deadline: default_deadline(),
            cpus: String::new(),
            serial: false,
            serial_gap: None,
        }
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_deadline() -> Duration {
    Duration::from_secs(600)
}

/// One configuration compared by the experiment.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Its name in tables ("no ICP", "ICP", "2.2.dom").
    pub name: String,
    /// The topology: a built-in name or a custom one.
    pub topology: String,
    /// Cooperation protocol of every node: "none", "icp", "summary" (meshcache only),
    /// "digest", "directory" (meshcache only), "carp" (meshcache only: the nodes split the
    /// URLs by CARP, each a member of the array, the others its parents) or "multicast"
    /// (meshcache only: the Berkeley protocol's multicast search).
    #[serde(default = "none")]
    pub protocol: String,
    /// Summary protocol: share of changed documents that triggers an update (default 0.01).
    #[serde(default)]
    pub summary_threshold: Option<f64>,
    /// Summary and digest protocols: Bloom filter bits per document (default: meshcache's, 8).
    #[serde(default)]
    pub bits_per_entry: Option<u8>,
    /// Digest protocol: how often each node rebuilds its digest (default 60 s).
    #[serde(default, with = "humantime_serde::option")]
    pub digest_period: Option<Duration>,
    /// Directory protocol: holders queried per miss (α; 0 = all; default 1).
    #[serde(default)]
    pub alpha: Option<u32>,
    /// Directory protocol: "requester" (search variant 1, the default) or "owner" (2).
    #[serde(default)]
    pub variant: Option<String>,
    /// Directory protocol: "pessimistic" (the default) or "optimistic" holder entries.
    #[serde(default)]
    pub updates: Option<String>,
    /// Multicast protocol: "auto" (the default: IP multicast on loopback when the kernel
    /// delivers it), "ip" or "logical" (the query unicast to every member). Links between
    /// nodes make it "logical": the group would bypass the emulated link.
    #[serde(default)]
    pub multicast_mode: Option<String>,
    /// The configuration the others are compared with.
    #[serde(default)]
    pub baseline: bool,
    /// Only these products (default: the experiment's `products`).
    #[serde(default)]
    pub products: Vec<Product>,
    /// Persistent upstream connections (default: `[nodes] persistent`).
    #[serde(default)]
    pub persistent: Option<bool>,
    /// ICP-query a lone parent anyway (the trans-Pacific paper's misconfiguration).
    #[serde(default)]
    pub query_lone_parent: bool,
    /// Link names (from `[[link]]`) active in this configuration; default: all.
    #[serde(default)]
    pub links: Option<Vec<String>>,
}

fn none() -> String {
    "none".into()
}

/// An emulated link between two parties of a topology.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Its name (configurations may select links by name).
    pub name: String,
    /// One end: "clients", "origins", or a node name (built-in topologies name nodes
    /// `n0`, `n1`, …; in "pair": `child` and `parent`).
    pub from: String,
    /// The other end.
    pub to: String,
    /// What the link does: `delay`, `jitter`, `loss`, `bandwidth` both ways, with optional
    /// `a_to_b` / `b_to_a` overrides (a = `from`, b = `to`).
    pub profile: LinkConfig,
}

/// What is wrong with an experiment file.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// TOML syntax, an unknown key, or a value of the wrong type.
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// A value that parses but makes no sense.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key, as a path (`config[2].topology`).
        key: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ExperimentError {
    ExperimentError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The built-in topology names.
pub const BUILTIN_TOPOLOGIES: &[&str] = &["3.1", "2.2", "2.2.dom", "pair"];

impl Experiment {
    /// Parses and validates an experiment file's text.
    pub fn from_toml(text: &str) -> Result<Experiment, ExperimentError> {
        let e: Experiment = toml::from_str(text)?;
        e.validate()?;
        Ok(e)
    }

    /// Checks the values; errors name the key.
    pub fn validate(&self) -> Result<(), ExperimentError> {
        if self.name.is_empty() || self.name.contains(['/', ' ']) {
            return Err(invalid("name", "must be non-empty, without spaces or '/'"));
        }
        if self.repetitions == 0 || self.repetitions > 100 {
            return Err(invalid("repetitions", "must be within 1..=100"));
        }
        if self.products.is_empty() {
            return Err(invalid("products", "must name at least one product"));
        }
        if self.config.is_empty() {
            return Err(invalid("config", "at least one [[config]] is needed"));
        }
        self.origins
            .validate()
            .map_err(|e| invalid("origins", e.to_string()))?;
        if self.nodes.memory != "auto" {
            parse_size(&self.nodes.memory).map_err(|e| invalid("nodes.memory", e))?;
        }
        if !(self.nodes.cache_share > 0.0 && self.nodes.cache_share <= 10.0) {
            return Err(invalid("nodes.cache_share", "must be within (0, 10]"));
        }
        parse_size(&self.nodes.max_object_size).map_err(|e| invalid("nodes.max_object_size", e))?;
        if self.nodes.threads == 0 || self.nodes.threads > 64 {
            return Err(invalid("nodes.threads", "must be within 1..=64"));
        }
        if self.clients.outstanding == 0 || self.clients.outstanding > 1000 {
            return Err(invalid("clients.outstanding", "must be within 1..=1000"));
        }
        for (key, list) in [
            ("nodes.cpus", &self.nodes.cpus),
            ("clients.cpus", &self.clients.cpus),
        ] {
            if !list.is_empty() {
                crate::pin::parse_cpu_list(list).map_err(|e| invalid(key, e))?;
            }
        }
        let mut names = HashSet::new();
        for (i, v) in self.variant.iter().enumerate() {
            if !names.insert(v.name.as_str()) {
                return Err(invalid(format!("variant[{i}].name"), "duplicate name"));
            }
        }
        let links: HashSet<&str> = self.link.iter().map(|l| l.name.as_str()).collect();
        if links.len() != self.link.len() {
            return Err(invalid("link", "link names must be unique"));
        }
        for (i, l) in self.link.iter().enumerate() {
            l.profile
                .directions()
                .map_err(|e| invalid(format!("link[{i}].profile"), e.to_string()))?;
            if l.from == l.to {
                return Err(invalid(
                    format!("link[{i}]"),
                    "from and to are the same party",
                ));
            }
        }
        let mut names = HashSet::new();
        for (i, c) in self.config.iter().enumerate() {
            let key = |k: &str| format!("config[{i}].{k}");
            if !names.insert(c.name.as_str()) {
                return Err(invalid(key("name"), format!("duplicate name {:?}", c.name)));
            }
            if !matches!(
                c.protocol.as_str(),
                "none" | "icp" | "summary" | "digest" | "directory" | "carp" | "multicast"
            ) {
                return Err(invalid(
                    key("protocol"),
                    format!(
                        "unknown protocol {:?} (known: none, icp, summary, digest, directory, carp, multicast)",
                        c.protocol
                    ),
                ));
            }
            if c.variant
                .as_deref()
                .is_some_and(|v| !matches!(v, "requester" | "owner"))
            {
                return Err(invalid(
                    key("variant"),
                    "must be \"requester\" or \"owner\"",
                ));
            }
            if c.multicast_mode
                .as_deref()
                .is_some_and(|v| !matches!(v, "auto" | "ip" | "logical"))
            {
                return Err(invalid(
                    key("multicast_mode"),
                    "must be \"auto\", \"ip\" or \"logical\"",
                ));
            }
            if c.updates
                .as_deref()
                .is_some_and(|v| !matches!(v, "pessimistic" | "optimistic"))
            {
                return Err(invalid(
                    key("updates"),
                    "must be \"pessimistic\" or \"optimistic\"",
                ));
            }
            let products = if c.products.is_empty() {
                &self.products
            } else {
                &c.products
            };
            if c.protocol == "summary" && products.contains(&Product::Squid) {
                return Err(invalid(
                    key("products"),
                    "Squid does not speak Summary Cache (SC-ICP): give this config products = [\"meshcache\"]",
                ));
            }
            if matches!(c.protocol.as_str(), "directory" | "carp" | "multicast")
                && products.contains(&Product::Squid)
            {
                return Err(invalid(
                    key("products"),
                    format!(
                        "the lab runs {:?} on meshcache nodes only: give this config products = [\"meshcache\"]",
                        c.protocol
                    ),
                ));
            }
            if c.summary_threshold
                .is_some_and(|t| !(0.001..=0.1).contains(&t))
            {
                return Err(invalid(key("summary_threshold"), "must be 0.001 to 0.1"));
            }
            if c.digest_period.is_some_and(|d| d < Duration::from_secs(1)) {
                return Err(invalid(key("digest_period"), "must be at least 1s"));
            }
            let topo = Topology::build(&c.topology, &self.topology)
                .map_err(|reason| invalid(key("topology"), reason))?;
            let parties = |p: &str| {
                p == "clients" || p == "origins" || topo.nodes.iter().any(|n| n.name == p)
            };
            for l in &self.link {
                let active = c.links.as_ref().is_none_or(|sel| sel.contains(&l.name));
                for end in [&l.from, &l.to] {
                    if active && !parties(end) {
                        return Err(invalid(
                            key("links"),
                            format!(
                                "link {:?} names {end:?}, which is not a node of topology {:?} \
                                 (nor \"clients\" or \"origins\")",
                                l.name, c.topology
                            ),
                        ));
                    }
                }
            }
            // The run would refuse it only when it comes to this configuration.
            let node = |p: &str| topo.nodes.iter().any(|n| n.name == p);
            if c.multicast_mode.as_deref() == Some("ip")
                && self.link.iter().any(|l| {
                    c.links.as_ref().is_none_or(|sel| sel.contains(&l.name))
                        && node(&l.from)
                        && node(&l.to)
                })
            {
                return Err(invalid(
                    key("multicast_mode"),
                    "\"ip\" with a link between two nodes: the group would bypass the link \
                     (leave it \"auto\" or make it \"logical\")",
                ));
            }
            if let Some(sel) = &c.links {
                for l in sel {
                    if !links.contains(l.as_str()) {
                        return Err(invalid(key("links"), format!("no [[link]] named {l:?}")));
                    }
                }
            }
        }
        if self.config.iter().filter(|c| c.baseline).count() > 1 {
            return Err(invalid(
                "config",
                "at most one configuration may be the baseline",
            ));
        }
        Ok(())
    }

    /// The workload spec of a variant (`None`: the base workload).
    pub fn workload_for(&self, variant: Option<&Variant>) -> toml::Table {
        let mut w = self.workload.clone();
        if let Some(v) = variant {
            for (k, val) in &v.workload {
                w.insert(k.clone(), val.clone());
            }
        }
        w
    }
}

/// Parses "32 MiB", "1 MB", "4096".
pub fn parse_size(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{text:?} is not a size: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_config(config: &str) -> Result<Experiment, ExperimentError> {
        Experiment::from_toml(&format!(
            "name = \"x\"\nproducts = [\"meshcache\"]\n[workload]\nmodel = \"benchmark\"\n\n[[config]]\nname = \"c\"\ntopology = \"4.0\"\n{config}\n"
        ))
    }

    #[test]
    fn multicast_is_a_meshcache_protocol_with_a_mode() {
        let e =
            with_config("protocol = \"multicast\"\nmulticast_mode = \"logical\"").expect("valid");
        assert_eq!(e.config[0].multicast_mode.as_deref(), Some("logical"));
        let err = with_config("protocol = \"multicast\"\nmulticast_mode = \"sometimes\"")
            .expect_err("unknown mode")
            .to_string();
        assert!(err.contains("multicast_mode"), "{err}");
        let err = with_config("protocol = \"multicast\"\nproducts = [\"squid\"]")
            .expect_err("meshcache only")
            .to_string();
        assert!(err.contains("products"), "{err}");
    }

    #[test]
    fn ip_multicast_across_a_link_between_nodes_is_refused_when_read() {
        let link =
            "[[link]]\nname = \"l\"\nfrom = \"n0\"\nto = \"n1\"\nprofile = { delay = \"1ms\" }\n";
        let file = |mode: &str, links: &str| {
            format!(
                "name = \"x\"\n[workload]\nmodel = \"benchmark\"\n{link}\n[[config]]\nname = \"c\"\n\
                 topology = \"4.0\"\nprotocol = \"multicast\"\nmulticast_mode = \"{mode}\"\n{links}\n"
            )
        };
        let err = Experiment::from_toml(&file("ip", ""))
            .expect_err("ip across a link")
            .to_string();
        assert!(err.contains("config[0].multicast_mode"), "{err}");
        Experiment::from_toml(&file("logical", "")).expect("logical is fine");
        Experiment::from_toml(&file("ip", "links = []")).expect("no link in use");
    }

    #[test]
    fn cpu_lists_are_checked_when_read() {
        let with = |section: &str| {
            Experiment::from_toml(&format!(
                "name = \"x\"\n[workload]\nmodel = \"benchmark\"\n{section}\n\n[[config]]\nname = \"c\"\ntopology = \"4.0\"\n"
            ))
        };
        let e = with("[nodes]\ncpus = \"1\"\n[clients]\ncpus = \"0\"").expect("valid");
        assert_eq!((e.nodes.cpus.as_str(), e.clients.cpus.as_str()), ("1", "0"));
        for (section, key) in [
            ("[nodes]\ncpus = \"one\"", "nodes.cpus"),
            ("[clients]\ncpus = \"1-0\"", "clients.cpus"),
        ] {
            let err = with(section).expect_err(section).to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
