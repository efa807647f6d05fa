//! Test harness: a real proxy on an ephemeral loopback port, a real origin, and small clients.
#![allow(dead_code)]

pub mod scripted;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use meshcache_proxy::{Config, Listeners, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// A running proxy.
pub struct Node {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
    pub proxy: Arc<Proxy>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// A proxy whose sockets are bound but which does not serve yet: its addresses are known, so
/// other nodes can name it as a peer before it starts.
pub struct Bound {
    pub config: Config,
    pub listeners: Listeners,
    pub addr: SocketAddr,
    pub icp: Option<SocketAddr>,
    dir: tempfile::TempDir,
}

/// Binds a proxy on 127.0.0.1:0 (and ICP on 127.0.0.1:0 when `icp`), access log written through.
pub fn bind(icp: bool, tweak: impl FnOnce(&mut Config)) -> Bound {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config {
        name: "testcache".into(),
        ..Config::default()
    };
    config.http.listen = vec!["127.0.0.1:0".parse().expect("addr")];
    config.admin.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.log.access = Some(dir.path().join("access.log"));
    config.log.flush_interval = Duration::ZERO;
    if icp {
        config.cooperation.protocol = meshcache_proxy::config::Protocol::Icp;
        config.cooperation.icp_listen = "127.0.0.1:0".parse().expect("addr");
    }
    tweak(&mut config);
    let listeners = Listeners::bind(&config).expect("bind");
    let addr = listeners.http[0].local_addr().expect("addr");
    let icp = listeners
        .icp
        .as_ref()
        .map(|s| s.local_addr().expect("icp addr"));
    if let Some(a) = icp {
        config.cooperation.icp_listen = a;
    }
    Bound {
        config,
        listeners,
        addr,
        icp,
        dir,
    }
}

/// Starts a bound proxy, after a last change to its config (e.g. adding peers).
pub fn start(bound: Bound, tweak: impl FnOnce(&mut Config)) -> Node {
    start_searching(bound, tweak, None)
}

/// As [`start`], searching for misses by `search` when given (a protocol of the test's own).
pub fn start_searching(
    bound: Bound,
    tweak: impl FnOnce(&mut Config),
    search: Option<Box<dyn meshcache_dcm::engine::SearchProtocol>>,
) -> Node {
    let Bound {
        mut config,
        listeners,
        addr,
        dir,
        ..
    } = bound;
    tweak(&mut config);
    let log = config.log.access.clone().expect("log path");
    let admin = listeners
        .admin
        .as_ref()
        .expect("admin")
        .local_addr()
        .expect("addr");
    let proxy = Arc::new(Proxy::with_search(config, search).expect("proxy"));
    let (tx, rx) = oneshot::channel::<()>();
    let p = proxy.clone();
    let task = tokio::spawn(async move {
        p.serve(listeners, async {
            let _ = rx.await;
        })
        .await
        .expect("serve");
    });
    Node {
        addr,
        admin,
        log,
        proxy,
        stop: Some(tx),
        task: Some(task),
        _dir: dir,
    }
}

/// Starts a proxy on 127.0.0.1:0 with the access log written through, after `tweak`.
pub async fn node(tweak: impl FnOnce(&mut Config)) -> Node {
    start(bind(false, tweak), |_| {})
}

impl Node {
    /// Stops the proxy and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .expect("stopped in time")
                .expect("joined");
        }
    }

    /// The access log's lines, once there are at least `n` (waits up to 5 s).
    pub async fn log_lines(&self, n: usize) -> Vec<String> {
        for _ in 0..500 {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            if lines.len() >= n {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "access log never reached {n} lines: {:?}",
            std::fs::read_to_string(&self.log)
        );
    }

    /// The Squid result code (e.g. "TCP_MISS/200") of log line `n` (1-based).
    pub async fn log_code(&self, n: usize) -> String {
        let lines = self.log_lines(n).await;
        lines[n - 1]
            .split_whitespace()
            .nth(3)
            .expect("code field")
            .to_owned()
    }

    /// GET on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        let req = Request::get(path)
            .header("host", self.admin.to_string())
            .body(Empty::<Bytes>::new())
            .expect("req");
        send(self.admin, req).await
    }

    /// `/stats` as JSON.
    pub async fn stats(&self) -> serde_json::Value {
        serde_json::from_slice(&self.admin_get("/stats").await.body).expect("stats json")
    }
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    /// "HIT" or "MISS" from X-Cache.
    pub fn x_cache(&self) -> &str {
        self.header("x-cache")
            .split_whitespace()
            .next()
            .unwrap_or("")
    }
}

/// Sends `req` on a new connection to `addr` and reads the whole response.
pub async fn send(addr: SocketAddr, req: Request<Empty<Bytes>>) -> Reply {
    send_from(None, addr, req).await
}

/// Sends `req` from the source address `from` (any when `None`) on a new connection to `addr`.
pub async fn send_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    req: Request<Empty<Bytes>>,
) -> Reply {
    let fut = async {
        let stream = match from {
            None => TcpStream::connect(addr).await.expect("connect"),
            Some(ip) => {
                let socket = if ip.is_ipv4() {
                    tokio::net::TcpSocket::new_v4()
                } else {
                    tokio::net::TcpSocket::new_v6()
                }
                .expect("socket");
                socket
                    .bind(SocketAddr::new(ip, 0))
                    .expect("bind the source address");
                socket.connect(addr).await.expect("connect")
            }
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("request finished in time")
}

/// A proxy request: method, absolute URL, extra headers.
pub async fn request(
    proxy: SocketAddr,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Reply {
    request_from(None, proxy, method, url, headers).await
}

/// A proxy request from the source address `from`: method, absolute URL (or `host:port` for
/// CONNECT), extra headers.
pub async fn request_from(
    from: Option<std::net::IpAddr>,
    proxy: SocketAddr,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let uri: http::Uri = url.parse().expect("url");
    let mut b = Request::builder()
        .method(method)
        .uri(url)
        .header("host", uri.authority().expect("authority").as_str());
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send_from(from, proxy, b.body(Empty::new()).expect("request")).await
}

/// GET through the proxy.
pub async fn get(proxy: SocketAddr, url: &str) -> Reply {
    request(proxy, "GET", url, &[]).await
}

/// Writes raw bytes and reads until the server closes or 5 s pass.
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An ephemeral loopback port that nothing listens on.
pub async fn dead_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr")
}

/// The hierarchy field (`HIER/peer`) of the first access-log line for `url`, waiting (at most
/// 5 s) for the line to be written.
pub async fn hier_of(node: &Node, url: &str) -> String {
    for _ in 0..500 {
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        if let Some(l) = text
            .lines()
            .find(|l| l.split_whitespace().nth(6) == Some(url))
        {
            return l.split_whitespace().nth(8).unwrap_or("").to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no log line for {url}");
}

/// Nodes named `names` (ICP on when `icp`), each listing every other as a peer in `role`;
/// `tweak` sets each node's config (it gets the node's name) before its sockets are bound.
pub fn full_mesh(
    names: &[&str],
    icp: bool,
    role: meshcache_dcm::Role,
    tweak: impl Fn(&str, &mut Config),
) -> Vec<Node> {
    let bound: Vec<Bound> = names
        .iter()
        .map(|name| {
            bind(icp, |c| {
                c.name = (*name).into();
                tweak(name, c);
            })
        })
        .collect();
    let addrs: Vec<(SocketAddr, Option<SocketAddr>)> =
        bound.iter().map(|b| (b.addr, b.icp)).collect();
    bound
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            start(b, |c| {
                c.peers = (0..names.len())
                    .filter(|&j| j != i)
                    .map(|j| {
                        meshcache_proxy::config::PeerConfig::new(
                            names[j], role, addrs[j].0, addrs[j].1,
                        )
                    })
                    .collect();
            })
        })
        .collect()
}

/// Waits (at most 5 s) until `node` has heard an ICP reply from its peer `i`.
pub async fn wait_icp_alive(node: &Node, i: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let s = node.stats().await;
        if s["peers"][i]["icp_alive"] == true {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "peer {i} never answered ICP: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 5 s) until `origin` has received a request for `path` (its path and query).
pub async fn at_origin(origin: &meshcache_lab::Origin, path: &str) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while origin.hits(path) == 0 {
        assert!(
            std::time::Instant::now() < until,
            "{path} never reached the origin"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `[[access]]` rules written as in a config file.
pub fn access_rules(toml_rules: &str) -> Vec<meshcache_policy::RuleConfig> {
    #[derive(serde::Deserialize)]
    struct File {
        access: Vec<meshcache_policy::RuleConfig>,
    }
    let file: File = toml::from_str(toml_rules).expect("test rules");
    file.access
}
