//! Whether a response may be stored (RFC 9111 §3), for how long it is fresh (§4.2.1, §4.2.2)
//! and how old it was on arrival (§4.2.3): decided once, when it arrives, into the few numbers
//! a stored object keeps ([`Freshness`]).
//!
//! The rules, for a shared cache:
//! - a final status other than 206 and 304 (this store keeps neither); with `must-understand`,
//!   only a status this cache understands, and then `no-store` is overruled;
//! - no `no-store`, no `private`, no `Vary` member `*`; a request with `Authorization` only
//!   with `public`, `s-maxage` or `must-revalidate`;
//! - something that allows storing: `public`, `max-age`, `s-maxage`, `Expires`, or a status
//!   that is heuristically cacheable (RFC 9110 §15.1);
//! - freshness from `s-maxage`, else `max-age`, else `Expires` − `Date`; an invalid argument or
//!   an `Expires` that is not a date (say, `0`, or extra spaces) makes the response stale, never
//!   "without expiry"; without any, a heuristic from `Last-Modified` for heuristically cacheable
//!   statuses (and `public` ones), or the refresh pattern's numbers;
//! - the age on arrival is the larger of `Age` and the apparent age (arrival − `Date`); an
//!   `Age` that is not a non-negative integer (a list such as `old, 0`, text) makes the response
//!   stale;
//! - `no-cache` (also the response's `Pragma: no-cache` without `Cache-Control`) is stored and
//!   validated at every use.
//!
//! A response that would be stale on arrival and has no validator is not stored: it could
//! never be used. `Set-Cookie` is no bar: the field is stored and served with the response, as
//! §3.1 allows (an origin that means it for one client says `private`).
//!
//! With targeted fields (RFC 9213) configured, the first of them that a response carries with
//! a valid value replaces `Cache-Control`, `Expires` and `Pragma` for this cache's decisions.
//!
//! Everything here is pure.

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

use crate::directives::ResponseCacheControl;
use crate::semantics::{Freshness, Refresh};
use crate::vary::vary_names;

/// What the operator adds to the response's own word.
#[derive(Clone, Copy, Debug)]
pub struct Policy<'a> {
    /// Share of (`Date` − `Last-Modified`) taken as the heuristic lifetime.
    pub heuristic_fraction: f32,
    /// The refresh pattern that matches the URL, if any: its numbers replace the heuristic and
    /// its options may lengthen explicit freshness.
    pub refresh: Option<&'a Refresh>,
    /// Targeted cache-control fields (RFC 9213), in precedence order.
    pub targeted: &'a [HeaderName],
}

impl Default for Policy<'_> {
    fn default() -> Self {
        Policy {
            heuristic_fraction: 0.1,
            refresh: None,
            targeted: &[],
        }
    }
}

/// The statuses RFC 9110 §15.1 makes heuristically cacheable.
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The statuses whose caching semantics this cache implements, for `must-understand`.
pub fn understood(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 302 | 303 | 307 | 308 | 404 | 405 | 410 | 414 | 451 | 501
    )
}

/// The response's freshness if this cache may store it as the answer to a GET with
/// `request` headers, received at `now`; `None` if not (see the module's rules).
pub fn assess(
    request: &HeaderMap,
    method: &Method,
    status: StatusCode,
    response: &HeaderMap,
    now: SystemTime,
    policy: &Policy<'_>,
) -> Option<Freshness> {
    if *method != Method::GET || status.is_informational() {
        return None;
    }
    if matches!(
        status,
        StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
    ) {
        return None;
    }
    let targeted = policy
        .targeted
        .iter()
        .find_map(|name| ResponseCacheControl::targeted(response, name));
    let cc = targeted.unwrap_or_else(|| ResponseCacheControl::parse(response));
    if cc.must_understand {
        if !understood(status) {
            return None;
        }
    } else if cc.no_store {
        return None;
    }
    if cc.private || vary_names(response).is_none() {
        return None;
    }
    if request.contains_key(header::AUTHORIZATION)
        && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate)
    {
        return None;
    }
    // Targeted fields stand for Expires and Pragma too (RFC 9213 §2.2).
    let own_fields = targeted.is_none();
    let expires = own_fields.then(|| response.get(header::EXPIRES)).flatten();
    let heuristic = heuristically_cacheable(status) || cc.public;
    if !(cc.public
        || cc.max_age.is_some()
        || cc.s_maxage.is_some()
        || expires.is_some()
        || heuristic)
    {
        return None;
    }
    let date = |name: HeaderName| {
        response
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
    };
    let served = date(header::DATE).unwrap_or(now);

    // §4.2.1: the first of s-maxage, max-age, Expires.
    let explicit: Option<u64> = match (cc.s_maxage, cc.max_age, expires) {
        (Some(s), _, _) | (None, Some(s), _) => Some(s.lifetime()),
        (None, None, Some(e)) => Some(
            e.to_str()
                .ok()
                .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
                .map_or(0, |e| secs_between(served, e)),
        ),
        (None, None, None) => None,
    };
    let modified_age = date(header::LAST_MODIFIED)
        .and_then(|lm| served.duration_since(lm).ok())
        .map(|d| d.as_secs())
        .filter(|&s| s > 0);
    let pragma_no_cache = own_fields
        && !response.contains_key(header::CACHE_CONTROL)
        && crate::directives::directives(response, header::PRAGMA).any(|(n, _)| n == "no-cache");
    let always_validate = cc.no_cache || pragma_no_cache || cc.proxy_revalidate;
    let revalidate = cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some();

    let mut lifetime = match (policy.refresh, explicit) {
        (_, _) if always_validate => 0,
        (Some(refresh), explicit) if explicit.is_some() || heuristic => {
            refresh.lifetime(explicit, modified_age, revalidate)
        }
        (_, Some(explicit)) => explicit,
        (_, None) if heuristic => modified_age.map_or(0, |age| {
            (age as f64 * f64::from(policy.heuristic_fraction)) as u64
        }),
        (_, None) => 0,
    };

    // §4.2.3: age on arrival.
    let apparent = now.duration_since(served).map_or(0, |d| d.as_secs());
    let age = match age_value(response) {
        AgeValue::Absent => apparent,
        AgeValue::Valid(age) => age.max(apparent),
        AgeValue::Invalid => {
            lifetime = 0;
            apparent
        }
    };
    let has_validator =
        response.contains_key(header::ETAG) || response.contains_key(header::LAST_MODIFIED);
    if lifetime <= age && !has_validator {
        return None;
    }
    let mut directives = cc.stored();
    directives.no_cache |= always_validate;
    Some(Freshness {
        response_time: secs(now),
        initial_age: clamp32(age),
        lifetime: clamp32(lifetime),
        directives,
    })
}

/// An `Age` field as received (RFC 9111 §5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgeValue {
    Absent,
    Valid(u64),
    /// Not a single non-negative integer.
    Invalid,
}

fn age_value(response: &HeaderMap) -> AgeValue {
    let mut lines = response.get_all(header::AGE).iter();
    let Some(first) = lines.next() else {
        return AgeValue::Absent;
    };
    if lines.next().is_some() {
        return AgeValue::Invalid;
    }
    match first.to_str().map(str::trim) {
        Ok(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            AgeValue::Valid(v.parse::<u64>().map_or(1 << 31, |n| n.min(1 << 31)))
        }
        _ => AgeValue::Invalid,
    }
}

/// Seconds from `from` to `to`; 0 when `to` is not later.
fn secs_between(from: SystemTime, to: SystemTime) -> u64 {
    to.duration_since(from).map_or(0, |d| d.as_secs())
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn clamp32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directives::RequestDirectives;
    use crate::semantics::Usability;
    use crate::testing::{date, map, t};
    use http::HeaderValue;

    fn assess_at(status: u16, res: &[(&str, &str)], policy: &Policy<'_>) -> Option<Freshness> {
        let mut res = map(res);
        if !res.contains_key(header::DATE) {
            res.insert(header::DATE, HeaderValue::from_str(&date(0)).expect("date"));
        }
        assess(
            &HeaderMap::new(),
            &Method::GET,
            StatusCode::from_u16(status).expect("status"),
            &res,
            t(0),
            policy,
        )
    }

    fn of(status: u16, res: &[(&str, &str)]) -> Option<Freshness> {
        assess_at(status, res, &Policy::default())
    }

    fn fresh(f: &Freshness) -> bool {
        f.usability(&RequestDirectives::default(), t(1)) == Usability::Fresh
    }

    #[test]
    fn directive_names_are_case_insensitive() {
        assert_eq!(
            of(200, &[("cache-control", "MaX-AgE=60")])
                .expect("stored")
                .lifetime,
            60
        );
        assert!(of(200, &[("cache-control", "max-age=60, NO-STORE")]).is_none());
        assert!(of(200, &[("cache-control", "max-age=60, PRIVATE")]).is_none());
        let f = of(
            200,
            &[("cache-control", "max-age=60, No-CaChE"), ("etag", "\"a\"")],
        )
        .expect("stored");
        assert!(!fresh(&f));
        // max-stale does not let a no-cache response be used without validation.
        let stale_ok = RequestDirectives {
            max_stale: Some(None),
            ..RequestDirectives::default()
        };
        assert_eq!(f.usability(&stale_ok, t(1)), Usability::MustValidate);
    }

    #[test]
    fn vary_star_anywhere_is_not_stored() {
        for v in ["*", "Foo, *", "*, Foo", ", *"] {
            assert!(
                of(200, &[("cache-control", "max-age=60"), ("vary", v)]).is_none(),
                "{v}"
            );
        }
        assert!(of(
            200,
            &[
                ("cache-control", "max-age=60"),
                ("vary", "Foo"),
                ("vary", "*")
            ]
        )
        .is_none());
        assert!(of(200, &[("cache-control", "max-age=60"), ("vary", "Foo")]).is_some());
    }

    #[test]
    fn invalid_expires_is_already_expired() {
        let f = of(
            200,
            &[
                ("expires", "Thu,  01 Jan 2099 00:00:00 GMT"),
                ("etag", "\"a\""),
            ],
        )
        .expect("stored, with a validator");
        assert_eq!(f.lifetime, 0);
        assert!(
            of(200, &[("expires", "0")]).is_none(),
            "stale without a validator"
        );
        // A valid Expires in each of the three date formats.
        for e in [
            "Thu, 01 Jan 2099 00:00:00 GMT",
            "Thursday, 01-Jan-99 00:00:00 GMT",
            "Thu Jan  1 00:00:00 2099",
        ] {
            let f = of(200, &[("expires", e), ("date", &date(0))]);
            assert!(
                f.is_some_and(|f| f.lifetime > 0) || e.contains("-99"),
                "{e}"
            );
        }
    }

    #[test]
    fn invalid_age_is_stale() {
        for a in ["old, 0", "abc", "-5", "1.5", ""] {
            let f = of(
                200,
                &[
                    ("cache-control", "max-age=60"),
                    ("age", a),
                    ("etag", "\"a\""),
                ],
            )
            .expect("stored, with a validator");
            assert!(!fresh(&f), "Age: {a:?}");
        }
        let f = of(200, &[("cache-control", "max-age=60"), ("age", "50")]).expect("stored");
        assert_eq!(f.age(t(0)), 50);
        assert!(fresh(&f));
    }

    #[test]
    fn apparent_age_counts() {
        let f = assess(
            &HeaderMap::new(),
            &Method::GET,
            StatusCode::OK,
            &map(&[("cache-control", "max-age=60"), ("date", &date(0))]),
            t(20),
            &Policy::default(),
        )
        .expect("stored");
        assert_eq!(f.age(t(20)), 20);
    }

    #[test]
    fn any_final_status_with_explicit_freshness_is_stored() {
        for status in [200, 299, 400, 404, 500, 502, 503, 504, 599] {
            assert!(
                of(status, &[("cache-control", "max-age=60")]).is_some(),
                "{status}"
            );
        }
        // Without explicit freshness, only the heuristically cacheable ones.
        let lm = date(0);
        let later = date(1000);
        for (status, stored) in [
            (200, true),
            (404, true),
            (410, true),
            (302, false),
            (500, false),
        ] {
            let f = of(status, &[("last-modified", &lm), ("date", &later)]);
            assert_eq!(f.is_some(), stored, "{status}");
        }
        assert!(of(206, &[("cache-control", "max-age=60")]).is_none());
        assert!(of(304, &[("cache-control", "max-age=60")]).is_none());
    }

    #[test]
    fn must_understand_overrules_no_store_for_understood_statuses() {
        assert!(of(
            200,
            &[("cache-control", "must-understand, no-store, max-age=60")]
        )
        .is_some());
        assert!(of(
            299,
            &[("cache-control", "must-understand, no-store, max-age=60")]
        )
        .is_none());
        assert!(of(299, &[("cache-control", "must-understand, max-age=60")]).is_none());
    }

    #[test]
    fn set_cookie_does_not_prevent_storing() {
        let f = of(
            200,
            &[("cache-control", "max-age=60"), ("set-cookie", "a=b")],
        )
        .expect("stored");
        assert!(fresh(&f));
    }

    #[test]
    fn authorization_needs_public_s_maxage_or_must_revalidate() {
        let with_auth = |cc: &str| {
            assess(
                &map(&[("authorization", "Basic dTpw")]),
                &Method::GET,
                StatusCode::OK,
                &map(&[("cache-control", cc)]),
                t(0),
                &Policy::default(),
            )
        };
        assert!(with_auth("max-age=60").is_none());
        for cc in [
            "max-age=60, public",
            "s-maxage=60",
            "max-age=60, must-revalidate",
        ] {
            assert!(with_auth(cc).is_some(), "{cc}");
        }
    }

    #[test]
    fn targeted_fields_take_precedence() {
        let cdn = [
            HeaderName::from_static("meshcache-cache-control"),
            HeaderName::from_static("cdn-cache-control"),
        ];
        let policy = Policy {
            targeted: &cdn,
            ..Policy::default()
        };
        let f = assess_at(
            200,
            &[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=600"),
            ],
            &policy,
        )
        .expect("stored");
        assert_eq!(f.lifetime, 600);
        assert!(assess_at(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("cdn-cache-control", "no-store")
            ],
            &policy
        )
        .is_none());
        assert!(assess_at(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("cdn-cache-control", "private")
            ],
            &policy
        )
        .is_none());
        let f = assess_at(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("cdn-cache-control", "no-cache"),
                ("etag", "\"a\""),
            ],
            &policy,
        )
        .expect("stored");
        assert!(!fresh(&f));
        let f = assess_at(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("cdn-cache-control", "max-age=0"),
                ("etag", "\"a\""),
            ],
            &policy,
        )
        .expect("stored");
        assert_eq!(f.lifetime, 0);
        // Our own field wins over CDN-Cache-Control; an invalid one is passed over.
        let f = assess_at(
            200,
            &[
                ("meshcache-cache-control", "max-age=30"),
                ("cdn-cache-control", "max-age=600"),
            ],
            &policy,
        )
        .expect("stored");
        assert_eq!(f.lifetime, 30);
        let f = assess_at(
            200,
            &[
                ("meshcache-cache-control", "Max-Age=30"),
                ("cdn-cache-control", "max-age=600"),
            ],
            &policy,
        )
        .expect("stored");
        assert_eq!(f.lifetime, 600);
        // Expires is ignored under a targeted field; without one, Cache-Control decides.
        let f = assess_at(
            200,
            &[("expires", "0"), ("cdn-cache-control", "max-age=600")],
            &policy,
        )
        .expect("stored");
        assert_eq!(f.lifetime, 600);
        assert!(assess_at(
            200,
            &[("cache-control", "no-store"), ("cdn-cache-control", "")],
            &policy
        )
        .is_none());
        // Not configured: the field means nothing.
        assert!(of(
            200,
            &[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=600")
            ]
        )
        .is_none());
    }
}
