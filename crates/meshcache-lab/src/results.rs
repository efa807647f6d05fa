//! What an experiment measured: the data model behind `results.json`, the
//! Markdown tables and the graphs ([`crate::report`]).
//!
//! One [`Results`] per `lab run`; one [`ConfigResult`] per configuration
//! (topology × product × protocol × workload variant) and repetition; one
//! [`NodeResult`] per cache node in it. Every figure is over the measured
//! phase only (after the warm-up), and per-request figures divide by the
//! requests the clients completed in that phase.

use serde::{Deserialize, Serialize};

/// Everything one `lab run` produced.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// The experiment's name (from its file).
    pub experiment: String,
    /// The experiment file's text, verbatim.
    pub experiment_toml: String,
    /// `git describe --always --dirty` of the tree the binary was built from, if known.
    pub revision: String,
    /// The base seed every workload was generated from.
    pub seed: u64,
    /// When the run started (RFC 3339, UTC).
    pub started: String,
    /// Wall-clock seconds the whole run took.
    pub duration_s: f64,
    /// The machine: CPU model, cores, kernel, and whether the run was in its own network namespace.
    pub machine: Machine,
    /// One entry per configuration and repetition, in the order run.
    pub configs: Vec<ConfigResult>,
    /// True when the configurations were measured at the same time (`lab run --concurrent`:
    /// one process per configuration, each in a network namespace of its own, every pass of
    /// each starting with the same pass of the others).
    #[serde(default)]
    pub concurrent: bool,
}

/// Where the run happened.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` from /proc/cpuinfo.
    pub cpu: String,
    /// Online cores.
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// True when the run had a network namespace of its own (UDP/TCP counters are then its own).
    pub own_netns: bool,
    /// Steal time during the measured phases, % of one core (from /proc/stat).
    pub steal_pct: f64,
}

/// One configuration's measurement.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConfigResult {
    /// The configuration's name, e.g. `"meshcache/icp/25%"`.
    pub name: String,
    /// The group this row is compared within (Table 2 puts one group's rows together).
    pub group: String,
    /// Whether this row is its group's baseline (overheads are relative to it).
    pub baseline: bool,
    /// `"meshcache"` or `"squid"`.
    pub product: String,
    /// The cooperation protocol (`none`, `icp`, …).
    pub protocol: String,
    /// The topology's name (`4.0`, `3.1`, `2.2`, `2.2.dom`, or the experiment's own).
    pub topology: String,
    /// Repetition number, from 0.
    pub repetition: u32,
    /// The seed of this configuration's workload.
    pub seed: u64,
    /// Requests the clients completed in the measured phase (errors excluded).
    pub requests: u64,
    /// Requests that failed (connection error, timeout, 5xx from the proxy).
    pub errors: u64,
    /// Seconds the measured phase took.
    pub wall_s: f64,
    /// Completed requests per second.
    pub req_per_s: f64,
    /// Share of requests answered from a cache of the mesh (local + sibling + parent).
    pub hit_ratio: f64,
    /// Share answered by the client's own cache.
    pub local_hit_ratio: f64,
    /// Share answered from a sibling's cache.
    pub sibling_hit_ratio: f64,
    /// Share answered from a parent's cache.
    pub parent_hit_ratio: f64,
    /// Share of body bytes answered from a cache of the mesh.
    pub byte_hit_ratio: f64,
    /// Requests the origins received during the measured pass (every miss of the mesh, and
    /// nothing else: a check on the hit ratios).
    #[serde(default)]
    pub origin_requests: u64,
    /// The workload's inherent hit ratio (the share of requests that re-reference a URL).
    pub inherent_hit_ratio: f64,
    /// Client-side latency.
    pub latency_ms: LatencySummary,
    /// Client-side latency distribution: (milliseconds, cumulative share) points, for plots.
    pub latency_cdf: Vec<(f64, f64)>,
    /// Latency histogram in the trans-Pacific paper's 0.25 s bins: (bin upper edge in s, count).
    pub latency_bins: Vec<(f64, u64)>,
    /// User CPU seconds of all cache nodes together.
    pub cpu_user_s: f64,
    /// System CPU seconds of all cache nodes together.
    pub cpu_sys_s: f64,
    /// User plus system CPU seconds of all cache nodes together, to the nanosecond (see
    /// [`NodeResult::cpu_exact_s`]); `None` when any node's is. Over repetitions, the median.
    #[serde(default)]
    pub cpu_exact_s: Option<f64>,
    /// The cache nodes' context switches (voluntary and involuntary) per client request.
    #[serde(default)]
    pub context_switches_per_request: f64,
    /// UDP datagrams sent plus received by the cache nodes.
    pub udp_messages: u64,
    /// UDP datagrams sent plus received in the whole namespace (when `own_netns`; a check on
    /// `udp_messages`).
    #[serde(default)]
    pub udp_datagrams_netns: u64,
    /// TCP segments sent plus received by the cache nodes (their sockets' own counters, see
    /// `tcpcount`); when those are not available, `tcp_segments_netns`.
    pub tcp_messages: u64,
    /// TCP segments sent plus received in the whole namespace (clients and origins included;
    /// when `own_netns`, else the host's too).
    #[serde(default)]
    pub tcp_segments_netns: u64,
    /// Whether `tcp_messages` and the nodes' TCP figures are per node (sock_diag worked).
    #[serde(default)]
    pub tcp_per_node: bool,
    /// Inter-cache messages (queries, replies, peer HTTP requests) per client request.
    pub intercache_messages_per_request: f64,
    /// Inter-cache protocol messages per client request: the messages above less the object
    /// transfers that brought a client a hit from another cache (which every cooperating
    /// protocol needs alike). What is left is the cost of finding hits: ICP queries and
    /// replies, summary updates, summary and digest fetches, false-hit requests — the
    /// Summary Cache paper's measure. (In a hierarchy with parents, the misses a parent
    /// resolves also count here.)
    #[serde(default)]
    pub protocol_messages_per_request: f64,
    /// Bytes of inter-cache protocol messages per client request: ICP and summary-update
    /// datagrams sent, plus whole summaries or digests served (not the objects peers fetch,
    /// which every protocol moves alike).
    #[serde(default)]
    pub intercache_bytes_per_request: f64,
    /// Summary and digest protocols: lookups in peers' summaries, the hits among them, and
    /// the false hits; the observed false-positive rate and the Bloom formula's.
    #[serde(default)]
    pub summary: Option<SummaryFigures>,
    /// Computational efficiency (the hierarchy paper's, from the requestor's perspective): of
    /// the CPU time of the nodes that serve clients, the share spent serving them.
    pub efficiency: f64,
    /// Per node.
    pub nodes: Vec<NodeResult>,
}

/// Client latency in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Mean of all requests.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean of the requests that took under 5 s (the trans-Pacific paper's truncated average).
    pub truncated_mean: f64,
    /// Share of requests under 5 s.
    pub truncated_share: f64,
    /// Mean of the requests that took 5 s or more (0 when there are none).
    pub tail_mean: f64,
}

/// One cache node's figures over the measured phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeResult {
    /// The node's name.
    pub name: String,
    /// Its role in the topology: `child`, `sibling`, `parent`.
    pub role: String,
    /// Client requests it received (from the emulated clients).
    pub client_requests: u64,
    /// Its clients' hits answered locally / by a sibling / by a parent, and misses.
    pub local_hits: u64,
    /// See `local_hits`.
    pub sibling_hits: u64,
    /// See `local_hits`.
    pub parent_hits: u64,
    /// Body bytes its clients received.
    #[serde(default)]
    pub client_bytes: u64,
    /// Body bytes of its clients' hits (local, sibling or parent): over `client_bytes`, the
    /// node's byte hit ratio.
    #[serde(default)]
    pub hit_bytes: u64,
    /// Its clients' latency (`None` for a node without clients). Over repetitions, each
    /// figure's median.
    #[serde(default)]
    pub latency_ms: Option<LatencySummary>,
    /// User CPU seconds.
    pub cpu_user_s: f64,
    /// System CPU seconds.
    pub cpu_sys_s: f64,
    /// User plus system CPU seconds from the scheduler's nanosecond account of its threads
    /// (`cpu_user_s` and `cpu_sys_s` come in 10 ms ticks); `None` when a thread exited during
    /// the measured pass, taking its time with it.
    #[serde(default)]
    pub cpu_exact_s: Option<f64>,
    /// Context switches of its threads (those alive at both readings), voluntary: each a wait
    /// for a socket, a timer or a lock, and the wake-up after it.
    #[serde(default)]
    pub switches_voluntary: u64,
    /// ... and involuntary (its core given to another thread).
    #[serde(default)]
    pub switches_involuntary: u64,
    /// ICP (or other inter-cache UDP) datagrams sent.
    pub udp_sent: u64,
    /// Inter-cache UDP datagrams received.
    pub udp_received: u64,
    /// TCP segments its sockets sent (clients, peers and origins alike); `None` when the run
    /// could not count per node.
    #[serde(default)]
    pub tcp_sent: Option<u64>,
    /// TCP segments its sockets received.
    #[serde(default)]
    pub tcp_received: Option<u64>,
    /// CPU seconds spent serving its clients' requests (meshcache's instrumentation; 0 for Squid).
    pub client_s: f64,
    /// CPU seconds spent serving peers (their HTTP requests and queries).
    pub peer_s: f64,
    /// CPU seconds spent on its own searches (queries sent, replies received).
    pub search_s: f64,
    /// The rest of its CPU time: client_s + peer_s + search_s + overhead_s = user + sys.
    pub overhead_s: f64,
}

/// How the summaries did (summary and digest protocols, meshcache nodes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SummaryFigures {
    /// Lookups of misses in peers' summaries.
    pub lookups: u64,
    /// Lookups a summary answered "maybe".
    pub summary_hits: u64,
    /// Summary hits the peer did not have.
    pub false_hits: u64,
    /// False hits over lookups of objects the peer did not hold.
    pub observed_fp_rate: f64,
    /// The Bloom formula's rate for the summaries' size and documents, weighted by lookups.
    pub formula_fp_rate: f64,
    /// Summary memory per cached document, bytes: each node's counting filter plus its copies
    /// of the peers' arrays, over the documents in its own summary (averaged over nodes).
    pub memory_per_object: f64,
}
