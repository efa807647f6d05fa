//! meshcache-sim: a trace-driven discrete-event simulator of meshcache meshes, and the
//! directory-based DCM paper's analytical model.
//!
//! The simulator drives the very protocol code the proxy runs (`meshcache-dcm`'s state
//! machines, `meshcache-store`'s replacement policies, `meshcache-summary`'s filters) on a
//! virtual clock, with thousands of virtual caches. No tokio, no sockets: time is a number.

mod counters;
mod engine;
mod fanout;
pub mod mesh;
pub mod model;
mod net;
pub mod plot;
mod proto;
pub mod results;
pub mod single;
pub mod spec;
pub mod trace;

pub use engine::{Control, Sim};
pub use results::Results;
pub use spec::{Protocol, SimSpec};
pub use trace::Trace;

/// Runs `spec` over `trace` to the end (or until `control` stops it). A single cache
/// replayed serially takes the event-free loop of [`single`], which gives the same results.
pub fn run(spec: &SimSpec, trace: &Trace, control: Control<'_>) -> Result<Results, String> {
    spec.validate().map_err(|e| e.to_string())?;
    if spec.replay.warmup > 0 && spec.replay.warmup >= trace.requests.len() as u64 {
        return Err(format!(
            "replay.warmup: {} warm-up requests leave nothing to measure in a trace of {}",
            spec.replay.warmup,
            trace.requests.len()
        ));
    }
    if single::applies(spec) {
        return Ok(single::run(spec, trace, control));
    }
    Ok(Sim::new(spec, trace).run(control))
}
