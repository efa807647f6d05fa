//! Caching policy over real sockets: refresh patterns change freshness as documented
//! (docs/access.md, "Caching policy"), cache rules keep requests out of the store, PURGE works
//! only when an access rule names it, and `X-Forwarded-For` / `Via` are what the origin sees.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{get, node, request, request_from, Node};
use http_body_util::Full;
use meshcache_lab::Origin;
use meshcache_policy::{Action, RuleConfig};
use meshcache_proxy::config::{DiskSection, ForwardedFor, PeerConfig, RefreshConfig};
use tokio::net::TcpListener;

/// The `ttl=N` of a response's `Cache-Status` (a hit's remaining freshness).
fn ttl(reply: &common::Reply) -> i64 {
    let status = reply.header("cache-status");
    status
        .split(';')
        .find_map(|p| p.trim().strip_prefix("ttl="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ttl in Cache-Status {status:?}"))
}

/// GETs `path` twice and returns the second reply, which must be a hit, and its ttl.
async fn hit_ttl(node: &Node, origin: &Origin, path: &str) -> i64 {
    let url = origin.url(path);
    let first = get(node.addr, &url).await;
    assert_eq!(first.status, 200, "{path}");
    let second = get(node.addr, &url).await;
    assert_eq!(second.x_cache(), "HIT", "{path}: {:?}", second.headers);
    assert_eq!(origin.hits(path), 1, "{path}");
    ttl(&second)
}

fn pattern(url_regex: &str, edit: impl FnOnce(&mut RefreshConfig)) -> RefreshConfig {
    let mut p = RefreshConfig::new(url_regex);
    edit(&mut p);
    p
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `ttl` is within a few seconds below `want` (the test's own time passes).
fn about(ttl: i64, want: i64) -> bool {
    (want - 3..=want).contains(&ttl)
}

#[tokio::test]
async fn refresh_patterns_change_heuristic_freshness() {
    let origin = Origin::start().await.expect("origin");
    let node = node(|c| {
        c.cache.refresh = vec![
            pattern("/percent", |p| {
                p.percent = 50;
                p.max = secs(3600);
            }),
            pattern("/capped", |p| {
                p.percent = 50;
                p.max = secs(600);
            }),
            pattern("/min-only", |p| p.min = secs(300)),
            pattern("/lastmod", |p| {
                p.min = secs(3600);
                p.percent = 10;
                p.max = secs(86_400);
                p.override_lastmod = true;
            }),
            // Squid's `(/cgi-bin/|\?) 0 0% 0`: no heuristic freshness at all.
            pattern("/query-zero", |p| {
                p.percent = 0;
                p.max = Duration::ZERO;
            }),
        ];
    })
    .await;
    // No pattern matches: cache.heuristic_fraction, 10 % of 1000 s.
    let t = hit_ttl(&node, &origin, "/plain?size=10&lm=1000").await;
    assert!(about(t, 100), "{t}");
    // 50 % of the age since Last-Modified.
    let t = hit_ttl(&node, &origin, "/percent?size=10&lm=1000").await;
    assert!(about(t, 500), "{t}");
    // At most max.
    let t = hit_ttl(&node, &origin, "/capped?size=10&lm=100000").await;
    assert!(about(t, 600), "{t}");
    // Neither explicit freshness nor Last-Modified (nor any validator): fresh for min, where
    // without a pattern it is not even stored.
    let t = hit_ttl(&node, &origin, "/min-only?size=10").await;
    assert!(about(t, 300), "{t}");
    get(node.addr, &origin.url("/plain-nothing?size=10")).await;
    let again = get(node.addr, &origin.url("/plain-nothing?size=10")).await;
    assert_eq!(again.x_cache(), "MISS");
    assert_eq!(origin.hits("/plain-nothing?size=10"), 2);
    // override_lastmod: min although Last-Modified gives 100 s.
    let t = hit_ttl(&node, &origin, "/lastmod?size=10&lm=1000").await;
    assert!(about(t, 3600), "{t}");
    // Explicit freshness is untouched by the pattern: max-age=600 under `0 0% 0`.
    let t = hit_ttl(&node, &origin, "/query-zero?size=10&cc=max-age%3D600").await;
    assert!(about(t, 600), "{t}");
    // ...while Last-Modified alone no longer makes it fresh: stored, revalidated every time.
    let path = "/query-zero?size=10&lm=1000";
    get(node.addr, &origin.url(path)).await;
    get(node.addr, &origin.url(path)).await;
    assert_eq!(origin.hits(path), 2);
    let code = node.log_code(16).await;
    assert!(code.starts_with("TCP_REFRESH_"), "{code}");
    node.stop().await;
}

#[tokio::test]
async fn override_expire_keeps_a_max_age_0_response_fresh_for_min() {
    let origin = Origin::start().await.expect("origin");
    let node = node(|c| {
        c.cache.refresh = vec![pattern("/override", |p| {
            p.min = secs(600);
            p.override_expire = true;
        })];
    })
    .await;
    let t = hit_ttl(&node, &origin, "/override?size=10&cc=max-age%3D0&etag=a").await;
    assert!(about(t, 600), "{t}");
    // The same response elsewhere is revalidated at every request (RFC 9111).
    let path = "/elsewhere?size=10&cc=max-age%3D0&etag=a";
    get(node.addr, &origin.url(path)).await;
    get(node.addr, &origin.url(path)).await;
    assert_eq!(origin.hits(path), 2);
    // must-revalidate is never overridden (as Squid).
    let path = "/override-mr?size=10&cc=max-age%3D0%2C%20must-revalidate&etag=a";
    get(node.addr, &origin.url(path)).await;
    get(node.addr, &origin.url(path)).await;
    assert_eq!(origin.hits(path), 2);
    node.stop().await;
}

#[tokio::test]
async fn ignore_reload_serves_a_reload_from_the_store() {
    let origin = Origin::start().await.expect("origin");
    let node = node(|c| {
        c.cache.refresh = vec![pattern("/ignore", |p| p.ignore_reload = true)];
    })
    .await;
    for (path, reload) in [
        (
            "/ignore?size=10&cc=max-age%3D600&etag=a",
            ("cache-control", "no-cache"),
        ),
        (
            "/ignore?size=11&cc=max-age%3D600&etag=a",
            ("pragma", "no-cache"),
        ),
        (
            "/ignore?size=12&cc=max-age%3D600&etag=a",
            ("cache-control", "max-age=0"),
        ),
    ] {
        let url = origin.url(path);
        get(node.addr, &url).await;
        let reply = request(node.addr, "GET", &url, &[reload]).await;
        assert_eq!(reply.x_cache(), "HIT", "{path} {reload:?}");
        assert_eq!(origin.hits(path), 1, "{path} {reload:?}");
    }
    // Without the option a reload goes to the origin.
    let path = "/plain?size=10&cc=max-age%3D600&etag=a";
    get(node.addr, &origin.url(path)).await;
    let reply = request(
        node.addr,
        "GET",
        &origin.url(path),
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(origin.hits(path), 2);
    node.stop().await;
}

#[tokio::test]
async fn cache_deny_neither_stores_nor_serves_from_the_store() {
    let origin = Origin::start().await.expect("origin");
    let node = node(|c| {
        c.cache.rules = vec![
            RuleConfig {
                url_regex: vec!["/private".into()],
                ..RuleConfig::new(Action::Deny)
            },
            RuleConfig {
                src: vec!["127.0.0.2".into()],
                ..RuleConfig::new(Action::Deny)
            },
        ];
    })
    .await;
    let path = "/private?size=10&cc=max-age%3D600";
    for _ in 0..3 {
        let reply = get(node.addr, &origin.url(path)).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.x_cache(), "MISS");
        assert_eq!(
            reply.header("cache-status"),
            "testcache; fwd=bypass; fwd-status=200"
        );
    }
    assert_eq!(origin.hits(path), 3);
    assert!(!node.proxy.cache().contains(&origin.url(path)));
    assert_eq!(node.log_code(3).await, "TCP_MISS/200");
    // A stored response is not served to a request the rules deny, and stays stored.
    let path = "/shared?size=10&cc=max-age%3D600";
    let url = origin.url(path);
    get(node.addr, &url).await;
    let denied = request_from(
        Some("127.0.0.2".parse().expect("ip")),
        node.addr,
        "GET",
        &url,
        &[],
    )
    .await;
    assert_eq!(denied.x_cache(), "MISS");
    assert_eq!(origin.hits(path), 2);
    assert_eq!(get(node.addr, &url).await.x_cache(), "HIT");
    assert_eq!(origin.hits(path), 2);
    // only-if-cached cannot be answered from a cache the rules keep it out of.
    let reply = request(
        node.addr,
        "GET",
        &origin.url("/private?size=10&cc=max-age%3D600"),
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(reply.status, 504);
    node.stop().await;
}

/// Access rules: PURGE from 127.0.0.1 only, everything else from loopback.
fn purge_rules() -> Vec<RuleConfig> {
    vec![
        RuleConfig {
            method: vec!["PURGE".into()],
            src: vec!["127.0.0.1".into()],
            ..RuleConfig::new(Action::Allow)
        },
        RuleConfig {
            src: vec!["127.0.0.0/8".into()],
            ..RuleConfig::new(Action::Allow)
        },
    ]
}

#[tokio::test]
async fn purge_removes_the_object_when_a_rule_allows_it() {
    let origin = Origin::start().await.expect("origin");
    let node = node(|c| c.access = purge_rules()).await;
    let path = "/p?size=10&cc=max-age%3D600";
    let url = origin.url(path);
    get(node.addr, &url).await;
    assert_eq!(get(node.addr, &url).await.x_cache(), "HIT");
    let purged = request(node.addr, "PURGE", &url, &[]).await;
    assert_eq!((purged.status, purged.body.len()), (200, 0));
    assert_eq!(node.log_code(3).await, "TCP_MISS/200");
    assert_eq!(get(node.addr, &url).await.x_cache(), "MISS");
    assert_eq!(origin.hits(path), 2);
    // Nothing stored: 404.
    let missing = request(node.addr, "PURGE", &origin.url("/never"), &[]).await;
    assert_eq!(missing.status, 404);
    assert_eq!(node.log_code(5).await, "TCP_MISS/404");
    // The second rule allows 127.0.0.2's requests but does not name PURGE: refused, and the
    // object stays.
    let refused = request_from(
        Some("127.0.0.2".parse().expect("ip")),
        node.addr,
        "PURGE",
        &url,
        &[],
    )
    .await;
    assert_eq!(refused.status, 403);
    assert_eq!(node.log_code(6).await, "TCP_DENIED/403");
    assert_eq!(get(node.addr, &url).await.x_cache(), "HIT");
    // Vary variants go with their URL.
    let path = "/v?size=10&cc=max-age%3D600&vary=accept-language";
    let url = origin.url(path);
    for lang in ["en", "pt"] {
        request(node.addr, "GET", &url, &[("accept-language", lang)]).await;
    }
    assert_eq!(request(node.addr, "PURGE", &url, &[]).await.status, 200);
    for lang in ["en", "pt"] {
        let reply = request(node.addr, "GET", &url, &[("accept-language", lang)]).await;
        assert_eq!(reply.x_cache(), "MISS", "{lang}");
    }
    node.stop().await;
}

#[tokio::test]
async fn purge_without_a_rule_naming_it_is_refused() {
    let origin = Origin::start().await.expect("origin");
    // No access rule at all: loopback may do anything else, but not PURGE.
    let open = node(|_| {}).await;
    // Rules that allow every method without naming PURGE.
    let named_nowhere = node(|c| {
        c.access = vec![RuleConfig {
            src: vec!["127.0.0.0/8".into()],
            ..RuleConfig::new(Action::Allow)
        }]
    })
    .await;
    for node in [&open, &named_nowhere] {
        let url = origin.url("/kept?size=10&cc=max-age%3D600");
        get(node.addr, &url).await;
        let reply = request(node.addr, "PURGE", &url, &[]).await;
        assert_eq!(reply.status, 403);
        assert_eq!(reply.header("x-meshcache-error"), "access-denied");
        assert_eq!(node.log_code(2).await, "TCP_DENIED/403");
        assert_eq!(get(node.addr, &url).await.x_cache(), "HIT");
    }
    open.stop().await;
    named_nowhere.stop().await;
}

#[tokio::test]
async fn purge_reaches_the_disks() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = dir.path().join("cache");
    let node = node(move |c| {
        c.access = purge_rules();
        c.store.disks = vec![DiskSection {
            path: disk,
            size: 64 << 20,
            sync_interval: Duration::from_millis(10),
        }];
    })
    .await;
    let url = origin.url("/d?size=100000&cc=max-age%3D600");
    get(node.addr, &url).await;
    assert!(node.proxy.cache().flush_disks(Duration::from_secs(5)));
    assert!(node.proxy.cache().contains(&url));
    assert_eq!(request(node.addr, "PURGE", &url, &[]).await.status, 200);
    assert!(!node.proxy.cache().contains(&url));
    assert!(node.proxy.cache().flush_disks(Duration::from_secs(5)));
    assert!(!node.proxy.cache().contains(&url));
    assert_eq!(get(node.addr, &url).await.x_cache(), "MISS");
    node.stop().await;
}

/// An origin that answers every request with the `X-Forwarded-For` and `Via` it received
/// (`-` for none), one per line, never cacheable.
async fn echo_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| {
                let seen = |name: &str| {
                    let values: Vec<&str> = req
                        .headers()
                        .get_all(name)
                        .iter()
                        .map(|v| v.to_str().unwrap_or("?"))
                        .collect();
                    if values.is_empty() {
                        "-".to_owned()
                    } else {
                        values.join(" | ")
                    }
                };
                let body = format!("{}\n{}\n", seen("x-forwarded-for"), seen("via"));
                let resp = http::Response::builder()
                    .header("cache-control", "no-store")
                    .body(Full::new(Bytes::from(body)))
                    .expect("response");
                async move { Ok::<_, Infallible>(resp) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
            );
        }
    });
    addr
}

/// What the echo origin saw: (X-Forwarded-For, Via).
async fn seen(proxy: SocketAddr, origin: SocketAddr, headers: &[(&str, &str)]) -> (String, String) {
    let reply = request(proxy, "GET", &format!("http://{origin}/echo"), headers).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let mut lines = text.lines().map(str::to_owned);
    (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    )
}

#[tokio::test]
async fn forwarded_for_modes_as_the_origin_sees_them() {
    let origin = echo_origin().await;
    for (mode, alone, after) in [
        (ForwardedFor::On, "127.0.0.1", "10.0.0.1, 127.0.0.1"),
        (ForwardedFor::Off, "unknown", "10.0.0.1, unknown"),
        (ForwardedFor::Truncate, "127.0.0.1", "127.0.0.1"),
        (ForwardedFor::Delete, "-", "-"),
        (ForwardedFor::Transparent, "-", "10.0.0.1"),
    ] {
        let node = node(|c| c.http.forwarded_for = mode).await;
        assert_eq!(seen(node.addr, origin, &[]).await.0, alone, "{mode:?}");
        let xff = [("x-forwarded-for", "10.0.0.1")];
        assert_eq!(seen(node.addr, origin, &xff).await.0, after, "{mode:?}");
        node.stop().await;
    }
    // The default is transparent: nothing added.
    let node = node(|_| {}).await;
    assert_eq!(seen(node.addr, origin, &[]).await.0, "-");
    node.stop().await;
}

#[tokio::test]
async fn forwarded_for_reaches_parents_too() {
    let origin = echo_origin().await;
    let parent = node(|c| c.name = "parent".into()).await;
    let parent_addr = parent.addr;
    let child = node(move |c| {
        c.name = "child".into();
        c.http.forwarded_for = ForwardedFor::On;
        c.peers = vec![PeerConfig::new(
            "parent",
            meshcache_dcm::Role::Parent,
            parent_addr,
            None,
        )];
        c.never_direct = vec![RuleConfig::new(Action::Allow)];
    })
    .await;
    let (xff, via) = seen(child.addr, origin, &[]).await;
    assert_eq!(xff, "127.0.0.1");
    assert!(
        via.contains("1.1 child (meshcache/") && via.contains("1.1 parent (meshcache/"),
        "{via}"
    );
    child.stop().await;
    parent.stop().await;
}

#[tokio::test]
async fn via_off_adds_none_but_still_sees_loops() {
    let origin = echo_origin().await;
    let on = node(|_| {}).await;
    let (_, via) = seen(on.addr, origin, &[]).await;
    assert!(via.starts_with("1.1 testcache (meshcache/"), "{via}");
    let off = node(|c| c.http.via = false).await;
    let (_, via) = seen(off.addr, origin, &[]).await;
    assert_eq!(via, "-");
    // Another proxy's Via goes on unchanged.
    let (_, via) = seen(off.addr, origin, &[("via", "1.1 office")]).await;
    assert_eq!(via, "1.1 office");
    // Responses: none of ours, on a miss, a hit, or an error made here.
    let lab = Origin::start().await.expect("origin");
    let url = lab.url("/v?size=10&cc=max-age%3D600");
    for reply in [
        get(off.addr, &url).await,
        get(off.addr, &url).await,
        get(off.addr, "http://127.0.0.1:1/").await,
    ] {
        assert!(reply.headers.get("via").is_none(), "{:?}", reply.headers);
    }
    // A request that names this node in Via is still a loop.
    let reply = request(off.addr, "GET", &url, &[("via", "1.1 testcache")]).await;
    assert_eq!(reply.status, 508);
    on.stop().await;
    off.stop().await;
}
