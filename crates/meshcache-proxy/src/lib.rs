//! meshcache-proxy: the caching HTTP/1.1 forward proxy.
//!
//! A request enters through `server` (listeners, ACL, limits, shutdown), is handled by
//! `service` (the request lifecycle, described there), which consults the [`cache`] (store,
//! Vary, collapsed forwarding, store events) under the rules of `storable` and [`semantics`] (RFC 9111, pure; `directives` and `vary` read the fields they need),
//! and goes upstream through `upstream` (persistent pooled connections); the upstream
//! server's interim (1xx) responses reach the client through `interim`. The response body
//! (`body`) streams back to the client, captures a copy for the store when allowed, and ends
//! the transaction with one line in the `accesslog` and the `metrics`. `efficiency` times
//! the work by kind (clients, peers, searches) against the process's CPU time. `sockopt`
//! applies each side's socket options and reads back what the kernel made of them.
//!
//! Embedding it:
//! ```no_run
//! # async fn run() -> Result<(), meshcache_proxy::ProxyError> {
//! use meshcache_proxy::{Config, Listeners, Proxy};
//! let config = Config::default();
//! let listeners = Listeners::bind(&config)?;
//! let proxy = Proxy::new(config)?;
//! proxy.serve(listeners, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod access;
mod accesslog;
mod admin;
mod applets;
mod attachment;
mod body;
pub mod cache;
mod caching;
pub mod config;
mod coop;
mod decide;
mod directives;
mod efficiency;
mod error;
mod errorpage;
mod forward;
mod guard;
mod headers;
mod idle;
mod interim;
mod metrics;
mod outcome;
mod proxy_error;
mod ranges;
mod refusal;
mod resolve;
mod reusable_post;
mod routing;
pub mod semantics;
mod server;
mod service;
mod sockopt;
mod stamps;
mod storable;
mod target;
#[cfg(test)]
mod testing;
mod tunnel;
mod upstream;
mod vary;
mod zerocopy;

use std::sync::Arc;

pub use config::{Config, ConfigError, DEFAULT_CONFIG};
pub use proxy_error::ProxyError;
pub use server::{Listeners, Proxy};

/// State every request of one proxy shares.
pub(crate) struct Shared {
    config: Config,
    /// Who may use the proxy for what.
    access: access::Access,
    /// Where requests may go: `never_direct`, `always_direct`.
    routing: routing::Routing,
    /// The bodies of the responses the proxy makes up.
    errors: errorpage::ErrorPages,
    /// Proxy authentication, when `[auth]` is configured.
    auth: Option<Arc<meshcache_auth::Authenticator>>,
    cache: cache::Cache,
    /// Refresh patterns, cache rules, PURGE.
    caching: caching::Caching,
    upstream: upstream::Upstream,
    coop: coop::Coop,
    /// Active Cache, when `applets.enabled`.
    applets: Option<Arc<applets::Active>>,
    metrics: Arc<metrics::Metrics>,
    log: Option<accesslog::AccessLog>,
    via: headers::OwnVia,
    x_cache_hit: http::HeaderValue,
    x_cache_miss: http::HeaderValue,
    /// `Cache-Status` of a response an applet built for a hit.
    applet_built_status: Option<http::HeaderValue>,
    /// Clock ticks per second of `/proc` CPU times, read once at start.
    clock_ticks: u64,
}

impl Shared {
    /// Where the node's time went so far.
    fn efficiency(&self) -> efficiency::EfficiencyReport {
        self.metrics
            .efficiency
            .report(efficiency::process_cpu_seconds(self.clock_ticks))
    }
}

impl coop::host::Host for Shared {
    fn config(&self) -> &Config {
        &self.config
    }

    fn cache(&self) -> &cache::Cache {
        &self.cache
    }

    fn link(&self) -> &coop::Link {
        &self.coop
    }

    fn upstream(&self) -> &upstream::Upstream {
        &self.upstream
    }

    fn via(&self) -> &http::HeaderValue {
        self.via.own()
    }

    fn efficiency(&self) -> &efficiency::Efficiency {
        &self.metrics.efficiency
    }
}
