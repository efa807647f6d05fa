//! Two tiers against one: the hit ratio of a node with a small memory store and a disk, against
//! a node whose memory store alone is as large as both, on the same Zipf request stream over a
//! working set 20 times the small memory store. Also the latency of disk hits against memory
//! hits. Real proxies, a real origin and real sockets on loopback, in this process.
//!
//! `cargo bench -p meshcache --bench tiers [-- --requests N --disk-share F --alpha A]`
//!
//! * working set: objects of 1–128 KiB (log-uniform, by rank), 20 × `--memory` bytes in all;
//! * requests: `--requests` (default 100,000) ranks drawn from Zipf(`--alpha`, default 0.8),
//!   the same seeded stream for every node, sent by 4 clients on persistent connections;
//! * nodes: `tiered` (memory `--memory`, default 8 MiB, and a disk of `--disk-share` × the working
//!   set, default 1.0), `one store` (memory alone of the same total), `disk-sized store` (memory
//!   alone of the disk's size: the tiers are inclusive, every object in memory is on disk too),
//!   and `memory only` (`--memory` alone, for scale).
//!
//! Prints the hit ratios (each node's own count of hits, from `/stats`), the difference, and
//! the latency of each kind of hit as the clients saw it. Not a test: nothing is asserted.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use meshcache_lab::Origin;
use meshcache_proxy::config::DiskSection;
use meshcache_proxy::{Config, Listeners, Proxy};
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    requests: usize,
    memory: u64,
    disk_share: f64,
    alpha: f64,
}

fn args() -> Args {
    let mut a = Args {
        requests: 100_000,
        memory: 8 << 20,
        disk_share: 1.0,
        alpha: 0.8,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--requests" => a.requests = value.parse().expect("--requests N"),
            "--memory" => a.memory = value.parse().expect("--memory BYTES"),
            "--disk-share" => a.disk_share = value.parse().expect("--disk-share F"),
            "--alpha" => a.alpha = value.parse().expect("--alpha A"),
            // cargo bench passes --bench.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// Object `rank`'s size: log-uniform in 1–128 KiB, a fixed function of the rank.
fn size_of(rank: u64) -> u64 {
    let mut z = rank.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    (1024.0 * 128f64.powf(u)) as u64
}

fn path_of(rank: u64) -> String {
    format!("/z{rank}?size={}&cc=max-age%3D86400", size_of(rank))
}

struct Node {
    proxy: Arc<Proxy>,
    addr: SocketAddr,
    admin: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start(memory: u64, disk: Option<(&std::path::Path, u64)>) -> Node {
    let mut config = Config::default();
    config.http.listen = vec!["127.0.0.1:0".parse().expect("addr")];
    config.admin.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.log.access = None;
    config.store.memory = memory;
    config.store.max_object_size = 1 << 20;
    if let Some((dir, size)) = disk {
        config.store.disks = vec![DiskSection {
            path: dir.to_owned(),
            size,
            sync_interval: Duration::from_secs(5),
        }];
    }
    let listeners = Listeners::bind(&config).expect("bind");
    let addr = listeners.http[0].local_addr().expect("addr");
    let admin = listeners
        .admin
        .as_ref()
        .expect("admin")
        .local_addr()
        .expect("addr");
    let proxy = Arc::new(Proxy::new(config).expect("proxy"));
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let p = proxy.clone();
    let task = tokio::spawn(async move {
        let _ = p
            .serve(listeners, async {
                let _ = rx.await;
            })
            .await;
    });
    Node {
        proxy,
        addr,
        admin,
        stop,
        task,
    }
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    url: &str,
    host: &str,
) -> (u16, String, String) {
    let req = Request::get(url)
        .header("host", host)
        .body(Empty::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (x_cache, cache_status) = (header("x-cache"), header("cache-status"));
    resp.into_body().collect().await.expect("body");
    (status, x_cache, cache_status)
}

async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn stats(admin: SocketAddr) -> serde_json::Value {
    let mut s = connect(admin).await;
    let req = Request::get("/stats")
        .header("host", admin.to_string())
        .body(Empty::<Bytes>::new())
        .expect("request");
    let body = s
        .send_request(req)
        .await
        .expect("stats")
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&body).expect("json")
}

/// Latencies (µs) by kind of answer.
#[derive(Default)]
struct Latencies {
    memory: Vec<u32>,
    disk: Vec<u32>,
    miss: Vec<u32>,
}

fn quantile(v: &mut [u32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    f64::from(v[i]) / 1000.0
}

/// Sends `stream` through `node` with 4 clients; returns its hit ratio and the latencies.
async fn drive(node: &Node, origin: &Origin, stream: &Arc<Vec<u64>>) -> (f64, Latencies) {
    let clients = 4;
    let host = origin.addr().to_string();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (stream, host, addr) = (stream.clone(), host.clone(), node.addr);
            let base = origin.url("");
            tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let mut lat = Latencies::default();
                for &rank in stream.iter().skip(c).step_by(clients) {
                    let url = format!("{}{}", base.trim_end_matches('/'), path_of(rank));
                    let t = Instant::now();
                    let (status, x_cache, cache_status) = get(&mut sender, &url, &host).await;
                    assert_eq!(status, 200, "{url}");
                    let us = t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                    if x_cache.starts_with("HIT") {
                        if cache_status.contains("detail=disk") {
                            lat.disk.push(us);
                        } else {
                            lat.memory.push(us);
                        }
                    } else {
                        lat.miss.push(us);
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Latencies::default();
    for t in tasks {
        let l = t.await.expect("client");
        all.memory.extend(l.memory);
        all.disk.extend(l.disk);
        all.miss.extend(l.miss);
    }
    let s = stats(node.admin).await;
    let hits = s["hits"].as_f64().unwrap_or(0.0);
    let requests = s["requests"].as_f64().unwrap_or(1.0);
    (hits / requests, all)
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let origin = Origin::start().await.expect("origin");
        let working_set_goal = a.memory * 20;
        let mut objects = 0u64;
        let mut working_set = 0u64;
        while working_set < working_set_goal {
            working_set += size_of(objects);
            objects += 1;
        }
        let disk = ((working_set as f64 * a.disk_share) as u64).max(8 << 20);
        let zipf = Zipf::new(objects as f64, a.alpha).expect("zipf");
        let mut rng = rand_pcg::Pcg64::seed_from_u64(29);
        let stream: Arc<Vec<u64>> = Arc::new(
            (0..a.requests)
                .map(|_| zipf.sample(&mut rng) as u64 - 1)
                .collect(),
        );
        let distinct = {
            let mut seen = std::collections::HashSet::new();
            stream.iter().filter(|r| seen.insert(**r)).count()
        };
        println!(
            "working set: {objects} objects, {:.1} MiB (20 x memory {:.1} MiB); {} requests, Zipf alpha {}, {distinct} distinct objects asked for (best possible hit ratio {:.2} %)",
            working_set as f64 / 1048576.0,
            a.memory as f64 / 1048576.0,
            a.requests,
            a.alpha,
            100.0 * (1.0 - distinct as f64 / a.requests as f64)
        );
        println!(
            "disk: {:.1} MiB ({} x the working set)",
            disk as f64 / 1048576.0,
            a.disk_share
        );
        let dir = tempfile::tempdir().expect("tmp");
        let configs: [(&str, u64, Option<u64>); 4] = [
            ("tiered", a.memory, Some(disk)),
            ("one store", a.memory + disk, None),
            ("disk-sized store", disk, None),
            ("memory only", a.memory, None),
        ];
        let mut ratios = Vec::new();
        println!();
        println!("| node | store | hit ratio | memory hits | disk hits | p50 / p99 memory hit ms | p50 / p99 disk hit ms | p50 / p99 miss ms | seconds |");
        println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (name, memory, disk) in configs {
            let path = dir.path().join(name.replace(' ', "-"));
            let node = start(memory, disk.map(|d| (path.as_path(), d)));
            let t = Instant::now();
            let (ratio, mut lat) = drive(&node, &origin, &stream).await;
            let secs = t.elapsed().as_secs_f64();
            let store = match disk {
                Some(d) => format!(
                    "{:.0} MiB memory + {:.0} MiB disk",
                    memory as f64 / 1048576.0,
                    d as f64 / 1048576.0
                ),
                None => format!("{:.0} MiB memory", memory as f64 / 1048576.0),
            };
            println!(
                "| {name} | {store} | {:.2} % | {} | {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {secs:.1} |",
                100.0 * ratio,
                lat.memory.len(),
                lat.disk.len(),
                quantile(&mut lat.memory, 0.5),
                quantile(&mut lat.memory, 0.99),
                quantile(&mut lat.disk, 0.5),
                quantile(&mut lat.disk, 0.99),
                quantile(&mut lat.miss, 0.5),
                quantile(&mut lat.miss, 0.99),
            );
            if disk.is_some() {
                let s = stats(node.admin).await;
                let d = &s["store"]["disks"][0];
                println!(
                    "|  | (disk: {} objects, {} writes, {} dropped, {} hits; {} open files) | | | | | | | |",
                    d["objects"], d["writes"], d["dropped"], d["hits"], s["store"]["open_files"]
                );
            }
            ratios.push(ratio);
            let _ = node.stop.send(());
            let _ = node.task.await;
            drop(node.proxy);
        }
        println!();
        println!(
            "tiered - one store: {:+.2} points",
            100.0 * (ratios[0] - ratios[1])
        );
    });
}
