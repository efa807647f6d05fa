//! Disk faults: what went wrong, counted by kind, logged once per episode.
//!
//! A disk that fails keeps the node serving: a write that cannot be made is dropped (the object
//! stays in memory, or is fetched again), a record that cannot be read is a miss. Each kind of
//! fault is logged when it starts and when the disk works again, not on every failed call, and
//! counted for `/stats` and `/metrics`. After a failed write the disk takes no writes for a
//! while (one second, doubling up to a minute while it keeps failing), then tries again.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// The kinds of fault a disk counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The file system is full (`ENOSPC`, `EDQUOT`).
    NoSpace,
    /// Writing is not allowed (`EROFS`, `EACCES`, `EPERM`).
    ReadOnly,
    /// The directory, or our files in it, went away.
    Removed,
    /// Any other I/O error (`EIO` and the rest).
    Io,
    /// A record failed its checksums or was not what the index said.
    Damaged,
}

impl Fault {
    /// Every kind, in the order `/stats` lists them.
    pub const ALL: [Fault; 5] = [
        Fault::NoSpace,
        Fault::ReadOnly,
        Fault::Removed,
        Fault::Io,
        Fault::Damaged,
    ];

    /// The name in `/stats` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::NoSpace => "no_space",
            Fault::ReadOnly => "read_only",
            Fault::Removed => "removed",
            Fault::Io => "io",
            Fault::Damaged => "damaged",
        }
    }

    /// The kind of an I/O error.
    pub fn of(error: &io::Error) -> Fault {
        match error.raw_os_error() {
            Some(code) if code == libc_errno::ENOSPC || code == libc_errno::EDQUOT => {
                Fault::NoSpace
            }
            Some(code)
                if code == libc_errno::EROFS
                    || code == libc_errno::EACCES
                    || code == libc_errno::EPERM =>
            {
                Fault::ReadOnly
            }
            Some(code) if code == libc_errno::ENOENT || code == libc_errno::ESTALE => {
                Fault::Removed
            }
            _ => Fault::Io,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The errno values we tell apart (from rustix, which knows them per platform).
mod libc_errno {
    use rustix::io::Errno;
    pub const ENOSPC: i32 = Errno::NOSPC.raw_os_error();
    pub const EDQUOT: i32 = Errno::DQUOT.raw_os_error();
    pub const EROFS: i32 = Errno::ROFS.raw_os_error();
    pub const EACCES: i32 = Errno::ACCESS.raw_os_error();
    pub const EPERM: i32 = Errno::PERM.raw_os_error();
    pub const ENOENT: i32 = Errno::NOENT.raw_os_error();
    pub const ESTALE: i32 = Errno::STALE.raw_os_error();
}

/// Fault counts by kind, for `/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    /// Writes refused for want of space.
    pub no_space: u64,
    /// Writes refused by a read-only file system or permissions.
    pub read_only: u64,
    /// Times the directory or our files were found gone.
    pub removed: u64,
    /// Other I/O errors.
    pub io: u64,
    /// Damaged records dropped.
    pub damaged: u64,
}

/// A disk's faults: counts, the episode each kind is in, and the write backoff.
#[derive(Debug)]
pub struct Faults {
    /// Where the disk is, for log lines.
    path: String,
    counts: [AtomicU64; 5],
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Kinds in an episode (logged, not yet over).
    ongoing: [bool; 5],
    /// No writes before this instant.
    paused_until: Option<Instant>,
    /// The pause after the next failed write.
    backoff: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

impl Faults {
    /// No faults yet, for the disk at `path`.
    pub fn new(path: &str) -> Faults {
        Faults {
            path: path.to_owned(),
            counts: Default::default(),
            state: Mutex::new(State {
                backoff: FIRST_BACKOFF,
                ..State::default()
            }),
        }
    }

    /// Counts a fault of `kind` while doing `what`; logs it if it starts an episode.
    pub fn record(&self, kind: Fault, what: &str, error: &dyn std::fmt::Display) {
        self.counts[kind.index()].fetch_add(1, Relaxed);
        let mut state = self.state.lock();
        if !std::mem::replace(&mut state.ongoing[kind.index()], true) {
            tracing::warn!(
                disk = %self.path,
                fault = kind.as_str(),
                error = %error,
                "disk fault while {what}; the node keeps serving from memory and the origin (logged once until it clears)"
            );
        }
    }

    /// A write failed with `kind`: no writes for a while.
    pub fn write_failed(&self, kind: Fault, what: &str, error: &dyn std::fmt::Display) {
        self.record(kind, what, error);
        let mut state = self.state.lock();
        let pause = state.backoff;
        state.paused_until = Some(Instant::now() + pause);
        state.backoff = (pause * 2).min(MAX_BACKOFF);
    }

    /// A write succeeded: write faults are over.
    pub fn write_succeeded(&self) {
        let mut state = self.state.lock();
        if state.paused_until.is_none() && !state.ongoing.iter().any(|o| *o) {
            return;
        }
        state.paused_until = None;
        state.backoff = FIRST_BACKOFF;
        for kind in [Fault::NoSpace, Fault::ReadOnly, Fault::Io, Fault::Removed] {
            if std::mem::replace(&mut state.ongoing[kind.index()], false) {
                tracing::info!(disk = %self.path, fault = kind.as_str(), "disk writes work again");
            }
        }
    }

    /// Ends the episode of `kind` without a log line (a damaged record is one event, not a
    /// state).
    pub fn clear(&self, kind: Fault) {
        self.state.lock().ongoing[kind.index()] = false;
    }

    /// Whether writes are paused now.
    pub fn writes_paused(&self) -> bool {
        let mut state = self.state.lock();
        match state.paused_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                state.paused_until = None;
                false
            }
            None => false,
        }
    }

    /// Counts so far.
    pub fn counts(&self) -> FaultCounts {
        let c = |k: Fault| self.counts[k.index()].load(Relaxed);
        FaultCounts {
            no_space: c(Fault::NoSpace),
            read_only: c(Fault::ReadOnly),
            removed: c(Fault::Removed),
            io: c(Fault::Io),
            damaged: c(Fault::Damaged),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_kind() {
        let e = |code| io::Error::from_raw_os_error(code);
        assert_eq!(Fault::of(&e(libc_errno::ENOSPC)), Fault::NoSpace);
        assert_eq!(Fault::of(&e(libc_errno::EROFS)), Fault::ReadOnly);
        assert_eq!(Fault::of(&e(libc_errno::ENOENT)), Fault::Removed);
        assert_eq!(Fault::of(&io::Error::other("x")), Fault::Io);
    }

    #[test]
    fn a_failed_write_pauses_writes_and_a_good_one_resumes_them() {
        let f = Faults::new("d");
        assert!(!f.writes_paused());
        f.write_failed(Fault::NoSpace, "writing", &"full");
        f.write_failed(Fault::NoSpace, "writing", &"full");
        assert!(f.writes_paused());
        assert_eq!(f.counts().no_space, 2);
        f.write_succeeded();
        assert!(!f.writes_paused());
    }
}
