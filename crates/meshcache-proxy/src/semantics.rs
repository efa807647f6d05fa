//! HTTP caching rules (RFC 9111), kept pure: every function takes `now`.
//!
//! Whether a response is stored, and its freshness, is decided once on arrival
//! (`crate::storable`); a stored object keeps only the numbers that yields in a compact
//! [`Freshness`] record, so that it costs a few bytes of metadata rather than a second copy of
//! both header maps. What happens on a later request — request directives, serving stale,
//! revalidation and 304 merging — is decided here.

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{request, response, StatusCode};

use crate::directives::{RequestDirectives, ResponseDirectives};
use crate::storable::{self, Policy};

/// Freshness facts of a stored response, fixed when it was received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freshness {
    /// When the response (or its last validation) arrived, in seconds since the epoch.
    pub response_time: u64,
    /// Its age when it arrived (RFC 9111 §4.2.3), seconds.
    pub initial_age: u32,
    /// Its freshness lifetime (RFC 9111 §4.2.1), seconds.
    pub lifetime: u32,
    /// Directives that govern serving it stale.
    pub directives: ResponseDirectives,
}

/// What the cache may do with a stored response for a given request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usability {
    /// Serve it as is.
    Fresh,
    /// Stale, but the client allows it (`max-stale`).
    StaleAllowed,
    /// Stale within `stale-while-revalidate`: serve it and refresh in the background.
    StaleWhileRevalidate,
    /// Validate with the origin before use.
    MustValidate,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A refresh pattern's numbers (Squid's `refresh_pattern regex min percent max [options]`),
/// for the responses of the URLs it matches. Times in seconds.
///
/// Squid decides freshness at each request from the response's age; every one of its tests is
/// "fresh while the age is below some bound", so the bound is worked out once, when the response
/// arrives, as its freshness lifetime ([`Refresh::lifetime`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Fresh at least this long without explicit freshness or `Last-Modified`.
    pub min: u64,
    /// Share (%) of the age since `Last-Modified` that a response stays fresh.
    pub percent: u32,
    /// Fresh at most this long without explicit freshness.
    pub max: u64,
    /// `min` holds even against explicit freshness.
    pub override_expire: bool,
    /// `min` holds even when `Last-Modified` gives less.
    pub override_lastmod: bool,
    /// A client's reload is answered from the store.
    pub ignore_reload: bool,
}

impl Refresh {
    /// The freshness lifetime of a response under this pattern, as Squid's `refreshCheck`:
    ///
    /// - with explicit freshness (`explicit`: `s-maxage`, `max-age`, or `Expires` − `Date`),
    ///   that, raised to `min` with `override_expire` (`max` does not cut it);
    /// - else, with `Last-Modified` before `Date` (`modified_age`: the difference), `percent` of
    ///   it, raised to `min` with `override_lastmod`, at most `max`;
    /// - else `min`, at most `max`.
    ///
    /// `revalidate`: the response says `must-revalidate`, `proxy-revalidate` or `s-maxage`,
    /// which Squid lets no override lengthen.
    pub fn lifetime(
        &self,
        explicit: Option<u64>,
        modified_age: Option<u64>,
        revalidate: bool,
    ) -> u64 {
        if let Some(explicit) = explicit {
            return if self.override_expire && !revalidate {
                explicit.max(self.min)
            } else {
                explicit
            };
        }
        let heuristic = match modified_age {
            Some(age) => {
                let share = age.saturating_mul(u64::from(self.percent)) / 100;
                if self.override_lastmod && !revalidate {
                    share.max(self.min)
                } else {
                    share
                }
            }
            None => self.min,
        };
        heuristic.min(self.max)
    }
}

impl Freshness {
    /// Decides whether a response to `req` may be stored, and if so its freshness, with the
    /// default policy but for `heuristic_fraction` (see `storable::assess`).
    pub fn for_exchange(
        req: &request::Parts,
        status: StatusCode,
        res_headers: &HeaderMap,
        response_time: SystemTime,
        heuristic_fraction: f32,
    ) -> Option<Freshness> {
        storable::assess(
            &req.headers,
            &req.method,
            status,
            res_headers,
            response_time,
            &Policy {
                heuristic_fraction,
                ..Policy::default()
            },
        )
    }

    /// Current age in seconds (RFC 9111 §4.2.3: initial age plus resident time).
    pub fn age(&self, now: SystemTime) -> u64 {
        u64::from(self.initial_age) + secs(now).saturating_sub(self.response_time)
    }

    /// Seconds of freshness left; negative once stale.
    pub fn ttl(&self, now: SystemTime) -> i64 {
        i64::from(self.lifetime) - self.age(now) as i64
    }

    /// Applies the request's directives (RFC 9111 §5.2.1) and the response's stale rules.
    pub fn usability(&self, req: &RequestDirectives, now: SystemTime) -> Usability {
        if req.no_cache || self.directives.no_cache {
            return Usability::MustValidate;
        }
        let age = self.age(now);
        let ttl = self.ttl(now);
        // Ages are whole seconds, so `max-age=0` (a reload) always validates.
        if req.max_age.is_some_and(|max| max == 0 || age > max) {
            return Usability::MustValidate;
        }
        if req.min_fresh.is_some_and(|min| ttl < min as i64) {
            return Usability::MustValidate;
        }
        if ttl > 0 {
            return Usability::Fresh;
        }
        if self.directives.must_revalidate {
            return Usability::MustValidate;
        }
        let staleness = (-ttl) as u64;
        match req.max_stale {
            Some(None) => return Usability::StaleAllowed,
            Some(Some(max)) if staleness <= max => return Usability::StaleAllowed,
            _ => {}
        }
        match self.directives.stale_while_revalidate {
            Some(window) if staleness <= u64::from(window) => Usability::StaleWhileRevalidate,
            _ => Usability::MustValidate,
        }
    }

    /// True when a failed refresh may fall back to this stale response (RFC 5861 §4).
    pub fn stale_if_error_allows(&self, now: SystemTime) -> bool {
        let staleness = (-self.ttl(now)).max(0) as u64;
        !self.directives.must_revalidate
            && !self.directives.no_cache
            && self
                .directives
                .stale_if_error
                .is_some_and(|w| staleness <= u64::from(w))
    }
}

/// Adds validators from a stored response to an upstream request (RFC 9111 §4.3.1), unless
/// the client sent its own.
pub fn add_validators(upstream: &mut HeaderMap, stored: &HeaderMap) {
    if upstream.contains_key(header::IF_NONE_MATCH)
        || upstream.contains_key(header::IF_MODIFIED_SINCE)
    {
        return;
    }
    if let Some(etag) = stored.get(header::ETAG) {
        upstream.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(lm) = stored.get(header::LAST_MODIFIED) {
        upstream.insert(header::IF_MODIFIED_SINCE, lm.clone());
    }
}

/// Whether a 304 applies to the stored response (RFC 9111 §4.3.4): a strong ETag must match,
/// else a weak one, else Last-Modified; a 304 without validators updates a response without
/// validators.
pub fn not_modified_matches(stored: &HeaderMap, fresh: &HeaderMap) -> bool {
    let get = |h: &HeaderMap, n: HeaderName| {
        h.get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .map(str::to_owned)
    };
    let (old_etag, new_etag) = (get(stored, header::ETAG), get(fresh, header::ETAG));
    let (old_lm, new_lm) = (
        get(stored, header::LAST_MODIFIED),
        get(fresh, header::LAST_MODIFIED),
    );
    match (&old_etag, &new_etag) {
        (_, Some(new)) => {
            let weak = |e: &str| e.trim_start_matches("W/").to_owned();
            old_etag
                .as_deref()
                .is_some_and(|old| weak(old) == weak(new))
        }
        (Some(_), None) => new_lm.is_some() && old_lm == new_lm,
        (None, None) => match (&old_lm, &new_lm) {
            (Some(o), Some(n)) => o == n,
            (Some(_), None) => true,
            (None, _) => new_lm.is_none(),
        },
    }
}

/// Headers a 304 must not overwrite in the stored response.
fn keeps_stored_value(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length" | "content-encoding" | "content-range" | "transfer-encoding" | "etag"
    ) && name != header::ETAG
        || name == header::CONTENT_LENGTH
}

/// Merges a 304's headers into the stored response's (RFC 9111 §3.2): every field the 304
/// carries replaces the stored one, except the framing fields of the stored body.
pub fn merge_not_modified(stored: &HeaderMap, fresh: &HeaderMap) -> HeaderMap {
    let mut merged = stored.clone();
    let mut replaced: Vec<&HeaderName> = Vec::new();
    for (name, value) in fresh {
        if keeps_stored_value(name) {
            continue;
        }
        if !replaced.contains(&name) {
            merged.remove(name);
            replaced.push(name);
        }
        merged.append(name.clone(), value.clone());
    }
    merged
}

/// Answers a client's own conditional request from a response we hold (RFC 9110 §13.2.2):
/// true when a 304 is the right answer.
pub fn client_not_modified(req: &HeaderMap, stored: &HeaderMap) -> Option<ConditionalHit> {
    if let Some(inm) = req.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let etag = stored.get(header::ETAG).and_then(|v| v.to_str().ok())?;
        let weak = |e: &str| e.trim().trim_start_matches("W/").to_owned();
        let hit = inm.trim() == "*" || inm.split(',').any(|c| weak(c) == weak(etag));
        return hit.then_some(ConditionalHit::IfNoneMatch);
    }
    let ims = req
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())?;
    let ims = httpdate::parse_http_date(ims).ok()?;
    let lm = stored
        .get(header::LAST_MODIFIED)
        .or_else(|| stored.get(header::DATE))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())?;
    (lm <= ims).then_some(ConditionalHit::IfModifiedSince)
}

/// Which validator made a client's conditional request a 304.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionalHit {
    /// `If-None-Match` matched (Squid logs TCP_INM_HIT).
    IfNoneMatch,
    /// `If-Modified-Since` held (Squid logs TCP_IMS_HIT).
    IfModifiedSince,
}

/// Builds the headers of a 304 sent to a client from a stored response (RFC 9110 §15.4.5).
pub fn not_modified_headers(stored: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ] {
        for v in stored.get_all(&name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// Formats a number as a header value without allocating a String.
pub fn number_value(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

/// The age to advertise with a served response, as a header value.
pub fn response_parts_for_log(parts: &response::Parts) -> Option<&str> {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{date, map as headers, t};

    fn req(pairs: &[(&str, &str)]) -> request::Parts {
        let mut b = http::Request::get("http://example.test/x");
        for (k, v) in pairs {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    fn fresh(res: &[(&str, &str)], at: u64) -> Option<Freshness> {
        Freshness::for_exchange(&req(&[]), StatusCode::OK, &headers(res), t(at), 0.1)
    }

    #[test]
    fn max_age_and_s_maxage() {
        let f = fresh(&[("cache-control", "max-age=60"), ("date", &date(0))], 0).expect("storable");
        assert_eq!(f.lifetime, 60);
        assert_eq!(
            f.usability(&RequestDirectives::default(), t(59)),
            Usability::Fresh
        );
        assert_eq!(
            f.usability(&RequestDirectives::default(), t(61)),
            Usability::MustValidate
        );
        let f = fresh(
            &[
                ("cache-control", "max-age=60, s-maxage=5"),
                ("date", &date(0)),
            ],
            0,
        )
        .expect("storable");
        assert_eq!(f.lifetime, 5);
    }

    #[test]
    fn age_header_counts() {
        let f = fresh(&[("cache-control", "max-age=60"), ("age", "50")], 0).expect("storable");
        assert_eq!(f.age(t(0)), 50);
        assert_eq!(f.ttl(t(5)), 5);
    }

    #[test]
    fn expires_and_heuristic() {
        let f = fresh(&[("date", &date(0)), ("expires", &date(100))], 0).expect("storable");
        assert_eq!(f.lifetime, 100);
        // Last-Modified 1000 s before Date: 10% heuristic = 100 s.
        let f =
            fresh(&[("date", &date(1000)), ("last-modified", &date(0))], 1000).expect("storable");
        assert_eq!(f.lifetime, 100);
    }

    /// Squid's numbers: `refresh_pattern . MIN PERCENT MAX` with minutes as seconds here.
    fn pattern(min: u64, percent: u32, max: u64) -> Refresh {
        Refresh {
            min,
            percent,
            max,
            ..Refresh::default()
        }
    }

    #[test]
    fn refresh_lifetime_as_squid() {
        let p = pattern(60, 20, 3600);
        // No explicit freshness: percent of the age since Last-Modified, at most max.
        assert_eq!(p.lifetime(None, Some(1000), false), 200);
        assert_eq!(p.lifetime(None, Some(100_000), false), 3600);
        // A recent change gives less than min: min does not apply (Squid's lm-factor test
        // comes first)...
        assert_eq!(p.lifetime(None, Some(100), false), 20);
        // ...unless override_lastmod.
        let lastmod = Refresh {
            override_lastmod: true,
            ..p
        };
        assert_eq!(lastmod.lifetime(None, Some(100), false), 60);
        assert_eq!(lastmod.lifetime(None, Some(1000), false), 200);
        assert_eq!(
            lastmod.lifetime(None, Some(100), true),
            20,
            "must-revalidate"
        );
        // Neither: min, within max.
        assert_eq!(p.lifetime(None, None, false), 60);
        assert_eq!(pattern(7200, 20, 3600).lifetime(None, None, false), 3600);
        // Explicit freshness wins over the pattern, shorter or longer...
        assert_eq!(p.lifetime(Some(0), Some(1000), false), 0);
        assert_eq!(p.lifetime(Some(86_400), None, false), 86_400);
        // ...unless override_expire: at least min, and max does not cut it.
        let expire = Refresh {
            override_expire: true,
            ..p
        };
        assert_eq!(expire.lifetime(Some(0), None, false), 60);
        assert_eq!(expire.lifetime(Some(86_400), None, false), 86_400);
        assert_eq!(expire.lifetime(Some(0), None, true), 0, "must-revalidate");
        // Squid's cgi-bin / query pattern: nothing heuristic at all.
        assert_eq!(pattern(0, 0, 0).lifetime(None, Some(1_000_000), false), 0);
        assert_eq!(pattern(0, 0, 0).lifetime(Some(600), None, false), 600);
    }

    #[test]
    fn refresh_patterns_set_the_stored_lifetime() {
        let with = |res: &[(&str, &str)], at: u64, r: Refresh| {
            storable::assess(
                &HeaderMap::new(),
                &http::Method::GET,
                StatusCode::OK,
                &headers(res),
                t(at),
                &Policy {
                    refresh: Some(&r),
                    ..Policy::default()
                },
            )
        };
        let p = pattern(60, 50, 3600);
        // Last-Modified 1000 s before Date: 50 % = 500 s (10 % without the pattern).
        let lm = [("date", date(1000)), ("last-modified", date(0))];
        let lm: Vec<(&str, &str)> = lm.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(with(&lm, 1000, p).expect("stored").lifetime, 500);
        assert_eq!(fresh(&lm, 1000).expect("stored").lifetime, 100);
        // No validator, no explicit freshness: stored for min (never stored without a pattern).
        assert!(fresh(&[("date", &date(0))], 0).is_none());
        let f = with(&[("date", &date(0))], 0, p).expect("stored for min");
        assert_eq!(f.lifetime, 60);
        assert_eq!(
            f.usability(&RequestDirectives::default(), t(59)),
            Usability::Fresh
        );
        assert_eq!(
            f.usability(&RequestDirectives::default(), t(61)),
            Usability::MustValidate
        );
        assert!(with(&[("date", &date(0))], 0, pattern(0, 20, 3600)).is_none());
        // override_expire: max-age=0 is fresh for min.
        let expire = Refresh {
            override_expire: true,
            ..p
        };
        let zero = [("cache-control", "max-age=0"), ("date", &date(0))];
        assert_eq!(with(&zero, 0, expire).expect("stored").lifetime, 60);
        assert!(with(&zero, 0, p).is_none(), "nothing to reuse it with");
        // Never lengthened: no-cache, Pragma: no-cache.
        for res in [
            &[("cache-control", "no-cache"), ("etag", "\"a\"")][..],
            &[("pragma", "no-cache"), ("etag", "\"a\"")],
            &[
                ("cache-control", "max-age=0, must-revalidate"),
                ("etag", "\"a\""),
            ],
        ] {
            let f = with(res, 0, expire).expect("stored");
            assert_eq!(f.ttl(t(0)), 0, "{res:?}");
        }
        // Not storable stays not storable.
        assert!(with(&[("cache-control", "no-store")], 0, expire).is_none());
        assert!(with(&[("cache-control", "private")], 0, expire).is_none());
    }

    #[test]
    fn never_stored() {
        assert!(fresh(&[("cache-control", "no-store, max-age=60")], 0).is_none());
        assert!(fresh(&[("cache-control", "private, max-age=60")], 0).is_none());
        // Nothing to go on: no lifetime and no validator.
        assert!(fresh(&[], 0).is_none());
        // Authorization needs public / s-maxage / must-revalidate.
        let auth = req(&[("authorization", "Basic eA==")]);
        let h = headers(&[("cache-control", "max-age=60")]);
        assert!(Freshness::for_exchange(&auth, StatusCode::OK, &h, t(0), 0.1).is_none());
        let h = headers(&[("cache-control", "max-age=60, public")]);
        assert!(Freshness::for_exchange(&auth, StatusCode::OK, &h, t(0), 0.1).is_some());
    }

    #[test]
    fn no_cache_response_is_stored_but_always_validated() {
        let f = fresh(&[("cache-control", "no-cache"), ("etag", "\"a\"")], 0).expect("storable");
        assert_eq!(
            f.usability(&RequestDirectives::default(), t(0)),
            Usability::MustValidate
        );
    }

    #[test]
    fn request_directives_apply() {
        let f =
            fresh(&[("cache-control", "max-age=100"), ("date", &date(0))], 0).expect("storable");
        let d = |max_age, min_fresh, max_stale| RequestDirectives {
            max_age,
            min_fresh,
            max_stale,
            ..Default::default()
        };
        assert_eq!(
            f.usability(&d(Some(10), None, None), t(20)),
            Usability::MustValidate
        );
        assert_eq!(
            f.usability(&d(Some(30), None, None), t(20)),
            Usability::Fresh
        );
        assert_eq!(
            f.usability(&d(None, Some(90), None), t(20)),
            Usability::MustValidate
        );
        assert_eq!(
            f.usability(&d(None, None, Some(Some(10))), t(105)),
            Usability::StaleAllowed
        );
        assert_eq!(
            f.usability(&d(None, None, Some(Some(10))), t(120)),
            Usability::MustValidate
        );
        assert_eq!(
            f.usability(&d(None, None, Some(None)), t(9999)),
            Usability::StaleAllowed
        );
        let nc = RequestDirectives {
            no_cache: true,
            ..Default::default()
        };
        assert_eq!(f.usability(&nc, t(0)), Usability::MustValidate);
    }

    #[test]
    fn must_revalidate_forbids_stale() {
        let f = fresh(
            &[
                ("cache-control", "max-age=1, must-revalidate"),
                ("date", &date(0)),
            ],
            0,
        )
        .expect("storable");
        let any = RequestDirectives {
            max_stale: Some(None),
            ..Default::default()
        };
        assert_eq!(f.usability(&any, t(5)), Usability::MustValidate);
    }

    #[test]
    fn stale_while_revalidate_and_if_error() {
        let f = fresh(
            &[
                (
                    "cache-control",
                    "max-age=10, stale-while-revalidate=20, stale-if-error=100",
                ),
                ("date", &date(0)),
            ],
            0,
        )
        .expect("storable");
        let none = RequestDirectives::default();
        assert_eq!(f.usability(&none, t(25)), Usability::StaleWhileRevalidate);
        assert_eq!(f.usability(&none, t(40)), Usability::MustValidate);
        assert!(f.stale_if_error_allows(t(100)));
        assert!(!f.stale_if_error_allows(t(200)));
    }

    #[test]
    fn validators_are_added_unless_client_sent_its_own() {
        let stored = headers(&[("etag", "\"v1\""), ("last-modified", &date(0))]);
        let mut up = HeaderMap::new();
        add_validators(&mut up, &stored);
        assert_eq!(up.get("if-none-match").expect("inm"), "\"v1\"");
        assert!(up.contains_key("if-modified-since"));
        let mut up = headers(&[("if-none-match", "\"client\"")]);
        add_validators(&mut up, &stored);
        assert_eq!(up.get("if-none-match").expect("inm"), "\"client\"");
    }

    #[test]
    fn not_modified_matching() {
        let stored = headers(&[("etag", "\"v1\"")]);
        assert!(not_modified_matches(
            &stored,
            &headers(&[("etag", "\"v1\"")])
        ));
        assert!(not_modified_matches(
            &stored,
            &headers(&[("etag", "W/\"v1\"")])
        ));
        assert!(!not_modified_matches(
            &stored,
            &headers(&[("etag", "\"v2\"")])
        ));
        let lm = headers(&[("last-modified", &date(0))]);
        assert!(not_modified_matches(
            &lm,
            &headers(&[("last-modified", &date(0))])
        ));
        assert!(!not_modified_matches(
            &lm,
            &headers(&[("last-modified", &date(5))])
        ));
        assert!(not_modified_matches(&HeaderMap::new(), &HeaderMap::new()));
    }

    #[test]
    fn merge_replaces_all_but_framing() {
        let stored = headers(&[
            ("content-length", "5"),
            ("cache-control", "max-age=1"),
            ("x-old", "a"),
            ("x-multi", "1"),
            ("x-multi", "2"),
        ]);
        let fresh = headers(&[
            ("content-length", "0"),
            ("cache-control", "max-age=99"),
            ("x-multi", "3"),
            ("x-new", "n"),
        ]);
        let merged = merge_not_modified(&stored, &fresh);
        assert_eq!(merged.get("content-length").expect("cl"), "5");
        assert_eq!(merged.get("cache-control").expect("cc"), "max-age=99");
        assert_eq!(merged.get_all("x-multi").iter().count(), 1);
        assert_eq!(merged.get("x-old").expect("kept"), "a");
        assert_eq!(merged.get("x-new").expect("added"), "n");
    }

    #[test]
    fn client_conditionals() {
        let stored = headers(&[("etag", "\"v1\""), ("last-modified", &date(0))]);
        assert_eq!(
            client_not_modified(&headers(&[("if-none-match", "\"x\", \"v1\"")]), &stored),
            Some(ConditionalHit::IfNoneMatch)
        );
        assert_eq!(
            client_not_modified(&headers(&[("if-none-match", "\"x\"")]), &stored),
            None
        );
        assert_eq!(
            client_not_modified(&headers(&[("if-modified-since", &date(10))]), &stored),
            Some(ConditionalHit::IfModifiedSince)
        );
        assert_eq!(
            client_not_modified(
                &headers(&[("if-modified-since", &date(0))]),
                &headers(&[("last-modified", &date(5))])
            ),
            None
        );
    }
}
