//! The analytical model of the directory-based DCM paper (its §5 and Table 1): the mean latency
//! of a client request in a large mesh of cooperating proxies, for the three cooperation
//! families the paper compares, as the mesh, the client population or the object size grows.
//!
//! | family | paper's name | search on a miss at the master cache |
//! | --- | --- | --- |
//! | [`Family::Directory`] | dbDCM | ask the proxy that owns the URL's share of the directory (a hash of the URL), then query at most α of the holders it names |
//! | [`Family::Icp`] | Squid | a logical broadcast: one ICP query to every other proxy, one hit or miss reply from each |
//! | [`Family::Multicast`] | Berkeley | one IP multicast query to the group; only holders reply; the client is redirected to the first one |
//!
//! The paper states the model's ingredients and its results (Figure 6) but leaves the formulas
//! to a technical report we do not have. This module rebuilds the model from what the paper
//! does state, and says below where it had to choose.
//!
//! # What the paper fixes
//!
//! * The inputs are the parameters of Table 1 ([`ModelParams`], whose `Default` is that table).
//! * Three steps (§5): count the IP packets each protocol sends for a master-cache hit, a
//!   neighbour-cache hit and a distributed miss, which gives the traffic on the network and the
//!   load on proxy, client and server hosts; feed these loads to M/G/1 queues (Kleinrock) to get
//!   a mean delay per resource; walk the timing diagram of each outcome and weigh the three
//!   outcomes by their probabilities to get the mean latency per request.
//! * The message counts of §2 and §3: the ICP family sends `N−1` queries and gets `N−1`
//!   replies; the multicast family puts one query on each of the `D` subnets, every proxy
//!   receives it, and only holders answer; the directory family sends a lookup to the owner
//!   of the URL's directory entry (unless that is the master itself, probability `1/N`),
//!   gets the holder list back, and queries `A = min(α, holders)` of them, each answering
//!   hit or miss. The multicast family redirects the client to the first holder; the other two
//!   fetch from the holder and relay the object to the client.
//! * The shape of Figure 6 (§5): with few proxies every family saturates on overloaded proxy
//!   hosts; with many proxies the ICP and multicast families saturate on the network while the
//!   directory family does not.
//!
//! # Resources and queues
//!
//! Four kinds of resource serve packets, each an M/G/1 queue whose server works at the
//! resource's bandwidth (a packet of `b` bytes takes `8b / bandwidth` seconds):
//!
//! * **proxy hosts** (`N` of them, Table 1's "average bandwidth of proxy host"): a host serves
//!   every packet it sends *and* every packet it receives, which is how the paper's point that
//!   proxies must process every query and reply they get is charged;
//! * **the network** (one queue at the cross-sectional bandwidth): every packet between the
//!   proxies, between a proxy and an origin server, and between a client and a proxy other
//!   than its own. A client reaches its own (master) proxy over its access link, which the
//!   client host's bandwidth stands for, so that traffic does not load the shared network.
//!   This is our reading of "cross-sectional bandwidth" and of the subnets "that connect the
//!   proxy hosts";
//! * **client hosts** (`C`, each seeing only its own requests);
//! * **origin server hosts** (`S`, sharing the misses evenly).
//!
//! Requests arrive at `Λ = C·λ` per second and spread evenly over the proxies (admission),
//! the directory owners (the hash) and the holders. For each resource the module adds up the
//! expected packets per request of each size class (small 40 B, medium 180 B, large `L`), which
//! gives per instance an arrival rate `λ_k` per class and a service time `s_k`. Then
//!
//! ```text
//! ρ = Σ λ_k s_k                       (utilisation)
//! W = Σ λ_k s_k² / (2 (1 − ρ))        (Pollaczek–Khinchine mean wait, = λ E[S²] / 2(1 − ρ))
//! ```
//!
//! and a packet of `b` bytes spends `W + 8b/bandwidth` at that resource. If any resource has
//! `ρ ≥ 1` the family is [`Latency::Saturated`], naming the most loaded resource; no number
//! is made up for it.
//!
//! # Packets per request
//!
//! With `n = max(1, O/L)` data packets per object and `a = max(1, 0.75·O/L)` acknowledgements
//! (Table 1), one TCP transfer is 3 small packets to open, one medium request, `n` large data
//! packets, `a` small acknowledgements and 3 small packets to close; each packet is charged
//! to both end hosts, and to the network when it crosses it. ICP and directory messages are
//! medium packets. With `h_m`, `h_n` the master and neighbour hit rates, `h_o = 1 − h_m − h_n`,
//! `q = (N−1)/N`, `D = max(1, 0.2N)`, `R = max(1, 0.3(N−1))` holders of an object that a
//! neighbour holds, `A = min(α, R)` with `α = min(5, N)`, and `p` the accuracy of a directory
//! entry, per request:
//!
//! | | ICP | multicast | directory |
//! | --- | --- | --- | --- |
//! | client ↔ master | one transfer | one transfer (on a neighbour hit: a redirect instead of the data) | one transfer |
//! | search, if the master misses (`1 − h_m`) | `N−1` queries + `N−1` replies | 1 send, `D` packets on the network, `N−1` receptions; `R` replies on a neighbour hit | lookup + answer (`q`), an eviction notice to the owner (`q`, the master keeps what it fetches); `A` queries + `A` replies on a neighbour hit, and on a miss when the entry is stale (`1 − p`) |
//! | neighbour hit (`h_n`) | transfer neighbour → master | client opens a transfer to the neighbour | transfer neighbour → master if one of the `A` answers hit (`1 − (1−p)^A`), else as a miss |
//! | miss (`h_o`) | transfer server → master | transfer server → master | transfer server → master and an "I hold it" notice to the owner (`q`) |
//!
//! # Timing
//!
//! A message of `b` bytes over a path of resources takes the sum of `W + 8b/bandwidth` over
//! the path. A run of `k` packets sent back to back (the data of a transfer, or the queries of
//! a logical broadcast) takes one message time for the first; the other `k − 1` follow at the
//! pace of the path's bottleneck, whose residual capacity serves each of them in
//! `(8b/bandwidth) / (1 − ρ)` (the processor-sharing view of the same queue). A relayed
//! transfer (holder → master → client) is one pipeline through both legs, with the master's
//! host visited twice per packet. A share of `f = 10%` of the data packets fills the TCP window
//! (Table 1): each such packet costs one more round trip of the leg (an acknowledgement back,
//! the next data packet forward).
//!
//! The three outcomes, after the client opens its connection to the master (SYN, SYN-ACK, then
//! the request):
//!
//! * **master hit**: the master sends the object;
//! * **neighbour hit**: the search until the first hit reply, then a connection to the holder
//!   and a relayed transfer (ICP, directory), or a redirect and a direct transfer from the
//!   holder to the client (multicast). In a logical broadcast to `k` proxies of which `R`
//!   hold the object, the first holder is expected at rank `(k + 1)/(R + 1)`: the master
//!   sends that many queries and processes that many replies before it knows. For the
//!   directory, each of the `A` holders queried has the object with probability `p`; the
//!   expected rank of the first that does is computed exactly; if none does, all `A` replies
//!   are awaited and the request goes to the origin server;
//! * **miss**: ICP waits for all `N−1` replies; multicast hears nothing and waits for the
//!   whole termination timeout; the directory family learns from the lookup that nobody holds
//!   the object (or, with a stale entry, after `A` miss replies). Then a connection to an
//!   origin server and a relayed transfer.
//!
//! Every search is cut at the termination timeout (40 ms). The mean latency is the sum of the
//! three outcomes weighed by `h_m`, `h_n`, `h_o`; [`Breakdown`] splits it into the network's,
//! the hosts' (proxies and servers) and the clients' shares and the time spent waiting for the
//! timeout, which are the paper's "average network latency, average host latency and average
//! client latency".
//!
//! # What this reproduces
//!
//! [`sweep`] over [`Axis::Proxies`], [`Axis::Clients`] and [`Axis::ObjectSize`] gives the
//! three panels of Figure 6. The figure itself is not in the text we have, so the tests check
//! the shape the paper describes, not its numbers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What can be wrong with the model's input.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// A parameter is out of its range.
    #[error("model parameter `{parameter}` = {value} is invalid: it must be {expected}")]
    Invalid {
        /// The field of [`ModelParams`].
        parameter: &'static str,
        /// The value given, as text.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The master and neighbour hit rates add up to more than one.
    #[error(
        "master_hit_rate ({master}) + neighbour_hit_rate ({neighbour}) must not exceed 1 \
         (the rest is the miss rate)"
    )]
    HitRates {
        /// `master_hit_rate`.
        master: f64,
        /// `neighbour_hit_rate`.
        neighbour: f64,
    },
    /// `--set KEY=VALUE` named no parameter.
    #[error("unknown model parameter `{key}` (known: {known})")]
    UnknownParameter {
        /// The key given.
        key: String,
        /// The parameters there are, comma-separated.
        known: String,
    },
    /// `--set KEY=VALUE` gave a value the parameter cannot take.
    #[error("bad value for model parameter `{key}`: {message}")]
    BadValue {
        /// The parameter.
        key: String,
        /// Why.
        message: String,
    },
    /// An axis name that is not one of [`Axis::ALL`].
    #[error("unknown axis `{0}` (known: proxies, clients, size)")]
    UnknownAxis(String),
}

/// The parameters of the model: Table 1 of the paper, whose values are the `Default`.
///
/// Table 1 writes four entries as functions of `N`; they are kept here as the constants of
/// those functions (`subnet_fraction`, `positive_response_fraction`, `directory_alpha`,
/// `ack_ratio`) so that a sweep over `N` recomputes them, and the methods
/// ([`ModelParams::subnets`], …) give their values. The fifth, the probability that the master
/// is not the owner of a URL's directory entry, `(N−1)/N`, follows from hashing URLs evenly over
/// the proxies and is not a parameter.
///
/// In files and on the command line sizes are text like `"10 KiB"`, bandwidths like
/// `"100 Mbit/s"` and durations like `"40ms"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelParams {
    /// Table 1 "total number of proxy hosts in the distributed cache", `N` (count; 30).
    pub proxies: u32,
    /// Table 1 "average cross-sectional bandwidth of the network" (bits per second; 1 Gb/s).
    #[serde(with = "units::bit_rate")]
    pub network_bandwidth: f64,
    /// Table 1 "average bandwidth of proxy host" (bits per second; 100 Mb/s).
    #[serde(with = "units::bit_rate")]
    pub proxy_bandwidth: f64,
    /// Table 1 "size of a small IP packet": TCP control packets and acknowledgements (bytes; 40 B).
    #[serde(with = "units::size")]
    pub small_packet: u64,
    /// Table 1 "size of a medium IP packet": HTTP requests, redirects, ICP and directory
    /// messages (bytes; 180 B).
    #[serde(with = "units::size")]
    pub medium_packet: u64,
    /// Table 1 "size of a large IP packet", `L`: data packets (bytes; 1024 B).
    #[serde(with = "units::size")]
    pub large_packet: u64,
    /// Table 1 "total number of client hosts", `C` (count; 9100).
    pub clients: u32,
    /// Table 1 "average number of requests per client per second", `λ` (requests per second; 0.53).
    pub client_request_rate: f64,
    /// Table 1 "average bandwidth of client" (bits per second; 10 Mb/s).
    #[serde(with = "units::bit_rate")]
    pub client_bandwidth: f64,
    /// Table 1 "master cache hit rate", `h_m` (probability; 0.25).
    pub master_hit_rate: f64,
    /// Table 1 "neighbor cache hit rate", `h_n`: the master misses and some neighbour holds the
    /// object (probability; 0.30). The miss rate is `1 − h_m − h_n`.
    pub neighbour_hit_rate: f64,
    /// Table 1 "average size of Web object", `O` (bytes; 10 kB, read as 10 KiB so that
    /// `O/L = 10`).
    #[serde(with = "units::size")]
    pub object_size: u64,
    /// Table 1 "total number of acknowledgement packets to IP data packets",
    /// `max(1, 0.75·O/L)`: this is the 0.75 (acknowledgements per data packet).
    pub ack_ratio: f64,
    /// Table 1 "percentage of data packets that cause the TCP window to fill" (fraction; 0.10).
    pub window_fill_fraction: f64,
    /// Table 1 "total number of server hosts per distributed cache", `S` (count; 3).
    pub servers: u32,
    /// Table 1 "average bandwidth of a server host" (bits per second; 100 Mb/s).
    #[serde(with = "units::bit_rate")]
    pub server_bandwidth: f64,
    /// Table 1 "number of subnets that connect the proxy hosts", `D = max(1, 0.20·N)`: this is
    /// the 0.20 (subnets per proxy).
    pub subnet_fraction: f64,
    /// Table 1 "number of the positive responses from neighbor proxies",
    /// `R = max(1, 0.30·(N−1))`: this is the 0.30 (share of the neighbours holding an object
    /// that some neighbour holds).
    pub positive_response_fraction: f64,
    /// Table 1 "maximum number of dbDCM neighbor caches to which a master cache will broadcast
    /// a request for a Web object", `α = min(5, N)`: this is the 5 (count).
    pub directory_alpha: u32,
    /// Table 1 "probability that a dbDCM directory entry is accurate", `p` (probability; 0.75).
    pub directory_accuracy: f64,
    /// Table 1 "timeout period used by termination algorithm" (duration; 40 ms).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ModelParams {
    /// Table 1 of the paper.
    fn default() -> Self {
        Self {
            proxies: 30,
            network_bandwidth: 1e9,
            proxy_bandwidth: 100e6,
            small_packet: 40,
            medium_packet: 180,
            large_packet: 1024,
            clients: 9100,
            client_request_rate: 0.53,
            client_bandwidth: 10e6,
            master_hit_rate: 0.25,
            neighbour_hit_rate: 0.30,
            object_size: 10 * 1024,
            ack_ratio: 0.75,
            window_fill_fraction: 0.10,
            servers: 3,
            server_bandwidth: 100e6,
            subnet_fraction: 0.20,
            positive_response_fraction: 0.30,
            directory_alpha: 5,
            directory_accuracy: 0.75,
            timeout: Duration::from_millis(40),
        }
    }
}

impl ModelParams {
    /// Checks every parameter's range; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ModelError> {
        fn invalid(
            parameter: &'static str,
            value: impl fmt::Display,
            expected: &'static str,
        ) -> ModelError {
            ModelError::Invalid {
                parameter,
                value: value.to_string(),
                expected,
            }
        }
        let positive = |name: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(name, v, "a finite number above 0"))
            }
        };
        let probability = |name: &'static str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(invalid(name, v, "a probability, within 0..=1"))
            }
        };
        let count = |name: &'static str, v: u64, min: u64, expected: &'static str| {
            if v >= min {
                Ok(())
            } else {
                Err(invalid(name, v, expected))
            }
        };
        count(
            "proxies",
            self.proxies.into(),
            2,
            "at least 2 (a proxy and a neighbour)",
        )?;
        positive("network_bandwidth", self.network_bandwidth)?;
        positive("proxy_bandwidth", self.proxy_bandwidth)?;
        count("small_packet", self.small_packet, 1, "at least 1 byte")?;
        count("medium_packet", self.medium_packet, 1, "at least 1 byte")?;
        count("large_packet", self.large_packet, 1, "at least 1 byte")?;
        count("clients", self.clients.into(), 1, "at least 1")?;
        positive("client_request_rate", self.client_request_rate)?;
        positive("client_bandwidth", self.client_bandwidth)?;
        probability("master_hit_rate", self.master_hit_rate)?;
        probability("neighbour_hit_rate", self.neighbour_hit_rate)?;
        if self.master_hit_rate + self.neighbour_hit_rate > 1.0 + 1e-12 {
            return Err(ModelError::HitRates {
                master: self.master_hit_rate,
                neighbour: self.neighbour_hit_rate,
            });
        }
        count("object_size", self.object_size, 1, "at least 1 byte")?;
        positive("ack_ratio", self.ack_ratio)?;
        probability("window_fill_fraction", self.window_fill_fraction)?;
        count("servers", self.servers.into(), 1, "at least 1")?;
        positive("server_bandwidth", self.server_bandwidth)?;
        probability("subnet_fraction", self.subnet_fraction)?;
        probability(
            "positive_response_fraction",
            self.positive_response_fraction,
        )?;
        count(
            "directory_alpha",
            self.directory_alpha.into(),
            1,
            "at least 1",
        )?;
        probability("directory_accuracy", self.directory_accuracy)?;
        if self.timeout.is_zero() {
            return Err(invalid("timeout", "0s", "longer than zero"));
        }
        Ok(())
    }

    /// Requests per second reaching the mesh, `Λ = C·λ`.
    pub fn request_rate(&self) -> f64 {
        f64::from(self.clients) * self.client_request_rate
    }

    /// `O/L`: the object in data packets (possibly fractional).
    fn object_in_packets(&self) -> f64 {
        self.object_size as f64 / self.large_packet as f64
    }

    /// Data packets per object, `max(1, O/L)` (an expectation, so possibly fractional).
    pub fn data_packets(&self) -> f64 {
        self.object_in_packets().max(1.0)
    }

    /// Acknowledgements per object transfer, `max(1, 0.75·O/L)` (Table 1).
    pub fn acks_per_object(&self) -> f64 {
        (self.ack_ratio * self.object_in_packets()).max(1.0)
    }

    /// Subnets the multicast query is replicated on, `D = max(1, 0.20·N)` (Table 1).
    pub fn subnets(&self) -> f64 {
        (self.subnet_fraction * f64::from(self.proxies)).max(1.0)
    }

    /// Neighbours holding an object that some neighbour holds, `R = max(1, 0.30·(N−1))`
    /// (Table 1's positive responses).
    pub fn positive_responses(&self) -> f64 {
        (self.positive_response_fraction * f64::from(self.proxies.saturating_sub(1))).max(1.0)
    }

    /// The most holders a directory master queries, `α = min(5, N)` (Table 1).
    pub fn directory_fanout(&self) -> f64 {
        f64::from(self.directory_alpha.min(self.proxies))
    }

    /// Holders a directory master actually queries, `A = min(α, R)` (§3: at most α of the
    /// holders the entry lists).
    pub fn directory_queries(&self) -> f64 {
        self.directory_fanout().min(self.positive_responses())
    }

    /// Probability that the master is not the owner of the URL's directory entry, `(N−1)/N`
    /// (Table 1), so the lookup crosses the network.
    pub fn remote_directory_probability(&self) -> f64 {
        let n = f64::from(self.proxies);
        (n - 1.0) / n
    }

    /// The share of requests no proxy holds, `1 − h_m − h_n`.
    pub fn miss_rate(&self) -> f64 {
        (1.0 - self.master_hit_rate - self.neighbour_hit_rate).max(0.0)
    }

    /// Overrides one parameter from text, the way `--set KEY=VALUE` does: the value is read as
    /// a TOML value when it is one (`64`, `0.4`, `"20 KiB"`) and as a string otherwise
    /// (`20KiB`, `40ms`, `2 Gbit/s`). The result is not validated; call
    /// [`ModelParams::validate`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ModelError> {
        let bad = |message: String| ModelError::BadValue {
            key: key.to_string(),
            message,
        };
        let mut table = match toml::Value::try_from(&*self) {
            Ok(toml::Value::Table(t)) => t,
            Ok(_) => return Err(bad("the parameters are not a table".into())),
            Err(e) => return Err(bad(e.to_string())),
        };
        if !table.contains_key(key) {
            return Err(ModelError::UnknownParameter {
                key: key.to_string(),
                known: table.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        table.insert(key.to_string(), crate::spec::toml_value(value));
        *self = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.message().to_string()))?;
        Ok(())
    }
}

/// The three families of cooperation protocol the paper compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// The paper's dbDCM: a directory partitioned over the proxies by a hash of the URL.
    Directory,
    /// Squid's ICP: a query to every neighbour, a reply from each.
    Icp,
    /// The Berkeley protocol: an IP multicast query, replies from holders only, a redirect.
    Multicast,
}

impl Family {
    /// Every family, in the order curves are drawn.
    pub const ALL: [Family; 3] = [Family::Directory, Family::Icp, Family::Multicast];

    /// The name used in files and tables: `directory`, `icp`, `multicast`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Directory => "directory",
            Family::Icp => "icp",
            Family::Multicast => "multicast",
        }
    }

    /// The paper's name for the protocol: `dbDCM`, `Squid`, `Berkeley`.
    pub fn paper_name(self) -> &'static str {
        match self {
            Family::Directory => "dbDCM",
            Family::Icp => "Squid",
            Family::Multicast => "Berkeley",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind of resource that serves packets, each instance an M/G/1 queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// The `N` proxy hosts.
    ProxyHosts,
    /// The shared network between proxies and servers.
    Network,
    /// The `S` origin server hosts.
    ServerHosts,
    /// The `C` client hosts.
    ClientHosts,
}

impl Resource {
    /// Every resource, in the order reports list them.
    pub const ALL: [Resource; 4] = [
        Resource::ProxyHosts,
        Resource::Network,
        Resource::ServerHosts,
        Resource::ClientHosts,
    ];

    /// A name for tables: `proxy hosts`, `network`, `server hosts`, `client hosts`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::ProxyHosts => "proxy hosts",
            Resource::Network => "network",
            Resource::ServerHosts => "server hosts",
            Resource::ClientHosts => "client hosts",
        }
    }

    fn index(self) -> usize {
        match self {
            Resource::ProxyHosts => 0,
            Resource::Network => 1,
            Resource::ServerHosts => 2,
            Resource::ClientHosts => 3,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mean latency of a request, or the resource that makes it unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Latency {
    /// A finite mean, in seconds.
    Finite(f64),
    /// Some resource has a utilisation of 1 or more: queues grow without bound.
    Saturated {
        /// The most utilised resource.
        resource: Resource,
    },
}

impl Latency {
    /// The mean in seconds, if finite.
    pub fn seconds(self) -> Option<f64> {
        match self {
            Latency::Finite(s) => Some(s),
            Latency::Saturated { .. } => None,
        }
    }

    /// The mean in milliseconds, if finite.
    pub fn millis(self) -> Option<f64> {
        self.seconds().map(|s| s * 1e3)
    }

    /// Whether some resource is saturated.
    pub fn is_saturated(self) -> bool {
        matches!(self, Latency::Saturated { .. })
    }
}

impl fmt::Display for Latency {
    /// `12.34 ms` or `saturated (network)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Latency::Finite(s) => write!(f, "{:.2} ms", s * 1e3),
            Latency::Saturated { resource } => write!(f, "saturated ({resource})"),
        }
    }
}

/// Time spent, split by what it was spent on (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Parts {
    /// Queueing and transmission on the shared network.
    pub network_s: f64,
    /// Queueing and transmission at proxy and server hosts.
    pub host_s: f64,
    /// Queueing and transmission at the client host.
    pub client_s: f64,
    /// Waiting for the termination timeout.
    pub timeout_s: f64,
}

impl Parts {
    /// The sum of the parts.
    pub fn total_s(&self) -> f64 {
        self.network_s + self.host_s + self.client_s + self.timeout_s
    }

    fn add(self, other: Parts) -> Parts {
        Parts {
            network_s: self.network_s + other.network_s,
            host_s: self.host_s + other.host_s,
            client_s: self.client_s + other.client_s,
            timeout_s: self.timeout_s + other.timeout_s,
        }
    }

    fn scale(self, k: f64) -> Parts {
        Parts {
            network_s: self.network_s * k,
            host_s: self.host_s * k,
            client_s: self.client_s * k,
            timeout_s: self.timeout_s * k,
        }
    }

    fn charge(&mut self, resource: Resource, seconds: f64) {
        match resource {
            Resource::Network => self.network_s += seconds,
            Resource::ProxyHosts | Resource::ServerHosts => self.host_s += seconds,
            Resource::ClientHosts => self.client_s += seconds,
        }
    }
}

/// One outcome of a request: its probability and its mean time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The probability of the outcome (Table 1's hit rates, or the miss rate).
    pub probability: f64,
    /// The mean time of a request with this outcome.
    pub time: Parts,
}

/// The timing analysis of one family (present when nothing saturates).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The master cache holds the object.
    pub master_hit: Outcome,
    /// A neighbour holds it (for the directory family this includes the searches that find no
    /// accurate holder and end at the origin server).
    pub neighbour_hit: Outcome,
    /// Nobody holds it: the origin server serves it.
    pub miss: Outcome,
    /// The mean over the three outcomes: the latency per request, split.
    pub mean: Parts,
}

/// The load on one kind of resource (per instance).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// The resource.
    pub resource: Resource,
    /// Packets per second arriving at one instance.
    pub packets_per_s: f64,
    /// Bits per second through one instance.
    pub bits_per_s: f64,
    /// Its utilisation `ρ` (1 or more: saturated).
    pub utilisation: f64,
    /// The Pollaczek–Khinchine mean wait of a packet, in seconds (none when saturated).
    pub mean_wait_s: Option<f64>,
}

/// Everything the model computes for one family at one set of parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// The family.
    pub family: Family,
    /// The mean latency per request.
    pub latency: Latency,
    /// The load on each resource, in [`Resource::ALL`] order.
    pub loads: Vec<Load>,
    /// The timing of the three outcomes; `None` when saturated.
    pub timing: Option<Timing>,
}

impl Breakdown {
    /// The load on `resource`.
    pub fn load(&self, resource: Resource) -> &Load {
        &self.loads[resource.index()]
    }
}

/// The Pollaczek–Khinchine mean waiting time of an M/G/1 queue, `λ E[S²] / (2 (1 − ρ))` with
/// `ρ = λ E[S]` (arrival rate per second, service time moments in seconds and seconds²).
/// `None` when `ρ ≥ 1`.
pub fn pk_mean_wait(arrival_rate: f64, mean_service: f64, second_moment: f64) -> Option<f64> {
    let rho = arrival_rate * mean_service;
    (rho < 1.0).then(|| arrival_rate * second_moment / (2.0 * (1.0 - rho)))
}

/// The mean latency per request of `family`.
pub fn latency(params: &ModelParams, family: Family) -> Result<Latency, ModelError> {
    Ok(breakdown(params, family)?.latency)
}

/// The loads, the timing analysis and the mean latency per request of `family`.
pub fn breakdown(params: &ModelParams, family: Family) -> Result<Breakdown, ModelError> {
    params.validate()?;
    let traffic = Traffic::of(params, family);
    let stations = Stations::new(params, &traffic);
    let loads: Vec<Load> = Resource::ALL
        .iter()
        .map(|&r| {
            let s = stations.get(r);
            Load {
                resource: r,
                packets_per_s: s.packets_per_s,
                bits_per_s: s.utilisation * s.bandwidth,
                utilisation: s.utilisation,
                mean_wait_s: s.wait,
            }
        })
        .collect();
    let worst = loads
        .iter()
        .filter(|l| l.mean_wait_s.is_none())
        .max_by(|a, b| a.utilisation.total_cmp(&b.utilisation));
    if let Some(worst) = worst {
        return Ok(Breakdown {
            family,
            latency: Latency::Saturated {
                resource: worst.resource,
            },
            loads,
            timing: None,
        });
    }
    let timing = Timer {
        p: params,
        s: &stations,
    }
    .timing(family);
    Ok(Breakdown {
        family,
        latency: Latency::Finite(timing.mean.total_s()),
        loads,
        timing: Some(timing),
    })
}

/// The quantity a [`sweep`] varies: the x axis of one panel of Figure 6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// Figure 6a: the number of proxy hosts `N`.
    Proxies,
    /// Figure 6b: the number of client hosts `C` (with `N = 30`).
    Clients,
    /// Figure 6c: the Web object size `O`, in KiB (with `N = 30`).
    ObjectSize,
}

impl Axis {
    /// The three panels, in the paper's order.
    pub const ALL: [Axis; 3] = [Axis::Proxies, Axis::Clients, Axis::ObjectSize];

    /// The name on the command line: `proxies`, `clients`, `size`.
    pub fn as_str(self) -> &'static str {
        match self {
            Axis::Proxies => "proxies",
            Axis::Clients => "clients",
            Axis::ObjectSize => "size",
        }
    }

    /// The panel of Figure 6: `figure6a`, `figure6b`, `figure6c` (the files' stems).
    pub fn figure(self) -> &'static str {
        match self {
            Axis::Proxies => "figure6a",
            Axis::Clients => "figure6b",
            Axis::ObjectSize => "figure6c",
        }
    }

    /// The x axis label, with its unit.
    pub fn label(self) -> &'static str {
        match self {
            Axis::Proxies => "proxy hosts N",
            Axis::Clients => "client hosts C",
            Axis::ObjectSize => "Web object size O (KiB)",
        }
    }

    /// Whether the panel reads best with a logarithmic x axis.
    pub fn log_x(self) -> bool {
        matches!(self, Axis::Proxies)
    }

    /// The x values of the panel: wide enough to show where each family saturates at the
    /// Table 1 values of the other parameters.
    pub fn default_values(self) -> Vec<f64> {
        let v: &[f64] = match self {
            Axis::Proxies => &[
                2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 30.0, 40.0, 50.0, 64.0, 80.0,
                100.0, 128.0, 160.0, 200.0, 256.0, 320.0, 400.0, 512.0, 640.0, 800.0, 1024.0,
            ],
            Axis::Clients => &[
                1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0, 8000.0, 9100.0, 10000.0,
                11000.0, 12000.0, 13000.0, 14000.0, 15000.0, 16000.0, 18000.0, 20000.0, 22000.0,
                24000.0, 26000.0, 28000.0, 30000.0, 32000.0,
            ],
            Axis::ObjectSize => &[
                0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0, 16.0, 18.0, 20.0, 22.0, 24.0, 28.0, 32.0,
            ],
        };
        v.to_vec()
    }

    /// `params` with this axis's quantity set to `x` (a whole number of proxies or clients,
    /// or a size in KiB).
    pub fn apply(self, params: &ModelParams, x: f64) -> Result<ModelParams, ModelError> {
        let whole = |parameter: &'static str, expected: &'static str| {
            if x.is_finite() && x.fract() == 0.0 && x >= 0.0 && x <= f64::from(u32::MAX) {
                Ok(x as u32)
            } else {
                Err(ModelError::Invalid {
                    parameter,
                    value: x.to_string(),
                    expected,
                })
            }
        };
        let mut p = params.clone();
        match self {
            Axis::Proxies => p.proxies = whole("proxies", "a whole number of proxies")?,
            Axis::Clients => p.clients = whole("clients", "a whole number of clients")?,
            Axis::ObjectSize => {
                if !(x.is_finite() && x > 0.0) {
                    return Err(ModelError::Invalid {
                        parameter: "object_size",
                        value: format!("{x} KiB"),
                        expected: "a size above 0",
                    });
                }
                p.object_size = (x * 1024.0).round().max(1.0) as u64;
            }
        }
        p.validate()?;
        Ok(p)
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Axis {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Axis::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| ModelError::UnknownAxis(s.to_string()))
    }
}

/// One point of a curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The value of the swept quantity (see [`Axis`] for its unit).
    pub x: f64,
    /// The mean latency per request there.
    pub latency: Latency,
}

/// One family's latency along an axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// The family.
    pub family: Family,
    /// The points, in the order of the values swept.
    pub points: Vec<Point>,
}

/// The mean latency of every family at each of `values` of `axis`, the other parameters as in
/// `params`: one panel of Figure 6. One curve per family, in [`Family::ALL`] order.
pub fn sweep(params: &ModelParams, axis: Axis, values: &[f64]) -> Result<Vec<Curve>, ModelError> {
    let points: Vec<ModelParams> = values
        .iter()
        .map(|&x| axis.apply(params, x))
        .collect::<Result<_, _>>()?;
    Family::ALL
        .iter()
        .map(|&family| {
            let points = values
                .iter()
                .zip(&points)
                .map(|(&x, p)| {
                    Ok(Point {
                        x,
                        latency: latency(p, family)?,
                    })
                })
                .collect::<Result<_, ModelError>>()?;
            Ok(Curve { family, points })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Step 1: packets per request
// ---------------------------------------------------------------------------

/// Expected packets per request of each size class.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Packets {
    small: f64,
    medium: f64,
    large: f64,
}

impl Packets {
    fn add(&mut self, other: Packets, weight: f64) {
        self.small += other.small * weight;
        self.medium += other.medium * weight;
        self.large += other.large * weight;
    }

    fn medium(n: f64) -> Packets {
        Packets {
            medium: n,
            ..Packets::default()
        }
    }
}

/// Expected packets per request handled by all instances of each resource together (the
/// network counts each packet once, hosts count what they send and what they receive).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Traffic {
    proxy: Packets,
    network: Packets,
    server: Packets,
    client: Packets,
}

/// Which hosts a TCP transfer joins.
#[derive(Clone, Copy)]
enum Ends {
    ClientMaster,
    ClientNeighbour,
    ProxyProxy,
    ProxyServer,
}

impl Traffic {
    fn of(p: &ModelParams, family: Family) -> Traffic {
        let n = f64::from(p.proxies);
        let (h_m, h_n, h_o) = (p.master_hit_rate, p.neighbour_hit_rate, p.miss_rate());
        let q = p.remote_directory_probability();
        let transfer = Packets {
            small: 6.0 + p.acks_per_object(),
            medium: 1.0,
            large: p.data_packets(),
        };
        // A connection that carries an HTTP redirect instead of the object.
        let redirect = Packets {
            small: 7.0,
            medium: 2.0,
            large: 0.0,
        };
        let mut t = Traffic::default();
        match family {
            Family::Icp => {
                t.tcp(Ends::ClientMaster, transfer, 1.0);
                // N−1 queries and N−1 replies, each sent by one proxy and received by another.
                t.proxy.add(Packets::medium(4.0 * (n - 1.0)), 1.0 - h_m);
                t.network.add(Packets::medium(2.0 * (n - 1.0)), 1.0 - h_m);
                t.tcp(Ends::ProxyProxy, transfer, h_n);
                t.tcp(Ends::ProxyServer, transfer, h_o);
            }
            Family::Multicast => {
                t.tcp(Ends::ClientMaster, transfer, h_m + h_o);
                t.tcp(Ends::ClientMaster, redirect, h_n);
                t.tcp(Ends::ClientNeighbour, transfer, h_n);
                // One send, D copies on the network, N−1 receptions.
                t.proxy.add(Packets::medium(n), 1.0 - h_m);
                t.network.add(Packets::medium(p.subnets()), 1.0 - h_m);
                // Holders reply; nobody else does.
                let r = p.positive_responses();
                t.proxy.add(Packets::medium(2.0 * r), h_n);
                t.network.add(Packets::medium(r), h_n);
                t.tcp(Ends::ProxyServer, transfer, h_o);
            }
            Family::Directory => {
                let a = p.directory_queries();
                let found = p.directory_found_probability();
                t.tcp(Ends::ClientMaster, transfer, 1.0);
                // Lookup and answer, and the eviction notice for what the master admits.
                t.proxy.add(Packets::medium(3.0 * 2.0 * q), 1.0 - h_m);
                t.network.add(Packets::medium(3.0 * q), 1.0 - h_m);
                // Queries to A holders and their replies: on every neighbour hit, and on a
                // miss whose directory entry is stale.
                let queried = h_n + h_o * (1.0 - p.directory_accuracy);
                t.proxy.add(Packets::medium(4.0 * a), queried);
                t.network.add(Packets::medium(2.0 * a), queried);
                t.tcp(Ends::ProxyProxy, transfer, h_n * found);
                let origin = h_n * (1.0 - found) + h_o;
                t.tcp(Ends::ProxyServer, transfer, origin);
                // "I hold it" to the owner after a fetch from the origin server.
                t.proxy.add(Packets::medium(2.0 * q), origin);
                t.network.add(Packets::medium(q), origin);
            }
        }
        t
    }

    /// Adds one TCP connection carrying `packets` between `ends`, with probability `weight`.
    fn tcp(&mut self, ends: Ends, packets: Packets, weight: f64) {
        match ends {
            Ends::ClientMaster => {
                self.client.add(packets, weight);
                self.proxy.add(packets, weight);
            }
            Ends::ClientNeighbour => {
                self.client.add(packets, weight);
                self.proxy.add(packets, weight);
                self.network.add(packets, weight);
            }
            Ends::ProxyProxy => {
                self.proxy.add(packets, 2.0 * weight);
                self.network.add(packets, weight);
            }
            Ends::ProxyServer => {
                self.proxy.add(packets, weight);
                self.server.add(packets, weight);
                self.network.add(packets, weight);
            }
        }
    }
}

impl ModelParams {
    /// Probability that at least one of the `A` holders a directory master queries still has
    /// the object, `1 − (1 − p)^A`.
    fn directory_found_probability(&self) -> f64 {
        1.0 - (1.0 - self.directory_accuracy).powf(self.directory_queries())
    }
}

// ---------------------------------------------------------------------------
// Step 2: M/G/1 queues
// ---------------------------------------------------------------------------

/// One instance of a resource as an M/G/1 queue.
#[derive(Clone, Copy, Debug)]
struct Station {
    /// Bits per second.
    bandwidth: f64,
    packets_per_s: f64,
    utilisation: f64,
    /// `None` when saturated.
    wait: Option<f64>,
}

impl Station {
    /// A queue fed `per_request` packets for each of `requests_per_s` requests.
    fn new(p: &ModelParams, bandwidth: f64, per_request: Packets, requests_per_s: f64) -> Station {
        let classes = [
            (per_request.small, p.small_packet),
            (per_request.medium, p.medium_packet),
            (per_request.large, p.large_packet),
        ];
        let (mut lambda, mut rho, mut second) = (0.0, 0.0, 0.0);
        for (count, bytes) in classes {
            let rate = count * requests_per_s;
            let service = bytes as f64 * 8.0 / bandwidth;
            lambda += rate;
            rho += rate * service;
            second += rate * service * service;
        }
        // pk_mean_wait with λ·E[S] = ρ and λ·E[S²] = `second`.
        let wait = if lambda > 0.0 {
            pk_mean_wait(lambda, rho / lambda, second / lambda)
        } else {
            Some(0.0)
        };
        Station {
            bandwidth,
            packets_per_s: lambda,
            utilisation: rho,
            wait,
        }
    }
}

/// The four kinds of resource, indexed by [`Resource::index`].
struct Stations([Station; 4]);

impl Stations {
    fn new(p: &ModelParams, t: &Traffic) -> Stations {
        let rate = p.request_rate();
        Stations([
            Station::new(p, p.proxy_bandwidth, t.proxy, rate / f64::from(p.proxies)),
            Station::new(p, p.network_bandwidth, t.network, rate),
            Station::new(p, p.server_bandwidth, t.server, rate / f64::from(p.servers)),
            Station::new(p, p.client_bandwidth, t.client, p.client_request_rate),
        ])
    }

    fn get(&self, r: Resource) -> &Station {
        &self.0[r.index()]
    }
}

// ---------------------------------------------------------------------------
// Step 3: timing
// ---------------------------------------------------------------------------

use Resource::{ClientHosts as Cl, Network as Net, ProxyHosts as Px, ServerHosts as Sv};

/// Client and its master proxy (the client's access link).
const CLIENT_MASTER: &[Resource] = &[Cl, Px];
/// Two proxies.
const PROXY_PROXY: &[Resource] = &[Px, Net, Px];
/// A proxy and an origin server.
const PROXY_SERVER: &[Resource] = &[Px, Net, Sv];
/// A client and a proxy other than its master (the multicast family's redirect).
const CLIENT_NEIGHBOUR: &[Resource] = &[Cl, Net, Px];
/// A holder's data relayed by the master to the client.
const NEIGHBOUR_RELAY: &[Resource] = &[Px, Net, Px, Px, Cl];
/// A server's data relayed by the master to the client.
const SERVER_RELAY: &[Resource] = &[Sv, Net, Px, Px, Cl];
/// A query and its reply between two proxies, once it has left the master's queue (network,
/// the neighbour receiving, the neighbour replying, network).
const QUERY_ROUND: &[Resource] = &[Net, Px, Px, Net];

/// Walks the timing diagrams with the queues' delays.
struct Timer<'a> {
    p: &'a ModelParams,
    s: &'a Stations,
}

impl Timer<'_> {
    fn service(&self, r: Resource, bytes: u64) -> f64 {
        bytes as f64 * 8.0 / self.s.get(r).bandwidth
    }

    fn wait(&self, r: Resource) -> f64 {
        self.s.get(r).wait.unwrap_or(f64::INFINITY)
    }

    /// One packet of `bytes` through `path`: wait and service at each resource.
    fn hop(&self, path: &[Resource], bytes: u64) -> Parts {
        let mut parts = Parts::default();
        for &r in path {
            parts.charge(r, self.wait(r) + self.service(r, bytes));
        }
        parts
    }

    /// `count` packets of `bytes` sent back to back through `path`: the first as a hop, the
    /// others at the pace of the bottleneck's residual capacity.
    fn burst(&self, path: &[Resource], bytes: u64, count: f64) -> Parts {
        let mut parts = self.hop(path, bytes);
        let extra = (count - 1.0).max(0.0);
        if extra > 0.0 {
            let pace = |r: Resource| {
                let visits = path.iter().filter(|&&x| x == r).count() as f64;
                visits * self.service(r, bytes) / (1.0 - self.s.get(r).utilisation)
            };
            let bottleneck = Resource::ALL
                .into_iter()
                .filter(|r| path.contains(r))
                .max_by(|a, b| pace(*a).total_cmp(&pace(*b)));
            if let Some(r) = bottleneck {
                parts.charge(r, extra * pace(r));
            }
        }
        parts
    }

    /// SYN, SYN-ACK, then the request, over `path`.
    fn connect(&self, path: &[Resource]) -> Parts {
        let s = self.hop(path, self.p.small_packet);
        s.add(s).add(self.hop(path, self.p.medium_packet))
    }

    /// The window stalls of one TCP leg: each costs an acknowledgement back and a data packet
    /// forward.
    fn stalls(&self, leg: &[Resource]) -> Parts {
        let n = self.p.window_fill_fraction * self.p.data_packets();
        self.hop(leg, self.p.small_packet)
            .add(self.hop(leg, self.p.large_packet))
            .scale(n)
    }

    /// The object's data through `path`, with the stalls of each TCP leg in `legs`.
    fn transfer(&self, path: &[Resource], legs: &[&[Resource]]) -> Parts {
        let mut parts = self.burst(path, self.p.large_packet, self.p.data_packets());
        for leg in legs {
            parts = parts.add(self.stalls(leg));
        }
        parts
    }

    /// A search, cut at the termination timeout.
    fn bounded(&self, search: Parts) -> Parts {
        let limit = self.p.timeout.as_secs_f64();
        if search.total_s() > limit {
            Parts {
                timeout_s: limit,
                ..Parts::default()
            }
        } else {
            search
        }
    }

    /// The master sends `rank` queries back to back, the last one reaches a neighbour and
    /// comes back, the master processes `rank` replies.
    fn query_round(&self, rank: f64) -> Parts {
        let m = self.p.medium_packet;
        let out = self.burst(&[Px], m, rank);
        out.add(self.hop(QUERY_ROUND, m)).add(out)
    }

    /// Fetch from a holder, relayed to the client.
    fn neighbour_fetch(&self) -> Parts {
        self.connect(PROXY_PROXY)
            .add(self.transfer(NEIGHBOUR_RELAY, &[PROXY_PROXY, CLIENT_MASTER]))
    }

    /// Fetch from an origin server, relayed to the client.
    fn origin_fetch(&self) -> Parts {
        self.connect(PROXY_SERVER)
            .add(self.transfer(SERVER_RELAY, &[PROXY_SERVER, CLIENT_MASTER]))
    }

    fn timing(&self, family: Family) -> Timing {
        let p = self.p;
        let m = p.medium_packet;
        let n = f64::from(p.proxies);
        let open = self.connect(CLIENT_MASTER);
        let master_hit = open.add(self.transfer(CLIENT_MASTER, &[CLIENT_MASTER]));
        let (neighbour_hit, miss) = match family {
            Family::Icp => {
                let k = n - 1.0;
                let first = (k + 1.0) / (p.positive_responses() + 1.0);
                let hit = self.bounded(self.query_round(first));
                let all = self.bounded(self.query_round(k));
                (
                    open.add(hit).add(self.neighbour_fetch()),
                    open.add(all).add(self.origin_fetch()),
                )
            }
            Family::Multicast => {
                let hit = self.bounded(self.query_round(1.0));
                let redirect = self
                    .hop(CLIENT_MASTER, m)
                    .add(self.connect(CLIENT_NEIGHBOUR))
                    .add(self.transfer(CLIENT_NEIGHBOUR, &[CLIENT_NEIGHBOUR]));
                let wait = Parts {
                    timeout_s: p.timeout.as_secs_f64(),
                    ..Parts::default()
                };
                (
                    open.add(hit).add(redirect),
                    open.add(wait).add(self.origin_fetch()),
                )
            }
            Family::Directory => {
                let q = p.remote_directory_probability();
                let a = p.directory_queries();
                let acc = p.directory_accuracy;
                let lookup = self.hop(PROXY_PROXY, m).scale(2.0 * q);
                let found = p.directory_found_probability();
                let first = first_success_rank(acc, a);
                let hit = self.bounded(self.query_round(first));
                let none = self.bounded(self.query_round(a));
                let origin = self.origin_fetch();
                let neighbour = hit
                    .add(self.neighbour_fetch())
                    .scale(found)
                    .add(none.add(origin).scale(1.0 - found));
                let miss = none.scale(1.0 - acc).add(origin);
                (open.add(lookup).add(neighbour), open.add(lookup).add(miss))
            }
        };
        let outcome = |probability: f64, time: Parts| Outcome { probability, time };
        let master_hit = outcome(p.master_hit_rate, master_hit);
        let neighbour_hit = outcome(p.neighbour_hit_rate, neighbour_hit);
        let miss = outcome(p.miss_rate(), miss);
        let mean = master_hit
            .time
            .scale(master_hit.probability)
            .add(neighbour_hit.time.scale(neighbour_hit.probability))
            .add(miss.time.scale(miss.probability));
        Timing {
            master_hit,
            neighbour_hit,
            miss,
            mean,
        }
    }
}

/// The expected rank of the first success among `tries` (possibly fractional) independent
/// tries of probability `p`, given that one succeeds:
/// `Σ_{j≤A} j p (1−p)^{j−1} / (1 − (1−p)^A) = (1 − (1−p)^A (1 + A p)) / (p (1 − (1−p)^A))`.
fn first_success_rank(p: f64, tries: f64) -> f64 {
    let fail_all = (1.0 - p).powf(tries);
    if p <= 0.0 || fail_all >= 1.0 {
        return tries.max(1.0);
    }
    ((1.0 - fail_all * (1.0 + tries * p)) / (p * (1.0 - fail_all))).max(1.0)
}

// ---------------------------------------------------------------------------
// Units in files: sizes and bit rates as text
// ---------------------------------------------------------------------------

mod units {
    /// Sizes as IEC text ("10 KiB") or byte counts.
    pub mod size {
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&bytesize::ByteSize(*v).display().iec().to_string())
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Raw {
                Bytes(u64),
                Text(String),
            }
            match Raw::deserialize(d)? {
                Raw::Bytes(n) => Ok(n),
                Raw::Text(t) => t.parse::<bytesize::ByteSize>().map(|b| b.0).map_err(|e| {
                    serde::de::Error::custom(format!(
                        "invalid size {t:?} ({e}); write e.g. \"10 KiB\""
                    ))
                }),
            }
        }
    }

    /// Bit rates as text ("100 Mbit/s", "1 Gb/s") or bits per second.
    pub mod bit_rate {
        use serde::{Deserialize, Deserializer, Serializer};

        const UNITS: [(f64, &str); 4] = [(1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")];

        /// The rate with the largest unit it is at least one of: "100 Mbit/s".
        pub fn format(v: f64) -> String {
            let (scale, prefix) = UNITS
                .into_iter()
                .find(|(scale, _)| v.abs() >= *scale)
                .unwrap_or((1.0, ""));
            format!("{} {prefix}bit/s", v / scale)
        }

        /// Reads "100 Mbit/s", "100Mb/s", "1 Gbps", "1e9 bit/s" or a plain number (bit/s).
        pub fn parse(text: &str) -> Result<f64, String> {
            let t = text.trim();
            let split = t
                .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
                .unwrap_or(t.len());
            let (number, unit) = t.split_at(split);
            let number: f64 = number
                .trim()
                .parse()
                .map_err(|_| format!("invalid bit rate {text:?}; write e.g. \"100 Mbit/s\""))?;
            let scale = match unit.trim() {
                "" | "bit/s" | "b/s" | "bps" => 1.0,
                "kbit/s" | "kb/s" | "kbps" | "Kbit/s" | "Kb/s" => 1e3,
                "Mbit/s" | "Mb/s" | "Mbps" => 1e6,
                "Gbit/s" | "Gb/s" | "Gbps" => 1e9,
                other => {
                    return Err(format!(
                        "unknown bit rate unit {other:?} in {text:?}; use bit/s, kbit/s, Mbit/s or Gbit/s"
                    ))
                }
            };
            Ok(number * scale)
        }

        pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&format(*v))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Raw {
                Number(f64),
                Text(String),
            }
            match Raw::deserialize(d)? {
                Raw::Number(n) => Ok(n),
                Raw::Text(t) => parse(&t).map_err(serde::de::Error::custom),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(axis: Axis, x: f64) -> ModelParams {
        axis.apply(&ModelParams::default(), x).unwrap()
    }

    fn lat(p: &ModelParams, f: Family) -> Latency {
        latency(p, f).unwrap()
    }

    fn ms(p: &ModelParams, f: Family) -> f64 {
        lat(p, f)
            .millis()
            .unwrap_or_else(|| panic!("{f} saturated: {}", lat(p, f)))
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    #[test]
    fn defaults_are_table_1() {
        let p = ModelParams::default();
        assert_eq!(p.proxies, 30);
        assert_eq!(p.network_bandwidth, 1e9);
        assert_eq!(p.proxy_bandwidth, 1e8);
        assert_eq!(
            (p.small_packet, p.medium_packet, p.large_packet),
            (40, 180, 1024)
        );
        assert_eq!(p.clients, 9100);
        assert_eq!(p.client_request_rate, 0.53);
        assert_eq!(p.client_bandwidth, 1e7);
        assert_eq!((p.master_hit_rate, p.neighbour_hit_rate), (0.25, 0.30));
        assert_eq!(p.object_size, 10_240);
        assert_eq!(p.window_fill_fraction, 0.10);
        assert_eq!((p.servers, p.server_bandwidth), (3, 1e8));
        assert_eq!(p.directory_accuracy, 0.75);
        assert_eq!(p.timeout, Duration::from_millis(40));
        // Table 1's formulas at N = 30, O/L = 10.
        assert_eq!(p.data_packets(), 10.0);
        assert_eq!(p.acks_per_object(), 7.5);
        assert_eq!(p.subnets(), 6.0);
        assert!(close(p.positive_responses(), 8.7, 1e-12));
        assert_eq!(p.directory_fanout(), 5.0);
        assert_eq!(p.directory_queries(), 5.0);
        assert!(close(p.remote_directory_probability(), 29.0 / 30.0, 1e-12));
        assert!(close(p.miss_rate(), 0.45, 1e-12));
        assert!(close(p.request_rate(), 4823.0, 1e-12));
        p.validate().unwrap();
    }

    #[test]
    fn table_1_formulas_have_their_floors_and_caps() {
        let p = at(Axis::Proxies, 2.0);
        assert_eq!(p.subnets(), 1.0); // max(1, 0.4)
        assert_eq!(p.positive_responses(), 1.0); // max(1, 0.3)
        assert_eq!(p.directory_fanout(), 2.0); // min(5, 2)
        assert_eq!(p.directory_queries(), 1.0); // min(α, R)
        let small = at(Axis::ObjectSize, 0.5);
        assert_eq!(small.data_packets(), 1.0);
        assert_eq!(small.acks_per_object(), 1.0);
    }

    #[test]
    fn pollaczek_khinchine_by_hand() {
        // M/D/1: λ = 50/s, S = 10 ms: ρ = 0.5, W = 50 · 1e-4 / (2 · 0.5) = 5 ms.
        let w = pk_mean_wait(50.0, 0.010, 0.010 * 0.010).unwrap();
        assert!(close(w, 0.005, 1e-12), "{w}");
        // M/M/1: E[S²] = 2 E[S]², W = ρ/(1−ρ) E[S] = 0.8/0.2 · 10 ms = 40 ms.
        let w = pk_mean_wait(80.0, 0.010, 2.0 * 0.010 * 0.010).unwrap();
        assert!(close(w, 0.040, 1e-12), "{w}");
        assert_eq!(pk_mean_wait(100.0, 0.010, 1e-4), None);
        assert_eq!(pk_mean_wait(200.0, 0.010, 1e-4), None);
    }

    #[test]
    fn a_station_mixes_packet_sizes_as_pollaczek_khinchine_says() {
        let p = ModelParams::default();
        // 1000 small and 1000 large packets per second on a 100 Mbit/s host.
        let per_request = Packets {
            small: 1.0,
            medium: 0.0,
            large: 1.0,
        };
        let s = Station::new(&p, 100e6, per_request, 1000.0);
        let (s1, s2) = (40.0 * 8.0 / 100e6, 1024.0 * 8.0 / 100e6);
        let rho = 1000.0 * (s1 + s2);
        assert!(close(s.utilisation, rho, 1e-12));
        let w = 1000.0 * (s1 * s1 + s2 * s2) / (2.0 * (1.0 - rho));
        assert!(close(s.wait.unwrap(), w, 1e-12));
        assert_eq!(s.packets_per_s, 2000.0);
    }

    #[test]
    fn an_idle_master_hit_is_the_sum_of_transmission_times() {
        // One client making a request every 100 s: every queue is practically empty.
        let p = ModelParams {
            clients: 1,
            client_request_rate: 0.01,
            ..ModelParams::default()
        };
        let b = breakdown(&p, Family::Icp).unwrap();
        let t = b.timing.unwrap().master_hit.time.total_s();
        let tx = |bytes: f64| bytes * 8.0 / 10e6 + bytes * 8.0 / 100e6;
        let connect = 2.0 * tx(40.0) + tx(180.0);
        // First data packet through proxy and client, 9 more at the client's pace, one
        // window stall (10% of 10 packets): an ack back and a data packet forward.
        let data = tx(1024.0) + 9.0 * 1024.0 * 8.0 / 10e6 + (tx(40.0) + tx(1024.0));
        assert!(close(t, connect + data, 1e-3), "{t} vs {}", connect + data);
    }

    #[test]
    fn breakdown_parts_add_up_to_the_latency() {
        for f in Family::ALL {
            let b = breakdown(&ModelParams::default(), f).unwrap();
            let timing = b.timing.unwrap();
            let sum = timing.master_hit.time.total_s() * 0.25
                + timing.neighbour_hit.time.total_s() * 0.30
                + timing.miss.time.total_s() * 0.45;
            assert!(close(b.latency.seconds().unwrap(), sum, 1e-12), "{f}");
            assert!(close(timing.mean.total_s(), sum, 1e-12), "{f}");
        }
    }

    #[test]
    fn figure_6a_few_proxies_saturate_every_family_on_proxy_hosts() {
        for n in [2.0, 4.0] {
            let p = at(Axis::Proxies, n);
            for f in Family::ALL {
                assert_eq!(
                    lat(&p, f),
                    Latency::Saturated {
                        resource: Resource::ProxyHosts
                    },
                    "{f} at N = {n}"
                );
            }
        }
    }

    #[test]
    fn figure_6a_many_proxies_saturate_icp_and_multicast_on_the_network() {
        let p = at(Axis::Proxies, 1024.0);
        let net = Latency::Saturated {
            resource: Resource::Network,
        };
        assert_eq!(lat(&p, Family::Icp), net);
        assert_eq!(lat(&p, Family::Multicast), net);
        // The directory stays finite and flat: within 5% from 64 to 1024 proxies.
        let d64 = ms(&at(Axis::Proxies, 64.0), Family::Directory);
        let d1024 = ms(&p, Family::Directory);
        assert!(
            close(d1024, d64, 0.05),
            "{d64} ms at 64, {d1024} ms at 1024"
        );
        assert!(d1024 < 30.0, "{d1024} ms");
    }

    #[test]
    fn figure_6a_icp_saturates_first_then_multicast_and_never_the_directory() {
        let first_saturated = |f: Family| {
            Axis::Proxies
                .default_values()
                .into_iter()
                .filter(|&n| n >= 30.0)
                .find(|&n| lat(&at(Axis::Proxies, n), f).is_saturated())
        };
        let icp = first_saturated(Family::Icp).unwrap();
        let multicast = first_saturated(Family::Multicast).unwrap();
        assert!(icp < multicast, "icp at {icp}, multicast at {multicast}");
        assert_eq!(first_saturated(Family::Directory), None);
        // At Table 1's N = 30 all three are finite.
        for f in Family::ALL {
            assert!(!lat(&ModelParams::default(), f).is_saturated(), "{f}");
        }
    }

    #[test]
    fn directory_network_load_does_not_grow_with_the_mesh() {
        let net = |n: f64, f: Family| {
            breakdown(&at(Axis::Proxies, n), f)
                .unwrap()
                .load(Resource::Network)
                .utilisation
        };
        let (d30, d512) = (net(30.0, Family::Directory), net(512.0, Family::Directory));
        assert!(d512 < d30 * 1.05, "{d30} → {d512}");
        let (i30, i60) = (net(30.0, Family::Icp), net(60.0, Family::Icp));
        assert!(i60 > i30 * 1.3, "{i30} → {i60}");
    }

    #[test]
    fn latency_grows_with_clients_and_object_size() {
        for f in Family::ALL {
            let mut last = 0.0;
            for c in [1000.0, 4000.0, 8000.0, 9100.0] {
                let l = ms(&at(Axis::Clients, c), f);
                assert!(l > last, "{f}: {l} ms at {c} clients after {last}");
                last = l;
            }
            let mut last = 0.0;
            for kib in [1.0, 2.0, 4.0, 8.0, 10.0] {
                let l = ms(&at(Axis::ObjectSize, kib), f);
                assert!(l > last, "{f}: {l} ms at {kib} KiB after {last}");
                last = l;
            }
        }
    }

    /// The last value of `axis` (in its default range) at which `f` is finite.
    fn last_finite(base: &ModelParams, axis: Axis, f: Family) -> f64 {
        axis.default_values()
            .into_iter()
            .take_while(|&x| !lat(&axis.apply(base, x).unwrap(), f).is_saturated())
            .last()
            .unwrap()
    }

    #[test]
    fn without_an_origin_bottleneck_the_directory_has_the_widest_range() {
        // Origin servers with capacity to spare, so the protocols' own loads decide.
        let base = ModelParams {
            servers: 1000,
            ..ModelParams::default()
        };
        for axis in [Axis::Clients, Axis::ObjectSize] {
            let d = last_finite(&base, axis, Family::Directory);
            let i = last_finite(&base, axis, Family::Icp);
            let m = last_finite(&base, axis, Family::Multicast);
            assert!(d > i, "{axis}: directory {d}, icp {i}");
            assert!(d >= m, "{axis}: directory {d}, multicast {m}");
        }
        assert_eq!(last_finite(&base, Axis::Clients, Family::Icp), 14000.0);
        assert_eq!(
            last_finite(&base, Axis::Clients, Family::Directory),
            24000.0
        );
    }

    #[test]
    fn with_table_1_servers_the_origin_limits_every_family_alike() {
        let base = ModelParams::default();
        for f in Family::ALL {
            assert_eq!(last_finite(&base, Axis::Clients, f), 14000.0, "{f}");
            assert_eq!(
                lat(&at(Axis::Clients, 15000.0), f),
                Latency::Saturated {
                    resource: Resource::ServerHosts
                },
                "{f}"
            );
        }
    }

    #[test]
    fn multicast_misses_wait_for_the_whole_timeout() {
        let t = breakdown(&ModelParams::default(), Family::Multicast)
            .unwrap()
            .timing
            .unwrap();
        assert_eq!(t.miss.time.timeout_s, 0.040);
        assert_eq!(t.neighbour_hit.time.timeout_s, 0.0);
        let icp = breakdown(&ModelParams::default(), Family::Icp)
            .unwrap()
            .timing
            .unwrap();
        assert_eq!(icp.miss.time.timeout_s, 0.0);
    }

    #[test]
    fn first_success_rank_by_hand() {
        assert_eq!(first_success_rank(1.0, 5.0), 1.0);
        // A = 2, p = 0.5: ranks 1 (0.5) and 2 (0.25), given success (0.75): 4/3.
        assert!(close(first_success_rank(0.5, 2.0), 4.0 / 3.0, 1e-12));
        assert_eq!(first_success_rank(0.0, 3.0), 3.0);
    }

    #[test]
    fn validation_names_the_bad_parameter() {
        let name = |e: ModelError| match e {
            ModelError::Invalid { parameter, .. } => parameter,
            other => panic!("{other}"),
        };
        let bad = |f: fn(&mut ModelParams)| {
            let mut p = ModelParams::default();
            f(&mut p);
            p.validate().unwrap_err()
        };
        assert_eq!(
            name(bad(|p| p.network_bandwidth = -1.0)),
            "network_bandwidth"
        );
        assert_eq!(
            name(bad(|p| p.client_request_rate = f64::NAN)),
            "client_request_rate"
        );
        assert_eq!(
            name(bad(|p| p.directory_accuracy = 1.5)),
            "directory_accuracy"
        );
        assert_eq!(name(bad(|p| p.proxies = 1)), "proxies");
        assert_eq!(name(bad(|p| p.object_size = 0)), "object_size");
        assert_eq!(name(bad(|p| p.timeout = Duration::ZERO)), "timeout");
        assert_eq!(
            bad(|p| p.neighbour_hit_rate = 0.8),
            ModelError::HitRates {
                master: 0.25,
                neighbour: 0.8
            }
        );
        let p = ModelParams {
            neighbour_hit_rate: 0.8,
            ..ModelParams::default()
        };
        assert!(latency(&p, Family::Icp).is_err());
        assert_eq!(
            name(
                Axis::Proxies
                    .apply(&ModelParams::default(), 2.5)
                    .unwrap_err()
            ),
            "proxies"
        );
        assert_eq!(
            name(
                Axis::ObjectSize
                    .apply(&ModelParams::default(), 0.0)
                    .unwrap_err()
            ),
            "object_size"
        );
        assert!(sweep(&ModelParams::default(), Axis::Proxies, &[30.0, 1.0]).is_err());
    }

    #[test]
    fn set_overrides_one_parameter_from_text() {
        let mut p = ModelParams::default();
        p.set("proxies", "64").unwrap();
        p.set("object_size", "20KiB").unwrap();
        p.set("timeout", "10ms").unwrap();
        p.set("network_bandwidth", "2 Gbit/s").unwrap();
        p.set("client_request_rate", "1").unwrap();
        p.set("master_hit_rate", "0.4").unwrap();
        assert_eq!(p.proxies, 64);
        assert_eq!(p.object_size, 20 * 1024);
        assert_eq!(p.timeout, Duration::from_millis(10));
        assert_eq!(p.network_bandwidth, 2e9);
        assert_eq!(p.client_request_rate, 1.0);
        assert_eq!(p.master_hit_rate, 0.4);
        match p.set("proxy_count", "3").unwrap_err() {
            ModelError::UnknownParameter { key, known } => {
                assert_eq!(key, "proxy_count");
                assert!(known.contains("proxies"), "{known}");
            }
            other => panic!("{other}"),
        }
        match p.set("proxies", "many").unwrap_err() {
            ModelError::BadValue { key, .. } => assert_eq!(key, "proxies"),
            other => panic!("{other}"),
        }
        assert_eq!(p.proxies, 64, "a failed set leaves the parameters alone");
    }

    #[test]
    fn parameters_round_trip_through_toml_with_human_units() {
        let p = ModelParams::default();
        let text = toml::to_string(&p).unwrap();
        assert!(text.contains("network_bandwidth = \"1 Gbit/s\""), "{text}");
        assert!(text.contains("object_size = \"10.0 KiB\""), "{text}");
        assert!(text.contains("timeout = \"40ms\""), "{text}");
        let back: ModelParams = toml::from_str(&text).unwrap();
        assert_eq!(back, p);
        let err = toml::from_str::<ModelParams>(&format!("{text}\nbogus = 1\n")).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn bit_rates_parse_in_the_usual_spellings() {
        use units::bit_rate::{format, parse};
        assert_eq!(parse("100 Mbit/s").unwrap(), 1e8);
        assert_eq!(parse("10Mb/s").unwrap(), 1e7);
        assert_eq!(parse("1 Gbps").unwrap(), 1e9);
        assert_eq!(parse("1e9").unwrap(), 1e9);
        assert!(parse("fast").is_err());
        assert!(parse("10 furlongs").is_err());
        assert_eq!(format(1.5e9), "1.5 Gbit/s");
        assert_eq!(format(64_000.0), "64 kbit/s");
    }

    #[test]
    fn sweep_gives_one_curve_per_family_with_saturation_marked() {
        let curves = sweep(&ModelParams::default(), Axis::Proxies, &[4.0, 30.0, 1024.0]).unwrap();
        assert_eq!(
            curves.iter().map(|c| c.family).collect::<Vec<_>>(),
            Family::ALL
        );
        for c in &curves {
            assert_eq!(c.points.len(), 3);
            assert!(c.points[0].latency.is_saturated());
            assert!(!c.points[1].latency.is_saturated());
        }
        let json = serde_json::to_string(&curves[1].points[2]).unwrap();
        assert_eq!(
            json,
            r#"{"x":1024.0,"latency":{"saturated":{"resource":"network"}}}"#
        );
    }

    #[test]
    fn axes_parse_from_their_names() {
        for a in Axis::ALL {
            assert_eq!(a.as_str().parse::<Axis>().unwrap(), a);
        }
        assert_eq!(
            "bogus".parse::<Axis>().unwrap_err(),
            ModelError::UnknownAxis("bogus".into())
        );
    }
}
