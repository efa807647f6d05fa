//! The registry of mapped files whose bytes may be sent with sendfile(2).
//!
//! A mapping is entered when it is made ([`register`]) and leaves when its [`Registration`] is
//! dropped, which its owner does only after the last `Bytes` over it is gone. [`locate`] turns a
//! buffer that lies inside a registered mapping into the file and the offset to send it from.
//! One registry serves the whole process: mappings never overlap, so their addresses tell them
//! apart whoever made them.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

/// Bytes and calls of sendfile(2) from one kind of mapping.
#[derive(Debug, Default)]
pub struct SendCounters {
    /// Bytes sent.
    pub bytes: AtomicU64,
    /// Calls that sent something.
    pub sends: AtomicU64,
}

/// A registered mapping.
#[derive(Debug)]
struct Region {
    /// One past the last mapped address.
    end: usize,
    file: Arc<File>,
    /// The file offset of the mapping's first byte.
    offset: u64,
    counters: Arc<SendCounters>,
    /// The file is memory (a memfd): reading the mapping cannot fail.
    in_memory: bool,
}

/// Mappings by first address.
static REGIONS: RwLock<BTreeMap<usize, Region>> = RwLock::new(BTreeMap::new());

/// How many are registered: with none, [`locate`] takes no lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Buffers shorter than this are written, not sent from a file: sendfile's page bookkeeping
/// costs more than the copy.
const SMALLEST: usize = 16 * 1024;

/// Keeps a mapping registered; dropping it takes the mapping out of the registry.
#[derive(Debug)]
pub struct Registration {
    base: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if REGIONS.write().remove(&self.base).is_some() {
            COUNT.fetch_sub(1, Relaxed);
        }
    }
}

/// Registers the mapping of `len` bytes at `base`, which shows `file` from `offset` on; sends
/// from it are counted in `counters`. `in_memory`: the file is memory (a memfd), not a file on
/// a device. Keep the registration as long as the mapping.
pub fn register(
    base: *const u8,
    len: usize,
    file: Arc<File>,
    offset: u64,
    counters: Arc<SendCounters>,
    in_memory: bool,
) -> Registration {
    let base = base as usize;
    let region = Region {
        end: base.saturating_add(len),
        file,
        offset,
        counters,
        in_memory,
    };
    if REGIONS.write().insert(base, region).is_none() {
        COUNT.fetch_add(1, Relaxed);
    }
    Registration { base }
}

/// Where `buf` can be sent from: the file, its offset in it, and the counters to count the
/// send in. `None` when `buf` is short or lies in no registered mapping.
pub fn locate(buf: &[u8]) -> Option<(Arc<File>, u64, Arc<SendCounters>)> {
    if buf.len() < SMALLEST {
        return None;
    }
    find(buf, |_| true)
}

/// The file and offset of `buf` when it lies in a registered mapping of a file on a device
/// (not memory), whatever its length: bytes to read with `pread` rather than through the
/// mapping.
pub fn on_device(buf: &[u8]) -> Option<(Arc<File>, u64)> {
    find(buf, |r| !r.in_memory).map(|(file, offset, _)| (file, offset))
}

fn find(
    buf: &[u8],
    wanted: impl Fn(&Region) -> bool,
) -> Option<(Arc<File>, u64, Arc<SendCounters>)> {
    if buf.is_empty() || COUNT.load(Relaxed) == 0 {
        return None;
    }
    let start = buf.as_ptr() as usize;
    let end = start.checked_add(buf.len())?;
    let regions = REGIONS.read();
    let (&base, region) = regions.range(..=start).next_back()?;
    (end <= region.end && wanted(region)).then(|| {
        (
            region.file.clone(),
            region.offset + (start - base) as u64,
            region.counters.clone(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_found_in_its_mapping_only_while_registered() {
        let file = Arc::new(tempfile::tempfile().expect("file"));
        let backing = vec![0u8; 100_000];
        let counters = Arc::new(SendCounters::default());
        let reg = register(backing.as_ptr(), backing.len(), file, 4096, counters, false);
        let (_, offset, _) = locate(&backing[20_000..60_000]).expect("inside");
        assert_eq!(offset, 4096 + 20_000);
        assert!(
            locate(&backing[..100]).is_none(),
            "short buffers are written"
        );
        assert_eq!(on_device(&backing[..100]).map(|(_, o)| o), Some(4096));
        let other = vec![0u8; 50_000];
        assert!(locate(&other).is_none());
        drop(reg);
        assert!(locate(&backing[20_000..60_000]).is_none());
    }
}
