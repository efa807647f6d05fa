//! What happens to one request: the request lifecycle.
//!
//! ```text
//! http.allow ─► target (absolute-URI, host:port for CONNECT, or origin-form in accelerator
//!   │            mode) ─► access rules (access.rs) ─► CONNECT? ─► tunnel
//!   ▼ framing and loop checks
//!   │
//!   ├─ PURGE ─► an access rule names it? ─────► remove: 200 (or 404); else 403
//!   ├─ GET/HEAD the cache rules deny ─────────► relay, never stored (fwd=bypass)
//!   ├─ GET/HEAD ─► lookup ─ fresh ─────────────► serve from store (304 / 206 / 200)
//!   │                 ├─ stale, may serve ─────► serve, refresh in background
//!   │                 ├─ stale ────────────────► conditional request ─► 304: refresh, serve
//!   │                 │                                            └─► 200: relay and store
//!   │                 └─ miss ─► collapse ─────► one upstream fetch, relayed and captured
//!   └─ other methods ─► relay; a success invalidates the URL
//!                         └─ POST naming its own URL, fresh ─► stored as that URL's GET
//! ```
//!
//! Every "serve" of a stored object goes through `serve_hit`: the document's applet, if it has
//! one, decides first (serve it, serve what the applet built, or fetch as a miss).
//!
//! Every path ends in a response whose body finishes the [`Transaction`]: one log line.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{request, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use meshcache_applet::Built;
use meshcache_store::InvalidateCause;

use crate::access::{Denial, Verdict};
use crate::applets::{self, Gate};
use crate::body::{Capture, ProxyBody, Relay, Spill, Transaction};
use crate::cache::{CachedObject, Collapse, FetchGuard, Found, Tier};
use crate::config::ForwardedFor;
use crate::decide::{Facts, Requester, Subject};
use crate::directives::RequestDirectives;
use crate::error::UpstreamError;
use crate::forward::{self, Forwarded};
use crate::guard::ViolationSlot;
use crate::headers::{self, parse_range, RangeRequest};
use crate::interim::InterimRelay;
use crate::outcome::ResultCode;
use crate::ranges::{self, PieceHead};
use crate::refusal::refuse;
use crate::routing::Directness;
use crate::semantics::{self, ConditionalHit, Freshness, Usability};
use crate::stamps::{add_via, add_via_received, head_size, made_response, X_CACHE};
use crate::storable::{self, Policy};
use crate::target::{same_origin_url, Target};
use crate::{tunnel, Shared};

static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Handles one request. Never fails: every problem becomes a response.
///
/// The paths beyond a plain hit (fetching, revalidating, tunnels, applets) are awaited as boxed
/// futures, so the future every request carries is 3 KB instead of 7.9 KB (measured with
/// `size_of_val`): that is the memory an in-flight request holds, and what is moved when it
/// starts.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    client: SocketAddr,
    allowed: bool,
    violation: ViolationSlot,
    relay: Option<InterimRelay>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let target = Target::of(&parts.uri, shared.config.http.accelerate.as_deref());
    let url = match &target {
        Ok(t) => t.url.clone(),
        Err(_) => parts.uri.to_string(),
    };
    let txn = Transaction::new(shared.clone(), client.ip(), parts.method.clone(), url);
    if !allowed {
        return Ok(refuse(
            &shared,
            txn,
            StatusCode::FORBIDDEN,
            ResultCode::TcpDenied,
            "access-denied",
            "access denied: your address is not allowed to use this proxy",
        ));
    }
    let target_len = parts.uri.authority().map_or(0, |a| a.as_str().len())
        + parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
    let head_bytes = target_len
        + parts
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if head_bytes as u64 > shared.config.http.max_header_bytes {
        return Ok(refuse(
            &shared,
            txn,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ResultCode::NoneNone,
            "request-too-large",
            "the request head is larger than http.max_header_bytes",
        ));
    }
    let internal_url = crate::coop::summary::internal(&shared.config, &parts.uri)
        .filter(|_| parts.method == Method::GET || parts.method == Method::HEAD);
    let mut txn = txn;
    let admitted = admit(&shared, &mut txn, &parts, &target, internal_url.is_some()).await;
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(denial) => {
            tracing::debug!(%client, url = %parts.uri, reason = %denial.reason(), "request denied");
            let mut response = refuse(
                &shared,
                txn,
                denial.status(),
                ResultCode::TcpDenied,
                denial.token(),
                &denial.reason(),
            );
            if let (Denial::AuthRequired(_), Some(auth)) = (&denial, &shared.auth) {
                if let Ok(challenge) = HeaderValue::from_str(auth.challenge()) {
                    response
                        .headers_mut()
                        .insert(header::PROXY_AUTHENTICATE, challenge);
                }
            }
            return Ok(response);
        }
    };
    if let Some(which) = internal_url {
        let head = parts.method == Method::HEAD;
        return Ok(internal(&shared, txn, which, &parts.headers, head));
    }
    if parts.method == Method::CONNECT {
        return Ok(Box::pin(tunnel::connect(shared, txn, parts, admitted.directness)).await);
    }
    // Content-Length with Transfer-Encoding never gets here: hyper reads such a body as chunked,
    // drops the length and closes the connection after the response (RFC 9112 §6.3).
    let mut target = match target {
        Ok(t) => t,
        Err((status, token, reason)) => {
            return Ok(refuse(
                &shared,
                txn,
                status,
                ResultCode::NoneNone,
                token,
                &reason,
            ))
        }
    };
    target.directness = admitted.directness;
    target.received = parts.version;
    target.interim = relay;
    if headers::via_contains(&parts.headers, &shared.config.name)
        || headers::via_hops(&parts.headers) > headers::MAX_VIA_HOPS
    {
        return Ok(refuse(
            &shared,
            txn,
            StatusCode::LOOP_DETECTED,
            ResultCode::TcpDenied,
            "forwarding-loop",
            "forwarding loop detected: this request already passed through this proxy, or through too many",
        ));
    }
    let response = if parts.method == Method::GET || parts.method == Method::HEAD {
        if admitted.caches {
            cached(&shared, txn, parts, target).await
        } else {
            Box::pin(bypass(&shared, txn, parts, target)).await
        }
    } else if parts.method.as_str() == "PURGE" {
        purge(&shared, txn, admitted.purge, &target)
    } else {
        Box::pin(pass_through(&shared, txn, parts, body, target, &violation)).await
    };
    Ok(response)
}

/// Marks a request the cache rules keep out of the cache: fetched, relayed, never stored.
#[derive(Clone, Copy, Debug)]
struct Bypass;

/// A GET or HEAD that the cache rules keep out of the cache (Squid's `cache deny`): not looked
/// up, not collapsed with others, not stored (`Cache-Status: NAME; fwd=bypass`), and not asked
/// of siblings; `only-if-cached` gets 504.
async fn bypass(
    shared: &Arc<Shared>,
    txn: Transaction,
    mut parts: request::Parts,
    target: Target,
) -> Response<ProxyBody> {
    if RequestDirectives::parse(&parts.headers).only_if_cached {
        return refuse(
            shared,
            txn,
            StatusCode::GATEWAY_TIMEOUT,
            ResultCode::TcpMiss,
            "only-if-cached",
            "only-if-cached: the cache rules keep this URL out of the cache",
        );
    }
    parts.extensions.insert(Bypass);
    Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await
}

/// PURGE: removes the stored response for the URL (every variant, memory and disks) and
/// answers 200, or 404 when nothing was stored, both without a body and logged `TCP_MISS`, as
/// Squid. Only an `[[access]]` rule that allows the request and names the method `PURGE`
/// allows it; otherwise 403 (`TCP_DENIED`).
fn purge(shared: &Shared, txn: Transaction, allowed: bool, target: &Target) -> Response<ProxyBody> {
    if !allowed {
        return refuse(
            shared,
            txn,
            StatusCode::FORBIDDEN,
            ResultCode::TcpDenied,
            "access-denied",
            "PURGE is allowed only by an [[access]] rule that allows it and names method PURGE",
        );
    }
    let held = shared.cache.contains(&target.url);
    shared
        .cache
        .invalidate(&target.url, InvalidateCause::Explicit);
    let status = if held {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    };
    let mut headers = HeaderMap::with_capacity(2);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
    add_via(shared, &mut headers);
    made_response(
        txn,
        ResultCode::TcpMiss,
        status,
        headers,
        ProxyBody::full(Bytes::new()),
    )
}

/// The request headers to forward for `client`: `X-Forwarded-For` as `http.forwarded_for`
/// says (borrowed as they are when it is `transparent`).
fn outgoing<'a>(
    shared: &Shared,
    headers: &'a HeaderMap,
    client: std::net::IpAddr,
) -> std::borrow::Cow<'a, HeaderMap> {
    let mode = shared.config.http.forwarded_for;
    if mode == ForwardedFor::Transparent {
        return std::borrow::Cow::Borrowed(headers);
    }
    let mut owned = headers.clone();
    headers::forwarded_for(&mut owned, mode, client);
    std::borrow::Cow::Owned(owned)
}

/// The freshness of a response to a GET of `url` with `request` headers (see
/// [`storable::assess`]), under the refresh pattern that matches it and the node's targeted
/// cache-control fields. Callers store only what answers a GET; a HEAD's or a POST's response
/// is assessed as the GET response it stands for.
fn freshness_of(
    shared: &Shared,
    request: &HeaderMap,
    url: &str,
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<Freshness> {
    storable::assess(
        request,
        &Method::GET,
        status,
        headers,
        now,
        &Policy {
            heuristic_fraction: shared.config.cache.heuristic_fraction,
            refresh: shared.caching.refresh(url),
            targeted: shared.caching.targeted(),
        },
    )
}

/// The access rules' answer for a request (see [`crate::access`]), and where the routing rules
/// let it go ([`crate::routing`]). A request whose target is malformed passes here: it is
/// refused for that right after.
async fn admit(
    shared: &Shared,
    txn: &mut Transaction,
    parts: &request::Parts,
    target: &Result<Target, (StatusCode, &'static str, String)>,
    internal: bool,
) -> Result<Admitted, Denial> {
    let method = parts.method.as_str();
    if parts.method == Method::CONNECT {
        let Some((authority, port)) = parts.uri.authority().and_then(|a| Some((a, a.port_u16()?)))
        else {
            return Ok(Admitted::default());
        };
        let host = authority.host().to_ascii_lowercase();
        let subject = Subject {
            host: &host,
            port,
            scheme: None,
            url: authority.as_str(),
            method,
            forwarded: true,
        };
        return admit_subject(shared, txn, parts, &subject).await;
    }
    let Ok(target) = target else {
        return Ok(Admitted::default());
    };
    let subject = Subject {
        host: &target.host,
        port: target.port,
        scheme: Some("http"),
        url: &target.url,
        method,
        // Accelerated requests go to the origin the operator configured.
        forwarded: !internal && parts.uri.scheme().is_some(),
    };
    admit_subject(shared, txn, parts, &subject).await
}

/// The access and routing rules for one subject; the user the credentials named, if a rule
/// asked, goes to the log.
async fn admit_subject(
    shared: &Shared,
    txn: &mut Transaction,
    parts: &request::Parts,
    subject: &Subject<'_>,
) -> Result<Admitted, Denial> {
    let resolver = shared.upstream.resolver();
    let who = Requester {
        addr: txn.client(),
        credentials: parts
            .headers
            .get(header::PROXY_AUTHORIZATION)
            .map(HeaderValue::as_bytes),
        auth: shared.auth.as_deref(),
    };
    let mut facts = Facts::default();
    let verdict = shared
        .access
        .check(resolver, who, subject, &mut facts)
        .await;
    let result = match verdict {
        Verdict::Deny(denial) => Err(denial),
        Verdict::Allow => {
            let directness = if subject.forwarded {
                shared
                    .routing
                    .directness(resolver, who, subject, &mut facts)
                    .await
            } else {
                Directness::Either
            };
            let caches = match subject.method {
                "GET" | "HEAD" => {
                    shared
                        .caching
                        .caches(resolver, who, subject, &mut facts)
                        .await
                }
                _ => true,
            };
            Ok(Admitted {
                directness,
                caches,
                purge: subject.method == "PURGE" && shared.access.allows_purge(&facts),
            })
        }
    };
    txn.user = facts.named;
    result
}

/// What the rules decided for a request they let in.
#[derive(Clone, Copy, Debug)]
struct Admitted {
    /// Where it may go (routing rules).
    directness: Directness,
    /// Whether it may use the cache (cache rules; GET and HEAD).
    caches: bool,
    /// Whether it is a PURGE the access rules allow.
    purge: bool,
}

impl Default for Admitted {
    /// A request no rule list looked at: anywhere, cached, no PURGE.
    fn default() -> Self {
        Self {
            directness: Directness::Either,
            caches: true,
            purge: false,
        }
    }
}

/// GET and HEAD: the cache path.
async fn cached(
    shared: &Arc<Shared>,
    txn: Transaction,
    parts: request::Parts,
    target: Target,
) -> Response<ProxyBody> {
    let mut directives = RequestDirectives::parse(&parts.headers);
    if shared
        .caching
        .refresh(&target.url)
        .is_some_and(|r| r.ignore_reload)
    {
        directives.ignore_reload();
    }
    let now = SystemTime::now();
    if let Some(found) = shared.cache.find(&target.url, &parts.headers).await {
        match found.object().freshness.usability(&directives, now) {
            Usability::Fresh | Usability::StaleAllowed => {
                let (code, detail) = hit_of(shared, &found, "hit", "hit; detail=disk");
                return serve_hit(
                    shared,
                    txn,
                    parts,
                    target,
                    found.object(),
                    code,
                    now,
                    detail,
                )
                .await;
            }
            Usability::StaleWhileRevalidate => {
                refresh_in_background(
                    shared.clone(),
                    txn.client(),
                    parts.headers.clone(),
                    target.clone(),
                    found.clone(),
                );
                return serve_hit(
                    shared,
                    txn,
                    parts,
                    target,
                    found.object(),
                    ResultCode::TcpStaleHit,
                    now,
                    "hit; fwd=stale",
                )
                .await;
            }
            Usability::MustValidate if directives.only_if_cached => {
                return refuse(
                    shared,
                    txn,
                    StatusCode::GATEWAY_TIMEOUT,
                    ResultCode::TcpMiss,
                    "only-if-cached",
                    "only-if-cached: the stored response is stale",
                );
            }
            Usability::MustValidate if parts.method == Method::GET => {
                return Box::pin(revalidate(shared, txn, parts, target, found)).await;
            }
            Usability::MustValidate => {
                return Box::pin(freshen_with_head(shared, txn, parts, target, found)).await;
            }
        }
    }
    // Pieces kept from 206s: a range inside one is served; a GET for the whole completes a
    // held prefix with a range request for the rest.
    if parts.method == Method::GET {
        if let Some(partial) = shared.cache.partial(&target.url) {
            if parts.headers.contains_key(header::RANGE) {
                let usable = matches!(
                    partial.freshness.usability(&directives, now),
                    Usability::Fresh | Usability::StaleAllowed
                );
                if let Some(object) = usable
                    .then(|| ranges::from_piece(&parts.headers, &partial))
                    .flatten()
                {
                    return serve_stored(
                        shared,
                        txn,
                        &parts,
                        &object,
                        ResultCode::TcpMemHit,
                        now,
                        "hit; detail=partial",
                    );
                }
            } else if partial.prefix().is_some()
                && !directives.only_if_cached
                && !directives.no_store
                && !parts.headers.contains_key(header::IF_NONE_MATCH)
                && !parts.headers.contains_key(header::IF_MODIFIED_SINCE)
            {
                return Box::pin(complete(shared, txn, parts, target, partial)).await;
            }
        }
    }
    if directives.only_if_cached {
        return refuse(
            shared,
            txn,
            StatusCode::GATEWAY_TIMEOUT,
            ResultCode::TcpMiss,
            "only-if-cached",
            "only-if-cached: not in the cache",
        );
    }
    let collapsible = parts.method == Method::GET
        && !directives.no_store
        && !parts.headers.contains_key(header::RANGE)
        && !parts.headers.contains_key(header::IF_NONE_MATCH)
        && !parts.headers.contains_key(header::IF_MODIFIED_SINCE);
    if !collapsible {
        return Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
    }
    match shared.cache.collapse(&target.url) {
        Collapse::Leader(guard) => {
            Box::pin(fetch(
                shared,
                txn,
                parts,
                target,
                Some(guard),
                ResultCode::TcpMiss,
            ))
            .await
        }
        Collapse::Follower(mut done) => {
            shared.metrics.collapsed.fetch_add(1, Relaxed);
            let _ =
                tokio::time::timeout(shared.config.cache.collapse_timeout, done.changed()).await;
            let now = SystemTime::now();
            if let Some(found) = shared.cache.find(&target.url, &parts.headers).await {
                if matches!(
                    found.object().freshness.usability(&directives, now),
                    Usability::Fresh | Usability::StaleAllowed
                ) {
                    let (code, detail) = hit_of(
                        shared,
                        &found,
                        "hit; detail=collapsed",
                        "hit; detail=collapsed",
                    );
                    return serve_hit(
                        shared,
                        txn,
                        parts,
                        target,
                        found.object(),
                        code,
                        now,
                        detail,
                    )
                    .await;
                }
            }
            Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await
        }
    }
}

/// The result code and `Cache-Status` words of a fresh hit on `found`: Squid's `TCP_MEM_HIT`
/// from memory, `TCP_HIT` from a disk (counted in the disk's figures).
fn hit_of(
    shared: &Shared,
    found: &Found,
    memory: &'static str,
    disk: &'static str,
) -> (ResultCode, &'static str) {
    shared.cache.count_hit(found);
    match found.tier {
        Tier::Memory => (ResultCode::TcpMemHit, memory),
        Tier::Disk(_) => (ResultCode::TcpHit, disk),
    }
}

/// A hit: the document's applet, if it has one, runs first and decides whether the stored copy
/// is served, a response it built, or the request goes to the origin as a miss.
#[allow(clippy::too_many_arguments)]
async fn serve_hit(
    shared: &Arc<Shared>,
    txn: Transaction,
    mut parts: request::Parts,
    target: Target,
    object: &CachedObject,
    code: ResultCode,
    now: SystemTime,
    status_detail: &str,
) -> Response<ProxyBody> {
    if shared.applets.is_none() {
        return serve_stored(shared, txn, &parts, object, code, now, status_detail);
    }
    let client = txn.client();
    let gate = match applets::on_hit(shared, &mut parts, &target.url, client, object) {
        Some(gate) => gate,
        // Boxed: fetching a module is a large future, made only when the module must be
        // fetched (a document's first hits, and once its TTL has passed) or has failed to be.
        None => {
            Box::pin(applets::on_hit_fetching(
                shared,
                &mut parts,
                &target.url,
                client,
                object,
            ))
            .await
        }
    };
    match gate {
        Gate::Serve => serve_stored(shared, txn, &parts, object, code, now, status_detail),
        Gate::Built(built) => serve_built(shared, txn, &parts, built, code),
        Gate::Origin(why) => {
            let mut resp =
                Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
            let h = resp.headers_mut();
            if let Some(v) = h.get(&CACHE_STATUS).and_then(|v| v.to_str().ok()) {
                if let Ok(v) = HeaderValue::from_str(&format!("{v}; detail={why}")) {
                    h.insert(CACHE_STATUS.clone(), v);
                }
            }
            resp
        }
    }
}

/// Sends the response an applet built for a hit.
fn serve_built(
    shared: &Shared,
    txn: Transaction,
    req: &request::Parts,
    built: Built,
    code: ResultCode,
) -> Response<ProxyBody> {
    let body_len = built.body_len();
    let mut headers = HeaderMap::with_capacity(built.headers.len() + 5);
    for (n, v) in built.headers {
        headers.append(n, v);
    }
    let bodiless = matches!(built.status.as_u16(), 204 | 304) || req.method == Method::HEAD;
    if !matches!(built.status.as_u16(), 204 | 304) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    add_via(shared, &mut headers);
    headers.insert(X_CACHE.clone(), shared.x_cache_hit.clone());
    if let Some(v) = &shared.applet_built_status {
        headers.insert(CACHE_STATUS.clone(), v.clone());
    }
    let body = if bodiless {
        ProxyBody::empty()
    } else {
        ProxyBody::parts(built.parts)
    };
    made_response(txn, code, built.status, headers, body)
}

/// Sends a stored object: 304 for a matching conditional, 206/416 for a range, else 200.
fn serve_stored(
    shared: &Shared,
    txn: Transaction,
    req: &request::Parts,
    object: &CachedObject,
    mut code: ResultCode,
    now: SystemTime,
    status_detail: &str,
) -> Response<ProxyBody> {
    let stored = object.header_map();
    let mut status = object.status;
    let mut headers;
    let mut body = object.body.clone();
    if let Some(hit) = semantics::client_not_modified(&req.headers, &stored) {
        if matches!(code, ResultCode::TcpMemHit | ResultCode::TcpHit) {
            code = match hit {
                ConditionalHit::IfNoneMatch => ResultCode::TcpInmHit,
                ConditionalHit::IfModifiedSince => ResultCode::TcpImsHit,
            };
        }
        status = StatusCode::NOT_MODIFIED;
        headers = semantics::not_modified_headers(&stored);
        body = Bytes::new();
    } else {
        headers = stored;
        let len = body.len() as u64;
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        let if_range_ok = req
            .headers
            .get(header::IF_RANGE)
            .is_none_or(|v| Some(v) == object.header(&header::ETAG));
        if let (Some(range), true, true) = (
            req.headers.get(header::RANGE),
            object.status == StatusCode::OK,
            if_range_ok,
        ) {
            match parse_range(range, len) {
                RangeRequest::Whole => {}
                RangeRequest::Partial(r) => {
                    status = StatusCode::PARTIAL_CONTENT;
                    body = body.slice(r.start as usize..=r.end as usize);
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len() as u64));
                    if let Ok(v) =
                        HeaderValue::from_str(&format!("bytes {}-{}/{len}", r.start, r.end))
                    {
                        headers.insert(header::CONTENT_RANGE, v);
                    }
                }
                RangeRequest::Unsatisfiable => {
                    status = StatusCode::RANGE_NOT_SATISFIABLE;
                    body = Bytes::new();
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
                    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                        headers.insert(header::CONTENT_RANGE, v);
                    }
                }
            }
        }
    }
    headers.insert(header::AGE, HeaderValue::from(object.freshness.age(now)));
    add_via(shared, &mut headers);
    headers.insert(X_CACHE.clone(), shared.x_cache_hit.clone());
    // Built by hand rather than with `format!`: this runs on every hit.
    let mut cache_status = String::with_capacity(shared.config.name.len() + 40);
    for part in [
        shared.config.name.as_str(),
        "; ",
        status_detail,
        "; ttl=",
        itoa::Buffer::new().format(object.freshness.ttl(now)),
    ] {
        cache_status.push_str(part);
    }
    if let Ok(v) = HeaderValue::from_str(&cache_status) {
        headers.insert(CACHE_STATUS.clone(), v);
    }
    if req.method == Method::HEAD {
        body = Bytes::new();
    }
    made_response(txn, code, status, headers, ProxyBody::full(body))
}

/// Fetches from upstream and relays; a storable GET response is captured for the store.
async fn fetch(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    target: Target,
    guard: Option<FetchGuard>,
    code: ResultCode,
) -> Response<ProxyBody> {
    // What the log says if the client leaves before the answer (`TCP_MISS_ABORTED/000`).
    txn.result = code;
    let now = SystemTime::now();
    let hierarchical = parts.method == Method::GET
        && !RequestDirectives::parse(&parts.headers).no_cache
        && !parts.headers.contains_key(header::AUTHORIZATION)
        && parts.extensions.get::<Bypass>().is_none();
    let sent = outgoing(shared, &parts.headers, txn.client());
    match forward::forward(shared, &parts.method, &sent, &target, None, hierarchical).await {
        Ok(fwd) => relay_response(shared, txn, &parts, &target, fwd, guard, code, now),
        Err(e) => upstream_failed(shared, txn, e),
    }
}

/// A HEAD for a stored GET response that must be validated: the HEAD goes upstream and is
/// relayed; a 200 whose validators and length agree with the stored response freshens it (its
/// fields merged as a 304's would be), one that disagrees invalidates it (RFC 9111 §4.3.5).
async fn freshen_with_head(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    target: Target,
    found: Found,
) -> Response<ProxyBody> {
    txn.result = ResultCode::TcpMiss;
    let sent = outgoing(shared, &parts.headers, txn.client());
    let result = forward::forward(shared, &Method::HEAD, &sent, &target, None, false).await;
    drop(sent);
    let fwd = match result {
        Ok(fwd) => fwd,
        Err(e) => return upstream_failed(shared, txn, e),
    };
    let now = SystemTime::now();
    if fwd.response.status() == StatusCode::OK {
        let object = found.object();
        let stored = object.header_map();
        let head = fwd.response.headers();
        let same_length = head
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_none_or(|n| n == object.body.len() as u64);
        let merged = (same_length && semantics::not_modified_matches(&stored, head))
            .then(|| semantics::merge_not_modified(&stored, head));
        let refreshed = merged.and_then(|merged| {
            let f = freshness_of(
                shared,
                &parts.headers,
                &target.url,
                object.status,
                &merged,
                now,
            )?;
            Some(CachedObject::new(
                object.status,
                &merged,
                object.body.clone(),
                f,
            ))
        });
        match refreshed {
            Some(object) => shared.cache.insert(&target.url, &parts.headers, object),
            None => shared.cache.invalidate(&target.url, InvalidateCause::Stale),
        }
    }
    relay_response(
        shared,
        txn,
        &parts,
        &target,
        fwd,
        None,
        ResultCode::TcpMiss,
        now,
    )
}

/// A GET for the whole of a representation the cache holds a prefix of: upstream is asked
/// for the rest (`Range: bytes=L-`, `If-Range`); a 206 that completes the prefix makes the
/// whole, which is stored and served (`Cache-Status: fwd=partial`). A 200 (the representation
/// changed) is relayed and stored as any miss; a 206 that does not complete it is dropped and
/// the whole fetched plainly.
async fn complete(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    target: Target,
    partial: crate::cache::partial::Partial,
) -> Response<ProxyBody> {
    txn.result = ResultCode::TcpMiss;
    let Some(prefix) = partial.prefix().cloned() else {
        return Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
    };
    let held = prefix.len() as u64;
    let asked = ranges::rest_request(&parts.headers, &partial, held);
    let sent = outgoing(shared, &asked, txn.client());
    let result = forward::forward(shared, &Method::GET, &sent, &target, None, false).await;
    drop(sent);
    let fwd = match result {
        Ok(fwd) => fwd,
        Err(e) => return upstream_failed(shared, txn, e),
    };
    txn.hierarchy = fwd.hier;
    txn.peer = fwd.lease.peer().map(|ip| ip.to_string());
    let now = SystemTime::now();
    let status = fwd.response.status();
    let head =
        PieceHead::of(status, fwd.response.headers()).filter(|h| h.completes(&partial, held));
    let Some(head) = head else {
        if status == StatusCode::PARTIAL_CONTENT {
            return Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
        }
        return relay_response(
            shared,
            txn,
            &parts,
            &target,
            fwd,
            None,
            ResultCode::TcpMiss,
            now,
        );
    };
    let Forwarded {
        response, lease, ..
    } = fwd;
    let (mut rparts, body) = response.into_parts();
    headers::strip_hop_by_hop(&mut rparts.headers);
    let limit = head.len().min(shared.config.store.max_object_size) as usize;
    let Ok(rest) = Limited::new(body, limit).collect().await else {
        // The rest broke off: the client still gets the whole, fetched plainly.
        return Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
    };
    lease.release();
    let fresh = freshness_of(
        shared,
        &parts.headers,
        &target.url,
        StatusCode::OK,
        &rparts.headers,
        now,
    );
    let object = ranges::whole(
        &prefix,
        &rest.to_bytes(),
        &head,
        fresh.unwrap_or(partial.freshness),
    );
    if object.body.len() as u64 != partial.total {
        return Box::pin(fetch(shared, txn, parts, target, None, ResultCode::TcpMiss)).await;
    }
    let detail = if fresh.is_some() {
        let copy = CachedObject::from_parts(
            object.status,
            object.headers.clone(),
            object.body.clone(),
            object.freshness,
        );
        shared.cache.insert(&target.url, &parts.headers, copy);
        "fwd=partial; stored"
    } else {
        "fwd=partial"
    };
    let mut resp = serve_stored(
        shared,
        txn,
        &parts,
        &object,
        ResultCode::TcpMiss,
        now,
        detail,
    );
    resp.headers_mut()
        .insert(X_CACHE.clone(), shared.x_cache_miss.clone());
    resp
}

/// Relays an upstream response to the client, capturing it for the store when allowed: only
/// when `req` is a GET (a POST whose response may answer GETs comes as its GET view).
#[allow(clippy::too_many_arguments)]
fn relay_response(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    req: &request::Parts,
    target: &Target,
    fwd: Forwarded,
    guard: Option<FetchGuard>,
    code: ResultCode,
    now: SystemTime,
) -> Response<ProxyBody> {
    let Forwarded {
        response,
        lease,
        hier,
        timed_out,
        proxy_only,
        ..
    } = fwd;
    let (mut rparts, incoming) = response.into_parts();
    let received = rparts.version;
    // We send our own HTTP-version, not the origin's (RFC 9110 §6.2): the server would
    // otherwise write the received version into the status line, and an HTTP/1.0 origin's
    // answer would tell an HTTP/1.1 client this hop speaks 1.0 only.
    rparts.version = Version::HTTP_11;
    txn.hierarchy = hier;
    txn.timed_out = timed_out;
    txn.peer = lease.peer().map(|ip| ip.to_string());
    headers::strip_hop_by_hop(&mut rparts.headers);
    let directives = RequestDirectives::parse(&req.headers);
    // A Range request's answer is stored only when it is the whole representation (an origin
    // may ignore Range and send 200): a 206 is a part, which this store does not keep.
    let partial = req.headers.contains_key(header::RANGE) && rparts.status != StatusCode::OK;
    let bypass = req.extensions.get::<Bypass>().is_some();
    let freshness = if proxy_only
        || bypass
        || directives.no_store
        || partial
        || !applets::admit(shared, &target.url, &rparts.headers)
    {
        None
    } else {
        freshness_of(
            shared,
            &req.headers,
            &target.url,
            rparts.status,
            &rparts.headers,
            now,
        )
    };
    let expected = rparts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let fits = expected.is_none_or(|n| n <= shared.config.store.max_object_size);
    let mut detail = if bypass {
        "fwd=bypass"
    } else if code == ResultCode::TcpMiss {
        "fwd=uri-miss"
    } else {
        "fwd=stale"
    }
    .to_owned();
    // A 206 that can be combined with other pieces of its representation is kept as one.
    let piece = (partial
        && rparts.status == StatusCode::PARTIAL_CONTENT
        && req.method == Method::GET
        && !(proxy_only || bypass || directives.no_store)
        && fits)
        .then(|| PieceHead::of(rparts.status, &rparts.headers))
        .flatten()
        .filter(|_| applets::admit(shared, &target.url, &rparts.headers))
        .and_then(|head| {
            let f = freshness_of(
                shared,
                &req.headers,
                &target.url,
                StatusCode::OK,
                &rparts.headers,
                now,
            )?;
            Some((head, f))
        });
    let capture = match freshness {
        _ if piece.is_some() => piece.map(|(head, f)| {
            detail.push_str("; stored");
            drop(guard);
            let cache = shared.cache.clone();
            let url = target.url.clone();
            let sink = Box::new(move |body: Bytes, _guard: Option<FetchGuard>| {
                if let Some(piece) = head.piece(body, f) {
                    cache.keep_partial(&url, piece);
                }
            });
            Capture::new(
                shared.config.store.max_object_size,
                shared.cache.memory_limit(),
                expected,
                sink,
                None,
                None,
            )
        }),
        Some(f) if fits && req.method == Method::GET => {
            detail.push_str("; stored");
            let cache = shared.cache.clone();
            let url = target.url.clone();
            let req_headers = req.headers.clone();
            let (status, head) = (rparts.status, rparts.headers.clone());
            let spill: Option<Spill> = cache.has_disks().then(|| {
                let (cache, url, req_headers, head) = (
                    cache.clone(),
                    url.clone(),
                    req_headers.clone(),
                    head.clone(),
                );
                Box::new(move || cache.stream(&url, &req_headers, status, &head, f, expected))
                    as Spill
            });
            let sink = Box::new(move |body: Bytes, guard: Option<FetchGuard>| {
                cache.insert_guarded(
                    &url,
                    &req_headers,
                    CachedObject::new(status, &head, body, f),
                    guard,
                );
            });
            Some(Capture::new(
                shared.config.store.max_object_size,
                shared.cache.memory_limit(),
                expected,
                sink,
                spill,
                guard,
            ))
        }
        _ => {
            // Not storable: a stored copy is outdated now if the origin no longer allows one.
            if code != ResultCode::TcpMiss
                && req.method == Method::GET
                && rparts.status != StatusCode::NOT_MODIFIED
            {
                shared.cache.invalidate(&target.url, InvalidateCause::Stale);
            }
            drop(guard);
            None
        }
    };
    if req.method == Method::GET {
        if let Some(d) = shared.coop.directory() {
            // Optimistic directory entries for what we will not hold are taken back.
            d.fetch_done(
                &shared.coop,
                meshcache_store::StoreKey::get(&target.url).0,
                capture.is_some(),
            );
        }
    }
    let _ = write!(detail, "; fwd-status={}", rparts.status.as_u16());
    add_via_received(shared, &mut rparts.headers, received);
    rparts
        .headers
        .append(X_CACHE.clone(), shared.x_cache_miss.clone());
    if let Ok(v) = HeaderValue::from_str(&format!("{}; {detail}", shared.config.name)) {
        // Each cache on the path adds its own entry (RFC 9211 §2), as Squid does for X-Cache.
        rparts.headers.append(CACHE_STATUS.clone(), v);
    }
    txn.result = code;
    txn.status = rparts.status.as_u16();
    txn.content_type = rparts.headers.get(header::CONTENT_TYPE).cloned();
    txn.head_bytes = head_size(&rparts.headers);
    Response::from_parts(
        rparts,
        ProxyBody::relay(Relay::new(incoming, capture, lease)).with_transaction(txn),
    )
}

use std::fmt::Write as _;

/// A stale object: ask upstream with validators. 304 refreshes it; anything else replaces it.
async fn revalidate(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    target: Target,
    found: Found,
) -> Response<ProxyBody> {
    txn.result = ResultCode::TcpRefreshModified;
    let object = found.object();
    let stored = object.header_map();
    let mut client_headers = parts.headers.clone();
    client_headers.remove(header::IF_NONE_MATCH);
    client_headers.remove(header::IF_MODIFIED_SINCE);
    client_headers.remove(header::RANGE);
    client_headers.remove(header::IF_RANGE);
    semantics::add_validators(&mut client_headers, &stored);
    let sent = outgoing(shared, &client_headers, txn.client());
    let result = forward::forward(shared, &Method::GET, &sent, &target, None, false).await;
    drop(sent);
    let now_after = SystemTime::now();
    if let Ok(fwd) = &result {
        txn.hierarchy = fwd.hier;
        txn.peer = fwd.lease.peer().map(|ip| ip.to_string());
    }
    // Upstream failed (no answer, or a 5xx) within stale-if-error: the stored copy is served.
    let failed = result
        .as_ref()
        .map_or(true, |fwd| fwd.response.status().is_server_error());
    if failed && object.freshness.stale_if_error_allows(now_after) {
        return serve_hit(
            shared,
            txn,
            parts,
            target,
            object,
            ResultCode::TcpRefreshFailOld,
            now_after,
            "hit; fwd=stale; detail=stale-if-error",
        )
        .await;
    }
    match result {
        Ok(fwd)
            if fwd.response.status() == StatusCode::NOT_MODIFIED
                && semantics::not_modified_matches(&stored, fwd.response.headers()) =>
        {
            let merged = semantics::merge_not_modified(&stored, fwd.response.headers());
            fwd.lease.release();
            let refreshed = match freshness_of(
                shared,
                &parts.headers,
                &target.url,
                object.status,
                &merged,
                now_after,
            ) {
                Some(f) => {
                    let obj = CachedObject::new(object.status, &merged, object.body.clone(), f);
                    shared.cache.insert(&target.url, &parts.headers, obj);
                    match shared.cache.find(&target.url, &parts.headers).await {
                        Some(found) => found,
                        // Not found at once (on its way to a disk): the merged head is served.
                        None => Found::detached(
                            found.key,
                            CachedObject::new(object.status, &merged, object.body.clone(), f),
                        ),
                    }
                }
                None => {
                    shared
                        .cache
                        .invalidate(&target.url, InvalidateCause::NoStore);
                    found
                }
            };
            serve_hit(
                shared,
                txn,
                parts,
                target,
                refreshed.object(),
                ResultCode::TcpRefreshUnmodified,
                now_after,
                "fwd=stale; fwd-status=304",
            )
            .await
        }
        Ok(fwd) => {
            let mut req_parts = parts;
            req_parts.headers = client_headers;
            // The client's own conditionals were replaced by ours; it gets the full response.
            relay_response(
                shared,
                txn,
                &req_parts,
                &target,
                fwd,
                None,
                ResultCode::TcpRefreshModified,
                now_after,
            )
        }
        Err(e) => {
            txn.result = ResultCode::TcpRefreshFailErr;
            upstream_failed(shared, txn, e)
        }
    }
}

/// stale-while-revalidate: refresh a stored object off the request path.
fn refresh_in_background(
    shared: Arc<Shared>,
    client: std::net::IpAddr,
    request: HeaderMap,
    target: Target,
    found: Found,
) {
    let Collapse::Leader(guard) = shared.cache.collapse(&target.url) else {
        return;
    };
    // The client has its answer: nothing of this fetch goes to its connection.
    let target = Target {
        interim: None,
        ..target
    };
    tokio::spawn(async move {
        let _guard = guard;
        let object = found.object();
        let stored = object.header_map();
        let mut headers = request.clone();
        for h in [
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::RANGE,
            header::IF_RANGE,
        ] {
            headers.remove(h);
        }
        semantics::add_validators(&mut headers, &stored);
        headers::forwarded_for(&mut headers, shared.config.http.forwarded_for, client);
        let Ok(fwd) = forward::forward(&shared, &Method::GET, &headers, &target, None, false).await
        else {
            return;
        };
        let now = SystemTime::now();
        let mut parts = Request::get(target.url.as_str())
            .body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|_| Request::new(()).into_parts().0);
        parts.headers = request;
        let Forwarded {
            response: resp,
            lease,
            ..
        } = fwd;
        if resp.status() == StatusCode::NOT_MODIFIED
            && semantics::not_modified_matches(&stored, resp.headers())
        {
            lease.release();
            let merged = semantics::merge_not_modified(&stored, resp.headers());
            if let Some(f) = freshness_of(
                &shared,
                &parts.headers,
                &target.url,
                object.status,
                &merged,
                now,
            ) {
                shared.cache.insert(
                    &target.url,
                    &parts.headers,
                    CachedObject::new(object.status, &merged, object.body.clone(), f),
                );
            }
            return;
        }
        let (mut rparts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut rparts.headers);
        let Some(f) = freshness_of(
            &shared,
            &parts.headers,
            &target.url,
            rparts.status,
            &rparts.headers,
            now,
        )
        .filter(|_| applets::admit(&shared, &target.url, &rparts.headers)) else {
            shared.cache.invalidate(&target.url, InvalidateCause::Stale);
            return;
        };
        if let Ok(collected) = Limited::new(body, shared.config.store.max_object_size as usize)
            .collect()
            .await
        {
            lease.release();
            shared.cache.insert(
                &target.url,
                &parts.headers,
                CachedObject::new(rparts.status, &rparts.headers, collected.to_bytes(), f),
            );
        }
    });
}

/// Methods other than GET and HEAD: relay both ways; a success invalidates the URL
/// (RFC 9111 §4.4), and the URLs in Location and Content-Location on the same host. A POST
/// response that names its own URL in Content-Location and says how long it is fresh is then
/// stored as that URL's GET response (RFC 9110 §9.3.3; `reusable_post.rs`).
async fn pass_through(
    shared: &Arc<Shared>,
    mut txn: Transaction,
    parts: request::Parts,
    body: Incoming,
    target: Target,
    violation: &ViolationSlot,
) -> Response<ProxyBody> {
    txn.result = ResultCode::TcpMiss;
    let sent = outgoing(shared, &parts.headers, txn.client());
    let forwarded =
        forward::forward(shared, &parts.method, &sent, &target, Some(body), false).await;
    drop(sent);
    match forwarded {
        Ok(fwd) => {
            let status = fwd.response.status();
            let safe = matches!(parts.method, Method::OPTIONS | Method::TRACE);
            if !safe && (status.is_success() || status.is_redirection()) {
                shared
                    .cache
                    .invalidate(&target.url, InvalidateCause::UnsafeMethod);
                for name in [header::LOCATION, header::CONTENT_LOCATION] {
                    if let Some(url) = fwd
                        .response
                        .headers()
                        .get(&name)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|l| same_origin_url(&target, l))
                    {
                        shared.cache.invalidate(&url, InvalidateCause::UnsafeMethod);
                    }
                }
            }
            // A POST answered with its own URL's current representation and an explicit
            // lifetime is captured as that URL's GET response, once the invalidation above
            // has removed what was stored.
            let as_get = crate::reusable_post::as_get(
                &parts,
                &target,
                fwd.response.status(),
                fwd.response.headers(),
            );
            relay_response(
                shared,
                txn,
                as_get.as_ref().unwrap_or(&parts),
                &target,
                fwd,
                None,
                ResultCode::TcpMiss,
                SystemTime::now(),
            )
        }
        Err(e) => match violation.lock().clone() {
            // The client's body broke its own framing: that is the client's error, not the origin's.
            Some(v) => refuse(
                shared,
                txn,
                StatusCode::BAD_REQUEST,
                ResultCode::NoneNone,
                "invalid-request",
                &v.reason,
            ),
            None => upstream_failed(shared, txn, e),
        },
    }
}

/// An upstream failure, told to the client.
fn upstream_failed(shared: &Shared, mut txn: Transaction, e: UpstreamError) -> Response<ProxyBody> {
    tracing::debug!(url = txn.url(), error = %e, "upstream failed");
    if txn.result == ResultCode::NoneNone {
        txn.result = ResultCode::TcpMiss;
    }
    let code = txn.result;
    refuse(shared, txn, e.status(), code, e.token(), &e.to_string())
}

/// Our own digest or summary (Squid's internal URL), served from memory.
fn internal(
    shared: &Shared,
    txn: Transaction,
    which: crate::coop::summary::Internal,
    request: &HeaderMap,
    head: bool,
) -> Response<ProxyBody> {
    let (status, mut headers, body) =
        crate::coop::summary::serve(&shared.coop, shared.coop.summaries(), which, request);
    headers.insert(X_CACHE.clone(), shared.x_cache_hit.clone());
    add_via(shared, &mut headers);
    let code = if status == StatusCode::OK {
        ResultCode::TcpMemHit
    } else {
        ResultCode::TcpMiss
    };
    let body = if head { Bytes::new() } else { body };
    let mut resp = made_response(txn, code, status, headers, ProxyBody::full(body));
    if status == StatusCode::OK && which == crate::coop::summary::Internal::Digest {
        // Squid's reason phrase for a digest.
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Cache Digest OK"));
    }
    resp
}
