//! The origin emulator: an HTTP/1.1 server whose responses are controlled by
//! the request's query string. The parameters are listed in the
//! [crate documentation](crate#query-parameters-get-and-head).
//!
//! Server-level defaults ([`OriginConfig`]: a reply delay drawn from a
//! distribution, a default `Cache-Control`, `Last-Modified` and `ETag`) apply
//! where the query string says nothing; `Default` is the plain emulator.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use httpdate::HttpDate;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Sleep;

/// The largest body `size=N` may ask for: 1 GiB.
pub const MAX_SIZE: u64 = 1 << 30;

/// The body pattern, repeated from offset 0.
const PATTERN: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789\n";
/// Bodies up to this length are one zero-copy slice of the shared buffer;
/// longer ones are streamed in frames of this length.
const SHARED_LEN: usize = 1 << 20;
/// Frame (and so chunk) length of `chunked=1` bodies.
const CHUNK_LEN: usize = 64 * 1024;
/// Latest time `httpdate` can format (9999-12-31T23:59:59Z), in Unix seconds.
const MAX_HTTP_DATE: u64 = 253_402_300_799;

const X_ORIGIN_COUNT: HeaderName = HeaderName::from_static("x-origin-count");
const X_REQUEST_BODY_BYTES: HeaderName = HeaderName::from_static("x-request-body-bytes");

/// The byte at `offset` of every body the origin sends.
pub fn body_byte(offset: u64) -> u8 {
    PATTERN[(offset % PATTERN.len() as u64) as usize]
}

/// The whole body the origin sends for `size=len` (zero-copy up to 1 MiB).
pub fn expected_body(len: usize) -> Bytes {
    if len <= SHARED_LEN {
        shared_buf().slice(..len)
    } else {
        PATTERN
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect::<Vec<u8>>()
            .into()
    }
}

/// The pattern repeated over `SHARED_LEN + PATTERN.len()` bytes, so that a
/// slice of up to `SHARED_LEN` bytes can start at any pattern phase.
fn shared_buf() -> &'static Bytes {
    static BUF: OnceLock<Bytes> = OnceLock::new();
    BUF.get_or_init(|| {
        PATTERN
            .iter()
            .copied()
            .cycle()
            .take(SHARED_LEN + PATTERN.len())
            .collect::<Vec<u8>>()
            .into()
    })
}

/// `len` (≤ `SHARED_LEN`) body bytes from body offset `offset`, zero-copy.
fn pattern_slice(offset: u64, len: usize) -> Bytes {
    let start = (offset % PATTERN.len() as u64) as usize;
    shared_buf().slice(start..start + len)
}

/// A running origin emulator: a cheap handle ([`Clone`] shares it).
///
/// The server stops accepting connections, and asks open ones to close once
/// their current response is done, when the last handle is dropped (or, for
/// [`Origin::spawn`], when its shutdown future resolves).
#[derive(Clone)]
pub struct Origin {
    shared: Arc<Shared>,
    /// Dropping the last clone drops the sender, which stops the server.
    _alive: Arc<oneshot::Sender<()>>,
}

/// The longest delay [`Delay`] may produce (larger draws are cut to it).
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// Errors of the origin emulator's setup.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// An [`OriginConfig`] setting is invalid; `key` is its name.
    #[error("origin setting `{key}`: {reason}")]
    Invalid {
        /// The offending key (`cache_control`, `delay.sigma`, ...).
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Binding the listener failed.
    #[error("origin socket: {0}")]
    Io(#[from] std::io::Error),
}

/// How long the origin waits before each response head (unless the URL's
/// `delay_ms` says otherwise).
///
/// In TOML, a duration string is a fixed delay (`delay = "1s"`); a table
/// names a distribution with `dist`:
///
/// ```toml
/// delay = { dist = "uniform", min = "500ms", max = "1500ms" }
/// delay = { dist = "exponential", mean = "1s" }
/// delay = { dist = "lognormal", median = "800ms", sigma = 0.6 }
/// delay = { dist = "fixed", value = "1s" }
/// ```
///
/// Draws come from a PCG generator seeded with [`OriginConfig::seed`], one
/// per response in arrival order, and are cut to [`MAX_DELAY`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delay {
    /// Always the same delay (default: zero).
    Fixed(Duration),
    /// Uniform between `min` and `max`.
    Uniform {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
    /// Exponential with the given mean.
    Exponential {
        /// Mean delay.
        mean: Duration,
    },
    /// Log-normal: `ln(delay)` is normal with mean `ln(median)` and
    /// standard deviation `sigma`.
    LogNormal {
        /// Median delay.
        median: Duration,
        /// Shape (standard deviation of the log), `0..=10`.
        sigma: f64,
    },
}

impl Default for Delay {
    fn default() -> Delay {
        Delay::Fixed(Duration::ZERO)
    }
}

/// The table form of [`Delay`].
#[derive(Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
enum DelayTable {
    Fixed {
        #[serde(with = "humantime_serde")]
        value: Duration,
    },
    Uniform {
        #[serde(with = "humantime_serde")]
        min: Duration,
        #[serde(with = "humantime_serde")]
        max: Duration,
    },
    Exponential {
        #[serde(with = "humantime_serde")]
        mean: Duration,
    },
    Lognormal {
        #[serde(with = "humantime_serde")]
        median: Duration,
        sigma: f64,
    },
}

impl Serialize for Delay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Delay::Fixed(d) => humantime_serde::serialize(&d, s),
            Delay::Uniform { min, max } => DelayTable::Uniform { min, max }.serialize(s),
            Delay::Exponential { mean } => DelayTable::Exponential { mean }.serialize(s),
            Delay::LogNormal { median, sigma } => {
                DelayTable::Lognormal { median, sigma }.serialize(s)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Delay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Delay, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Delay;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"1s\" or a table with `dist`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Delay, E> {
                humantime_serde::re::humantime::parse_duration(v)
                    .map(Delay::Fixed)
                    .map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Delay, A::Error> {
                let table =
                    DelayTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(match table {
                    DelayTable::Fixed { value } => Delay::Fixed(value),
                    DelayTable::Uniform { min, max } => Delay::Uniform { min, max },
                    DelayTable::Exponential { mean } => Delay::Exponential { mean },
                    DelayTable::Lognormal { median, sigma } => Delay::LogNormal { median, sigma },
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl Delay {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), OriginError> {
        let invalid = |key, reason: &str| {
            Err(OriginError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        match *self {
            Delay::Uniform { min, max } if min > max => {
                invalid("delay.min", "must not exceed delay.max")
            }
            Delay::LogNormal { sigma, .. } if !(0.0..=10.0).contains(&sigma) => {
                invalid("delay.sigma", "must be between 0 and 10")
            }
            _ => Ok(()),
        }
    }

    /// Whether every draw is zero.
    pub fn is_zero(&self) -> bool {
        *self == Delay::Fixed(Duration::ZERO)
    }

    /// One draw, cut to [`MAX_DELAY`].
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        let secs = match *self {
            Delay::Fixed(d) => return d.min(MAX_DELAY),
            Delay::Uniform { min, max } => {
                if min >= max {
                    return min.min(MAX_DELAY);
                }
                rng.random_range(min.as_secs_f64()..=max.as_secs_f64())
            }
            Delay::Exponential { mean } => match Exp::new(1.0 / mean.as_secs_f64()) {
                Ok(exp) if !mean.is_zero() => exp.sample(rng),
                _ => 0.0,
            },
            Delay::LogNormal { median, sigma } => {
                match LogNormal::new(median.as_secs_f64().ln(), sigma) {
                    Ok(ln) if !median.is_zero() => ln.sample(rng),
                    _ => 0.0,
                }
            }
        };
        if secs.is_finite() {
            Duration::from_secs_f64(secs.clamp(0.0, MAX_DELAY.as_secs_f64()))
        } else {
            MAX_DELAY
        }
    }
}

/// Server-level defaults of an origin (TOML; unknown keys are errors).
/// Each applies only when the request's query string does not say
/// otherwise; `Default` is the plain emulator.
///
/// ```toml
/// delay = "1s"                      # or { dist = "exponential", mean = "1s" }
/// cache_control = "max-age=86400"   # when the URL has no `cc`
/// last_modified = "1day"            # Last-Modified: now − 1 day, when no `lm`
/// etag = true                       # ETag from path+query, when no `etag`
/// seed = 1                          # of the delay draws
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    /// Wait before every response head (all methods, errors included)
    /// unless the URL's `delay_ms` gives one.
    pub delay: Delay,
    /// `Cache-Control` of responses whose URL has no `cc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Last-Modified` this long before the response's `Date`, for URLs
    /// without `lm` (whole seconds).
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<Duration>,
    /// For URLs without `etag`: send a strong ETag derived from the path and
    /// query string (a 64-bit FNV-1a hash), so revalidation gets a 304.
    pub etag: bool,
    /// Seed of the delay draws.
    pub seed: u64,
}

impl OriginConfig {
    /// Checks every setting; errors name the key.
    pub fn validate(&self) -> Result<(), OriginError> {
        self.delay.validate()?;
        if let Some(cc) = &self.cache_control {
            HeaderValue::from_str(cc).map_err(|_| OriginError::Invalid {
                key: "cache_control",
                reason: format!("{cc:?} is not a valid header value"),
            })?;
        }
        if let Some(lm) = self.last_modified {
            if lm.as_secs() > MAX_HTTP_DATE {
                return Err(OriginError::Invalid {
                    key: "last_modified",
                    reason: "too far in the past".to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// The validated [`OriginConfig`], ready to apply.
struct Defaults {
    delay: Delay,
    rng: Mutex<Pcg64>,
    cache_control: Option<HeaderValue>,
    last_modified: Option<i64>,
    etag: bool,
}

impl Defaults {
    fn new(config: &OriginConfig) -> Result<Defaults, OriginError> {
        config.validate()?;
        Ok(Defaults {
            delay: config.delay,
            rng: Mutex::new(Pcg64::seed_from_u64(config.seed)),
            cache_control: config
                .cache_control
                .as_deref()
                .and_then(|cc| HeaderValue::from_str(cc).ok()),
            last_modified: config
                .last_modified
                .and_then(|lm| i64::try_from(lm.as_secs()).ok()),
            etag: config.etag,
        })
    }

    /// One draw of the default delay.
    fn delay(&self) -> Duration {
        if self.delay.is_zero() {
            return Duration::ZERO;
        }
        self.delay.sample(&mut *self.rng.lock())
    }

    /// Waits one draw of the default delay.
    async fn wait(&self) {
        let delay = self.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// The ETag derived from a request's path and query: 64-bit FNV-1a, hex.
fn derived_etag(key: &str) -> HeaderValue {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    string_value(format!("\"{h:016x}\""))
}

/// What the handles and the connection tasks share.
struct Shared {
    addr: SocketAddr,
    total: AtomicU64,
    hits: Mutex<HashMap<String, u64>>,
    defaults: Defaults,
}

impl Shared {
    fn new(addr: SocketAddr, defaults: Defaults) -> Shared {
        Shared {
            addr,
            total: AtomicU64::new(0),
            hits: Mutex::new(HashMap::new()),
            defaults,
        }
    }

    /// Counts a request for `key`; returns that key's count including it.
    fn count(&self, key: &str) -> u64 {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut hits = self.hits.lock();
        if let Some(n) = hits.get_mut(key) {
            *n += 1;
            *n
        } else {
            hits.insert(key.to_owned(), 1);
            1
        }
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("addr", &self.shared.addr)
            .field("total", &self.total())
            .finish()
    }
}

impl Origin {
    /// Serves on an already-bound listener until `shutdown` resolves or the
    /// last handle is dropped. Spawns the accept loop on the current tokio
    /// runtime and returns at once.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    #[must_use = "the origin stops when the last handle is dropped"]
    pub fn spawn(
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Origin {
        let defaults = Defaults {
            delay: Delay::default(),
            rng: Mutex::new(Pcg64::seed_from_u64(0)),
            cache_control: None,
            last_modified: None,
            etag: false,
        };
        Origin::spawn_defaults(listener, defaults, shutdown)
    }

    /// [`Origin::spawn`] with server-level defaults; fails only on an
    /// invalid `config`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn_with(
        listener: TcpListener,
        config: &OriginConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Origin, OriginError> {
        let defaults = Defaults::new(config)?;
        Ok(Origin::spawn_defaults(listener, defaults, shutdown))
    }

    fn spawn_defaults(
        listener: TcpListener,
        defaults: Defaults,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Origin {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        let shared = Arc::new(Shared::new(addr, defaults));
        let (alive_tx, alive_rx) = oneshot::channel::<()>();
        let stop = async move {
            tokio::select! {
                () = shutdown => {}
                _ = alive_rx => {}
            }
        };
        tokio::spawn(serve(listener, Arc::clone(&shared), stop));
        Origin {
            shared,
            _alive: Arc::new(alive_tx),
        }
    }

    /// Binds `127.0.0.1:0` and serves until the last handle is dropped.
    pub async fn start() -> std::io::Result<Origin> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Ok(Origin::spawn(listener, std::future::pending()))
    }

    /// [`Origin::start`] with server-level defaults.
    pub async fn start_with(config: &OriginConfig) -> Result<Origin, OriginError> {
        config.validate()?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Origin::spawn_with(listener, config, std::future::pending())
    }

    /// The address the origin listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://ADDR` followed by `path_and_query` (a `/` is put before it
    /// when missing). An unspecified listening address (`0.0.0.0`, `[::]`)
    /// is replaced by the loopback address.
    pub fn url(&self, path_and_query: &str) -> String {
        let mut addr = self.shared.addr;
        if addr.ip().is_unspecified() {
            match addr {
                SocketAddr::V4(_) => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
                SocketAddr::V6(_) => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
            }
        }
        let slash = if path_and_query.starts_with('/') {
            ""
        } else {
            "/"
        };
        format!("http://{addr}{slash}{path_and_query}")
    }

    /// How many requests were received for exactly this path and query
    /// string (as sent in the request target, e.g. `/a?size=10`).
    pub fn hits(&self, path_and_query: &str) -> u64 {
        self.shared
            .hits
            .lock()
            .get(path_and_query)
            .copied()
            .unwrap_or(0)
    }

    /// How many requests were received in all.
    pub fn total(&self) -> u64 {
        self.shared.total.load(Ordering::Relaxed)
    }

    /// Sets all counts back to zero.
    pub fn reset(&self) {
        let mut hits = self.shared.hits.lock();
        hits.clear();
        self.shared.total.store(0, Ordering::Relaxed);
    }
}

/// Runs an origin in the foreground (`meshcache lab origin --listen ADDR`):
/// binds `addr`, logs the bound address, and serves until ctrl-c or SIGTERM.
pub async fn run_origin(addr: SocketAddr) -> std::io::Result<()> {
    match run_origin_with(addr, &OriginConfig::default()).await {
        Ok(()) => Ok(()),
        Err(OriginError::Io(e)) => Err(e),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// [`run_origin`] with server-level defaults (`meshcache lab origin
/// --listen ADDR --delay 1s ...`).
pub async fn run_origin_with(addr: SocketAddr, config: &OriginConfig) -> Result<(), OriginError> {
    let defaults = Defaults::new(config)?;
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, ?config, "lab origin listening");
    serve(
        listener,
        Arc::new(Shared::new(local, defaults)),
        shutdown_signal(),
    )
    .await;
    tracing::info!("lab origin stopped");
    Ok(())
}

/// Resolves on ctrl-c or (on Unix) SIGTERM; never, where neither can be
/// listened for.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// The accept loop: runs until `stop` resolves, then closes the listener and
/// asks every open connection to shut down gracefully.
async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new());
    // Dropped when this loop ends, which tells the connections to close.
    let (conns_tx, conns_rx) = watch::channel(());
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut stop => break,
            res = listener.accept() => match res {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: do not spin.
                    tracing::warn!(error = %e, "lab origin: accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "lab origin: TCP_NODELAY failed");
        }
        tokio::spawn(serve_connection(
            builder.clone(),
            stream,
            Arc::clone(&shared),
            conns_rx.clone(),
        ));
    }
    drop(listener);
    drop(conns_tx);
}

async fn serve_connection(
    builder: http1::Builder,
    stream: TcpStream,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<()>,
) {
    let service = service_fn(move |req| handle(Arc::clone(&shared), req));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let res = tokio::select! {
        res = conn.as_mut() => res,
        // Nothing is ever sent: this fires when the accept loop ends.
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = res {
        tracing::debug!(error = %e, "lab origin: connection error");
    }
}

/// The counting key of a request: its path and query as received (only
/// those, for an absolute-form target).
fn target_key(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |pq| pq.as_str())
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<OriginBody>, Infallible> {
    let count = shared.count(target_key(req.uri()));
    let response = match *req.method() {
        Method::GET | Method::HEAD => get_or_head(&shared.defaults, &req, count).await,
        Method::CONNECT => plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported\n",
            count,
        ),
        _ => {
            let response = other_method(req, count).await;
            shared.defaults.wait().await;
            response
        }
    };
    Ok(response)
}

/// A GET or HEAD request: the response its query string describes.
async fn get_or_head(
    defaults: &Defaults,
    req: &Request<Incoming>,
    count: u64,
) -> Response<OriginBody> {
    let mut params = match Params::parse(req.uri().query().unwrap_or("")) {
        Ok(params) => params,
        Err(msg) => {
            defaults.wait().await;
            return plain(StatusCode::BAD_REQUEST, format!("{msg}\n"), count);
        }
    };
    match params.delay {
        Some(delay) => tokio::time::sleep(delay).await,
        None => defaults.wait().await,
    }
    if params.cc.is_none() {
        params.cc.clone_from(&defaults.cache_control);
    }
    if params.lm.is_none() {
        params.lm = defaults.last_modified;
    }
    if params.etag.is_none() && defaults.etag {
        params.etag = Some(derived_etag(target_key(req.uri())));
    }
    let now = SystemTime::now();
    let (Some(expires), Some(last_modified)) = (
        params
            .expires
            .map_or(Some(None), |secs| shift(now, secs).map(Some)),
        params
            .lm
            .map_or(Some(None), |secs| shift(now, -secs).map(Some)),
    ) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "expires or lm out of range\n",
            count,
        );
    };

    let mut headers = base_headers(now, count);
    // The headers a 304 repeats.
    if let Some(etag) = &params.etag {
        headers.insert(header::ETAG, etag.clone());
    }
    if let Some(lm) = last_modified {
        headers.insert(header::LAST_MODIFIED, date_value(lm));
    }
    if let Some(cc) = &params.cc {
        headers.insert(header::CACHE_CONTROL, cc.clone());
    }
    if let Some(expires) = expires {
        headers.insert(header::EXPIRES, date_value(expires));
    }
    if let Some(vary) = &params.vary {
        headers.insert(header::VARY, vary.clone());
    }

    if params.status.is_success()
        && not_modified(req.headers(), params.etag.as_ref(), last_modified)
    {
        return respond(StatusCode::NOT_MODIFIED, headers, OriginBody::empty());
    }

    headers.insert(
        header::CONTENT_TYPE,
        params
            .ct
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    if params.setcookie {
        headers.insert(
            header::SET_COOKIE,
            string_value(format!("lab={count}; Path=/")),
        );
    }
    let mut replaced: Vec<HeaderName> = Vec::new();
    for (name, value) in params.hdrs {
        if replaced.contains(&name) {
            headers.append(name, value);
        } else {
            headers.insert(name.clone(), value);
            replaced.push(name);
        }
    }

    if let Some((first, last)) = params
        .ranges
        .then(|| honoured_range(req.headers(), params.etag.as_ref(), params.size))
        .flatten()
        .filter(|_| req.method() == Method::GET && params.status == StatusCode::OK)
    {
        let whole = expected_body(params.size as usize);
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {first}-{last}/{}", params.size)) {
            headers.insert(header::CONTENT_RANGE, v);
        }
        let part = Bytes::copy_from_slice(&whole[first as usize..=last as usize]);
        return respond(
            StatusCode::PARTIAL_CONTENT,
            headers,
            OriginBody::fixed(part),
        );
    }

    let body = if req.method() == Method::HEAD {
        if !params.chunked {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(params.size));
        }
        OriginBody::empty()
    } else if let Some(text) = &params.text {
        let mut body = Vec::with_capacity(params.size as usize);
        body.extend_from_slice(text.as_bytes());
        let rest = params.size as usize - text.len();
        body.extend_from_slice(&expected_body(text.len() + rest)[text.len()..]);
        OriginBody::fixed(body.into())
    } else {
        OriginBody::pattern(params.size, !params.chunked, params.stall)
    };
    respond(params.status, headers, body)
}

/// The one byte range (`bytes=a-b`, `a-`, `-n`) a request asks of a body of `size` bytes, if
/// it is satisfiable and its `If-Range` (if any) names the current entity tag.
fn honoured_range(
    headers: &HeaderMap,
    etag: Option<&HeaderValue>,
    size: u64,
) -> Option<(u64, u64)> {
    if let Some(if_range) = headers.get(header::IF_RANGE) {
        if Some(if_range) != etag {
            return None;
        }
    }
    let spec = headers
        .get(header::RANGE)?
        .to_str()
        .ok()?
        .trim()
        .strip_prefix("bytes=")?;
    if spec.contains(',') || size == 0 {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (first, last) = match (first.trim(), last.trim()) {
        ("", n) => (size.saturating_sub(n.parse().ok()?), size - 1),
        (a, "") => (a.parse().ok()?, size - 1),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size - 1)),
    };
    (first <= last && last < size).then_some((first, last))
}

/// Any method but GET, HEAD and CONNECT: reads the request body, answers
/// `ok` and its length.
async fn other_method(req: Request<Incoming>, count: u64) -> Response<OriginBody> {
    let mut body = req.into_body();
    let mut len: u64 = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    len += data.len() as u64;
                }
            }
            Err(e) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}\n"),
                    count,
                );
            }
        }
    }
    let mut response = plain(StatusCode::OK, "ok", count);
    response
        .headers_mut()
        .insert(X_REQUEST_BODY_BYTES, HeaderValue::from(len));
    response
}

/// Whether a conditional GET/HEAD gets a 304. `If-None-Match` takes
/// precedence over `If-Modified-Since` (RFC 9110 §13.2.2).
fn not_modified(
    headers: &HeaderMap,
    etag: Option<&HeaderValue>,
    last_modified: Option<SystemTime>,
) -> bool {
    let etag = etag.and_then(|e| e.to_str().ok()).map(weak);
    let mut has_inm = false;
    for value in headers.get_all(header::IF_NONE_MATCH) {
        has_inm = true;
        let Ok(list) = value.to_str() else { continue };
        for tag in list.split(',').map(str::trim) {
            if tag == "*" || Some(weak(tag)) == etag {
                return true;
            }
        }
    }
    if has_inm {
        return false;
    }
    let ims = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<HttpDate>().ok());
    match (ims, last_modified) {
        // Compared at the one-second resolution of HTTP dates.
        (Some(ims), Some(lm)) => ims >= HttpDate::from(lm),
        _ => false,
    }
}

/// An entity tag without its weakness indicator.
fn weak(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

/// `now` moved by `secs` seconds, if `httpdate` can format the result.
fn shift(now: SystemTime, secs: i64) -> Option<SystemTime> {
    let t = if secs >= 0 {
        now.checked_add(Duration::from_secs(secs.unsigned_abs()))?
    } else {
        now.checked_sub(Duration::from_secs(secs.unsigned_abs()))?
    };
    let since_epoch = t.duration_since(UNIX_EPOCH).ok()?;
    (since_epoch.as_secs() <= MAX_HTTP_DATE).then_some(t)
}

fn date_value(t: SystemTime) -> HeaderValue {
    string_value(httpdate::fmt_http_date(t))
}

/// A header value from a string known to be valid.
fn string_value(s: String) -> HeaderValue {
    HeaderValue::try_from(s).unwrap_or(HeaderValue::from_static(""))
}

/// `Date` and `x-origin-count`, which every response carries.
fn base_headers(now: SystemTime, count: u64) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(12);
    headers.insert(header::DATE, date_value(now));
    headers.insert(X_ORIGIN_COUNT, HeaderValue::from(count));
    headers
}

fn respond(status: StatusCode, headers: HeaderMap, body: OriginBody) -> Response<OriginBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// A `text/plain` response with the common headers.
fn plain(status: StatusCode, body: impl Into<Bytes>, count: u64) -> Response<OriginBody> {
    let mut headers = base_headers(SystemTime::now(), count);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    respond(status, headers, OriginBody::fixed(body.into()))
}

/// The parsed query string of a GET or HEAD.
struct Params {
    size: u64,
    cc: Option<HeaderValue>,
    expires: Option<i64>,
    lm: Option<i64>,
    etag: Option<HeaderValue>,
    vary: Option<HeaderValue>,
    status: StatusCode,
    delay: Option<Duration>,
    stall: Option<Duration>,
    chunked: bool,
    ct: Option<HeaderValue>,
    setcookie: bool,
    /// Honour a single-range `Range` request with a 206.
    ranges: bool,
    hdrs: Vec<(HeaderName, HeaderValue)>,
    text: Option<String>,
}

impl Params {
    fn parse(query: &str) -> Result<Params, String> {
        let mut p = Params {
            size: 0,
            cc: None,
            expires: None,
            lm: None,
            etag: None,
            vary: None,
            status: StatusCode::OK,
            delay: None,
            stall: None,
            chunked: false,
            ct: None,
            setcookie: false,
            ranges: false,
            hdrs: Vec::new(),
            text: None,
        };
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key);
            let v = percent_decode(value);
            let k = key.as_ref();
            match k {
                "size" => {
                    let size: u64 = number(k, &v)?;
                    if size > MAX_SIZE {
                        return Err(format!(
                            "size={size} exceeds the maximum of {MAX_SIZE} bytes"
                        ));
                    }
                    p.size = size;
                }
                "cc" => p.cc = Some(header_value(k, &v)?),
                "expires" => p.expires = Some(number(k, &v)?),
                "lm" => p.lm = Some(number(k, &v)?),
                "etag" => {
                    let quoted = v.starts_with('"') || v.starts_with("W/\"");
                    let tag = if quoted {
                        v.into_owned()
                    } else {
                        format!("\"{v}\"")
                    };
                    p.etag = Some(header_value(k, &tag)?);
                }
                "vary" => p.vary = Some(header_value(k, &v)?),
                "status" => {
                    let code: u16 = number(k, &v)?;
                    p.status = StatusCode::from_u16(code)
                        .ok()
                        .filter(|s| !s.is_informational())
                        .ok_or_else(|| {
                            format!("status={code} is not a final status code (200..=999)")
                        })?;
                }
                "delay_ms" => p.delay = Some(Duration::from_millis(number(k, &v)?)),
                "stall_ms" => p.stall = Some(Duration::from_millis(number(k, &v)?)),
                "chunked" => p.chunked = flag(k, &v)?,
                "ct" => p.ct = Some(header_value(k, &v)?),
                "setcookie" => p.setcookie = flag(k, &v)?,
                "ranges" => p.ranges = flag(k, &v)?,
                "text" => p.text = Some(v.into_owned()),
                "hdr" => {
                    let (name, value) = v
                        .split_once(':')
                        .ok_or_else(|| format!("hdr={v:?}: expected Name:Value"))?;
                    let name = HeaderName::from_bytes(name.trim().as_bytes())
                        .map_err(|_| format!("hdr={v:?}: invalid header name"))?;
                    p.hdrs.push((name, header_value(k, value.trim())?));
                }
                _ => {}
            }
        }
        if let Some(t) = &p.text {
            if p.chunked || p.stall.is_some() {
                return Err("text= cannot be combined with chunked or stall_ms".into());
            }
            p.size = p.size.max(t.len() as u64);
        }
        Ok(p)
    }
}

fn number<T: FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{key}={value:?}: not a valid number"))
}

fn header_value(key: &str, value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("{key}={value:?}: not a valid header value"))
}

/// `1`/`true`/`yes`/`on` or nothing → true, `0`/`false`/`no`/`off` → false.
fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{key}={value:?}: expected 1 or 0")),
    }
}

/// Decodes `%XX` escapes and `+` (a space). A `%` not followed by two hex
/// digits is kept; invalid UTF-8 becomes U+FFFD.
fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match (
                bytes.get(i + 1).and_then(hex),
                bytes.get(i + 2).and_then(hex),
            ) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 3;
                }
                _ => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn hex(b: &u8) -> Option<u8> {
    (*b as char).to_digit(16).map(|d| d as u8)
}

/// A response body: a fixed buffer, or `len` pattern bytes streamed from
/// the shared buffer (optionally after a stall, optionally of undeclared
/// length so that hyper sends it chunked).
enum OriginBody {
    Fixed(Option<Bytes>),
    Pattern {
        stall: Option<Pin<Box<Sleep>>>,
        next: u64,
        end: u64,
        frame_len: usize,
        sized: bool,
    },
}

impl OriginBody {
    fn empty() -> OriginBody {
        OriginBody::Fixed(None)
    }

    fn fixed(bytes: Bytes) -> OriginBody {
        OriginBody::Fixed((!bytes.is_empty()).then_some(bytes))
    }

    fn pattern(len: u64, sized: bool, stall: Option<Duration>) -> OriginBody {
        if sized && len as usize <= SHARED_LEN && stall.is_none() {
            return OriginBody::fixed(pattern_slice(0, len as usize));
        }
        OriginBody::Pattern {
            stall: stall.map(|d| Box::pin(tokio::time::sleep(d))),
            next: 0,
            end: len,
            frame_len: if sized { SHARED_LEN } else { CHUNK_LEN },
            sized,
        }
    }
}

impl Body for OriginBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            OriginBody::Fixed(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            OriginBody::Pattern {
                stall,
                next,
                end,
                frame_len,
                ..
            } => {
                if let Some(sleep) = stall {
                    ready!(sleep.as_mut().poll(cx));
                    *stall = None;
                }
                if *next >= *end {
                    return Poll::Ready(None);
                }
                let len = (*end - *next).min(*frame_len as u64) as usize;
                let frame = pattern_slice(*next, len);
                *next += len as u64;
                Poll::Ready(Some(Ok(Frame::data(frame))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            OriginBody::Fixed(data) => data.is_none(),
            // An unsized body must be polled to the end, so that even an
            // empty one is sent chunked.
            OriginBody::Pattern {
                next, end, sized, ..
            } => *sized && next >= end,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            OriginBody::Fixed(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            OriginBody::Pattern {
                next,
                end,
                sized: true,
                ..
            } => SizeHint::with_exact(end - next),
            OriginBody::Pattern { .. } => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_slices_match_body_byte() {
        for offset in [0u64, 1, 36, 37, 1000, (1 << 20) + 5] {
            let slice = pattern_slice(offset, 100);
            for (i, b) in slice.iter().enumerate() {
                assert_eq!(*b, body_byte(offset + i as u64));
            }
        }
        let big = expected_body(SHARED_LEN + 100);
        assert!(big
            .iter()
            .enumerate()
            .all(|(i, b)| *b == body_byte(i as u64)));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(
            percent_decode("max-age%3D60%2C+public"),
            "max-age=60, public"
        );
        assert_eq!(percent_decode("a%2Bb%zz%4"), "a+b%zz%4");
        assert_eq!(percent_decode("plain"), "plain");
    }

    #[test]
    fn params() -> Result<(), String> {
        let p = Params::parse("size=10&cc=max-age=60&etag=v1&hdr=X-A:1&hdr=X-B%3A+two&chunked")?;
        assert_eq!(p.size, 10);
        assert_eq!(p.cc, Some(HeaderValue::from_static("max-age=60")));
        assert_eq!(p.etag, Some(HeaderValue::from_static("\"v1\"")));
        assert!(p.chunked);
        assert_eq!(p.hdrs.len(), 2);
        assert_eq!(p.hdrs[1].1, "two");
        let p = Params::parse("etag=W/%22w%22")?;
        assert_eq!(p.etag, Some(HeaderValue::from_static("W/\"w\"")));
        assert!(Params::parse("size=1073741825").is_err());
        assert!(Params::parse("size=1073741824").is_ok());
        assert!(Params::parse("status=101").is_err());
        assert!(Params::parse("size=x").is_err());
        assert!(Params::parse("hdr=novalue").is_err());
        Ok(())
    }

    #[test]
    fn delay_samples_follow_their_distribution() {
        let mut rng = Pcg64::seed_from_u64(5);
        let n = 20_000;
        let mean = |d: Delay, rng: &mut Pcg64| {
            (0..n).map(|_| d.sample(rng).as_secs_f64()).sum::<f64>() / n as f64
        };
        let exp = mean(
            Delay::Exponential {
                mean: Duration::from_secs(1),
            },
            &mut rng,
        );
        assert!((0.95..1.05).contains(&exp), "exponential mean {exp}");
        let uni = mean(
            Delay::Uniform {
                min: Duration::from_secs(1),
                max: Duration::from_secs(3),
            },
            &mut rng,
        );
        assert!((1.95..2.05).contains(&uni), "uniform mean {uni}");
        let ln = Delay::LogNormal {
            median: Duration::from_secs(1),
            sigma: 0.8,
        };
        let mut draws: Vec<Duration> = (0..n).map(|_| ln.sample(&mut rng)).collect();
        draws.sort();
        let median = draws[n / 2].as_secs_f64();
        assert!((0.95..1.05).contains(&median), "lognormal median {median}");
        assert_eq!(
            Delay::Fixed(Duration::from_secs(7200)).sample(&mut rng),
            MAX_DELAY
        );
    }

    #[test]
    fn derived_etags_are_quoted_and_distinct() {
        let a = derived_etag("/a?x=1");
        assert_eq!(a, derived_etag("/a?x=1"));
        assert_ne!(a, derived_etag("/a?x=2"));
        assert_eq!(a.len(), 18);
    }

    #[test]
    fn shift_bounds() {
        let now = SystemTime::now();
        assert!(shift(now, -60).is_some());
        assert!(shift(now, i64::MIN).is_none());
        assert!(shift(now, i64::MAX).is_none());
    }
}
