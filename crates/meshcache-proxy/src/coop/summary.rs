//! The summary driver: runs `meshcache-dcm`'s summary exchange (Summary Cache and Cache
//! Digests: its [`Sender`] and [`Receiver`], which hold the rules) with the store-event
//! stream, the ICP socket, HTTP and tokio's timers.
//!
//! - [`Summaries`] follows the store (it is the cache's [`StoreFollower`]): every admission,
//!   eviction and invalidation reaches our counting filter as the store makes it, under the
//!   store's lock, so the filter never lags or reorders the store and costs no task wake-up.
//! - [`run_local`] does the rest, woken only when there is something to do: with the `summary`
//!   protocol, an update goes to every peer by ICP (`ICP_OP_DIRUPDATE`) once the share of
//!   changed documents passes the threshold; a store that outgrew the filter (or shrank far
//!   below it) has it rebuilt from the store's keys; with `digest`, the Cache Digest we serve is
//!   rebuilt every `digest_rebuild_period`.
//! - Peers' updates (`summary`) come to our *inbox*, a UDP socket on our ICP address that
//!   nothing waits on, so an update never wakes the node: it is read before summary lookups (at
//!   most every [`pace::INBOX_POLL`]) and once a second by [`run_local`] when no lookup did. A node
//!   names its inbox to a peer in its fetch of the peer's whole summary ([`INBOX_HEADER`]);
//!   until then, or for a peer that names none, updates go to the peer's ICP port.
//! - [`run_fetch`] fetches whole summaries from peers: at start, when deltas were lost or a
//!   peer restarted, and (digests) when a peer's digest expires. A summary that fails the
//!   checks is refused with a counted, logged reason; the peer then counts as a miss.
//! - [`serve`] answers `/squid-internal-periodic/store_digest` (Squid's URL: origin-form with
//!   any host, or absolute with our own name or address and port) and
//!   `/meshcache-internal/summary` (the whole Summary Cache array).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};
use meshcache_dcm::summary::exchange::{exchanges, Flavor, Receiver, Sender, Settings};
use meshcache_dcm::summary::pace::{FETCH_CHECK_INTERVAL, INBOX_IDLE};
use meshcache_dcm::summary::{add_all, InPlace, UpdateVerdict};
use meshcache_dcm::PeerId;
use meshcache_store::StoreEvent;
use meshcache_summary::Hashing;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use super::host::Host;
use super::link::Link;
use crate::cache::StoreFollower;
use crate::config::{Config, Protocol};

/// Squid's path for a cache's own digest.
pub const DIGEST_PATH: &str = "/squid-internal-periodic/store_digest";
/// Our path for the whole Summary Cache array.
pub const SUMMARY_PATH: &str = "/meshcache-internal/summary";
/// Request header of a fetch of a peer's whole summary that tells the peer where to send our
/// updates instead of our ICP port: `ICP; inbox=PORT`, our ICP address and the inbox's port
/// on the same address.
pub const INBOX_HEADER: &str = "meshcache-summary-inbox";
/// Receive buffer for one update datagram (the largest is 32 + 4 × 360 bytes).
const INBOX_BUFFER: usize = 2048;
/// The largest summary body we accept from a peer.
const MAX_SUMMARY_BODY: usize = 64 << 20;

/// Our own summary, and while a rebuild is under way, the store's changes since the snapshot
/// of keys it is built from (replayed onto the new filter when it is installed).
struct Local {
    sender: Sender,
    since_snapshot: Option<Vec<([u8; 16], bool)>>,
}

impl std::ops::Deref for Local {
    type Target = Sender;
    fn deref(&self) -> &Sender {
        &self.sender
    }
}

impl std::ops::DerefMut for Local {
    fn deref_mut(&mut self) -> &mut Sender {
        &mut self.sender
    }
}

/// Node-wide summary counters.
#[derive(Debug, Default)]
pub struct SummaryCounters {
    /// Delta-update datagrams sent (one per peer and message).
    pub updates_sent: AtomicU64,
    /// Bytes of those.
    pub update_bytes_sent: AtomicU64,
    /// Update datagrams received that did not decode, or came from nobody we exchange with.
    pub bad_updates: AtomicU64,
    /// Update datagrams read from our inbox (the others came to the ICP socket).
    pub inbox_received: AtomicU64,
    /// Our digest or summary served to others.
    pub served: AtomicU64,
    /// Bytes of those.
    pub served_bytes: AtomicU64,
}

/// The summary state of a node.
pub struct Summaries {
    flavor: Flavor,
    /// Ours: written by the store's events (under the store's lock), read by [`run_local`].
    local: Mutex<Local>,
    /// Our peers': read by every lookup.
    peers: Mutex<Receiver>,
    /// Wakes [`run_local`]: an update is due, or the filter needs resizing.
    wake: Notify,
    /// Set when `wake` was notified and [`run_local`] has not looked yet (one wake-up per job).
    woken: AtomicBool,
    /// Our update inbox (summary protocol): a non-blocking socket nobody waits on, read before
    /// lookups and by [`run_local`] when idle, so a peer's update never wakes this node.
    inbox: OnceLock<std::net::UdpSocket>,
    /// Per peer: its inbox, once its fetch of our summary named one.
    inboxes: Mutex<Vec<Option<SocketAddr>>>,
    /// When the inbox was last read (ms after `epoch`).
    inbox_read: AtomicU64,
    epoch: Instant,
    /// Counters.
    pub counters: SummaryCounters,
}

impl Summaries {
    /// The summary state `config` asks for, or `None` when its protocol keeps no summaries.
    pub fn new(config: &Config) -> Option<Summaries> {
        let c = &config.cooperation;
        if !c.protocol.uses_summaries() {
            return None;
        }
        let flavor = match c.protocol {
            Protocol::Digest => Flavor::Digest,
            _ => Flavor::Summary,
        };
        let settings = Settings {
            flavor,
            capacity: c.summary_capacity,
            store_bytes: config.store.memory
                + config.store.disks.iter().map(|d| d.size).sum::<u64>(),
            bits_per_entry: c.summary_bits_per_entry,
            hash_functions: c.summary_hash_functions,
            threshold: c.summary_threshold,
            digest_period: c.digest_rebuild_period,
        };
        let first_seq = {
            let t = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            (t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(16) ^ std::process::id()) | 1
        };
        let sender = match c.icp_listen.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        };
        let exchanging = config
            .peers
            .iter()
            .map(|p| exchanges(flavor, p.no_digest, p.icp.is_some()))
            .collect();
        let summaries = Summaries {
            flavor,
            local: Mutex::new(Local {
                sender: Sender::new(&settings, first_seq, sender),
                since_snapshot: None,
            }),
            peers: Mutex::new(Receiver::new(&settings, exchanging)),
            wake: Notify::new(),
            woken: AtomicBool::new(false),
            inbox: OnceLock::new(),
            inboxes: Mutex::new(vec![None; config.peers.len()]),
            inbox_read: AtomicU64::new(0),
            epoch: Instant::now(),
            counters: SummaryCounters::default(),
        };
        // The (empty) digest is there from the first request on, not from the first tick of
        // the task that follows the store.
        summaries.publish();
        Some(summaries)
    }

    /// Binds our update inbox on `ip` (summary protocol). Without one (an error, which is
    /// logged), peers send our updates to the ICP port as before.
    pub(crate) fn bind_inbox(&self, ip: IpAddr) {
        if self.flavor != Flavor::Summary || ip.is_unspecified() {
            return;
        }
        let bound = std::net::UdpSocket::bind(SocketAddr::new(ip, 0))
            .and_then(|socket| socket.set_nonblocking(true).map(|()| socket));
        match bound {
            Ok(socket) => {
                let _ = self.inbox.set(socket);
            }
            Err(e) => {
                tracing::warn!(%ip, error = %e, "no summary inbox; peers' updates come to the ICP port")
            }
        }
    }

    /// Our inbox's address, when we have one.
    pub fn inbox_addr(&self) -> Option<SocketAddr> {
        self.inbox.get().and_then(|s| s.local_addr().ok())
    }

    /// A peer's fetch of our summary named its inbox in `value` (`ICP; inbox=PORT`): our
    /// updates for the peer whose ICP address that is go there from now on.
    pub(crate) fn peer_inbox(&self, coop: &Link, value: &str) -> Option<PeerId> {
        let (icp, port) = value.split_once(';')?;
        let icp: SocketAddr = icp.trim().parse().ok()?;
        let port: u16 = port.trim().strip_prefix("inbox=")?.parse().ok()?;
        let peer = coop.peer_at(icp).filter(|&p| self.exchanging(p))?;
        let mut inboxes = self.inboxes.lock();
        *inboxes.get_mut(peer.0)? = Some(SocketAddr::new(icp.ip(), port));
        Some(peer)
    }

    /// Reads every update waiting in our inbox, if it was not read in the last `within`.
    pub(crate) fn read_inbox(&self, coop: &Link, within: Duration) {
        let Some(inbox) = self.inbox.get() else {
            return;
        };
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.inbox_read.load(Relaxed);
        if now < last + within.as_millis() as u64
            || self
                .inbox_read
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        let mut buf = [0u8; INBOX_BUFFER];
        while let Ok((n, from)) = inbox.recv_from(&mut buf) {
            self.counters.inbox_received.fetch_add(1, Relaxed);
            on_update(coop, self, &buf[..n], from);
        }
    }

    /// Whether we exchange summaries with `peer`.
    pub fn exchanging(&self, peer: PeerId) -> bool {
        self.peers.lock().exchanging(peer)
    }

    /// Peers whose summary may hold `key` (counted as lookups).
    pub fn candidates(&self, key: &[u8; 16]) -> Vec<PeerId> {
        self.peers.lock().candidates(key)
    }

    /// A peer did not have what its summary promised.
    pub fn false_hit(&self, peer: PeerId) {
        self.peers.lock().false_hit(peer);
    }

    /// The report for `/stats`.
    pub fn report(&self, names: &[String]) -> serde_json::Value {
        let now = Instant::now();
        let local = self.local.lock();
        let f = local.summary().filter();
        let entries = f.entries();
        let bits = f.bits();
        let set = (0..bits).filter(|&b| f.is_set(b)).count() as u64;
        let fill = set as f64 / bits.max(1) as f64;
        let receiver = self.peers.lock();
        let peers = receiver.peers();
        let reports: Vec<serde_json::Value> = peers
            .reports(now)
            .into_iter()
            .zip(names)
            .map(|(r, name)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("name".into(), name.clone().into());
                }
                v
            })
            .collect();
        serde_json::json!({
            "protocol": match self.flavor { Flavor::Digest => "digest", Flavor::Summary => "summary" },
            "local": {
                "entries": entries,
                "capacity": f.capacity(),
                "bits": bits,
                "bits_per_entry": f.bits_per_entry(),
                "hash_functions": f.hashing().functions(),
                "fill": fill,
                "formula_fp_rate": meshcache_summary::bloom_fp_rate(entries, bits, u32::from(f.hashing().functions())),
                "counter_bytes": f.memory(),
                "counter_bytes_per_object": if entries > 0 { f.memory() as f64 / entries as f64 } else { 0.0 },
                "saturated_counters": f.saturated(),
                "changed_since_update": local.summary().changed_docs(),
                "updates": local.summary().stats(),
            },
            "peer_memory_bytes": peers.memory(),
            "updates_sent": self.counters.updates_sent.load(Relaxed),
            "update_bytes_sent": self.counters.update_bytes_sent.load(Relaxed),
            "bad_updates": self.counters.bad_updates.load(Relaxed),
            "inbox": self.inbox_addr().map(|a| a.to_string()),
            "inbox_received": self.counters.inbox_received.load(Relaxed),
            "served": self.counters.served.load(Relaxed),
            "served_bytes": self.counters.served_bytes.load(Relaxed),
            "peers": reports,
        })
    }

    /// Rebuilds the digest we serve from the counting filter.
    fn publish(&self) {
        self.local.lock().publish(SystemTime::now());
    }
}

impl StoreFollower for Summaries {
    /// Folds the store's changes into the counting filter, and wakes [`run_local`] when that
    /// makes an update due or the filter no longer fits the store. A filter update is a tenth
    /// of a microsecond; handing events to a task cost more than that.
    fn changed(&self, events: &[StoreEvent]) {
        let mut local = self.local.lock();
        for ev in events {
            let (key, admitted) = (ev.key().0, ev.is_admission());
            local.change(&key, admitted);
            if let Some(since) = &mut local.since_snapshot {
                since.push((key, admitted));
            }
        }
        let work = local.has_work();
        drop(local);
        if work && !self.woken.swap(true, Relaxed) {
            self.wake.notify_one();
        }
    }
}

/// Sends our updates when they are due, resizes the filter to the store, rebuilds the digest we
/// serve. Attach `s` as the cache's follower before this runs.
pub(crate) async fn run_local<H: Host>(
    host: Arc<H>,
    s: Arc<Summaries>,
    mut stop: watch::Receiver<bool>,
) {
    let period = host.config().cooperation.digest_rebuild_period;
    // While the disks' rebuild runs, the digest served misses what it has yet to find: it is
    // rebuilt as soon as the rebuild is over, not a whole period later (as Squid does). Asked
    // before the first digest is built, so a rebuild that ends in between is not missed.
    let mut disks_rebuilding = !host.cache().disks_rebuilt();
    s.publish();
    let mut rebuild = tokio::time::interval(period);
    rebuild.tick().await;
    let mut idle = tokio::time::interval(INBOX_IDLE);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rebuild_check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = s.wake.notified() => {}
            _ = rebuild.tick() => {
                s.publish();
                continue;
            }
            _ = rebuild_check.tick(), if disks_rebuilding => {
                if host.cache().disks_rebuilt() {
                    disks_rebuilding = false;
                    s.publish();
                }
                continue;
            }
            _ = idle.tick(), if s.inbox.get().is_some() => {
                s.read_inbox(host.link(), INBOX_IDLE / 2);
                continue;
            }
            _ = stop.changed() => return,
        }
        // Summary Cache's updates keep their spacing: the work found now waits for it.
        let at = s.local.lock().drain_at(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            _ = stop.changed() => return,
        }
        s.woken.store(false, Relaxed);
        let drained = s.local.lock().drain(Instant::now());
        send_updates(&*host, &s, &drained.updates).await;
        if let Some(capacity) = drained.resize {
            tracing::info!(capacity, "resizing the summary to the store");
            rebuild_from_store(host.cache(), &s, capacity);
        }
    }
}

/// Rebuilds our filter from the store's keys, without holding the store or the filter while
/// it is built: the changes the store makes after its keys are copied are recorded (the
/// recording starts before the store's lock is released) and replayed onto the new filter as
/// it is installed, so none is lost or counted twice.
fn rebuild_from_store(cache: &crate::cache::Cache, s: &Summaries, capacity: u32) {
    let (keys, mut filter) = cache.keys_then(|| {
        let mut local = s.local.lock();
        local.since_snapshot = Some(Vec::new());
        local.summary().empty_like(capacity)
    });
    add_all(&mut filter, keys.iter().map(|k| &k.0));
    let mut local = s.local.lock();
    let since = local.since_snapshot.take().unwrap_or_default();
    local.summary_mut().install(filter);
    for (key, admitted) in since {
        local.change(&key, admitted);
    }
    local.resized(SystemTime::now());
}

/// Sends update datagrams to every peer we exchange summaries with.
async fn send_updates(host: &impl Host, s: &Summaries, updates: &[Arc<[u8]>]) {
    let link = host.link();
    let Some(socket) = link.icp_socket() else {
        return;
    };
    if updates.is_empty() {
        return;
    }
    let targets: Vec<SocketAddr> = {
        let receiver = s.peers.lock();
        let inboxes = s.inboxes.lock();
        host.config()
            .peers
            .iter()
            .enumerate()
            .filter(|(i, _)| receiver.exchanging(PeerId(*i)))
            .filter_map(|(i, p)| inboxes.get(i).copied().flatten().or(p.icp))
            .collect()
    };
    for datagram in updates {
        for &to in &targets {
            if socket.send_to(datagram, to).await.is_ok() {
                s.counters.updates_sent.fetch_add(1, Relaxed);
                link.counters
                    .bytes_sent
                    .fetch_add(datagram.len() as u64, Relaxed);
                s.counters
                    .update_bytes_sent
                    .fetch_add(datagram.len() as u64, Relaxed);
            }
        }
    }
}

/// An `ICP_OP_DIRUPDATE` datagram arrived from `from`, for `summaries` when the protocol
/// keeps them.
pub(crate) fn on_update_datagram(
    coop: &Link,
    summaries: Option<&Summaries>,
    datagram: &[u8],
    from: SocketAddr,
) {
    match summaries {
        Some(s) => on_update(coop, s, datagram, from),
        None => {
            coop.counters.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// An update datagram for `s` (to the ICP port or the inbox) from `from`.
fn on_update(coop: &Link, s: &Summaries, datagram: &[u8], from: SocketAddr) {
    let peer = coop.peer_at(from);
    let verdict = s
        .peers
        .lock()
        .on_update(Instant::now(), peer, datagram, &mut InPlace);
    match (peer, verdict) {
        (Some(peer), Ok(verdict)) => {
            coop.heard_from(peer);
            if verdict == UpdateVerdict::Held {
                tracing::debug!(%from, "summary update out of sequence; fetching the whole array");
            }
        }
        (_, Err(e)) => {
            let n = s.counters.bad_updates.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(%from, error = %e, bad = n, "summary update refused");
            }
        }
        (None, Ok(_)) => {}
    }
}

/// Fetches peers' whole summaries when they are due.
pub(crate) async fn run_fetch<H: Host>(
    host: Arc<H>,
    s: Arc<Summaries>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(FETCH_CHECK_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let due = s.peers.lock().fetch_due(Instant::now());
        for peer in due {
            let fetch = fetch_one(&*host, &s, peer);
            tokio::select! {
                _ = fetch => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Fetches one peer's summary and installs (or refuses) it.
async fn fetch_one(host: &impl Host, s: &Summaries, peer: PeerId) {
    let Some(spec) = host.config().peers.get(peer.0) else {
        return;
    };
    let name = spec.name.clone();
    let path = match s.flavor {
        Flavor::Digest => DIGEST_PATH,
        Flavor::Summary => SUMMARY_PATH,
    };
    let limit = host.config().cooperation.peer_response_timeout * 2;
    // Our inbox, for the peer to send its updates to (summary protocol).
    let inbox = s
        .inbox_addr()
        .zip(host.link().icp_addr())
        .map(|(inbox, icp)| format!("{icp}; inbox={}", inbox.port()));
    let got = tokio::time::timeout(limit, get(host, spec.http, path, inbox.as_deref())).await;
    let now = Instant::now();
    let (body, expires) = match got {
        Ok(Ok(x)) => x,
        Ok(Err(why)) => {
            tracing::info!(peer = %name, %why, "could not fetch the peer's summary; retrying later");
            s.peers.lock().failed(now, peer);
            return;
        }
        Err(_) => {
            tracing::info!(peer = %name, "peer's summary did not arrive in time; retrying later");
            s.peers.lock().failed(now, peer);
            return;
        }
    };
    let expires_in = expires.and_then(|e| e.duration_since(SystemTime::now()).ok());
    let body: Arc<[u8]> = Arc::from(&body[..]);
    match s
        .peers
        .lock()
        .fetched(now, peer, &body, expires_in, &mut InPlace)
    {
        Ok(()) => tracing::debug!(peer = %name, bytes = body.len(), "peer summary installed"),
        Err(refused) => {
            tracing::warn!(peer = %name, error = %refused.error, "refusing the peer's summary")
        }
    }
}

/// GETs `path` from a peer's HTTP port (origin-form, as Squid rewrites its internal URLs).
async fn get(
    node: &impl Host,
    peer: SocketAddr,
    path: &str,
    inbox: Option<&str>,
) -> Result<(Bytes, Option<SystemTime>), String> {
    let host = peer.ip().to_string();
    let mut req = Request::new(crate::upstream::no_body());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = Uri::try_from(path).map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&peer.to_string()) {
        h.insert(header::HOST, v);
    }
    h.append(
        header::ACCEPT,
        HeaderValue::from_static("application/cache-digest"),
    );
    h.append(header::ACCEPT, HeaderValue::from_static("text/html"));
    h.insert(header::VIA, node.via().clone());
    if let Some(v) = inbox.and_then(|v| HeaderValue::from_str(v).ok()) {
        h.insert(INBOX_HEADER, v);
    }
    let (resp, lease) = node
        .upstream()
        .send(&host, peer.port(), req)
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let expires = resp
        .headers()
        .get(header::EXPIRES)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    let body = Limited::new(resp.into_body(), MAX_SUMMARY_BODY)
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    lease.release();
    if status != StatusCode::OK {
        let text = String::from_utf8_lossy(&body[..body.len().min(120)])
            .trim()
            .to_owned();
        return Err(format!("{status}: {text}"));
    }
    Ok((body, expires))
}

/// What an internal URL asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Internal {
    /// Our Cache Digest.
    Digest,
    /// Our whole Summary Cache array.
    Summary,
}

/// Whether `uri` names one of our internal objects: origin-form with the path (any Host, as
/// Squid), or absolute with our own name or listening address and port.
pub(crate) fn internal(config: &Config, uri: &Uri) -> Option<Internal> {
    let which = match uri.path() {
        DIGEST_PATH => Internal::Digest,
        SUMMARY_PATH => Internal::Summary,
        _ => return None,
    };
    let Some(auth) = uri.authority() else {
        return Some(which);
    };
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    let port = auth.port_u16().unwrap_or(80);
    let ours = config.http.listen.iter().any(|l| {
        l.port() == port
            && (host.eq_ignore_ascii_case(&config.name)
                || host.parse::<IpAddr>().is_ok_and(|ip| ip == l.ip()))
    });
    ours.then_some(which)
}

/// The response to an internal request.
pub(crate) fn serve(
    link: &Link,
    s: Option<&Summaries>,
    which: Internal,
    request: &HeaderMap,
) -> (StatusCode, HeaderMap, Bytes) {
    if let (Internal::Summary, Some(s), Some(v)) = (
        which,
        s,
        request.get(INBOX_HEADER).and_then(|v| v.to_str().ok()),
    ) {
        if s.peer_inbox(link, v).is_none() {
            tracing::debug!(
                inbox = v,
                "summary inbox named by no peer we exchange with; ignored"
            );
        }
    }
    let mut headers = HeaderMap::new();
    let text = |headers: &mut HeaderMap, msg: &'static str| {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        (StatusCode::NOT_FOUND, Bytes::from_static(msg.as_bytes()))
    };
    let (status, body) = match (which, s) {
        (Internal::Digest, Some(s)) => {
            let local = s.local.lock();
            match local.digest() {
                Some(p) => {
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/cache-digest"),
                    );
                    let date =
                        |t: SystemTime| HeaderValue::from_str(&httpdate::fmt_http_date(t)).ok();
                    if let Some(v) = date(p.expires) {
                        headers.insert(header::EXPIRES, v);
                    }
                    if let Some(v) = date(p.built) {
                        headers.insert(header::LAST_MODIFIED, v);
                    }
                    (StatusCode::OK, Bytes::from_owner(p.body.clone()))
                }
                None if local.summary().filter().hashing() == Hashing::DIGEST => text(
                    &mut headers,
                    "This cache is currently building its digest.\n",
                ),
                None => text(&mut headers, "This cache does not support Cache Digests.\n"),
            }
        }
        (Internal::Digest, None) => {
            text(&mut headers, "This cache does not support Cache Digests.\n")
        }
        (Internal::Summary, Some(s)) if s.flavor == Flavor::Summary => {
            match s.local.lock().full() {
                Some(body) => {
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/x-meshcache-summary"),
                    );
                    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    (StatusCode::OK, Bytes::from_owner(body))
                }
                None => text(
                    &mut headers,
                    "This cache is currently building its summary.\n",
                ),
            }
        }
        (Internal::Summary, _) => text(&mut headers, "This cache does not exchange summaries.\n"),
    };
    if status == StatusCode::OK {
        if let Some(s) = s {
            s.counters.served.fetch_add(1, Relaxed);
            s.counters
                .served_bytes
                .fetch_add(body.len() as u64, Relaxed);
        }
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len() as u64));
    (status, headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Cache, CachedObject};
    use crate::semantics::Freshness;
    use meshcache_store::{InvalidateCause, Replacement, StoreConfig, StoreKey};

    fn object() -> CachedObject {
        let f = Freshness {
            response_time: 0,
            initial_age: 0,
            lifetime: 60,
            directives: Default::default(),
        };
        CachedObject::new(
            StatusCode::OK,
            &HeaderMap::new(),
            Bytes::from_static(b"x"),
            f,
        )
    }

    fn follower(protocol: &str) -> (Cache, Arc<Summaries>) {
        let config = Config::from_toml(&format!(
            "[cooperation]\nprotocol = \"{protocol}\"\nsummary_capacity = 1000\n"
        ))
        .expect("config");
        let summaries = Arc::new(Summaries::new(&config).expect("keeps summaries"));
        let cache = Cache::new(StoreConfig {
            capacity: 1 << 24,
            max_object_size: 1 << 16,
            replacement: Replacement::Lru,
        });
        assert!(cache.follow(summaries.clone()));
        (cache, summaries)
    }

    fn url(i: u32) -> String {
        format!("http://a.test/{i}")
    }

    #[tokio::test]
    async fn the_filter_follows_the_store_and_wakes_the_sender_once_an_update_is_due() {
        let (cache, s) = follower("summary");
        // 1 % of a 1,000-entry filter: the tenth change makes an update due.
        for i in 0..9 {
            cache.insert(&url(i), &HeaderMap::new(), object());
        }
        assert_eq!(s.local.lock().summary().filter().entries(), 9);
        assert!(!s.woken.load(Relaxed), "nothing due yet");
        cache.insert(&url(9), &HeaderMap::new(), object());
        assert!(s.woken.load(Relaxed));
        tokio::time::timeout(Duration::from_secs(5), s.wake.notified())
            .await
            .expect("the sender is woken");
        for i in 0..10 {
            assert!(s.local.lock().summary().contains(&StoreKey::get(&url(i)).0));
        }
        cache.invalidate(&url(3), InvalidateCause::Explicit);
        let local = s.local.lock();
        assert_eq!(local.summary().filter().entries(), 9);
        assert!(!local.summary().contains(&StoreKey::get(&url(3)).0));
    }

    #[test]
    fn digests_wake_nothing_for_changes() {
        let (cache, s) = follower("digest");
        for i in 0..50 {
            cache.insert(&url(i), &HeaderMap::new(), object());
        }
        assert_eq!(s.local.lock().summary().filter().entries(), 50);
        assert!(
            !s.woken.load(Relaxed),
            "a digest is rebuilt on its schedule only"
        );
    }

    #[test]
    fn a_rebuild_loses_no_change_the_store_makes_meanwhile() {
        let (cache, s) = follower("summary");
        let writer = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                for i in 0..3000 {
                    cache.insert(&url(i), &HeaderMap::new(), object());
                    if i % 3 == 0 {
                        cache.invalidate(&url(i / 2), InvalidateCause::Explicit);
                    }
                }
            })
        };
        let mut rebuilds = 0;
        while !writer.is_finished() || rebuilds < 20 {
            rebuild_from_store(&cache, &s, 2000 + rebuilds);
            rebuilds += 1;
        }
        writer.join().expect("writer");
        let stored = cache.keys();
        let local = s.local.lock();
        assert!(local.since_snapshot.is_none());
        assert_eq!(local.summary().stats().rebuilds, u64::from(rebuilds));
        assert_eq!(
            local.summary().filter().entries(),
            stored.len() as u64,
            "{rebuilds} rebuilds"
        );
        for key in &stored {
            assert!(local.summary().contains(&key.0));
        }
    }

    #[test]
    fn a_peer_names_its_inbox_and_nothing_else_does() {
        let config = Config::from_toml(
            "[cooperation]\nprotocol = \"summary\"\n\
             [[peer]]\nname = \"b\"\nrole = \"sibling\"\nhttp = \"127.0.0.2:3128\"\nicp = \"127.0.0.2:3130\"\n\
             [[peer]]\nname = \"c\"\nrole = \"sibling\"\nhttp = \"127.0.0.3:3128\"\nicp = \"127.0.0.3:3130\"\n",
        )
        .expect("config");
        let coop = crate::coop::Coop::new(&config);
        let s = coop.summaries().expect("summaries");
        for bad in [
            "",
            "127.0.0.2:3130",
            "127.0.0.2:3130; inbox=",
            "127.0.0.2:3130; inbox=70000",
            "127.0.0.2:3130; port=4000",
            "nonsense; inbox=4000",
            "127.0.0.9:3130; inbox=4000",
            "127.0.0.2:3131; inbox=4000",
        ] {
            assert_eq!(s.peer_inbox(&coop, bad), None, "{bad:?}");
        }
        assert!(s.inboxes.lock().iter().all(Option::is_none));
        assert_eq!(
            s.peer_inbox(&coop, "127.0.0.3:3130; inbox=40001"),
            Some(PeerId(1))
        );
        let want: SocketAddr = "127.0.0.3:40001".parse().expect("addr");
        assert_eq!(*s.inboxes.lock(), vec![None, Some(want)]);
    }

    #[test]
    fn the_inbox_is_read_at_most_once_per_poll_interval() {
        let (_, s) = follower("summary");
        let config = Config::from_toml("[cooperation]\nprotocol = \"summary\"\n").expect("config");
        let coop = crate::coop::Coop::new(&config);
        s.bind_inbox(IpAddr::from([127, 0, 0, 1]));
        let inbox = s.inbox_addr().expect("bound");
        let stranger = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        stranger.send_to(b"not an update", inbox).expect("send");
        // Wait for the datagram to be queued (loopback: at once, but not before the send).
        let until = Instant::now() + Duration::from_secs(5);
        s.inbox_read.store(0, Relaxed);
        while s.counters.inbox_received.load(Relaxed) == 0 {
            assert!(Instant::now() < until, "the datagram is read");
            s.inbox_read.store(0, Relaxed);
            std::thread::sleep(Duration::from_millis(1));
            s.read_inbox(&coop, Duration::ZERO);
        }
        // Refused (not from a peer), counted, and nothing panics.
        assert_eq!(s.counters.bad_updates.load(Relaxed), 1);
        stranger.send_to(b"again", inbox).expect("send");
        std::thread::sleep(Duration::from_millis(20));
        s.read_inbox(&coop, Duration::from_secs(3600));
        assert_eq!(s.counters.inbox_received.load(Relaxed), 1, "read too soon");
    }
}
