//! The offline check of a disk's directory (`meshcache store check DIR`).
//!
//! Takes the directory's lock (so it refuses to run beside a node using it), reads the slab and
//! every file the way the rebuild does, and reports what it found: objects and their bytes,
//! damaged records, records superseded by a newer one of the same key, leftovers in `tmp/`.
//! With `repair`, damaged and superseded slab records are killed, damaged files and leftovers
//! deleted, so that the next start indexes exactly the good objects without meeting the rest.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use meshcache_store::StoreKey;
use serde::Serialize;

use crate::entry::Location;
use crate::format::{Kind, DEAD};
use crate::layout::{Layout, OpenError};
use crate::rebuild::{walk_files, walk_slab, FileCheck, Seen};
use crate::space::UNIT;

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Objects (responses and Vary markers) that check out and would be indexed.
    pub objects: u64,
    /// Their records' bytes.
    pub bytes: u64,
    /// Of them, in the slab.
    pub slab_objects: u64,
    /// Of them, in files of their own.
    pub file_objects: u64,
    /// Of them, Vary markers.
    pub vary_markers: u64,
    /// Records that fail a checksum, are truncated, or are not their key's.
    pub damaged: u64,
    /// Valid records of a key that has a newer one.
    pub superseded: u64,
    /// Files left in `tmp/` by a write that never finished.
    pub leftovers: u64,
    /// The slab's length in bytes (0 if there is none).
    pub slab_len: u64,
    /// Whether the damaged and superseded records and the leftovers were removed.
    pub repaired: bool,
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "objects: {} ({} bytes; {} in the slab, {} in files; {} Vary markers)",
            self.objects, self.bytes, self.slab_objects, self.file_objects, self.vary_markers
        )?;
        writeln!(f, "damaged records: {}", self.damaged)?;
        writeln!(f, "superseded records: {}", self.superseded)?;
        writeln!(f, "unfinished writes in tmp/: {}", self.leftovers)?;
        write!(
            f,
            "{}",
            if self.repaired {
                "repaired: damaged and superseded records and unfinished writes removed"
            } else if self.damaged + self.superseded + self.leftovers > 0 {
                "not repaired (--repair removes them; a node would ignore them anyway)"
            } else {
                "nothing to repair"
            }
        )
    }
}

/// One valid record seen, to find the newest of each key.
struct Seen1 {
    serial: u64,
    location: Location,
}

/// Checks the disk directory `dir`; see the [module documentation](self).
///
/// # Errors
///
/// The directory cannot be read or its lock taken (a node is using it).
pub fn check(dir: &Path, repair: bool) -> Result<CheckReport, OpenError> {
    let layout = Layout::new(dir);
    let io_err = |what: &'static str| {
        move |error| OpenError::Io {
            path: dir.to_owned(),
            what,
            error,
        }
    };
    if !dir.is_dir() {
        return Err(OpenError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let _lock = layout.take_lock()?;
    let stop = AtomicBool::new(false);
    let mut report = CheckReport {
        repaired: repair,
        ..CheckReport::default()
    };
    let mut newest: HashMap<StoreKey, Seen1> = HashMap::new();
    let mut bad = Vec::new();
    let mut superseded = Vec::new();
    let mut consider =
        |key: StoreKey, serial: u64, location: Location, superseded: &mut Vec<_>| match newest
            .get_mut(&key)
        {
            Some(old) if old.serial >= serial => superseded.push((key, location)),
            Some(old) => {
                superseded.push((key, old.location));
                *old = Seen1 { serial, location };
            }
            None => {
                newest.insert(key, Seen1 { serial, location });
            }
        };
    let mut vary: HashMap<StoreKey, bool> = HashMap::new();

    let slab = OpenOptions::new()
        .read(true)
        .write(repair)
        .open(layout.slab());
    if let Ok(slab) = &slab {
        report.slab_len = slab.metadata().map_err(io_err("reading the slab"))?.len();
        walk_slab(slab, report.slab_len, &stop, |seen| match seen {
            Seen::Record { header, unit } => {
                let location = Location::Slab {
                    unit,
                    len: header.record_len() as u32,
                };
                vary.insert(header.key, header.kind == Kind::Vary);
                consider(header.key, header.serial, location, &mut superseded);
            }
            Seen::Damaged { unit, .. } => {
                report.damaged += 1;
                bad.push(Location::Slab { unit, len: 0 });
            }
            Seen::Free { .. } => {}
        })
        .map_err(io_err("reading the slab"))?;
    }
    let mut bad_files = Vec::new();
    walk_files(&layout.files(), &stop, |path, key, checked| match checked {
        Ok(header) => {
            vary.insert(key, header.kind == Kind::Vary);
            consider(
                key,
                header.serial,
                Location::File {
                    len: header.record_len(),
                },
                &mut superseded,
            );
        }
        Err(FileCheck::Damaged(_)) => {
            report.damaged += 1;
            bad_files.push(path.to_owned());
        }
        Err(FileCheck::Io(_)) => report.damaged += 1,
    })
    .map_err(io_err("reading files/"))?;

    for (key, seen) in &newest {
        report.objects += 1;
        report.bytes += seen.location.len();
        match seen.location {
            Location::Slab { .. } => report.slab_objects += 1,
            Location::File { .. } => report.file_objects += 1,
        }
        if vary.get(key) == Some(&true) {
            report.vary_markers += 1;
        }
    }
    report.superseded = superseded.len() as u64;
    let leftovers: Vec<_> = fs::read_dir(layout.tmp())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    report.leftovers = leftovers.len() as u64;

    if repair {
        let kill = |unit: u64| -> Result<(), OpenError> {
            if let Ok(slab) = &slab {
                slab.write_all_at(&DEAD, unit * UNIT)
                    .map_err(io_err("repairing the slab"))?;
            }
            Ok(())
        };
        for location in bad {
            if let Location::Slab { unit, .. } = location {
                kill(unit)?;
            }
        }
        for (key, location) in superseded {
            match location {
                Location::Slab { unit, .. } => kill(unit)?,
                // Only a slab record can be superseded by a file of the same key or the reverse;
                // two files of one key share one path.
                Location::File { .. } => {
                    let path = layout.file_of(&key);
                    if newest
                        .get(&key)
                        .is_some_and(|n| !matches!(n.location, Location::File { .. }))
                    {
                        let _ = fs::remove_file(path);
                    }
                }
            }
        }
        for path in bad_files.iter().chain(&leftovers) {
            let _ = fs::remove_file(path);
        }
        if let Ok(slab) = &slab {
            slab.sync_all().map_err(io_err("repairing the slab"))?;
        }
    }
    Ok(report)
}
