//! Link emulation: user-space relays that make a loopback hop behave like a
//! wide-area path (kernel traffic shaping is not available to the lab).
//!
//! Lab nodes live on distinct `127.0.0.x` addresses of one machine. To put,
//! say, a trans-Pacific path (about 278 ms round trip) between two caches, a
//! relay sits between them: the nodes are configured to talk to the relay's
//! address, and the relay forwards every byte or datagram after the delay,
//! jitter, loss and bandwidth of a [`LinkConfig`].
//!
//! ## The profile
//!
//! A [`LinkConfig`] (TOML, unknown keys are errors) gives one [`Profile`]
//! per direction. The two parties are called **A** and **B**: for a TCP relay
//! A is the side that connects (the client) and B the target; for a UDP pair
//! they are the two fixed peers. The top-level keys apply to both
//! directions; `a_to_b` and `b_to_a` override them key by key:
//!
//! ```toml
//! delay = "139ms"        # one-way delay
//! jitter = "5ms"         # each chunk's delay is drawn uniformly in delay ± jitter
//! loss = 0.01            # share of segments (TCP) or datagrams (UDP) lost
//! bandwidth = "10 Mbit"  # bits per second; absent = unlimited
//!
//! [b_to_a]
//! bandwidth = "2 Mbit"   # an asymmetric link: only B→A is slower
//! ```
//!
//! **Bandwidth is in bits per second**: `"64 kbit"`, `"10 Mbit"`,
//! `"1 Gbit"` (decimal prefixes; `bps`, `kbps`, `Mbps`, `Gbps` and a `/s`
//! suffix are accepted too) or a bare integer number of bits per second.
//! Byte units (`"MB"`, `"MiB"`) are refused, so the unit is never ambiguous.
//!
//! ## The TCP relay ([`Link::tcp`])
//!
//! Listens on an already-bound listener; each accepted connection is
//! connected to a target (optionally from a chosen local IP, so the target
//! sees that source address) and bytes are forwarded both ways, each
//! direction with its own profile:
//!
//! * **Delay and jitter**: every chunk read is delivered `delay ± jitter`
//!   later, never reordered: its delivery time is the later of the previous
//!   chunk's delivery and `now + delay + jitter draw`.
//! * **Bandwidth** is serialization delay: a chunk of `n` bytes occupies the
//!   link for `8n / rate`, and a chunk queues behind the previous one (a token
//!   bucket with no burst allowance beyond the chunk).
//! * **Loss** cannot drop bytes from a TCP stream; it costs what TCP would pay
//!   to recover. `loss` is a per-segment share (segments of 1448 bytes), so a
//!   chunk of `k` segments is "lost" with probability `1 - (1 - loss)^k`; a
//!   lost chunk is delivered one retransmission timeout (RTO) later, and a
//!   retransmission is lost again with probability `loss`, doubling the RTO
//!   each time (at most 6 times). The RTO is Linux's for a steady path:
//!   `RTT + 200 ms` (200 ms is Linux's minimum `RTTVAR` term), where the RTT
//!   is the sum of both one-way delays. Later chunks wait behind a lost one,
//!   as TCP's in-order delivery makes them.
//! * **Connection setup** pays a handshake: the connection to the target is
//!   opened one A→B delay after the client's connection was accepted (the
//!   SYN), and the client's first bytes cannot leave before one B→A delay
//!   after that (the SYN-ACK). A request on a new connection thus takes two
//!   round trips to get its answer, as over a real path. The client's own
//!   `connect` returns at once (the kernel completes it on loopback).
//! * **Half-close** propagates: end of stream on one side is forwarded (a
//!   `shutdown` of the write side) after the data before it. An error on
//!   either side closes both; a failed connect to the target closes the
//!   client's connection one B→A delay later.
//! * At most 4 MiB per direction are held in the relay (the emulated
//!   window); a sender beyond that is held back by TCP flow control. Over a
//!   `139ms` link this caps one connection at about 30 MB/s.
//!
//! ## The UDP pair relay ([`Link::udp_pair`])
//!
//! For two fixed parties A and B (ICP peers recognise each other by source
//! address and port): a datagram arriving on the `a_side` socket (the
//! address A uses for B) from A's address is sent from the `b_side` socket
//! (the address B uses for A) to B's address after the A→B profile, and the
//! reverse for B→A. Datagrams from any other address are dropped and
//! counted. Loss drops datagrams; jitter may reorder them, as a real network
//! may. Bandwidth queues datagrams as for TCP; at most 4096 datagrams per
//! direction wait in the relay, later ones are dropped (counted as
//! overflow).
//!
//! ## Running and counting
//!
//! Both relays take an already-bound socket and a shutdown future, spawn
//! their work on the current tokio runtime, and return a [`Link`] handle:
//! [`Link::counters`] reads the [`Counters`] (bytes and chunks or datagrams
//! forwarded per direction, losses, connections, strangers), [`Link::stop`]
//! stops the relay and returns the final counts; dropping the handle stops
//! it too. Jitter and loss draws come from a PCG generator seeded by the
//! caller, so a run is reproducible (each TCP connection derives its own
//! stream from the seed and its accept order).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// The largest delay or jitter a profile accepts (keeps time arithmetic safe).
pub const MAX_DELAY: Duration = Duration::from_secs(3600);
/// TCP's minimum retransmission timeout term on Linux.
pub const RTO_MIN: Duration = Duration::from_millis(200);
/// The segment size that `loss` applies to on TCP relays.
pub const SEGMENT: usize = 1448;
/// Most retransmissions a lost TCP chunk pays for.
const MAX_RETRANSMITS: u32 = 6;
/// Bytes per direction a TCP relay holds at most (the emulated window).
const WINDOW: usize = 4 << 20;
/// Largest read of a TCP relay.
const CHUNK: usize = 64 * 1024;
/// Datagrams per direction a UDP relay holds at most.
const UDP_QUEUE: usize = 4096;

/// Errors of link emulation.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// A profile setting is out of range; `key` is its name in the config
    /// (`loss`, `b_to_a.delay`, ...).
    #[error("link setting `{key}`: {reason}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bandwidth string could not be parsed.
    #[error("bandwidth {input:?}: {reason}")]
    Bandwidth {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A socket operation failed while setting the relay up.
    #[error("link socket: {0}")]
    Io(#[from] io::Error),
}

/// A link rate in bits per second (see the [module docs](self) for the
/// accepted spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth(u64);

impl Bandwidth {
    /// A rate of `bps` bits per second; `None` for zero.
    pub fn from_bits_per_sec(bps: u64) -> Option<Bandwidth> {
        (bps > 0).then_some(Bandwidth(bps))
    }

    /// The rate in bits per second.
    pub fn bits_per_sec(self) -> u64 {
        self.0
    }

    /// How long `len` bytes occupy the link.
    pub fn transmit_time(self, len: usize) -> Duration {
        Duration::from_secs_f64(len as f64 * 8.0 / self.0 as f64)
    }
}

impl FromStr for Bandwidth {
    type Err = LinkError;

    fn from_str(input: &str) -> Result<Bandwidth, LinkError> {
        let err = |reason| LinkError::Bandwidth {
            input: input.to_owned(),
            reason,
        };
        let s = input.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let number: f64 = number
            .parse()
            .map_err(|_| err("expected a number followed by a unit such as \"10 Mbit\""))?;
        let unit = unit.trim();
        let unit = unit
            .strip_suffix("/s")
            .or_else(|| unit.strip_suffix("ps"))
            .unwrap_or(unit);
        let scale = match unit {
            "" | "bit" | "b" => 1.0,
            "k" | "K" | "kbit" | "Kbit" | "kb" => 1e3,
            "M" | "Mbit" | "mbit" | "Mb" => 1e6,
            "G" | "Gbit" | "gbit" | "Gb" => 1e9,
            _ => {
                return Err(err(
                    "unknown unit: bandwidth is in bits per second, e.g. \"800 kbit\", \"10 Mbit\", \"1 Gbit\" (byte units are not accepted)",
                ))
            }
        };
        let bps = (number * scale).round();
        if !(1.0..1e15).contains(&bps) {
            return Err(err("must be between 1 bit/s and 1 Pbit/s"));
        }
        Ok(Bandwidth(bps as u64))
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (scale, unit) in [
            (1_000_000_000, "Gbit"),
            (1_000_000, "Mbit"),
            (1_000, "kbit"),
        ] {
            if self.0 % scale == 0 {
                return write!(f, "{} {unit}", self.0 / scale);
            }
        }
        write!(f, "{} bit", self.0)
    }
}

impl Serialize for Bandwidth {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bandwidth, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Bandwidth;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate in bits per second such as \"10 Mbit\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bandwidth, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Bandwidth, E> {
                Bandwidth::from_bits_per_sec(v)
                    .ok_or_else(|| E::custom("bandwidth must be at least 1 bit/s"))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Bandwidth, E> {
                u64::try_from(v)
                    .ok()
                    .and_then(Bandwidth::from_bits_per_sec)
                    .ok_or_else(|| E::custom("bandwidth must be at least 1 bit/s"))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// How one direction of a link behaves.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    /// One-way delay.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    /// Each chunk's or datagram's delay is drawn uniformly in
    /// `delay ± jitter` (and never below zero).
    #[serde(with = "humantime_serde")]
    pub jitter: Duration,
    /// Share of segments (TCP) or datagrams (UDP) lost, in `[0, 1]`.
    pub loss: f64,
    /// Link rate; `None` is unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

impl Profile {
    /// A profile with only a one-way delay.
    pub fn delay(delay: Duration) -> Profile {
        Profile {
            delay,
            ..Profile::default()
        }
    }

    /// Checks the ranges; `prefix` is put before key names in errors.
    pub fn validate(&self, prefix: &str) -> Result<(), LinkError> {
        let invalid = |key: &str, reason: String| LinkError::Invalid {
            key: format!("{prefix}{key}"),
            reason,
        };
        if self.delay > MAX_DELAY {
            return Err(invalid("delay", format!("at most {MAX_DELAY:?}")));
        }
        if self.jitter > MAX_DELAY {
            return Err(invalid("jitter", format!("at most {MAX_DELAY:?}")));
        }
        if !(0.0..=1.0).contains(&self.loss) {
            return Err(invalid(
                "loss",
                format!("a share between 0 and 1, got {}", self.loss),
            ));
        }
        Ok(())
    }
}

/// Per-direction overrides of a [`LinkConfig`]: each key given replaces
/// the symmetric one.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileOverride {
    /// One-way delay of this direction.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// Jitter of this direction.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Duration>,
    /// Loss share of this direction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Link rate of this direction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

impl ProfileOverride {
    fn is_empty(&self) -> bool {
        *self == ProfileOverride::default()
    }

    fn apply(&self, base: Profile) -> Profile {
        Profile {
            delay: self.delay.unwrap_or(base.delay),
            jitter: self.jitter.unwrap_or(base.jitter),
            loss: self.loss.unwrap_or(base.loss),
            bandwidth: self.bandwidth.or(base.bandwidth),
        }
    }
}

/// A link between parties A and B: symmetric settings plus optional
/// per-direction overrides (see the [module docs](self)). `Default` is a
/// perfect link (no delay, no loss, unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    /// One-way delay, both directions.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    /// Jitter, both directions.
    #[serde(with = "humantime_serde")]
    pub jitter: Duration,
    /// Loss share, both directions.
    pub loss: f64,
    /// Link rate, both directions (bits per second).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
    /// Overrides for A→B.
    #[serde(skip_serializing_if = "ProfileOverride::is_empty")]
    pub a_to_b: ProfileOverride,
    /// Overrides for B→A.
    #[serde(skip_serializing_if = "ProfileOverride::is_empty")]
    pub b_to_a: ProfileOverride,
}

/// The two validated directions of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Directions {
    /// A→B (client to target, for TCP).
    pub a_to_b: Profile,
    /// B→A (target to client, for TCP).
    pub b_to_a: Profile,
}

impl LinkConfig {
    /// The same profile both ways.
    pub fn symmetric(p: Profile) -> LinkConfig {
        LinkConfig {
            delay: p.delay,
            jitter: p.jitter,
            loss: p.loss,
            bandwidth: p.bandwidth,
            ..LinkConfig::default()
        }
    }

    /// Applies the overrides and validates both directions; errors name
    /// the offending key.
    pub fn directions(&self) -> Result<Directions, LinkError> {
        let base = Profile {
            delay: self.delay,
            jitter: self.jitter,
            loss: self.loss,
            bandwidth: self.bandwidth,
        };
        base.validate("")?;
        let a_to_b = self.a_to_b.apply(base);
        let b_to_a = self.b_to_a.apply(base);
        a_to_b.validate("a_to_b.")?;
        b_to_a.validate("b_to_a.")?;
        Ok(Directions { a_to_b, b_to_a })
    }
}

/// What a loss costs in one direction.
#[derive(Debug, Clone, Copy)]
enum LossMode {
    /// TCP: delivered late, by the retransmission timeout (with backoff).
    Retransmit { rto: Duration },
    /// UDP: the datagram is dropped.
    Drop,
}

/// The time model of one direction: pure, it takes `now` and returns
/// delivery times.
struct Shaper {
    profile: Profile,
    mode: LossMode,
    rng: Pcg64,
    /// When the emulated link is next free to serialize.
    wire_free: Instant,
    /// The latest delivery time handed out (TCP delivers in order).
    last_delivery: Instant,
}

impl Shaper {
    fn new(profile: Profile, mode: LossMode, seed: u64, now: Instant) -> Shaper {
        Shaper {
            profile,
            mode,
            rng: Pcg64::seed_from_u64(seed),
            wire_free: now,
            last_delivery: now,
        }
    }

    /// One draw of the one-way latency: `delay ± jitter`, never negative.
    fn latency(&mut self) -> Duration {
        let Profile { delay, jitter, .. } = self.profile;
        if jitter.is_zero() {
            return delay;
        }
        let j = jitter.as_secs_f64();
        let draw = self.rng.random_range(-j..=j);
        Duration::from_secs_f64((delay.as_secs_f64() + draw).max(0.0))
    }

    /// Nothing leaves before `t` (the end of the handshake).
    fn not_before(&mut self, t: Instant) {
        self.wire_free = self.wire_free.max(t);
    }

    /// Schedules `len` bytes handed to the link at `now`: their delivery
    /// time and whether they were "lost" (TCP: and paid a retransmission
    /// penalty), or `None` when dropped (UDP). `len == 0` is a TCP FIN,
    /// which is never lost.
    fn schedule(&mut self, now: Instant, len: usize) -> Option<(Instant, bool)> {
        let loss = self.profile.loss;
        if let LossMode::Drop = self.mode {
            if loss > 0.0 && self.rng.random::<f64>() < loss {
                return None;
            }
        }
        let start = now.max(self.wire_free);
        let tx = self
            .profile
            .bandwidth
            .map_or(Duration::ZERO, |b| b.transmit_time(len));
        self.wire_free = start + tx;
        let mut at = self.wire_free + self.latency();
        let mut lost = false;
        if let LossMode::Retransmit { rto } = self.mode {
            if len > 0 && loss > 0.0 {
                let segments = len.div_ceil(SEGMENT) as i32;
                let p_chunk = 1.0 - (1.0 - loss).powi(segments);
                if self.rng.random::<f64>() < p_chunk {
                    lost = true;
                    let mut backoff = rto;
                    at += backoff;
                    for _ in 1..MAX_RETRANSMITS {
                        if self.rng.random::<f64>() >= loss {
                            break;
                        }
                        backoff *= 2;
                        at += backoff;
                    }
                }
            }
            at = at.max(self.last_delivery);
            self.last_delivery = at;
        }
        Some((at, lost))
    }
}

/// Counters of one direction.
#[derive(Debug, Default)]
struct DirStats {
    bytes: AtomicU64,
    packets: AtomicU64,
    lost: AtomicU64,
    overflow: AtomicU64,
}

impl DirStats {
    fn snapshot(&self) -> DirectionCounters {
        DirectionCounters {
            bytes: self.bytes.load(Ordering::Relaxed),
            packets: self.packets.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            overflow: self.overflow.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    a_to_b: DirStats,
    b_to_a: DirStats,
    connections: AtomicU64,
    active: AtomicU64,
    connect_errors: AtomicU64,
    strangers: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What crossed one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DirectionCounters {
    /// Bytes delivered (TCP payload or UDP datagram payload).
    pub bytes: u64,
    /// Chunks (TCP reads) or datagrams delivered.
    pub packets: u64,
    /// TCP: chunks that paid a retransmission penalty; UDP: datagrams
    /// dropped by the loss draw.
    pub lost: u64,
    /// UDP: datagrams dropped because the relay's queue was full.
    pub overflow: u64,
}

/// A snapshot of a relay's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    /// A→B (client to target, for TCP).
    pub a_to_b: DirectionCounters,
    /// B→A (target to client, for TCP).
    pub b_to_a: DirectionCounters,
    /// TCP: connections accepted.
    pub connections: u64,
    /// TCP: connections open now.
    pub active: u64,
    /// TCP: connections whose connect to the target failed.
    pub connect_errors: u64,
    /// UDP: datagrams dropped because they came from neither party.
    pub strangers: u64,
}

impl Stats {
    fn snapshot(&self) -> Counters {
        Counters {
            a_to_b: self.a_to_b.snapshot(),
            b_to_a: self.b_to_a.snapshot(),
            connections: self.connections.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            connect_errors: self.connect_errors.load(Ordering::Relaxed),
            strangers: self.strangers.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, d) in [("a->b", &self.a_to_b), ("b->a", &self.b_to_a)] {
            write!(
                f,
                "{name}: {} bytes in {} packets, {} lost, {} overflow; ",
                d.bytes, d.packets, d.lost, d.overflow
            )?;
        }
        write!(
            f,
            "{} connections ({} open, {} connect errors), {} stranger datagrams",
            self.connections, self.active, self.connect_errors, self.strangers
        )
    }
}

/// Where a relay listens and forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkAddrs {
    /// A TCP relay.
    Tcp {
        /// The address clients connect to.
        listen: SocketAddr,
        /// Where connections are relayed.
        target: SocketAddr,
    },
    /// A UDP pair relay.
    Udp {
        /// The address A sends to (the relay's face towards A).
        a_side: SocketAddr,
        /// The address B sends to (the relay's face towards B).
        b_side: SocketAddr,
        /// A's address.
        a: SocketAddr,
        /// B's address.
        b: SocketAddr,
    },
}

impl fmt::Display for LinkAddrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkAddrs::Tcp { listen, target } => write!(f, "tcp {listen} -> {target}"),
            LinkAddrs::Udp {
                a_side,
                b_side,
                a,
                b,
            } => write!(f, "udp {a} -> {a_side} | {b_side} -> {b}"),
        }
    }
}

/// A TCP relay's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpRelay {
    /// Where accepted connections are relayed (party B).
    pub target: SocketAddr,
    /// Local IP the outgoing connections are bound to (the port is chosen
    /// by the system), so that the target sees this source address.
    pub bind_out: Option<IpAddr>,
    /// The link's behaviour.
    pub link: LinkConfig,
    /// Seed of the jitter and loss draws.
    pub seed: u64,
}

/// A UDP pair relay's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct UdpPair {
    /// Party A's address (source of what arrives on `a_side`).
    pub a: SocketAddr,
    /// Party B's address (source of what arrives on `b_side`).
    pub b: SocketAddr,
    /// The link's behaviour.
    pub link: LinkConfig,
    /// Seed of the jitter and loss draws.
    pub seed: u64,
}

/// A running relay. Dropping it stops the relay (open TCP connections are
/// closed, datagrams in flight are discarded).
#[must_use = "the relay stops when its Link is dropped"]
pub struct Link {
    addrs: LinkAddrs,
    stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("addrs", &self.addrs)
            .field("counters", &self.counters())
            .finish()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A stop future that resolves on `shutdown` or when the handle goes.
fn stopper(
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (
    oneshot::Sender<()>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            _ = rx => {}
        }
    };
    (tx, stop)
}

/// A well-mixed seed for stream `id` of a relay seeded with `seed`
/// (splitmix64).
fn derive_seed(seed: u64, id: u64) -> u64 {
    let mut z = seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Link {
    /// Starts a TCP relay on an already-bound listener; it runs until
    /// `shutdown` resolves, [`Link::stop`] is called or the handle is
    /// dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn tcp(
        listener: TcpListener,
        relay: TcpRelay,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Link, LinkError> {
        let directions = relay.link.directions()?;
        let listen = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let rto = directions.a_to_b.delay + directions.b_to_a.delay + RTO_MIN;
        let shared = Arc::new(TcpShared {
            target: relay.target,
            bind_out: relay.bind_out,
            directions,
            rto,
            seed: relay.seed,
            stats: Arc::clone(&stats),
        });
        let (tx, stop) = stopper(shutdown);
        let task = tokio::spawn(tcp_accept_loop(listener, shared, stop));
        Ok(Link {
            addrs: LinkAddrs::Tcp {
                listen,
                target: relay.target,
            },
            stats,
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// Starts a UDP pair relay on two already-bound sockets: `a_side` (the
    /// address A sends to) and `b_side` (the address B sends to). It runs
    /// until `shutdown` resolves, [`Link::stop`] is called or the handle is
    /// dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn udp_pair(
        a_side: UdpSocket,
        b_side: UdpSocket,
        pair: UdpPair,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Link, LinkError> {
        let directions = pair.link.directions()?;
        let addrs = LinkAddrs::Udp {
            a_side: a_side.local_addr()?,
            b_side: b_side.local_addr()?,
            a: pair.a,
            b: pair.b,
        };
        let stats = Arc::new(Stats::default());
        let now = Instant::now();
        let ab = Shaper::new(
            directions.a_to_b,
            LossMode::Drop,
            derive_seed(pair.seed, 0),
            now,
        );
        let ba = Shaper::new(
            directions.b_to_a,
            LossMode::Drop,
            derive_seed(pair.seed, 1),
            now,
        );
        let (tx, stop) = stopper(shutdown);
        let task = tokio::spawn(udp_relay(
            a_side,
            b_side,
            pair.a,
            pair.b,
            ab,
            ba,
            Arc::clone(&stats),
            stop,
        ));
        Ok(Link {
            addrs,
            stats,
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// Where the relay listens and forwards to.
    pub fn addrs(&self) -> LinkAddrs {
        self.addrs
    }

    /// The address clients connect to (TCP) or A sends to (UDP).
    pub fn local_addr(&self) -> SocketAddr {
        match self.addrs {
            LinkAddrs::Tcp { listen, .. } => listen,
            LinkAddrs::Udp { a_side, .. } => a_side,
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.stats.snapshot()
    }

    /// Stops the relay, waits for it to end, and returns the final counters.
    pub async fn stop(mut self) -> Counters {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters()
    }
}

/// What a TCP relay's connections share.
struct TcpShared {
    target: SocketAddr,
    bind_out: Option<IpAddr>,
    directions: Directions,
    rto: Duration,
    seed: u64,
    stats: Arc<Stats>,
}

async fn tcp_accept_loop(
    listener: TcpListener,
    shared: Arc<TcpShared>,
    stop: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    let mut next_id: u64 = 0;
    tokio::pin!(stop);
    loop {
        while conns.try_join_next().is_some() {}
        let client = tokio::select! {
            biased;
            () = &mut stop => break,
            res = listener.accept() => match res {
                Ok((client, _)) => client,
                Err(e) => {
                    // E.g. out of file descriptors: do not spin.
                    tracing::warn!(error = %e, "link: accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        bump(&shared.stats.connections, 1);
        let seed = derive_seed(shared.seed, next_id);
        next_id += 1;
        conns.spawn(relay_connection(client, Arc::clone(&shared), seed));
    }
    drop(listener);
    conns.shutdown().await;
}

/// Decrements the open-connection count when a connection task ends (or
/// is aborted).
struct ActiveGuard(Arc<Stats>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connect_out(target: SocketAddr, bind_out: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(ip) = bind_out {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(target).await
}

async fn relay_connection(client: TcpStream, shared: Arc<TcpShared>, seed: u64) {
    let stats = &shared.stats;
    bump(&stats.active, 1);
    let _guard = ActiveGuard(Arc::clone(stats));
    let _ = client.set_nodelay(true);
    let now = Instant::now();
    let mode = LossMode::Retransmit { rto: shared.rto };
    let mut up = Shaper::new(shared.directions.a_to_b, mode, derive_seed(seed, 0), now);
    let mut down = Shaper::new(shared.directions.b_to_a, mode, derive_seed(seed, 1), now);

    // The SYN travels A→B before the target sees a connection.
    tokio::time::sleep(up.latency()).await;
    let server = match connect_out(shared.target, shared.bind_out).await {
        Ok(server) => server,
        Err(e) => {
            bump(&stats.connect_errors, 1);
            tracing::debug!(target = %shared.target, error = %e, "link: connect failed");
            // The refusal travels back B→A.
            tokio::time::sleep(down.latency()).await;
            return;
        }
    };
    let _ = server.set_nodelay(true);
    // The SYN-ACK travels B→A: A's first bytes cannot leave before it
    // arrives. B may send from now on.
    up.not_before(Instant::now() + down.latency());

    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let res = tokio::try_join!(
        pipe(client_r, server_w, up, &stats.a_to_b),
        pipe(server_r, client_w, down, &stats.b_to_a),
    );
    if let Err(e) = res {
        // Dropping all four halves closes both sides.
        tracing::debug!(error = %e, "link: connection closed on error");
    }
}

/// One direction of a TCP connection: reads chunks, delivers each at its
/// scheduled time, forwards end of stream as a write shutdown.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut shaper: Shaper,
    stats: &DirStats,
) -> io::Result<()> {
    let window = Semaphore::new(WINDOW);
    // `None` is end of stream.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Bytes>)>();
    let reader = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                let fin = shaper.schedule(Instant::now(), 0);
                if let Some((at, _)) = fin {
                    let _ = tx.send((at, None));
                }
                return Ok::<(), io::Error>(());
            }
            // Held until written: the window bounds what the relay buffers.
            window
                .acquire_many(n as u32)
                .await
                .map_err(io::Error::other)?
                .forget();
            let chunk = Bytes::copy_from_slice(&buf[..n]);
            if let Some((at, lost)) = shaper.schedule(Instant::now(), n) {
                if lost {
                    bump(&stats.lost, 1);
                }
                if tx.send((at, Some(chunk))).is_err() {
                    return Ok(());
                }
            }
        }
    };
    let writer = async {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            match chunk {
                Some(chunk) => {
                    to.write_all(&chunk).await?;
                    bump(&stats.bytes, chunk.len() as u64);
                    bump(&stats.packets, 1);
                    window.add_permits(chunk.len());
                }
                None => {
                    to.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<(), io::Error>(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

#[allow(clippy::too_many_arguments)]
async fn udp_relay(
    a_side: UdpSocket,
    b_side: UdpSocket,
    a: SocketAddr,
    b: SocketAddr,
    ab: Shaper,
    ba: Shaper,
    stats: Arc<Stats>,
    stop: impl Future<Output = ()>,
) {
    let forward = udp_direction(&a_side, a, &b_side, b, ab, &stats.a_to_b, &stats);
    let backward = udp_direction(&b_side, b, &a_side, a, ba, &stats.b_to_a, &stats);
    tokio::select! {
        () = stop => {}
        _ = futures_join(forward, backward) => {}
    }
}

/// Runs two never-ending futures together.
async fn futures_join(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::join!(a, b);
}

/// Resolves at `at`, or never.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One direction of a UDP pair: receives on `input` from `from`, sends
/// from `output` to `to` at each datagram's scheduled time.
async fn udp_direction(
    input: &UdpSocket,
    from: SocketAddr,
    output: &UdpSocket,
    to: SocketAddr,
    mut shaper: Shaper,
    dir: &DirStats,
    stats: &Stats,
) {
    // Ordered by delivery time, then arrival: jitter may reorder.
    let mut queue: BinaryHeap<Reverse<(Instant, u64, Bytes)>> = BinaryHeap::new();
    let mut seq: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let next = queue.peek().map(|Reverse((at, _, _))| *at);
        tokio::select! {
            res = input.recv_from(&mut buf) => match res {
                Ok((n, src)) => {
                    if src != from {
                        bump(&stats.strangers, 1);
                    } else if queue.len() >= UDP_QUEUE {
                        bump(&dir.overflow, 1);
                    } else if let Some((at, _)) = shaper.schedule(Instant::now(), n) {
                        queue.push(Reverse((at, seq, Bytes::copy_from_slice(&buf[..n]))));
                        seq += 1;
                    } else {
                        bump(&dir.lost, 1);
                    }
                }
                Err(e) => {
                    // E.g. an ICMP error reported on the socket: do not spin.
                    tracing::debug!(error = %e, "link: udp receive failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
            () = until(next) => {
                if let Some(Reverse((_, _, datagram))) = queue.pop() {
                    match output.send_to(&datagram, to).await {
                        Ok(_) => {
                            bump(&dir.bytes, datagram.len() as u64);
                            bump(&dir.packets, 1);
                        }
                        Err(e) => tracing::debug!(error = %e, %to, "link: udp send failed"),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bandwidth_parsing() {
        let cases = [
            ("10 Mbit", 10_000_000),
            ("10Mbit/s", 10_000_000),
            ("10 Mbps", 10_000_000),
            ("1.5 Gbit", 1_500_000_000),
            ("800 kbit", 800_000),
            ("64000", 64_000),
            ("64000 bit", 64_000),
        ];
        for (text, bps) in cases {
            let b: Bandwidth = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(b.bits_per_sec(), bps, "{text}");
        }
        for bad in ["10 MB", "10 MiB", "fast", "0", "", "-1 Mbit"] {
            assert!(bad.parse::<Bandwidth>().is_err(), "{bad} accepted");
        }
        assert_eq!(
            Bandwidth::from_bits_per_sec(10_000_000)
                .map(|b| b.to_string())
                .as_deref(),
            Some("10 Mbit")
        );
        assert_eq!(
            Bandwidth::from_bits_per_sec(1_500)
                .map(|b| b.to_string())
                .as_deref(),
            Some("1500 bit")
        );
        // 1 MB at 8 Mbit/s takes one second.
        assert_eq!(
            Bandwidth(8_000_000).transmit_time(1_000_000),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn config_from_toml() -> Result<(), Box<dyn std::error::Error>> {
        let c: LinkConfig = toml::from_str(
            "delay = \"139ms\"\njitter = \"5ms\"\nloss = 0.01\nbandwidth = \"10 Mbit\"\n[b_to_a]\nbandwidth = 2000000\ndelay = \"100ms\"\n",
        )?;
        let d = c.directions()?;
        assert_eq!(d.a_to_b.delay, ms(139));
        assert_eq!(d.a_to_b.jitter, ms(5));
        assert_eq!(d.a_to_b.bandwidth, Bandwidth::from_bits_per_sec(10_000_000));
        assert_eq!(d.b_to_a.delay, ms(100));
        assert_eq!(d.b_to_a.jitter, ms(5));
        assert_eq!(d.b_to_a.loss, 0.01);
        assert_eq!(d.b_to_a.bandwidth, Bandwidth::from_bits_per_sec(2_000_000));
        // Round trip through TOML.
        let back: LinkConfig = toml::from_str(&toml::to_string(&c)?)?;
        assert_eq!(back, c);

        assert!(toml::from_str::<LinkConfig>("delay = \"1s\"\nlatency = \"1s\"\n").is_err());
        assert!(toml::from_str::<LinkConfig>("[a_to_b]\nspeed = 1\n").is_err());
        let err = toml::from_str::<LinkConfig>("bandwidth = \"10 MB\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("bits per second"), "{err}");

        let bad: LinkConfig = toml::from_str("[b_to_a]\nloss = 1.5\n")?;
        match bad.directions() {
            Err(LinkError::Invalid { key, .. }) => assert_eq!(key, "b_to_a.loss"),
            other => panic!("unexpected {other:?}"),
        }
        let bad: LinkConfig = toml::from_str("loss = -0.1\n")?;
        match bad.directions() {
            Err(LinkError::Invalid { key, .. }) => assert_eq!(key, "loss"),
            other => panic!("unexpected {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn tcp_schedule_is_ordered_and_within_jitter() {
        let now = Instant::now();
        let p = Profile {
            delay: ms(100),
            jitter: ms(50),
            ..Profile::default()
        };
        let mut s = Shaper::new(p, LossMode::Retransmit { rto: ms(400) }, 7, now);
        let mut last = now;
        for i in 0..1000u64 {
            let t = now + Duration::from_micros(i * 100);
            let (at, lost) = s.schedule(t, 100).unwrap_or((now, true));
            assert!(!lost);
            assert!(at >= last, "reordered at {i}");
            assert!(at >= t + ms(50));
            last = at;
        }
        // Not all equal: jitter is applied.
        let mut u = Shaper::new(p, LossMode::Drop, 7, now);
        let draws: Vec<_> = (0..20).map(|_| u.latency()).collect();
        assert!(draws.iter().all(|d| *d >= ms(50) && *d <= ms(150)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn bandwidth_serializes_chunks() {
        let now = Instant::now();
        let p = Profile {
            delay: ms(10),
            bandwidth: Bandwidth::from_bits_per_sec(8_000_000), // 1 MB/s
            ..Profile::default()
        };
        let mut s = Shaper::new(p, LossMode::Retransmit { rto: ms(400) }, 1, now);
        // Ten 100 kB chunks handed at once: the last leaves after 1 s.
        let mut at = now;
        for _ in 0..10 {
            at = s.schedule(now, 100_000).map_or(now, |(at, _)| at);
        }
        assert_eq!(at, now + Duration::from_secs(1) + ms(10));
    }

    #[test]
    fn tcp_loss_costs_an_rto() {
        let now = Instant::now();
        let p = Profile {
            loss: 1.0,
            ..Profile::default()
        };
        let mut s = Shaper::new(p, LossMode::Retransmit { rto: ms(200) }, 1, now);
        let (at, lost) = s.schedule(now, 10).unwrap_or((now, false));
        assert!(lost);
        // Every retransmission lost: 200 ms doubled 6 times in all.
        assert_eq!(at, now + ms(200 * 63));
        // The FIN is never lost but waits behind.
        let fin = s.schedule(now, 0).map_or(now, |(at, _)| at);
        assert_eq!(fin, at);

        let p = Profile {
            loss: 0.1,
            ..Profile::default()
        };
        let mut s = Shaper::new(p, LossMode::Retransmit { rto: ms(200) }, 3, now);
        let lost = (0..1000)
            .filter(|_| s.schedule(now, SEGMENT).is_some_and(|(_, l)| l))
            .count();
        assert!((50..=160).contains(&lost), "{lost} of 1000 lost");
    }

    #[test]
    fn udp_loss_drops() {
        let now = Instant::now();
        let p = Profile {
            loss: 0.25,
            ..Profile::default()
        };
        let mut s = Shaper::new(p, LossMode::Drop, 11, now);
        let dropped = (0..2000).filter(|_| s.schedule(now, 50).is_none()).count();
        assert!((400..=600).contains(&dropped), "{dropped} of 2000 dropped");
        let mut s = Shaper::new(Profile::default(), LossMode::Drop, 11, now);
        assert!((0..100).all(|_| s.schedule(now, 50).is_some()));
    }
}
