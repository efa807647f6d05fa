//! The writer: one thread per disk that does every write, removal and sync, in queue order.
//!
//! **A store.** A small record is placed in the slab (a run of free units; when there is none,
//! the replacement policy's victims are removed until there is), written with one `pwritev`,
//! then indexed. A large one is written to `tmp/`, renamed to its place under `files/`, then
//! indexed. Indexing checks that the write is still the newest announced for its key; if not,
//! the record is removed at once. A failed write releases its space, abandons the write and
//! pauses writing for a while (see `fault`).
//!
//! **A removal.** A slab record is killed (its magic overwritten with `DEAD`, so the rebuild
//! never brings it back) before its units are freed for reuse. A file is unlinked, unless the
//! index holds a newer file of the same key: renaming that one into place already replaced
//! it. Every rename and unlink under `files/` happens on this thread, so they cannot overtake
//! one another.
//!
//! **Durability.** Every `sync_interval`, if anything was written, `syncfs(2)` on the
//! directory's file system: whatever was written before it started is on disk when it returns.
//!
//! **A removed directory.** At each tick the writer checks that the slab it writes is still the
//! one at the directory's path. If not (the directory was removed or replaced), every object of
//! the disk is dropped from the index and the directory is made again, empty; until that works,
//! writes stay paused.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshcache_store::StoreKey;

use crate::disk::{Job, Shared, StoreJob};
use crate::entry::{DiskEntry, Location};
use crate::fault::Fault;
use crate::format::{Header, Kind, DEAD, HEADER_LEN};
use crate::index::Garbage;
use crate::space::UNIT;

/// How many victims a store may evict looking for slab space before it gives up.
const MAX_EVICTIONS_PER_STORE: usize = 10_000;

/// How long a store waits at most for the rebuild's next batch before it looks again (and
/// whether the disk is being closed).
const REBUILD_WAIT: Duration = Duration::from_millis(100);

/// The current time in Unix seconds.
pub(crate) fn unix_now() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32)
}

/// Writes all of `bufs` at `offset`.
fn write_all_at(file: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut bufs: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    while !bufs.is_empty() {
        let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        let mut n = rustix::io::pwritev(file, &slices, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        while n > 0 {
            if n >= bufs[0].len() {
                n -= bufs[0].len();
                bufs.remove(0);
            } else {
                bufs[0] = &bufs[0][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// A large object being written as its body arrives.
struct OpenStream {
    key: StoreKey,
    serial: u64,
    kind: Kind,
    meta_len: u32,
    meta_crc: u32,
    expires: u32,
    tmp: PathBuf,
    file: Option<File>,
    body_len: u64,
    body_crc: u32,
}

struct Writer<'a> {
    shared: &'a Shared,
    streams: HashMap<u64, OpenStream>,
    /// Something was written since the last sync.
    dirty: bool,
    next_tick: Instant,
}

/// The writer thread's body: takes jobs until the queue is closed and empty.
pub(crate) fn run(shared: &Shared) {
    let mut w = Writer {
        shared,
        streams: HashMap::new(),
        dirty: false,
        next_tick: Instant::now() + shared.config.sync_interval,
    };
    loop {
        match shared.queue.take(w.next_tick) {
            Some(job) => w.job(job),
            None if shared.queue.is_closed() => break,
            None => {}
        }
        if Instant::now() >= w.next_tick {
            w.tick();
        }
    }
    w.sync();
    for (_, s) in w.streams.drain() {
        let _ = fs::remove_file(&s.tmp);
    }
}

impl Writer<'_> {
    fn tick(&mut self) {
        self.sync();
        // Damaged records are events, not a state: the next one is logged again.
        self.shared.faults.clear(Fault::Damaged);
        self.check_directory();
        self.next_tick = Instant::now() + self.shared.config.sync_interval;
    }

    fn job(&mut self, job: Job) {
        match job {
            Job::Store(job) => self.store(job),
            Job::Remove(g) => collect(self.shared, vec![g]),
            Job::StreamOpen {
                id,
                key,
                serial,
                kind,
                meta,
                expires,
            } => self.stream_open(id, key, serial, kind, &meta, expires),
            Job::StreamChunk { id, chunk } => self.stream_chunk(id, &chunk),
            Job::StreamEnd { id, guard } => {
                self.stream_end(id);
                drop(guard);
            }
            Job::StreamAbort { id } => self.stream_abort(id),
            Job::Sync(done) => {
                self.sync();
                let _ = done.send(());
            }
        }
    }

    fn failed(&self, key: &StoreKey, serial: u64, what: &str, e: &io::Error) {
        self.shared.faults.write_failed(Fault::of(e), what, e);
        self.shared.counters.dropped.fetch_add(1, Relaxed);
        self.shared.locked(|ix| ix.abandon(key, serial));
    }

    fn stored(&mut self, len: u64) {
        self.dirty = true;
        self.shared.counters.writes.fetch_add(1, Relaxed);
        self.shared.counters.written_bytes.fetch_add(len, Relaxed);
        self.shared.faults.write_succeeded();
    }

    /// Indexes a landed record, then removes whatever that made garbage.
    fn commit(&mut self, entry: DiskEntry, serial: u64) {
        let garbage = self
            .shared
            .locked(|ix| {
                ix.commit(entry, serial);
                ix.take_garbage()
            })
            .unwrap_or_default();
        collect(self.shared, garbage);
    }

    fn store(&mut self, job: StoreJob) {
        let header = Header::new(
            job.kind,
            job.serial,
            job.key,
            &job.meta,
            &job.body,
            job.expires,
            unix_now(),
        );
        if job.in_slab() {
            self.store_in_slab(&job, &header);
        } else {
            self.store_in_file(&job, &header);
        }
        // The guard goes with the job: waiters look again once the object is indexed.
    }

    fn store_in_slab(&mut self, job: &StoreJob, header: &Header) {
        let len = header.record_len();
        let units = len.div_ceil(UNIT);
        let mut evictions = 0;
        let unit = loop {
            let batches = self.shared.progress.now();
            let found = self.shared.locked(|ix| {
                let unit = ix.allocate(units);
                // No room: the policy's next victim goes (not while rebuilding: what is not
                // yet read is not free, and evicting would not make it so).
                let rebuilding = ix.rebuilding();
                let evicted = unit.is_none() && !rebuilding && ix.evict_one();
                (unit, rebuilding, evicted, ix.take_garbage())
            });
            let Some((unit, rebuilding, evicted, garbage)) = found else {
                return;
            };
            collect(self.shared, garbage);
            match unit {
                Some(unit) => break unit,
                // The rebuild has not read far enough to free room: wait for its next batch.
                None if rebuilding && !self.shared.stop.load(Relaxed) => {
                    self.shared.progress.wait_past(batches, REBUILD_WAIT)
                }
                None if evicted && evictions < MAX_EVICTIONS_PER_STORE => evictions += 1,
                None => {
                    self.shared.counters.dropped.fetch_add(1, Relaxed);
                    self.shared.locked(|ix| ix.abandon(&job.key, job.serial));
                    return;
                }
            }
        };
        let slab = self.shared.files.read().slab.clone();
        let head = header.encode();
        if let Err(e) = write_all_at(&slab, &[&head, &job.meta, &job.body], unit * UNIT) {
            self.shared.locked(|ix| ix.release(unit, units));
            self.failed(&job.key, job.serial, "writing to the slab", &e);
            return;
        }
        self.stored(len);
        let location = Location::Slab {
            unit,
            len: len as u32,
        };
        match DiskEntry::new(job.key, location, job.kind == Kind::Vary, job.expires) {
            Ok(entry) => self.commit(entry, job.serial),
            Err(_) => collect(
                self.shared,
                vec![Garbage {
                    key: job.key,
                    location,
                }],
            ),
        }
    }

    fn store_in_file(&mut self, job: &StoreJob, header: &Header) {
        let layout = &self.shared.layout;
        let tmp = layout.tmp_file(job.serial);
        let written = (|| {
            let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            let head = header.encode();
            write_all_at(&file, &[&head, &job.meta, &job.body], 0)?;
            drop(file);
            place(&tmp, &layout.file_of(&job.key))
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            self.failed(&job.key, job.serial, "writing a file", &e);
            return;
        }
        let len = header.record_len();
        self.stored(len);
        let location = Location::File { len };
        if let Ok(entry) = DiskEntry::new(job.key, location, job.kind == Kind::Vary, job.expires) {
            self.commit(entry, job.serial);
        }
    }

    fn stream_open(
        &mut self,
        id: u64,
        key: StoreKey,
        serial: u64,
        kind: Kind,
        meta: &[u8],
        expires: u32,
    ) {
        let tmp = self.shared.layout.tmp_file(serial);
        let opened = (|| {
            let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            // The header is written last, when the body's length and checksum are known.
            write_all_at(&file, &[&[0u8; HEADER_LEN], meta], 0)?;
            Ok::<_, io::Error>(file)
        })();
        let file = match opened {
            Ok(f) => Some(f),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                self.failed(&key, serial, "starting a file", &e);
                None
            }
        };
        self.streams.insert(
            id,
            OpenStream {
                key,
                serial,
                kind,
                meta_len: meta.len() as u32,
                meta_crc: crc32c::crc32c(meta),
                expires,
                tmp,
                file,
                body_len: 0,
                body_crc: 0,
            },
        );
    }

    fn stream_chunk(&mut self, id: u64, chunk: &Bytes) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(file) = &s.file else {
            return;
        };
        let at = HEADER_LEN as u64 + u64::from(s.meta_len) + s.body_len;
        match file.write_all_at(chunk, at) {
            Ok(()) => {
                s.body_len += chunk.len() as u64;
                s.body_crc = crc32c::crc32c_append(s.body_crc, chunk);
            }
            Err(e) => {
                s.file = None;
                let _ = fs::remove_file(&s.tmp);
                let (key, serial) = (s.key, s.serial);
                self.failed(&key, serial, "writing a file", &e);
            }
        }
    }

    fn stream_end(&mut self, id: u64) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        let Some(file) = s.file else {
            return;
        };
        let header = Header {
            kind: s.kind,
            serial: s.serial,
            key: s.key,
            meta_len: s.meta_len,
            meta_crc: s.meta_crc,
            body_len: s.body_len,
            body_crc: s.body_crc,
            expires: s.expires,
            stored: unix_now(),
        };
        let placed = file.write_all_at(&header.encode(), 0).and_then(|()| {
            drop(file);
            place(&s.tmp, &self.shared.layout.file_of(&s.key))
        });
        if let Err(e) = placed {
            let _ = fs::remove_file(&s.tmp);
            self.failed(&s.key, s.serial, "finishing a file", &e);
            return;
        }
        let len = header.record_len();
        self.stored(len);
        if let Ok(entry) = DiskEntry::new(
            s.key,
            Location::File { len },
            s.kind == Kind::Vary,
            s.expires,
        ) {
            self.commit(entry, s.serial);
        }
    }

    fn stream_abort(&mut self, id: u64) {
        if let Some(s) = self.streams.remove(&id) {
            let _ = fs::remove_file(&s.tmp);
            self.shared.locked(|ix| ix.abandon(&s.key, s.serial));
        }
    }

    fn sync(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        let started = Instant::now();
        let slab = self.shared.files.read().slab.clone();
        match rustix::fs::syncfs(&*slab) {
            Ok(()) => {
                let c = &self.shared.counters;
                c.syncs.fetch_add(1, Relaxed);
                c.last_sync_us
                    .store(started.elapsed().as_micros() as u64, Relaxed);
            }
            Err(e) => {
                let e = io::Error::from(e);
                self.shared.faults.record(Fault::of(&e), "syncing", &e);
            }
        }
    }

    /// Notices a removed or replaced directory and makes it again.
    fn check_directory(&mut self) {
        let shared = self.shared;
        let id = shared.files.read().slab_id;
        let same = fs::metadata(shared.layout.slab()).is_ok_and(|m| (m.dev(), m.ino()) == id);
        if same {
            return;
        }
        let gone = io::Error::from(io::ErrorKind::NotFound);
        shared
            .faults
            .write_failed(Fault::Removed, "checking the directory", &gone);
        // What the disk held is lost with the directory.
        shared.locked(|ix| ix.clear());
        for (_, s) in self.streams.drain() {
            shared.locked(|ix| ix.abandon(&s.key, s.serial));
        }
        match Shared::open_files(&shared.layout, shared.config.slab_len()) {
            Ok((files, run)) => {
                let units = files.slab_len / UNIT;
                shared.set_run(run);
                *shared.files.write() = files;
                shared.locked(|ix| ix.reset(units));
                shared.faults.write_succeeded();
                tracing::warn!(disk = %shared.path().display(), "the disk's directory was removed or replaced: made again, empty");
            }
            Err(e) => {
                shared
                    .faults
                    .write_failed(Fault::Removed, "making the directory again", &e);
            }
        }
    }
}

/// Renames a finished file into its place, making its folder if needed.
fn place(tmp: &std::path::Path, to: &std::path::Path) -> io::Result<()> {
    match fs::rename(tmp, to) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && tmp.exists() => {
            if let Some(dir) = to.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::rename(tmp, to)
        }
        other => other,
    }
}

/// Takes records that left the index off the disk: slab records are killed, then their units
/// freed; files are unlinked unless a newer file of the key is indexed.
pub(crate) fn collect(shared: &Shared, garbage: Vec<Garbage>) {
    if garbage.is_empty() {
        return;
    }
    let slab = shared.files.read().slab.clone();
    let mut freed = Vec::new();
    for g in garbage {
        shared.counters.removed.fetch_add(1, Relaxed);
        match g.location {
            Location::Slab { unit, len } => {
                if let Err(e) = slab.write_all_at(&DEAD, unit * UNIT) {
                    shared.faults.record(Fault::of(&e), "removing a record", &e);
                }
                freed.push((unit, u64::from(len).div_ceil(UNIT)));
            }
            Location::File { .. } => {
                let newer = shared
                    .locked(|ix| {
                        ix.peek(&g.key)
                            .is_some_and(|e| matches!(e.location(), Location::File { .. }))
                    })
                    .unwrap_or(false);
                if !newer {
                    match fs::remove_file(shared.layout.file_of(&g.key)) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => shared.faults.record(Fault::of(&e), "removing a file", &e),
                    }
                }
            }
        }
    }
    if !freed.is_empty() {
        shared.locked(|ix| {
            for &(unit, units) in &freed {
                ix.release(unit, units);
            }
        });
    }
}
