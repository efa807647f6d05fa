//! Header handling shared by every path through the proxy: hop-by-hop removal, `Via`,
//! `X-Forwarded-For`, request `Cache-Control` directives, and the small header parsers the
//! cache needs.
//! Everything here is pure.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::ForwardedFor;

/// Headers that describe one connection, never the message (RFC 9110 §7.6.1), plus
/// the de-facto `Proxy-Connection` and `Keep-Alive`.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
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

/// Appends our hop to `Via` ("1.1 NAME (meshcache/VERSION)").
pub fn append_via(headers: &mut HeaderMap, via: &HeaderValue) {
    headers.append(header::VIA, via.clone());
}

/// The `Via` value this node adds.
pub fn via_value(name: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "1.1 {name} (meshcache/{})",
        env!("CARGO_PKG_VERSION")
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("1.1 meshcache"))
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

/// The request's cache directives (RFC 9111 §5.2.1), plus `Pragma: no-cache`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestDirectives {
    /// `max-age=N`: the client accepts nothing older.
    pub max_age: Option<u64>,
    /// `max-stale[=N]`: the client accepts a stale response (by at most N seconds).
    pub max_stale: Option<Option<u64>>,
    /// `min-fresh=N`: the response must stay fresh at least N more seconds.
    pub min_fresh: Option<u64>,
    /// `no-cache` (or `Pragma: no-cache`): validate with the origin first.
    pub no_cache: bool,
    /// `no-store`: store nothing of this exchange.
    pub no_store: bool,
    /// `only-if-cached`: answer from the cache or with 504.
    pub only_if_cached: bool,
}

impl RequestDirectives {
    /// Parses `Cache-Control` (all instances) and, absent that, `Pragma`.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut d = RequestDirectives::default();
        let mut any_cc = false;
        for (name, value) in directives(headers, header::CACHE_CONTROL) {
            any_cc = true;
            let secs = || value.and_then(|v| v.parse::<u64>().ok());
            match name.as_str() {
                "max-age" => d.max_age = secs().or(Some(0)),
                "max-stale" => d.max_stale = Some(secs()),
                "min-fresh" => d.min_fresh = secs(),
                "no-cache" => d.no_cache = true,
                "no-store" => d.no_store = true,
                "only-if-cached" => d.only_if_cached = true,
                _ => {}
            }
        }
        if !any_cc && directives(headers, header::PRAGMA).any(|(n, _)| n == "no-cache") {
            d.no_cache = true;
        }
        d
    }

    /// Squid's `ignore-reload`: the client's reload (`no-cache`, `Pragma: no-cache`,
    /// `max-age=0`) is disregarded, so a fresh stored response answers it.
    pub fn ignore_reload(&mut self) {
        self.no_cache = false;
        if self.max_age == Some(0) {
            self.max_age = None;
        }
    }
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

/// The response directives the cache acts on beyond freshness (RFC 9111 §5.2.2, RFC 5861).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseDirectives {
    /// `must-revalidate` / `proxy-revalidate`: never serve stale.
    pub must_revalidate: bool,
    /// `stale-while-revalidate=N`.
    pub stale_while_revalidate: Option<u32>,
    /// `stale-if-error=N`.
    pub stale_if_error: Option<u32>,
}

impl ResponseDirectives {
    /// Parses the response's `Cache-Control`.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut d = ResponseDirectives::default();
        for (name, value) in directives(headers, header::CACHE_CONTROL) {
            let secs = || value.and_then(|v| v.parse::<u32>().ok());
            match name.as_str() {
                "must-revalidate" | "proxy-revalidate" => d.must_revalidate = true,
                "stale-while-revalidate" => d.stale_while_revalidate = secs(),
                "stale-if-error" => d.stale_if_error = secs(),
                _ => {}
            }
        }
        d
    }
}

/// Iterates `name[=value]` directives of a comma-separated header, names lower-cased,
/// quotes stripped from values.
pub(crate) fn directives(
    headers: &HeaderMap,
    name: HeaderName,
) -> impl Iterator<Item = (String, Option<&str>)> + '_ {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|item| {
            let item = item.trim();
            if item.is_empty() {
                return None;
            }
            let (n, v) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (item, None),
            };
            Some((n.to_ascii_lowercase(), v))
        })
}

/// The field names a response's `Vary` lists, lower-cased; `None` for `Vary: *`.
pub fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for item in headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let item = item.trim();
        if item == "*" {
            return None;
        }
        if let Ok(name) = HeaderName::from_bytes(item.to_ascii_lowercase().as_bytes()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Some(names)
}

/// The bytes that select a Vary variant: each named header's values, normalised
/// (whitespace around commas folded), separated so that no two requests collide.
pub fn vary_selector(names: &[HeaderName], request: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::new();
    for name in names {
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        let mut first = true;
        for value in request.get_all(name) {
            for part in value.as_bytes().split(|&b| b == b',') {
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(part.trim_ascii());
            }
        }
        out.push(0);
    }
    out
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

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

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
    fn ignore_reload_drops_reloads_only() {
        for reload in [
            &[("cache-control", "no-cache")][..],
            &[("pragma", "no-cache")],
            &[("cache-control", "max-age=0")],
        ] {
            let mut d = RequestDirectives::parse(&map(reload));
            d.ignore_reload();
            assert_eq!(d, RequestDirectives::default(), "{reload:?}");
        }
        let mut d = RequestDirectives::parse(&map(&[("cache-control", "max-age=5, no-store")]));
        d.ignore_reload();
        assert_eq!((d.max_age, d.no_store), (Some(5), true));
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
    fn request_directives() {
        let d = RequestDirectives::parse(&map(&[
            ("cache-control", "max-age=5, Min-Fresh=\"2\""),
            ("cache-control", "max-stale, only-if-cached"),
        ]));
        assert_eq!(d.max_age, Some(5));
        assert_eq!(d.min_fresh, Some(2));
        assert_eq!(d.max_stale, Some(None));
        assert!(d.only_if_cached && !d.no_cache);
        assert!(RequestDirectives::parse(&map(&[("pragma", "no-cache")])).no_cache);
        // Cache-Control wins over Pragma when both are present.
        assert!(
            !RequestDirectives::parse(&map(&[
                ("pragma", "no-cache"),
                ("cache-control", "max-age=1")
            ]))
            .no_cache
        );
    }

    #[test]
    fn response_directives() {
        let d = ResponseDirectives::parse(&map(&[(
            "cache-control",
            "max-age=1, stale-while-revalidate=30, stale-if-error=60, proxy-revalidate",
        )]));
        assert_eq!(d.stale_while_revalidate, Some(30));
        assert_eq!(d.stale_if_error, Some(60));
        assert!(d.must_revalidate);
    }

    #[test]
    fn vary() {
        assert_eq!(vary_names(&map(&[("vary", "*")])), None);
        let names =
            vary_names(&map(&[("vary", "Accept-Encoding, accept-language")])).expect("names");
        assert_eq!(names.len(), 2);
        let a = vary_selector(&names, &map(&[("accept-encoding", "gzip,  br")]));
        let b = vary_selector(&names, &map(&[("accept-encoding", "gzip, br")]));
        let c = vary_selector(&names, &map(&[("accept-encoding", "br")]));
        assert_eq!(a, b);
        assert_ne!(a, c);
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
