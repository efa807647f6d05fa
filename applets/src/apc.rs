//! `apc`: access permission check with Ed25519 capabilities.
//!
//! The origin stores its public key with the document, in the `apc-key` header (32 bytes as
//! 64 hex digits), and hands authorised clients a cookie
//!
//! ```text
//! apc=<payload>.<signature>
//! ```
//!
//! where both parts are base64url without padding, the signature is the 64-byte Ed25519
//! signature of the decoded payload bytes, and the payload is the UTF-8 text
//! `<url-prefix>|<expiry, Unix seconds>`. The cached copy is served only when the key decodes,
//! the cookie decodes and parses, the signature verifies, the expiry lies in the future and the
//! request URL starts with the prefix. Any failure sends the request to the origin, which
//! decides for itself (and may hand out a fresh cookie).

#[path = "guest.rs"]
mod guest;

#[no_mangle]
pub extern "C" fn run() -> i32 {
    if permitted() {
        guest::CACHED
    } else {
        guest::ORIGIN
    }
}

/// Whether the request carries a valid, unexpired capability for its URL.
fn permitted() -> bool {
    let key_hex = guest::item_header_value(guest::DOCUMENT, "apc-key");
    let key = match key_hex.as_deref().and_then(public_key) {
        Some(key) => key,
        None => return false,
    };
    let cookie = match guest::cookie("apc") {
        Some(c) => c,
        None => return false,
    };
    let (payload_b64, signature_b64) = match cookie.split_once('.') {
        Some(parts) => parts,
        None => return false,
    };
    let payload = match base64url_decode(payload_b64) {
        Some(p) => p,
        None => return false,
    };
    let signature: [u8; 64] = match base64url_decode(signature_b64).map(<[u8; 64]>::try_from) {
        Some(Ok(s)) => s,
        _ => return false,
    };
    let text = match std::str::from_utf8(&payload) {
        Ok(t) => t,
        Err(_) => return false,
    };
    // The expiry is the part after the last '|', so a prefix may itself contain '|'.
    let (prefix, expiry) = match text.rsplit_once('|') {
        Some(parts) => parts,
        None => return false,
    };
    let expiry_ms = match parse_seconds(expiry).and_then(|s| s.checked_mul(1000)) {
        Some(ms) => ms,
        None => return false,
    };
    if expiry_ms <= guest::now() {
        return false;
    }
    if !guest::get_input_string(guest::URL).starts_with(prefix) {
        return false;
    }
    guest::verify(&key, &signature, &payload)
}

/// A 32-byte key from 64 hex digits (surrounding whitespace ignored).
fn public_key(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (byte, pair) in key.iter_mut().zip(hex.chunks(2)) {
        *byte = hex_digit(pair[0])? << 4 | hex_digit(pair[1])?;
    }
    Some(key)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decimal seconds: ASCII digits only, no sign, no spaces.
fn parse_seconds(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The 6-bit value of a base64url character (RFC 4648, section 5).
fn base64url_value(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some((c - b'A') as u32),
        b'a'..=b'z' => Some((c - b'a') as u32 + 26),
        b'0'..=b'9' => Some((c - b'0') as u32 + 52),
        b'-' => Some(62),
        b'_' => Some(63),
        _ => None,
    }
}

/// Decodes unpadded base64url. Rejects padding, characters outside the alphabet, a length that
/// no byte string encodes to (one character left over), and non-zero unused trailing bits, so
/// each byte string has exactly one accepted encoding.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut bits: u32 = 0; // pending bits, in the low `pending` bits
    let mut pending = 0;
    for &c in text {
        bits = bits << 6 | base64url_value(c)?;
        pending += 6;
        if pending >= 8 {
            pending -= 8;
            out.push((bits >> pending) as u8);
            bits &= (1 << pending) - 1;
        }
    }
    // 2 or 4 bits remain after a partial group; they must be zero.
    if bits != 0 {
        return None;
    }
    Some(out)
}
