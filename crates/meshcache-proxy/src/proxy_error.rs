//! Why a proxy could not start: one error for the whole start-up, each case naming what
//! to fix.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::ConfigError;

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The config is invalid.
    #[error("invalid config: {0}")]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// `multicast_mode = "ip"`, and IP multicast on loopback is not available.
    #[error("multicast group {group}: {reason}")]
    Multicast {
        /// The group.
        group: std::net::SocketAddrV4,
        /// Why.
        reason: String,
    },
    /// Active Cache could not start (engine, or a bound module that does not load).
    #[error("applets: {0}")]
    Applets(String),
    /// A disk of the store could not be used.
    #[error("store.disk: {0}")]
    Disk(meshcache_disk::OpenError),
    /// Proxy authentication could not start (the htpasswd file, the helpers).
    #[error("auth: {0}")]
    Auth(meshcache_auth::AuthError),
    /// The error page templates could not be read.
    #[error("cannot read error pages from {path:?}: {source}")]
    ErrorPages {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The access log could not be opened.
    #[error("cannot open access log {path:?}: {source}")]
    AccessLog {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
