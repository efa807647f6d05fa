//! A disk over real files: writes, reads, restarts, damage, streams, budgets, the lock and the
//! offline check. The index holder here is a plain mutex, as the proxy's cache is.

use std::os::unix::fs::FileExt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use meshcache_disk::{
    check, Disk, DiskConfig, DiskIndex, Gone, IndexHolder, Kind, Location, OpenError, ReadError,
    StoreJob,
};
use meshcache_store::{EvictCause, InvalidateCause, Replacement, StoreEvent, StoreKey};
use parking_lot::Mutex;

struct Holder {
    index: Mutex<DiskIndex>,
    changes: Mutex<Vec<StoreEvent>>,
}

impl IndexHolder for Holder {
    fn with_index(&self, _disk: usize, f: &mut dyn FnMut(&mut DiskIndex)) {
        let mut ix = self.index.lock();
        f(&mut ix);
        self.changes.lock().extend(ix.take_changes());
    }
}

struct Node {
    disk: Disk,
    holder: Arc<Holder>,
}

fn config(dir: &std::path::Path, size: u64) -> DiskConfig {
    DiskConfig {
        path: dir.to_owned(),
        size,
        sync_interval: Duration::from_millis(200),
        replacement: Replacement::Lru,
        max_object_size: size,
        queue_bytes: 64 << 20,
    }
}

fn start(dir: &std::path::Path, size: u64) -> Node {
    let node = open(dir, size);
    node.run();
    node.wait_rebuilt();
    node
}

/// The disk opened, its threads not started.
fn open(dir: &std::path::Path, size: u64) -> Node {
    let (disk, index) = Disk::open(0, config(dir, size)).expect("open");
    let holder = Arc::new(Holder {
        index: Mutex::new(index),
        changes: Mutex::new(Vec::new()),
    });
    Node { disk, holder }
}

fn key(n: u32) -> StoreKey {
    StoreKey::get(&format!("http://disk.test/{n}"))
}

fn body(n: u32, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(n) as u8)
        .collect::<Vec<u8>>()
        .into()
}

impl Node {
    /// Starts the writer and the rebuild.
    fn run(&self) {
        let holder = self.holder.clone() as Arc<dyn IndexHolder>;
        let weak: Weak<dyn IndexHolder> = Arc::downgrade(&holder);
        self.disk.start(weak);
    }

    fn wait_rebuilt(&self) {
        for _ in 0..500 {
            if self.disk.rebuilt() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("rebuild did not finish");
    }

    fn put(&self, n: u32, body: Bytes) {
        let serial = self.disk.next_serial();
        self.holder.index.lock().expect(key(n), serial);
        self.disk
            .store(StoreJob {
                key: key(n),
                serial,
                kind: Kind::Object,
                meta: format!("meta of {n}").into_bytes(),
                body,
                expires: 0,
                guard: None,
            })
            .expect("queued");
    }

    fn flush(&self) {
        assert!(self.disk.flush(Duration::from_secs(10)), "flushed");
    }

    /// The object's metadata and body, read the way a hit reads them.
    fn get(&self, n: u32) -> Option<(Bytes, Bytes)> {
        let entry = self.holder.index.lock().get(&key(n))?;
        match entry.location() {
            Location::Slab { unit, len } => {
                let r = self
                    .disk
                    .read_slab(&key(n), unit, len, false)
                    .expect("slab read");
                Some((r.meta, r.body))
            }
            Location::File { len } => {
                let f = self.disk.open_file(&key(n), len).expect("file open");
                let mut body = vec![0; f.header.body_len as usize];
                f.file
                    .read_exact_at(&mut body, f.body_offset())
                    .expect("read body");
                Some((f.meta, body.into()))
            }
        }
    }

    fn remove(&self, n: u32) {
        let mut ix = self.holder.index.lock();
        ix.remove(&key(n), Gone::Invalidated(InvalidateCause::UnsafeMethod));
        for g in ix.take_garbage() {
            self.disk.remove(g);
        }
        self.holder.changes.lock().extend(ix.take_changes());
    }

    fn len(&self) -> usize {
        self.holder.index.lock().len()
    }
}

#[test]
fn objects_survive_a_restart_small_ones_in_the_slab_large_ones_in_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let sizes = [0usize, 1, 1000, 32 * 1024 - 1, 32 * 1024, 300_000];
    {
        let node = start(dir.path(), 64 << 20);
        for (n, &len) in sizes.iter().enumerate() {
            node.put(n as u32, body(n as u32, len));
        }
        node.flush();
        assert_eq!(node.len(), sizes.len());
        for (n, &len) in sizes.iter().enumerate() {
            let (meta, b) = node.get(n as u32).expect("stored");
            assert_eq!(meta, format!("meta of {n}").as_bytes());
            assert_eq!(b, body(n as u32, len));
        }
        let admitted = node
            .holder
            .changes
            .lock()
            .iter()
            .filter(|c| c.is_admission())
            .count();
        assert_eq!(admitted, sizes.len(), "one admission per object");
    }
    let node = start(dir.path(), 64 << 20);
    assert_eq!(node.len(), sizes.len(), "all found again");
    assert_eq!(node.disk.stats().rebuild_found, sizes.len() as u64);
    for (n, &len) in sizes.iter().enumerate() {
        let (_, b) = node.get(n as u32).expect("found again");
        assert_eq!(b, body(n as u32, len), "object {n}");
    }
    let files = std::fs::read_dir(dir.path().join("files"))
        .expect("files/")
        .flatten()
        .map(|d| std::fs::read_dir(d.path()).expect("folder").count())
        .sum::<usize>();
    assert_eq!(files, 2, "bodies of 32 KiB and more get a file each");
}

#[test]
fn a_second_node_on_the_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let _node = start(dir.path(), 1 << 20);
    match Disk::open(0, config(dir.path(), 1 << 20)) {
        Err(e @ OpenError::Locked { .. }) => {
            assert!(e.to_string().contains("in use by another meshcache"), "{e}");
        }
        other => panic!("expected the lock to refuse, got {other:?}"),
    }
}

#[test]
fn damaged_and_foreign_bytes_are_dropped_never_served() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let node = start(dir.path(), 8 << 20);
        node.put(1, body(1, 2000));
        node.put(2, body(2, 2000));
        node.put(3, body(3, 100_000));
        node.put(4, body(4, 100_000));
        node.flush();
    }
    // One slab record's body flipped, one file truncated, foreign files beside ours.
    let slab = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("slab"))
        .expect("slab");
    let mut b = [0u8; 1];
    slab.read_exact_at(&mut b, 1500).expect("read");
    slab.write_all_at(&[b[0] ^ 0xff], 1500).expect("write");
    let hex = key(4).to_hex();
    let file = dir.path().join("files").join(&hex[..2]).join(&hex);
    let len = std::fs::metadata(&file).expect("file").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open")
        .set_len(len - 10)
        .expect("truncate");
    std::fs::write(
        dir.path().join("files").join(&hex[..2]).join("README"),
        "not ours",
    )
    .expect("foreign");
    std::fs::write(dir.path().join("notes.txt"), "not ours either").expect("foreign");

    let report = check(dir.path(), false).expect("check");
    assert_eq!((report.objects, report.damaged), (2, 2), "{report}");

    let node = start(dir.path(), 8 << 20);
    assert_eq!(node.len(), 2);
    let stats = node.disk.stats();
    assert_eq!(stats.rebuild_damaged, 2);
    assert_eq!(stats.faults.damaged, 2);
    assert!(node.get(2).is_some() && node.get(3).is_some());
    assert!(node.get(1).is_none() && node.get(4).is_none());
    assert!(!file.exists(), "the truncated file was deleted");
    assert!(
        dir.path().join("notes.txt").exists(),
        "foreign files are left alone"
    );
}

#[test]
fn a_store_waits_for_the_rebuild_to_free_room_rather_than_being_dropped() {
    let dir = tempfile::tempdir().expect("tmp");
    let objects = 20_000;
    {
        let node = start(dir.path(), 64 << 20);
        for n in 0..objects {
            node.put(n, body(n, 1000));
        }
        node.flush();
        assert_eq!(node.len(), objects as usize);
    }
    // The new object is queued before the threads start: the writer meets it while the
    // rebuild is still reading the 20,000 records in front of the slab's free space.
    let node = open(dir.path(), 64 << 20);
    node.put(objects, body(objects, 700));
    node.run();
    node.flush();
    node.wait_rebuilt();
    assert_eq!(node.disk.stats().dropped, 0, "{:?}", node.disk.stats());
    assert_eq!(node.len(), objects as usize + 1);
    assert_eq!(node.get(objects).expect("stored").1, body(objects, 700));
    assert_eq!(node.get(0).expect("found again").1, body(0, 1000));
}

#[test]
fn removed_objects_stay_removed_after_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let node = start(dir.path(), 8 << 20);
        for n in 0..4 {
            node.put(n, body(n, if n % 2 == 0 { 500 } else { 50_000 }));
        }
        node.flush();
        node.remove(0);
        node.remove(1);
        // A newer version replaces an older one.
        node.put(2, body(99, 700));
        node.flush();
        assert_eq!(node.len(), 2);
    }
    let node = start(dir.path(), 8 << 20);
    assert_eq!(node.len(), 2);
    assert!(node.get(0).is_none() && node.get(1).is_none());
    assert_eq!(node.get(2).expect("newest").1, body(99, 700));
    let report = check(dir.path(), false);
    assert!(report.is_err(), "the node holds the lock");
    drop(node);
    let report = check(dir.path(), false).expect("check");
    assert_eq!(
        (report.objects, report.superseded, report.damaged),
        (2, 0, 0),
        "{report}"
    );
}

#[test]
fn the_budget_evicts_by_policy_and_reuses_slab_space() {
    let dir = tempfile::tempdir().expect("tmp");
    // 64 KiB of objects at most: 20 objects of ~5 KiB do not fit.
    let node = start(dir.path(), 64 << 10);
    for n in 0..20 {
        node.put(n, body(n, 5000));
        node.flush();
    }
    let len = node.len();
    assert!((10..=13).contains(&len), "{len} objects in 64 KiB");
    assert!(node.holder.index.lock().bytes() <= 64 << 10);
    // LRU: the newest are the ones kept.
    assert!(node.get(19).is_some() && node.get(0).is_none());
    let evicted = node
        .holder
        .changes
        .lock()
        .iter()
        .filter(|c| {
            matches!(
                c,
                StoreEvent::Evicted {
                    cause: EvictCause::Capacity,
                    ..
                }
            )
        })
        .count();
    assert_eq!(evicted, 20 - len);
    drop(node);
    let node = start(dir.path(), 64 << 10);
    assert_eq!(
        node.len(),
        len,
        "evicted objects were killed, not brought back"
    );
}

#[test]
fn a_stream_becomes_a_file_and_an_abandoned_one_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let node = start(dir.path(), 64 << 20);
    let whole = body(7, 3 << 20);
    let serial = node.disk.next_serial();
    node.holder.index.lock().expect(key(7), serial);
    let mut stream = node
        .disk
        .stream(key(7), serial, Kind::Object, b"streamed".to_vec(), 0)
        .expect("stream");
    for piece in whole.chunks(64 << 10) {
        assert!(stream.push(Bytes::copy_from_slice(piece)));
    }
    stream.finish(None);
    let serial = node.disk.next_serial();
    node.holder.index.lock().expect(key(8), serial);
    let mut dropped = node
        .disk
        .stream(key(8), serial, Kind::Object, b"never finished".to_vec(), 0)
        .expect("stream");
    assert!(dropped.push(body(8, 1000)));
    drop(dropped);
    node.flush();
    let (meta, b) = node.get(7).expect("streamed object");
    assert_eq!((meta.as_ref(), b.len()), (&b"streamed"[..], whole.len()));
    assert_eq!(b, whole);
    assert!(node.get(8).is_none());
    assert_eq!(node.holder.index.lock().pending(), 0);
    assert_eq!(
        std::fs::read_dir(dir.path().join("tmp"))
            .expect("tmp")
            .count(),
        0
    );
}

#[test]
fn a_stale_read_is_told_apart_from_a_good_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let node = start(dir.path(), 8 << 20);
    node.put(1, body(1, 3000));
    node.flush();
    let entry = node.holder.index.lock().peek(&key(1)).expect("entry");
    let Location::Slab { unit, len } = entry.location() else {
        panic!("small objects go to the slab");
    };
    // Read as another key: refused.
    assert!(matches!(
        node.disk.read_slab(&key(2), unit, len, false),
        Err(ReadError::Damaged(_))
    ));
    node.remove(1);
    node.flush();
    assert!(
        matches!(
            node.disk.read_slab(&key(1), unit, len, false),
            Err(ReadError::Damaged(_))
        ),
        "a removed record is killed"
    );
}
