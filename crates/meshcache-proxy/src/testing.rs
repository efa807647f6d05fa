//! Helpers for the crate's unit tests: header maps and fixed clocks.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// A header map of `(name, value)` pairs, in order, repeated names appended.
pub(crate) fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    h
}

/// A fixed instant `s` seconds after a fixed origin.
pub(crate) fn t(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
}

/// [`t`] as an HTTP date.
pub(crate) fn date(s: u64) -> String {
    httpdate::fmt_http_date(t(s))
}
