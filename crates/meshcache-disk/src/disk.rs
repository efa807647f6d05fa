//! One disk: its directory and files, its writer and rebuild threads, its counters.
//!
//! The cache that owns a [`Disk`] keeps the disk's [`DiskIndex`] under its own lock and lends
//! it to the disk's threads through [`IndexHolder`]. The request path never writes: it reads
//! records ([`Disk::read_slab`], [`Disk::open_file`]) and queues work for the writer
//! ([`Disk::store`], [`Disk::remove`], [`Disk::stream`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshcache_store::{Replacement, StoreConfig, StoreKey};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use crate::entry::MAX_SLAB_RECORD;
use crate::fault::{FaultCounts, Faults};
use crate::format::{Kind, HEADER_LEN};
use crate::index::{DiskIndex, Garbage};
use crate::layout::{DirLock, Layout, OpenError};
use crate::progress::Progress;
use crate::queue::Queue;
use crate::space::UNIT;

/// Bodies of at least this many bytes get a file of their own (and hits of them go out with
/// sendfile(2)); smaller ones are packed in the slab and read with one `pread`. The same
/// threshold as the memory store's shared-memory bodies: below it a copy is cheaper than
/// sendfile's page bookkeeping.
pub const LARGE_BODY: u64 = 32 * 1024;

/// How a disk is set up.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// Its directory (created if missing).
    pub path: PathBuf,
    /// Bytes of objects it may hold.
    pub size: u64,
    /// Objects completely written this long before a crash survive it.
    pub sync_interval: Duration,
    /// Which objects leave first when it is full.
    pub replacement: Replacement,
    /// Larger objects are not written.
    pub max_object_size: u64,
    /// Bytes of writes that may wait in its queue; more are dropped.
    pub queue_bytes: u64,
}

impl DiskConfig {
    /// The slab's length for this configuration: the whole budget plus a quarter for
    /// fragmentation, in whole units. The file is sparse: only what is written takes space.
    pub fn slab_len(&self) -> u64 {
        self.size
            .saturating_add(self.size / 4)
            .max(64 * UNIT)
            .next_multiple_of(UNIT)
    }
}

/// Lends a disk's index to the disk's threads; implemented by the cache that owns it.
pub trait IndexHolder: Send + Sync {
    /// Runs `f` on disk `disk`'s index under the owner's lock, then publishes the changes it
    /// recorded (see [`DiskIndex::take_changes`]). Garbage is left for the caller to take.
    fn with_index(&self, disk: usize, f: &mut dyn FnMut(&mut DiskIndex));
}

/// An object to write.
pub struct StoreJob {
    /// Its key.
    pub key: StoreKey,
    /// Its serial (from [`Disk::next_serial`], announced with [`DiskIndex::expect`]).
    pub serial: u64,
    /// A response or a Vary marker.
    pub kind: Kind,
    /// The owner's metadata (status, headers, freshness).
    pub meta: Vec<u8>,
    /// The body.
    pub body: Bytes,
    /// Fresh until (Unix seconds).
    pub expires: u32,
    /// Held until the object is indexed (or dropped): waiters of a collapsed fetch wake then.
    pub guard: Option<Box<dyn Send>>,
}

impl std::fmt::Debug for StoreJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreJob")
            .field("key", &self.key)
            .field("serial", &self.serial)
            .field("kind", &self.kind)
            .field("meta", &self.meta.len())
            .field("body", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl StoreJob {
    /// The record's length on disk.
    pub fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + self.meta.len() as u64 + self.body.len() as u64
    }

    /// Whether the record goes to the slab (rather than a file of its own).
    pub fn in_slab(&self) -> bool {
        (self.body.len() as u64) < LARGE_BODY && self.record_len() <= MAX_SLAB_RECORD
    }
}

/// What the writer is asked to do, in order.
pub(crate) enum Job {
    Store(StoreJob),
    Remove(Garbage),
    StreamOpen {
        id: u64,
        key: StoreKey,
        serial: u64,
        kind: Kind,
        meta: Vec<u8>,
        expires: u32,
    },
    StreamChunk {
        id: u64,
        chunk: Bytes,
    },
    StreamEnd {
        id: u64,
        guard: Option<Box<dyn Send>>,
    },
    StreamAbort {
        id: u64,
    },
    /// Sync now, then say so.
    Sync(std::sync::mpsc::Sender<()>),
}

/// The files of the disk's directory in use now (replaced when a removed directory is made
/// again).
#[derive(Debug)]
pub(crate) struct Files {
    pub(crate) slab: Arc<File>,
    pub(crate) slab_len: u64,
    /// The slab's identity, to notice the directory being removed or replaced.
    pub(crate) slab_id: (u64, u64),
    /// The directory's lock, held until the disk is closed (or dropped).
    pub(crate) lock: Option<DirLock>,
}

/// Counters of a disk, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) written_bytes: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) removed: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) last_sync_us: AtomicU64,
    pub(crate) rebuild_found: AtomicU64,
    pub(crate) rebuild_damaged: AtomicU64,
    pub(crate) rebuild_us: AtomicU64,
    pub(crate) rebuilding: AtomicBool,
}

/// A disk's figures that do not need its index.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DiskStats {
    /// The directory.
    pub path: String,
    /// Hits served from this disk.
    pub hits: u64,
    /// Records written.
    pub writes: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Writes dropped: the queue was full, or writes were paused after a fault.
    pub dropped: u64,
    /// Records removed (evicted, invalidated, superseded).
    pub removed: u64,
    /// Jobs waiting for the writer.
    pub queue_jobs: u64,
    /// Bytes those jobs hold.
    pub queue_bytes: u64,
    /// Syncs done.
    pub syncs: u64,
    /// How long the last sync took, in microseconds.
    pub last_sync_us: u64,
    /// Whether the rebuild is still reading the disk.
    pub rebuilding: bool,
    /// Objects the rebuild found.
    pub rebuild_found: u64,
    /// Damaged records the rebuild dropped.
    pub rebuild_damaged: u64,
    /// How long the rebuild took (so far), in microseconds.
    pub rebuild_us: u64,
    /// Faults by kind.
    pub faults: FaultCounts,
    /// The slab's length in bytes.
    pub slab_len: u64,
}

/// What the threads of one disk share.
pub(crate) struct Shared {
    pub(crate) number: usize,
    pub(crate) config: DiskConfig,
    pub(crate) layout: Layout,
    pub(crate) files: RwLock<Files>,
    pub(crate) queue: Queue<Job>,
    pub(crate) faults: Faults,
    pub(crate) counters: Counters,
    /// The rebuild's batches, for a writer waiting for room.
    pub(crate) progress: Progress,
    /// `run << 32`, then one more per record.
    serial: AtomicU64,
    next_stream: AtomicU64,
    pub(crate) holder: Mutex<Option<Weak<dyn IndexHolder>>>,
    pub(crate) stop: AtomicBool,
}

impl Shared {
    /// Runs `f` on the index under the holder's lock and returns what it returns, or `None`
    /// when the holder is gone.
    pub(crate) fn locked<T>(&self, mut f: impl FnMut(&mut DiskIndex) -> T) -> Option<T> {
        let holder = self.holder.lock().as_ref()?.upgrade()?;
        let mut out = None;
        holder.with_index(self.number, &mut |ix| out = Some(f(ix)));
        out
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Relaxed)
    }

    /// The run a serial belongs to.
    pub(crate) fn run_of(serial: u64) -> u32 {
        (serial >> 32) as u32
    }

    pub(crate) fn this_run(&self) -> u32 {
        Self::run_of(self.serial.load(Relaxed))
    }

    pub(crate) fn path(&self) -> &Path {
        self.layout.dir()
    }

    /// Opens (or makes again) the directory's files: prepares the directory, takes its lock,
    /// starts a new run and opens the slab.
    pub(crate) fn open_files(layout: &Layout, slab_len: u64) -> Result<(Files, u32), OpenError> {
        layout.prepare()?;
        let lock = layout.take_lock()?;
        let run = layout.next_run()?;
        let (slab, len) = layout.open_slab(slab_len)?;
        let slab_id = file_id(&slab).map_err(|error| OpenError::Io {
            path: layout.dir().to_owned(),
            what: "reading the slab's identity",
            error,
        })?;
        Ok((
            Files {
                slab: Arc::new(slab),
                slab_len: len,
                slab_id,
                lock: Some(lock),
            },
            run,
        ))
    }

    /// Starts a new run of serials (after the directory was made again).
    pub(crate) fn set_run(&self, run: u32) {
        self.serial.store(u64::from(run) << 32, Relaxed);
    }
}

/// Device and inode of an open file.
pub(crate) fn file_id(file: &File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// One disk of the store; see the module's documentation.
pub struct Disk {
    pub(crate) shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("number", &self.shared.number)
            .field("path", &self.shared.path())
            .finish_non_exhaustive()
    }
}

impl Disk {
    /// Opens disk number `number` (its place in the owner's list): creates its directory if
    /// missing, takes its lock, and returns it with an index to keep under the owner's lock.
    /// The index is empty until the rebuild, started by [`Disk::start`], fills it.
    ///
    /// # Errors
    ///
    /// The directory cannot be created or opened, is locked by another node, or holds another
    /// format.
    pub fn open(number: usize, config: DiskConfig) -> Result<(Disk, DiskIndex), OpenError> {
        let layout = Layout::new(&config.path);
        let (files, run) = Shared::open_files(&layout, config.slab_len())?;
        let index = DiskIndex::new(
            StoreConfig {
                capacity: config.size,
                max_object_size: config.max_object_size,
                replacement: config.replacement,
            },
            files.slab_len / UNIT,
            true,
        );
        let shared = Arc::new(Shared {
            number,
            faults: Faults::new(&config.path.display().to_string()),
            queue: Queue::new(config.queue_bytes),
            layout,
            files: RwLock::new(files),
            counters: Counters::default(),
            progress: Progress::default(),
            serial: AtomicU64::new(u64::from(run) << 32),
            next_stream: AtomicU64::new(0),
            holder: Mutex::new(None),
            stop: AtomicBool::new(false),
            config,
        });
        shared.counters.rebuilding.store(true, Relaxed);
        Ok((
            Disk {
                shared,
                threads: Mutex::new(Vec::new()),
            },
            index,
        ))
    }

    /// Starts the writer and the rebuild, lending them the index through `holder`.
    pub fn start(&self, holder: Weak<dyn IndexHolder>) {
        *self.shared.holder.lock() = Some(holder);
        let mut threads = self.threads.lock();
        let name = |what: &str| format!("disk{}-{what}", self.shared.number);
        let shared = self.shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name(name("writer"))
            .spawn(move || crate::writer::run(&shared))
        {
            threads.push(t);
        }
        let shared = self.shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name(name("rebuild"))
            .spawn(move || crate::rebuild::run(&shared))
        {
            threads.push(t);
        }
    }

    /// Its place in the owner's list.
    pub fn number(&self) -> usize {
        self.shared.number
    }

    /// Its configuration.
    pub fn config(&self) -> &DiskConfig {
        &self.shared.config
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        self.shared.path()
    }

    /// A serial for the next write (announce it with [`DiskIndex::expect`]).
    pub fn next_serial(&self) -> u64 {
        self.shared.next_serial()
    }

    /// Whether a record of `len` bytes (header, metadata and body) may be written here.
    pub fn admits(&self, len: u64) -> bool {
        len <= self
            .shared
            .config
            .max_object_size
            .min(self.shared.config.size)
    }

    /// Queues an object for writing. Refused (and handed back, its guard with it) when writes
    /// are paused after a fault or the queue is full; the caller then abandons the serial.
    pub fn store(&self, job: StoreJob) -> Result<(), StoreJob> {
        if self.shared.faults.writes_paused() {
            self.shared.counters.dropped.fetch_add(1, Relaxed);
            return Err(job);
        }
        let bytes = job.record_len();
        match self.shared.queue.offer(Job::Store(job), bytes) {
            Ok(()) => Ok(()),
            Err(Job::Store(job)) => {
                self.shared.counters.dropped.fetch_add(1, Relaxed);
                Err(job)
            }
            Err(_) => unreachable!("offer hands back the job it was given"),
        }
    }

    /// Queues the removal of a record that left the index (always taken).
    pub fn remove(&self, garbage: Garbage) {
        let _ = self.shared.queue.force(Job::Remove(garbage));
    }

    /// Starts writing an object whose body arrives in pieces (a file of its own, whatever its
    /// size), announced with `serial`. `None` when writes are paused or the queue is closed;
    /// the caller then abandons the serial.
    pub fn stream(
        &self,
        key: StoreKey,
        serial: u64,
        kind: Kind,
        meta: Vec<u8>,
        expires: u32,
    ) -> Option<crate::stream::DiskStream> {
        if self.shared.faults.writes_paused() {
            self.shared.counters.dropped.fetch_add(1, Relaxed);
            return None;
        }
        let id = self.shared.next_stream.fetch_add(1, Relaxed);
        let open = Job::StreamOpen {
            id,
            key,
            serial,
            kind,
            meta,
            expires,
        };
        self.shared.queue.force(open).ok()?;
        Some(crate::stream::DiskStream::new(
            self.shared.clone(),
            id,
            key,
            serial,
        ))
    }

    /// Counts a hit served from this disk.
    pub fn count_hit(&self) {
        self.shared.counters.hits.fetch_add(1, Relaxed);
    }

    /// Waits until every queued job is done and the disk synced, `timeout` at most; whether
    /// it got there.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (tx, rx) = std::sync::mpsc::channel();
        if self.shared.queue.force(Job::Sync(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }

    /// Whether the rebuild is over.
    pub fn rebuilt(&self) -> bool {
        !self.shared.counters.rebuilding.load(Relaxed)
    }

    /// The disk's counters.
    pub fn stats(&self) -> DiskStats {
        let c = &self.shared.counters;
        let (jobs, bytes) = self.shared.queue.len_and_bytes();
        DiskStats {
            path: self.path().display().to_string(),
            hits: c.hits.load(Relaxed),
            writes: c.writes.load(Relaxed),
            written_bytes: c.written_bytes.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            removed: c.removed.load(Relaxed),
            queue_jobs: jobs as u64,
            queue_bytes: bytes,
            syncs: c.syncs.load(Relaxed),
            last_sync_us: c.last_sync_us.load(Relaxed),
            rebuilding: c.rebuilding.load(Relaxed),
            rebuild_found: c.rebuild_found.load(Relaxed),
            rebuild_damaged: c.rebuild_damaged.load(Relaxed),
            rebuild_us: c.rebuild_us.load(Relaxed),
            faults: self.shared.faults.counts(),
            slab_len: self.shared.files.read().slab_len,
        }
    }

    /// Stops the threads after the queued jobs are done and a last sync (at most `timeout`
    /// for the jobs), and lets go of the directory's lock: a node started next on the same
    /// directory, in this process too, may take it at once, even while something still holds
    /// this `Disk` (a request finishing, a response body being read).
    pub fn close(&self, timeout: Duration) {
        let _ = self.flush(timeout);
        self.shared.stop.store(true, Relaxed);
        self.shared.queue.close();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.shared.files.write().lock = None;
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.queue.close();
        let me = std::thread::current().id();
        for t in self.threads.get_mut().drain(..) {
            // The last owner may let go on one of the disk's own threads: that one ends by
            // itself once it sees the queue closed.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}
