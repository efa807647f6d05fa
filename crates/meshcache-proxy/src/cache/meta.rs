//! What a disk record's metadata holds for the cache: a response's head and freshness, or a
//! URL's Vary marker. The disk checks the bytes' checksum; this decodes them, and refuses
//! (never panics on) anything that is not what it wrote.
//!
//! ```text
//! response (format 1):
//!   u8 1 · u16 status · u64 response_time · u32 initial_age · u32 lifetime
//!   u8 flags (1 must-revalidate, 2 stale-while-revalidate given, 4 stale-if-error given,
//!     8 no-cache)
//!   u32 stale_while_revalidate · u32 stale_if_error
//!   u16 field count, then per field: u16 name length, name, u32 value length, value
//! Vary marker (format 1):
//!   u8 1 · u16 name count, then per name: u16 length, name · u16 variant count, 16 bytes each
//! ```
//!
//! Integers are little-endian. Field values are decoded as slices of the record's bytes,
//! without a copy.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::StatusCode;
use meshcache_store::StoreKey;

use super::object::CachedObject;
use crate::directives::ResponseDirectives;
use crate::semantics::Freshness;

const FORMAT: u8 = 1;

/// Metadata that is not what the cache writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// Shorter than its own lengths say.
    #[error("truncated metadata")]
    Truncated,
    /// A version, status, name or value the cache never writes.
    #[error("invalid metadata: {0}")]
    Invalid(&'static str),
}

/// A response's head and freshness, encoded.
pub fn encode_object(object: &CachedObject) -> Vec<u8> {
    let f = &object.freshness;
    let fields: usize = object
        .headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum();
    let mut out = Vec::with_capacity(32 + fields);
    out.push(FORMAT);
    out.extend_from_slice(&object.status.as_u16().to_le_bytes());
    out.extend_from_slice(&f.response_time.to_le_bytes());
    out.extend_from_slice(&f.initial_age.to_le_bytes());
    out.extend_from_slice(&f.lifetime.to_le_bytes());
    let d = &f.directives;
    let flags = u8::from(d.must_revalidate)
        | u8::from(d.stale_while_revalidate.is_some()) << 1
        | u8::from(d.stale_if_error.is_some()) << 2
        | u8::from(d.no_cache) << 3;
    out.push(flags);
    out.extend_from_slice(&d.stale_while_revalidate.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&d.stale_if_error.unwrap_or(0).to_le_bytes());
    let count = object.headers.len().min(usize::from(u16::MAX));
    out.extend_from_slice(&(count as u16).to_le_bytes());
    for (name, value) in object.headers.iter().take(count) {
        let name = name.as_str().as_bytes();
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A Vary marker, encoded.
pub fn encode_vary(names: &[HeaderName], variants: &[StoreKey]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + names.len() * 24 + variants.len() * 16);
    out.push(FORMAT);
    out.extend_from_slice(&(names.len() as u16).to_le_bytes());
    for name in names {
        let name = name.as_str().as_bytes();
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
    }
    out.extend_from_slice(&(variants.len() as u16).to_le_bytes());
    for v in variants {
        out.extend_from_slice(&v.0);
    }
    out
}

/// Reads integers and slices off the front of the metadata.
struct Reader {
    bytes: Bytes,
    at: usize,
}

impl Reader {
    /// The next `n` bytes, borrowed (no reference count is touched: scalars and names are
    /// read this way).
    fn raw(&mut self, n: usize) -> Result<&[u8], MetaError> {
        let end = self.at.checked_add(n).ok_or(MetaError::Truncated)?;
        let out = self.bytes.get(self.at..end).ok_or(MetaError::Truncated)?;
        self.at = end;
        Ok(out)
    }

    /// The next `n` bytes as a slice of the record's buffer (field values keep it, uncopied).
    fn take(&mut self, n: usize) -> Result<Bytes, MetaError> {
        let start = self.at;
        self.raw(n)?;
        Ok(self.bytes.slice(start..self.at))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], MetaError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.raw(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, MetaError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, MetaError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, MetaError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, MetaError> {
        self.array().map(u64::from_le_bytes)
    }

    fn name(&mut self) -> Result<HeaderName, MetaError> {
        let len = self.u16()?;
        let raw = self.raw(usize::from(len))?;
        HeaderName::from_bytes(raw).map_err(|_| MetaError::Invalid("field name"))
    }

    fn end(&self) -> Result<(), MetaError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(MetaError::Invalid("trailing bytes"))
        }
    }
}

/// A stored response from its metadata and body.
///
/// # Errors
///
/// [`MetaError`] when `meta` is not a response's metadata as [`encode_object`] writes it.
pub fn decode_object(meta: Bytes, body: Bytes) -> Result<CachedObject, MetaError> {
    let mut r = Reader { bytes: meta, at: 0 };
    if r.u8()? != FORMAT {
        return Err(MetaError::Invalid("format"));
    }
    let status = StatusCode::from_u16(r.u16()?).map_err(|_| MetaError::Invalid("status"))?;
    let response_time = r.u64()?;
    let initial_age = r.u32()?;
    let lifetime = r.u32()?;
    let flags = r.u8()?;
    let swr = r.u32()?;
    let sie = r.u32()?;
    let count = r.u16()?;
    let mut headers = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let name = r.name()?;
        let len = r.u32()? as usize;
        let value = HeaderValue::from_maybe_shared(r.take(len)?)
            .map_err(|_| MetaError::Invalid("field value"))?;
        headers.push((name, value));
    }
    r.end()?;
    let freshness = Freshness {
        response_time,
        initial_age,
        lifetime,
        directives: ResponseDirectives {
            must_revalidate: flags & 1 != 0,
            no_cache: flags & 8 != 0,
            stale_while_revalidate: (flags & 2 != 0).then_some(swr),
            stale_if_error: (flags & 4 != 0).then_some(sie),
        },
    };
    let headers: Arc<[(HeaderName, HeaderValue)]> = headers.into();
    Ok(CachedObject::from_parts(status, headers, body, freshness))
}

/// A Vary marker's field names and variants from its metadata.
///
/// # Errors
///
/// [`MetaError`] when `meta` is not a marker as [`encode_vary`] writes it.
pub fn decode_vary(meta: Bytes) -> Result<(Box<[HeaderName]>, Vec<StoreKey>), MetaError> {
    let mut r = Reader { bytes: meta, at: 0 };
    if r.u8()? != FORMAT {
        return Err(MetaError::Invalid("format"));
    }
    let count = r.u16()?;
    let mut names = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        names.push(r.name()?);
    }
    let count = r.u16()?;
    let mut variants = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        variants.push(StoreKey(r.array()?));
    }
    r.end()?;
    Ok((names.into_boxed_slice(), variants))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn object(headers: Vec<(HeaderName, HeaderValue)>, f: Freshness) -> CachedObject {
        CachedObject::from_parts(
            StatusCode::OK,
            headers.into(),
            Bytes::from_static(b"body"),
            f,
        )
    }

    fn freshness() -> impl Strategy<Value = Freshness> {
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<(bool, bool)>(),
            any::<Option<u32>>(),
            any::<Option<u32>>(),
        )
            .prop_map(
                |(response_time, initial_age, lifetime, (must_revalidate, no_cache), swr, sie)| {
                    Freshness {
                        response_time,
                        initial_age,
                        lifetime,
                        directives: ResponseDirectives {
                            must_revalidate,
                            no_cache,
                            stale_while_revalidate: swr,
                            stale_if_error: sie,
                        },
                    }
                },
            )
    }

    fn field() -> impl Strategy<Value = (HeaderName, HeaderValue)> {
        ("[a-z][a-z0-9-]{0,20}", "[ -~]{0,60}").prop_map(|(n, v)| {
            (
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v.trim()).expect("value"),
            )
        })
    }

    proptest! {
        #[test]
        fn responses_round_trip(f in freshness(), fields in proptest::collection::vec(field(), 0..20), status in 100u16..600) {
            let mut o = object(fields, f);
            o.status = StatusCode::from_u16(status).expect("status");
            let back = decode_object(Bytes::from(encode_object(&o)), o.body.clone()).expect("decodes");
            prop_assert_eq!(back.status, o.status);
            prop_assert_eq!(back.freshness, o.freshness);
            prop_assert_eq!(&back.headers[..], &o.headers[..]);
            prop_assert_eq!(back.body, o.body);
        }

        #[test]
        fn markers_round_trip(names in proptest::collection::vec("[a-z][a-z-]{0,15}", 0..6), keys in proptest::collection::vec(any::<[u8; 16]>(), 0..40)) {
            let names: Vec<HeaderName> = names.iter().map(|n| HeaderName::from_bytes(n.as_bytes()).expect("name")).collect();
            let keys: Vec<StoreKey> = keys.into_iter().map(StoreKey).collect();
            let (n, k) = decode_vary(Bytes::from(encode_vary(&names, &keys))).expect("decodes");
            prop_assert_eq!(&n[..], &names[..]);
            prop_assert_eq!(k, keys);
        }

        /// Whatever the bytes, decoding answers; it never panics.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_object(Bytes::from(bytes.clone()), Bytes::new());
            let _ = decode_vary(Bytes::from(bytes));
        }
    }

    #[test]
    fn a_short_or_foreign_metadata_is_refused() {
        let o = object(
            vec![(http::header::ETAG, HeaderValue::from_static("\"x\""))],
            Freshness {
                response_time: 1,
                initial_age: 2,
                lifetime: 3,
                directives: ResponseDirectives::default(),
            },
        );
        let meta = encode_object(&o);
        for cut in 0..meta.len() {
            assert!(decode_object(Bytes::copy_from_slice(&meta[..cut]), Bytes::new()).is_err());
        }
        let mut wrong = meta.clone();
        wrong[0] = 9;
        assert_eq!(
            decode_object(Bytes::from(wrong), Bytes::new()).err(),
            Some(MetaError::Invalid("format"))
        );
        let mut longer = meta;
        longer.push(0);
        assert!(decode_object(Bytes::from(longer), Bytes::new()).is_err());
    }
}
