//! The admin listener: `/metrics` (Prometheus text) and `/stats` (JSON). Loopback by default;
//! it answers GET only and reveals no cached content.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::Shared;

/// Answers one admin request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(ctype),
        );
        r
    };
    if req.method() != Method::GET {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ));
    }
    let stats = shared.cache.stats();
    Ok(match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            shared.metrics.prometheus(stats),
        ),
        "/stats" => {
            let snap = shared.metrics.snapshot(stats);
            let body = serde_json::to_string_pretty(&snap)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            reply(StatusCode::OK, "application/json", body + "\n")
        }
        "/" => reply(
            StatusCode::OK,
            "text/plain",
            "meshcache admin: /metrics /stats\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics or /stats\n".into(),
        ),
    })
}
