//! Configuration of one proxy node.
//!
//! The config is TOML, strict (an unknown key is an error that names it) and written in human
//! units: sizes as `"256 MiB"`, durations as `"2s"`. Every section has safe defaults, so an empty
//! file is a valid config: a loopback-only proxy on 127.0.0.1:3128. [`DEFAULT_CONFIG`] is the
//! commented default that `meshcache config default` prints; a test checks that it parses to
//! exactly [`Config::default`], so the two can never drift apart.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use meshcache_store::Replacement;
use serde::{Deserialize, Serialize};

/// The commented default configuration, as `meshcache config default` prints it.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// A whole node's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The node's name, shown in `Via`, `X-Cache` and `Cache-Status`.
    pub name: String,
    /// Client-facing HTTP listener.
    pub http: HttpConfig,
    /// Connections to origins.
    pub upstream: UpstreamConfig,
    /// The object store.
    pub store: StoreSection,
    /// Caching behaviour.
    pub cache: CacheConfig,
    /// The admin listener (metrics, stats).
    pub admin: AdminConfig,
    /// Logging.
    pub log: LogConfig,
    /// Cooperation with other caches.
    pub cooperation: CooperationConfig,
    /// Name resolution for origins.
    pub dns: DnsConfig,
    /// Active Cache: applets run on cache hits.
    pub applets: meshcache_applet::AppletConfig,
    /// The pages of the responses the proxy makes up (403, 502, 503 …).
    pub errors: ErrorsConfig,
    /// Proxy authentication (`[auth]`): an htpasswd file or Squid's helpers; rules that name
    /// `user` or `group` need it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<meshcache_auth::AuthConfig>,
    /// Neighbour caches (`[[peer]]` tables).
    #[serde(rename = "peer")]
    pub peers: Vec<PeerConfig>,
    /// Access rules (`[[access]]` tables), in order: the first that matches decides; once there
    /// is one, a request that matches none is denied. `http.allow` and `http.connect_ports` are
    /// checked first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub access: Vec<meshcache_policy::RuleConfig>,
    /// Named lists (`[lists]`): a name, and the file of items (one a line) that `@name` stands
    /// for in a rule.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lists: std::collections::BTreeMap<String, PathBuf>,
    /// Requests that must go through a parent (`[[never_direct]]`, Squid's `never_direct`): the
    /// first rule that matches decides; `allow` means "never direct".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub never_direct: Vec<meshcache_policy::RuleConfig>,
    /// Requests that must go straight to the origin (`[[always_direct]]`), decided before
    /// `never_direct`; `allow` means "always direct".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub always_direct: Vec<meshcache_policy::RuleConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: "meshcache".into(),
            http: HttpConfig::default(),
            upstream: UpstreamConfig::default(),
            store: StoreSection::default(),
            cache: CacheConfig::default(),
            admin: AdminConfig::default(),
            log: LogConfig::default(),
            cooperation: CooperationConfig::default(),
            dns: DnsConfig::default(),
            applets: meshcache_applet::AppletConfig::default(),
            errors: ErrorsConfig::default(),
            auth: None,
            peers: Vec::new(),
            access: Vec::new(),
            lists: std::collections::BTreeMap::new(),
            never_direct: Vec::new(),
            always_direct: Vec::new(),
        }
    }
}

/// Client-facing HTTP listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Client ACL: source networks allowed to use the proxy. Everything else gets 403.
    pub allow: Vec<IpNet>,
    /// Ports a CONNECT tunnel may reach.
    pub connect_ports: Vec<u16>,
    /// Accelerator mode: origin-form requests (`GET /path`) go to this origin.
    pub accelerate: Option<String>,
    /// The most client connections open at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// The largest request head (request line and headers).
    #[serde(with = "size")]
    pub max_header_bytes: u64,
    /// The most header fields in one request.
    pub max_headers: usize,
    /// How long a client may take to send a request head.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a client connection (or a CONNECT tunnel) may go with nothing moving either way:
    /// between requests, mid-body, or a download the client stopped reading.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// On shutdown, how long in-flight requests may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Add this node's `Via` to the requests it forwards and the responses it sends (Squid's
    /// `via`). Off, a loop through this node alone is no longer seen (as in Squid).
    pub via: bool,
    /// What becomes of `X-Forwarded-For` on requests sent to origins and peers (Squid's
    /// `forwarded_for`).
    pub forwarded_for: ForwardedFor,
    /// Socket options for client connections.
    pub socket: SocketOptions,
}

/// What a forwarded request's `X-Forwarded-For` says (Squid's `forwarded_for`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardedFor {
    /// The client's address is appended (Squid's default).
    On,
    /// `unknown` is appended.
    Off,
    /// The header is removed.
    Delete,
    /// The client's address replaces whatever the header said.
    Truncate,
    /// The header goes on as the client sent it, or not at all.
    #[default]
    Transparent,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 3128))],
            allow: vec![
                "127.0.0.0/8".parse().expect("literal CIDR"),
                "::1/128".parse().expect("literal CIDR"),
            ],
            connect_ports: vec![443],
            accelerate: None,
            max_connections: 10_000,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(10),
            via: true,
            forwarded_for: ForwardedFor::Transparent,
            socket: SocketOptions::default(),
        }
    }
}

/// Per-socket options. Large buffers matter on long fat links: a window of
/// bandwidth × RTT (the trans-Pacific pair needed far more than the old 64 KiB default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SocketOptions {
    /// Disable Nagle's algorithm.
    pub nodelay: bool,
    /// SO_SNDBUF; unset leaves the kernel's autotuning alone.
    #[serde(with = "opt_size")]
    pub send_buffer: Option<u64>,
    /// SO_RCVBUF; unset leaves the kernel's autotuning alone.
    #[serde(with = "opt_size")]
    pub recv_buffer: Option<u64>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        Self {
            nodelay: true,
            send_buffer: None,
            recv_buffer: None,
        }
    }
}

/// Connections to origins (and, later, to parents and siblings).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// How long a TCP connect may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long an upstream connection may go with nothing moving either way: silent before the
    /// response head or between body bytes, or not taking the request. Waits for the client's
    /// own request body do not count, nor time in the pool (`idle_timeout` governs that).
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// How long an idle pooled connection is kept.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// The most idle connections kept per upstream host.
    pub max_idle_per_host: usize,
    /// Keep connections to origins and peers open for further requests. With `false`, every
    /// request opens a connection of its own and sends `Connection: close`.
    pub persistent: bool,
    /// The local address upstream connections are opened from (Squid's
    /// `tcp_outgoing_address`); the kernel picks one when unset. Used only for destinations
    /// of the same address family.
    pub source_address: Option<std::net::IpAddr>,
    /// Socket options for upstream connections.
    pub socket: SocketOptions,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_idle_per_host: 64,
            persistent: true,
            source_address: None,
            socket: SocketOptions::default(),
        }
    }
}

/// The object store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// Memory budget for cached objects (bodies and headers).
    #[serde(with = "size")]
    pub memory: u64,
    /// Larger objects are passed through, never stored.
    #[serde(with = "size")]
    pub max_object_size: u64,
    /// Replacement policy: `lru`, `gdsf` or `lfuda`.
    pub replacement: Replacement,
    /// Keep bodies of 32 KiB and more in shared memory and send hits of them with sendfile(2),
    /// without copying them into the socket (as nginx serves its cache files). Off: every body
    /// on the heap, written with write(2).
    pub zero_copy: bool,
    /// Large disk objects (bodies of 32 KiB and more) kept open and mapped between hits, as
    /// nginx's `open_file_cache`: each holds a file descriptor and a mapping. At most a quarter
    /// of the open-file limit is used (`meshcache run` raises its soft limit to the hard one).
    pub open_files: u64,
    /// Disks: `[[store.disk]]` tables. None: memory only.
    #[serde(rename = "disk", skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskSection>,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            memory: 256 * 1024 * 1024,
            max_object_size: 8 * 1024 * 1024,
            replacement: Replacement::Lru,
            zero_copy: true,
            open_files: 4096,
            disks: Vec::new(),
        }
    }
}

/// One disk of the store (`[[store.disk]]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSection {
    /// Its directory, created if missing (relative paths from the working directory).
    pub path: PathBuf,
    /// Bytes of objects it may hold.
    #[serde(with = "size")]
    pub size: u64,
    /// Objects completely written this long before a crash survive it.
    #[serde(
        with = "humantime_serde",
        default = "DiskSection::default_sync_interval"
    )]
    pub sync_interval: Duration,
}

impl DiskSection {
    /// Five seconds.
    pub fn default_sync_interval() -> Duration {
        Duration::from_secs(5)
    }
}

/// Caching behaviour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Share of a response's age since Last-Modified used as its freshness lifetime when it
    /// gives none (RFC 9111 §4.2.2 suggests 10%), for URLs no refresh pattern matches.
    pub heuristic_fraction: f32,
    /// Concurrent misses for one URL make one upstream request; the others wait at most this
    /// long for it before fetching on their own.
    #[serde(with = "humantime_serde")]
    pub collapse_timeout: Duration,
    /// Refresh patterns (`[[cache.refresh]]`, Squid's `refresh_pattern`), in order: the first
    /// whose `url_regex` matches a URL governs the freshness of its responses.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refresh: Vec<RefreshConfig>,
    /// Cache rules (`[[cache.rules]]`, Squid's `cache`), in order: a request the first matching
    /// rule denies is neither answered from the store nor stored. A request no rule matches
    /// uses the cache.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<meshcache_policy::RuleConfig>,
    /// Targeted cache-control fields (RFC 9213) this node obeys, in precedence order: the
    /// first a response carries with a valid value replaces its `Cache-Control` and `Expires`
    /// here. Left out: `["Meshcache-Cache-Control", "CDN-Cache-Control"]` in accelerator mode
    /// (`http.accelerate`), none in forward mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targeted_fields: Option<Vec<String>>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            heuristic_fraction: 0.1,
            collapse_timeout: Duration::from_secs(10),
            refresh: Vec::new(),
            rules: Vec::new(),
            targeted_fields: None,
        }
    }
}

/// The targeted fields an accelerator obeys when `cache.targeted_fields` is left out: its own,
/// then the one every CDN reads (RFC 9213 §3.1).
pub const ACCELERATOR_TARGETED_FIELDS: [&str; 2] = ["meshcache-cache-control", "cdn-cache-control"];

/// One refresh pattern (`[[cache.refresh]]`): Squid's
/// `refresh_pattern [-i] regex min percent max [options]`. A key left out takes the value of
/// Squid's built-in pattern (`0 20% 4320`: min 0, 20 %, max 3 days, no options).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshConfig {
    /// Searched in the URL (the `regex` crate's syntax; `(?i)` for Squid's `-i`).
    pub url_regex: String,
    /// A response without explicit freshness and without `Last-Modified` is fresh this long.
    #[serde(with = "humantime_serde", default)]
    pub min: Duration,
    /// A response without explicit freshness is fresh for this share (in %) of its age since
    /// `Last-Modified` (`Date` − `Last-Modified`).
    #[serde(default = "RefreshConfig::default_percent")]
    pub percent: u32,
    /// A response without explicit freshness is fresh at most this long.
    #[serde(with = "humantime_serde", default = "RefreshConfig::default_max")]
    pub max: Duration,
    /// A response with explicit freshness (`max-age`, `Expires`) stays fresh at least `min`
    /// (violates RFC 9111).
    #[serde(default)]
    pub override_expire: bool,
    /// A response with `Last-Modified` stays fresh at least `min`, however recent the change.
    #[serde(default)]
    pub override_lastmod: bool,
    /// A client's reload (`Cache-Control: no-cache`, `Pragma: no-cache`, `max-age=0`) is
    /// answered from the store when the stored response is fresh (violates RFC 9111).
    #[serde(default)]
    pub ignore_reload: bool,
}

impl RefreshConfig {
    /// Squid's built-in 20 %.
    pub fn default_percent() -> u32 {
        20
    }

    /// Squid's built-in 3 days (4320 minutes).
    pub fn default_max() -> Duration {
        Duration::from_secs(3 * 24 * 3600)
    }

    /// A pattern for `url_regex` with Squid's built-in numbers and no options.
    pub fn new(url_regex: &str) -> Self {
        Self {
            url_regex: url_regex.into(),
            min: Duration::ZERO,
            percent: Self::default_percent(),
            max: Self::default_max(),
            override_expire: false,
            override_lastmod: false,
            ignore_reload: false,
        }
    }
}

/// The admin listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Where `/metrics` and `/stats` are served; `"off"` disables the listener.
    #[serde(with = "off")]
    pub listen: Option<SocketAddr>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 3180))),
        }
    }
}

/// Logging.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Access log in Squid's native format; `"off"` disables it.
    #[serde(with = "off")]
    pub access: Option<PathBuf>,
    /// How often buffered log lines are written out; `0s` writes every line at once.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Old access logs kept when the log is rotated (SIGUSR1, as `squid -k rotate`): Squid's
    /// `logfile_rotate`. 0 only reopens the file, for logrotate and the like.
    pub rotate: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            access: Some(PathBuf::from("access.log")),
            flush_interval: Duration::from_secs(1),
            rotate: 0,
        }
    }
}

/// How this node cooperates with its peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// No inter-cache queries; parents are still used as configured.
    #[default]
    None,
    /// ICP v2 queries to siblings and parents (RFC 2186/2187, as Squid speaks it).
    Icp,
    /// Summary Cache (SC-ICP): peers exchange Bloom-filter summaries (delta updates by ICP,
    /// whole arrays over HTTP) and a miss is ICP-queried only at peers whose summary says hit,
    /// one at a time.
    Summary,
    /// Squid's Cache Digests: peers' digests are fetched over HTTP and a miss goes straight
    /// to a peer whose digest says hit, with no query at all.
    Digest,
    /// The directory-based protocol (dbDCM): a hash of the URL names the sibling that keeps
    /// the list of its holders; a miss asks that one member, then queries α of the holders.
    Directory,
    /// CARP v1 hash routing to the parents (as Squid's `carp` parents): no queries at all.
    Carp,
    /// The multicast search (the Berkeley protocol): one query to an IP multicast group (or,
    /// where loopback cannot carry it, to each member in turn); only holders answer, and the
    /// deadline sends a miss to the parents or the origin.
    Multicast,
}

impl Protocol {
    /// Whether the protocol keeps an ICP socket (queries, replies, summary updates).
    pub fn uses_icp(self) -> bool {
        matches!(
            self,
            Protocol::Icp | Protocol::Summary | Protocol::Directory | Protocol::Multicast
        )
    }

    /// Whether the node keeps a summary of its own store and of its peers'.
    pub fn uses_summaries(self) -> bool {
        matches!(self, Protocol::Summary | Protocol::Digest)
    }
}

/// How α directory holders are picked (see `meshcache_dcm::directory::Choice`).
pub use meshcache_dcm::directory::Choice as DirChoice;
/// Directory flush policy (see `meshcache_dcm::directory::Flush`).
pub use meshcache_dcm::directory::Flush as DirFlush;
/// When directory holders are entered (see `meshcache_dcm::directory::UpdateMode`).
pub use meshcache_dcm::directory::UpdateMode as DirUpdateMode;
/// Directory search variant (see `meshcache_dcm::directory::Variant`).
pub use meshcache_dcm::directory::Variant as DirVariant;

/// How the multicast search sends its queries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MulticastMode {
    /// IP multicast when the kernel delivers the group's traffic on loopback (probed at start)
    /// and every member is on this host's loopback; logical multicast otherwise.
    #[default]
    Auto,
    /// IP multicast, or refuse to start.
    Ip,
    /// Logical multicast: the query unicast to every member.
    Logical,
}

/// Cooperation settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CooperationConfig {
    /// The search protocol.
    pub protocol: Protocol,
    /// Where ICP queries are answered and sent from (peers recognise us by this address).
    pub icp_listen: SocketAddr,
    /// Sources that are not peers but may query us (child caches); everyone else gets DENIED.
    pub icp_allow: Vec<IpNet>,
    /// Shortest wait for ICP replies.
    #[serde(with = "humantime_serde")]
    pub icp_timeout_floor: Duration,
    /// Longest wait for ICP replies; the wait adapts to peers' round trips in between.
    #[serde(with = "humantime_serde")]
    pub icp_timeout_ceiling: Duration,
    /// A peer silent this long after a query is no longer waited for.
    #[serde(with = "humantime_serde")]
    pub dead_peer_timeout: Duration,
    /// We answer ICP_HIT only for objects fresh for at least this long (Squid: 30 s).
    #[serde(with = "humantime_serde")]
    pub icp_hit_min_fresh: Duration,
    /// A peer that sends no response head within this time, counted from the request's last
    /// byte, is stalled: the request goes to the next candidate and the peer is skipped until
    /// it recovers.
    #[serde(with = "humantime_serde")]
    pub peer_response_timeout: Duration,
    /// Send ICP queries to a lone parent (no siblings, one parent) before every miss, although
    /// its answer cannot change the route. A deliberate misconfiguration, off by default.
    pub query_lone_parent: bool,
    /// Summaries (summary and digest protocols): bits per document (the Bloom filter's load
    /// factor). The paper recommends 8 to 16; Squid's digests use 5.
    pub summary_bits_per_entry: u8,
    /// Summaries: hash functions, each 32 bits of the MD5 store key (extended by MD5 of the
    /// key repeated when more than 128 bits are needed). Squid reads digests only with 4.
    pub summary_hash_functions: u16,
    /// Summaries: documents the filter is sized for; 0 sizes it from `store.memory` and the
    /// disks' sizes at 13 KiB per object (Squid's `store_avg_object_size`). It is resized as
    /// the store grows.
    pub summary_capacity: u32,
    /// Summary protocol: publish an update when this share of the cached documents is new
    /// since the last one (the paper: 1 %; 0.1 % to 10 %).
    pub summary_threshold: f64,
    /// Digest protocol: how often our digest is rebuilt (served with this as its lifetime),
    /// and the longest we keep a peer's digest before fetching it again.
    #[serde(with = "humantime_serde")]
    pub digest_rebuild_period: Duration,
    /// Directory: holders queried at most per miss (α); 0 = every holder the entry lists.
    pub directory_alpha: u32,
    /// Directory: `requester` (search variant 1: the owner returns the holders and we query
    /// them) or `owner` (variant 2: the owner queries them for us; the replies come to us).
    pub directory_variant: DirVariant,
    /// Directory: `pessimistic` (a holder is entered once it stored the object) or
    /// `optimistic` (at lookup time, taken back if nothing was stored).
    pub directory_updates: DirUpdateMode,
    /// Directory: how α holders are picked among more: `round_robin` or `random`.
    pub directory_choice: DirChoice,
    /// Directory: a holder record not renewed for this long is dropped.
    #[serde(with = "humantime_serde")]
    pub directory_ttl: Duration,
    /// Directory: memory for our share of the directory (128 bytes an entry).
    #[serde(with = "size")]
    pub directory_memory: u64,
    /// Directory: which entries make room when it is full: `lru` or `lfu`.
    pub directory_flush: DirFlush,
    /// CARP: we are a member of the array ourselves (a mesh of equals splitting the URLs, each
    /// listing the others as parents), so the URLs we win we fetch. Off: the parents are the
    /// array, as for a Squid child with `carp` parents.
    pub carp_member: bool,
    /// Multicast: the IPv4 multicast group (address and port) every member joins on loopback
    /// and sends its queries to.
    pub multicast_group: SocketAddrV4,
    /// Multicast: the queries' IP TTL. 0 keeps them on this host whatever the routes say.
    pub multicast_ttl: u32,
    /// Multicast: `auto`, `ip` or `logical` (see [`MulticastMode`]).
    pub multicast_mode: MulticastMode,
    /// Multicast: shortest wait for a HIT. The wait is three times the slowest member's mean
    /// HIT round trip (five times this floor until one is known), within this floor and
    /// `icp_timeout_ceiling`; nobody answers a miss, so every miss waits it out.
    #[serde(with = "humantime_serde")]
    pub multicast_timeout_floor: Duration,
}

impl Default for CooperationConfig {
    fn default() -> Self {
        let directory = meshcache_dcm::directory::DirectoryConfig::default();
        Self {
            protocol: Protocol::None,
            icp_listen: SocketAddr::from(([127, 0, 0, 1], 3130)),
            icp_allow: Vec::new(),
            icp_timeout_floor: Duration::from_millis(50),
            icp_timeout_ceiling: Duration::from_secs(2),
            dead_peer_timeout: Duration::from_secs(10),
            icp_hit_min_fresh: Duration::from_secs(30),
            peer_response_timeout: Duration::from_secs(5),
            query_lone_parent: false,
            summary_bits_per_entry: 8,
            summary_hash_functions: 4,
            summary_capacity: 0,
            summary_threshold: 0.01,
            digest_rebuild_period: Duration::from_secs(300),
            directory_alpha: directory.alpha,
            directory_variant: directory.variant,
            directory_updates: directory.mode,
            directory_choice: directory.choice,
            directory_ttl: directory.ttl,
            directory_memory: meshcache_dcm::directory::DEFAULT_MEMORY,
            directory_flush: directory.flush,
            carp_member: false,
            multicast_group: SocketAddrV4::new(Ipv4Addr::new(239, 255, 31, 30), 3131),
            multicast_ttl: 0,
            multicast_mode: MulticastMode::Auto,
            multicast_timeout_floor: Duration::from_millis(20),
        }
    }
}

/// Error pages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorsConfig {
    /// A directory of HTML templates named as Squid names its pages (`ERR_ACCESS_DENIED` …),
    /// with Squid's `%` codes; Squid's own (`/usr/share/squid/errors/templates`) work. Unset:
    /// the built-in plain-text pages.
    pub directory: Option<PathBuf>,
    /// The administrator's address, in pages (`%w`; Squid's `cache_mgr`).
    pub admin: String,
}

impl Default for ErrorsConfig {
    fn default() -> Self {
        Self {
            directory: None,
            admin: "webmaster".into(),
        }
    }
}

/// Name resolution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// A static host table (as Squid's `hosts_file`): host name to address, consulted before
    /// the system resolver. Names match without regard to case.
    pub hosts: std::collections::BTreeMap<String, std::net::IpAddr>,
    /// How long the system resolver's answer for a name is used (it gives no TTL).
    #[serde(with = "humantime_serde")]
    pub positive_ttl: Duration,
    /// How long a name that did not resolve stays unresolved before it is asked again.
    #[serde(with = "humantime_serde")]
    pub negative_ttl: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            hosts: std::collections::BTreeMap::new(),
            positive_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(5),
        }
    }
}

/// One neighbour cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// Name shown in logs and metrics.
    pub name: String,
    /// `sibling` or `parent`.
    pub role: meshcache_dcm::Role,
    /// Its HTTP proxy address.
    pub http: SocketAddr,
    /// Its ICP address; leave out for a peer that speaks no ICP.
    #[serde(default)]
    pub icp: Option<SocketAddr>,
    /// Never send it ICP queries.
    #[serde(default)]
    pub no_query: bool,
    /// Never fetch its summary or digest (summary and digest protocols): it is then a miss
    /// for every lookup (Squid: `no-digest`).
    #[serde(default)]
    pub no_digest: bool,
    /// Use it when no other parent is available.
    #[serde(default)]
    pub default: bool,
    /// Balance requests among round-robin parents.
    #[serde(default)]
    pub round_robin: bool,
    /// Do not keep a copy of what it serves.
    #[serde(default)]
    pub proxy_only: bool,
    /// Preference weight (at least 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// Only requests for these domains go to it (".example.org" includes subdomains).
    #[serde(default)]
    pub domains: Vec<String>,
    /// The client's proxy credentials: `"pass"` forwards its `Proxy-Authorization` to this
    /// peer (Squid's `login=PASS`, for a parent that authenticates the same users); unset,
    /// they stop here, as they do for the origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<PeerLogin>,
}

/// What a peer is told of the client's proxy credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerLogin {
    /// Forward the client's `Proxy-Authorization`.
    Pass,
}

fn one() -> u32 {
    1
}

impl PeerConfig {
    /// A peer with every option at its default.
    pub fn new(
        name: &str,
        role: meshcache_dcm::Role,
        http: SocketAddr,
        icp: Option<SocketAddr>,
    ) -> Self {
        PeerConfig {
            name: name.to_owned(),
            role,
            http,
            icp,
            no_query: false,
            no_digest: false,
            default: false,
            round_robin: false,
            proxy_only: false,
            weight: 1,
            domains: Vec::new(),
            login: None,
        }
    }
}

/// A config that could not be used, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid TOML, or a key or value the schema refuses.
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// Valid syntax, but the values contradict each other or are unsafe.
    #[error("{key}: {reason}")]
    Invalid {
        /// The dotted key at fault.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl Config {
    /// Parses and validates a TOML config.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.into(),
            })
        };
        if self.name.is_empty() || !self.name.bytes().all(|b| b.is_ascii_graphic()) {
            return invalid("name", "must be non-empty printable ASCII without spaces");
        }
        if self.http.listen.is_empty() {
            return invalid("http.listen", "needs at least one address");
        }
        if self.http.max_connections == 0 {
            return invalid("http.max_connections", "must be at least 1");
        }
        if self.http.max_header_bytes < 8192 {
            return invalid("http.max_header_bytes", "must be at least 8 KiB");
        }
        self.validate_store()?;
        if !self.lists.is_empty() {
            self.lists()?;
        }
        self.access_rules()?;
        self.routing_rules()?;
        if let Some(auth) = &self.auth {
            if let Err(e) = auth.validate() {
                return Err(ConfigError::Invalid {
                    key: "auth",
                    reason: e.to_string(),
                });
            }
        }
        if let Some(dir) = &self.errors.directory {
            if let Err(e) = std::fs::read_dir(dir) {
                return Err(ConfigError::Invalid {
                    key: "errors.directory",
                    reason: format!("{}: {e}", dir.display()),
                });
            }
        }
        self.cache_rules()?;
        self.refresh_patterns()?;
        for name in self.cache.targeted_fields.iter().flatten() {
            let lower = name.to_ascii_lowercase();
            if http::HeaderName::from_bytes(lower.as_bytes()).is_err()
                || matches!(lower.as_str(), "cache-control" | "expires" | "pragma")
            {
                return invalid(
                    "cache.targeted_fields",
                    "each must be a field name other than Cache-Control, Expires or Pragma",
                );
            }
        }
        if !(0.0..=1.0).contains(&self.cache.heuristic_fraction) {
            return invalid("cache.heuristic_fraction", "must be between 0 and 1");
        }
        if let Err((key, reason)) = self.applets.validate() {
            return Err(ConfigError::Invalid { key, reason });
        }
        let mut names = std::collections::HashSet::new();
        for peer in &self.peers {
            if peer.name.is_empty() || !names.insert(peer.name.as_str()) {
                return invalid(
                    "peer.name",
                    &format!("{:?} is empty or used twice", peer.name),
                );
            }
            if peer.weight == 0 {
                return invalid(
                    "peer.weight",
                    &format!("peer {:?}: must be at least 1", peer.name),
                );
            }
            if peer.icp.is_some_and(|a| a == self.cooperation.icp_listen) {
                return invalid(
                    "peer.icp",
                    &format!("peer {:?} has our own ICP address", peer.name),
                );
            }
        }
        let c = &self.cooperation;
        if c.icp_timeout_floor > c.icp_timeout_ceiling {
            return invalid(
                "cooperation.icp_timeout_floor",
                "is above cooperation.icp_timeout_ceiling",
            );
        }
        if !(0.001..=0.1).contains(&c.summary_threshold) {
            return invalid(
                "cooperation.summary_threshold",
                "must be between 0.001 (0.1 %) and 0.1 (10 %)",
            );
        }
        if !(1..=32).contains(&c.summary_bits_per_entry) {
            return invalid("cooperation.summary_bits_per_entry", "must be 1 to 32");
        }
        if !(1..=32).contains(&c.summary_hash_functions) {
            return invalid("cooperation.summary_hash_functions", "must be 1 to 32");
        }
        if c.protocol == Protocol::Digest && c.summary_hash_functions != 4 {
            return invalid(
                "cooperation.summary_hash_functions",
                "must be 4 with protocol = \"digest\" (Squid's Cache Digests use 4)",
            );
        }
        if c.digest_rebuild_period < Duration::from_secs(1) {
            return invalid("cooperation.digest_rebuild_period", "must be at least 1s");
        }
        if c.protocol == Protocol::Directory {
            let specific = matches!(c.icp_listen, SocketAddr::V4(a) if !a.ip().is_unspecified());
            if !specific {
                return invalid(
                    "cooperation.icp_listen",
                    "must be a specific IPv4 address with protocol = \"directory\" (it names us in directory entries)",
                );
            }
            if let Some(p) = self.peers.iter().find(|p| {
                p.role == meshcache_dcm::Role::Sibling && !matches!(p.icp, Some(SocketAddr::V4(_)))
            }) {
                return invalid(
                    "peer.icp",
                    &format!(
                        "sibling {:?}: directory members need an IPv4 ICP address",
                        p.name
                    ),
                );
            }
        }
        if c.protocol == Protocol::Multicast {
            if !c.icp_listen.is_ipv4() {
                return invalid(
                    "cooperation.icp_listen",
                    "must be an IPv4 address with protocol = \"multicast\" (the group is IPv4)",
                );
            }
            if let Some(p) = self
                .peers
                .iter()
                .find(|p| p.icp.is_some_and(|a| !a.is_ipv4()))
            {
                return invalid(
                    "peer.icp",
                    &format!(
                        "peer {:?}: multicast members need an IPv4 ICP address",
                        p.name
                    ),
                );
            }
            if c.multicast_mode == MulticastMode::Ip {
                if let Some(p) = self
                    .peers
                    .iter()
                    .find(|p| p.icp.is_some_and(|a| !a.ip().is_loopback()))
                {
                    return invalid(
                        "cooperation.multicast_mode",
                        &format!(
                            "\"ip\" reaches loopback members only, and peer {:?} is not on loopback: use \"auto\" or \"logical\"",
                            p.name
                        ),
                    );
                }
            }
        }
        if !c.multicast_group.ip().is_multicast() || c.multicast_group.port() == 0 {
            return invalid(
                "cooperation.multicast_group",
                "must be an IPv4 multicast address (224.0.0.0/4) with a port",
            );
        }
        if c.multicast_ttl > 255 {
            return invalid("cooperation.multicast_ttl", "must be 0 to 255");
        }
        if c.multicast_timeout_floor < Duration::from_millis(1) {
            return invalid(
                "cooperation.multicast_timeout_floor",
                "must be at least 1ms",
            );
        }
        if c.multicast_timeout_floor > c.icp_timeout_ceiling {
            return invalid(
                "cooperation.multicast_timeout_floor",
                "is above cooperation.icp_timeout_ceiling",
            );
        }
        use meshcache_dcm::directory::{BadSetting, DirectoryConfig};
        if let Err(bad) = DirectoryConfig::check(c.directory_ttl, c.directory_memory) {
            let key = match bad {
                BadSetting::Ttl => "cooperation.directory_ttl",
                BadSetting::Memory => "cooperation.directory_memory",
            };
            return invalid(key, bad.reason());
        }
        let mut seen = std::collections::HashSet::new();
        for name in self.dns.hosts.keys() {
            let bare = name.strip_suffix('.').unwrap_or(name);
            let valid = !bare.is_empty()
                && bare.len() <= 253
                && bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !valid {
                return invalid(
                    "dns.hosts",
                    &format!("{name:?} is not a host name (letters, digits, '-', '.', '_')"),
                );
            }
            if !seen.insert(bare.to_ascii_lowercase()) {
                return invalid("dns.hosts", &format!("{name:?} is listed twice"));
            }
        }
        if let Some(origin) = &self.http.accelerate {
            if origin.parse::<http::uri::Authority>().is_err() || origin.contains('@') {
                return invalid("http.accelerate", "must be host:port");
            }
        }
        Ok(())
    }
}

impl Config {
    /// Compiles the access rules, reading the named lists: an error names the rule and key,
    /// or the list and line.
    pub fn access_rules(&self) -> Result<meshcache_policy::Rules, ConfigError> {
        self.rule_list("access", &self.access)
    }

    /// Compiles the routing rules: `(always_direct, never_direct)`.
    pub fn routing_rules(
        &self,
    ) -> Result<(meshcache_policy::Rules, meshcache_policy::Rules), ConfigError> {
        Ok((
            self.rule_list("always_direct", &self.always_direct)?,
            self.rule_list("never_direct", &self.never_direct)?,
        ))
    }

    /// Compiles the cache rules (`[[cache.rules]]`).
    pub fn cache_rules(&self) -> Result<meshcache_policy::Rules, ConfigError> {
        self.rule_list("cache.rules", &self.cache.rules)
    }

    /// Compiles the refresh patterns' expressions into one set, pattern `i` the set's `i`th
    /// (`None` when there is none): an error names the pattern by position.
    pub fn refresh_patterns(&self) -> Result<Option<regex::RegexSet>, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            key: "cache.refresh",
            reason,
        };
        for (i, pattern) in self.cache.refresh.iter().enumerate() {
            if let Err(e) = regex::Regex::new(&pattern.url_regex) {
                return Err(invalid(format!(
                    "rule {}, url_regex: {:?}: {e}",
                    i + 1,
                    pattern.url_regex
                )));
            }
            if pattern.min > pattern.max {
                return Err(invalid(format!("rule {}, min: is above max", i + 1)));
            }
        }
        if self.cache.refresh.is_empty() {
            return Ok(None);
        }
        regex::RegexSetBuilder::new(self.cache.refresh.iter().map(|p| &p.url_regex))
            .size_limit(64 << 20)
            .build()
            .map(Some)
            .map_err(|e| invalid(format!("the expressions together: {e}")))
    }

    /// Reads the named lists.
    fn lists(&self) -> Result<meshcache_policy::Lists, ConfigError> {
        meshcache_policy::Lists::load(&self.lists).map_err(|e| ConfigError::Invalid {
            key: "lists",
            reason: e.to_string(),
        })
    }

    /// Compiles one rule list, reading the named lists it refers to.
    fn rule_list(
        &self,
        key: &'static str,
        configs: &[meshcache_policy::RuleConfig],
    ) -> Result<meshcache_policy::Rules, ConfigError> {
        if configs.is_empty() {
            return Ok(meshcache_policy::Rules::default());
        }
        let rules = meshcache_policy::Rules::compile(configs, &self.lists()?).map_err(|e| {
            ConfigError::Invalid {
                key,
                reason: e.to_string(),
            }
        })?;
        let needs = |i: &usize, group: bool| {
            rules.rule(*i).is_some_and(|r| {
                if group {
                    r.names_group()
                } else {
                    r.names_user()
                }
            })
        };
        let group_helper = self.auth.as_ref().is_some_and(|a| a.group_helper.is_some());
        if let Some(i) = (0..rules.len()).find(|i| needs(i, false) && self.auth.is_none()) {
            return Err(ConfigError::Invalid {
                key,
                reason: format!(
                    "rule {}: user and group need proxy authentication: configure [auth]",
                    i + 1
                ),
            });
        }
        if let Some(i) = (0..rules.len()).find(|i| needs(i, true) && !group_helper) {
            return Err(ConfigError::Invalid {
                key,
                reason: format!("rule {}: group needs auth.group_helper", i + 1),
            });
        }
        Ok(rules)
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
        let store = &self.store;
        let largest_disk = store.disks.iter().map(|d| d.size).max().unwrap_or(0);
        if store.max_object_size > store.memory.max(largest_disk) {
            return invalid(
                "store.max_object_size",
                if store.disks.is_empty() {
                    "is larger than store.memory".into()
                } else {
                    "is larger than store.memory and than every store.disk".into()
                },
            );
        }
        if store.open_files > 1 << 20 {
            return invalid("store.open_files", "must be at most 1048576".into());
        }
        let mut paths = std::collections::HashSet::new();
        for disk in &store.disks {
            let name = disk.path.display();
            if disk.path.as_os_str().is_empty() {
                return invalid("store.disk.path", "must not be empty".into());
            }
            if !paths.insert(disk.path.clone()) {
                return invalid("store.disk.path", format!("{name} is listed twice"));
            }
            if disk.size < 1 << 20 {
                return invalid("store.disk.size", format!("{name}: must be at least 1 MiB"));
            }
            if disk.sync_interval < Duration::from_millis(10)
                || disk.sync_interval > Duration::from_secs(3600)
            {
                return invalid(
                    "store.disk.sync_interval",
                    format!("{name}: must be between 10ms and 1h"),
                );
            }
        }
        Ok(())
    }
}

/// Optional values that a config can switch off with the string `"off"`.
mod off {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::str::FromStr;

    pub fn serialize<T: Serialize, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => v.serialize(s),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        if text == "off" {
            return Ok(None);
        }
        text.parse()
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e} (or \"off\")")))
    }
}

/// Sizes as human strings ("256 MiB") or plain byte counts (one format for every section).
use meshcache_applet::config::size;

/// Optional sizes.
mod opt_size {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::size::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        super::size::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_matches_code_default() {
        let parsed = Config::from_toml(DEFAULT_CONFIG).expect("default config parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn config_reference_shows_the_embedded_default() {
        let doc = include_str!("../../../docs/config.md");
        assert!(
            doc.contains(DEFAULT_CONFIG),
            "docs/config.md must embed the default config verbatim"
        );
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(
            Config::from_toml("").expect("empty parses"),
            Config::default()
        );
    }

    #[test]
    fn disks_parse_and_let_objects_exceed_memory() {
        let c = Config::from_toml(
            "[store]\nmemory = \"64 MiB\"\nmax_object_size = \"4 GiB\"\n\n[[store.disk]]\npath = \"cache\"\nsize = \"20 GiB\"\n\n[[store.disk]]\npath = \"/srv/cache2\"\nsize = \"1 GiB\"\nsync_interval = \"1s\"\n",
        )
        .expect("parses");
        assert_eq!(c.store.disks.len(), 2);
        assert_eq!(c.store.disks[0].size, 20 << 30);
        assert_eq!(c.store.disks[0].sync_interval, Duration::from_secs(5));
        assert_eq!(c.store.disks[1].sync_interval, Duration::from_secs(1));
        for (toml, key) in [
            ("[store]\nmax_object_size = \"2 GiB\"\n[[store.disk]]\npath = \"d\"\nsize = \"1 GiB\"\n", "store.max_object_size"),
            ("[[store.disk]]\npath = \"d\"\nsize = \"1 KiB\"\n", "store.disk.size"),
            ("[[store.disk]]\npath = \"d\"\nsize = \"1 GiB\"\n[[store.disk]]\npath = \"d\"\nsize = \"1 GiB\"\n", "store.disk.path"),
            ("[[store.disk]]\npath = \"d\"\nsize = \"1 GiB\"\nsync_interval = \"2h\"\n", "store.disk.sync_interval"),
            ("[[store.disk]]\npath = \"d\"\n", "size"),
            ("[[store.disk]]\npath = \"d\"\nsize = \"1 GiB\"\nsise = 3\n", "sise"),
        ] {
            let err = Config::from_toml(toml).expect_err(toml).to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[store]\nmemroy = \"1 MiB\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.contains("memroy"), "{err}");
    }

    #[test]
    fn human_units() {
        let c = Config::from_toml(
            "[store]\nmemory = \"1 MiB\"\nmax_object_size = 4096\n[upstream]\nread_timeout = \"1500ms\"\n",
        )
        .expect("parses");
        assert_eq!(c.store.memory, 1024 * 1024);
        assert_eq!(c.store.max_object_size, 4096);
        assert_eq!(c.upstream.read_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn bad_size_is_explained() {
        let err = Config::from_toml("[store]\nmemory = \"lots\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.contains("memory") && err.contains("lots"), "{err}");
    }

    #[test]
    fn contradictions_are_refused() {
        let err = Config::from_toml("[store]\nmemory = \"1 MiB\"\nmax_object_size = \"2 MiB\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.starts_with("store.max_object_size"), "{err}");
        let err = Config::from_toml("[cache]\nheuristic_fraction = 2.0\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.starts_with("cache.heuristic_fraction"), "{err}");
    }

    #[test]
    fn listeners_and_logs_switch_off() {
        let c = Config::from_toml("[admin]\nlisten = \"off\"\n[log]\naccess = \"off\"\n")
            .expect("parses");
        assert_eq!((c.admin.listen, c.log.access), (None, None));
        let err = Config::from_toml("[admin]\nlisten = \"nowhere\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.contains("nowhere"), "{err}");
    }

    #[test]
    fn peers() {
        let c = Config::from_toml(
            "[cooperation]\nprotocol = \"icp\"\n[[peer]]\nname = \"p1\"\nrole = \"parent\"\nhttp = \"127.0.0.2:3128\"\nicp = \"127.0.0.2:3130\"\ndomains = [\".br\"]\n[[peer]]\nname = \"s1\"\nrole = \"sibling\"\nhttp = \"127.0.0.3:3128\"\nproxy_only = true\n",
        )
        .expect("parses");
        assert_eq!(c.cooperation.protocol, Protocol::Icp);
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.peers[0].weight, 1);
        assert!(c.peers[1].proxy_only && c.peers[1].icp.is_none());
        let err = Config::from_toml(
            "[[peer]]\nname = \"x\"\nrole = \"cousin\"\nhttp = \"127.0.0.2:1\"\n",
        )
        .expect_err("must be refused")
        .to_string();
        assert!(err.contains("cousin"), "{err}");
        let err = Config::from_toml("[[peer]]\nname = \"x\"\nrole = \"parent\"\nhttp = \"127.0.0.2:1\"\n[[peer]]\nname = \"x\"\nrole = \"parent\"\nhttp = \"127.0.0.3:1\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.starts_with("peer.name"), "{err}");
    }

    #[test]
    fn summary_settings_are_checked() {
        let c = Config::from_toml(
            "[cooperation]\nprotocol = \"summary\"\nsummary_threshold = 0.05\nsummary_bits_per_entry = 16\n",
        )
        .expect("parses");
        assert_eq!(c.cooperation.protocol, Protocol::Summary);
        assert!(c.cooperation.protocol.uses_icp() && c.cooperation.protocol.uses_summaries());
        for (text, key) in [
            ("summary_threshold = 0.5", "cooperation.summary_threshold"),
            (
                "summary_bits_per_entry = 0",
                "cooperation.summary_bits_per_entry",
            ),
            (
                "summary_hash_functions = 33",
                "cooperation.summary_hash_functions",
            ),
            (
                "protocol = \"digest\"\nsummary_hash_functions = 8",
                "cooperation.summary_hash_functions",
            ),
            (
                "digest_rebuild_period = \"10ms\"",
                "cooperation.digest_rebuild_period",
            ),
        ] {
            let err = Config::from_toml(&format!("[cooperation]\n{text}\n"))
                .expect_err("must be refused")
                .to_string();
            assert!(err.starts_with(key), "{text}: {err}");
        }
        let c = Config::from_toml(
            "[cooperation]\nprotocol = \"digest\"\n[[peer]]\nname = \"s\"\nrole = \"sibling\"\nhttp = \"127.0.0.2:3128\"\nno_digest = true\n",
        )
        .expect("parses");
        assert!(c.peers[0].no_digest && !c.cooperation.protocol.uses_icp());
    }

    #[test]
    fn multicast_settings_are_checked() {
        let c = Config::from_toml(
            "[cooperation]\nprotocol = \"multicast\"\nmulticast_group = \"239.1.2.3:4000\"\nmulticast_mode = \"logical\"\nmulticast_timeout_floor = \"5ms\"\n",
        )
        .expect("parses");
        assert_eq!(c.cooperation.protocol, Protocol::Multicast);
        assert!(c.cooperation.protocol.uses_icp());
        assert_eq!(
            c.cooperation.multicast_group,
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4000)
        );
        assert_eq!(c.cooperation.multicast_mode, MulticastMode::Logical);
        for (text, key) in [
            (
                "multicast_group = \"10.0.0.1:3131\"",
                "cooperation.multicast_group",
            ),
            (
                "multicast_group = \"239.1.2.3:0\"",
                "cooperation.multicast_group",
            ),
            ("multicast_ttl = 256", "cooperation.multicast_ttl"),
            (
                "multicast_timeout_floor = \"0s\"",
                "cooperation.multicast_timeout_floor",
            ),
            (
                "multicast_timeout_floor = \"3s\"",
                "cooperation.multicast_timeout_floor",
            ),
            (
                "protocol = \"multicast\"\nicp_listen = \"[::1]:3130\"",
                "cooperation.icp_listen",
            ),
            (
                "protocol = \"multicast\"\nmulticast_mode = \"ip\"\n[[peer]]\nname = \"far\"\nrole = \"sibling\"\nhttp = \"10.0.0.2:3128\"\nicp = \"10.0.0.2:3130\"",
                "cooperation.multicast_mode",
            ),
        ] {
            let err = Config::from_toml(&format!("[cooperation]\n{text}\n"))
                .expect_err("must be refused")
                .to_string();
            assert!(err.starts_with(key), "{text}: {err}");
        }
        let err = Config::from_toml("[cooperation]\nmulticast_mode = \"sometimes\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.contains("sometimes"), "{err}");
    }

    #[test]
    fn caching_policy_parses_and_is_checked() {
        let c = Config::from_toml(
            "[http]\nvia = false\nforwarded_for = \"truncate\"\n\n[[cache.refresh]]\nurl_regex = '(?i)\\.deb$'\nmin = \"1d\"\npercent = 20\nmax = \"30d\"\noverride_expire = true\n\n[[cache.refresh]]\nurl_regex = '.'\n\n[[cache.rules]]\naction = \"deny\"\ndomain = [\".intranet.example\"]\n",
        )
        .expect("parses");
        assert!(!c.http.via);
        assert_eq!(c.http.forwarded_for, ForwardedFor::Truncate);
        let deb = &c.cache.refresh[0];
        assert_eq!(
            (
                deb.min,
                deb.percent,
                deb.max,
                deb.override_expire,
                deb.ignore_reload
            ),
            (
                Duration::from_secs(86_400),
                20,
                Duration::from_secs(30 * 86_400),
                true,
                false
            )
        );
        assert_eq!(c.cache.refresh[1], RefreshConfig::new("."));
        assert_eq!(c.cache.rules.len(), 1);
        for (toml, want) in [
            (
                "[[cache.refresh]]\nurl_regex = 'a'\n[[cache.refresh]]\nurl_regex = '(unclosed'\n",
                "cache.refresh: rule 2, url_regex",
            ),
            (
                "[[cache.refresh]]\nurl_regex = 'a'\nmin = \"2d\"\nmax = \"1d\"\n",
                "cache.refresh: rule 1, min",
            ),
            ("[[cache.refresh]]\nmin = \"1d\"\n", "url_regex"),
            (
                "[[cache.refresh]]\nurl_regex = 'a'\nreload_into_ims = true\n",
                "reload_into_ims",
            ),
            (
                "[[cache.refresh]]\nurl_regex = 'a'\npercent = \"20%\"\n",
                "percent",
            ),
            (
                "[[cache.rules]]\naction = \"deny\"\nport = [\"44x\"]\n",
                "cache.rules: rule 1",
            ),
            ("[http]\nforwarded_for = \"sometimes\"\n", "sometimes"),
        ] {
            let err = Config::from_toml(toml).expect_err(toml).to_string();
            assert!(err.contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn bad_replacement_is_named() {
        let err = Config::from_toml("[store]\nreplacement = \"fifo\"\n")
            .expect_err("must be refused")
            .to_string();
        assert!(err.contains("fifo"), "{err}");
    }
}
