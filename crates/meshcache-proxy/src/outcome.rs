//! How each request ended, in Squid's vocabulary.
//!
//! Every transaction finishes with a [`ResultCode`] and a [`HierCode`] (where the response
//! came from, shared with the cooperation crate). They are what the
//! access log prints (so Squid's log tools read our logs), what `X-Cache` and `Cache-Status`
//! report, and what the metrics count.

pub use meshcache_dcm::HierCode;

/// Squid's result codes (the `%Ss` field of the native log format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ResultCode {
    /// Served from the memory store (Squid logs memory hits as TCP_MEM_HIT).
    TcpMemHit,
    /// Served from a disk (Squid's TCP_HIT: a hit that is not a memory hit).
    TcpHit,
    /// Fetched from upstream.
    TcpMiss,
    /// A stale object revalidated: upstream said 304.
    TcpRefreshUnmodified,
    /// A stale object revalidated: upstream sent a new one.
    TcpRefreshModified,
    /// Revalidation failed; the stale object was served (stale-if-error).
    TcpRefreshFailOld,
    /// Revalidation failed; the client got the error.
    TcpRefreshFailErr,
    /// Served stale while a background refresh runs (stale-while-revalidate).
    TcpStaleHit,
    /// The client's If-Modified-Since was answered 304 from the cache.
    TcpImsHit,
    /// The client's If-None-Match was answered 304 from the cache.
    TcpInmHit,
    /// Refused by the ACL or a policy.
    TcpDenied,
    /// A CONNECT tunnel.
    TcpTunnel,
    /// No transaction took place: the request was unparseable or malformed.
    NoneNone,
}

impl ResultCode {
    /// Every code, in metric order.
    pub const ALL: [ResultCode; 13] = [
        ResultCode::TcpMemHit,
        ResultCode::TcpHit,
        ResultCode::TcpMiss,
        ResultCode::TcpRefreshUnmodified,
        ResultCode::TcpRefreshModified,
        ResultCode::TcpRefreshFailOld,
        ResultCode::TcpRefreshFailErr,
        ResultCode::TcpStaleHit,
        ResultCode::TcpImsHit,
        ResultCode::TcpInmHit,
        ResultCode::TcpDenied,
        ResultCode::TcpTunnel,
        ResultCode::NoneNone,
    ];

    /// The name Squid prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultCode::TcpMemHit => "TCP_MEM_HIT",
            ResultCode::TcpHit => "TCP_HIT",
            ResultCode::TcpMiss => "TCP_MISS",
            ResultCode::TcpRefreshUnmodified => "TCP_REFRESH_UNMODIFIED",
            ResultCode::TcpRefreshModified => "TCP_REFRESH_MODIFIED",
            ResultCode::TcpRefreshFailOld => "TCP_REFRESH_FAIL_OLD",
            ResultCode::TcpRefreshFailErr => "TCP_REFRESH_FAIL_ERR",
            ResultCode::TcpStaleHit => "TCP_STALE_HIT",
            ResultCode::TcpImsHit => "TCP_IMS_HIT",
            ResultCode::TcpInmHit => "TCP_INM_HIT",
            ResultCode::TcpDenied => "TCP_DENIED",
            ResultCode::TcpTunnel => "TCP_TUNNEL",
            ResultCode::NoneNone => "NONE_NONE",
        }
    }

    /// True when the body came from our store (what `X-Cache: HIT` means).
    pub fn is_hit(self) -> bool {
        matches!(
            self,
            ResultCode::TcpMemHit
                | ResultCode::TcpHit
                | ResultCode::TcpRefreshUnmodified
                | ResultCode::TcpRefreshFailOld
                | ResultCode::TcpStaleHit
                | ResultCode::TcpImsHit
                | ResultCode::TcpInmHit
        )
    }

    /// Index into per-code metric arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}
