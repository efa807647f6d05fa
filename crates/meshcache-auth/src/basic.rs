//! `Basic` credentials (RFC 7617) as a client sends them in `Proxy-Authorization`: the header
//! value in, user and password out.
//!
//! Pure: no I/O, no clock, no allocation beyond the two strings returned. It never panics,
//! whatever the bytes (a property test feeds it arbitrary input); each way a value can be wrong
//! is a [`BasicError`] variant, so the proxy can log why it answered 407.
//!
//! What is accepted: the scheme `Basic` in any case, one or more spaces or tabs, one base64 token
//! (standard alphabet, padding optional), optional surrounding whitespace. The decoded text must
//! be UTF-8 (the `charset="UTF-8"` of RFC 7617 §2.1, which the proxy's challenge announces), the
//! user is what precedes the first colon and may be neither empty nor hold a control character
//! (it ends up in logs and helper lines); the password is everything after the colon and may be
//! anything, empty included.

use base64::engine::general_purpose::{STANDARD, STANDARD_PAD_INDIFFERENT};
use base64::Engine as _;

/// The longest `Proxy-Authorization` value looked at. Longer ones are rejected unread: no real
/// user and password need 8 KiB, and Squid's helpers read lines of about that size.
pub const MAX_VALUE_LEN: usize = 8 * 1024;

/// Why a `Proxy-Authorization` value is not usable `Basic` credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BasicError {
    /// Longer than [`MAX_VALUE_LEN`].
    #[error("the value is {len} bytes long, more than the {max} allowed")]
    TooLong {
        /// The value's length.
        len: usize,
        /// [`MAX_VALUE_LEN`].
        max: usize,
    },
    /// Another scheme (`Digest`, `Negotiate`, …) or no scheme at all.
    #[error("the scheme is not Basic")]
    NotBasic,
    /// `Basic` and nothing after it.
    #[error("no credentials follow the Basic scheme")]
    MissingCredentials,
    /// More than one token after `Basic`.
    #[error("more than one token follows the Basic scheme")]
    TrailingData,
    /// The token is not base64.
    #[error("the credentials are not base64")]
    Base64,
    /// The decoded credentials are not UTF-8.
    #[error("the decoded credentials are not UTF-8")]
    NotUtf8,
    /// No colon separates user and password.
    #[error("the decoded credentials have no colon between user and password")]
    NoColon,
    /// Nothing before the colon.
    #[error("the user name is empty")]
    EmptyUser,
    /// The user name holds a control character (CR, LF, NUL, …).
    #[error("the user name holds a control character")]
    ControlInUser,
}

/// Parses one `Proxy-Authorization` value into `(user, password)`.
///
/// ```
/// use meshcache_auth::{parse_basic, BasicError};
///
/// // "Aladdin:open sesame", the example of RFC 7617.
/// let (user, password) = parse_basic(b"Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")?;
/// assert_eq!((user.as_str(), password.as_str()), ("Aladdin", "open sesame"));
/// assert_eq!(parse_basic(b"Digest username=\"x\""), Err(BasicError::NotBasic));
/// # Ok::<(), BasicError>(())
/// ```
pub fn parse_basic(value: &[u8]) -> Result<(String, String), BasicError> {
    decode(credentials(value)?)
}

/// The base64 token of a `Basic` value, undecoded: the scheme and the token's shape checked.
/// The cache keys on it, so a cached check decodes nothing.
pub(crate) fn credentials(value: &[u8]) -> Result<&[u8], BasicError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(BasicError::TooLong {
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    let value = trim(value);
    let (scheme, rest) = match value.iter().position(|&b| is_space(b)) {
        Some(at) => value.split_at(at),
        None => (value, &[][..]),
    };
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err(BasicError::NotBasic);
    }
    let token = trim(rest);
    if token.is_empty() {
        return Err(BasicError::MissingCredentials);
    }
    if token.iter().any(|&b| is_space(b)) {
        return Err(BasicError::TrailingData);
    }
    Ok(token)
}

/// Decodes a token from [`credentials`] into user and password.
pub(crate) fn decode(token: &[u8]) -> Result<(String, String), BasicError> {
    let decoded = STANDARD_PAD_INDIFFERENT
        .decode(token)
        .map_err(|_| BasicError::Base64)?;
    let mut user = String::from_utf8(decoded).map_err(|_| BasicError::NotUtf8)?;
    let colon = user.find(':').ok_or(BasicError::NoColon)?;
    let password = user[colon + 1..].to_owned();
    user.truncate(colon);
    if user.is_empty() {
        return Err(BasicError::EmptyUser);
    }
    if user.chars().any(char::is_control) {
        return Err(BasicError::ControlInUser);
    }
    Ok((user, password))
}

/// The `Proxy-Authorization` value a client sends for `user` and `password` (with padding).
///
/// ```
/// assert_eq!(
///     meshcache_auth::basic_value("Aladdin", "open sesame"),
///     "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
/// );
/// ```
pub fn basic_value(user: &str, password: &str) -> String {
    let mut plain = String::with_capacity(user.len() + 1 + password.len());
    plain.push_str(user);
    plain.push(':');
    plain.push_str(password);
    let mut value = String::from("Basic ");
    STANDARD.encode_string(plain, &mut value);
    value
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_space(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_space(*last) {
            break;
        }
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parsed(value: &str) -> Result<(String, String), BasicError> {
        parse_basic(value.as_bytes())
    }

    fn ok(user: &str, password: &str) -> Result<(String, String), BasicError> {
        Ok((user.to_owned(), password.to_owned()))
    }

    #[test]
    fn accepts_what_clients_send() {
        // RFC 7617's example; curl sends the same bytes for `-U Aladdin:'open sesame'`.
        assert_eq!(
            parsed("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            ok("Aladdin", "open sesame")
        );
        // Scheme in any case, tabs, surrounding whitespace, no padding.
        assert_eq!(
            parsed(" bAsIc\t QWxhZGRpbjpvcGVuIHNlc2FtZQ  "),
            ok("Aladdin", "open sesame")
        );
        // The password keeps later colons; an empty password is a password.
        assert_eq!(parsed(&basic_value("u", "a:b:c")), ok("u", "a:b:c"));
        assert_eq!(parsed(&basic_value("u", "")), ok("u", ""));
        // UTF-8 user names (RFC 7617 §2.1's "test" with a pound sign: "test:123£").
        assert_eq!(parsed("Basic dGVzdDoxMjPCow=="), ok("test", "123£"));
    }

    #[test]
    fn names_each_fault() {
        use BasicError::*;
        assert_eq!(parsed(""), Err(NotBasic));
        assert_eq!(parsed("Bearer abc"), Err(NotBasic));
        assert_eq!(parsed("Basically dTpw"), Err(NotBasic));
        assert_eq!(parsed("Basic"), Err(MissingCredentials));
        assert_eq!(parsed("Basic   "), Err(MissingCredentials));
        assert_eq!(parsed("Basic dTpw dTpw"), Err(TrailingData));
        assert_eq!(parsed("Basic d*pw"), Err(Base64));
        assert_eq!(parsed("Basic dTpw="), Err(Base64)); // 'u:p' with a wrong pad
        assert_eq!(parsed("Basic //79"), Err(NotUtf8));
        assert_eq!(parsed("Basic dXNlcg=="), Err(NoColon)); // "user"
        assert_eq!(parsed(&basic_value("", "p")), Err(EmptyUser));
        assert_eq!(parsed(&basic_value("a\nb", "p")), Err(ControlInUser));
        let long = vec![b'A'; MAX_VALUE_LEN + 1];
        assert_eq!(
            parse_basic(&long),
            Err(TooLong {
                len: MAX_VALUE_LEN + 1,
                max: MAX_VALUE_LEN
            })
        );
    }

    proptest! {
        #[test]
        fn never_panics(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_basic(&value);
        }

        #[test]
        fn never_panics_after_basic(token in "[A-Za-z0-9+/= \t:]{0,80}") {
            let _ = parse_basic(format!("Basic {token}").as_bytes());
        }

        #[test]
        fn round_trips(user in "[^:\\p{Cc}]{1,40}", password in "\\PC{0,40}") {
            prop_assert_eq!(parse_basic(basic_value(&user, &password).as_bytes()), Ok((user, password)));
        }
    }
}
