//! A POST response that may answer later GETs of its URL.
//!
//! RFC 9110 §9.3.3: "Responses to POST requests are only cacheable when they include explicit
//! freshness information … and a Content-Location header field that has the same value as the
//! POST's target URI". Such a response says: this content is the current representation of the
//! resource the POST changed (RFC 9110 §8.7), for this long. A later GET of that URL may be
//! answered with it (RFC 9111 §4 lets a cache reuse a stored response to a GET only for a GET,
//! so it is stored as the GET response of the URL).
//!
//! Only what is particular to POST is checked here; whether the response may be stored at all
//! (`no-store`, `private`, `Vary: *`, the request's `no-store`, the store's limits) is decided
//! as for any GET response, on the request view this returns.

use http::header::{self, HeaderMap};
use http::{request, Method, StatusCode};

use crate::directives::ResponseCacheControl;
use crate::target::{same_origin_url, Target};

/// The request as a GET, when `req` is a POST whose response (`status`, `headers`) may be
/// stored as the GET response for the target URL; `None` otherwise.
pub(crate) fn as_get(
    req: &request::Parts,
    target: &Target,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<request::Parts> {
    if req.method != Method::POST || !represents_target(status) || !explicitly_fresh(headers) {
        return None;
    }
    let mut locations = headers.get_all(header::CONTENT_LOCATION).iter();
    let location = locations.next()?.to_str().ok()?;
    if locations.next().is_some() || same_origin_url(target, location)? != target.url {
        return None;
    }
    let mut get = req.clone();
    get.method = Method::GET;
    Some(get)
}

/// A success that carries content: only then is Content-Location the identifier of the
/// representation enclosed (RFC 9110 §8.7). 204 has no content, and 206 only a part of it,
/// which the store does not keep.
fn represents_target(status: StatusCode) -> bool {
    status.is_success() && !matches!(status.as_u16(), 204 | 206)
}

/// The response states its own lifetime (`s-maxage`, `max-age` or `Expires`, RFC 9111
/// §4.2.1): a heuristic lifetime is not enough for a POST response (RFC 9110 §9.3.3).
fn explicitly_fresh(headers: &HeaderMap) -> bool {
    let cc = ResponseCacheControl::parse(headers);
    headers.contains_key(header::EXPIRES) || cc.max_age.is_some() || cc.s_maxage.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::Directness;
    use http::{HeaderValue, Request};

    fn target() -> Target {
        Target {
            host: "a.test".into(),
            port: 80,
            url: "http://a.test/form?x=1".into(),
            path: "/form?x=1".into(),
            directness: Directness::Either,
            received: http::Version::HTTP_11,
            interim: None,
        }
    }

    fn post() -> request::Parts {
        let (mut parts, ()) = Request::post("http://a.test/form?x=1")
            .header("content-type", "text/plain")
            .body(())
            .expect("request")
            .into_parts();
        parts.method = Method::POST;
        parts
    }

    fn answer(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn reused_with_its_own_content_location_and_explicit_freshness() {
        for fields in [
            &[
                ("content-location", "/form?x=1"),
                ("cache-control", "max-age=60"),
            ][..],
            &[
                ("content-location", "form?x=1"),
                ("cache-control", "public, S-MaxAge=9"),
            ],
            &[
                ("content-location", "http://A.test:80/form?x=1"),
                ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            ],
        ] {
            let get = as_get(&post(), &target(), StatusCode::OK, &answer(fields));
            let get = get.unwrap_or_else(|| panic!("{fields:?}"));
            assert_eq!(get.method, Method::GET);
            assert_eq!(
                get.headers.get("content-type").map(|v| v.as_bytes()),
                Some(&b"text/plain"[..])
            );
        }
    }

    #[test]
    fn not_reused_otherwise() {
        let ok = [
            ("content-location", "/form?x=1"),
            ("cache-control", "max-age=60"),
        ];
        for fields in [
            &[
                ("content-location", "/form"),
                ("cache-control", "max-age=60"),
            ][..],
            &[
                ("content-location", "/form?x=2"),
                ("cache-control", "max-age=60"),
            ],
            &[
                ("content-location", "http://b.test/form?x=1"),
                ("cache-control", "max-age=60"),
            ],
            &[
                ("content-location", "/form?x=1"),
                ("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ],
            &[
                ("content-location", "/form?x=1"),
                ("cache-control", "no-cache, max-stale=5"),
            ],
            &[("cache-control", "max-age=60")],
            &[
                ("content-location", "/form?x=1"),
                ("content-location", "/form?x=1"),
                ("cache-control", "max-age=60"),
            ],
        ] {
            assert!(
                as_get(&post(), &target(), StatusCode::OK, &answer(fields)).is_none(),
                "{fields:?}"
            );
        }
        for status in [204, 206, 302, 404, 500] {
            let status = StatusCode::from_u16(status).expect("status");
            assert!(
                as_get(&post(), &target(), status, &answer(&ok)).is_none(),
                "{status}"
            );
        }
        let mut put = post();
        put.method = Method::PUT;
        assert!(as_get(&put, &target(), StatusCode::OK, &answer(&ok)).is_none());
    }
}
