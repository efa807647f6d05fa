//! Squid's helper protocol, the wire side: request lines out, reply lines in. Pure.
//!
//! Squid talks to its helpers over their stdin and stdout, one line per message:
//!
//! * **Request**: `[channel-ID SP] token SP token … LF`. A basic auth helper gets `user password`,
//!   an external ACL group helper (`ext_unix_group_acl`, `ext_ldap_group_acl`) gets `user group`.
//!   Each token is RFC 1738 URL-escaped (`%XX`), as Squid's `rfc1738_escape` does, so spaces and
//!   line ends inside a password cannot break the framing; the helpers unescape them.
//! * **Reply**: `[channel-ID SP] result [SP kv-pairs] LF`, where result is `OK`, `ERR` or `BH`
//!   ("broken helper": it could not decide, ask another one). Older helpers answer a bare `OK`
//!   or `ERR`, or put a free-text reason after the result (`ERR Wrong password`, as Debian's
//!   `basic_ncsa_auth` does); newer ones send `message="…"` and other `key=value` pairs.
//!
//! The channel-ID is there only when the helper is run with `concurrency` above 0: it is then
//! sent up to that many requests at once and answers them in any order, each reply carrying its
//! request's channel-ID. With `concurrency` 0 there is no ID and one request at a time.

use std::fmt::Write as _;

/// A helper's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResultCode {
    /// `OK`: valid credentials, or the user is in the group.
    Ok,
    /// `ERR`: wrong credentials, or not in the group.
    Err,
    /// `BH`: the helper could not decide (backend down, internal error); ask another.
    BrokenHelper,
    /// Anything else: the helper is not speaking this protocol. Treated as `BH`.
    Unknown,
}

/// One parsed reply line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The channel-ID, when the helper runs concurrently.
    pub(crate) channel: Option<u64>,
    /// The verdict.
    pub(crate) result: ResultCode,
    /// What followed the verdict: kv-pairs or an older helper's free-text reason.
    pub(crate) notes: String,
}

impl Reply {
    /// The helper's reason, for logs: the `message=` pair's value, else the free text after the
    /// verdict (`ERR Wrong password`), else nothing.
    pub(crate) fn message(&self) -> Option<&str> {
        let notes = self.notes.trim();
        if let Some(at) = notes.find("message=") {
            let value = &notes[at + "message=".len()..];
            return Some(match value.strip_prefix('"') {
                Some(quoted) => quoted.split('"').next().unwrap_or(quoted),
                None => value.split(' ').next().unwrap_or(value),
            });
        }
        (!notes.is_empty()).then_some(notes)
    }
}

/// Why a reply line cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadReply {
    /// Empty (or only whitespace).
    Empty,
    /// The helper runs concurrently but the line does not start with a channel-ID: the helper
    /// is probably one that knows no concurrency, configured with `concurrency` above 0.
    NoChannel,
}

/// Appends `token` RFC 1738-escaped: control characters, non-ASCII bytes, space and the
/// characters RFC 1738 calls unsafe (`"#%<>[\]^`{|}~'`) become `%XX`; the rest is left as it is,
/// as Squid's `rfc1738_escape` does.
pub(crate) fn escape_into(out: &mut String, token: &str) {
    for &b in token.as_bytes() {
        let unsafe_char = matches!(
            b,
            b' ' | b'"'
                | b'#'
                | b'%'
                | b'<'
                | b'>'
                | b'['
                | b'\\'
                | b']'
                | b'^'
                | b'`'
                | b'{'
                | b'|'
                | b'}'
                | b'~'
                | b'\''
        );
        if !(0x20..0x7f).contains(&b) || unsafe_char {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
}

/// A request line's body (without channel-ID and line end): the tokens escaped and joined by
/// single spaces.
pub(crate) fn request_line(tokens: &[&str]) -> String {
    let mut line = String::with_capacity(tokens.iter().map(|t| t.len() + 1).sum::<usize>());
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        escape_into(&mut line, token);
    }
    line
}

/// Parses one reply line (without its line end; a trailing CR is ignored). `concurrent`: the
/// helper runs with channel-IDs, so the line must start with one.
pub(crate) fn parse_reply(line: &[u8], concurrent: bool) -> Result<Reply, BadReply> {
    let text = String::from_utf8_lossy(line);
    let mut rest = text.trim_matches(|c: char| c == ' ' || c == '\t' || c == '\r');
    if rest.is_empty() {
        return Err(BadReply::Empty);
    }
    let channel = if concurrent {
        let (id, after) = split_token(rest);
        let id = id.parse::<u64>().map_err(|_| BadReply::NoChannel)?;
        rest = after;
        Some(id)
    } else {
        None
    };
    let (code, notes) = split_token(rest);
    let result = match code {
        "OK" => ResultCode::Ok,
        "ERR" => ResultCode::Err,
        "BH" => ResultCode::BrokenHelper,
        _ => ResultCode::Unknown,
    };
    Ok(Reply {
        channel,
        result,
        notes: notes.to_owned(),
    })
}

/// The first space-separated token and what follows it (leading spaces removed).
fn split_token(s: &str) -> (&str, &str) {
    match s.find([' ', '\t']) {
        Some(at) => (&s[..at], s[at..].trim_start_matches([' ', '\t'])),
        None => (s, ""),
    }
}

/// RFC 1738 unescaping, as the helpers do it: `%XX` becomes the byte, anything else stays.
#[cfg(test)]
pub(crate) fn unescape(token: &str) -> Vec<u8> {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(v).unwrap_or(0));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_like_squid() {
        assert_eq!(request_line(&["alice", "s3cret"]), "alice s3cret");
        assert_eq!(
            request_line(&["bob@example.org", "a b%c\nd"]),
            "bob@example.org a%20b%25c%0Ad"
        );
        assert_eq!(request_line(&["ü", "~'\""]), "%C3%BC %7E%27%22");
        // Reserved characters pass unescaped, as with Squid's default flags.
        assert_eq!(request_line(&[";/?:@=&"]), ";/?:@=&");
    }

    #[test]
    fn parses_replies() {
        let reply = |line: &str, concurrent| parse_reply(line.as_bytes(), concurrent);
        assert_eq!(
            reply("OK", false),
            Ok(Reply {
                channel: None,
                result: ResultCode::Ok,
                notes: String::new()
            })
        );
        // basic_ncsa_auth's own words: a trailing space, a free-text reason.
        assert_eq!(reply("OK \r", false).map(|r| r.result), Ok(ResultCode::Ok));
        let err = reply("ERR Wrong password", false).expect("reply");
        assert_eq!(err.result, ResultCode::Err);
        assert_eq!(err.message(), Some("Wrong password"));
        let bh = reply("BH message=\"LDAP server down\" ttl=5", false).expect("reply");
        assert_eq!(bh.result, ResultCode::BrokenHelper);
        assert_eq!(bh.message(), Some("LDAP server down"));
        assert_eq!(
            reply("3 ERR", true).map(|r| (r.channel, r.result)),
            Ok((Some(3), ResultCode::Err))
        );
        // helper-mux (Squid 5) repeats the channel after the verdict: harmless notes.
        assert_eq!(
            reply("1 OK 1 ", true).map(|r| (r.channel, r.result)),
            Ok((Some(1), ResultCode::Ok))
        );
        assert_eq!(
            reply("hello", false).map(|r| r.result),
            Ok(ResultCode::Unknown)
        );
        assert_eq!(reply("OK", true), Err(BadReply::NoChannel));
        assert_eq!(reply(" \r", false), Err(BadReply::Empty));
    }

    proptest! {
        #[test]
        fn escaped_tokens_hold_no_separator_and_unescape_back(token in "\\PC{0,30}|[\\x00-\\x7f]{0,30}") {
            let mut out = String::new();
            escape_into(&mut out, &token);
            prop_assert!(!out.bytes().any(|b| b == b' ' || b == b'\n' || b == b'\r' || b >= 0x7f));
            prop_assert_eq!(unescape(&out), token.as_bytes());
        }

        #[test]
        fn parse_reply_never_panics(line in proptest::collection::vec(any::<u8>(), 0..100), concurrent: bool) {
            if let Ok(reply) = parse_reply(&line, concurrent) {
                let _ = reply.message();
            }
        }
    }
}
