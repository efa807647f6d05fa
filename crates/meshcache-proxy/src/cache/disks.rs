//! The cache's disks: which one an object goes to, and reading an object back as the cache's
//! own [`Entry`].
//!
//! An object goes to one disk, chosen by a rendezvous hash of its key weighted by the disks'
//! sizes (so each disk gets its share, and adding one moves only the objects that go to it),
//! among the disks that accept an object of its size.
//!
//! A small object is read from the slab whole, checked, and decoded into an ordinary stored
//! response with its body on the heap. A large one's file is opened, its head checked and
//! decoded, and its body mapped (see [`zerocopy::mapped`]): its hits go out with sendfile(2).

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderName;
use meshcache_disk::{
    Damage, Disk, DiskConfig, DiskEntry, DiskIndex, Kind, Location, OpenError, ReadError,
};
use meshcache_store::StoreKey;

use super::meta::{decode_object, decode_vary};
use super::object::CachedObject;
use crate::zerocopy::{self, regions::SendCounters};

/// What a disk holds under a key, read back.
pub(crate) enum Loaded {
    /// A response.
    Object(CachedObject),
    /// A URL's Vary marker.
    Marker(Box<[HeaderName]>, Vec<StoreKey>),
}

/// The cache's disks; see the [module documentation](self).
pub(crate) struct DiskTier {
    pub(crate) disks: Vec<Disk>,
    /// sendfile(2) from the disks' files.
    pub(crate) sent: Arc<SendCounters>,
}

/// A 64-bit mix of `key` for disk `disk` (splitmix64 over the key's first bytes, which are
/// already uniform: the key is an MD5).
fn mix(key: &StoreKey, disk: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&key.0[..8]);
    let mut z = u64::from_le_bytes(word) ^ (disk as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl DiskTier {
    /// Opens every disk; their indexes go under the cache's lock.
    pub(crate) fn open(configs: &[DiskConfig]) -> Result<(DiskTier, Vec<DiskIndex>), OpenError> {
        let mut disks = Vec::with_capacity(configs.len());
        let mut indexes = Vec::with_capacity(configs.len());
        for (n, config) in configs.iter().enumerate() {
            let (disk, index) = Disk::open(n, config.clone())?;
            disks.push(disk);
            indexes.push(index);
        }
        Ok((
            DiskTier {
                disks,
                sent: Arc::default(),
            },
            indexes,
        ))
    }

    /// The disk an object of `key` whose record is `len` bytes goes to, if any accepts it.
    pub(crate) fn choose(&self, key: &StoreKey, len: u64) -> Option<usize> {
        self.disks
            .iter()
            .enumerate()
            .filter(|(_, d)| d.admits(len))
            .map(|(i, d)| {
                // Weighted rendezvous: -ln(u) / weight, the smallest wins.
                let u = (mix(key, i) >> 11) as f64 / (1u64 << 53) as f64;
                let score = -(u.max(f64::MIN_POSITIVE)).ln() / d.config().size as f64;
                (i, score)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    }

    /// Reads what disk `disk` holds under `key` at `entry`, checked and decoded. With `nowait`,
    /// a slab record not in the page cache is [`ReadError::WouldBlock`].
    pub(crate) fn read(
        &self,
        disk: usize,
        key: &StoreKey,
        entry: DiskEntry,
        nowait: bool,
    ) -> Result<Loaded, ReadError> {
        let d = &self.disks[disk];
        let (kind, meta, body) = match entry.location() {
            Location::Slab { unit, len } => {
                let record = d.read_slab(key, unit, len, nowait)?;
                (record.header.kind, record.meta, record.body)
            }
            Location::File { len } => {
                let opened = d.open_file(key, len)?;
                let (kind, meta) = (opened.header.kind, opened.meta.clone());
                let (offset, body_len) = (opened.body_offset(), opened.header.body_len);
                let body = if kind == Kind::Object {
                    zerocopy::mapped::map(opened.file, offset, body_len, self.sent.clone())?
                } else {
                    Bytes::new()
                };
                (kind, meta, body)
            }
        };
        let unusable = |_| ReadError::Damaged(Damage::Foreign);
        Ok(match kind {
            Kind::Object => Loaded::Object(decode_object(meta, body).map_err(unusable)?),
            Kind::Vary => {
                let (names, variants) = decode_vary(meta).map_err(unusable)?;
                Loaded::Marker(names, variants)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendezvous_hash_spreads_by_size() {
        let dir = tempfile::tempdir().expect("tmp");
        let config = |name: &str, size: u64| DiskConfig {
            path: dir.path().join(name),
            size,
            sync_interval: std::time::Duration::from_secs(5),
            replacement: meshcache_store::Replacement::Lru,
            max_object_size: size,
            queue_bytes: 1 << 20,
        };
        let (tier, _) =
            DiskTier::open(&[config("a", 1 << 30), config("b", 3 << 30)]).expect("open");
        let mut counts = [0u32; 2];
        for i in 0..4000 {
            let key = StoreKey::get(&format!("http://a.test/{i}"));
            counts[tier.choose(&key, 1000).expect("a disk")] += 1;
        }
        // One quarter and three quarters, within a few percent.
        assert!((900..1100).contains(&counts[0]), "{counts:?}");
        let big = tier.choose(&StoreKey::get("http://a.test/x"), 2 << 30);
        assert_eq!(big, Some(1), "only the larger disk takes a 2 GiB object");
    }
}
