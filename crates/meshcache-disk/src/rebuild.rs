//! The rebuild: finding what a disk holds after a restart, while the node already serves.
//!
//! The slab is read front to back in large pieces, skipping holes (`SEEK_DATA`). At every unit
//! boundary a record may start: a header that decodes is checked with its metadata and body
//! against their checksums; a valid record is indexed (the newest of two records of one key
//! wins, by serial) and the reading goes on after it; anything else is passed over a unit at a
//! time. Free space is given to the allocator as the reading passes it, so the writer can place
//! new records behind the rebuild while it runs, never ahead of it (a record that finds no room
//! yet waits for the next batch: see `progress`). Then `files/` is read: each
//! file's name, header, metadata and whole body are checked; a damaged file is deleted.
//!
//! Until the rebuild reaches an object, a request for it is a miss (fetched and stored again,
//! and the older record then ignored). What it finds is indexed in batches, under the owner's
//! lock, and reported as admitted like any new object, so peers' summaries and digests learn of
//! it by the protocols' normal updates.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use meshcache_store::StoreKey;

use crate::disk::Shared;
use crate::entry::{DiskEntry, Location, MAX_SLAB_RECORD};
use crate::fault::Fault;
use crate::format::{Damage, Header, Kind, HEADER_LEN};
use crate::index::Found;
use crate::space::UNIT;
use crate::writer::collect;

/// Bytes read at once from the slab.
const PIECE: usize = 1 << 20;

/// Records indexed per visit to the owner's lock.
const BATCH: usize = 4096;

/// What the rebuild found and has not yet handed to the index.
#[derive(Default)]
struct Batch {
    found: Vec<(DiskEntry, u64)>,
    free: Vec<(u64, u64)>,
}

impl Batch {
    fn flush(&mut self, shared: &Shared) {
        if self.found.is_empty() && self.free.is_empty() {
            return;
        }
        let (found, free) = (
            std::mem::take(&mut self.found),
            std::mem::take(&mut self.free),
        );
        let indexed = found.len() as u64;
        let mut twins = Vec::new();
        let garbage = shared
            .locked(|ix| {
                for &(unit, units) in &free {
                    ix.found_free(unit, units);
                }
                for &(entry, serial) in &found {
                    if let Found::Twin(twin) = ix.found(entry) {
                        twins.push((entry, serial, twin));
                    }
                }
                ix.take_garbage()
            })
            .unwrap_or_default();
        collect(shared, garbage);
        if !twins.is_empty() {
            // Two valid records of one key: the one written later wins.
            let newer: Vec<bool> = twins
                .iter()
                .map(|(entry, serial, twin)| {
                    serial_at(shared, &entry.key(), twin.location()).is_none_or(|s| *serial > s)
                })
                .collect();
            let garbage = shared
                .locked(|ix| {
                    for ((entry, _, twin), &newer) in twins.iter().zip(&newer) {
                        ix.settle(*entry, *twin, newer);
                    }
                    ix.take_garbage()
                })
                .unwrap_or_default();
            collect(shared, garbage);
        }
        shared
            .counters
            .rebuild_found
            .fetch_add(indexed - twins.len() as u64, Relaxed);
        shared.progress.advance();
    }
}

/// The serial of the record of `key` at `location`, read from its header.
fn serial_at(shared: &Shared, key: &StoreKey, location: Location) -> Option<u64> {
    let mut head = [0u8; HEADER_LEN];
    match location {
        Location::Slab { unit, .. } => {
            let slab = shared.files.read().slab.clone();
            slab.read_exact_at(&mut head, unit * UNIT).ok()?;
        }
        Location::File { .. } => {
            File::open(shared.layout.file_of(key))
                .and_then(|f| f.read_exact_at(&mut head, 0))
                .ok()?;
        }
    }
    Header::decode(&head).ok().map(|h| h.serial)
}

/// The rebuild thread's body.
pub(crate) fn run(shared: &Shared) {
    let started = Instant::now();
    let mut batch = Batch::default();
    if let Err(e) = slab(shared, &mut batch) {
        shared
            .faults
            .record(Fault::of(&e), "rebuilding from the slab", &e);
    }
    batch.flush(shared);
    if let Err(e) = files(shared, &mut batch) {
        shared
            .faults
            .record(Fault::of(&e), "rebuilding from files/", &e);
    }
    batch.flush(shared);
    shared.locked(|ix| ix.rebuilt());
    let c = &shared.counters;
    c.rebuild_us
        .store(started.elapsed().as_micros() as u64, Relaxed);
    c.rebuilding.store(false, Relaxed);
    shared.progress.advance();
    tracing::info!(
        disk = %shared.path().display(),
        objects = c.rebuild_found.load(Relaxed),
        damaged = c.rebuild_damaged.load(Relaxed),
        seconds = started.elapsed().as_secs_f64(),
        "disk rebuilt"
    );
}

fn damaged(shared: &Shared, what: &str, damage: Damage) {
    shared.counters.rebuild_damaged.fetch_add(1, Relaxed);
    shared.faults.record(Fault::Damaged, what, &damage);
}

/// The next offset at or after `at` that holds data (holes are never written records), or
/// `None` when only holes are left.
fn next_data(file: &File, at: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(at)) {
        Ok(pos) => Ok(Some(pos)),
        Err(e) if e == rustix::io::Errno::NXIO => Ok(None),
        // No SEEK_DATA here: treat everything as data.
        Err(e) if e == rustix::io::Errno::INVAL => Ok(Some(at)),
        Err(e) => Err(e.into()),
    }
}

/// A window of the slab in memory.
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// Reads `len` bytes (fewer at `end`) from `at`.
    fn fill(&mut self, file: &File, at: u64, len: usize, end: u64) -> io::Result<()> {
        let len = len.min(end.saturating_sub(at) as usize);
        self.start = at;
        self.bytes.resize(len, 0);
        let mut done = 0;
        while done < len {
            match file.read_at(&mut self.bytes[done..], at + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.bytes.truncate(done);
        Ok(())
    }
}

/// What reading the slab comes across.
pub(crate) enum Seen {
    /// A valid record at `unit`.
    Record { header: Header, unit: u64 },
    /// A record header at `unit` whose record does not check out.
    Damaged { unit: u64, damage: Damage },
    /// Bytes `from..to` (whole units) hold no live record.
    Free { from: u64, to: u64 },
}

/// Reads the slab `file` of `len` bytes front to back and tells `visit` what it finds, in
/// order; stops early when `stop` is set.
pub(crate) fn walk_slab(
    file: &File,
    len: u64,
    stop: &AtomicBool,
    mut visit: impl FnMut(Seen),
) -> io::Result<()> {
    let end = len / UNIT * UNIT;
    let mut window = Window {
        start: 0,
        bytes: Vec::with_capacity(PIECE),
    };
    // `pos`: the unit-aligned offset looked at; `free_from`: where the current free run began.
    let mut pos = 0u64;
    let mut free_from = 0u64;
    while pos < end {
        if stop.load(Relaxed) {
            return Ok(());
        }
        if pos + HEADER_LEN as u64 > window.end() {
            let Some(data) = next_data(file, pos)? else {
                break;
            };
            pos = (data / UNIT * UNIT).max(pos);
            if pos >= end {
                break;
            }
            window.fill(file, pos, PIECE, end)?;
            if window.bytes.len() < HEADER_LEN {
                break;
            }
        }
        let at = (pos - window.start) as usize;
        let header = match Header::decode(&window.bytes[at..]) {
            Ok(h) if h.record_len() <= MAX_SLAB_RECORD && pos + h.record_len() <= end => h,
            Ok(_) => {
                visit(Seen::Damaged {
                    unit: pos / UNIT,
                    damage: Damage::Lengths,
                });
                pos += UNIT;
                continue;
            }
            Err(_) => {
                pos += UNIT;
                continue;
            }
        };
        let rec_len = header.record_len();
        if pos + rec_len > window.end() {
            window.fill(file, pos, PIECE.max(rec_len as usize), end)?;
        }
        let at = (pos - window.start) as usize;
        if let Err(damage) = header.verify(&window.bytes[at..]) {
            visit(Seen::Damaged {
                unit: pos / UNIT,
                damage,
            });
            pos += UNIT;
            continue;
        }
        if pos > free_from {
            visit(Seen::Free {
                from: free_from,
                to: pos,
            });
        }
        visit(Seen::Record {
            header,
            unit: pos / UNIT,
        });
        pos += rec_len.div_ceil(UNIT) * UNIT;
        free_from = pos;
    }
    if end > free_from {
        visit(Seen::Free {
            from: free_from,
            to: end,
        });
    }
    Ok(())
}

fn slab(shared: &Shared, batch: &mut Batch) -> io::Result<()> {
    let (file, len) = {
        let files = shared.files.read();
        (files.slab.clone(), files.slab_len)
    };
    walk_slab(&file, len, &shared.stop, |seen| match seen {
        Seen::Record { header, unit } => {
            let location = Location::Slab {
                unit,
                len: header.record_len() as u32,
            };
            if let Ok(entry) = DiskEntry::new(
                header.key,
                location,
                header.kind == Kind::Vary,
                header.expires,
            ) {
                batch.found.push((entry, header.serial));
                if batch.found.len() >= BATCH {
                    batch.flush(shared);
                }
            }
        }
        Seen::Damaged { damage, .. } => damaged(shared, "rebuilding from the slab", damage),
        Seen::Free { from, to } => {
            batch.free.push((from / UNIT, (to - from) / UNIT));
            if batch.free.len() >= BATCH / 16 {
                batch.flush(shared);
            }
        }
    })
}

/// The key a file under `files/` is named after.
fn key_of_name(name: &str) -> Option<StoreKey> {
    StoreKey::from_hex(name)
}

/// Reads every file under `root` (`files/`) named after a key and tells `visit` its path, its
/// key and whether it checks out; files not named after a key are left alone.
pub(crate) fn walk_files(
    root: &std::path::Path,
    stop: &AtomicBool,
    mut visit: impl FnMut(&std::path::Path, StoreKey, Result<Header, FileCheck>),
) -> io::Result<()> {
    let mut folders: Vec<_> = match fs::read_dir(root) {
        Ok(dir) => dir.flatten().map(|e| e.path()).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    folders.sort();
    for folder in folders {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            if stop.load(Relaxed) {
                return Ok(());
            }
            let path = entry.path();
            let Some(key) = entry.file_name().to_str().and_then(key_of_name) else {
                continue;
            };
            let checked = check_file(&path, &key);
            visit(&path, key, checked);
        }
    }
    Ok(())
}

fn files(shared: &Shared, batch: &mut Batch) -> io::Result<()> {
    let this_run = shared.this_run();
    walk_files(
        &shared.layout.files(),
        &shared.stop,
        |path, key, checked| {
            match checked {
                Ok(header) if Shared::run_of(header.serial) == this_run => {
                    // Written by this run: indexed when it was written.
                }
                Ok(header) => {
                    let location = Location::File {
                        len: header.record_len(),
                    };
                    if let Ok(entry) =
                        DiskEntry::new(key, location, header.kind == Kind::Vary, header.expires)
                    {
                        batch.found.push((entry, header.serial));
                    }
                }
                Err(FileCheck::Damaged(damage)) => {
                    damaged(shared, "rebuilding from files/", damage);
                    let _ = fs::remove_file(path);
                }
                Err(FileCheck::Io(e)) => {
                    shared
                        .faults
                        .record(Fault::of(&e), "rebuilding from files/", &e);
                }
            }
            if batch.found.len() >= BATCH / 16 {
                batch.flush(shared);
            }
        },
    )
}

/// Why a file did not pass.
pub(crate) enum FileCheck {
    Damaged(Damage),
    Io(io::Error),
}

/// Checks a whole file: header, that it is `key`'s, its length, metadata and body checksums.
pub(crate) fn check_file(path: &std::path::Path, key: &StoreKey) -> Result<Header, FileCheck> {
    let file = File::open(path).map_err(FileCheck::Io)?;
    let size = file.metadata().map_err(FileCheck::Io)?.len();
    let mut head = [0u8; HEADER_LEN];
    if size < HEADER_LEN as u64 {
        return Err(FileCheck::Damaged(Damage::Truncated));
    }
    file.read_exact_at(&mut head, 0).map_err(FileCheck::Io)?;
    let header = Header::decode(&head).map_err(FileCheck::Damaged)?;
    if header.key != *key {
        return Err(FileCheck::Damaged(Damage::WrongKey));
    }
    if header.record_len() != size {
        return Err(FileCheck::Damaged(Damage::Truncated));
    }
    let mut meta = vec![0u8; header.meta_len as usize];
    file.read_exact_at(&mut meta, HEADER_LEN as u64)
        .map_err(FileCheck::Io)?;
    header.verify_meta(&meta).map_err(FileCheck::Damaged)?;
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = header.body_offset();
    while at < size {
        let n = ((size - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], at)
            .map_err(FileCheck::Io)?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
    }
    if crc != header.body_crc {
        return Err(FileCheck::Damaged(Damage::BodyChecksum));
    }
    Ok(header)
}
