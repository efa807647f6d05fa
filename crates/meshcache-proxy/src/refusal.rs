//! The proxy's own error responses: a status, a short page naming the reason
//! (`errorpage`), and `X-Meshcache-Error` with a stable token that tests and scripts match.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{ProxyBody, Transaction};
use crate::outcome::ResultCode;
use crate::stamps::{add_via, made_response, X_CACHE};
use crate::Shared;

static X_ERROR: HeaderName = HeaderName::from_static("x-meshcache-error");

/// An error response made by the proxy: status, a short text body naming the reason, and
/// `X-Meshcache-Error` with a stable token.
pub(crate) fn refuse(
    shared: &Shared,
    txn: Transaction,
    status: StatusCode,
    code: ResultCode,
    token: &'static str,
    reason: &str,
) -> Response<ProxyBody> {
    let (content_type, body) = shared.errors.render(&crate::errorpage::Incident {
        status,
        token,
        reason,
        method: txn.method(),
        url: txn.url(),
        client: txn.client(),
    });
    let mut headers = HeaderMap::with_capacity(6);
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len() as u64));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_ERROR.clone(), HeaderValue::from_static(token));
    if code == ResultCode::NoneNone || status == StatusCode::LOOP_DETECTED {
        // The client speaks HTTP wrongly to us: do not trust the rest of the connection.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    headers.insert(X_CACHE.clone(), shared.x_cache_miss.clone());
    add_via(shared, &mut headers);
    made_response(txn, code, status, headers, ProxyBody::full(body))
}
