//! What a simulation runs: the mesh, its caches, the protocol, the network and host model, and
//! how the trace is replayed. A [`SimSpec`] is read from TOML (strict: unknown keys are
//! errors) or built in code; [`SimSpec::validate`] names the first bad value.

use std::time::Duration;

use bytesize::ByteSize;
use meshcache_store::Replacement;
use serde::{Deserialize, Serialize};

/// How α directory holders are picked (`meshcache_dcm::directory::Choice`).
pub use meshcache_dcm::directory::Choice as DirChoice;
/// Which directory entries make room (`meshcache_dcm::directory::Flush`).
pub use meshcache_dcm::directory::Flush as DirFlush;
/// When directory holders are entered (`meshcache_dcm::directory::UpdateMode`).
pub use meshcache_dcm::directory::UpdateMode as DirUpdateMode;
/// Directory search variant (`meshcache_dcm::directory::Variant`).
pub use meshcache_dcm::directory::Variant as DirVariant;
/// How multicast queries reach the members (`meshcache_dcm::multicast::Mode`).
pub use meshcache_dcm::multicast::Mode as MulticastMode;

/// A bad simulation parameter, named.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{key}: {reason}")]
pub struct SpecError {
    /// The parameter, as written in the TOML (`mesh.caches`, `net.latency`…).
    pub key: String,
    /// What is wrong with its value.
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> SpecError {
    SpecError {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// Everything one simulation run needs besides the trace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimSpec {
    /// The caches and how they are connected.
    pub mesh: MeshSpec,
    /// The cooperation protocol and its parameters.
    pub protocol: ProtocolSpec,
    /// Link latencies and bandwidths, and per-message CPU costs.
    pub net: NetSpec,
    /// How the trace's requests are issued.
    pub replay: ReplaySpec,
}

/// The caches, their stores and their relations.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeshSpec {
    /// Leaf caches, the ones clients talk to (client `c` goes to cache `c mod caches`, as the
    /// Summary Cache paper's benchmark assigns clients).
    pub caches: u32,
    /// Whether the leaf caches are each other's siblings.
    pub siblings: bool,
    /// Parent caches above the leaves (every leaf lists every parent).
    pub parents: u32,
    /// Per parent, the domains it serves (Squid's `cache_peer_domain`); empty: every parent
    /// serves every host. When given, one list per parent.
    pub parent_domains: Vec<Vec<String>>,
    /// Each leaf cache's store size.
    pub cache_size: ByteSize,
    /// Each parent's store size.
    pub parent_size: ByteSize,
    /// Largest object a cache keeps.
    pub max_object_size: ByteSize,
    /// Replacement policy of every store.
    pub replacement: Replacement,
    /// Which cache a client's request goes to (the DCM framework's admission algorithm).
    pub admission: Admission,
}

/// The admission algorithm: to which leaf cache (the "master cache") a request goes.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Each client has one cache, client `c` cache `c mod caches` (Squid's browsers; the
    /// Summary Cache paper's benchmark assigns client groups so).
    #[default]
    Client,
    /// Each request picks a cache at random (the Berkeley protocol's clients), the same in
    /// every run of one trace: a hash of the request's place in the trace.
    Random,
}

impl Default for MeshSpec {
    fn default() -> Self {
        MeshSpec {
            caches: 4,
            siblings: true,
            parents: 0,
            parent_domains: Vec::new(),
            cache_size: ByteSize::mib(256),
            parent_size: ByteSize::gib(1),
            max_object_size: ByteSize::mib(8),
            replacement: Replacement::Lru,
            admission: Admission::Client,
        }
    }
}

/// Which cooperation protocol the caches run.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// No search: misses go to the parents or the origin.
    None,
    /// ICP: query every sibling (and parents, when more than one) on every miss.
    #[default]
    Icp,
    /// Summary Cache: ICP queries only to the peers whose Bloom-filter summary says "maybe",
    /// one at a time; summaries updated by delta messages.
    Summary,
    /// Squid's Cache Digests: whole digests fetched periodically, no queries.
    Digest,
    /// The directory-based protocol (dbDCM).
    Directory,
    /// The Berkeley protocol: one multicast query, answered by holders only.
    Multicast,
    /// CARP hash routing over the parents (or among the leaves, with no parents).
    Carp,
}

impl Protocol {
    /// Every protocol, in the order reports list them.
    pub const ALL: [Protocol; 7] = [
        Protocol::None,
        Protocol::Icp,
        Protocol::Summary,
        Protocol::Digest,
        Protocol::Directory,
        Protocol::Multicast,
        Protocol::Carp,
    ];

    /// Its name, as written in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::None => "none",
            Protocol::Icp => "icp",
            Protocol::Summary => "summary",
            Protocol::Digest => "digest",
            Protocol::Directory => "directory",
            Protocol::Multicast => "multicast",
            Protocol::Carp => "carp",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown protocol {s:?} (one of: {})",
                    Protocol::ALL.map(Protocol::as_str).join(", ")
                )
            })
    }
}

/// How the simulator carries an ICP search's queries and replies.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IcpModel {
    /// One event per datagram, each handled by the nodes' `IcpMesh` as the proxy handles it.
    #[default]
    Datagrams,
    /// A search's datagrams worked out together when it starts, and of a multicast group
    /// query only the copy to the first holder to answer delivered as an event
    /// (the simulator's `fanout.rs`).
    Aggregate,
}

/// The protocol and its tuning (each protocol reads its own fields; the rest are ignored).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProtocolSpec {
    /// Which protocol.
    pub name: Protocol,
    /// ICP: `datagrams` (every query and reply an event, through the node's `IcpMesh`) or
    /// `aggregate` (a search's datagrams worked out together: the same counts and routes,
    /// tens of times faster on large meshes; see docs/simulator.md for what it approximates).
    /// Multicast's group queries follow it too: in `aggregate`, only the copy to the holder
    /// whose HIT comes first is an event.
    pub icp_model: IcpModel,
    /// ICP: shortest wait for replies.
    #[serde(with = "humantime_serde")]
    pub icp_timeout_floor: Duration,
    /// ICP: longest wait for replies.
    #[serde(with = "humantime_serde")]
    pub icp_timeout_ceiling: Duration,
    /// ICP: a peer silent this long after a query is not waited for.
    #[serde(with = "humantime_serde")]
    pub dead_peer_timeout: Duration,
    /// Summary Cache: share of new documents that triggers a delta update (the paper's
    /// threshold; 1 % by default).
    pub summary_threshold: f64,
    /// Summary Cache and digests: filter bits per cached document (the proxy's
    /// `summary_bits_per_entry`; 1 to 32).
    pub bits_per_entry: u32,
    /// Summary Cache and digests: hash functions, each 32 bits of the MD5 store key (the
    /// proxy's `summary_hash_functions`; digests need 4, as Squid's).
    pub summary_hash_functions: u16,
    /// Summary Cache and digests: documents the filter is first sized for; 0 sizes it from the
    /// store (`mesh.cache_size`, or `parent_size`) at 13 KiB an object, at least 100 (the
    /// proxy's `summary_capacity`). It is resized as the store grows, as in the proxy.
    pub summary_capacity: u32,
    /// Digests: how often a node rebuilds its digest (served with this as its lifetime) and the
    /// longest it keeps a peer's before fetching it again (the proxy's
    /// `digest_rebuild_period`; at least 1 s).
    #[serde(with = "humantime_serde")]
    pub digest_interval: Duration,
    /// Directory: how many holders a search asks at most (α); 0: every holder the entry
    /// lists (the proxy's `directory_alpha`).
    pub directory_alpha: u32,
    /// Directory: `requester` (search variant 1: the owner returns the holders and the
    /// requester queries them) or `owner` (variant 2: the owner queries them on the
    /// requester's behalf).
    pub directory_variant: DirVariant,
    /// Directory: `pessimistic` (a holder is entered once it stored the object) or
    /// `optimistic` (at lookup time, taken back if nothing was stored).
    pub directory_updates: DirUpdateMode,
    /// Directory: how α holders are picked among more: `round_robin` or `random`.
    pub directory_choice: DirChoice,
    /// Directory: a holder record not renewed for this long is dropped (every node announces
    /// its whole store again every half of it).
    #[serde(with = "humantime_serde")]
    pub directory_ttl: Duration,
    /// Directory: memory for each node's share of the directory (128 bytes an entry).
    pub directory_memory: ByteSize,
    /// Directory: which entries make room when a share is full: `lru` or `lfu`.
    pub directory_flush: DirFlush,
    /// Multicast: `ip` (one datagram to the group per search, which every node receives: what
    /// the proxy's `auto` settles on where the network carries the group) or `logical` (the
    /// query unicast to each member).
    pub multicast_mode: MulticastMode,
    /// Multicast: shortest wait for a HIT (the wait adapts to the members' HIT round trips, up
    /// to `icp_timeout_ceiling`; every miss waits it out).
    #[serde(with = "humantime_serde")]
    pub multicast_timeout_floor: Duration,
}

impl Default for ProtocolSpec {
    fn default() -> Self {
        let directory = meshcache_dcm::directory::DirectoryConfig::default();
        ProtocolSpec {
            name: Protocol::Icp,
            icp_model: IcpModel::Datagrams,
            icp_timeout_floor: Duration::from_millis(50),
            icp_timeout_ceiling: Duration::from_secs(2),
            dead_peer_timeout: Duration::from_secs(10),
            summary_threshold: 0.01,
            bits_per_entry: 8,
            summary_hash_functions: 4,
            summary_capacity: 0,
            digest_interval: Duration::from_secs(300),
            directory_alpha: directory.alpha,
            directory_variant: directory.variant,
            directory_updates: directory.mode,
            directory_choice: directory.choice,
            directory_ttl: directory.ttl,
            directory_memory: ByteSize::b(meshcache_dcm::directory::DEFAULT_MEMORY),
            directory_flush: directory.flush,
            multicast_mode: MulticastMode::Ip,
            multicast_timeout_floor: Duration::from_millis(20),
        }
    }
}

/// The network and host model. Defaults: the bandwidths and packet sizes of Table 1 of the
/// directory-based DCM paper (proxy hosts 100 Mb/s, clients 10 Mb/s, origin servers 100 Mb/s,
/// a 1 Gb/s network between proxies); latencies of a campus LAN and a distant origin; CPU
/// costs calibrated on meshcache (docs/simulator.md says from which measurements).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetSpec {
    /// One-way latency between two proxies.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// One-way latency between a client and its proxy.
    #[serde(with = "humantime_serde")]
    pub client_latency: Duration,
    /// One-way latency between a proxy and an origin server.
    #[serde(with = "humantime_serde")]
    pub origin_latency: Duration,
    /// Bandwidth of a proxy host's interface, bits per second.
    pub proxy_bandwidth: u64,
    /// Bandwidth of a client, bits per second.
    pub client_bandwidth: u64,
    /// Bandwidth of an origin server, bits per second.
    pub origin_bandwidth: u64,
    /// Cross-sectional bandwidth of the network between proxies, bits per second (one shared
    /// link every inter-cache message crosses; 0: unlimited).
    pub network_bandwidth: u64,
    /// Origin server hosts (a URL's host name picks one by hash).
    pub origin_servers: u32,
    /// CPU to handle one HTTP request at a proxy (as server or as client of a peer).
    #[serde(with = "humantime_serde")]
    pub cpu_request: Duration,
    /// CPU per KiB of body a proxy relays.
    #[serde(with = "humantime_serde")]
    pub cpu_per_kib: Duration,
    /// CPU to send or to receive one datagram.
    #[serde(with = "humantime_serde")]
    pub cpu_datagram: Duration,
    /// Bytes of HTTP request and response headers, added to every HTTP exchange.
    pub http_header_bytes: u64,
}

impl Default for NetSpec {
    fn default() -> Self {
        NetSpec {
            latency: Duration::from_micros(500),
            client_latency: Duration::from_millis(1),
            origin_latency: Duration::from_millis(50),
            proxy_bandwidth: 100_000_000,
            client_bandwidth: 10_000_000,
            origin_bandwidth: 100_000_000,
            network_bandwidth: 1_000_000_000,
            origin_servers: 3,
            cpu_request: Duration::from_micros(10),
            cpu_per_kib: Duration::from_nanos(80),
            cpu_datagram: Duration::from_micros(5),
            http_header_bytes: 300,
        }
    }
}

impl NetSpec {
    /// Everything instantaneous and free: only the order of events matters (the exact
    /// comparison with a live one-request-at-a-time run uses this).
    pub fn instant() -> Self {
        NetSpec {
            latency: Duration::ZERO,
            client_latency: Duration::ZERO,
            origin_latency: Duration::ZERO,
            proxy_bandwidth: 0,
            client_bandwidth: 0,
            origin_bandwidth: 0,
            network_bandwidth: 0,
            origin_servers: 1,
            cpu_request: Duration::ZERO,
            cpu_per_kib: Duration::ZERO,
            cpu_datagram: Duration::ZERO,
            http_header_bytes: 0,
        }
    }
}

/// How requests are issued.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Replay {
    /// Each request at its trace time (open loop).
    Timed,
    /// Each client issues its next request when the previous one is answered (closed loop;
    /// trace times ignored), as the lab's emulated clients do.
    #[default]
    Closed,
    /// One request at a time over the whole trace, in trace order: each starts when the one
    /// before is answered and the mesh is quiet.
    Serial,
}

/// Replay settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplaySpec {
    /// Open loop, closed loop, or one at a time.
    pub mode: Replay,
    /// Replay only the first `limit` requests (0: all).
    pub limit: u64,
    /// Closed loop: requests each client keeps outstanding.
    pub outstanding: u32,
    /// The first `warmup` requests of the trace are replayed first and not measured (every
    /// counter starts after them), as a lab run's pre-warm round is: each client's in order,
    /// the clients at once; the measured replay starts when the mesh is quiet.
    pub warmup: u64,
    /// Serial replay: the pause between the mesh going quiet and the next request, in which
    /// the protocols' timers run — the lab's `[clients] serial_gap`.
    #[serde(with = "humantime_serde")]
    pub serial_gap: Duration,
}

impl Default for ReplaySpec {
    fn default() -> Self {
        ReplaySpec {
            mode: Replay::Closed,
            limit: 0,
            outstanding: 1,
            warmup: 0,
            serial_gap: Duration::ZERO,
        }
    }
}

/// A value given on the command line (`--set KEY=VALUE`): a TOML value (`64`, `"1 GiB"`,
/// `true`), or else the text itself as a string (`summary`, `20KiB`).
pub fn toml_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.trim().to_owned()))
}

impl SimSpec {
    /// Parses a spec from TOML; unknown keys are errors.
    pub fn from_toml(text: &str) -> Result<SimSpec, String> {
        let spec: SimSpec = toml::from_str(text).map_err(|e| e.to_string())?;
        spec.validate().map_err(|e| e.to_string())?;
        Ok(spec)
    }

    /// Checks every value; the error names the first bad one.
    pub fn validate(&self) -> Result<(), SpecError> {
        let m = &self.mesh;
        if m.caches == 0 {
            return Err(bad("mesh.caches", "at least one cache"));
        }
        if m.caches > 100_000 {
            return Err(bad("mesh.caches", "at most 100000"));
        }
        if m.siblings && m.caches > 10_000 {
            return Err(bad(
                "mesh.caches",
                "at most 10000 siblings: a full mesh keeps N × (N − 1) peer entries",
            ));
        }
        if m.parents > 1_000 {
            return Err(bad("mesh.parents", "at most 1000"));
        }
        if !m.parent_domains.is_empty() && m.parent_domains.len() != m.parents as usize {
            return Err(bad(
                "mesh.parent_domains",
                format!(
                    "{} lists for {} parents: give one list per parent",
                    m.parent_domains.len(),
                    m.parents
                ),
            ));
        }
        if m.cache_size.as_u64() == 0 {
            return Err(bad("mesh.cache_size", "must be above 0"));
        }
        if m.parents > 0 && m.parent_size.as_u64() == 0 {
            return Err(bad("mesh.parent_size", "must be above 0"));
        }
        if m.max_object_size.as_u64() == 0 {
            return Err(bad("mesh.max_object_size", "must be above 0"));
        }
        let p = &self.protocol;
        if p.icp_timeout_floor > p.icp_timeout_ceiling {
            return Err(bad(
                "protocol.icp_timeout_floor",
                "above protocol.icp_timeout_ceiling",
            ));
        }
        if !(p.summary_threshold > 0.0 && p.summary_threshold <= 1.0) {
            return Err(bad("protocol.summary_threshold", "must be in (0, 1]"));
        }
        if !(1..=32).contains(&p.bits_per_entry) {
            return Err(bad("protocol.bits_per_entry", "must be 1 to 32"));
        }
        if !(1..=32).contains(&p.summary_hash_functions) {
            return Err(bad("protocol.summary_hash_functions", "must be 1 to 32"));
        }
        if p.name == Protocol::Digest && p.summary_hash_functions != 4 {
            return Err(bad(
                "protocol.summary_hash_functions",
                "must be 4 with the digest protocol (Squid's Cache Digests use 4)",
            ));
        }
        if p.digest_interval < Duration::from_secs(1) {
            return Err(bad("protocol.digest_interval", "must be at least 1s"));
        }
        use meshcache_dcm::directory::{BadSetting, DirectoryConfig};
        if let Err(why) = DirectoryConfig::check(p.directory_ttl, p.directory_memory.as_u64()) {
            let key = match why {
                BadSetting::Ttl => "protocol.directory_ttl",
                BadSetting::Memory => "protocol.directory_memory",
            };
            return Err(bad(key, why.reason()));
        }
        if p.multicast_timeout_floor < Duration::from_millis(1) {
            return Err(bad(
                "protocol.multicast_timeout_floor",
                "must be at least 1ms",
            ));
        }
        if p.multicast_timeout_floor > p.icp_timeout_ceiling {
            return Err(bad(
                "protocol.multicast_timeout_floor",
                "above protocol.icp_timeout_ceiling",
            ));
        }
        if p.name == Protocol::Carp && m.parents == 0 && !m.siblings {
            return Err(bad(
                "protocol.name",
                "carp needs parents, or leaf caches that are siblings (a mesh of equals)",
            ));
        }
        if !(1..=100_000).contains(&self.net.origin_servers) {
            return Err(bad("net.origin_servers", "1 to 100000"));
        }
        if self.replay.mode == Replay::Closed && !(1..=1_000).contains(&self.replay.outstanding) {
            return Err(bad("replay.outstanding", "1 to 1000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = SimSpec::from_toml("[mesh]\ncaches = 4\nsize = 3\n").unwrap_err();
        assert!(e.contains("unknown field `size`"), "{e}");
        let e = SimSpec::from_toml("[mesh]\ncaches = 0\n").unwrap_err();
        assert_eq!(e, "mesh.caches: at least one cache");
        let e = SimSpec::from_toml("[protocol]\nname = \"gossip\"\n").unwrap_err();
        assert!(e.contains("unknown variant `gossip`"), "{e}");
        let e =
            SimSpec::from_toml("[mesh]\nparents = 2\nparent_domains = [[\"a\"]]\n").unwrap_err();
        assert!(
            e.starts_with("mesh.parent_domains: 1 lists for 2 parents"),
            "{e}"
        );
    }

    #[test]
    fn human_units_parse() {
        let s = SimSpec::from_toml(
            "[mesh]\ncaches = 100\ncache_size = \"64 MiB\"\n[net]\nlatency = \"2ms\"\n\
             [protocol]\nname = \"summary\"\n",
        )
        .unwrap();
        assert_eq!(s.mesh.cache_size, ByteSize::mib(64));
        assert_eq!(s.net.latency, Duration::from_millis(2));
        assert_eq!(s.protocol.name, Protocol::Summary);
    }

    #[test]
    fn the_icp_model_is_chosen_by_name() {
        assert_eq!(SimSpec::default().protocol.icp_model, IcpModel::Datagrams);
        let s = SimSpec::from_toml("[protocol]\nicp_model = \"aggregate\"\n").unwrap();
        assert_eq!(s.protocol.icp_model, IcpModel::Aggregate);
        let e = SimSpec::from_toml("[protocol]\nicp_model = \"fast\"\n").unwrap_err();
        assert!(e.contains("unknown variant `fast`"), "{e}");
    }

    #[test]
    fn directory_and_multicast_settings() {
        let s = SimSpec::from_toml(
            "[protocol]\nname = \"directory\"\ndirectory_alpha = 0\n\
             directory_variant = \"owner\"\ndirectory_updates = \"optimistic\"\n\
             directory_choice = \"random\"\ndirectory_ttl = \"10m\"\n\
             directory_memory = \"1 MiB\"\ndirectory_flush = \"lfu\"\n\
             multicast_mode = \"logical\"\nmulticast_timeout_floor = \"5ms\"\n",
        )
        .unwrap();
        let p = &s.protocol;
        assert_eq!(p.directory_alpha, 0, "0: every holder, as in the proxy");
        assert_eq!(p.directory_variant, DirVariant::Owner);
        assert_eq!(p.directory_updates, DirUpdateMode::Optimistic);
        assert_eq!(p.directory_choice, DirChoice::Random);
        assert_eq!(p.directory_ttl, Duration::from_secs(600));
        assert_eq!(p.directory_memory, ByteSize::mib(1));
        assert_eq!(p.directory_flush, DirFlush::Lfu);
        assert_eq!(p.multicast_mode, MulticastMode::Logical);
        assert_eq!(p.multicast_timeout_floor, Duration::from_millis(5));
        for (toml, error) in [
            (
                "directory_ttl = \"0s\"",
                "protocol.directory_ttl: must be at least 1s",
            ),
            (
                "directory_memory = \"100 B\"",
                "protocol.directory_memory: must hold at least one entry (128 B)",
            ),
            (
                "multicast_timeout_floor = \"0s\"",
                "protocol.multicast_timeout_floor: must be at least 1ms",
            ),
            (
                "multicast_timeout_floor = \"3s\"",
                "protocol.multicast_timeout_floor: above protocol.icp_timeout_ceiling",
            ),
        ] {
            let e = SimSpec::from_toml(&format!("[protocol]\n{toml}\n")).unwrap_err();
            assert_eq!(e, error);
        }
        let e = SimSpec::from_toml("[protocol]\nmulticast_mode = \"auto\"\n").unwrap_err();
        assert!(e.contains("unknown variant `auto`"), "{e}");
    }
}
