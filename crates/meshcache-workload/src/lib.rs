//! # meshcache-workload
//!
//! Workloads for meshcache's evaluation lab and simulator, as pure data and
//! pure functions (no I/O beyond `std::io::{Read, Write}` handed in, no
//! clock, no tokio):
//!
//! * [`trace`]: the request stream every consumer reads — one [`Request`] a
//!   line, written and read by [`trace::write`] and [`trace::read`];
//! * [`log`]: Squid access-log parsing (native format and the common
//!   variants), bad lines counted, never fatal;
//! * [`characterize`]: what a log says about its workload, per domain group
//!   (the hierarchy-evaluation paper's hot ratio, hot set size, hot set
//!   popularity and domain ratio, plus rate, sizes, popularity slope,
//!   temporal locality, one-timers, cacheability);
//! * [`generate`]: deterministic (seeded) synthetic request streams from a
//!   characterization or from explicit parameters.

pub mod characterize;
pub mod generate;
pub mod log;
pub mod trace;

pub use trace::Request;
