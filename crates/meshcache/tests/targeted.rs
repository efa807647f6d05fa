//! Targeted cache control (RFC 9213) over real sockets: an accelerator obeys
//! `Meshcache-Cache-Control`, then `CDN-Cache-Control`, over `Cache-Control` (`no-store`,
//! `private`, `no-cache`, `max-age=0` included); a forward proxy ignores them unless
//! `cache.targeted_fields` names them.

mod common;

use bytes::Bytes;
use common::{node, request, send, Node, Reply};
use http::Request;
use http_body_util::Empty;
use meshcache_lab::Origin;

/// An origin-form GET to an accelerator.
async fn accelerated(proxy: &Node, origin: &Origin, path: &str) -> Reply {
    let req = Request::get(path)
        .header("host", origin.addr().to_string())
        .body(Empty::<Bytes>::new())
        .expect("request");
    send(proxy.addr, req).await
}

/// Two GETs of each path; the log codes of the second, and the origin's counts.
async fn twice(
    proxy: &Node,
    origin: &Origin,
    accelerator: bool,
    cases: &[(&str, &str, u64)],
    first_line: usize,
) {
    let mut line = first_line;
    for &(path, second_code, origin_hits) in cases {
        for _ in 0..2 {
            let reply = if accelerator {
                accelerated(proxy, origin, path).await
            } else {
                request(proxy.addr, "GET", &origin.url(path), &[]).await
            };
            assert_eq!(reply.status, 200, "{path}");
            line += 1;
        }
        assert_eq!(proxy.log_code(line).await, second_code, "{path}");
        assert_eq!(origin.hits(path), origin_hits, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accelerator_obeys_targeted_fields_first() {
    let origin = Origin::start().await.expect("origin");
    let addr = origin.addr().to_string();
    let proxy = node(|c| c.http.accelerate = Some(addr)).await;
    twice(
        &proxy,
        &origin,
        true,
        &[
            // The targeted field allows what Cache-Control forbids...
            (
                "/a?cc=no-store&hdr=CDN-Cache-Control:max-age=600",
                "TCP_MEM_HIT/200",
                1,
            ),
            // ...and forbids what it allows: no-store, private.
            (
                "/b?cc=max-age=600&hdr=CDN-Cache-Control:no-store",
                "TCP_MISS/200",
                2,
            ),
            (
                "/c?cc=max-age=600&hdr=CDN-Cache-Control:private",
                "TCP_MISS/200",
                2,
            ),
            // no-cache and max-age=0: stored, validated at each use.
            (
                "/d?cc=max-age=600&etag=v1&hdr=CDN-Cache-Control:no-cache",
                "TCP_REFRESH_UNMODIFIED/200",
                2,
            ),
            (
                "/e?cc=max-age=600&etag=v1&hdr=CDN-Cache-Control:max-age=0",
                "TCP_REFRESH_UNMODIFIED/200",
                2,
            ),
            // Our own field comes before CDN-Cache-Control.
            (
                "/f?cc=no-store&hdr=CDN-Cache-Control:no-store&hdr=Meshcache-Cache-Control:max-age=600",
                "TCP_MEM_HIT/200",
                1,
            ),
            // An invalid targeted value is passed over: Cache-Control decides.
            (
                "/g?cc=no-store&hdr=CDN-Cache-Control:Max-Age=600",
                "TCP_MISS/200",
                2,
            ),
        ],
        0,
    )
    .await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_proxy_ignores_targeted_fields_unless_told() {
    let origin = Origin::start().await.expect("origin");
    let plain = node(|_| {}).await;
    twice(
        &plain,
        &origin,
        false,
        &[
            (
                "/a?cc=no-store&hdr=CDN-Cache-Control:max-age=600",
                "TCP_MISS/200",
                2,
            ),
            (
                "/b?cc=max-age=600&hdr=CDN-Cache-Control:no-store",
                "TCP_MEM_HIT/200",
                1,
            ),
        ],
        0,
    )
    .await;
    plain.stop().await;

    let origin = Origin::start().await.expect("origin");
    let told = node(|c| c.cache.targeted_fields = Some(vec!["CDN-Cache-Control".into()])).await;
    twice(
        &told,
        &origin,
        false,
        &[
            (
                "/a?cc=no-store&hdr=CDN-Cache-Control:max-age=600",
                "TCP_MEM_HIT/200",
                1,
            ),
            (
                "/b?cc=max-age=600&hdr=CDN-Cache-Control:no-store",
                "TCP_MISS/200",
                2,
            ),
        ],
        0,
    )
    .await;
    told.stop().await;
}
