//! The proxy's errors. Each says which side failed and whether retrying could help, and maps
//! to the status and short explanation the client sees.

use http::StatusCode;

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The host name did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// Host asked for.
        host: String,
        /// Resolver error.
        source: std::io::Error,
    },
    /// TCP connect refused or unreachable.
    #[error("cannot connect to {host}: {source}")]
    Connect {
        /// Host asked for.
        host: String,
        /// Socket error.
        source: std::io::Error,
    },
    /// TCP connect took longer than `upstream.connect_timeout`.
    #[error("connection to {host} timed out")]
    ConnectTimeout {
        /// Host asked for.
        host: String,
    },
    /// The upstream went silent for longer than `upstream.read_timeout`.
    #[error("{host} did not answer in time")]
    ReadTimeout {
        /// Host asked for.
        host: String,
    },
    /// The request may not go to the origin (`never_direct`) and no parent is up.
    #[error("{host} may only be reached through a parent, and no parent is up")]
    NoRoute {
        /// Host asked for.
        host: String,
    },
    /// A parent refused to open a CONNECT tunnel.
    #[error("parent {peer} answered {status} to CONNECT {authority}")]
    TunnelRefused {
        /// The parent.
        peer: String,
        /// Its status.
        status: StatusCode,
        /// The tunnel asked for.
        authority: String,
    },
    /// The upstream broke HTTP or closed the connection early.
    #[error("{host} failed: {source}")]
    Protocol {
        /// Host asked for.
        host: String,
        /// hyper's error.
        source: hyper::Error,
    },
}

impl UpstreamError {
    /// Classifies a hyper error, finding timeouts among its causes.
    pub fn from_hyper(host: &str, e: hyper::Error) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::TimedOut {
                    return UpstreamError::ReadTimeout {
                        host: host.to_owned(),
                    };
                }
            }
            cause = c.source();
        }
        UpstreamError::Protocol {
            host: host.to_owned(),
            source: e,
        }
    }

    /// The `X-Meshcache-Error` token the client gets.
    pub fn token(&self) -> &'static str {
        match self {
            UpstreamError::Resolve { .. } => "dns-failure",
            UpstreamError::Connect { .. } => "connect-failed",
            UpstreamError::ConnectTimeout { .. } | UpstreamError::ReadTimeout { .. } => {
                "upstream-timeout"
            }
            UpstreamError::NoRoute { .. } => "no-route",
            UpstreamError::TunnelRefused { .. } => "parent-refused",
            UpstreamError::Protocol { .. } => "upstream-failed",
        }
    }

    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::ConnectTimeout { .. } | UpstreamError::ReadTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            UpstreamError::NoRoute { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}
