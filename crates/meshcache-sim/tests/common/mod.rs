//! What the simulator's test files share: running a spec to the end, a request, a serial
//! spec on an instantaneous network.

#![allow(dead_code)] // each test file uses its own part

use std::sync::atomic::AtomicBool;

use meshcache_sim::spec::{NetSpec, Protocol, Replay};
use meshcache_sim::{Control, Results, SimSpec, Trace};
use meshcache_workload::Request;

/// Runs `spec` over `trace` to the end, without progress reports.
pub fn run(spec: &SimSpec, trace: &Trace) -> Results {
    let stop = AtomicBool::new(false);
    let mut progress = |_| {};
    meshcache_sim::run(
        spec,
        trace,
        Control {
            stop: &stop,
            progress: &mut progress,
        },
    )
    .expect("runs")
}

/// A 1000-byte request for `url` by `client`, at time 0.
pub fn req(client: u32, url: &str) -> Request {
    Request {
        time_ms: 0,
        client,
        size: 1000,
        url: url.into(),
    }
}

/// `caches` sibling caches running `protocol`, one request at a time on an instantaneous
/// network (client `c` uses cache `c mod caches`).
pub fn serial(caches: u32, protocol: Protocol) -> SimSpec {
    let mut spec = SimSpec::default();
    spec.mesh.caches = caches;
    spec.protocol.name = protocol;
    spec.net = NetSpec::instant();
    spec.replay.mode = Replay::Serial;
    spec
}
