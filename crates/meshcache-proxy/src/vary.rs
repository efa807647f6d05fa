//! `Vary` (RFC 9111 §4.1): which request fields select a stored response, and the bytes a
//! request's values of those fields make, so that requests a response would answer alike find
//! the same variant.
//!
//! `Vary` is a list across all its field lines; `*` anywhere in it (`Foo, *`, `*, *`, `, *`, or
//! `*` on a second line) means no later request can be matched, so such a response is never
//! reused. The selecting values are normalised as RFC 9111 §4.1 allows: whitespace around list
//! commas folded and, for the preference lists `Accept-Language` and `Accept-Encoding`, case,
//! member order among equal preferences, and the spelling of quality values
//! (`en-US, fr;q=0.5` selects what `fr;q=0.50, en-us` does).
//!
//! Everything here is pure.

use http::header::{self, HeaderMap, HeaderName};

/// The field names a response's `Vary` lists, lower-cased and sorted; `None` when it cannot
/// be matched by any request (`*` among its members, or a field line that is not text).
pub fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for line in headers.get_all(header::VARY) {
        for item in line.to_str().ok()?.split(',') {
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
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Some(names)
}

/// The bytes that select a Vary variant: each named header's values, normalised, separated so
/// that no two requests collide.
pub fn vary_selector(names: &[HeaderName], request: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::new();
    for name in names {
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        if *name == header::ACCEPT_LANGUAGE || *name == header::ACCEPT_ENCODING {
            preferences(request, name, &mut out);
        } else {
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
        }
        out.push(0);
    }
    out
}

/// A preference list (`token;q=0.8, token`) normalised: tokens lower-cased, quality values in
/// thousandths, ordered by preference then token. A value that is not text is kept as bytes.
fn preferences(request: &HeaderMap, name: &HeaderName, out: &mut Vec<u8>) {
    let mut members: Vec<(u16, String)> = Vec::new();
    for value in request.get_all(name) {
        let Ok(text) = value.to_str() else {
            out.extend_from_slice(value.as_bytes());
            out.push(b',');
            continue;
        };
        for member in text.split(',') {
            let mut parts = member.split(';');
            let token = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            if token.is_empty() {
                continue;
            }
            let mut q = 1000;
            for param in parts {
                if let Some((k, v)) = param.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = quality(v.trim()).unwrap_or(q);
                    }
                }
            }
            members.push((q, token));
        }
    }
    members.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    members.dedup();
    for (i, (q, token)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(token.as_bytes());
        if *q != 1000 {
            out.extend_from_slice(format!(";q={q}").as_bytes());
        }
    }
}

/// A quality value (RFC 9110 §12.4.2: `0[.ddd]` or `1[.000]`) in thousandths.
fn quality(v: &str) -> Option<u16> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{frac:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::map;

    #[test]
    fn a_star_anywhere_in_the_list_is_never_matched() {
        for lines in [
            &[("vary", "*")][..],
            &[("vary", "Foo, *")],
            &[("vary", "*, Foo")],
            &[("vary", "*, *")],
            &[("vary", ", *")],
            &[("vary", "Foo"), ("vary", "*")],
        ] {
            assert_eq!(vary_names(&map(lines)), None, "{lines:?}");
        }
        let names = vary_names(&map(&[("vary", "Foo, , bar"), ("vary", "FOO")])).expect("names");
        assert_eq!(names, ["bar", "foo"]);
    }

    #[test]
    fn whitespace_is_folded() {
        let names = vary_names(&map(&[("vary", "Accept-Encoding, x-thing")])).expect("names");
        let a = vary_selector(&names, &map(&[("x-thing", "a,  b")]));
        let b = vary_selector(&names, &map(&[("x-thing", "a, b")]));
        let c = vary_selector(&names, &map(&[("x-thing", "b")]));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn preference_lists_are_normalised() {
        let names = vary_names(&map(&[("vary", "Accept-Language")])).expect("names");
        let sel = |v: &str| vary_selector(&names, &map(&[("accept-language", v)]));
        assert_eq!(sel("en-US, fr;q=0.5"), sel("fr;q=0.50, en-us"));
        assert_eq!(sel("en-US, fr;q=0.5"), sel("en-us;q=1.0,FR;Q=0.5"));
        assert_eq!(sel("de, en"), sel("en, de"));
        assert_ne!(sel("en, fr;q=0.5"), sel("fr, en;q=0.5"));
        assert_ne!(sel("en"), sel("fr"));
        assert_eq!(quality("0.8"), Some(800));
        assert_eq!(quality("1"), Some(1000));
        assert_eq!(quality("1.5"), None);
        assert_eq!(quality("0.1234"), None);
    }
}
