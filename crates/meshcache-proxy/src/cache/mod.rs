//! The cache proper: what an object looks like in the store, the two tiers (memory and disks),
//! Vary handling, collapsed forwarding, and the store-event stream.
//!
//! Objects live under Squid's key for the URL (`MD5(GET || URL)`), so digests and directories
//! built from store events speak the same keys as Squid. A response with `Vary` is stored under
//! a variant key, and the plain key holds a small marker naming the Vary fields and the
//! variants, which is also what a peer's lookup by URL finds.
//!
//! **Two tiers.** The memory store keeps the hot objects. With disks configured, every object
//! stored in memory is also written to a disk, in the background (a full write queue drops the
//! write, never delays the client); objects too large for memory go to disk alone, streamed as
//! they arrive. A lookup tries memory, then the large objects kept open, then the disks'
//! indexes: a small object read from disk twice is copied back into memory, a large one kept open and
//! mapped (`open.rs`). A new version, an invalidation or a damaged record takes a key out of
//! both tiers. See `docs/store.md`.
//!
//! **One event stream.** Every change to the store is published as a [`StoreEvent`]: to a
//! [`StoreFollower`], if one is attached, while the tiers' lock is still held (so it sees the
//! changes in the store's own order, and a snapshot of the keys plus the events after it is
//! exact), and on one broadcast channel for tasks that follow the store at their own pace. The
//! events are those of the union of the tiers (`tiers.rs`): what a peer may ask this node for.

mod disks;
mod doorkeeper;
pub mod meta;
mod object;
mod open;
pub mod partial;
mod tiers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use http::StatusCode;
use meshcache_disk::{
    DiskConfig, DiskEntry, DiskIndex, DiskStats, DiskStream, Gone, IndexHolder, Kind, Location,
    OpenError, ReadError, StoreJob,
};
use meshcache_store::{
    EvictCause, InvalidateCause, MemoryStore, StoreConfig, StoreEvent, StoreKey,
};
use parking_lot::{Mutex, MutexGuard};
use serde::Serialize;
use tokio::sync::{broadcast, watch};

use crate::metrics::StoreStats;
use crate::semantics::Freshness;
use crate::vary::{vary_names, vary_selector};
use crate::zerocopy::{self, BodyArena};
use disks::{DiskTier, Loaded};
use partial::{Partial, Partials, Piece};

/// The share of the memory store's capacity that partial responses may take (1/N).
const PARTIALS_SHARE: u64 = 8;
pub use object::{CachedObject, Entry, ENTRY_OVERHEAD};
use tiers::Tiers;

/// Told of every store change synchronously, under the store's lock: it must be quick (a
/// counting filter's few counters, a flag) and must not call back into the cache.
pub trait StoreFollower: Send + Sync {
    /// These changes were just made to the store, in this order.
    fn changed(&self, events: &[StoreEvent]);
}

/// The most variants kept for one URL.
const MAX_VARIANTS: usize = 32;

/// Which tier answered a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The memory store.
    Memory,
    /// This disk (read from it now, or kept open since an earlier hit).
    Disk(usize),
}

/// A stored object found for a request.
#[derive(Clone, Debug)]
pub struct Found {
    entry: Arc<Entry>,
    /// The key it is stored under (a variant key for varying responses).
    pub key: StoreKey,
    /// Where it was found.
    pub tier: Tier,
}

impl Found {
    /// An object that is not (or not yet) in the store, as a lookup would have found it.
    pub fn detached(key: StoreKey, object: CachedObject) -> Found {
        Found {
            entry: Arc::new(Entry::Object(object)),
            key,
            tier: Tier::Memory,
        }
    }

    /// The object.
    pub fn object(&self) -> &CachedObject {
        match &*self.entry {
            Entry::Object(o) => o,
            // A `Found` is only ever made around an object.
            Entry::Vary { .. } => unreachable!("a Found always holds an object"),
        }
    }
}

/// The role a request takes for a cacheable miss.
pub enum Collapse {
    /// Fetch it; others wait for the guard to drop.
    Leader(FetchGuard),
    /// Another request is fetching it: wait for it to finish, then look again.
    Follower(watch::Receiver<()>),
}

/// Held by the request that fetches a URL for everyone; dropping it wakes the waiters. When
/// the object goes to a disk alone, the disk's writer holds it until the object is indexed.
pub struct FetchGuard {
    key: StoreKey,
    inner: Arc<Inner>,
    _done: watch::Sender<()>,
}

impl Drop for FetchGuard {
    fn drop(&mut self) {
        self.inner.inflight.lock().remove(&self.key);
    }
}

/// How the cache uses its disks.
#[derive(Clone, Debug, Default)]
pub struct DiskSettings {
    /// The disks.
    pub disks: Vec<DiskConfig>,
    /// Large disk objects kept open and mapped between hits.
    pub open_files: u64,
}

/// One disk's figures, for `/stats` and `/metrics`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DiskReport {
    /// Objects it holds.
    pub objects: u64,
    /// Bytes charged to its budget.
    pub bytes: u64,
    /// Its budget.
    pub capacity: u64,
    /// Writes announced and not yet landed.
    pub pending: u64,
    /// Its counters.
    #[serde(flatten)]
    pub stats: DiskStats,
}

/// Where a lookup stands.
enum Probe {
    Hit(Found),
    Miss,
    /// On disk `disk`, at `entry`: to read. `depth` 1 once a Vary marker was followed.
    Disk {
        disk: usize,
        key: StoreKey,
        entry: DiskEntry,
        depth: u8,
    },
}

struct Inner {
    tiers: Mutex<Tiers>,
    disks: Option<DiskTier>,
    inflight: Mutex<HashMap<StoreKey, watch::Receiver<()>>>,
    events: broadcast::Sender<StoreEvent>,
    follower: OnceLock<Arc<dyn StoreFollower>>,
    admitted: AtomicU64,
    evicted: AtomicU64,
    invalidated: AtomicU64,
    /// Where large bodies are kept so hits can be sent with sendfile(2) (see `zerocopy`).
    arena: Option<Arc<BodyArena>>,
    /// The largest object the memory store takes.
    memory_limit: u64,
    /// Pieces of representations that 206 responses brought (`partial.rs`).
    partials: Mutex<Partials>,
}

/// The shared cache: store, collapsed-forwarding table and event stream.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

/// When a stored response stops being fresh, in Unix seconds (0 if it never is).
fn fresh_until(f: &Freshness) -> u32 {
    let until = (f.response_time + u64::from(f.lifetime)).saturating_sub(u64::from(f.initial_age));
    u32::try_from(until).unwrap_or(u32::MAX)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Cache {
    /// A cache with the given store settings, every body on the heap, no disk.
    pub fn new(config: StoreConfig) -> Self {
        Self::with_arena(config, None)
    }

    /// A cache that keeps bodies of `zerocopy::MIN_SIZE` bytes and more in `arena`; no disk.
    pub fn with_arena(config: StoreConfig, arena: Option<Arc<BodyArena>>) -> Self {
        Self::build(config, arena, None, Vec::new(), 0)
    }

    /// A cache with disks: their directories are opened (and locked) now; their rebuild and
    /// writer start with [`Cache::start`].
    ///
    /// # Errors
    ///
    /// A disk's directory cannot be used (see [`OpenError`]).
    pub fn with_disks(
        config: StoreConfig,
        arena: Option<Arc<BodyArena>>,
        settings: &DiskSettings,
    ) -> Result<Self, OpenError> {
        if settings.disks.is_empty() {
            return Ok(Self::with_arena(config, arena));
        }
        let (tier, indexes) = DiskTier::open(&settings.disks)?;
        Ok(Self::build(
            config,
            arena,
            Some(tier),
            indexes,
            settings.open_files,
        ))
    }

    fn build(
        config: StoreConfig,
        arena: Option<Arc<BodyArena>>,
        disks: Option<DiskTier>,
        indexes: Vec<DiskIndex>,
        open_files: u64,
    ) -> Self {
        // Room for the events of a summary's drain interval at tens of thousands of misses a
        // second; a subscriber that falls further behind rebuilds from the store.
        let (events, _) = broadcast::channel(16_384);
        Cache {
            inner: Arc::new(Inner {
                tiers: Mutex::new(Tiers::new(MemoryStore::new(config), indexes, open_files)),
                disks,
                inflight: Mutex::new(HashMap::new()),
                events,
                follower: OnceLock::new(),
                admitted: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                invalidated: AtomicU64::new(0),
                arena,
                memory_limit: config.max_object_size.min(config.capacity),
                partials: Mutex::new(Partials::new(config.capacity / PARTIALS_SHARE)),
            }),
        }
    }

    /// Starts the disks' rebuild and writer. Call it once followers and subscribers are
    /// attached: the objects the rebuild finds are announced as admitted.
    pub fn start(&self) {
        let Some(tier) = &self.inner.disks else {
            return;
        };
        let holder: Arc<dyn IndexHolder> = self.inner.clone();
        let holder: Weak<dyn IndexHolder> = Arc::downgrade(&holder);
        for disk in &tier.disks {
            disk.start(holder.clone());
        }
    }

    /// Writes out what the disks' queues hold, syncs, and stops their threads (`timeout` at
    /// most for the queues).
    pub fn close(&self, timeout: Duration) {
        if let Some(tier) = &self.inner.disks {
            for disk in &tier.disks {
                disk.close(timeout);
            }
        }
    }

    /// Waits until every disk has written what it was given and synced (`timeout` at most);
    /// whether they all did. For tests and tools.
    pub fn flush_disks(&self, timeout: Duration) -> bool {
        self.inner
            .disks
            .as_ref()
            .is_none_or(|t| t.disks.iter().all(|d| d.flush(timeout)))
    }

    /// Whether every disk's rebuild is over.
    pub fn disks_rebuilt(&self) -> bool {
        self.inner
            .disks
            .as_ref()
            .is_none_or(|t| t.disks.iter().all(|d| d.rebuilt()))
    }

    /// The arena large bodies are kept in, if any.
    pub fn arena(&self) -> Option<&Arc<BodyArena>> {
        self.inner.arena.as_ref()
    }

    /// Subscribes to store events (admitted, evicted, invalidated, with cause).
    pub fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.inner.events.subscribe()
    }

    /// Attaches the one synchronous follower (a second is refused: returns false). Attach it
    /// before the first request, or it misses what was stored before.
    pub fn follow(&self, follower: Arc<dyn StoreFollower>) -> bool {
        self.inner.follower.set(follower).is_ok()
    }

    /// The keys of everything stored now, and `then()`'s result. `then` runs under the store's
    /// lock, after the snapshot and before the store can change again, so a follower can mark
    /// that point there (start recording changes, take its own lock): every change it is told
    /// of afterwards is one the snapshot does not hold.
    pub fn keys_then<G>(&self, then: impl FnOnce() -> G) -> (Vec<StoreKey>, G) {
        let tiers = self.inner.tiers.lock();
        let keys = tiers.keys();
        let guard = then();
        drop(tiers);
        (keys, guard)
    }

    /// The keys of everything stored now (to rebuild a summary from).
    pub fn keys(&self) -> Vec<StoreKey> {
        self.inner.tiers.lock().keys()
    }

    /// Finds the object that answers a GET of `url` with these request headers. A disk read it
    /// needs is made on this thread (see [`Cache::find`] for the request path).
    pub fn lookup(&self, url: &str, request: &HeaderMap) -> Option<Found> {
        let mut probe = self.inner.first_probe(url, request);
        loop {
            match probe {
                Probe::Hit(found) => return Some(found),
                Probe::Miss => return None,
                Probe::Disk { .. } => {
                    probe = self.inner.resolve(probe, url, request, false).ok()?;
                }
            }
        }
    }

    /// As [`Cache::lookup`], for the request path: a disk read that would wait for the device
    /// (its record not in the page cache) is made on a blocking thread.
    pub async fn find(&self, url: &str, request: &HeaderMap) -> Option<Found> {
        let mut probe = self.inner.first_probe(url, request);
        loop {
            match probe {
                Probe::Hit(found) => return Some(found),
                Probe::Miss => return None,
                Probe::Disk {
                    disk,
                    key,
                    entry,
                    depth,
                } => {
                    let again = Probe::Disk {
                        disk,
                        key,
                        entry,
                        depth,
                    };
                    probe = match self.inner.resolve(probe, url, request, true) {
                        Ok(next) => next,
                        Err(()) => {
                            let (inner, url, request) =
                                (self.inner.clone(), url.to_owned(), request.clone());
                            tokio::task::spawn_blocking(move || {
                                inner.resolve(again, &url, &request, false)
                            })
                            .await
                            .ok()?
                            .ok()?
                        }
                    };
                }
            }
        }
    }

    /// True when a GET of `url` has a stored response (or Vary marker), without touching the
    /// replacement policy: what a peer's query asks.
    pub fn contains(&self, url: &str) -> bool {
        self.inner.tiers.lock().holds(&StoreKey::get(url))
    }

    /// True when a GET of `url` has a stored object that stays fresh at least `min` longer,
    /// looked up without touching the replacement policy: what an ICP query asks. A URL whose
    /// responses vary is not a hit (the query carries no request headers to pick a variant).
    pub fn fresh_for(&self, url: &str, min: Duration) -> bool {
        let key = StoreKey::get(url);
        let tiers = self.inner.tiers.lock();
        match tiers.memory.peek(&key).map(|e| &**e) {
            Some(Entry::Object(o)) => {
                let ttl = o.freshness.ttl(SystemTime::now());
                return ttl > 0 && ttl >= min.as_secs() as i64;
            }
            Some(Entry::Vary { .. }) => return false,
            None => {}
        }
        tiers
            .disks
            .iter()
            .find_map(|d| d.peek(&key))
            .is_some_and(|e| {
                let ttl = i64::from(e.expires()) - unix_now() as i64;
                !e.is_vary() && ttl > 0 && ttl >= min.as_secs() as i64
            })
    }

    /// The largest object the memory store takes.
    pub fn memory_limit(&self) -> u64 {
        self.inner.memory_limit
    }

    /// Whether the cache has disks.
    pub fn has_disks(&self) -> bool {
        self.inner.disks.is_some()
    }

    /// Stores a response to a GET of `url` made with `request` headers. Refusals (too large,
    /// too many variants) are silent: the response was already relayed.
    pub fn insert(&self, url: &str, request: &HeaderMap, object: CachedObject) {
        self.insert_guarded(url, request, object, None);
    }

    /// As [`Cache::insert`], for a collapsed fetch's leader: `guard` is dropped once the object
    /// can be found (at once if the memory store took it, when it is indexed if only a disk
    /// does).
    pub fn insert_guarded(
        &self,
        url: &str,
        request: &HeaderMap,
        mut object: CachedObject,
        guard: Option<FetchGuard>,
    ) {
        let key = StoreKey::get(url);
        // The whole representation supersedes any pieces of it.
        self.inner.partials.lock().remove(&key);
        if object.body.len() as u64 <= self.inner.memory_limit {
            if let Some(body) = self.arena().and_then(|a| a.place(&object.body)) {
                object.body = body;
            } else if let Ok(body) = zerocopy::mapped::resident(&object.body) {
                // A body mapped from a disk's file (a revalidated disk hit) is not kept mapped
                // in memory: a mapping per object would pin files and address space.
                object.body = body;
            }
        }
        let names = object
            .headers
            .iter()
            .any(|(n, _)| n == http::header::VARY)
            .then(|| vary_names(&HeaderMap::from_iter(object.headers.iter().cloned())))
            .flatten()
            .filter(|names| !names.is_empty());
        let mut guard: Option<Box<dyn Send>> = guard.map(|g| Box::new(g) as Box<dyn Send>);
        let mut tiers = self.inner.tiers.lock();
        let mut news = Vec::new();
        match names {
            None => {
                let entry = Arc::new(Entry::Object(object));
                self.inner
                    .put(&mut tiers, key, entry, &mut guard, &mut news);
            }
            Some(names) => {
                let vkey = StoreKey::variant(url, &vary_selector(&names, request));
                let mut variants = self.inner.known_variants(&tiers, &key, &names);
                if !variants.contains(&vkey) {
                    if variants.len() >= MAX_VARIANTS {
                        return;
                    }
                    variants.push(vkey);
                }
                let entry = Arc::new(Entry::Object(object));
                if self
                    .inner
                    .put(&mut tiers, vkey, entry, &mut guard, &mut news)
                {
                    let marker = Arc::new(Entry::Vary {
                        names: names.into_boxed_slice(),
                        variants,
                    });
                    self.inner
                        .put(&mut tiers, key, marker, &mut None, &mut news);
                }
            }
        }
        self.inner.settle(tiers, news);
        drop(guard);
    }

    /// Starts writing a response too large for the memory store straight to a disk, as its
    /// body arrives (see [`DiskStream`]). `None` when no disk takes it. Whatever was stored
    /// for it before is dropped now.
    pub fn stream(
        &self,
        url: &str,
        request: &HeaderMap,
        status: StatusCode,
        headers: &HeaderMap,
        freshness: Freshness,
        expected: Option<u64>,
    ) -> Option<DiskStream> {
        let tier = self.inner.disks.as_ref()?;
        let key = StoreKey::get(url);
        let head = CachedObject::new(status, headers, Bytes::new(), freshness);
        let meta = meta::encode_object(&head);
        let len = expected.unwrap_or(0) + meta.len() as u64 + 64;
        let names = vary_names(headers).filter(|n| !n.is_empty());
        let target = match &names {
            Some(names) => StoreKey::variant(url, &vary_selector(names, request)),
            None => key,
        };
        let disk = tier.choose(&target, len)?;
        let mut tiers = self.inner.tiers.lock();
        let mut news = Vec::new();
        self.inner.forget(
            &mut tiers,
            target,
            Gone::Evicted(EvictCause::Replaced),
            &mut news,
        );
        if let Some(names) = names {
            let mut variants = self.inner.known_variants(&tiers, &key, &names);
            if !variants.contains(&target) {
                if variants.len() >= MAX_VARIANTS {
                    self.inner.settle(tiers, news);
                    return None;
                }
                variants.push(target);
            }
            let marker = Arc::new(Entry::Vary {
                names: names.into_boxed_slice(),
                variants,
            });
            self.inner
                .put(&mut tiers, key, marker, &mut None, &mut news);
        }
        let d = &tier.disks[disk];
        let serial = d.next_serial();
        tiers.disks[disk].expect(target, serial);
        let stream = d.stream(target, serial, Kind::Object, meta, fresh_until(&freshness));
        if stream.is_none() {
            tiers.disks[disk].abandon(&target, serial);
        }
        self.inner.settle(tiers, news);
        stream
    }

    /// Keeps a 206's piece of `url`'s representation. When the pieces now make the whole, it
    /// is stored as a 200 (and the pieces forgotten); returns whether it was.
    pub fn keep_partial(&self, url: &str, piece: Piece) -> bool {
        let key = StoreKey::get(url);
        let whole = {
            let mut partials = self.inner.partials.lock();
            let Some(partial) = partials.add(key, piece) else {
                return false;
            };
            partial.whole().map(|body| {
                let headers: HeaderMap = partial.headers.iter().cloned().collect();
                CachedObject::new(StatusCode::OK, &headers, body, partial.freshness)
            })
        };
        match whole {
            Some(object) => {
                self.insert(url, &HeaderMap::new(), object);
                true
            }
            None => false,
        }
    }

    /// The pieces held of `url`'s representation.
    pub fn partial(&self, url: &str) -> Option<Partial> {
        self.inner.partials.lock().get(&StoreKey::get(url)).cloned()
    }

    /// Removes whatever is stored for `url`, every variant included.
    pub fn invalidate(&self, url: &str, cause: InvalidateCause) {
        let key = StoreKey::get(url);
        self.inner.partials.lock().remove(&key);
        // A disk's Vary marker names the variants to drop with it: read it first.
        let on_disk = self.inner.disk_marker(&key);
        let mut tiers = self.inner.tiers.lock();
        let mut variants = match tiers.memory.peek(&key).map(|e| &**e) {
            Some(Entry::Vary { variants, .. }) => variants.clone(),
            _ => Vec::new(),
        };
        variants.extend(on_disk);
        let mut news = Vec::new();
        for k in std::iter::once(key).chain(variants) {
            self.inner
                .forget(&mut tiers, k, Gone::Invalidated(cause), &mut news);
        }
        self.inner.settle(tiers, news);
    }

    /// Removes one stored object (e.g. a variant found stale and gone upstream).
    pub fn invalidate_key(&self, key: &StoreKey, cause: InvalidateCause) {
        let mut tiers = self.inner.tiers.lock();
        let mut news = Vec::new();
        self.inner
            .forget(&mut tiers, *key, Gone::Invalidated(cause), &mut news);
        self.inner.settle(tiers, news);
    }

    /// Joins the fetch of `url` in flight, or becomes the one that fetches it.
    pub fn collapse(&self, url: &str) -> Collapse {
        let key = StoreKey::get(url);
        let mut inflight = self.inner.inflight.lock();
        if let Some(rx) = inflight.get(&key) {
            return Collapse::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        inflight.insert(key, rx);
        Collapse::Leader(FetchGuard {
            key,
            inner: self.inner.clone(),
            _done: tx,
        })
    }

    /// Counts a hit served from `found`'s tier (a disk's figures count its hits).
    pub fn count_hit(&self, found: &Found) {
        if let (Tier::Disk(disk), Some(tier)) = (found.tier, &self.inner.disks) {
            if let Some(d) = tier.disks.get(disk) {
                d.count_hit();
            }
        }
    }

    /// Store figures for metrics.
    pub fn stats(&self) -> StoreStats {
        let tiers = self.inner.tiers.lock();
        let store = &tiers.memory;
        let disks = match &self.inner.disks {
            Some(tier) => tier
                .disks
                .iter()
                .zip(&tiers.disks)
                .map(|(d, ix)| DiskReport {
                    objects: ix.len() as u64,
                    bytes: ix.bytes(),
                    capacity: ix.capacity(),
                    pending: ix.pending() as u64,
                    stats: d.stats(),
                })
                .collect(),
            None => Vec::new(),
        };
        StoreStats {
            objects: store.len() as u64,
            bytes: store.bytes(),
            capacity: store.capacity(),
            admitted: self.inner.admitted.load(Relaxed),
            evicted: self.inner.evicted.load(Relaxed),
            invalidated: self.inner.invalidated.load(Relaxed),
            arena: self.arena().map(|a| a.stats()),
            open_files: tiers.open.len() as u64,
            disk_sendfile_bytes: self
                .inner
                .disks
                .as_ref()
                .map_or(0, |t| t.sent.bytes.load(Relaxed)),
            disks,
        }
    }
}

impl Inner {
    /// Tells the follower of `news` under the lock, lets the lock go, then broadcasts them.
    fn settle(&self, tiers: MutexGuard<'_, Tiers>, news: Vec<StoreEvent>) {
        if let (Some(f), false) = (self.follower.get(), news.is_empty()) {
            f.changed(&news);
        }
        drop(tiers);
        for event in news {
            match event {
                StoreEvent::Admitted { .. } => self.admitted.fetch_add(1, Relaxed),
                StoreEvent::Evicted {
                    cause: EvictCause::Replaced,
                    ..
                } => 0,
                StoreEvent::Evicted { .. } => self.evicted.fetch_add(1, Relaxed),
                StoreEvent::Invalidated { .. } => self.invalidated.fetch_add(1, Relaxed),
            };
            // No subscriber yet is fine.
            let _ = self.events.send(event);
        }
    }

    /// Queues every disk's garbage for its writer (under the lock, so that a removal is queued
    /// before any later write of the same key).
    fn queue_garbage(&self, tiers: &mut Tiers) {
        let Some(tier) = &self.disks else {
            return;
        };
        for (disk, index) in tier.disks.iter().zip(tiers.disks.iter_mut()) {
            for g in index.take_garbage() {
                disk.remove(g);
            }
        }
    }

    /// The variants known for `key` if its marker has these `names`: memory's marker, or the
    /// disk's.
    fn known_variants(&self, tiers: &Tiers, key: &StoreKey, names: &[HeaderName]) -> Vec<StoreKey> {
        match tiers.memory.peek(key).map(|e| &**e) {
            Some(Entry::Vary {
                names: old,
                variants,
            }) if **old == *names => variants.clone(),
            _ => Vec::new(),
        }
    }

    /// Takes `key` out of both tiers.
    fn forget(&self, tiers: &mut Tiers, key: StoreKey, why: Gone, news: &mut Vec<StoreEvent>) {
        let gone = match why {
            Gone::Invalidated(cause) => tiers.memory.invalidate(&key, cause),
            Gone::Evicted(_) => tiers
                .memory
                .invalidate(&key, InvalidateCause::Stale)
                .map(|e| StoreEvent::Evicted {
                    key,
                    size: e.size(),
                    cause: EvictCause::Replaced,
                }),
        };
        news.extend(tiers.memory_news(gone));
        for index in &mut tiers.disks {
            index.remove(&key, why);
        }
        news.extend(tiers.all_disk_news());
        self.queue_garbage(tiers);
    }

    /// Stores `entry` under `key`: in memory if it fits there, and on a disk if there is one
    /// that takes it; older copies in either tier go. `guard` goes with the disk write when
    /// the memory store does not take the entry. Returns whether either tier took it.
    fn put(
        &self,
        tiers: &mut Tiers,
        key: StoreKey,
        entry: Arc<Entry>,
        guard: &mut Option<Box<dyn Send>>,
        news: &mut Vec<StoreEvent>,
    ) -> bool {
        let in_memory = match tiers.memory.insert(key, entry.clone()) {
            Ok(events) => {
                news.extend(tiers.memory_news(events));
                true
            }
            Err(_) => {
                // Too large for memory: an older version there must not outlive this one.
                if let Some(e) = tiers.memory.invalidate(&key, InvalidateCause::Stale) {
                    news.extend(tiers.memory_news([e]));
                }
                false
            }
        };
        let Some(tier) = &self.disks else {
            return in_memory;
        };
        // Older copies on any disk are outdated now.
        for index in &mut tiers.disks {
            index.remove(&key, Gone::Evicted(EvictCause::Replaced));
        }
        news.extend(tiers.all_disk_news());
        self.queue_garbage(tiers);
        let (kind, meta, body, expires) = match &*entry {
            Entry::Object(o) => (
                Kind::Object,
                meta::encode_object(o),
                o.body.clone(),
                fresh_until(&o.freshness),
            ),
            Entry::Vary { names, variants } => (
                Kind::Vary,
                meta::encode_vary(names, variants),
                Bytes::new(),
                0,
            ),
        };
        let len = 64 + meta.len() as u64 + body.len() as u64;
        let Some(disk) = tier.choose(&key, len) else {
            return in_memory;
        };
        let d = &tier.disks[disk];
        let serial = d.next_serial();
        tiers.disks[disk].expect(key, serial);
        let job = StoreJob {
            key,
            serial,
            kind,
            meta,
            body,
            expires,
            guard: if in_memory { None } else { guard.take() },
        };
        match d.store(job) {
            Ok(()) => true,
            Err(job) => {
                tiers.disks[disk].abandon(&key, serial);
                *guard = job.guard;
                in_memory
            }
        }
    }

    /// The first step of a lookup of `url`.
    fn first_probe(&self, url: &str, request: &HeaderMap) -> Probe {
        let mut tiers = self.tiers.lock();
        self.probe(&mut tiers, StoreKey::get(url), url, request, 0)
    }

    /// Looks `key` up in memory (following a Vary marker once), then among the large objects
    /// kept open, then in the disks' indexes.
    fn probe(
        &self,
        tiers: &mut Tiers,
        key: StoreKey,
        url: &str,
        request: &HeaderMap,
        depth: u8,
    ) -> Probe {
        if let Some(entry) = tiers.memory.get(&key).cloned() {
            return match &*entry {
                Entry::Object(_) => Probe::Hit(Found {
                    entry,
                    key,
                    tier: Tier::Memory,
                }),
                Entry::Vary { names, .. } if depth == 0 => {
                    let vkey = StoreKey::variant(url, &vary_selector(names, request));
                    self.probe(tiers, vkey, url, request, 1)
                }
                Entry::Vary { .. } => Probe::Miss,
            };
        }
        let found = tiers
            .disks
            .iter_mut()
            .enumerate()
            .find_map(|(disk, index)| index.get(&key).map(|entry| (disk, entry)));
        let Some((disk, entry)) = found else {
            return Probe::Miss;
        };
        if let Some(open) = tiers.open.get(&key) {
            return Probe::Hit(Found {
                entry: open,
                key,
                tier: Tier::Disk(disk),
            });
        }
        tiers.begin_read(key);
        Probe::Disk {
            disk,
            key,
            entry,
            depth,
        }
    }

    /// Reads a disk probe's record and takes the lookup one step on. `Err` only with
    /// `nowait`, when the record is not in the page cache (the read is still announced: retry
    /// it without `nowait`).
    fn resolve(
        &self,
        probe: Probe,
        url: &str,
        request: &HeaderMap,
        nowait: bool,
    ) -> Result<Probe, ()> {
        let Probe::Disk {
            disk,
            key,
            entry,
            depth,
        } = probe
        else {
            return Ok(probe);
        };
        let Some(tier) = &self.disks else {
            return Ok(Probe::Miss);
        };
        let loaded = tier.read(disk, &key, entry, nowait);
        if matches!(loaded, Err(ReadError::WouldBlock)) {
            return Err(());
        }
        let mut tiers = self.tiers.lock();
        let current = tiers.end_read(&key);
        let mut news = Vec::new();
        let next = match loaded {
            Err(e) => {
                let location = entry.location();
                let removed = tiers.disks[disk].remove_if_at(
                    &key,
                    location,
                    Gone::Evicted(EvictCause::Damaged),
                );
                news.extend(tiers.all_disk_news());
                self.queue_garbage(&mut tiers);
                if removed {
                    match &e {
                        ReadError::Io(io) => tier.disks[disk].note_read_error(io),
                        other => tier.disks[disk].note_damaged(&key, other),
                    }
                }
                Probe::Miss
            }
            Ok(Loaded::Object(object)) => {
                let small = matches!(entry.location(), Location::Slab { .. });
                let entry = Arc::new(Entry::Object(object));
                if current && small {
                    // Back into memory (its copy is on the heap already) once read again.
                    if tiers.doorkeeper.admit(&key) {
                        if let Ok(events) = tiers.memory.insert(key, entry.clone()) {
                            news.extend(tiers.memory_news(events));
                        }
                    }
                } else if current {
                    tiers.open.keep(key, entry.clone());
                }
                Probe::Hit(Found {
                    entry,
                    key,
                    tier: Tier::Disk(disk),
                })
            }
            Ok(Loaded::Marker(names, variants)) if depth == 0 => {
                let vkey = StoreKey::variant(url, &vary_selector(&names, request));
                if current {
                    let marker = Arc::new(Entry::Vary { names, variants });
                    if let Ok(events) = tiers.memory.insert(key, marker) {
                        news.extend(tiers.memory_news(events));
                    }
                }
                self.probe(&mut tiers, vkey, url, request, 1)
            }
            Ok(Loaded::Marker(..)) => Probe::Miss,
        };
        self.settle(tiers, news);
        Ok(next)
    }

    /// The variants a disk's Vary marker for `key` names (read from the disk), if a disk holds
    /// one.
    fn disk_marker(&self, key: &StoreKey) -> Vec<StoreKey> {
        let Some(tier) = &self.disks else {
            return Vec::new();
        };
        let found = {
            let tiers = self.tiers.lock();
            tiers
                .disks
                .iter()
                .enumerate()
                .find_map(|(i, d)| d.peek(key).filter(DiskEntry::is_vary).map(|e| (i, e)))
        };
        match found.map(|(disk, entry)| tier.read(disk, key, entry, false)) {
            Some(Ok(Loaded::Marker(_, variants))) => variants,
            _ => Vec::new(),
        }
    }
}

impl IndexHolder for Inner {
    fn with_index(&self, disk: usize, f: &mut dyn FnMut(&mut DiskIndex)) {
        let mut tiers = self.tiers.lock();
        f(&mut tiers.disks[disk]);
        let news = tiers.disk_news(disk);
        self.settle(tiers, news);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use meshcache_store::Replacement;

    fn cache() -> Cache {
        Cache::new(StoreConfig {
            capacity: 1 << 20,
            max_object_size: 1 << 16,
            replacement: Replacement::Lru,
        })
    }

    fn object(headers: &[(&str, &str)], body: &'static str) -> CachedObject {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        let f = Freshness {
            response_time: 0,
            initial_age: 0,
            lifetime: 60,
            directives: Default::default(),
        };
        CachedObject::new(StatusCode::OK, &map, Bytes::from_static(body.as_bytes()), f)
    }

    fn req(pairs: &[(&str, &str)]) -> HeaderMap {
        object(pairs, "").header_map()
    }

    #[test]
    fn store_lookup_and_events() {
        let c = cache();
        let mut events = c.subscribe();
        c.insert("http://a.test/x", &HeaderMap::new(), object(&[], "hello"));
        let found = c.lookup("http://a.test/x", &HeaderMap::new()).expect("hit");
        assert_eq!(found.object().body, "hello");
        assert!(matches!(events.try_recv(), Ok(StoreEvent::Admitted { .. })));
        c.invalidate("http://a.test/x", InvalidateCause::UnsafeMethod);
        assert!(c.lookup("http://a.test/x", &HeaderMap::new()).is_none());
        assert!(matches!(
            events.try_recv(),
            Ok(StoreEvent::Invalidated {
                cause: InvalidateCause::UnsafeMethod,
                ..
            })
        ));
    }

    #[test]
    fn vary_variants() {
        let c = cache();
        let url = "http://a.test/v";
        c.insert(
            url,
            &req(&[("accept-encoding", "gzip")]),
            object(&[("vary", "Accept-Encoding")], "gz"),
        );
        c.insert(
            url,
            &req(&[("accept-encoding", "br")]),
            object(&[("vary", "Accept-Encoding")], "br"),
        );
        let gz = c
            .lookup(url, &req(&[("accept-encoding", "gzip")]))
            .expect("gzip variant");
        assert_eq!(gz.object().body, "gz");
        let br = c
            .lookup(url, &req(&[("accept-encoding", "br")]))
            .expect("br variant");
        assert_eq!(br.object().body, "br");
        assert!(c.lookup(url, &HeaderMap::new()).is_none());
        assert!(c.contains(url));
        c.invalidate(url, InvalidateCause::Explicit);
        assert!(c
            .lookup(url, &req(&[("accept-encoding", "gzip")]))
            .is_none());
        assert_eq!(c.stats().objects, 0);
    }

    /// Records what it is told.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<StoreEvent>>);

    impl StoreFollower for Recorder {
        fn changed(&self, events: &[StoreEvent]) {
            self.0.lock().extend_from_slice(events);
        }
    }

    #[test]
    fn the_follower_sees_every_change_in_the_stores_order() {
        let c = cache();
        let recorder = Arc::new(Recorder::default());
        assert!(c.follow(recorder.clone()));
        assert!(
            !c.follow(Arc::new(Recorder::default())),
            "one follower only"
        );
        let mut events = c.subscribe();
        // 40 KiB bodies in a 1 MiB store: the later ones evict the first.
        let body: &'static str = Box::leak("x".repeat(40 << 10).into_boxed_str());
        for i in 0..40 {
            c.insert(
                &format!("http://a.test/{i}"),
                &HeaderMap::new(),
                object(&[], body),
            );
        }
        c.invalidate("http://a.test/39", InvalidateCause::Explicit);
        c.invalidate_key(
            &StoreKey::get("http://a.test/38"),
            InvalidateCause::Explicit,
        );
        let seen = recorder.0.lock().clone();
        let mut broadcast = Vec::new();
        while let Ok(e) = events.try_recv() {
            broadcast.push(e);
        }
        assert_eq!(
            seen, broadcast,
            "the follower and the channel agree, in order"
        );
        assert!(seen.iter().any(|e| matches!(e, StoreEvent::Evicted { .. })));
        // Replaying what the follower saw gives exactly what is stored.
        let mut held = std::collections::HashSet::new();
        for e in &seen {
            if e.is_admission() {
                held.insert(e.key());
            } else {
                held.remove(&e.key());
            }
        }
        let (keys, guard) = c.keys_then(|| recorder.0.lock().len());
        assert_eq!(guard, seen.len());
        assert_eq!(
            keys.into_iter().collect::<std::collections::HashSet<_>>(),
            held
        );
    }

    #[tokio::test]
    async fn collapse_wakes_followers_when_leader_finishes() {
        let c = cache();
        let Collapse::Leader(guard) = c.collapse("http://a.test/c") else {
            panic!("first is leader")
        };
        let Collapse::Follower(mut rx) = c.collapse("http://a.test/c") else {
            panic!("second follows")
        };
        let waiter = tokio::spawn(async move { rx.changed().await.is_err() });
        drop(guard);
        assert!(waiter.await.expect("joined"), "sender dropped");
        assert!(matches!(c.collapse("http://a.test/c"), Collapse::Leader(_)));
    }
}
