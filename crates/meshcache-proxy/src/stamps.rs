//! What this node writes on the messages it sends: its `Via` (unless `http.via` is off), and
//! `X-Cache`; the size of a response head, which the access log counts; and the responses
//! whose head it makes itself.

use http::header::{self, HeaderMap, HeaderName};
use http::{Response, StatusCode, Version};

use crate::body::{ProxyBody, Transaction};
use crate::outcome::ResultCode;
use crate::{headers, Shared};

/// Squid's `X-Cache`: `HIT from <name>` or `MISS from <name>` (`Shared::x_cache_hit`, `_miss`).
pub(crate) static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// Appends this node's `Via` to a message it makes itself, unless `http.via` is off.
pub(crate) fn add_via(shared: &Shared, headers: &mut HeaderMap) {
    add_via_received(shared, headers, Version::HTTP_11);
}

/// Appends this node's `Via` to a message it forwards, received as `version`, unless
/// `http.via` is off.
pub(crate) fn add_via_received(shared: &Shared, headers: &mut HeaderMap, version: Version) {
    if shared.config.http.via {
        headers::append_via(headers, shared.via.received(version));
    }
}

/// Approximate bytes of a response head on the wire.
pub(crate) fn head_size(headers: &HeaderMap) -> u64 {
    17 + headers
        .iter()
        .map(|(n, v)| (n.as_str().len() + v.len() + 4) as u64)
        .sum::<u64>()
        + 2
}

/// A response whose head the proxy made: `body` under `status` and `headers`, its transaction
/// logged with `code`, the status, the content type and the head's size.
pub(crate) fn made_response(
    mut txn: Transaction,
    code: ResultCode,
    status: StatusCode,
    headers: HeaderMap,
    body: ProxyBody,
) -> Response<ProxyBody> {
    txn.result = code;
    txn.status = status.as_u16();
    txn.content_type = headers.get(header::CONTENT_TYPE).cloned();
    txn.head_bytes = head_size(&headers);
    let mut resp = Response::new(body.with_transaction(txn));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
