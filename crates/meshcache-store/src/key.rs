//! Store keys: the 16-byte MD5 identity of a cached object.
//!
//! meshcache computes keys exactly the way Squid does for its *public* store
//! keys (`storeKeyPublic` / `storeKeyPublicByRequestMethod`): MD5 over a single
//! byte holding Squid's internal method number, then the URL bytes, then — for a
//! `Vary` variant — the request's normalised values of the headers the response
//! varies on. Using the same construction means a key computed here can be
//! compared with keys found in Squid cache digests, ICP/HTCP exchanges and
//! cache-manager output.

use std::fmt;

use md5::{Digest, Md5};

/// Squid-compatible store key: MD5 over one method byte then the URL bytes.
///
/// The method byte is Squid's internal `Http::MethodType` number (see the
/// `METHOD_*` associated constants), not the method's spelling.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct StoreKey(pub [u8; 16]);

impl StoreKey {
    /// Squid's method number for `GET`.
    pub const METHOD_GET: u8 = 1;
    /// Squid's method number for `POST`.
    pub const METHOD_POST: u8 = 2;
    /// Squid's method number for `PUT`.
    pub const METHOD_PUT: u8 = 3;
    /// Squid's method number for `HEAD`.
    pub const METHOD_HEAD: u8 = 4;
    /// Squid's method number for `CONNECT`.
    pub const METHOD_CONNECT: u8 = 5;
    /// Squid's method number for `TRACE`.
    pub const METHOD_TRACE: u8 = 6;
    /// Squid's method number for `OPTIONS`.
    pub const METHOD_OPTIONS: u8 = 7;
    /// Squid's method number for `DELETE`.
    pub const METHOD_DELETE: u8 = 8;

    /// Key for a `GET` of `url` (Squid: `MD5(0x01 || url)`).
    pub fn get(url: &str) -> Self {
        Self::with_method(Self::METHOD_GET, url)
    }

    /// Key for method number `method_id` (Squid's internal `Http::MethodType`:
    /// GET=1, POST=2, PUT=3, HEAD=4, …; see the `METHOD_*` constants).
    pub fn with_method(method_id: u8, url: &str) -> Self {
        Self::digest(method_id, url, &[])
    }

    /// Key of a `Vary` variant: MD5 over `0x01 || url || variant`.
    ///
    /// `variant` is the request's values of the headers named by the response's
    /// `Vary`, already normalised by the caller (Squid's `vary_headers`
    /// string). An empty `variant` gives the same key as [`StoreKey::get`].
    pub fn variant(url: &str, variant: &[u8]) -> Self {
        Self::digest(Self::METHOD_GET, url, variant)
    }

    fn digest(method_id: u8, url: &str, variant: &[u8]) -> Self {
        let mut md5 = Md5::new();
        md5.update([method_id]);
        md5.update(url.as_bytes());
        md5.update(variant);
        StoreKey(md5.finalize().into())
    }

    /// The 16 key bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// 32 upper-case hex digits in byte order (Squid's `storeKeyText`).
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// Parse 32 hex digits (either case), as printed by [`StoreKey::to_hex`].
    /// Returns `None` for anything else.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let digits = hex.as_bytes();
        if digits.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            let hi = char::from(pair[0]).to_digit(16)?;
            let lo = char::from(pair[1]).to_digit(16)?;
            // Both digits are < 16, so the value fits in a byte.
            *byte = u8::try_from(hi * 16 + lo).ok()?;
        }
        Some(StoreKey(out))
    }
}

impl fmt::Display for StoreKey {
    /// Upper-case hex, 32 digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02X}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squid_get_key_vector() {
        // Verified against a real Squid 5.7 (store.log / cachemgr output).
        assert_eq!(
            StoreKey::get("http://127.0.0.1:28765/obj.txt").to_hex(),
            "329CA687BE79CAC3C412013B6F70C45D"
        );
    }

    #[test]
    fn md5_construction_matches_reference() {
        // get() is with_method(1, ..), and the method byte and URL both matter.
        let url = "http://example.com/";
        assert_eq!(StoreKey::get(url), StoreKey::with_method(1, url));
        assert_ne!(
            StoreKey::get(url),
            StoreKey::with_method(StoreKey::METHOD_HEAD, url)
        );
        assert_ne!(StoreKey::get(url), StoreKey::get("http://example.com/x"));
    }

    #[test]
    fn independent_md5_vectors() {
        // Computed independently with Python's hashlib:
        // md5(b"\x04http://example.com/") and
        // md5(b"\x01http://example.com/page" + b'accept-encoding="gzip"').
        assert_eq!(
            StoreKey::with_method(StoreKey::METHOD_HEAD, "http://example.com/").to_hex(),
            "09F9CBAF232773D5A8D6DC9EC02B1B12"
        );
        assert_eq!(
            StoreKey::variant("http://example.com/page", b"accept-encoding=\"gzip\"").to_hex(),
            "20FCF1A452D6C76D0B9EE23E2BD6EE91"
        );
    }

    #[test]
    fn hex_formatting() {
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::try_from(i * 17).unwrap_or(0);
        }
        let key = StoreKey(bytes);
        assert_eq!(key.to_hex(), "00112233445566778899AABBCCDDEEFF");
        assert_eq!(key.to_string(), key.to_hex());
        assert_eq!(format!("{key}"), "00112233445566778899AABBCCDDEEFF");
        assert_eq!(StoreKey([0xAB; 16]).to_hex(), "AB".repeat(16));
    }

    #[test]
    fn hex_round_trip() {
        let key = StoreKey::get("http://example.com/a");
        assert_eq!(StoreKey::from_hex(&key.to_hex()), Some(key));
        assert_eq!(StoreKey::from_hex(&key.to_hex().to_lowercase()), Some(key));
        assert_eq!(StoreKey::from_hex("00"), None);
        assert_eq!(StoreKey::from_hex(&"G".repeat(32)), None);
        assert_eq!(StoreKey::from_hex(&"é".repeat(16)), None);
    }

    #[test]
    fn variant_keys_differ_from_plain() {
        let url = "http://example.com/page";
        let plain = StoreKey::get(url);
        let gzip = StoreKey::variant(url, b"accept-encoding=\"gzip\"");
        let br = StoreKey::variant(url, b"accept-encoding=\"br\"");
        assert_ne!(plain, gzip);
        assert_ne!(gzip, br);
        assert_eq!(StoreKey::variant(url, b""), plain);
        // The variant bytes are appended after the URL, as in Squid.
        assert_eq!(
            StoreKey::variant("http://example.com/pa", b"ge"),
            StoreKey::get("http://example.com/page")
        );
    }
}
