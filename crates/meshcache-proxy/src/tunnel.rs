//! CONNECT tunnels, once the access rules (and `http.connect_ports`) allowed them: bytes copied both ways until either side
//! closes or nothing has moved either way for `http.idle_timeout`; logged as TCP_TUNNEL when
//! the tunnel ends.

use std::sync::Arc;

use http::{request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::{ProxyBody, Transaction};
use crate::error::UpstreamError;
use crate::idle::IdleStream;
use crate::outcome::{HierCode, ResultCode};
use crate::refusal::refuse;
use crate::routing::Directness;
use crate::Shared;

/// Opens a tunnel for a CONNECT request: to the origin, or through a parent when the routing
/// rules say `never_direct`.
pub(crate) async fn connect(
    shared: Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    directness: Directness,
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
    let opened = if directness == Directness::Never {
        through_parent(&shared, &host, authority.as_str(), &parts.headers)
            .await
            .map(|(stream, early, parent)| (stream, early, Some(parent)))
    } else {
        // `upstream.socket`'s options, the host table and the connect timeout, as for origins.
        shared
            .upstream
            .open(&host, port)
            .await
            .map(|s| (s, Vec::new(), None))
    };
    let (upstream, early, parent) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            let token = e.token();
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
    match parent {
        Some(name) => {
            txn.hierarchy = HierCode::FirstUpParent;
            txn.peer = Some(name);
        }
        None => {
            txn.hierarchy = HierCode::Direct;
            txn.peer = Some(authority.host().to_owned());
        }
    }
    let idle = shared.config.http.idle_timeout;
    let req = http::Request::from_parts(parts, ());
    tokio::spawn(async move {
        let mut bytes = 0;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                // Bytes the parent sent right after its 200 belong to the tunnel.
                if !early.is_empty() && client.write_all(&early).await.is_err() {
                    txn.finish(0);
                    return;
                }
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

/// The longest CONNECT response head a parent may send.
const MAX_PARENT_HEAD: usize = 16 * 1024;

/// Opens a tunnel to `authority` through the first parent that is up and agrees (each parent in
/// configuration order; a refused or silent one is marked down and the next is tried). Returns
/// the stream, the tunnel bytes the parent sent after its answer, and the parent's name.
async fn through_parent(
    shared: &Shared,
    host: &str,
    authority: &str,
    headers: &http::HeaderMap,
) -> Result<(TcpStream, Vec<u8>, String), UpstreamError> {
    let mut last = UpstreamError::NoRoute {
        host: host.to_owned(),
    };
    for peer in shared.coop.parents_up(host) {
        let spec = shared.coop.spec(peer);
        let asked = async {
            let mut stream = shared
                .upstream
                .open(&spec.http.ip().to_string(), spec.http.port())
                .await?;
            let mut request = format!(
                "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nVia: {}\r\n",
                shared.via.own().to_str().unwrap_or("1.1 meshcache")
            )
            .into_bytes();
            if let Some(credentials) = crate::forward::passed_credentials(shared, peer, headers) {
                request.extend_from_slice(b"Proxy-Authorization: ");
                request.extend_from_slice(credentials.as_bytes());
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"\r\n");
            let io = |source| UpstreamError::Connect {
                host: spec.name.clone(),
                source,
            };
            stream.write_all(&request).await.map_err(io)?;
            let mut head = Vec::with_capacity(1024);
            let mut chunk = [0u8; 4096];
            loop {
                let n = stream.read(&mut chunk).await.map_err(io)?;
                if n == 0 {
                    return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
                }
                head.extend_from_slice(&chunk[..n]);
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut response = httparse::Response::new(&mut headers);
                match response.parse(&head) {
                    Ok(httparse::Status::Complete(len)) => {
                        let status = response
                            .code
                            .and_then(|c| StatusCode::from_u16(c).ok())
                            .unwrap_or(StatusCode::BAD_GATEWAY);
                        if !status.is_success() {
                            return Err(UpstreamError::TunnelRefused {
                                peer: spec.name.clone(),
                                status,
                                authority: authority.to_owned(),
                            });
                        }
                        return Ok((stream, head.split_off(len)));
                    }
                    Ok(httparse::Status::Partial) if head.len() < MAX_PARENT_HEAD => continue,
                    _ => {
                        return Err(io(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "not an HTTP response to CONNECT",
                        )))
                    }
                }
            }
        };
        let timeout = shared.config.cooperation.peer_response_timeout
            + shared.config.upstream.connect_timeout;
        match tokio::time::timeout(timeout, asked).await {
            Ok(Ok((stream, early))) => {
                shared.coop.fetch_result(peer, true);
                return Ok((stream, early, spec.name.clone()));
            }
            Ok(Err(e)) => {
                tracing::info!(peer = %spec.name, error = %e, "parent failed a CONNECT; trying the next");
                // A parent that answers is up, even when it refuses this tunnel.
                let answered = matches!(e, UpstreamError::TunnelRefused { .. });
                shared.coop.fetch_result(peer, answered);
                last = e;
            }
            Err(_) => {
                tracing::warn!(peer = %spec.name, "parent stalled on a CONNECT; trying the next");
                shared.coop.fetch_result(peer, false);
                last = UpstreamError::ReadTimeout {
                    host: spec.name.clone(),
                };
            }
        }
    }
    Err(last)
}
