//! Active Cache in the proxy: which stored documents carry an applet, getting its module, running
//! it on a hit, and delivering its log records to the origin.
//!
//! ```text
//! store time:  CacheApplet header ─ refused (other origin) ─► log line, counted, header ignored
//!                                 └ applets disabled ───────► not stored (no hit could run it)
//! hit:  plan (header, else a [[applets.bind]]) ─► module (compiled, or fetched from the
//!       origin and compiled once) ─► run ─► Cached: serve the stored copy
//!                                        ├► Built: serve the applet's response
//!                                        └► Origin (asked, trap, limit, no module): a miss
//! background:  log spool ─► POST batches to each destination, backing off on failure
//! ```
//!
//! A run happens on the request's own task: a hit with a well-behaved applet costs a few
//! microseconds, and a runaway one is cut off at its CPU deadline (`applets.cpu`, scaled by
//! the document's size up to `applets.cpu_max`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{request, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use meshcache_applet::header::{self as applet_header, Attachment};
use meshcache_applet::{
    Applet, AppletConfig, Built, Counter, Hit, Item, Items, Reason, Runtime, Spent, Verdict,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::attachment::{Attached, Source};
use crate::cache::CachedObject;
use crate::semantics::Usability;
use crate::Shared;

/// How long a module that could not be fetched or compiled is not asked for again.
const FAILED_MODULE_RETRY: Duration = Duration::from_secs(30);

/// Counters of the proxy's side of Active Cache (the runtime counts the runs).
#[derive(Debug, Default)]
pub struct ProxyCounters {
    /// `CacheApplet` headers refused (another origin, malformed): ignored.
    pub refused: AtomicU64,
    /// Modules fetched from origins.
    pub module_fetches: AtomicU64,
    /// Hits sent to the origin because their module could not be had.
    pub module_unavailable: AtomicU64,
    /// Log batches POSTed successfully.
    pub log_posts: AtomicU64,
    /// Log POSTs that failed (the batch is retried).
    pub log_post_failures: AtomicU64,
}

/// Where a bound applet's module comes from.
enum BoundModule {
    /// Compiled at start from a file.
    File(Arc<Applet>),
    /// Fetched from this URL.
    Url(String),
}

struct Bound {
    urls: String,
    module: BoundModule,
    log: Option<String>,
}

enum Slot {
    Ready { applet: Arc<Applet>, at: Instant },
    Failed { until: Instant, why: String },
}

/// A run whose hit was answered: its applet and what it left to release.
type Answered = (Arc<Applet>, Spent);

/// The proxy's Active Cache state: the runtime, the bindings, the modules by URL.
pub struct Active {
    runtime: Runtime,
    bindings: Vec<Bound>,
    modules: Mutex<HashMap<String, Slot>>,
    /// One fetch at a time per module URL: the other first hits wait for it.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Runs whose instance waits to be released, and the next one made, after the answer; and
    /// the end [`run_replenish`] takes (until it does, a run releases its instance itself).
    spent: mpsc::Sender<Answered>,
    spent_rx: Mutex<Option<mpsc::Receiver<Answered>>>,
    /// The cache as the applets' `item_open` sees it.
    items: std::sync::OnceLock<Arc<dyn Items>>,
    /// Counters.
    pub counters: ProxyCounters,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active")
            .field("bindings", &self.bindings.len())
            .finish()
    }
}

/// What a hit does after its applet ran.
pub(crate) enum Gate {
    /// Serve the stored copy.
    Serve,
    /// Serve this response.
    Built(Built),
    /// Handle as a miss; the token says why (for `Cache-Status`).
    Origin(&'static str),
}

impl Active {
    /// Starts the runtime and compiles file-bound modules; `None` when applets are disabled.
    pub fn new(config: &AppletConfig) -> Result<Option<Arc<Active>>, String> {
        if !config.enabled {
            return Ok(None);
        }
        let runtime = Runtime::new(config.clone()).map_err(|e| e.to_string())?;
        let mut bindings = Vec::new();
        for (i, b) in config.bindings.iter().enumerate() {
            let module = if b.module.starts_with("http://") {
                BoundModule::Url(b.module.clone())
            } else {
                let bytes = std::fs::read(&b.module)
                    .map_err(|e| format!("applets.bind[{i}].module {:?}: {e}", b.module))?;
                let applet = runtime
                    .compile(&bytes)
                    .map_err(|e| format!("applets.bind[{i}].module {:?}: {e}", b.module))?;
                BoundModule::File(applet)
            };
            bindings.push(Bound {
                urls: b.urls.clone(),
                module,
                log: b.log.clone(),
            });
        }
        // Each waiting run holds a pool slot: at most a quarter of the pool waits.
        let (spent, spent_rx) = mpsc::channel((config.instances as usize / 4).max(1));
        Ok(Some(Arc::new(Active {
            runtime,
            bindings,
            modules: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            spent,
            spent_rx: Mutex::new(Some(spent_rx)),
            items: std::sync::OnceLock::new(),
            counters: ProxyCounters::default(),
        })))
    }

    /// Hands a run's instance to [`run_replenish`], which releases it and makes the applet's
    /// next one once this task has answered. While that task does not run, or when too many
    /// runs wait for it, the instance is released here and now.
    fn after_answer(&self, applet: &Arc<Applet>, spent: Spent) {
        if spent.is_empty() {
            // Its instance was rewound and kept for the next hit: nothing to do.
            return;
        }
        let replenishing = self.spent_rx.lock().is_none();
        if replenishing {
            if let Err(e) = self.spent.try_send((applet.clone(), spent)) {
                drop(e.into_inner());
            }
        } else {
            drop(spent);
        }
    }

    /// The applet a stored document runs: its own `CacheApplet`, else the first binding.
    fn attachment(&self, url: &str, object: &CachedObject) -> Option<Arc<Attached>> {
        let origin = applet_header::origin_of(url)?;
        if let Some(v) = object.header(&CACHE_APPLET) {
            if let Ok(Attachment { module, log }) = applet_header::parse(url, v.as_bytes()) {
                return Some(Arc::new(Attached {
                    module: Source::Url(module),
                    log_to: Arc::from(log),
                    origin: Arc::from(origin),
                }));
            }
        }
        let b = self
            .bindings
            .iter()
            .find(|b| meshcache_applet::config::glob_match(&b.urls, url))?;
        let log_to = |default: &str| match &b.log {
            Some(l) => applet_header::resolve(&origin, l).unwrap_or_else(|_| default.to_owned()),
            None => default.to_owned(),
        };
        let (module, log_to) = match &b.module {
            BoundModule::File(a) => (Source::Compiled(a.clone()), log_to(&format!("{origin}/"))),
            BoundModule::Url(u) => (Source::Url(u.clone()), log_to(u)),
        };
        Some(Arc::new(Attached {
            module,
            log_to: Arc::from(log_to),
            origin: Arc::from(origin),
        }))
    }

    /// The compiled module at a module URL, if it is cached and within its TTL.
    fn ready_at(&self, url: &str) -> Option<Arc<Applet>> {
        match self.modules.lock().get(url) {
            Some(Slot::Ready { applet, at }) if at.elapsed() < self.runtime.config().module_ttl => {
                Some(applet.clone())
            }
            _ => None,
        }
    }

    /// The compiled module at a module URL: cached, or fetched (again, after its TTL).
    async fn applet_at(
        self: &Arc<Self>,
        shared: &Shared,
        url: &str,
    ) -> Result<Arc<Applet>, String> {
        match self.ready_at(url) {
            Some(applet) => Ok(applet),
            None => self.module(shared, url).await,
        }
    }

    /// The compiled module at `url`: fetched from its origin and compiled on first use.
    async fn module(self: &Arc<Self>, shared: &Shared, url: &str) -> Result<Arc<Applet>, String> {
        let flight = self
            .fetching
            .lock()
            .entry(url.to_owned())
            .or_default()
            .clone();
        let _one_at_a_time = flight.lock().await;
        // Another hit may have fetched it (or failed to) while this one waited.
        match self.modules.lock().get(url) {
            Some(Slot::Ready { applet, at }) if at.elapsed() < self.runtime.config().module_ttl => {
                return Ok(applet.clone())
            }
            Some(Slot::Failed { until, why }) if Instant::now() < *until => return Err(why.clone()),
            _ => {}
        }
        let got = self.fetch_and_compile(shared, url).await;
        self.fetching.lock().remove(url);
        got
    }

    async fn fetch_and_compile(
        self: &Arc<Self>,
        shared: &Shared,
        url: &str,
    ) -> Result<Arc<Applet>, String> {
        self.counters.module_fetches.fetch_add(1, Relaxed);
        let got = match fetch_module(shared, url, self.runtime.config().max_module).await {
            Ok(bytes) => {
                let me = self.clone();
                tokio::task::spawn_blocking(move || me.runtime.compile(&bytes))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Err(e) => Err(e),
        };
        let mut modules = self.modules.lock();
        if modules.len() >= self.runtime.config().max_modules && !modules.contains_key(url) {
            // Make room: the slot loaded longest ago goes (a failure's retry time counts as
            // its load time).
            let oldest = modules
                .iter()
                .min_by_key(|(_, slot)| match slot {
                    Slot::Ready { at, .. } => *at,
                    Slot::Failed { until, .. } => *until - FAILED_MODULE_RETRY,
                })
                .map(|(u, _)| u.clone());
            if let Some(oldest) = oldest {
                modules.remove(&oldest);
            }
        }
        match got {
            Ok(applet) => {
                modules.insert(
                    url.to_owned(),
                    Slot::Ready {
                        applet: applet.clone(),
                        at: Instant::now(),
                    },
                );
                Ok(applet)
            }
            Err(why) => {
                tracing::warn!(module = url, error = %why, "applet module unavailable; its documents' hits go to the origin");
                modules.insert(
                    url.to_owned(),
                    Slot::Failed {
                        until: Instant::now() + FAILED_MODULE_RETRY,
                        why: why.clone(),
                    },
                );
                Err(why)
            }
        }
    }

    /// Counters and gauges for `/stats` and `/metrics`.
    pub fn report(&self) -> serde_json::Value {
        let c = &self.runtime.counters;
        let p = &self.counters;
        let l = &self.runtime.logs.counters;
        let g = |a: &AtomicU64| a.load(Relaxed);
        serde_json::json!({
            "runs": c.get(Counter::Runs),
            "cached": c.get(Counter::Cached),
            "built": c.get(Counter::Built),
            "asked_origin": c.get(Counter::AskedOrigin),
            "traps": c.get(Counter::Traps),
            "timeouts": c.get(Counter::Timeouts),
            "memory_overruns": c.get(Counter::Memory),
            "output_overruns": c.get(Counter::Output),
            "invalid_results": c.get(Counter::Invalid),
            "instantiate_failures": c.get(Counter::Instantiate),
            "made_ahead": c.get(Counter::MadeAhead),
            "rewound": c.get(Counter::Rewound),
            "ready_ahead": self.runtime.ready_ahead(),
            "ticker_sleeps": self.runtime.ticker_sleeps(),
            "quarantined": c.get(Counter::Quarantined),
            "quarantines": c.get(Counter::Quarantines),
            "kv_rejected": c.get(Counter::KvRejected),
            "run_micros": c.get(Counter::RunNanos) / 1000,
            "modules_compiled": c.get(Counter::Compiled),
            "module_compile_failures": c.get(Counter::CompileFailed),
            "module_fetches": g(&p.module_fetches),
            "module_unavailable": g(&p.module_unavailable),
            "refused_headers": g(&p.refused),
            "log_records_queued": g(&l.queued),
            "log_records_delivered": g(&l.delivered),
            "log_records_dropped": g(&l.dropped),
            "log_posts": g(&p.log_posts),
            "log_post_failures": g(&p.log_post_failures),
        })
    }
}

static CACHE_APPLET: header::HeaderName = header::HeaderName::from_static(applet_header::NAME);

/// Store time: may a response naming an applet be stored? Refusals are logged and counted here,
/// once per stored response, so hits need not repeat them.
pub(crate) fn admit(shared: &Shared, url: &str, headers: &HeaderMap) -> bool {
    let Some(v) = headers.get(&CACHE_APPLET) else {
        return true;
    };
    let Some(active) = &shared.applets else {
        shared.metrics.applets_not_stored.fetch_add(1, Relaxed);
        return false;
    };
    if let Err(why) = applet_header::parse(url, v.as_bytes()) {
        active.counters.refused.fetch_add(1, Relaxed);
        tracing::warn!(url, value = ?v, reason = %why, "CacheApplet header ignored");
    }
    true
}

/// The proxy's cache, as applets see it: fresh objects only, matched with the client's request
/// headers (for `Vary`). One per proxy, made on the first hit with an applet; it does not keep
/// the proxy alive.
struct CacheItems {
    shared: std::sync::Weak<Shared>,
}

impl Items for CacheItems {
    fn open(&self, url: &str, request: &HeaderMap) -> Option<Item> {
        let shared = self.shared.upgrade()?;
        let found = shared.cache.lookup(url, request)?;
        let o = found.object();
        let directives = crate::directives::RequestDirectives::parse(request);
        match o
            .freshness
            .usability(&directives, std::time::SystemTime::now())
        {
            Usability::Fresh | Usability::StaleAllowed => item_of(o),
            _ => None,
        }
    }
}

/// A stored object as an applet sees it: its status, headers and body, shared with the cache.
/// A body mapped from a disk's file is read into memory first (with `pread`, so that a device
/// error is an error, not a signal): an applet reads every byte it is given. `None` when that
/// read fails.
fn item_of(o: &CachedObject) -> Option<Item> {
    Some(Item {
        status: o.status,
        headers: o.headers.clone(),
        body: crate::zerocopy::mapped::resident(&o.body).ok()?,
    })
}

/// Runs the applet of a stored document, if it has one, for this hit, when its module is at
/// hand (compiled at start, or fetched and compiled by an earlier hit and within its TTL): the
/// usual case, with no future to make. `None` when the module must be fetched first: then
/// [`on_hit_fetching`] does it and runs the applet. The request's headers are lent to the run
/// and come back as they were.
pub(crate) fn on_hit(
    shared: &Arc<Shared>,
    req: &mut request::Parts,
    url: &str,
    client: IpAddr,
    object: &CachedObject,
) -> Option<Gate> {
    let Some((active, attached)) = attachment(shared, url, object) else {
        return Some(Gate::Serve);
    };
    let fetched;
    let applet = match &attached.module {
        Source::Compiled(applet) => applet,
        Source::Url(module) => {
            fetched = active.ready_at(module)?;
            &fetched
        }
    };
    Some(run(
        shared, active, attached, applet, req, url, client, object,
    ))
}

/// [`on_hit`] for a document whose module is known by its URL: fetched (or found fetched) and
/// compiled first.
pub(crate) async fn on_hit_fetching(
    shared: &Arc<Shared>,
    req: &mut request::Parts,
    url: &str,
    client: IpAddr,
    object: &CachedObject,
) -> Gate {
    let Some((active, attached)) = attachment(shared, url, object) else {
        return Gate::Serve;
    };
    let applet = match &attached.module {
        Source::Compiled(applet) => applet.clone(),
        Source::Url(module) => match active.applet_at(shared, module).await {
            Ok(applet) => applet,
            Err(_) => {
                active.counters.module_unavailable.fetch_add(1, Relaxed);
                return Gate::Origin("applet-unavailable");
            }
        },
    };
    run(shared, active, attached, &applet, req, url, client, object)
}

/// The document's applet, if it has one (worked out on its first hit and kept with it). Borrowed,
/// not cloned: a clone is an atomic add and subtract on a count that every hit of the document
/// shares (a cache line moved between cores when they run on several).
fn attachment<'o>(
    shared: &'o Shared,
    url: &str,
    object: &'o CachedObject,
) -> Option<(&'o Arc<Active>, &'o Attached)> {
    let active = shared.applets.as_ref()?;
    let attached = object
        .applet
        .get_or_init(|| active.attachment(url, object))
        .as_deref()?;
    Some((active, attached))
}

/// Runs `applet` for the hit, and says what to answer.
#[allow(clippy::too_many_arguments)]
fn run(
    shared: &Arc<Shared>,
    active: &Active,
    attached: &Attached,
    applet: &Arc<Applet>,
    req: &mut request::Parts,
    url: &str,
    client: IpAddr,
    object: &CachedObject,
) -> Gate {
    let Some(document) = item_of(object) else {
        return Gate::Origin("disk-error");
    };
    let hit = Hit {
        method: &req.method,
        url,
        origin: &attached.origin,
        headers: &mut req.headers,
        client,
        document,
        log_to: &attached.log_to,
    };
    let items = active.items.get_or_init(|| {
        Arc::new(CacheItems {
            shared: Arc::downgrade(shared),
        })
    });
    let (verdict, spent) = active.runtime.run_deferred(applet, hit, items);
    active.after_answer(applet, spent);
    match verdict {
        Verdict::Cached => Gate::Serve,
        Verdict::Built(b) => Gate::Built(b),
        Verdict::Origin(reason) => {
            if !matches!(reason, Reason::Asked | Reason::Quarantined) {
                tracing::info!(url, reason = ?reason, "applet failed; the request goes to the origin");
            }
            Gate::Origin(match reason {
                Reason::Asked => "applet-origin",
                Reason::Trap(_) => "applet-trap",
                Reason::Timeout => "applet-timeout",
                Reason::Memory => "applet-memory",
                Reason::Output => "applet-output",
                Reason::Invalid(_) => "applet-invalid",
                Reason::Instantiate(_) => "applet-instantiate",
                Reason::Quarantined => "applet-quarantined",
            })
        }
    }
}

/// Where an absolute `http://` URL points: host, port, origin-form path, and the `Host` header.
struct UrlParts {
    host: String,
    port: u16,
    path: Uri,
    host_header: HeaderValue,
}

fn split_url(url: &str) -> Option<UrlParts> {
    let uri: Uri = url.parse().ok()?;
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let auth = uri.authority()?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Some(UrlParts {
        host: auth.host().to_owned(),
        port: auth.port_u16().unwrap_or(80),
        path: Uri::try_from(path).ok()?,
        host_header: HeaderValue::from_str(auth.as_str()).ok()?,
    })
}

/// GETs a module from its origin (not through the cache: modules are code, fetched fresh).
async fn fetch_module(shared: &Shared, url: &str, max: u64) -> Result<Bytes, String> {
    let UrlParts {
        host,
        port,
        path,
        host_header,
    } = split_url(url).ok_or_else(|| format!("bad module URL {url}"))?;
    let mut req = Request::new(crate::upstream::no_body());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = path;
    req.headers_mut().insert(header::HOST, host_header);
    req.headers_mut()
        .insert(header::ACCEPT, HeaderValue::from_static("application/wasm"));
    if shared.config.http.via {
        req.headers_mut()
            .insert(header::VIA, shared.via.own().clone());
    }
    let limit = shared.config.upstream.read_timeout + shared.config.upstream.connect_timeout;
    let fetch = async {
        let (resp, lease) = shared
            .upstream
            .send(&host, port, req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), max as usize)
            .collect()
            .await
            .map_err(|e| format!("reading the module: {e}"))?
            .to_bytes();
        lease.release();
        if status != StatusCode::OK {
            return Err(format!("{url}: {status}"));
        }
        Ok(body)
    };
    tokio::time::timeout(limit, fetch)
        .await
        .map_err(|_| format!("{url}: no answer within {limit:?}"))?
}

/// POSTs one log batch; `Ok` on a 2xx answer.
async fn post_log(shared: &Shared, destination: &str, body: Bytes) -> Result<(), String> {
    let UrlParts {
        host,
        port,
        path,
        host_header,
    } = split_url(destination).ok_or_else(|| format!("bad log URL {destination}"))?;
    let ip = *shared
        .upstream
        .resolver()
        .lookup(&host)
        .await
        .map_err(|e| format!("{host}: {e}"))?
        .first()
        .ok_or_else(|| format!("{host}: no address"))?;
    let addr = std::net::SocketAddr::new(ip, port);
    let limit = shared.config.upstream.read_timeout + shared.config.upstream.connect_timeout;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = path;
        let h = req.headers_mut();
        h.insert(header::HOST, host_header);
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        if shared.config.http.via {
            h.insert(header::VIA, shared.via.own().clone());
        }
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("no answer within {limit:?}"))?
}

/// Releases the instances of answered runs and makes each applet's next one, off the hits'
/// path: a run wakes it, and it runs when the run's task yields, after writing its answer.
/// (Letting every other ready task go first, with a `yield_now`, was tried: under load it
/// cost more CPU per hit, not less.)
pub(crate) async fn run_replenish(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let Some(active) = shared.applets.clone() else {
        return;
    };
    let Some(mut spent) = active.spent_rx.lock().take() else {
        return;
    };
    let mut batch = Vec::new();
    let most = spent.max_capacity();
    loop {
        tokio::select! {
            n = spent.recv_many(&mut batch, most) => if n == 0 { return },
            _ = stop.changed() => return,
        }
        for (applet, spent) in batch.drain(..) {
            active.runtime.replenish(&applet, spent);
        }
    }
}

/// Delivers the log spool: every `applets.log_interval`, one batch per destination that is not
/// backing off; a failure puts the batch back and doubles that destination's wait, up to
/// `applets.log_retry_max`. At shutdown, one last round; what is left is logged with its count.
pub(crate) async fn run_logs(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let Some(active) = shared.applets.clone() else {
        return;
    };
    let config = active.runtime.config().clone();
    let spool = active.runtime.logs.clone();
    let mut backoff: HashMap<String, (Instant, Duration)> = HashMap::new();
    let mut tick = tokio::time::interval(config.log_interval);
    let mut last_round = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => last_round = true,
        }
        for destination in spool.destinations() {
            if !last_round {
                if let Some((until, _)) = backoff.get(&destination) {
                    if Instant::now() < *until {
                        continue;
                    }
                }
            }
            // Drain what is waiting, batch by batch, while the destination answers.
            while let Some(batch) = spool.take(&destination, config.log_batch) {
                match post_log(&shared, &destination, batch.body.clone()).await {
                    Ok(()) => {
                        active.counters.log_posts.fetch_add(1, Relaxed);
                        spool.delivered(batch);
                        backoff.remove(&destination);
                    }
                    Err(why) => {
                        active.counters.log_post_failures.fetch_add(1, Relaxed);
                        let wait = backoff
                            .get(&destination)
                            .map_or(config.log_interval, |(_, w)| {
                                (*w * 2).min(config.log_retry_max)
                            });
                        tracing::warn!(destination, error = %why, retry_in = ?wait, "applet log delivery failed");
                        let dropped = spool.put_back(batch);
                        if dropped > 0 {
                            tracing::warn!(
                                destination,
                                dropped,
                                "applet log records dropped: the queue is full"
                            );
                        }
                        backoff.insert(destination.clone(), (Instant::now() + wait, wait));
                        break;
                    }
                }
            }
        }
        if last_round {
            let left: usize = spool.destinations().iter().map(|d| spool.pending(d)).sum();
            if left > 0 {
                tracing::warn!(
                    records = left,
                    "applet log records not delivered at shutdown"
                );
            }
            return;
        }
    }
}
