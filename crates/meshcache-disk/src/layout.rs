//! A disk's directory: what is in it, its lock, and its marker file.
//!
//! ```text
//! DIR/meshcache-disk   the marker: format version and the last run's number
//! DIR/lock             held (flock) by the node using the directory; holds its pid
//! DIR/slab             small objects, packed (see `space` and `format`)
//! DIR/files/XX/KEY     a large object each: XX is the key's first byte, KEY its 32 hex digits
//! DIR/tmp/             files being written; emptied at start
//! ```
//!
//! Nothing else in the directory is touched. A second node started on the same directory is
//! refused: the lock is taken with `flock(LOCK_EX | LOCK_NB)`, released by the kernel when the
//! holder exits, however it exits.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use meshcache_store::StoreKey;

/// The marker file's first line: what the directory is and its format.
const MARKER_HEAD: &str = "meshcache disk store, format 1";

/// Why a disk's directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the directory's lock.
    #[error(
        "{path} is in use by another meshcache (pid {pid}); a directory serves one node at a time"
    )]
    Locked {
        /// The directory.
        path: PathBuf,
        /// The holder's pid, as it wrote it (or "unknown").
        pid: String,
    },
    /// The directory holds a store of a format this version does not know.
    #[error("{path} holds a disk store of another format ({found:?}); move it away or point store.disk.path elsewhere")]
    Format {
        /// The directory.
        path: PathBuf,
        /// The marker's first line.
        found: String,
    },
    /// A file system error.
    #[error("{path}: {what}: {error}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        error: io::Error,
    },
    /// The directory to check does not exist.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
}

/// The paths of a disk's directory.
#[derive(Clone, Debug)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The layout of `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The marker file.
    pub fn marker(&self) -> PathBuf {
        self.dir.join("meshcache-disk")
    }

    /// The lock file.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }

    /// The slab file.
    pub fn slab(&self) -> PathBuf {
        self.dir.join("slab")
    }

    /// The folder of large objects.
    pub fn files(&self) -> PathBuf {
        self.dir.join("files")
    }

    /// The file of a large object.
    pub fn file_of(&self, key: &StoreKey) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join("files").join(&hex[..2]).join(hex)
    }

    /// The folder of files being written.
    pub fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// A file being written, numbered `serial`.
    pub fn tmp_file(&self, serial: u64) -> PathBuf {
        self.tmp().join(format!("{serial:016x}"))
    }

    fn err(&self, what: &'static str) -> impl FnOnce(io::Error) -> OpenError + '_ {
        move |error| OpenError::Io {
            path: self.dir.clone(),
            what,
            error,
        }
    }

    /// Creates what is missing (the directory, `files/`, `tmp/`) and empties `tmp/`.
    pub fn prepare(&self) -> Result<(), OpenError> {
        fs::create_dir_all(&self.dir).map_err(self.err("creating the directory"))?;
        fs::create_dir_all(self.files()).map_err(self.err("creating files/"))?;
        fs::create_dir_all(self.tmp()).map_err(self.err("creating tmp/"))?;
        for entry in fs::read_dir(self.tmp())
            .map_err(self.err("reading tmp/"))?
            .flatten()
        {
            // Left by a node that stopped mid-write: never renamed, never indexed.
            let _ = fs::remove_file(entry.path());
        }
        Ok(())
    }

    /// Takes the directory's lock.
    ///
    /// # Errors
    ///
    /// [`OpenError::Locked`] when another process holds it.
    pub fn take_lock(&self) -> Result<DirLock, OpenError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.lock())
            .map_err(self.err("opening the lock file"))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(OpenError::Locked {
                    path: self.dir.clone(),
                    pid: if pid.is_empty() { "unknown" } else { pid }.to_owned(),
                });
            }
            Err(e) => return Err(self.err("locking")(e.into())),
        }
        file.set_len(0).map_err(self.err("writing the lock file"))?;
        writeln!(file, "{}", std::process::id()).map_err(self.err("writing the lock file"))?;
        Ok(DirLock { _file: file })
    }

    /// Reads the marker and writes the next run's number into it: the larger of the clock's
    /// seconds and the last run's number plus one, so that serials grow across restarts even
    /// if the marker was lost or the clock stepped back within a second.
    pub fn next_run(&self) -> Result<u32, OpenError> {
        let last = match fs::read_to_string(self.marker()) {
            Ok(text) => {
                let mut lines = text.lines();
                let head = lines.next().unwrap_or("");
                if head != MARKER_HEAD {
                    if head.starts_with("meshcache disk store") {
                        return Err(OpenError::Format {
                            path: self.dir.clone(),
                            found: head.to_owned(),
                        });
                    }
                    tracing::warn!(marker = %self.marker().display(), "unreadable disk marker: writing a new one");
                }
                lines
                    .find_map(|l| l.strip_prefix("run "))
                    .and_then(|n| n.trim().parse::<u32>().ok())
                    .unwrap_or(0)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(self.err("reading the marker")(e)),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX - 1)) as u32);
        let run = now.max(last.saturating_add(1));
        let tmp = self.tmp().join("marker");
        fs::write(&tmp, format!("{MARKER_HEAD}\nrun {run}\n"))
            .map_err(self.err("writing the marker"))?;
        fs::rename(&tmp, self.marker()).map_err(self.err("writing the marker"))?;
        Ok(run)
    }

    /// Opens the slab, creating it `len` bytes long (sparse) if missing and growing it to `len`
    /// if shorter. Returns the file and its length (never shrunk: records beyond a smaller
    /// `len` stay readable).
    pub fn open_slab(&self, len: u64) -> Result<(File, u64), OpenError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.slab())
            .map_err(self.err("opening the slab"))?;
        let have = file
            .metadata()
            .map_err(self.err("reading the slab's size"))?
            .len();
        if have < len {
            file.set_len(len).map_err(self.err("sizing the slab"))?;
        }
        Ok((file, have.max(len)))
    }
}

/// The held lock of a disk's directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().expect("tmp");
        let layout = Layout::new(dir.path().join("d"));
        layout.prepare().expect("prepare");
        let held = layout.take_lock().expect("first");
        match layout.take_lock() {
            Err(OpenError::Locked { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(held);
        layout.take_lock().expect("free again");
    }

    #[test]
    fn runs_grow_and_a_foreign_marker_is_rewritten() {
        let dir = tempfile::tempdir().expect("tmp");
        let layout = Layout::new(dir.path());
        layout.prepare().expect("prepare");
        let a = layout.next_run().expect("run");
        let b = layout.next_run().expect("run");
        assert!(b > a);
        fs::write(layout.marker(), "garbage\x00\x01").expect("write");
        assert!(layout.next_run().is_ok());
        fs::write(layout.marker(), "meshcache disk store, format 9\nrun 1\n").expect("write");
        assert!(matches!(layout.next_run(), Err(OpenError::Format { .. })));
    }

    #[test]
    fn leftovers_in_tmp_are_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let layout = Layout::new(dir.path());
        layout.prepare().expect("prepare");
        fs::write(layout.tmp_file(7), b"half").expect("write");
        layout.prepare().expect("prepare");
        assert_eq!(fs::read_dir(layout.tmp()).expect("dir").count(), 0);
    }
}
