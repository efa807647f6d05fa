//! Partial content (RFC 9111 §3.3, §3.4): which 206 responses the cache keeps as pieces of a
//! representation (`cache/partial.rs` holds them), the 206 it serves from a piece, and the
//! whole it makes when a range request brings the rest.
//!
//! A 206 is kept only when the pieces can be combined safely: one range with the complete
//! length (`Content-Range: bytes a-b/N`), a strong `ETag`, no `Vary`, and a body of exactly the
//! range's length. A later request for a range inside one held run is answered from it; a
//! GET for the whole, when the cache holds a prefix, is sent upstream as a range request for
//! the rest (`Range: bytes=L-`, `If-Range` with the ETag), and the two parts become one 200.
//!
//! Everything here is pure.

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use crate::cache::partial::{Partial, Piece};
use crate::cache::CachedObject;
use crate::headers::{parse_content_range, parse_range, RangeRequest};
use crate::semantics::Freshness;

/// What a 206's head says of the piece it carries, when the piece may be kept.
#[derive(Clone, Debug)]
pub(crate) struct PieceHead {
    headers: Vec<(HeaderName, HeaderValue)>,
    etag: HeaderValue,
    start: u64,
    end: u64,
    total: u64,
}

impl PieceHead {
    /// The piece a 206 with these headers carries, or `None` if it may not be kept.
    pub(crate) fn of(status: StatusCode, headers: &HeaderMap) -> Option<PieceHead> {
        if status != StatusCode::PARTIAL_CONTENT || headers.contains_key(header::VARY) {
            return None;
        }
        let mut ranges = headers.get_all(header::CONTENT_RANGE).iter();
        let (start, end, total) = parse_content_range(ranges.next()?)?;
        if ranges.next().is_some() {
            return None;
        }
        let etag = headers.get(header::ETAG)?.clone();
        if !etag.as_bytes().starts_with(b"\"") {
            return None; // weak (W/"…") or malformed: not for combining (§3.4)
        }
        let headers = headers
            .iter()
            .filter(|(n, _)| **n != header::CONTENT_RANGE && **n != header::CONTENT_LENGTH)
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        Some(PieceHead {
            headers,
            etag,
            start,
            end,
            total,
        })
    }

    /// The range's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start + 1
    }

    /// The piece with its body; `None` if the body is not the range's length.
    pub(crate) fn piece(self, body: Bytes, freshness: Freshness) -> Option<Piece> {
        (body.len() as u64 == self.len()).then_some(Piece {
            headers: self.headers,
            etag: self.etag,
            start: self.start,
            total: self.total,
            body,
            freshness,
        })
    }

    /// Whether this piece is the rest of `partial`'s prefix of `held` bytes: the same
    /// representation, from byte `held` to the end.
    pub(crate) fn completes(&self, partial: &Partial, held: u64) -> bool {
        self.etag == partial.etag
            && self.total == partial.total
            && self.start == held
            && self.end + 1 == self.total
    }
}

/// The stored object (a 206 with its `Content-Range`) that answers `request`'s range from
/// `partial`, when one held run covers it.
pub(crate) fn from_piece(request: &HeaderMap, partial: &Partial) -> Option<CachedObject> {
    let RangeRequest::Partial(r) = parse_range(request.get(header::RANGE)?, partial.total) else {
        return None;
    };
    if let Some(if_range) = request.get(header::IF_RANGE) {
        if *if_range != partial.etag {
            return None;
        }
    }
    let body = partial.slice(r.start, r.end)?;
    let mut headers = HeaderMap::with_capacity(partial.headers.len() + 1);
    for (n, v) in &partial.headers {
        headers.append(n.clone(), v.clone());
    }
    let range = format!("bytes {}-{}/{}", r.start, r.end, partial.total);
    headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(&range).ok()?);
    Some(CachedObject::new(
        StatusCode::PARTIAL_CONTENT,
        &headers,
        body,
        partial.freshness,
    ))
}

/// The request headers that ask upstream for the rest of `partial` after its prefix of
/// `held` bytes: the client's, with `Range: bytes=held-` and `If-Range` (so a changed
/// representation comes back whole, as a 200).
pub(crate) fn rest_request(client: &HeaderMap, partial: &Partial, held: u64) -> HeaderMap {
    let mut headers = client.clone();
    for h in [
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_MATCH,
        header::IF_UNMODIFIED_SINCE,
    ] {
        headers.remove(h);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("bytes={held}-")) {
        headers.insert(header::RANGE, v);
    }
    headers.insert(header::IF_RANGE, partial.etag.clone());
    headers
}

/// The whole 200 made of `prefix` and the `rest` that completes it, with the head of the
/// response that brought the rest.
pub(crate) fn whole(
    prefix: &Bytes,
    rest: &Bytes,
    head: &PieceHead,
    freshness: Freshness,
) -> CachedObject {
    let mut body = BytesMut::with_capacity(prefix.len() + rest.len());
    body.extend_from_slice(prefix);
    body.extend_from_slice(rest);
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    for (n, v) in &head.headers {
        headers.append(n.clone(), v.clone());
    }
    CachedObject::new(StatusCode::OK, &headers, body.freeze(), freshness)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::partial::Partials;
    use crate::directives::ResponseDirectives;
    use crate::testing::map;
    use meshcache_store::StoreKey;

    fn freshness() -> Freshness {
        Freshness {
            response_time: 0,
            initial_age: 0,
            lifetime: 60,
            directives: ResponseDirectives::default(),
        }
    }

    fn head(range: &str, etag: &str) -> Option<PieceHead> {
        PieceHead::of(
            StatusCode::PARTIAL_CONTENT,
            &map(&[
                ("content-range", range),
                ("etag", etag),
                ("content-length", "4"),
                ("content-type", "text/plain"),
            ]),
        )
    }

    #[test]
    fn only_combinable_pieces_are_kept() {
        let h = head("bytes 0-3/10", "\"a\"").expect("kept");
        assert_eq!(h.len(), 4);
        assert_eq!(
            h.headers.len(),
            2,
            "without Content-Range and Content-Length"
        );
        assert!(head("bytes 0-3/*", "\"a\"").is_none());
        assert!(head("bytes 0-3/10", "W/\"a\"").is_none());
        assert!(PieceHead::of(StatusCode::OK, &map(&[("etag", "\"a\"")])).is_none());
        assert!(PieceHead::of(
            StatusCode::PARTIAL_CONTENT,
            &map(&[
                ("content-range", "bytes 0-3/10"),
                ("etag", "\"a\""),
                ("vary", "x")
            ])
        )
        .is_none());
        let h = head("bytes 0-3/10", "\"a\"").expect("kept");
        assert!(h
            .clone()
            .piece(Bytes::from_static(b"012"), freshness())
            .is_none());
        assert!(h.piece(Bytes::from_static(b"0123"), freshness()).is_some());
    }

    #[test]
    fn a_held_range_is_served_and_the_rest_completes_the_whole() {
        let mut t = Partials::new(1 << 20);
        let key = StoreKey::get("http://ranges.test/x");
        let piece = head("bytes 0-3/10", "\"a\"")
            .expect("kept")
            .piece(Bytes::from_static(b"0123"), freshness())
            .expect("piece");
        let partial = t.add(key, piece).expect("kept").clone();
        let hit = from_piece(&map(&[("range", "bytes=1-2")]), &partial).expect("held");
        assert_eq!(hit.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(&hit.body[..], b"12");
        assert_eq!(
            hit.header(&header::CONTENT_RANGE).expect("range"),
            "bytes 1-2/10"
        );
        assert!(from_piece(&map(&[("range", "bytes=2-5")]), &partial).is_none());
        assert!(from_piece(
            &map(&[("range", "bytes=0-1"), ("if-range", "\"b\"")]),
            &partial
        )
        .is_none());
        let asked = rest_request(&map(&[("if-none-match", "\"z\"")]), &partial, 4);
        assert_eq!(asked["range"], "bytes=4-");
        assert_eq!(asked["if-range"], "\"a\"");
        assert!(!asked.contains_key("if-none-match"));
        let rest = head("bytes 4-9/10", "\"a\"").expect("kept");
        assert!(rest.completes(&partial, 4));
        assert!(!head("bytes 4-8/10", "\"a\"")
            .expect("kept")
            .completes(&partial, 4));
        assert!(!head("bytes 4-9/10", "\"b\"")
            .expect("kept")
            .completes(&partial, 4));
        let whole = whole(
            partial.prefix().expect("prefix"),
            &Bytes::from_static(b"456789"),
            &rest,
            freshness(),
        );
        assert_eq!(whole.status, StatusCode::OK);
        assert_eq!(&whole.body[..], b"0123456789");
        assert!(whole.header(&header::CONTENT_RANGE).is_none());
    }
}
