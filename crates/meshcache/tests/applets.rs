//! Active Cache end to end: the shipped applets (`applets/*.wasm`) run by a real proxy on real
//! hits, against an origin that serves documents naming them, serves the modules, and takes
//! the applets' log records by POST. The hostile fixtures must leave the proxy serving.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{node, request, Node, Reply};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpListener;

/// A document the test origin serves: headers and body.
#[derive(Clone)]
struct Doc {
    headers: Vec<(String, String)>,
    body: Bytes,
}

/// A small origin with a route table, per-path counters and a record of POSTed bodies. POSTs
/// to a path in `failing` get 503 while its count of failures lasts.
#[derive(Clone, Default)]
struct TestOrigin {
    routes: Arc<Mutex<HashMap<String, Doc>>>,
    hits: Arc<Mutex<HashMap<String, u64>>>,
    posts: Arc<Mutex<Vec<(String, Bytes)>>>,
    failing: Arc<Mutex<HashMap<String, u32>>>,
    addr: Arc<Mutex<Option<SocketAddr>>>,
}

impl TestOrigin {
    async fn start() -> TestOrigin {
        let origin = TestOrigin::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        *origin.addr.lock() = Some(listener.local_addr().expect("addr"));
        let o = origin.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let o = o.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let o = o.clone();
                        async move { Ok::<_, Infallible>(o.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        origin
    }

    fn addr(&self) -> SocketAddr {
        self.addr.lock().expect("started")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// Serves `body` at `path`, cacheable for an hour, with extra headers.
    fn route(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) {
        let mut h = vec![
            ("cache-control".to_owned(), "max-age=3600".to_owned()),
            ("content-type".to_owned(), "text/html".to_owned()),
        ];
        h.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.routes.lock().insert(
            path.to_owned(),
            Doc {
                headers: h,
                body: body.into(),
            },
        );
    }

    /// Serves the shipped module `applets/<name>.wasm` at `/applets/<name>.wasm`.
    fn module(&self, name: &str) {
        self.route(
            &format!("/applets/{name}.wasm"),
            &[("content-type", "application/wasm")],
            std::fs::read(module_path(name)).expect("shipped module"),
        );
    }

    fn hits(&self, path: &str) -> u64 {
        self.hits.lock().get(path).copied().unwrap_or(0)
    }

    /// POSTed bodies to `path`, concatenated.
    fn posted(&self, path: &str) -> String {
        let posts = self.posts.lock();
        posts
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        *self.hits.lock().entry(path.clone()).or_default() += 1;
        if req.method() == http::Method::POST {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut failing = self.failing.lock();
            if let Some(n) = failing.get_mut(&path).filter(|n| **n > 0) {
                *n -= 1;
                let mut r = Response::new(Full::new(Bytes::from_static(b"busy")));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return r;
            }
            self.posts.lock().push((path, body));
            return Response::new(Full::new(Bytes::from_static(b"ok")));
        }
        let doc = self.routes.lock().get(&path).cloned();
        match doc {
            Some(doc) => {
                let mut r = Response::new(Full::new(doc.body));
                for (k, v) in doc.headers {
                    r.headers_mut().append(
                        http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                        http::HeaderValue::from_str(&v).expect("value"),
                    );
                }
                r
            }
            None => {
                let mut r = Response::new(Full::new(Bytes::from_static(b"no such document")));
                *r.status_mut() = StatusCode::NOT_FOUND;
                r
            }
        }
    }
}

fn module_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../applets/{name}.wasm"))
}

/// A proxy with applets on, logs sent every 50 ms.
async fn proxy() -> Node {
    node(|c| {
        c.applets.log_interval = Duration::from_millis(50);
        c.applets.log_retry_max = Duration::from_millis(200);
    })
    .await
}

async fn get(node: &Node, url: &str, headers: &[(&str, &str)]) -> Reply {
    request(node.addr, "GET", url, headers).await
}

fn applets(stats: &serde_json::Value) -> &serde_json::Value {
    &stats["applets"]
}

/// Waits (at most 5 s) for `cond` on the origin.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn null_runs_on_every_hit_and_its_module_is_fetched_once() {
    let origin = TestOrigin::start().await;
    origin.module("null");
    origin.route("/doc", &[("cacheapplet", "/applets/null.wasm")], "hello");
    let p = proxy().await;
    let url = origin.url("/doc");
    let first = get(&p, &url, &[]).await;
    assert_eq!((first.status, first.x_cache()), (200, "MISS"));
    for _ in 0..3 {
        let r = get(&p, &url, &[]).await;
        assert_eq!(
            (r.status, r.x_cache(), &r.body[..]),
            (200, "HIT", &b"hello"[..])
        );
    }
    assert_eq!(origin.hits("/doc"), 1);
    assert_eq!(origin.hits("/applets/null.wasm"), 1);
    // After an answer, the run's instance is rewound and kept; the next hit takes it.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while applets(&p.stats().await)["ready_ahead"] != 1 {
        assert!(std::time::Instant::now() < until, "no instance made ahead");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let made = applets(&p.stats().await)["made_ahead"]
        .as_u64()
        .expect("made_ahead");
    let r = get(&p, &url, &[]).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
    let s = p.stats().await;
    assert_eq!(applets(&s)["made_ahead"], made + 1, "{s}");
    assert_eq!(applets(&s)["runs"], 4, "{s}");
    assert_eq!(applets(&s)["rewound"], 4, "{s}");
    assert_eq!(applets(&s)["cached"], 4, "{s}");
    assert_eq!(applets(&s)["modules_compiled"], 1, "{s}");
    let metrics = String::from_utf8_lossy(&p.admin_get("/metrics").await.body).into_owned();
    for line in [
        "# TYPE meshcache_applet_ready_ahead gauge",
        "# TYPE meshcache_applet_made_ahead_total counter",
        "meshcache_applet_rewound_total 4",
        "meshcache_applet_runs_total 4",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_hits_fetch_the_module_once() {
    let origin = TestOrigin::start().await;
    origin.module("null");
    origin.route("/doc", &[("cacheapplet", "/applets/null.wasm")], "hello");
    let p = proxy().await;
    let url = origin.url("/doc");
    get(&p, &url, &[]).await;
    let mut hits = Vec::new();
    for _ in 0..10 {
        let (addr, url) = (p.addr, url.clone());
        hits.push(tokio::spawn(async move {
            request(addr, "GET", &url, &[]).await
        }));
    }
    for h in hits {
        let r = h.await.expect("task");
        assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    }
    assert_eq!(origin.hits("/applets/null.wasm"), 1);
    let s = p.stats().await;
    assert_eq!(applets(&s)["module_fetches"], 1, "{s}");
    assert_eq!(applets(&s)["runs"], 10, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn log_records_reach_the_origin_by_post() {
    let origin = TestOrigin::start().await;
    origin.module("log");
    origin.route(
        "/news",
        &[("cacheapplet", "/applets/log.wasm; log=/hits")],
        "news",
    );
    let p = proxy().await;
    let url = origin.url("/news");
    get(&p, &url, &[]).await;
    get(&p, &url, &[]).await;
    get(&p, &url, &[]).await;
    eventually("two log records posted", || {
        origin.posted("/hits").lines().count() == 2
    })
    .await;
    let posted = origin.posted("/hits");
    for line in posted.lines() {
        assert!(line.ends_with(&format!("127.0.0.1 GET {url}")), "{line}");
        assert!(line.contains(" GMT "), "IMF-fixdate: {line}");
    }
    let s = p.stats().await;
    assert_eq!(applets(&s)["log_records_delivered"], 2, "{s}");
    assert_eq!(applets(&s)["log_records_dropped"], 0, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn failed_log_deliveries_are_retried_until_they_succeed() {
    let origin = TestOrigin::start().await;
    origin.module("log");
    origin.route("/d", &[("cacheapplet", "/applets/log.wasm; log=/l")], "d");
    origin.failing.lock().insert("/l".into(), 2);
    let p = proxy().await;
    let url = origin.url("/d");
    get(&p, &url, &[]).await;
    get(&p, &url, &[]).await;
    eventually("the record delivered after two refusals", || {
        origin.posted("/l").lines().count() == 1
    })
    .await;
    let s = p.stats().await;
    assert_eq!(applets(&s)["log_post_failures"], 2, "{s}");
    assert_eq!(applets(&s)["log_records_delivered"], 1, "{s}");
    assert_eq!(applets(&s)["log_records_dropped"], 0, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn ads_rotate_banners_from_the_spec_object() {
    let origin = TestOrigin::start().await;
    origin.module("ads");
    origin.route(
        "/ads/spec.txt",
        &[],
        "# banners\n/b/one.gif\n\n/b/two.gif\n/b/three.gif\n",
    );
    origin.route(
        "/page",
        &[("cacheapplet", "/applets/ads.wasm")],
        "<p>top<!--#ad--></p><p>side<!--#ad--></p>",
    );
    let p = proxy().await;
    // Without the spec in the cache the applet cannot choose: the request goes to the origin.
    get(&p, &origin.url("/page"), &[]).await;
    let r = get(&p, &origin.url("/page"), &[]).await;
    assert!(r.header("cache-status").contains("applet-origin"), "{r:?}");
    assert_eq!(origin.hits("/page"), 2);
    get(&p, &origin.url("/ads/spec.txt"), &[]).await;
    let img = |u: &str| format!("<img src=\"{u}\" alt=\"advertisement\">");
    let mut bodies = Vec::new();
    for _ in 0..4 {
        let r = get(&p, &origin.url("/page"), &[]).await;
        assert_eq!((r.status, r.x_cache()), (200, "HIT"));
        assert_eq!(r.header("content-type"), "text/html");
        assert!(r.header("cache-status").contains("detail=applet"), "{r:?}");
        bodies.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    let (one, two, three) = (img("/b/one.gif"), img("/b/two.gif"), img("/b/three.gif"));
    assert_eq!(bodies[0], format!("<p>top{one}</p><p>side{two}</p>"));
    assert_eq!(bodies[1], format!("<p>top{two}</p><p>side{three}</p>"));
    assert_eq!(bodies[2], format!("<p>top{three}</p><p>side{one}</p>"));
    assert_eq!(bodies[3], bodies[0]);
    assert_eq!(origin.hits("/page"), 2);
    p.stop().await;
}

/// Base64url without padding.
fn b64url(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| n << 8 | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn apc_serves_only_holders_of_a_signed_cookie() {
    use ed25519_dalek::{Signer, SigningKey};
    let key = SigningKey::from_bytes(&[42; 32]);
    let public: String = key
        .verifying_key()
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let origin = TestOrigin::start().await;
    origin.module("apc");
    origin.route(
        "/members/report",
        &[("cacheapplet", "/applets/apc.wasm"), ("apc-key", &public)],
        "members only",
    );
    let p = proxy().await;
    let url = origin.url("/members/report");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let cookie = |prefix: &str, expiry: u64, signer: &SigningKey| {
        let payload = format!("{prefix}|{expiry}");
        let sig = signer.sign(payload.as_bytes()).to_bytes();
        format!("apc={}.{}", b64url(payload.as_bytes()), b64url(&sig))
    };
    let members = origin.url("/members/");
    get(&p, &url, &[]).await; // the miss that stores it
    let good = cookie(&members, now + 600, &key);
    let r = get(&p, &url, &[("cookie", &good)]).await;
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"members only"[..]));
    assert_eq!(origin.hits("/members/report"), 1);
    let other_key = SigningKey::from_bytes(&[43; 32]);
    for (what, c) in [
        ("no cookie", String::new()),
        ("expired", cookie(&members, now - 5, &key)),
        (
            "another prefix",
            cookie(&origin.url("/admin/"), now + 600, &key),
        ),
        ("another signer", cookie(&members, now + 600, &other_key)),
        ("garbage", "apc=%%%.!!!".to_owned()),
    ] {
        let before = origin.hits("/members/report");
        let headers: Vec<(&str, &str)> = if c.is_empty() {
            vec![]
        } else {
            vec![("cookie", &c)]
        };
        let r = get(&p, &url, &headers).await;
        assert_eq!(r.status, 200, "{what}");
        assert_eq!(
            origin.hits("/members/report"),
            before + 1,
            "{what}: went to the origin"
        );
    }
    let s = p.stats().await;
    assert_eq!(applets(&s)["asked_origin"], 5, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn ssi_expands_includes_per_request() {
    let origin = TestOrigin::start().await;
    origin.module("ssi");
    origin.route(
        "/ssi.shtml",
        &[("cacheapplet", "/applets/ssi.wasm")],
        "<p>You are <!--#echo var=\"REMOTE_ADDR\" -->, it is <!--#echo var=\"DATE_GMT\" -->.</p><!--#echo var=\"NOPE\"-->",
    );
    origin.route(
        "/plain.shtml",
        &[("cacheapplet", "/applets/ssi.wasm")],
        "<p>nothing</p>",
    );
    let p = proxy().await;
    let url = origin.url("/ssi.shtml");
    get(&p, &url, &[]).await;
    let r = get(&p, &url, &[]).await;
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.x_cache(), "HIT");
    assert!(body.starts_with("<p>You are 127.0.0.1, it is "), "{body}");
    assert!(body.ends_with(" GMT.</p>(none)"), "{body}");
    assert!(!body.contains("<!--#"), "{body}");
    assert_eq!(r.header("content-length"), body.len().to_string());
    // No directive: the stored copy, unchanged.
    get(&p, &origin.url("/plain.shtml"), &[]).await;
    let r = get(&p, &origin.url("/plain.shtml"), &[]).await;
    assert_eq!(&r.body[..], b"<p>nothing</p>");
    let status = r.header("cache-status");
    assert!(
        status.starts_with("testcache; hit;") && !status.contains("applet"),
        "{r:?}"
    );
    p.stop().await;
}

#[tokio::test]
async fn csid_assembles_each_clients_page_from_cached_items() {
    let origin = TestOrigin::start().await;
    origin.module("csid");
    origin.route(
        "/portal",
        &[("cacheapplet", "/applets/csid.wasm")],
        "alice: /items/sports /items/weather\n*: /items/news\n",
    );
    for (item, text) in [("sports", "[S]"), ("weather", "[W]"), ("news", "[N]")] {
        origin.route(&format!("/items/{item}"), &[], text);
    }
    let p = proxy().await;
    let url = origin.url("/portal");
    get(&p, &url, &[]).await;
    // Items not cached yet: to the origin.
    get(&p, &url, &[("cookie", "client-id=alice")]).await;
    assert_eq!(origin.hits("/portal"), 2);
    for item in ["sports", "weather", "news"] {
        get(&p, &origin.url(&format!("/items/{item}")), &[]).await;
    }
    let r = get(&p, &url, &[("cookie", "theme=dark; client-id=alice")]).await;
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"[S][W]"[..]));
    assert_eq!(r.header("x-csid-client"), "alice");
    let r = get(&p, &url, &[]).await;
    assert_eq!(&r.body[..], b"[N]");
    assert_eq!(origin.hits("/portal"), 2);
    p.stop().await;
}

#[tokio::test]
async fn hostile_applets_are_stopped_counted_and_the_proxy_keeps_serving() {
    let origin = TestOrigin::start().await;
    origin.module("null");
    origin.route("/fine", &[("cacheapplet", "/applets/null.wasm")], "fine");
    // The CPU budget is wall time on the epoch ticker: generous enough that on a loaded
    // machine the balloon still meets its memory limit, and the flood its output limit, first.
    let p = node(|c| {
        c.applets.cpu = Duration::from_millis(200);
        c.applets.cpu_max = Duration::from_millis(500);
        c.applets.memory = 8 << 20;
        c.applets.max_output = 1 << 20;
    })
    .await;
    let fine = origin.url("/fine");
    get(&p, &fine, &[]).await;
    for (name, detail) in [
        ("spin", "applet-timeout"),
        ("balloon", "applet-memory"),
        ("flood", "applet-output"),
        ("crash", "applet-trap"),
    ] {
        origin.module(name);
        let path = format!("/{name}");
        origin.route(
            &path,
            &[("cacheapplet", &format!("/applets/{name}.wasm"))],
            name,
        );
        let url = origin.url(&path);
        get(&p, &url, &[]).await;
        for _ in 0..2 {
            let r = get(&p, &url, &[]).await;
            assert_eq!((r.status, &r.body[..]), (200, name.as_bytes()), "{name}");
            assert!(r.header("cache-status").contains(detail), "{name}: {r:?}");
            let ok = get(&p, &fine, &[]).await;
            assert_eq!(
                (ok.x_cache(), &ok.body[..]),
                ("HIT", &b"fine"[..]),
                "after {name}"
            );
        }
        assert_eq!(
            origin.hits(&path),
            3,
            "{name}: every hit went to the origin"
        );
    }
    let s = p.stats().await;
    let a = applets(&s);
    for counter in ["timeouts", "memory_overruns", "output_overruns", "traps"] {
        assert_eq!(a[counter], 2, "{counter}: {s}");
    }
    assert_eq!(a["cached"], 8, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn a_module_that_keeps_faulting_rests_and_its_hits_go_straight_to_the_origin() {
    let origin = TestOrigin::start().await;
    origin.module("crash");
    origin.route("/c", &[("cacheapplet", "/applets/crash.wasm")], "c");
    let p = node(|c| {
        c.applets.quarantine_after = 3;
        c.applets.quarantine = Duration::from_secs(3600);
    })
    .await;
    let url = origin.url("/c");
    get(&p, &url, &[]).await;
    for _ in 0..3 {
        let r = get(&p, &url, &[]).await;
        assert!(r.header("cache-status").contains("applet-trap"), "{r:?}");
    }
    for _ in 0..2 {
        let r = get(&p, &url, &[]).await;
        assert_eq!((r.status, &r.body[..]), (200, &b"c"[..]));
        assert!(
            r.header("cache-status").contains("applet-quarantined"),
            "{r:?}"
        );
    }
    let s = p.stats().await;
    assert_eq!(applets(&s)["traps"], 3, "{s}");
    assert_eq!(applets(&s)["runs"], 3, "{s}");
    assert_eq!(applets(&s)["quarantines"], 1, "{s}");
    assert_eq!(applets(&s)["quarantined"], 2, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn writes_and_log_records_are_kept_only_when_the_applet_completes() {
    let origin = TestOrigin::start().await;
    origin.module("putcrash");
    origin.route(
        "/pc",
        &[("cacheapplet", "/applets/putcrash.wasm; log=/pclog")],
        "pc",
    );
    let p = proxy().await;
    let url = origin.url("/pc");
    get(&p, &url, &[]).await;
    let r = get(&p, &url, &[("cookie", "crash=1")]).await;
    assert!(r.header("cache-status").contains("applet-trap"), "{r:?}");
    let r = get(&p, &url, &[]).await;
    assert_eq!(r.x_cache(), "HIT");
    eventually("one record posted", || origin.posted("/pclog") == "x").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        origin.posted("/pclog"),
        "x",
        "the trapped run's record was dropped"
    );
    p.stop().await;
}

#[tokio::test]
async fn applets_of_another_origin_are_refused_and_the_document_served_without_one() {
    let origin = TestOrigin::start().await;
    let elsewhere = TestOrigin::start().await;
    elsewhere.module("crash");
    origin.route(
        "/doc",
        &[("cacheapplet", &elsewhere.url("/applets/crash.wasm"))],
        "doc",
    );
    let p = proxy().await;
    let url = origin.url("/doc");
    get(&p, &url, &[]).await;
    let r = get(&p, &url, &[]).await;
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"doc"[..]));
    assert_eq!(elsewhere.hits("/applets/crash.wasm"), 0);
    let s = p.stats().await;
    assert_eq!(applets(&s)["refused_headers"], 1, "{s}");
    assert_eq!(applets(&s)["runs"], 0, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn an_unavailable_module_sends_hits_to_the_origin() {
    let origin = TestOrigin::start().await;
    origin.route("/doc", &[("cacheapplet", "/applets/missing.wasm")], "doc");
    origin.route("/bad", &[("cacheapplet", "/notwasm")], "bad");
    origin.route("/notwasm", &[], "this is not a module");
    let p = proxy().await;
    for path in ["/doc", "/bad"] {
        let url = origin.url(path);
        get(&p, &url, &[]).await;
        let r = get(&p, &url, &[]).await;
        assert_eq!(r.status, 200);
        assert!(
            r.header("cache-status").contains("applet-unavailable"),
            "{r:?}"
        );
        // Not fetched again for every hit.
        get(&p, &url, &[]).await;
        assert_eq!(origin.hits(path), 3);
    }
    assert_eq!(origin.hits("/applets/missing.wasm"), 1);
    assert_eq!(origin.hits("/notwasm"), 1);
    let s = p.stats().await;
    assert_eq!(applets(&s)["module_compile_failures"], 1, "{s}");
    assert_eq!(applets(&s)["module_unavailable"], 4, "{s}");
    p.stop().await;
}

#[tokio::test]
async fn with_applets_disabled_documents_naming_one_are_not_stored() {
    let origin = TestOrigin::start().await;
    origin.route("/doc", &[("cacheapplet", "/applets/null.wasm")], "doc");
    origin.route("/plain", &[], "plain");
    let p = node(|c| c.applets.enabled = false).await;
    for _ in 0..2 {
        get(&p, &origin.url("/doc"), &[]).await;
        get(&p, &origin.url("/plain"), &[]).await;
    }
    assert_eq!(origin.hits("/doc"), 2);
    assert_eq!(origin.hits("/plain"), 1);
    let s = p.stats().await;
    assert_eq!(s["applets_not_stored"], 2, "{s}");
    assert!(s.get("applets").is_none());
    p.stop().await;
}

#[tokio::test]
async fn an_administrator_binds_a_module_file_to_urls() {
    let origin = TestOrigin::start().await;
    origin.route("/news/a", &[], "<!--#echo var=\"REMOTE_ADDR\" -->");
    origin.route("/other", &[], "<!--#echo var=\"REMOTE_ADDR\" -->");
    let pattern = origin.url("/news/*");
    let p = node(|c| {
        c.applets.bindings = vec![meshcache_applet::Binding {
            urls: pattern,
            module: module_path("ssi").to_string_lossy().into_owned(),
            log: None,
        }]
    })
    .await;
    for path in ["/news/a", "/other"] {
        get(&p, &origin.url(path), &[]).await;
    }
    let r = get(&p, &origin.url("/news/a"), &[]).await;
    assert_eq!(&r.body[..], b"127.0.0.1");
    let r = get(&p, &origin.url("/other"), &[]).await;
    assert_eq!(&r.body[..], b"<!--#echo var=\"REMOTE_ADDR\" -->");
    p.stop().await;
}

#[tokio::test]
async fn a_bound_module_that_does_not_load_stops_the_proxy_from_starting() {
    let mut config = meshcache_proxy::Config::default();
    config.applets.bindings = vec![meshcache_applet::Binding {
        urls: "*".into(),
        module: "/nonexistent/x.wasm".into(),
        log: None,
    }];
    let err = meshcache_proxy::Proxy::new(config).err().expect("refused");
    let text = err.to_string();
    assert!(text.contains("applets.bind[0].module"), "{text}");
}

#[test]
fn the_applet_commands_check_modules_and_run_one() {
    let bin = env!("CARGO_BIN_EXE_meshcache");
    let names = ["null", "log", "ads", "apc", "ssi", "csid"];
    let out = std::process::Command::new(bin)
        .arg("applet")
        .arg("check")
        .args(names.map(module_path))
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches(": ok (")
            .count(),
        6
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let bogus = dir.path().join("bogus.wasm");
    std::fs::write(&bogus, b"not a module").expect("write");
    let out = std::process::Command::new(bin)
        .args(["applet", "check"])
        .arg(&bogus)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("does not compile"),
        "{out:?}"
    );

    let doc = dir.path().join("doc.html");
    std::fs::write(&doc, "hi <!--#echo var=\"REMOTE_ADDR\" -->!").expect("write");
    let out = std::process::Command::new(bin)
        .args(["applet", "run"])
        .arg(module_path("ssi"))
        .args([
            "--url",
            "http://o.example/doc.html",
            "--client",
            "127.0.0.7",
            "--body",
        ])
        .arg(&doc)
        .args(["--doc-header", "Content-Type: text/html"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with("serve a built response: 200 OK"),
        "{stdout}"
    );
    assert!(stdout.contains("content-type: text/html"), "{stdout}");
    assert!(stdout.contains("hi 127.0.0.7!"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_fetching_a_hit_runs_the_applet_there_and_on_its_own_hits() {
    let origin = TestOrigin::start().await;
    origin.module("log");
    origin.route(
        "/shared",
        &[("cacheapplet", "/applets/log.wasm; log=/hits")],
        "shared",
    );
    let nodes = common::full_mesh(&["a", "b"], true, meshcache_dcm::Role::Sibling, |_, c| {
        c.applets.log_interval = Duration::from_millis(50);
    });
    let (a, b) = (&nodes[0], &nodes[1]);
    let url = origin.url("/shared");
    assert_eq!(get(a, &url, &[]).await.x_cache(), "MISS");
    // A first miss through b wakes a up as its peer (a peer never heard from is not waited for).
    origin.route("/warmup", &[], "w");
    get(b, &origin.url("/warmup"), &[]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // b misses, finds the copy at a by ICP and fetches it there: a's hit runs the applet (the
    // peer is its client), and b stores the copy with its CacheApplet header.
    let r = get(b, &url, &[]).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"shared"[..]));
    assert_eq!(
        origin.hits("/shared"),
        1,
        "served by the sibling, not the origin"
    );
    assert!(common::hier_of(b, &url).await.starts_with("SIBLING_HIT/"));
    assert_eq!(applets(&a.stats().await)["runs"], 1);
    // b's own hit runs the applet too.
    assert_eq!(get(b, &url, &[]).await.x_cache(), "HIT");
    let sb = b.stats().await;
    assert_eq!(applets(&sb)["runs"], 1, "{sb}");
    eventually("a record from each node", || {
        origin.posted("/hits").lines().count() == 2
    })
    .await;
    for n in nodes {
        n.stop().await;
    }
}
