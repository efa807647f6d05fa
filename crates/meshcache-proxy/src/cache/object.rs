//! What the cache holds under a key: a stored response, or a URL's Vary marker.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use meshcache_store::{StoreKey, Weigh};

use crate::semantics::Freshness;
use crate::zerocopy;

/// A stored response: status, end-to-end headers, the whole body and its freshness.
#[derive(Debug)]
pub struct CachedObject {
    /// Response status.
    pub status: StatusCode,
    /// End-to-end response headers, in order (hop-by-hop ones already removed); shared, so
    /// an applet run can see them without a copy.
    pub headers: Arc<[(HeaderName, HeaderValue)]>,
    /// The body.
    pub body: Bytes,
    /// Freshness facts.
    pub freshness: Freshness,
    /// The applet its hits run, worked out on the first hit (see `applets`).
    pub applet: std::sync::OnceLock<Option<Arc<crate::attachment::Attached>>>,
}

impl CachedObject {
    /// Builds a stored object from a response head and body.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Bytes, freshness: Freshness) -> Self {
        let headers = headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        Self::from_parts(status, headers, body, freshness)
    }

    /// Builds a stored object from headers already in the stored shape.
    pub fn from_parts(
        status: StatusCode,
        headers: Arc<[(HeaderName, HeaderValue)]>,
        body: Bytes,
        freshness: Freshness,
    ) -> Self {
        CachedObject {
            status,
            headers,
            body,
            freshness,
            applet: std::sync::OnceLock::new(),
        }
    }

    /// The stored headers as a map (for semantics functions and serving).
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len() + 6);
        for (n, v) in self.headers.iter() {
            map.append(n.clone(), v.clone());
        }
        map
    }

    /// One header's first value.
    pub fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// What the store holds under a key.
#[derive(Debug)]
pub enum Entry {
    /// A response.
    Object(CachedObject),
    /// The URL's responses vary on these request fields; its variants are under these keys.
    Vary {
        /// Lower-case field names, sorted.
        names: Box<[HeaderName]>,
        /// Variant keys currently known.
        variants: Vec<StoreKey>,
    },
}

/// Fixed bookkeeping charged to every entry beyond its header and body bytes.
pub const ENTRY_OVERHEAD: u64 = (std::mem::size_of::<Entry>() + 16) as u64;

impl Weigh for Entry {
    fn weight(&self) -> u64 {
        let own = match self {
            Entry::Object(o) => {
                zerocopy::charged(o.body.len())
                    + o.headers
                        .iter()
                        .map(|(n, v)| (n.as_str().len() + v.len() + 48) as u64)
                        .sum::<u64>()
            }
            Entry::Vary { names, variants } => (names.len() * 24 + variants.len() * 16) as u64,
        };
        own + ENTRY_OVERHEAD
            + meshcache_store::MemoryStore::<Entry>::metadata_bytes_per_entry() as u64
    }
}

#[cfg(test)]
mod overhead {
    use super::*;
    use meshcache_store::{MemoryStore, Replacement};

    /// Per-object bookkeeping beyond the response's own header and body bytes: the store's
    /// index and policy node, the entry record and its `Arc`. Documented in docs/proxy.md.
    #[test]
    fn metadata_per_object_is_at_most_256_bytes() {
        for r in [Replacement::Lru, Replacement::Gdsf, Replacement::Lfuda] {
            let store = MemoryStore::<Entry>::metadata_bytes_per_entry_for(r) as u64;
            let total = store + ENTRY_OVERHEAD;
            println!("{r}: store {store} + entry {ENTRY_OVERHEAD} = {total} bytes");
            assert!(total <= 256, "{r}: {total} bytes of metadata per object");
        }
    }
}
