//! A disk's large object, mapped for its hits: the body as [`Bytes`] over the file's pages.
//!
//! The mapping is registered (see [`regions`](super::regions)) for as long as a `Bytes` over it
//! exists, so writes of it to a client go out with sendfile(2) from the file; nothing is read
//! into our memory. The disk never writes a file once it is in place (a new version is a new
//! file renamed over the old one), so the pages shown never change under a reader.
//!
//! What the proxy itself reads of such a body (an applet's view of it) it reads with `pread`
//! ([`resident`]), never through the mapping: a file truncated behind our back, or a page the
//! device fails to read, then gives an error instead of a `SIGBUS`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};

use super::regions::{self, Registration, SendCounters};

/// The owner of a mapped body; see the [module documentation](self).
struct MappedBody {
    map: MmapRaw,
    /// Where the body starts in the mapping, and its length.
    start: usize,
    len: usize,
    _registration: Registration,
}

impl AsRef<[u8]> for MappedBody {
    #[allow(unsafe_code)]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start + len` lies within the mapping (checked in `map`), which lives as long
        // as this owner. The file is never written while it is in place: the disk replaces a
        // file by renaming a new one over it, which leaves the mapped inode as it was.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.start), self.len) }
    }
}

/// The body of `file`, `len` bytes from `offset`, mapped and registered for sendfile(2); sends
/// are counted in `counters`.
///
/// # Errors
///
/// The body lies beyond the file, or the mapping fails.
pub fn map(file: File, offset: u64, len: u64, counters: Arc<SendCounters>) -> io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let size = file.metadata()?.len();
    let end = offset
        .checked_add(len)
        .filter(|&end| end <= size)
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "body beyond the file"))?;
    let map_len = usize::try_from(end).map_err(|_| io::Error::other("file too large to map"))?;
    let map = MmapOptions::new().len(map_len).map_raw_read_only(&file)?;
    let file = Arc::new(file);
    let registration = regions::register(map.as_ptr(), map_len, file, 0, counters, false);
    Ok(Bytes::from_owner(MappedBody {
        map,
        start: offset as usize,
        len: len as usize,
        _registration: registration,
    }))
}

/// `body` with its bytes in our memory: a copy read with `pread` when it lies in a registered
/// disk mapping, the same `Bytes` otherwise.
pub fn resident(body: &Bytes) -> io::Result<Bytes> {
    let Some((file, offset)) = regions::on_device(body) else {
        return Ok(body.clone());
    };
    let mut copy = vec![0u8; body.len()];
    file.read_exact_at(&mut copy, offset)?;
    Ok(Bytes::from(copy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_mapped_body_reads_right_and_is_sent_from_its_file() {
        let mut file = tempfile::tempfile().expect("file");
        let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&content).expect("write");
        let counters = Arc::new(SendCounters::default());
        let body = map(file.try_clone().expect("dup"), 100, 90_000, counters).expect("map");
        assert_eq!(&body[..], &content[100..90_100]);
        let (_, offset, _) = regions::locate(&body[1000..40_000]).expect("registered");
        assert_eq!(offset, 1100);
        assert_eq!(resident(&body).expect("read"), &content[100..90_100]);
        let past = map(file, 50_000, 60_000, Arc::default());
        assert!(past.is_err(), "a body beyond the file is refused");
    }
}
