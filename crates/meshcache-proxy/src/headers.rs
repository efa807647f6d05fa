//! Header handling shared by every path through the proxy: hop-by-hop removal, `Via`,
//! `X-Forwarded-For`, and `Range`. (Cache directives are in `directives`, `Vary` in `vary`.)
//! Everything here is pure.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::ForwardedFor;

/// Headers that describe one connection, never the message (RFC 9110 §7.6.1), plus
/// the de-facto `Proxy-Connection` and `Keep-Alive`, and the `Proxy-*` authentication fields,
/// which concern one proxy hop and which a cache must not store (RFC 9111 §3.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-authentication-info"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including every header that `Connection` names.
/// `Transfer-Encoding` goes too: hyper re-frames every body it sends.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

/// Appends our hop to `Via` (an entry of [`OwnVia`]).
pub fn append_via(headers: &mut HeaderMap, via: &HeaderValue) {
    headers.append(header::VIA, via.clone());
}

/// This node's `Via` entries. The entry names the protocol version of the message as this
/// node received it (RFC 9110 §7.6.3): a request from an HTTP/1.0 client goes upstream with
/// `1.0 NAME`, a response from an HTTP/1.0 origin goes to the client with it; what the node
/// makes itself (hits, errors, its own requests) says `1.1`.
#[derive(Clone, Debug)]
pub struct OwnVia {
    http_11: HeaderValue,
    http_10: HeaderValue,
}

impl OwnVia {
    /// The entries of the node called `name`.
    pub fn new(name: &str) -> Self {
        let entry = |version: &str| {
            HeaderValue::from_str(&format!(
                "{version} {name} (meshcache/{})",
                env!("CARGO_PKG_VERSION")
            ))
            .unwrap_or_else(|_| HeaderValue::from_static("1.1 meshcache"))
        };
        Self {
            http_11: entry("1.1"),
            http_10: entry("1.0"),
        }
    }

    /// The entry for a message this node makes itself.
    pub fn own(&self) -> &HeaderValue {
        &self.http_11
    }

    /// The entry for a message received as `version` (HTTP/1.0 and older as `1.0`).
    pub fn received(&self, version: http::Version) -> &HeaderValue {
        if version <= http::Version::HTTP_10 {
            &self.http_10
        } else {
            &self.http_11
        }
    }
}

/// The most proxies a request may have passed through before we refuse it as a loop.
pub const MAX_VIA_HOPS: usize = 16;

/// How many proxies a request has passed through, by its `Via` entries.
pub fn via_hops(headers: &HeaderMap) -> usize {
    headers
        .get_all(header::VIA)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|hop| !hop.trim().is_empty())
        .count()
}

/// True when a `Via` header already names this node: the request has looped back to us.
pub fn via_contains(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get_all(header::VIA)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|hop| hop.split_whitespace().nth(1) == Some(name))
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Sets a forwarded request's `X-Forwarded-For` for `client` as `mode` says (Squid's
/// `forwarded_for`): `on` appends the client's address, `off` appends `unknown`, `truncate`
/// leaves the client's address alone, `delete` removes the header, `transparent` leaves it as
/// the client sent it. The list is sent as one field. A client that named the header in
/// `Connection` (to have it dropped as hop-by-hop) does not thereby drop the entry added here.
pub fn forwarded_for(headers: &mut HeaderMap, mode: ForwardedFor, client: IpAddr) {
    if mode == ForwardedFor::Transparent {
        return;
    }
    let hop_by_hop = unlist_connection(headers, &X_FORWARDED_FOR);
    let mut list = String::new();
    if !hop_by_hop && matches!(mode, ForwardedFor::On | ForwardedFor::Off) {
        for item in headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            list.push_str(item);
            list.push_str(", ");
        }
    }
    headers.remove(&X_FORWARDED_FOR);
    match mode {
        ForwardedFor::On | ForwardedFor::Truncate => {
            list.push_str(&client.to_canonical().to_string())
        }
        ForwardedFor::Off => list.push_str("unknown"),
        ForwardedFor::Delete | ForwardedFor::Transparent => return,
    }
    if let Ok(v) = HeaderValue::from_str(&list) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

/// Takes `name` out of the `Connection` header's list; true when it was there.
fn unlist_connection(headers: &mut HeaderMap, name: &HeaderName) -> bool {
    let mut found = false;
    let mut rest = Vec::new();
    for token in headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        if token.eq_ignore_ascii_case(name.as_str()) {
            found = true;
        } else {
            rest.push(token.to_owned());
        }
    }
    if found {
        headers.remove(header::CONNECTION);
        if let Ok(v) = HeaderValue::from_str(&rest.join(", ")) {
            if !rest.is_empty() {
                headers.insert(header::CONNECTION, v);
            }
        }
    }
    found
}

/// A 206's `Content-Range: bytes a-b/N` (RFC 9110 §14.4) as `(a, b, N)`: one range with the
/// representation's complete length; `None` for anything else (`*` for the length, a range
/// that is empty or past the length, another unit).
pub fn parse_content_range(value: &HeaderValue) -> Option<(u64, u64, u64)> {
    let spec = value.to_str().ok()?.trim().strip_prefix("bytes ")?;
    let (range, total) = spec.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let digits = |s: &str| {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (first, last, total) = (digits(first)?, digits(last)?, digits(total)?);
    (first <= last && last < total).then_some((first, last, total))
}

/// A single satisfiable byte range, resolved against the object length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
}

/// What a `Range` request header asks of an object of `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeRequest {
    /// No range, several ranges or a form we do not serve partially: send the whole object.
    Whole,
    /// One satisfiable range: send 206.
    Partial(ByteRange),
    /// The range lies past the end: send 416.
    Unsatisfiable,
}

/// Interprets a `Range` header (RFC 9110 §14.2) for a cached object of `len` bytes.
pub fn parse_range(value: &HeaderValue, len: u64) -> RangeRequest {
    let Ok(text) = value.to_str() else {
        return RangeRequest::Whole;
    };
    let Some(spec) = text.trim().strip_prefix("bytes=") else {
        return RangeRequest::Whole;
    };
    if spec.contains(',') {
        return RangeRequest::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeRequest::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        // Suffix range: the last N bytes.
        let Ok(n) = last.parse::<u64>() else {
            return RangeRequest::Whole;
        };
        if n == 0 || len == 0 {
            return RangeRequest::Unsatisfiable;
        }
        ByteRange {
            start: len.saturating_sub(n),
            end: len - 1,
        }
    } else {
        let Ok(start) = first.parse::<u64>() else {
            return RangeRequest::Whole;
        };
        let end = if last.is_empty() {
            u64::MAX
        } else {
            match last.parse::<u64>() {
                Ok(e) if e >= start => e,
                _ => return RangeRequest::Whole,
            }
        };
        if start >= len {
            return RangeRequest::Unsatisfiable;
        }
        ByteRange {
            start,
            end: end.min(len - 1),
        }
    };
    RangeRequest::Partial(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::map;

    #[test]
    fn forwarded_for_modes() {
        let client: IpAddr = "192.0.2.7".parse().expect("ip");
        let sent = |mode, pairs: &[(&str, &str)]| {
            let mut h = map(pairs);
            forwarded_for(&mut h, mode, client);
            let values: Vec<&str> = h
                .get_all("x-forwarded-for")
                .iter()
                .map(|v| v.to_str().expect("ascii"))
                .collect();
            (values.join(" | "), h)
        };
        let two = [
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", " 10.0.0.2 ,"),
        ];
        for (mode, none, with) in [
            (
                ForwardedFor::On,
                "192.0.2.7",
                "10.0.0.1, 10.0.0.2, 192.0.2.7",
            ),
            (ForwardedFor::Off, "unknown", "10.0.0.1, 10.0.0.2, unknown"),
            (ForwardedFor::Truncate, "192.0.2.7", "192.0.2.7"),
            (ForwardedFor::Delete, "", ""),
            (ForwardedFor::Transparent, "", "10.0.0.1 |  10.0.0.2 ,"),
        ] {
            assert_eq!(sent(mode, &[]).0, none, "{mode:?} without a header");
            assert_eq!(sent(mode, &two).0, with, "{mode:?} with two");
        }
        // An IPv4 client on a dual-stack socket is written as IPv4; IPv6 as is.
        let mut h = HeaderMap::new();
        forwarded_for(
            &mut h,
            ForwardedFor::On,
            "::ffff:192.0.2.9".parse().expect("ip"),
        );
        assert_eq!(h["x-forwarded-for"], "192.0.2.9");
        let mut h = HeaderMap::new();
        forwarded_for(&mut h, ForwardedFor::On, "2001:db8::1".parse().expect("ip"));
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        // A client cannot have our entry dropped by calling the header hop-by-hop: its own
        // entries go (they were hop-by-hop), ours stays, and so do the other Connection tokens.
        let (value, mut h) = sent(
            ForwardedFor::On,
            &[
                ("connection", "X-Forwarded-For, x-other"),
                ("x-forwarded-for", "10.6.6.6"),
                ("x-other", "1"),
            ],
        );
        assert_eq!(value, "192.0.2.7");
        strip_hop_by_hop(&mut h);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert!(!h.contains_key("x-other"));
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authenticate", "Basic realm=\"x\""),
            ("proxy-authentication-info", "nextnonce=\"a\""),
            ("x-end-to-end", "kept"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn via_loop_detection() {
        let h = map(&[("via", "1.1 edge (squid), 1.1 cache1 (meshcache/0.1.0)")]);
        assert!(via_contains(&h, "cache1"));
        assert!(!via_contains(&h, "cache2"));
        assert_eq!(via_hops(&h), 2);
    }

    #[test]
    fn content_ranges() {
        let cr = |s: &str| parse_content_range(&HeaderValue::from_str(s).expect("value"));
        assert_eq!(cr("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(cr("bytes 99-99/100"), Some((99, 99, 100)));
        for bad in [
            "bytes 0-9/*",
            "bytes */100",
            "bytes 9-0/100",
            "bytes 0-100/100",
            "items 0-9/100",
            "bytes 0-9",
            "bytes -1-9/100",
            "bytes 0-9/1e3",
        ] {
            assert_eq!(cr(bad), None, "{bad}");
        }
    }

    #[test]
    fn ranges() {
        let r = |s: &str, len| parse_range(&HeaderValue::from_str(s).expect("value"), len);
        assert_eq!(
            r("bytes=0-9", 100),
            RangeRequest::Partial(ByteRange { start: 0, end: 9 })
        );
        assert_eq!(
            r("bytes=90-", 100),
            RangeRequest::Partial(ByteRange { start: 90, end: 99 })
        );
        assert_eq!(
            r("bytes=-10", 100),
            RangeRequest::Partial(ByteRange { start: 90, end: 99 })
        );
        assert_eq!(
            r("bytes=50-500", 100),
            RangeRequest::Partial(ByteRange { start: 50, end: 99 })
        );
        assert_eq!(r("bytes=100-", 100), RangeRequest::Unsatisfiable);
        assert_eq!(r("bytes=0-1,5-6", 100), RangeRequest::Whole);
        assert_eq!(r("items=0-1", 100), RangeRequest::Whole);
        assert_eq!(r("bytes=9-1", 100), RangeRequest::Whole);
    }
}
