//! Listeners, connections and shutdown.
//!
//! [`Proxy::serve`] takes listeners that are already bound (so tests bind `127.0.0.1:0`) and a
//! shutdown future. Each accepted connection holds one permit of a semaphore sized
//! `http.max_connections`: when none is left, accepting pauses and clients wait in the kernel
//! queue. On shutdown the listeners close, every connection is told to finish its current
//! request and close, and `serve` returns once all have (or `http.shutdown_grace` passes).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::accesslog::{AccessLog, AccessRecord};
use crate::cache::{Cache, DiskSettings};
use crate::config::{Config, SocketOptions};
use crate::coop::Coop;
use crate::efficiency::{Category, ConnCategory, Source, Timed};
use crate::guard::{GuardedStream, HeadLimits, ViolationSlot};
use crate::interim::Interim;
use crate::metrics::Metrics;
use crate::outcome::{HierCode, ResultCode};
use crate::sockopt::{self, Side};
use crate::upstream::{Upstream, SWEEP_INTERVAL};
use crate::zerocopy::ZeroCopyStream;
use crate::{admin, headers, service, ProxyError, Shared};

/// Bound sockets for a proxy.
pub struct Listeners {
    /// Client listeners.
    pub http: Vec<TcpListener>,
    /// The admin listener, if enabled.
    pub admin: Option<TcpListener>,
    /// The ICP socket, when the protocol is ICP.
    pub icp: Option<tokio::net::UdpSocket>,
    /// The multicast group socket and what the start-up probe found (multicast protocol).
    pub multicast: Option<crate::coop::multicast::GroupSocket>,
}

impl Listeners {
    /// Binds what `config` asks for.
    pub fn bind(config: &Config) -> Result<Listeners, ProxyError> {
        let http = config
            .http
            .listen
            .iter()
            .map(|a| bind_tcp(*a, &config.http.socket))
            .collect::<Result<Vec<_>, _>>()?;
        let admin = config
            .admin
            .listen
            .map(|a| bind_tcp(a, &SocketOptions::default()))
            .transpose()?;
        let (icp, multicast) = if config.cooperation.protocol.uses_icp() {
            let addr = config.cooperation.icp_listen;
            let socket = std::net::UdpSocket::bind(addr)
                .map_err(|source| ProxyError::Bind { addr, source })?;
            // Before the socket goes non-blocking: the probe waits for its datagram.
            let multicast = crate::coop::multicast::bind(config, &socket)?;
            let ready = || -> std::io::Result<tokio::net::UdpSocket> {
                socket.set_nonblocking(true)?;
                tokio::net::UdpSocket::from_std(socket)
            };
            (
                Some(ready().map_err(|source| ProxyError::Bind { addr, source })?),
                multicast,
            )
        } else {
            (None, None)
        };
        Ok(Listeners {
            http,
            admin,
            icp,
            multicast,
        })
    }

    /// The client listeners' addresses.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.http
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }
}

fn bind_tcp(addr: SocketAddr, opts: &SocketOptions) -> Result<TcpListener, ProxyError> {
    let bind = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        sockopt::set_buffers(&socket, opts)?;
        socket.bind(addr)?;
        socket.listen(1024)
    };
    bind().map_err(|source| ProxyError::Bind { addr, source })
}

/// A proxy node: its shared state, ready to serve.
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    /// Builds a proxy from a validated config (opening the access log).
    pub fn new(config: Config) -> Result<Proxy, ProxyError> {
        Proxy::with_search(config, None)
    }

    /// As [`Proxy::new`], searching for misses by `search` when given instead of by the
    /// configured protocol: a cooperation protocol of the caller's, run by the same driver as
    /// the built-in ones (the configured protocol still says whether the node speaks ICP).
    pub fn with_search(
        config: Config,
        search: Option<Box<dyn meshcache_dcm::engine::SearchProtocol>>,
    ) -> Result<Proxy, ProxyError> {
        config.validate()?;
        let log = match &config.log.access {
            Some(path) => Some(
                AccessLog::open(path, config.log.flush_interval.is_zero())
                    .map_err(|source| ProxyError::AccessLog {
                        path: path.clone(),
                        source,
                    })?
                    .keeping(config.log.rotate),
            ),
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        let arena = if config.store.zero_copy {
            crate::zerocopy::BodyArena::new(config.store.memory)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "no shared memory for large bodies; hits are copied into sockets")
                })
                .ok()
        } else {
            None
        };
        let memory = meshcache_store::StoreConfig {
            capacity: config.store.memory,
            max_object_size: config.store.max_object_size,
            replacement: config.store.replacement,
        };
        let cache =
            Cache::with_disks(memory, arena, &disk_settings(&config)).map_err(ProxyError::Disk)?;
        let resolver = Arc::new(crate::resolve::Resolver::new(&config.dns));
        let upstream = Upstream::with_resolver(config.upstream.clone(), resolver, metrics.clone());
        let via = headers::OwnVia::new(&config.name);
        let x_cache = |what: &str| {
            http::HeaderValue::from_str(&format!("{what} from {}", config.name))
                .unwrap_or_else(|_| http::HeaderValue::from_static("MISS"))
        };
        let (x_cache_hit, x_cache_miss) = (x_cache("HIT"), x_cache("MISS"));
        let applet_built_status =
            http::HeaderValue::from_str(&format!("{}; hit; detail=applet", config.name)).ok();
        let coop = Coop::with_search(&config, search);
        let access = crate::access::Access::new(&config)?;
        let routing = crate::routing::Routing::new(&config)?;
        let auth = match &config.auth {
            Some(auth) => Some(Arc::new(
                meshcache_auth::Authenticator::start(auth).map_err(ProxyError::Auth)?,
            )),
            None => None,
        };
        let errors = match &config.errors.directory {
            None => crate::errorpage::ErrorPages::built_in(&config.name, &config.errors.admin),
            Some(dir) => {
                crate::errorpage::ErrorPages::load(&config.name, &config.errors.admin, dir)
                    .map_err(|source| ProxyError::ErrorPages {
                        path: dir.clone(),
                        source,
                    })?
            }
        };
        let caching = crate::caching::Caching::new(&config)?;
        let applets = crate::applets::Active::new(&config.applets).map_err(ProxyError::Applets)?;
        Ok(Proxy {
            shared: Arc::new(Shared {
                config,
                access,
                routing,
                errors,
                auth,
                cache,
                caching,
                upstream,
                coop,
                applets,
                metrics,
                log,
                via,
                x_cache_hit,
                x_cache_miss,
                applet_built_status,
                clock_ticks: crate::efficiency::clock_ticks(),
            }),
        })
    }

    /// The cache (to subscribe to store events, or inspect it).
    pub fn cache(&self) -> &Cache {
        &self.shared.cache
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Where the node's time went so far: clients, peers, searches, overhead (as `/stats`).
    pub fn efficiency(&self) -> crate::efficiency::EfficiencyReport {
        self.shared.efficiency()
    }

    /// The config in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Rotates the access log (see `AccessLog::rotate`); a failure is logged, and the log
    /// goes on where it was.
    pub fn rotate_logs(&self) {
        let Some(log) = &self.shared.log else {
            return;
        };
        match log.rotate() {
            Ok(()) => tracing::info!(keep = self.shared.config.log.rotate, "access log rotated"),
            Err(e) => {
                tracing::warn!(error = %e, "access log rotation failed; still writing to the old file")
            }
        }
    }

    /// Serves until `shutdown` resolves, then drains connections within the grace period.
    pub async fn serve(
        &self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ProxyError> {
        let shared = &self.shared;
        let (stop_tx, stop_rx) = watch::channel(false);
        let max = shared.config.http.max_connections;
        let permits = Arc::new(Semaphore::new(max));
        let acl: Arc<[IpNet]> = shared.config.http.allow.clone().into();
        let mut tasks = Vec::new();
        // ICP first: a request accepted before the socket is attached would route as if the
        // peers had been asked while no query was sent.
        if let Some(socket) = listeners.icp {
            let socket = Arc::new(socket);
            if let Ok(addr) = socket.local_addr() {
                tracing::info!(%addr, peers = shared.config.peers.len(), "ICP listening");
            }
            shared.coop.attach(socket.clone());
            tasks.push(tokio::spawn(crate::coop::run_icp(
                shared.clone(),
                shared.coop.upkeep(),
                socket,
                stop_rx.clone(),
            )));
        }
        if let Some(m) = shared.coop.multicast() {
            crate::coop::multicast::start(
                &shared.coop,
                m,
                &shared.config,
                listeners.multicast.as_ref(),
            );
            if let Some(socket) = listeners.multicast.and_then(|g| g.socket) {
                tasks.push(tokio::spawn(crate::coop::multicast::run_group(
                    shared.clone(),
                    Arc::new(socket),
                    stop_rx.clone(),
                )));
            }
        }
        if let Some(summaries) = shared.coop.summary_follower() {
            summaries.bind_inbox(shared.config.cooperation.icp_listen.ip());
            // Attached before the first client is accepted: no admission goes unseen.
            if !shared.cache.follow(summaries.clone()) {
                tracing::error!("the store already has a follower; the summary will not see it");
            }
            tasks.push(tokio::spawn(crate::coop::summary::run_local(
                shared.clone(),
                summaries.clone(),
                stop_rx.clone(),
            )));
            tasks.push(tokio::spawn(crate::coop::summary::run_fetch(
                shared.clone(),
                summaries,
                stop_rx.clone(),
            )));
        }
        if let Some(directory) = shared.coop.upkeep().directory.clone() {
            // Subscribed before the first client is accepted: every admission reaches its owner.
            let events = shared.cache.subscribe();
            tasks.push(tokio::spawn(crate::coop::directory::run_updates(
                shared.clone(),
                directory,
                events,
                stop_rx.clone(),
            )));
        }
        // The disks' rebuild announces what it finds as admitted: followers and subscribers
        // are attached by now.
        shared.cache.start();
        for listener in listeners.http {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, name = %shared.config.name, "proxy listening");
            }
            tasks.push(tokio::spawn(accept_loop(
                shared.clone(),
                listener,
                permits.clone(),
                acl.clone(),
                stop_rx.clone(),
            )));
        }
        if let Some(listener) = listeners.admin {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "admin listening");
            }
            tasks.push(tokio::spawn(admin_loop(
                shared.clone(),
                listener,
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(housekeeping(shared.clone(), stop_rx.clone())));
        tasks.push(tokio::spawn(crate::applets::run_logs(
            shared.clone(),
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(crate::applets::run_replenish(
            shared.clone(),
            stop_rx.clone(),
        )));
        shutdown.await;
        tracing::info!("shutting down: no new connections, finishing in-flight requests");
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        let all = u32::try_from(max).unwrap_or(u32::MAX);
        let drained =
            tokio::time::timeout(shared.config.http.shutdown_grace, permits.acquire_many(all))
                .await;
        if drained.is_err() {
            tracing::warn!(
                open = max - permits.available_permits(),
                "grace period over; closing remaining connections"
            );
        }
        if let Some(log) = &shared.log {
            log.flush();
        }
        // What the disks' queues hold is written and synced before the node stops.
        let cache = shared.cache.clone();
        let _ = tokio::task::spawn_blocking(move || cache.close(DISK_CLOSE_TIMEOUT)).await;
        Ok(())
    }
}

/// How long a stopping node waits for its disks' queues to be written.
const DISK_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of writes that may wait in a disk's queue; more are dropped (the objects stay in
/// memory, or are fetched again).
const DISK_QUEUE_BYTES: u64 = 64 << 20;

/// The cache's disks as the config names them.
fn disk_settings(config: &Config) -> DiskSettings {
    DiskSettings {
        disks: config
            .store
            .disks
            .iter()
            .map(|d| meshcache_disk::DiskConfig {
                path: d.path.clone(),
                size: d.size,
                sync_interval: d.sync_interval,
                replacement: config.store.replacement,
                max_object_size: config.store.max_object_size,
                queue_bytes: DISK_QUEUE_BYTES,
            })
            .collect(),
        open_files: open_files_within_limit(config.store.open_files),
    }
}

/// `store.open_files`, at most a quarter of the process's open-file limit (the rest is for
/// connections); the clamp is logged.
fn open_files_within_limit(wanted: u64) -> u64 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let allowed = limit / 4;
    if wanted > allowed {
        tracing::warn!(
            wanted,
            allowed,
            limit,
            "store.open_files is more than a quarter of the open-file limit (ulimit -n): using a quarter"
        );
    }
    wanted.min(allowed)
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    acl: Arc<[IpNet]>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let allowed = acl.iter().any(|net| net.contains(&peer.ip()));
        shared
            .metrics
            .client_connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !allowed {
            shared
                .metrics
                .client_denied
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            serve_connection(shared, stream, peer, allowed, stop).await;
            drop(permit);
        });
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    allowed: bool,
    mut stop: watch::Receiver<bool>,
) {
    let cfg = &shared.config.http;
    // The buffer sizes came with the listener's; TCP_NODELAY is set here.
    sockopt::connected(&stream, &cfg.socket, Side::Client, &shared.metrics.sockets);
    let slot = ViolationSlot::default();
    let limits = HeadLimits {
        max_bytes: usize::try_from(cfg.max_header_bytes).unwrap_or(usize::MAX),
        max_headers: cfg.max_headers,
    };
    let interim = Arc::new(Interim::new(&stream));
    let stream = ZeroCopyStream::new(stream, interim.clone());
    let io = GuardedStream::new(stream, limits, slot.clone())
        .with_timeouts(cfg.idle_timeout, cfg.header_read_timeout);
    let svc_shared = shared.clone();
    let svc_slot = slot.clone();
    // Who the connection works for, decided per request (a peer's requests carry its Via);
    // until its first request, nobody (its time is overhead).
    let category = Arc::new(ConnCategory::unattributed());
    let svc_category = category.clone();
    let svc_interim = interim.clone();
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let who = if svc_shared.coop.is_peer_request(peer.ip(), req.headers()) {
            Category::Peer
        } else {
            Category::Client
        };
        svc_category.begin_request(who);
        svc_shared.metrics.efficiency.count_request(who);
        let relay = svc_interim.begin(req.version());
        service::handle(
            svc_shared.clone(),
            peer,
            allowed,
            svc_slot.clone(),
            relay,
            req,
        )
    });
    let conn = http1::Builder::new()
        // The guard bounds heads already; hyper's buffer only needs room for one.
        .max_buf_size(limits.max_bytes.saturating_add(1024).max(8192))
        .max_headers(cfg.max_headers)
        .serve_connection(TokioIo::new(Box::pin(io)), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let efficiency = &shared.metrics.efficiency;
    let timed = Source::Cell(&category);
    let result = tokio::select! {
        r = Timed::new(conn.as_mut(), efficiency, timed) => r,
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            Timed::new(conn.as_mut(), efficiency, timed).await
        }
    };
    let violation = slot.lock().take();
    let refused = match violation {
        // A bad head: the guard answered it; log it as Squid logs a bad request.
        Some(v) if !v.mid_body => Some((v.status, v.reason)),
        // A bad body: the request that carried it has logged itself.
        Some(_) => None,
        None => match &result {
            // Anything the guard let through but hyper still refused (hyper answered it).
            Err(e) if e.is_parse() || e.is_parse_too_large() => Some((
                if e.is_parse_too_large() { 431 } else { 400 },
                e.to_string(),
            )),
            _ => None,
        },
    };
    if let Some((status, reason)) = refused {
        shared
            .metrics
            .invalid_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(client = %peer, status, %reason, "refused a request head");
        shared
            .metrics
            .record(ResultCode::NoneNone, 0, Duration::ZERO);
        if let Some(log) = &shared.log {
            log.log(&AccessRecord {
                start: std::time::SystemTime::now(),
                elapsed: Duration::ZERO,
                client: peer.ip(),
                result: ResultCode::NoneNone,
                status,
                bytes: 0,
                method: "NONE",
                url: "",
                hierarchy: HierCode::None,
                timed_out: false,
                aborted: false,
                peer: None,
                content_type: None,
                user: None,
            });
        }
    } else if let Err(e) = result {
        tracing::debug!(client = %peer, error = %e, "client connection ended");
    }
}

async fn admin_loop(shared: Arc<Shared>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            _ = stop.changed() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| admin::handle(shared.clone(), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Flushes the access log and drops expired idle upstream connections, periodically.
async fn housekeeping(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let flush_every = shared.config.log.flush_interval;
    let mut flush = tokio::time::interval(if flush_every.is_zero() {
        SWEEP_INTERVAL
    } else {
        flush_every
    });
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = flush.tick() => {
                if let Some(log) = &shared.log {
                    log.flush();
                }
            }
            _ = sweep.tick() => shared.upstream.sweep(),
            _ = stop.changed() => return,
        }
    }
}
