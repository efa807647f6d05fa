//! Cache directives: the `Cache-Control` list of requests and responses (RFC 9111 §5.2), and
//! the targeted fields of RFC 9213 (`CDN-Cache-Control` and the like), read into one shape so
//! that one set of rules ([`crate::storable`]) decides for either.
//!
//! `Cache-Control` is a comma-separated list of `name[=argument]`; names are case-insensitive
//! (§5.2), an argument may be a token or a quoted string, and a quoted string may hold commas
//! (`no-cache="Set-Cookie, X-Foo"`), so the list is split outside quotes only. A targeted field
//! is a Structured Fields dictionary (RFC 9651): keys are lower-case by that grammar, arguments
//! typed, and a field that does not parse is ignored whole (RFC 9213 §2.1).
//!
//! Everything here is pure.

use http::header::{self, HeaderMap, HeaderName};

/// Iterates `name[=value]` directives of a comma-separated header (every field line), names
/// lower-cased, values with their quotes taken off. Commas inside quoted strings do not split.
pub(crate) fn directives(
    headers: &HeaderMap,
    name: HeaderName,
) -> impl Iterator<Item = (String, Option<&str>)> + '_ {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(split_list)
        .filter_map(|item| {
            let item = item.trim();
            if item.is_empty() {
                return None;
            }
            let (n, v) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), Some(unquote(v.trim()))),
                None => (item, None),
            };
            Some((n.to_ascii_lowercase(), v))
        })
}

/// The members of one list field line, split at commas outside quoted strings.
fn split_list(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let s = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                ',' if !quoted => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// A quoted string's content (escapes left as they are: no directive we act on needs them).
fn unquote(v: &str) -> &str {
    match v.strip_prefix('"') {
        Some(inner) => inner.strip_suffix('"').unwrap_or(inner),
        None => v,
    }
}

/// A directive's delta-seconds argument (RFC 9111 §1.2.2): digits only; more than a cache can
/// hold counts as 2^31. Anything else is invalid.
fn delta_seconds(v: Option<&str>) -> Option<u64> {
    let v = v?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().map_or(1 << 31, |n| n.min(1 << 31)))
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
    /// Parses `Cache-Control` (all instances) and, absent that, `Pragma` (RFC 9111 §5.4).
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut d = RequestDirectives::default();
        let mut any_cc = false;
        for (name, value) in directives(headers, header::CACHE_CONTROL) {
            any_cc = true;
            match name.as_str() {
                // An invalid max-age asks for nothing older than nothing: validate.
                "max-age" => d.max_age = d.max_age.or(Some(delta_seconds(value).unwrap_or(0))),
                "max-stale" => d.max_stale = Some(delta_seconds(value)),
                "min-fresh" => d.min_fresh = delta_seconds(value),
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

/// A freshness directive's argument as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seconds {
    /// A valid delta-seconds.
    Valid(u64),
    /// Present but not a delta-seconds (`max-age=abc`, `max-age=1.5`, `max-age=-1`): the
    /// response is treated as stale (RFC 9111 §4.2.1 leaves a cache that choice).
    Invalid,
}

impl Seconds {
    fn of(v: Option<&str>) -> Seconds {
        delta_seconds(v).map_or(Seconds::Invalid, Seconds::Valid)
    }

    /// The lifetime it gives: an invalid argument gives none.
    pub fn lifetime(self) -> u64 {
        match self {
            Seconds::Valid(n) => n,
            Seconds::Invalid => 0,
        }
    }
}

/// A response's cache directives (RFC 9111 §5.2.2, RFC 5861), from `Cache-Control` or from a
/// targeted field. Of a directive given twice, the first counts (§4.2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseCacheControl {
    /// `max-age`.
    pub max_age: Option<Seconds>,
    /// `s-maxage`: a shared cache's `max-age`, which also implies `proxy-revalidate`.
    pub s_maxage: Option<Seconds>,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache`, qualified or not (the qualified form is treated as unqualified, as §5.2.2.4
    /// allows: the response is validated at every use).
    pub no_cache: bool,
    /// `private`, qualified or not: a shared cache stores none of it (§5.2.2.7).
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `proxy-revalidate`.
    pub proxy_revalidate: bool,
    /// `must-understand`: store only a status code this cache understands, even over
    /// `no-store` (§5.2.2.3).
    pub must_understand: bool,
    /// `stale-while-revalidate=N`.
    pub stale_while_revalidate: Option<u32>,
    /// `stale-if-error=N`.
    pub stale_if_error: Option<u32>,
}

impl ResponseCacheControl {
    /// Reads the response's `Cache-Control` field lines.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut d = Self::default();
        for (name, value) in directives(headers, header::CACHE_CONTROL) {
            d.set(&name, Argument::Text(value));
        }
        d
    }

    /// Reads a targeted field (RFC 9213) of `name`: `None` when the response has none, or its
    /// value is empty or not a valid dictionary (then the next field, or `Cache-Control`,
    /// decides).
    pub fn targeted(headers: &HeaderMap, name: &HeaderName) -> Option<Self> {
        let mut joined = String::new();
        for line in headers.get_all(name) {
            let line = line.to_str().ok()?;
            if !joined.is_empty() {
                joined.push_str(", ");
            }
            joined.push_str(line);
        }
        if joined.trim().is_empty() {
            return None;
        }
        let dict = sfv::Parser::new(&joined).parse::<sfv::Dictionary>().ok()?;
        let mut d = Self::default();
        for (key, entry) in &dict {
            let arg = match entry {
                sfv::ListEntry::Item(item) => match &item.bare_item {
                    sfv::BareItem::Boolean(true) => Argument::Flag,
                    sfv::BareItem::Boolean(false) => continue,
                    sfv::BareItem::Integer(n) => Argument::Integer(i64::from(*n)),
                    _ => Argument::Other,
                },
                sfv::ListEntry::InnerList(_) => Argument::Other,
            };
            d.set(key.as_str(), arg);
        }
        Some(d)
    }

    fn set(&mut self, name: &str, arg: Argument<'_>) {
        let first = |slot: &mut Option<Seconds>| {
            if slot.is_none() {
                *slot = Some(arg.seconds());
            }
        };
        match name {
            "max-age" => first(&mut self.max_age),
            "s-maxage" => first(&mut self.s_maxage),
            "no-store" => self.no_store = true,
            "no-cache" => self.no_cache = true,
            "private" => self.private = true,
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "must-understand" => self.must_understand = true,
            "stale-while-revalidate" => {
                self.stale_while_revalidate = self.stale_while_revalidate.or(arg.window());
            }
            "stale-if-error" => self.stale_if_error = self.stale_if_error.or(arg.window()),
            _ => {}
        }
    }

    /// What a stored response keeps for its later uses.
    pub fn stored(&self) -> ResponseDirectives {
        ResponseDirectives {
            must_revalidate: self.must_revalidate
                || self.proxy_revalidate
                || self.s_maxage.is_some(),
            no_cache: self.no_cache,
            stale_while_revalidate: self.stale_while_revalidate,
            stale_if_error: self.stale_if_error,
        }
    }
}

/// A directive's argument, from either syntax.
#[derive(Clone, Copy)]
enum Argument<'a> {
    /// `Cache-Control`: the text after `=`, unquoted, if any.
    Text(Option<&'a str>),
    /// A targeted field's boolean true (the key alone).
    Flag,
    /// A targeted field's integer.
    Integer(i64),
    /// A targeted field's argument of another type.
    Other,
}

impl Argument<'_> {
    fn seconds(self) -> Seconds {
        match self {
            Argument::Text(v) => Seconds::of(v),
            Argument::Integer(n) => {
                u64::try_from(n).map_or(Seconds::Invalid, |n| Seconds::Valid(n.min(1 << 31)))
            }
            Argument::Flag | Argument::Other => Seconds::Invalid,
        }
    }

    fn window(self) -> Option<u32> {
        match self.seconds() {
            Seconds::Valid(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Seconds::Invalid => None,
        }
    }
}

/// The directives a stored response keeps for its later uses (RFC 9111 §4.2.4, §5.2.2,
/// RFC 5861).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseDirectives {
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage`: never serve it stale.
    pub must_revalidate: bool,
    /// `no-cache`: never serve it without validating first, whatever the request allows.
    pub no_cache: bool,
    /// `stale-while-revalidate=N`.
    pub stale_while_revalidate: Option<u32>,
    /// `stale-if-error=N`.
    pub stale_if_error: Option<u32>,
}

impl ResponseDirectives {
    /// Parses the response's `Cache-Control`.
    pub fn parse(headers: &HeaderMap) -> Self {
        ResponseCacheControl::parse(headers).stored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::map;

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
        assert!(RequestDirectives::parse(&map(&[("cache-control", "NO-CACHE")])).no_cache);
        let bad = RequestDirectives::parse(&map(&[("cache-control", "max-age=abc")]));
        assert_eq!(bad.max_age, Some(0));
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
    fn response_directives() {
        let d = ResponseDirectives::parse(&map(&[(
            "cache-control",
            "max-age=1, stale-while-revalidate=30, stale-if-error=60, proxy-revalidate",
        )]));
        assert_eq!(d.stale_while_revalidate, Some(30));
        assert_eq!(d.stale_if_error, Some(60));
        assert!(d.must_revalidate);
        assert!(
            ResponseDirectives::parse(&map(&[("cache-control", "s-maxage=5")])).must_revalidate
        );
    }

    #[test]
    fn names_are_case_insensitive_and_the_first_of_two_counts() {
        let d = ResponseCacheControl::parse(&map(&[
            ("cache-control", "MaX-AgE=60, No-CaChE"),
            ("cache-control", "max-age=5, NO-STORE, Private"),
        ]));
        assert_eq!(d.max_age, Some(Seconds::Valid(60)));
        assert!(d.no_cache && d.no_store && d.private);
    }

    #[test]
    fn quoted_commas_do_not_split_and_bad_numbers_are_invalid() {
        let d = ResponseCacheControl::parse(&map(&[(
            "cache-control",
            "no-cache=\"Set-Cookie, X-Foo\", max-age=\"60\", s-maxage=1.5",
        )]));
        assert!(d.no_cache);
        assert_eq!(d.max_age, Some(Seconds::Valid(60)));
        assert_eq!(d.s_maxage, Some(Seconds::Invalid));
        for bad in [
            "max-age=-1",
            "max-age=",
            "max-age",
            "max-age=1e3",
            "max-age=+5",
        ] {
            let d = ResponseCacheControl::parse(&map(&[("cache-control", bad)]));
            assert_eq!(d.max_age, Some(Seconds::Invalid), "{bad}");
        }
        let huge =
            ResponseCacheControl::parse(&map(&[("cache-control", "max-age=99999999999999999999")]));
        assert_eq!(huge.max_age, Some(Seconds::Valid(1 << 31)));
    }

    #[test]
    fn targeted_fields_are_dictionaries() {
        let cdn = HeaderName::from_static("cdn-cache-control");
        let h = map(&[
            ("cdn-cache-control", "max-age=600, stale-if-error=30"),
            ("cdn-cache-control", "must-revalidate"),
        ]);
        let d = ResponseCacheControl::targeted(&h, &cdn).expect("valid");
        assert_eq!(d.max_age, Some(Seconds::Valid(600)));
        assert_eq!(d.stale_if_error, Some(30));
        assert!(d.must_revalidate);
        let d = ResponseCacheControl::targeted(&map(&[("cdn-cache-control", "no-store")]), &cdn)
            .expect("valid");
        assert!(d.no_store);
        // Not a dictionary (upper-case key, a quoted number is a string): ignored whole, or
        // the argument is invalid.
        assert!(
            ResponseCacheControl::targeted(&map(&[("cdn-cache-control", "Max-Age=5")]), &cdn)
                .is_none()
        );
        assert!(ResponseCacheControl::targeted(
            &map(&[("cdn-cache-control", "max-age=5,,")]),
            &cdn
        )
        .is_none());
        assert!(ResponseCacheControl::targeted(&map(&[("cdn-cache-control", "")]), &cdn).is_none());
        let d =
            ResponseCacheControl::targeted(&map(&[("cdn-cache-control", "max-age=\"5\"")]), &cdn)
                .expect("valid");
        assert_eq!(d.max_age, Some(Seconds::Invalid));
        assert!(ResponseCacheControl::targeted(&HeaderMap::new(), &cdn).is_none());
    }
}
