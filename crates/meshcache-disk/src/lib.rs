//! # meshcache-disk
//!
//! The disk tier of meshcache's store: objects that outlive memory and restarts.
//!
//! A disk is a directory. Small objects (bodies under [`LARGE_BODY`]) are packed into one
//! *slab* file, as Squid's `rock` store does, and read back with a single `pread`; large ones
//! get a file each, as nginx and Squid's `aufs` do, so that hits of them go to the client with
//! sendfile(2) and they can be written as they arrive, whatever their size. Every object is one
//! [record](format) — a header, the owner's metadata, the body — with CRC-32C checksums over all
//! three, checked before a byte is served, so a crash, a torn write or a foreign file is never
//! served; it is dropped and counted.
//!
//! What a disk holds is catalogued in memory by a [`DiskIndex`] (28 bytes per object plus the
//! index's bookkeeping; the key is the file's name, so a file needs no location). The index is
//! kept by the cache that owns the disk, under the lock of its memory store, so that the two
//! tiers form one store with one event stream. The disk's own threads borrow it through
//! [`IndexHolder`]:
//!
//! * the **writer** (the `writer` module) does every write, removal and sync in
//!   queue order; a full queue or a failing disk drops writes, never delays a client;
//! * the **rebuild** (the `rebuild` module) reads the disk after a start and
//!   indexes what it finds, while the node already serves.
//!
//! ## Layout
//!
//! * `format.rs` — the record: header encoding, checksums.
//! * `entry.rs` — [`DiskEntry`], what the index keeps per object.
//! * `space.rs` — [`Space`], the slab's free-space bitmap.
//! * `index.rs` — [`DiskIndex`]: the catalog, the space, pending writes, changes, garbage.
//! * `layout.rs` — the directory: paths, lock, marker file.
//! * `disk.rs` — [`Disk`]: opening, queueing work, counters.
//! * `queue.rs` — the writer's byte-bounded queue.
//! * `writer.rs`, `rebuild.rs` — the two threads; `progress.rs` — the rebuild's progress the
//!   writer waits on for room.
//! * `read.rs` — reading records for hits.
//! * `stream.rs` — [`DiskStream`]: a large object written as it arrives.
//! * `fault.rs` — [`Fault`]s: kinds, counts, logging, write backoff.
//! * `check.rs` — [`check()`]: the offline check (and repair) of a directory.

pub mod check;
mod disk;
mod entry;
mod fault;
mod format;
mod index;
mod layout;
mod progress;
mod queue;
mod read;
pub(crate) mod rebuild;
mod space;
mod stream;
pub(crate) mod writer;

pub use check::{check, CheckReport};
pub use disk::{Disk, DiskConfig, DiskStats, IndexHolder, StoreJob, LARGE_BODY};
pub use entry::{DiskEntry, Location};
pub use fault::{Fault, FaultCounts};
pub use format::{Damage, Header, Kind};
pub use index::{DiskIndex, Garbage, Gone};
pub use layout::OpenError;
pub use read::{OpenedFile, ReadError, SlabRecord};
pub use space::Space;
pub use stream::DiskStream;
