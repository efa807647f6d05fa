//! Persistent, pooled HTTP/1.1 connections to upstreams (origins now; parents and siblings
//! later).
//!
//! A request borrows a connection from the pool (or opens one) and gets back a [`Lease`]
//! along with the response head. The lease goes back to the pool only when the response body
//! has been read to its end; a body abandoned half-way closes its connection, so a reused
//! connection never carries leftovers of an earlier response. A request that fails on a reused
//! connection before any of it was processed (the origin closed the idle connection at the
//! same moment) is retried once on a fresh connection, as RFC 9112 §9.3.1 allows.
//!
//! With `upstream.persistent = false` nothing is pooled: every request opens its own connection
//! and says `Connection: close`. Host names found in the static host table (`dns.hosts`) are
//! not looked up with the system resolver; answers are kept a while ([`crate::resolve`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::{TcpSocket, TcpStream};

use crate::config::UpstreamConfig;
use crate::efficiency::{self, ConnCategory, Source, Timed};
use crate::error::UpstreamError;
use crate::idle::{IdleStream, Quiet};
use crate::metrics::Metrics;
use crate::resolve::Resolver;
use crate::sockopt::{self, Side};

/// Body of a request sent upstream: the client's, streamed, or none.
///
/// While the client's body waits for the client, the connection carrying it tells its idle
/// limit so (a slow upload is not a silent upstream; the client has its own idle limit).
#[derive(Debug)]
pub struct UpBody {
    body: Option<Incoming>,
    quiet: Option<Arc<Quiet>>,
    /// Dropped once the body has ended (or the body is dropped): see [`UpBody::client_watched`].
    sent: Option<tokio::sync::oneshot::Sender<()>>,
}

/// An empty upstream request body.
pub fn no_body() -> UpBody {
    UpBody {
        body: None,
        quiet: None,
        sent: None,
    }
}

impl UpBody {
    /// The client's request body, relayed as it arrives.
    pub fn client(body: Incoming) -> Self {
        UpBody {
            body: Some(body),
            quiet: None,
            sent: None,
        }
    }

    /// As [`UpBody::client`], with a receiver that completes (with an error: nothing is sent
    /// on it) once the body has all been handed to the connection, or was given up. A wait for
    /// the answer should count from then: before it, a slow client is the one to blame.
    pub fn client_watched(body: Incoming) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut up = UpBody::client(body);
        up.sent = Some(tx);
        (up, rx)
    }

    /// Reports its waits for the client to the connection that sends it.
    fn carried_by(&mut self, conn: &Conn) {
        if self.body.is_some() {
            self.quiet = Some(conn.quiet.clone());
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(body) = &mut this.body else {
            return Poll::Ready(None);
        };
        let r = Pin::new(body).poll_frame(cx);
        if let Some(quiet) = &this.quiet {
            quiet.awaiting_body(r.is_pending());
        }
        if matches!(r, Poll::Ready(None | Some(Err(_)))) {
            this.sent = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Drop for UpBody {
    fn drop(&mut self) {
        if let Some(quiet) = &self.quiet {
            quiet.awaiting_body(false);
        }
    }
}

/// One open connection: the request handle and the address it reached.
struct Conn {
    sender: SendRequest<UpBody>,
    peer: IpAddr,
    /// What excuses the connection's silence (see [`crate::idle`]).
    quiet: Arc<Quiet>,
    /// Whose work the connection's task is doing: that of the request that last used it.
    category: Arc<ConnCategory>,
}

impl Conn {
    /// Lends the connection to the request being served on this thread (to nobody, that is
    /// overhead, for work outside a timed poll such as a background refresh).
    fn lend(&self) {
        self.category.set_or_clear(efficiency::current());
        self.quiet.pooled(false);
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

struct PoolInner {
    idle: Mutex<HashMap<Arc<str>, Vec<Idle>>>,
    /// Names to addresses: the static host table, then the system resolver.
    resolver: Arc<Resolver>,
    config: UpstreamConfig,
    metrics: Arc<Metrics>,
}

/// The upstream connection pool.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<PoolInner>,
}

/// A connection on loan for one exchange. Call [`Lease::release`] once the response body
/// has been read to its end; dropping the lease closes the connection instead.
pub struct Lease {
    conn: Option<Conn>,
    key: Arc<str>,
    pool: Arc<PoolInner>,
}

impl Lease {
    /// The address of the upstream server (what Squid logs as the peer).
    pub fn peer(&self) -> Option<IpAddr> {
        self.conn.as_ref().map(|c| c.peer)
    }

    /// Gives the connection back to the pool for reuse.
    pub fn release(mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if conn.sender.is_closed() || !self.pool.config.persistent {
            return;
        }
        let mut idle = self.pool.idle.lock();
        let list = idle.entry(self.key.clone()).or_default();
        if list.len() < self.pool.config.max_idle_per_host {
            // Silent in the pool until `upstream.idle_timeout`, not `read_timeout`.
            conn.quiet.pooled(true);
            list.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

impl Upstream {
    /// A pool that finds addresses with `resolver`.
    pub(crate) fn with_resolver(
        config: UpstreamConfig,
        resolver: Arc<Resolver>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Upstream {
            inner: Arc::new(PoolInner {
                idle: Mutex::new(HashMap::new()),
                resolver,
                config,
                metrics,
            }),
        }
    }

    /// The resolver the pool connects with.
    pub(crate) fn resolver(&self) -> &Resolver {
        &self.inner.resolver
    }

    /// Drops idle connections older than the idle timeout; run it now and then.
    pub fn sweep(&self) {
        let max = self.inner.config.idle_timeout;
        let mut idle = self.inner.idle.lock();
        idle.retain(|_, list| {
            list.retain(|c| c.since.elapsed() < max && !c.conn.sender.is_closed());
            !list.is_empty()
        });
    }

    /// Takes the newest idle connection to `key` that is still open and young enough. One
    /// that is still finishing its previous exchange is waited for briefly.
    async fn take_idle(&self, key: &str) -> Option<Conn> {
        let max = self.inner.config.idle_timeout;
        loop {
            let candidate = {
                let mut idle = self.inner.idle.lock();
                idle.get_mut(key)?.pop()?
            };
            let Idle { mut conn, since } = candidate;
            if conn.sender.is_closed() || since.elapsed() >= max {
                continue;
            }
            let ready = tokio::time::timeout(Duration::from_secs(1), conn.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                return Some(conn);
            }
        }
    }

    /// Sends `req` to `host:port`, returning the response head and the connection's lease.
    pub async fn send(
        &self,
        host: &str,
        port: u16,
        mut req: Request<UpBody>,
    ) -> Result<(Response<Incoming>, Lease), UpstreamError> {
        let key: Arc<str> = Arc::from(format!("{host}:{port}"));
        let persistent = self.inner.config.persistent;
        if !persistent {
            req.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        let pooled = if persistent {
            self.take_idle(&key).await
        } else {
            None
        };
        if let Some(mut conn) = pooled {
            conn.lend();
            req.body_mut().carried_by(&conn);
            match conn.sender.try_send_request(req).await {
                Ok(resp) => {
                    self.inner
                        .metrics
                        .upstream_connections_reused
                        .fetch_add(1, Relaxed);
                    return Ok((resp, self.lease(conn, key)));
                }
                Err(mut e) => match e.take_message() {
                    // Not sent: the pooled connection died under us. Retry on a new one.
                    Some(returned) => req = returned,
                    None => {
                        return Err(self.failed(UpstreamError::from_hyper(host, e.into_error())))
                    }
                },
            }
        }
        let mut conn = self.connect(host, port).await.map_err(|e| self.failed(e))?;
        conn.lend();
        req.body_mut().carried_by(&conn);
        match conn.sender.send_request(req).await {
            Ok(resp) => Ok((resp, self.lease(conn, key))),
            Err(e) => Err(self.failed(UpstreamError::from_hyper(host, e))),
        }
    }

    fn failed(&self, e: UpstreamError) -> UpstreamError {
        self.inner.metrics.upstream_errors.fetch_add(1, Relaxed);
        e
    }

    fn lease(&self, conn: Conn, key: Arc<str>) -> Lease {
        Lease {
            conn: Some(conn),
            key,
            pool: self.inner.clone(),
        }
    }

    /// Opens a TCP connection to `host:port` with `upstream.socket`'s options (the static host
    /// table first, then the resolver; each address in turn), within `upstream.connect_timeout`.
    pub async fn open(&self, host: &str, port: u16) -> Result<TcpStream, UpstreamError> {
        let cfg = &self.inner.config;
        let connect = async {
            let mut last = None;
            let addrs =
                self.inner
                    .resolver
                    .lookup(host)
                    .await
                    .map_err(|e| UpstreamError::Resolve {
                        host: host.to_owned(),
                        source: std::io::Error::other(e.to_string()),
                    })?;
            for addr in addrs.iter().map(|ip| SocketAddr::new(*ip, port)) {
                let socket = if addr.is_ipv4() {
                    TcpSocket::new_v4()
                } else {
                    TcpSocket::new_v6()
                };
                let attempt = async {
                    let socket = socket?;
                    sockopt::set_buffers(&socket, &cfg.socket)?;
                    if let Some(ip) = cfg
                        .source_address
                        .filter(|ip| ip.is_ipv4() == addr.is_ipv4())
                    {
                        socket.bind(SocketAddr::new(ip, 0))?;
                    }
                    socket.connect(addr).await
                };
                match attempt.await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = Some(e),
                }
            }
            Err(UpstreamError::Connect {
                host: host.to_owned(),
                source: last.unwrap_or_else(|| std::io::Error::other("no addresses")),
            })
        };
        let stream = tokio::time::timeout(cfg.connect_timeout, connect)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout {
                host: host.to_owned(),
            })??;
        sockopt::connected(
            &stream,
            &cfg.socket,
            Side::Upstream,
            &self.inner.metrics.sockets,
        );
        Ok(stream)
    }

    async fn connect(&self, host: &str, port: u16) -> Result<Conn, UpstreamError> {
        let cfg = &self.inner.config;
        let stream = self.open(host, port).await?;
        self.inner
            .metrics
            .upstream_connections_opened
            .fetch_add(1, Relaxed);
        let peer = stream
            .peer_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let quiet = Arc::new(Quiet::default());
        let stream = IdleStream::with_quiet(stream, cfg.read_timeout, quiet.clone());
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| UpstreamError::from_hyper(host, e))?;
        let category = Arc::new(ConnCategory::unattributed());
        let task_category = category.clone();
        let metrics = self.inner.metrics.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let source = Source::Cell(&task_category);
            if let Err(e) = Timed::new(conn, &metrics.efficiency, source).await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(Conn {
            sender,
            peer,
            quiet,
            category,
        })
    }
}

/// How often the pool's idle list is swept.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
