//! What a simulation measured: hit ratios (local, remote, total, byte), inter-cache messages
//! and bytes per request, per-node load, the latency distribution, and the run's own speed.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

pub use crate::counters::{Classified, Kind, Outcome, Traffic};
use crate::mesh::{self, Node};
use crate::spec::SimSpec;
use crate::trace::Trace;

/// Latency of client requests, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyMs {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// One node's load.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeLoad {
    /// Its name (`n0`…, `p0`…).
    pub name: String,
    /// Client requests it received.
    pub client_requests: u64,
    /// Its clients' requests answered from its store.
    pub local_hits: u64,
    /// Its clients' requests answered from a sibling's store.
    pub sibling_hits: u64,
    /// Its clients' requests answered from a parent's store.
    pub parent_hits: u64,
    /// Peer requests it served.
    pub peer_requests: u64,
    /// Answers from its store.
    pub store_hits: u64,
    /// Origin fetches.
    pub origin_fetches: u64,
    /// Datagrams sent and received.
    pub datagrams: u64,
    /// Datagrams sent (what the lab reports as a node's `udp_sent`).
    pub datagrams_sent: u64,
    /// Share of the simulated time its CPU was busy.
    pub cpu_utilisation: f64,
    /// Objects and bytes in its store at the end.
    pub objects: u64,
    /// Bytes stored at the end.
    pub stored_bytes: u64,
    /// Evictions.
    pub evictions: u64,
}

/// Everything a run reports (written as `results.json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Results {
    /// The spec it ran.
    pub spec: SimSpec,
    /// Requests in the trace (after `replay.limit`), distinct objects, distinct bytes.
    pub trace_requests: u64,
    /// Distinct objects of the trace.
    pub trace_objects: u64,
    /// Distinct bytes of the trace.
    pub trace_unique_bytes: u64,
    /// The run was interrupted: the figures cover the requests answered until then.
    pub interrupted: bool,
    /// Answers by outcome.
    pub answered: Classified,
    /// Hits of any kind over requests.
    pub hit_ratio: f64,
    /// Local hits over requests.
    pub local_hit_ratio: f64,
    /// Sibling and parent hits over requests.
    pub remote_hit_ratio: f64,
    /// Hit bytes over bytes.
    pub byte_hit_ratio: f64,
    /// Inter-cache messages.
    pub traffic: Traffic,
    /// Protocol datagrams (see [`Traffic::datagrams`]) per request answered.
    pub datagrams_per_request: f64,
    /// Protocol datagram bytes per request.
    pub datagram_bytes_per_request: f64,
    /// Protocol messages, datagrams and whole summaries or digests fetched (see
    /// [`Traffic::messages`]), per request answered.
    pub messages_per_request: f64,
    /// Their bytes per request.
    pub message_bytes_per_request: f64,
    /// HTTP requests between caches per request.
    pub peer_http_per_request: f64,
    /// Client latency.
    pub latency_ms: LatencyMs,
    /// Busiest node's CPU utilisation.
    pub max_cpu_utilisation: f64,
    /// Mean CPU utilisation over nodes.
    pub mean_cpu_utilisation: f64,
    /// Per node.
    pub nodes: Vec<NodeLoad>,
    /// Simulated time, seconds.
    pub simulated_seconds: f64,
    /// Wall-clock time of the run, seconds.
    pub wall_seconds: f64,
    /// Requests simulated per wall-clock second.
    pub requests_per_second: f64,
    /// Summary Cache and Cache Digests: what the summaries did (other protocols: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<SummaryReport>,
    /// What produced these results (filled in by the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// Where a run's results come from: enough to run it again.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Provenance {
    /// The meshcache version that ran it.
    pub version: String,
    /// `git describe --always --dirty` of the working directory, or "unknown".
    pub revision: String,
    /// The requests: `trace FILE`, `log FILE` or `workload FILE`.
    pub input: String,
    /// The seed a generated workload was drawn with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Summary Cache and Cache Digests: every node's summary counters, summed over nodes and
/// peers (per peer, they are the proxy's `/stats`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SummaryReport {
    /// Update datagrams sent (one per peer and message).
    pub updates_sent: u64,
    /// Their bytes.
    pub update_bytes_sent: u64,
    /// Update messages built (each sent to every peer; at most 360 bit changes each).
    pub update_messages: u64,
    /// Updates published: the times a node's share of new documents reached the threshold
    /// (each sent as one or more messages to every peer).
    pub update_rounds: u64,
    /// Bit changes they carried.
    pub bit_changes: u64,
    /// Own filters rebuilt from the store (resized to the store).
    pub rebuilds: u64,
    /// Update datagrams dropped by their receiver: from a node it does not exchange summaries
    /// with (a parent, which lists no children), or undecodable.
    pub bad_updates: u64,
    /// Whole summaries (or digests) served to peers.
    pub served: u64,
    /// Their bytes.
    pub served_bytes: u64,
    /// Misses looked up in a peer's summary (one per peer with a summary and miss).
    pub lookups: u64,
    /// Lookups a summary answered "maybe".
    pub summary_hits: u64,
    /// Summary hits the peer did not have (an ICP MISS, or a 504 to a digest hit).
    pub false_hits: u64,
    /// The false hits the Bloom formula expects for the lookups made.
    pub expected_false_hits: f64,
    /// Whole summaries or digests installed.
    pub full_fetches: u64,
    /// Their bytes.
    pub full_bytes: u64,
    /// Update datagrams received from peers.
    pub updates_received: u64,
    /// Updates that showed a gap or a restart (a whole summary was fetched).
    pub gaps: u64,
    /// Summaries refused (malformed, or more than 65 % full).
    pub rejected: u64,
    /// Fetches that failed.
    pub fetch_failures: u64,
    /// False hits over lookups of objects the peer did not hold.
    pub observed_fp_rate: Option<f64>,
    /// The Bloom formula's false-positive rate, averaged over the lookups.
    pub formula_fp_rate: Option<f64>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// An empty client-latency histogram: microseconds, 1 µs to an hour, 3 significant digits
/// (longer latencies are recorded as an hour).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid")
}

/// Assembles the report of a finished (or interrupted) run.
#[allow(clippy::too_many_arguments)]
pub fn build(
    spec: &SimSpec,
    trace: &Trace,
    nodes: &[Node],
    answered: Classified,
    traffic: Traffic,
    latency: &Histogram<u64>,
    end_ns: u64,
    wall: Duration,
    interrupted: bool,
) -> Results {
    let n = answered.requests;
    let ms = |us: u64| us as f64 / 1_000.0;
    let latency_ms = if latency.is_empty() {
        LatencyMs::default()
    } else {
        LatencyMs {
            mean: latency.mean() / 1_000.0,
            p50: ms(latency.value_at_quantile(0.5)),
            p90: ms(latency.value_at_quantile(0.9)),
            p99: ms(latency.value_at_quantile(0.99)),
            max: ms(latency.max()),
        }
    };
    let span = end_ns.max(1) as f64;
    let nodes: Vec<NodeLoad> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| NodeLoad {
            name: mesh::name(i as u32, spec.mesh.caches),
            client_requests: node.stats.client_requests,
            local_hits: node.stats.local_hits,
            sibling_hits: node.stats.sibling_hits,
            parent_hits: node.stats.parent_hits,
            peer_requests: node.stats.peer_requests,
            store_hits: node.stats.store_hits,
            origin_fetches: node.stats.origin_fetches,
            datagrams: node.stats.datagrams_sent + node.stats.datagrams_received,
            datagrams_sent: node.stats.datagrams_sent,
            cpu_utilisation: node.stats.cpu_ns as f64 / span,
            objects: node.store.len() as u64,
            stored_bytes: node.store.bytes(),
            evictions: node.stats.evictions,
        })
        .collect();
    let max_cpu = nodes.iter().map(|l| l.cpu_utilisation).fold(0.0, f64::max);
    let mean_cpu = if nodes.is_empty() {
        0.0
    } else {
        nodes.iter().map(|l| l.cpu_utilisation).sum::<f64>() / nodes.len() as f64
    };
    let wall_seconds = wall.as_secs_f64();
    Results {
        spec: spec.clone(),
        trace_requests: trace.requests.len() as u64,
        trace_objects: trace.objects.len() as u64,
        trace_unique_bytes: trace.unique_bytes(),
        interrupted,
        hit_ratio: ratio(answered.requests - answered.misses, n),
        local_hit_ratio: ratio(answered.local_hits, n),
        remote_hit_ratio: ratio(answered.sibling_hits + answered.parent_hits, n),
        byte_hit_ratio: ratio(answered.hit_bytes, answered.bytes),
        datagrams_per_request: ratio(traffic.datagrams(), n),
        datagram_bytes_per_request: ratio(traffic.datagram_bytes(), n),
        messages_per_request: ratio(traffic.messages(), n),
        message_bytes_per_request: ratio(traffic.message_bytes(), n),
        peer_http_per_request: ratio(traffic.peer_http, n),
        answered,
        traffic,
        latency_ms,
        max_cpu_utilisation: max_cpu,
        mean_cpu_utilisation: mean_cpu,
        nodes,
        simulated_seconds: end_ns as f64 / 1e9,
        wall_seconds,
        requests_per_second: if wall_seconds > 0.0 {
            n as f64 / wall_seconds
        } else {
            0.0
        },
        summary: None,
        provenance: None,
    }
}
