//! The HTTP hop walker: tries a route's hops in order until one answers.
//!
//! A sibling is asked with `only-if-cached` (its 504 means "gone since", and the next hop is
//! tried), and a peer that refuses the connection or sends no response head within
//! `cooperation.peer_response_timeout` of the request's last byte is marked down and skipped,
//! so a dead or stalled parent costs at most that bound and never the request.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use meshcache_dcm::{HierCode, Hop, PeerId, Role, Route};

use crate::efficiency::{Category, Source, Timed};
use crate::error::UpstreamError;
use crate::headers;
use crate::routing::Directness;
use crate::target::Target;
use crate::upstream::{Lease, UpBody};
use crate::Shared;

/// What a forwarded request went through.
pub struct Forwarded {
    /// The response head and body.
    pub response: Response<Incoming>,
    /// The connection, to release when the body is done.
    pub lease: Lease,
    /// How the hop was chosen.
    pub hier: HierCode,
    /// The ICP wait ended by timeout.
    pub timed_out: bool,
    /// Do not store what came back (a `proxy_only` peer served it).
    pub proxy_only: bool,
}

/// Sends a request along its route: each hop in turn until one answers.
///
/// `retryable` requests (no body) move to the next hop when one fails; others get one try.
pub(crate) async fn forward(
    shared: &Shared,
    method: &Method,
    headers: &HeaderMap,
    target: &Target,
    mut body: Option<Incoming>,
    hierarchical: bool,
) -> Result<Forwarded, UpstreamError> {
    let route = if !shared.coop.has_peers() || target.directness == Directness::Always {
        Route::direct()
    } else {
        let search = shared.coop.route(&target.url, &target.host, hierarchical);
        tokio::pin!(search);
        Timed::new(
            search,
            &shared.metrics.efficiency,
            Source::Fixed(Category::Search),
        )
        .await
    };
    let route = if target.directness == Directness::Never {
        shared.coop.without_origin(route, &target.host)
    } else {
        route
    };
    if route.hops.is_empty() {
        return Err(UpstreamError::NoRoute {
            host: target.host.clone(),
        });
    }
    let mut last_error = None;
    let hops = route.hops.len();
    for (i, hop) in route.hops.iter().enumerate() {
        let last = i + 1 == hops || body.is_some();
        let (up_body, body_sent) = match body.take() {
            Some(b) => {
                let (up, sent) = UpBody::client_watched(b);
                (up, Some(sent))
            }
            None => (crate::upstream::no_body(), None),
        };
        match *hop {
            Hop::Direct => {
                let req = crate::target::upstream_request(
                    shared,
                    method.clone(),
                    headers,
                    target,
                    up_body,
                );
                match shared.upstream.send(&target.host, target.port, req).await {
                    Ok((response, lease)) => {
                        return Ok(Forwarded {
                            response,
                            lease,
                            hier: HierCode::Direct,
                            timed_out: route.timed_out,
                            proxy_only: false,
                        })
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            Hop::Peer { peer, code } => {
                let spec = shared.coop.spec(peer);
                if headers::via_contains(headers, &spec.name) {
                    // The request already passed through that peer: sending it back would loop.
                    continue;
                }
                let req = peer_request(
                    shared,
                    peer,
                    method,
                    headers,
                    target,
                    spec.role == Role::Sibling,
                    up_body,
                );
                let host = spec.http.ip().to_string();
                shared.coop.mesh().fetch_started(peer);
                // The peer has `peer_response_timeout` to answer once it has the whole request:
                // an upload that takes longer is the client's time, not a stalled peer.
                let stalled = async {
                    if let Some(sent) = body_sent {
                        let _ = sent.await;
                    }
                    tokio::time::sleep(shared.config.cooperation.peer_response_timeout).await;
                };
                let sent = tokio::select! {
                    sent = shared.upstream.send(&host, spec.http.port(), req) => Ok(sent),
                    () = stalled => Err(()),
                };
                match sent {
                    Ok(Ok((response, lease))) => {
                        shared.coop.fetch_result(peer, true);
                        let false_hit = match code {
                            HierCode::CdSiblingHit => {
                                response.status() == StatusCode::GATEWAY_TIMEOUT
                            }
                            HierCode::CdParentHit => response
                                .headers()
                                .get("x-cache")
                                .and_then(|v| v.to_str().ok())
                                .is_some_and(|v| v.starts_with("MISS")),
                            _ => false,
                        };
                        if false_hit {
                            if let Some(s) = shared.coop.summaries() {
                                s.false_hit(peer);
                            }
                        }
                        if spec.role == Role::Sibling
                            && response.status() == StatusCode::GATEWAY_TIMEOUT
                            && !last
                        {
                            // only-if-cached: the sibling no longer has it.
                            continue;
                        }
                        return Ok(Forwarded {
                            response,
                            lease,
                            hier: code,
                            timed_out: route.timed_out,
                            proxy_only: spec.proxy_only,
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::info!(peer = %spec.name, error = %e, "peer failed; trying the next hop");
                        shared.coop.fetch_result(peer, false);
                        last_error = Some(e);
                    }
                    Err(_) => {
                        tracing::warn!(peer = %spec.name, "peer stalled; trying the next hop");
                        shared.coop.fetch_result(peer, false);
                        last_error = Some(UpstreamError::ReadTimeout {
                            host: spec.name.clone(),
                        });
                    }
                }
            }
        }
        if last {
            break;
        }
    }
    if target.directness == Directness::Never {
        // Every peer failed, and the origin is not an option: 503, as for no peer at all.
        if let Some(e) = last_error {
            tracing::info!(url = %target.url, error = %e, "never_direct: every peer failed");
        }
        return Err(UpstreamError::NoRoute {
            host: target.host.clone(),
        });
    }
    Err(last_error.unwrap_or_else(|| UpstreamError::ReadTimeout {
        host: target.host.clone(),
    }))
}

/// A request to a peer: absolute-form, our Via, and `only-if-cached` for a sibling.
fn peer_request(
    shared: &Shared,
    peer: PeerId,
    method: &Method,
    headers: &HeaderMap,
    target: &Target,
    sibling: bool,
    body: UpBody,
) -> Request<UpBody> {
    let mut req = crate::target::upstream_request(shared, method.clone(), headers, target, body);
    *req.uri_mut() = target.url.parse().unwrap_or_else(|_| Uri::from_static("/"));
    *req.version_mut() = Version::HTTP_11;
    if sibling {
        req.headers_mut().append(
            header::CACHE_CONTROL,
            HeaderValue::from_static("only-if-cached"),
        );
    }
    if let Some(credentials) = passed_credentials(shared, peer, headers) {
        req.headers_mut()
            .insert(header::PROXY_AUTHORIZATION, credentials.clone());
    }
    req
}

/// The client's `Proxy-Authorization`, when `peer` is configured with `login = "pass"`.
pub(crate) fn passed_credentials<'h>(
    shared: &Shared,
    peer: PeerId,
    headers: &'h HeaderMap,
) -> Option<&'h HeaderValue> {
    let login = shared.config.peers.get(peer.0).and_then(|p| p.login);
    match login {
        Some(crate::config::PeerLogin::Pass) => headers.get(header::PROXY_AUTHORIZATION),
        None => None,
    }
}
