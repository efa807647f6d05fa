//! CONNECT tunnels, once the access rules (and `http.connect_ports`) allowed them: bytes copied both ways until either side
//! closes or nothing has moved either way for `http.idle_timeout`; logged as TCP_TUNNEL when
//! the tunnel ends.

use std::sync::Arc;

use http::{request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::body::{ProxyBody, Transaction};
use crate::error::UpstreamError;
use crate::idle::IdleStream;
use crate::outcome::{HierCode, ResultCode};
use crate::service::refuse;
use crate::Shared;

/// Opens a tunnel for a CONNECT request.
pub(crate) async fn connect(
    shared: Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
) -> Response<ProxyBody> {
    let Some(authority) = parts.uri.authority().cloned() else {
        return refuse(
            &shared,
            txn,
            StatusCode::BAD_REQUEST,
            ResultCode::NoneNone,
            "invalid-request",
            "CONNECT needs host:port",
        );
    };
    let Some(port) = authority.port_u16() else {
        return refuse(
            &shared,
            txn,
            StatusCode::BAD_REQUEST,
            ResultCode::NoneNone,
            "invalid-request",
            "CONNECT needs host:port",
        );
    };
    // The port was checked against http.connect_ports with the access rules.
    let host = authority.host().to_ascii_lowercase();
    // `upstream.socket`'s options, the host table and the connect timeout, as for origins.
    let upstream = match shared.upstream.open(&host, port).await {
        Ok(s) => s,
        Err(e) => {
            let token = match e {
                UpstreamError::Resolve { .. } => "dns-failure",
                UpstreamError::ConnectTimeout { .. } => "upstream-timeout",
                _ => "connect-failed",
            };
            return refuse(
                &shared,
                txn,
                e.status(),
                ResultCode::TcpTunnel,
                token,
                &e.to_string(),
            );
        }
    };
    txn.result = ResultCode::TcpTunnel;
    txn.status = 200;
    txn.hierarchy = HierCode::Direct;
    txn.peer = Some(authority.host().to_owned());
    let idle = shared.config.http.idle_timeout;
    let req = http::Request::from_parts(parts, ());
    tokio::spawn(async move {
        let mut bytes = 0;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                // Idle only when neither way moves: the client's side is kept so by its guard.
                let mut upstream = IdleStream::new(upstream, idle);
                if let Ok((a, b)) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                {
                    bytes = a + b;
                }
            }
            Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
        }
        txn.finish(bytes);
    });
    let mut resp = Response::new(ProxyBody::empty());
    *resp.status_mut() = StatusCode::OK;
    resp
}
