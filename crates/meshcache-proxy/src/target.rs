//! Where a request goes: the upstream target worked out from its URI (the cache key, the
//! request line's path, host and port), and URI references (`Location`, `Content-Location`)
//! resolved against it.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};

use crate::headers;
use crate::interim::InterimRelay;
use crate::routing::Directness;
use crate::stamps::add_via_received;
use crate::upstream::UpBody;
use crate::Shared;

/// Where a request goes upstream.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// Host, lower-case.
    pub host: String,
    /// Port.
    pub port: u16,
    /// The canonical URL: the cache key and the logged URL.
    pub url: String,
    /// `path?query` for the upstream request line.
    pub path: String,
    /// Where it may go (the routing rules).
    pub directness: Directness,
    /// The HTTP version the client's request came in (the upstream request's `Via` says it);
    /// `HTTP/1.1` for requests the node makes itself.
    pub received: Version,
    /// Where the interim (1xx) responses to the upstream request go: an HTTP/1.1 client's
    /// connection; none for an HTTP/1.0 client and for the requests the node makes itself.
    pub interim: Option<InterimRelay>,
}

impl Target {
    /// Works out the upstream target from the request URI; an origin-form request goes to
    /// `accelerate` (accelerator mode), or is refused. The error is the status, the token and
    /// the reason of the refusal.
    pub(crate) fn of(
        uri: &Uri,
        accelerate: Option<&str>,
    ) -> Result<Target, (StatusCode, &'static str, String)> {
        let (host, port) = match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(auth)) => (
                auth.host().to_ascii_lowercase(),
                auth.port_u16().unwrap_or(80),
            ),
            (Some(scheme), Some(_)) => {
                return Err((
                    StatusCode::NOT_IMPLEMENTED,
                    "unsupported-scheme",
                    format!("{scheme}:// is not proxied; https goes through CONNECT"),
                ))
            }
            _ => {
                let Some(origin) = accelerate else {
                    return Err((
                    StatusCode::BAD_REQUEST,
                    "origin-form",
                    "this is a proxy: send the absolute URL (GET http://host/path), or configure http.accelerate"
                        .into(),
                ));
                };
                let auth: http::uri::Authority = origin.parse().map_err(|_| {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "config",
                        "bad accelerate origin".into(),
                    )
                })?;
                (
                    auth.host().to_ascii_lowercase(),
                    auth.port_u16().unwrap_or(80),
                )
            }
        };
        if host.is_empty() {
            return Err((
                StatusCode::BAD_REQUEST,
                "invalid-url",
                "the URL has no host".into(),
            ));
        }
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        // Built by hand rather than with `format!`: this runs for every request.
        let mut url = String::with_capacity("http://:65535".len() + host.len() + path.len());
        url.push_str("http://");
        url.push_str(&host);
        if port != 80 {
            url.push(':');
            url.push_str(itoa::Buffer::new().format(port));
        }
        url.push_str(&path);
        Ok(Target {
            host,
            port,
            url,
            path,
            directness: Directness::Either,
            received: Version::HTTP_11,
            interim: None,
        })
    }
}

/// Resolves a `Location`-style URI reference against the target URL (RFC 3986 §5.2: absolute,
/// network-path, absolute-path, relative-path and query-only references, dot segments removed,
/// the fragment dropped) into a cache key. `None` unless the result is on the target's origin
/// (scheme, host and port): RFC 9111 §4.4 forbids invalidating another origin's URLs.
pub(crate) fn same_origin_url(target: &Target, reference: &str) -> Option<String> {
    let reference = reference.split('#').next().unwrap_or("");
    let origin = &target.url[..target.url.len() - target.path.len()];
    let (base_path, _) = target.path.split_once('?').unwrap_or((&target.path, ""));
    let has_scheme = reference.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    let (path, query) = if has_scheme || reference.starts_with("//") {
        let absolute = if has_scheme {
            reference.to_owned()
        } else {
            format!("http:{reference}")
        };
        let uri: Uri = absolute.parse().ok()?;
        let auth = uri.authority()?;
        let same = uri.scheme_str() == Some("http")
            && auth.host().eq_ignore_ascii_case(&target.host)
            && auth.port_u16().unwrap_or(80) == target.port;
        if !same {
            return None;
        }
        (uri.path().to_owned(), uri.query().map(str::to_owned))
    } else {
        let (path, query) = match reference.split_once('?') {
            Some((p, q)) => (p, Some(q.to_owned())),
            None => (reference, None),
        };
        if path.starts_with('/') {
            (path.to_owned(), query)
        } else if path.is_empty() {
            let query = query.or_else(|| target.path.split_once('?').map(|(_, q)| q.to_owned()));
            (base_path.to_owned(), query)
        } else {
            let dir = &base_path[..=base_path.rfind('/').unwrap_or(0)];
            (format!("{dir}{path}"), query)
        }
    };
    let path = remove_dot_segments(if path.is_empty() { "/" } else { &path });
    Some(match query {
        Some(q) => format!("{origin}{path}?{q}"),
        None => format!("{origin}{path}"),
    })
}

/// RFC 3986 §5.2.4 on an absolute path: `.` and `..` segments resolved.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let last = segments.len() - 1;
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.into_iter().enumerate() {
        match segment {
            "." | ".." => {
                if segment == ".." {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// Builds the request sent upstream: origin-form, hop-by-hop headers removed, `Via` added.
pub(crate) fn upstream_request(
    shared: &Shared,
    method: Method,
    headers: &HeaderMap,
    target: &Target,
    body: UpBody,
) -> Request<UpBody> {
    let mut out = Request::new(body);
    *out.method_mut() = method;
    *out.uri_mut() = target
        .path
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"));
    *out.version_mut() = Version::HTTP_11;
    let h = out.headers_mut();
    h.reserve(headers.len() + 2);
    for (n, v) in headers {
        h.append(n.clone(), v.clone());
    }
    headers::strip_hop_by_hop(h);
    h.remove(header::EXPECT);
    let host = if target.port == 80 {
        target.host.clone()
    } else {
        format!("{}:{}", target.host, target.port)
    };
    if let Ok(v) = HeaderValue::from_str(&host) {
        h.insert(header::HOST, v);
    }
    add_via_received(shared, h, target.received);
    if let Some(relay) = &target.interim {
        relay.arm();
        let (relay, via) = (relay.clone(), shared.via.clone());
        hyper::ext::on_informational(&mut out, move |head| {
            relay.relay(head.status(), head.headers(), via.received(head.version()));
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(url: &str, path: &str) -> Target {
        let uri: Uri = url.parse().expect("uri");
        let host = uri.host().expect("host").to_owned();
        Target {
            host,
            port: uri.port_u16().unwrap_or(80),
            url: url.into(),
            path: path.into(),
            directness: Directness::Either,
            received: Version::HTTP_11,
            interim: None,
        }
    }

    #[test]
    fn location_resolution() {
        let target = t("http://a.test:8080/x/y?q=1", "/x/y?q=1");
        let resolve = |r: &str| same_origin_url(&target, r);
        for (reference, want) in [
            ("/z", "http://a.test:8080/z"),
            ("/z?k=v#frag", "http://a.test:8080/z?k=v"),
            ("http://A.test:8080/q?1", "http://a.test:8080/q?1"),
            ("HTTP://a.test:8080/q", "http://a.test:8080/q"),
            ("//a.test:8080/n", "http://a.test:8080/n"),
            ("z", "http://a.test:8080/x/z"),
            ("./z/", "http://a.test:8080/x/z/"),
            ("../z", "http://a.test:8080/z"),
            ("../../../z", "http://a.test:8080/z"),
            ("/p/./q/../r", "http://a.test:8080/p/r"),
            ("..", "http://a.test:8080/"),
            ("?k=v", "http://a.test:8080/x/y?k=v"),
            ("", "http://a.test:8080/x/y?q=1"),
            ("#top", "http://a.test:8080/x/y?q=1"),
        ] {
            assert_eq!(resolve(reference).as_deref(), Some(want), "{reference:?}");
        }
        for other_origin in [
            "http://b.test:8080/q",
            "http://a.test/q",
            "http://a.test:8081/q",
            "https://a.test:8080/q",
            "//b.test/q",
            "//a.test/q",
            "ftp://a.test:8080/q",
            "mailto:x@a.test",
        ] {
            assert_eq!(resolve(other_origin), None, "{other_origin:?}");
        }
        let on_80 = t("http://a.test/d/", "/d/");
        assert_eq!(
            same_origin_url(&on_80, "http://a.test:80/e").as_deref(),
            Some("http://a.test/e")
        );
        assert_eq!(
            same_origin_url(&on_80, "e").as_deref(),
            Some("http://a.test/d/e")
        );
    }
}
