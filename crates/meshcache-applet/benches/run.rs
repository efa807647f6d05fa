//! The cost of one applet run, by applet and document size: instantiation from the pool, the
//! call, the host functions, the outcome. `cargo bench -p meshcache-applet`.
//!
//! (criterion_group! generates an undocumented public function.)
#![allow(missing_docs)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use meshcache_applet::{AppletConfig, Invocation, Item, Items, Runtime};

struct NoItems;
impl Items for NoItems {
    fn open(&self, _url: &str, _request: &HeaderMap) -> Option<Item> {
        None
    }
}

fn module(name: &str) -> Vec<u8> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../applets/{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn invocation(body: Bytes) -> Invocation {
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("o.test"));
    headers.insert("cookie", HeaderValue::from_static("client-id=c1"));
    Invocation {
        method: Method::GET,
        url: "http://o.test/doc".into(),
        origin: "http://o.test".into(),
        headers,
        client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        document: Item {
            status: StatusCode::OK,
            headers: Arc::from(vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/html"),
            )]),
            body,
        },
        log_to: Arc::from("http://o.test/log"),
    }
}

fn runs(c: &mut Criterion) {
    let rt = Runtime::new(AppletConfig::default()).expect("runtime");
    let items: Arc<dyn Items> = Arc::new(NoItems);
    let mut group = c.benchmark_group("run");
    for name in ["null", "log", "ssi"] {
        let applet = rt.compile(&module(name)).expect("compiles");
        for size in [500usize, 5_000, 50_000] {
            let mut body = b"<p><!--#echo var=\"DATE_GMT\" --></p>".to_vec();
            body.resize(size, b'x');
            let body = Bytes::from(body);
            group.bench_with_input(BenchmarkId::new(name, size), &body, |b, body| {
                b.iter(|| rt.run(&applet, invocation(body.clone()), items.clone()))
            });
        }
    }
    group.finish();
}

/// A run as the proxy makes it: the request (headers, URL, the document's names) lent by a
/// caller who keeps it from hit to hit, the document's headers and body shared with the cache.
/// What this adds over an empty run is the runtime's own cost per hit.
fn lent(c: &mut Criterion) {
    let rt = Runtime::new(AppletConfig::default()).expect("runtime");
    let items: Arc<dyn Items> = Arc::new(NoItems);
    let mut inv = invocation(Bytes::from(vec![b'x'; 5_000]));
    let mut group = c.benchmark_group("lent");
    for name in ["null", "log"] {
        let applet = rt.compile(&module(name)).expect("compiles");
        group.bench_function(BenchmarkId::new(name, 5_000), |b| {
            b.iter(|| {
                let (verdict, spent) = rt.run_deferred(&applet, inv.lend(), &items);
                rt.replenish(&applet, spent);
                verdict
            })
        });
    }
    group.finish();
}

/// The same applet run on every core at once, as a busy proxy runs it: what the runs share
/// (counters, the applet's ready instances, the ticker) costs more when cores take turns with
/// it. Reported per run, against one thread alone.
fn shared(c: &mut Criterion) {
    let rt = Runtime::new(AppletConfig::default()).expect("runtime");
    let items: Arc<dyn Items> = Arc::new(NoItems);
    let applet = rt.compile(&module("null")).expect("compiles");
    let body = Bytes::from(vec![b'x'; 5_000]);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut group = c.benchmark_group("null on every core");
    for n in [1, threads] {
        group.bench_function(BenchmarkId::new("threads", n), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(n as u64);
                let start = std::time::Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..n {
                        s.spawn(|| {
                            for _ in 0..per {
                                rt.run(&applet, invocation(body.clone()), items.clone());
                            }
                        });
                    }
                });
                // Each thread's time per run (the cost one hit sees), times the runs asked for.
                start.elapsed().mul_f64(iters as f64 / per.max(1) as f64)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, runs, lent, shared);
criterion_main!(benches);
