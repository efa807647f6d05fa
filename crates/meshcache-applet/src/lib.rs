//! meshcache-applet: Active Cache, per-document applets the proxy runs on cache hits.
//!
//! An origin names an applet for a document (the `CacheApplet` response header) or an
//! administrator binds one to URLs; on every hit the proxy runs it before answering, and the
//! applet decides: serve the cached copy, serve a response it built, or send the request to the
//! origin (see Cao, Zhang and Beach, "Active Cache: Caching Dynamic Contents on the Web").
//! Applets are WebAssembly modules run by wasmtime in a sandbox with no file, network or clock
//! access beyond the host interface, under CPU, memory and copy bounds.
//!
//! Layout:
//! - `abi`: the interface, declared once: imports, the entry point, outcome codes.
//! - `hit`: what a run sees and makes: the request, the stored responses, the built response.
//! - `host`: the host functions behind it, each bounded.
//! - `runtime`: the engine, compiled-module cache, epoch ticker and one run.
//! - `rewind`: the instrumentation that lets an instance be put back as it was made, so the
//!   next hit can run in it.
//! - `state`: what outlives a run: per-origin key/value stores and the log spool.
//! - [`config`]: the `[applets]` section.
//! - [`header`]: the `CacheApplet` header and the same-origin rule.
//!
//! The proxy (`meshcache-proxy`) fetches modules, calls [`Runtime::run`] on hits and delivers
//! the log spool; this crate does no network I/O.

mod abi;
pub mod config;
pub mod header;
mod hit;
mod host;
mod rewind;
mod runtime;
mod shard;
mod state;
mod ticker;

pub use config::{AppletConfig, Binding};
pub use hit::{Built, Hit, Invocation, Item, Items};
pub use runtime::{Applet, Counter, Counters, Reason, Runtime, Spent, Verdict};

/// What can go wrong building the runtime or loading a module.
#[derive(Debug, thiserror::Error)]
pub enum AppletError {
    /// The `[applets]` section is inconsistent.
    #[error("{0}")]
    Config(String),
    /// wasmtime refused the engine configuration.
    #[error("applet engine: {0}")]
    Engine(String),
    /// The module is larger than `applets.max_module`.
    #[error("applet module of {size} bytes is larger than applets.max_module ({max} bytes)")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// The bytes are not a valid WebAssembly module.
    #[error("applet module does not compile: {0}")]
    Compile(String),
    /// The module does not fit the interface (unknown import, missing export).
    #[error("applet module does not fit the interface: {0}")]
    Link(String),
}

#[cfg(test)]
mod tests;
