//! One cache, one request at a time: a replay with no events at all.
//!
//! With a single cache and no parent there is nobody to talk to, and with serial replay
//! nothing overlaps, so no queue ever forms: each request's fate is the store's answer and its
//! latency a sum of fixed terms. This loop gives exactly what the engine gives for such a
//! spec (a test compares them field by field) at the speed of the store alone — the speed a
//! cache-replacement study needs, to compare with single-cache simulators on the same trace.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::engine::Control;
use crate::mesh::{self, Node};
use crate::net::{ns, wire};
use crate::results::{self, Classified, Outcome, Results, Traffic};
use crate::spec::{Protocol, Replay, SimSpec};
use crate::trace::Trace;

/// Whether `spec` is a single cache replayed serially.
pub fn applies(spec: &SimSpec) -> bool {
    spec.mesh.caches == 1
        && spec.mesh.parents == 0
        && spec.replay.mode == Replay::Serial
        && spec.replay.warmup == 0
        && spec.replay.serial_gap.is_zero()
        // No timers: the summaries' drain ticks and the directory's upkeep would move time.
        && matches!(spec.protocol.name, Protocol::None | Protocol::Icp | Protocol::Carp)
}

/// Replays `trace` through the one cache of `spec` (see [`applies`]).
pub fn run(spec: &SimSpec, trace: &Trace, control: Control<'_>) -> Results {
    let wall = Instant::now();
    let mut nodes: Vec<Node> = mesh::build(spec, |_, _| Box::new(meshcache_dcm::engine::NoSearch));
    let node = &mut nodes[0];
    let net = &spec.net;
    let hdr = net.http_header_bytes;
    let (client_latency, origin_latency) = (ns(net.client_latency), ns(net.origin_latency));
    let cpu_request = ns(net.cpu_request);
    let cpu_per_kib = ns(net.cpu_per_kib);
    let mut classified = Classified::default();
    let mut latency = results::latency_histogram();
    let mut now: u64 = 0;
    let mut interrupted = false;
    let mut bodies = mesh::Bodies::new(trace.objects.len());
    let mut events = Vec::new();
    for (i, r) in trace.requests.iter().enumerate() {
        if i % 65_536 == 65_535 {
            (control.progress)(classified.requests);
            if control.stop.load(Ordering::Relaxed) {
                interrupted = true;
                break;
            }
        }
        now = now.max(r.time_ns);
        node.stats.client_requests += 1;
        node.stats.cpu_ns += cpu_request;
        let to_client = wire(r.size + hdr, net.client_bandwidth) + client_latency;
        let mut elapsed = client_latency + cpu_request;
        let outcome = if node.store.get(&r.key).is_some() {
            node.stats.store_hits += 1;
            let body_cpu = cpu_per_kib * r.size.div_ceil(1024);
            node.stats.cpu_ns += body_cpu;
            elapsed += body_cpu;
            Outcome::Local
        } else {
            node.stats.origin_fetches += 1;
            let body_cpu = cpu_request + cpu_per_kib * r.size.div_ceil(1024);
            node.stats.cpu_ns += body_cpu;
            elapsed += 2 * origin_latency + wire(r.size + hdr, net.origin_bandwidth) + body_cpu;
            if r.cacheable {
                events.clear();
                let body = bodies.get(r.obj, r.size);
                if node.store.insert_into(r.key, body, &mut events).is_ok() {
                    node.stats.evicted(&events);
                }
            }
            Outcome::Miss
        };
        elapsed += to_client;
        latency.saturating_record((elapsed / 1_000).max(1));
        now += elapsed;
        classified.add(outcome, r.size);
        node.stats.count(outcome);
    }
    (control.progress)(classified.requests);
    results::build(
        spec,
        trace,
        &nodes,
        classified,
        Traffic::default(),
        &latency,
        now,
        wall.elapsed(),
        interrupted,
    )
}
