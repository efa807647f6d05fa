//! The cache proper: what an object looks like in the store, Vary handling, collapsed
//! forwarding, and the store-event stream.
//!
//! Objects live in a [`MemoryStore`] under Squid's key for the URL (`MD5(GET || URL)`), so
//! digests and directories built from store events speak the same keys as Squid. A response
//! with `Vary` is stored under a variant key, and the plain key holds a small marker naming the
//! Vary fields and the variants, which is also what a peer's lookup by URL finds.
//!
//! Every change to the store is published as a [`StoreEvent`]: to a [`StoreFollower`], if one
//! is attached, while the store's lock is still held (so it sees the changes in the store's own
//! order, and a snapshot of the keys plus the events after it is exact), and on one broadcast
//! channel for tasks that follow the store at their own pace. That is the only way cooperation
//! protocols learn of admissions, evictions and invalidations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use meshcache_store::{InvalidateCause, MemoryStore, StoreConfig, StoreEvent, StoreKey, Weigh};
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};

use crate::headers::{vary_names, vary_selector};
use crate::metrics::StoreStats;
use crate::semantics::Freshness;
use crate::zerocopy::{self, BodyArena};

/// Told of every store change synchronously, under the store's lock: it must be quick (a
/// counting filter's few counters, a flag) and must not call back into the cache.
pub trait StoreFollower: Send + Sync {
    /// These changes were just made to the store, in this order.
    fn changed(&self, events: &[StoreEvent]);
}

/// The most variants kept for one URL.
const MAX_VARIANTS: usize = 32;

/// A stored response: status, end-to-end headers, the whole body and its freshness.
#[derive(Debug)]
pub struct CachedObject {
    /// Response status.
    pub status: StatusCode,
    /// End-to-end response headers, in order (hop-by-hop ones already removed); shared, so
    /// an applet run can see them without a copy.
    pub headers: Arc<[(HeaderName, HeaderValue)]>,
    /// The body.
    pub body: Bytes,
    /// Freshness facts.
    pub freshness: Freshness,
    /// The applet its hits run, worked out on the first hit (see `applets`).
    pub applet: std::sync::OnceLock<Option<Arc<crate::applets::Attached>>>,
}

impl CachedObject {
    /// Builds a stored object from a response head and body.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Bytes, freshness: Freshness) -> Self {
        let headers = headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        CachedObject {
            status,
            headers,
            body,
            freshness,
            applet: std::sync::OnceLock::new(),
        }
    }

    /// The stored headers as a map (for semantics functions and serving).
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len() + 6);
        for (n, v) in self.headers.iter() {
            map.append(n.clone(), v.clone());
        }
        map
    }

    /// One header's first value.
    pub fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// What the store holds under a key.
#[derive(Debug)]
pub enum Entry {
    /// A response.
    Object(CachedObject),
    /// The URL's responses vary on these request fields; its variants are under these keys.
    Vary {
        /// Lower-case field names, sorted.
        names: Box<[HeaderName]>,
        /// Variant keys currently known.
        variants: Vec<StoreKey>,
    },
}

/// Fixed bookkeeping charged to every entry beyond its header and body bytes.
pub const ENTRY_OVERHEAD: u64 = (std::mem::size_of::<Entry>() + 16) as u64;

impl Weigh for Entry {
    fn weight(&self) -> u64 {
        let own = match self {
            Entry::Object(o) => {
                zerocopy::charged(o.body.len())
                    + o.headers
                        .iter()
                        .map(|(n, v)| (n.as_str().len() + v.len() + 48) as u64)
                        .sum::<u64>()
            }
            Entry::Vary { names, variants } => (names.len() * 24 + variants.len() * 16) as u64,
        };
        own + ENTRY_OVERHEAD
            + meshcache_store::MemoryStore::<Entry>::metadata_bytes_per_entry() as u64
    }
}

/// A stored object found for a request.
#[derive(Clone, Debug)]
pub struct Found {
    entry: Arc<Entry>,
    /// The key it is stored under (a variant key for varying responses).
    pub key: StoreKey,
}

impl Found {
    /// The object.
    pub fn object(&self) -> &CachedObject {
        match &*self.entry {
            Entry::Object(o) => o,
            // `lookup` only ever builds a `Found` around an object.
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

/// Held by the request that fetches a URL for everyone; dropping it wakes the waiters.
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

struct Inner {
    store: Mutex<MemoryStore<Entry>>,
    inflight: Mutex<HashMap<StoreKey, watch::Receiver<()>>>,
    events: broadcast::Sender<StoreEvent>,
    follower: OnceLock<Arc<dyn StoreFollower>>,
    admitted: AtomicU64,
    evicted: AtomicU64,
    invalidated: AtomicU64,
    /// Where large bodies are kept so hits can be sent with sendfile(2) (see `zerocopy`).
    arena: Option<Arc<BodyArena>>,
}

/// The shared cache: store, collapsed-forwarding table and event stream.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

impl Cache {
    /// A cache with the given store settings, every body on the heap.
    pub fn new(config: StoreConfig) -> Self {
        Self::with_arena(config, None)
    }

    /// A cache that keeps bodies of [`zerocopy::MIN_SIZE`] bytes and more in `arena`.
    pub fn with_arena(config: StoreConfig, arena: Option<Arc<BodyArena>>) -> Self {
        // Room for the events of a summary's drain interval at tens of thousands of misses a
        // second; a subscriber that falls further behind rebuilds from the store.
        let (events, _) = broadcast::channel(16_384);
        Cache {
            inner: Arc::new(Inner {
                store: Mutex::new(MemoryStore::new(config)),
                inflight: Mutex::new(HashMap::new()),
                events,
                follower: OnceLock::new(),
                admitted: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                invalidated: AtomicU64::new(0),
                arena,
            }),
        }
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

    /// Tells the follower; called with the store's lock held.
    fn tell(&self, events: &[StoreEvent]) {
        if let (Some(f), false) = (self.inner.follower.get(), events.is_empty()) {
            f.changed(events);
        }
    }

    /// The keys of everything stored now, and `then()`'s result. `then` runs under the store's
    /// lock, after the snapshot and before the store can change again, so a follower can mark
    /// that point there (start recording changes, take its own lock): every change it is told
    /// of afterwards is one the snapshot does not hold.
    pub fn keys_then<G>(&self, then: impl FnOnce() -> G) -> (Vec<StoreKey>, G) {
        let store = self.inner.store.lock();
        let keys = store.keys().copied().collect();
        let guard = then();
        drop(store);
        (keys, guard)
    }

    fn publish(&self, events: impl IntoIterator<Item = StoreEvent>) {
        for event in events {
            match event {
                StoreEvent::Admitted { .. } => self.inner.admitted.fetch_add(1, Relaxed),
                StoreEvent::Evicted {
                    cause: meshcache_store::EvictCause::Capacity,
                    ..
                } => self.inner.evicted.fetch_add(1, Relaxed),
                StoreEvent::Evicted { .. } => 0,
                StoreEvent::Invalidated { .. } => self.inner.invalidated.fetch_add(1, Relaxed),
            };
            // No subscriber yet is fine.
            let _ = self.inner.events.send(event);
        }
    }

    /// The keys of everything stored now (to rebuild a summary from).
    pub fn keys(&self) -> Vec<StoreKey> {
        self.inner.store.lock().keys().copied().collect()
    }

    /// Finds the object that answers a GET of `url` with these request headers.
    pub fn lookup(&self, url: &str, request: &HeaderMap) -> Option<Found> {
        let key = StoreKey::get(url);
        let mut store = self.inner.store.lock();
        let entry = store.get(&key)?.clone();
        match &*entry {
            Entry::Object(_) => Some(Found { entry, key }),
            Entry::Vary { names, .. } => {
                let vkey = StoreKey::variant(url, &vary_selector(names, request));
                let entry = store.get(&vkey)?.clone();
                matches!(&*entry, Entry::Object(_)).then_some(Found { entry, key: vkey })
            }
        }
    }

    /// True when a GET of `url` has a stored response (or Vary marker), without touching the
    /// replacement policy: what a peer's query asks.
    pub fn contains(&self, url: &str) -> bool {
        self.inner.store.lock().contains(&StoreKey::get(url))
    }

    /// True when a GET of `url` has a stored object that stays fresh at least `min` longer,
    /// looked up without touching the replacement policy: what an ICP query asks. A URL whose
    /// responses vary is not a hit (the query carries no request headers to pick a variant).
    pub fn fresh_for(&self, url: &str, min: std::time::Duration) -> bool {
        let store = self.inner.store.lock();
        match store.peek(&StoreKey::get(url)).map(|e| &**e) {
            Some(Entry::Object(o)) => {
                let ttl = o.freshness.ttl(std::time::SystemTime::now());
                ttl > 0 && ttl >= min.as_secs() as i64
            }
            _ => false,
        }
    }

    /// Stores a response to a GET of `url` made with `request` headers. Refusals (too large,
    /// too many variants) are silent: the response was already relayed.
    pub fn insert(&self, url: &str, request: &HeaderMap, mut object: CachedObject) {
        let key = StoreKey::get(url);
        if let Some(body) = self.arena().and_then(|a| a.place(&object.body)) {
            object.body = body;
        }
        let names = object
            .headers
            .iter()
            .any(|(n, _)| n == http::header::VARY)
            .then(|| vary_names(&HeaderMap::from_iter(object.headers.iter().cloned())))
            .flatten()
            .filter(|names| !names.is_empty());
        let mut events = Vec::new();
        {
            let mut store = self.inner.store.lock();
            match names {
                None => {
                    if let Ok(ev) = store.insert(key, Arc::new(Entry::Object(object))) {
                        events.extend(ev);
                    }
                }
                Some(names) => {
                    let vkey = StoreKey::variant(url, &vary_selector(&names, request));
                    let mut variants = match store.peek(&key).map(|e| &**e) {
                        Some(Entry::Vary {
                            names: old,
                            variants,
                        }) if **old == *names => variants.clone(),
                        _ => Vec::new(),
                    };
                    if !variants.contains(&vkey) {
                        if variants.len() >= MAX_VARIANTS {
                            return;
                        }
                        variants.push(vkey);
                    }
                    if let Ok(ev) = store.insert(vkey, Arc::new(Entry::Object(object))) {
                        events.extend(ev);
                        let marker = Entry::Vary {
                            names: names.into_boxed_slice(),
                            variants,
                        };
                        if let Ok(ev) = store.insert(key, Arc::new(marker)) {
                            events.extend(ev);
                        }
                    }
                }
            }
            self.tell(&events);
        }
        self.publish(events);
    }

    /// Removes whatever is stored for `url`, every variant included.
    pub fn invalidate(&self, url: &str, cause: InvalidateCause) {
        let key = StoreKey::get(url);
        let mut events = Vec::new();
        {
            let mut store = self.inner.store.lock();
            let variants = match store.peek(&key).map(|e| &**e) {
                Some(Entry::Vary { variants, .. }) => variants.clone(),
                _ => Vec::new(),
            };
            events.extend(store.invalidate(&key, cause));
            for v in variants {
                events.extend(store.invalidate(&v, cause));
            }
            self.tell(&events);
        }
        self.publish(events);
    }

    /// Removes one stored object (e.g. a variant found stale and gone upstream).
    pub fn invalidate_key(&self, key: &StoreKey, cause: InvalidateCause) {
        let mut store = self.inner.store.lock();
        let event = store.invalidate(key, cause);
        if let Some(e) = &event {
            self.tell(std::slice::from_ref(e));
        }
        drop(store);
        self.publish(event);
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

    /// Store figures for metrics.
    pub fn stats(&self) -> StoreStats {
        let store = self.inner.store.lock();
        StoreStats {
            objects: store.len() as u64,
            bytes: store.bytes(),
            capacity: store.capacity(),
            admitted: self.inner.admitted.load(Relaxed),
            evicted: self.inner.evicted.load(Relaxed),
            invalidated: self.inner.invalidated.load(Relaxed),
            arena: self.arena().map(|a| a.stats()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

#[cfg(test)]
mod overhead {
    use super::*;
    use meshcache_store::Replacement;

    /// Per-object bookkeeping beyond the response's own header and body bytes: the store's
    /// index and policy node, the entry record and its `Arc`. Documented in docs/proxy.md.
    #[test]
    fn metadata_per_object_is_at_most_256_bytes() {
        for r in [Replacement::Lru, Replacement::Gdsf, Replacement::Lfuda] {
            let store = MemoryStore::<Entry>::metadata_bytes_per_entry_for(r) as u64;
            let total = store + ENTRY_OVERHEAD;
            println!("{r}: store {store} + entry {ENTRY_OVERHEAD} = {total} bytes");
            assert!(total <= 256, "{r}: {total} bytes of metadata per object");
        }
    }
}
