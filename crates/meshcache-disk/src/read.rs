//! Reading records for hits.
//!
//! A slab record is read whole with one `pread` (with `RWF_NOWAIT` first, so that a record not
//! in the page cache is read on a blocking thread instead of stalling the caller) and checked
//! against all its checksums and its key before a byte of it is used: a record overwritten
//! since it was looked up, or damaged, is never served. A file's header and metadata are read
//! and checked the same way; its body, checked when it was written or when the rebuild found
//! it, is left in the file for the caller to send.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use bytes::Bytes;
use meshcache_store::StoreKey;

use crate::disk::Disk;
use crate::fault::Fault;
use crate::format::{Damage, Header, HEADER_LEN};
use crate::space::UNIT;

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not in the page cache, and the caller asked not to wait.
    #[error("would block")]
    WouldBlock,
    /// Not there (a file removed since it was looked up).
    #[error("missing")]
    Missing,
    /// Not a valid record of the key.
    #[error("damaged record: {0}")]
    Damaged(#[from] Damage),
    /// The read failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A slab record, checked.
#[derive(Clone, Debug)]
pub struct SlabRecord {
    /// Its header.
    pub header: Header,
    /// Its metadata.
    pub meta: Bytes,
    /// Its body.
    pub body: Bytes,
}

/// A large object's file, open, with its header and metadata checked.
#[derive(Debug)]
pub struct OpenedFile {
    /// The file.
    pub file: File,
    /// Its header.
    pub header: Header,
    /// Its metadata.
    pub meta: Bytes,
}

impl OpenedFile {
    /// Where the body starts in the file.
    pub fn body_offset(&self) -> u64 {
        self.header.body_offset()
    }
}

/// Reads exactly `buf.len()` bytes at `offset`; with `nowait`, fails with
/// [`ReadError::WouldBlock`] rather than wait for the device.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64, nowait: bool) -> Result<(), ReadError> {
    let flags = if nowait {
        rustix::io::ReadWriteFlags::NOWAIT
    } else {
        rustix::io::ReadWriteFlags::empty()
    };
    let mut done = 0;
    while done < buf.len() {
        let mut slices = [io::IoSliceMut::new(&mut buf[done..])];
        match rustix::io::preadv2(file, &mut slices, offset + done as u64, flags) {
            Ok(0) => return Err(Damage::Truncated.into()),
            Ok(n) => done += n,
            Err(e) if e == rustix::io::Errno::AGAIN => return Err(ReadError::WouldBlock),
            // No RWF_NOWAIT here (old kernel, some file systems): read the plain way.
            Err(e) if nowait && e == rustix::io::Errno::OPNOTSUPP => {
                return read_exact_at(file, buf, offset, false)
            }
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    Ok(())
}

impl Disk {
    /// Reads and checks the slab record of `key` at `unit`, `len` bytes long.
    ///
    /// # Errors
    ///
    /// [`ReadError::WouldBlock`] with `nowait` when the record is not in the page cache;
    /// [`ReadError::Damaged`] when it is not a valid record of `key` (overwritten since the
    /// lookup, or damaged); [`ReadError::Io`] when the read fails.
    pub fn read_slab(
        &self,
        key: &StoreKey,
        unit: u64,
        len: u32,
        nowait: bool,
    ) -> Result<SlabRecord, ReadError> {
        let slab = self.shared.files.read().slab.clone();
        let mut buf = vec![0u8; len as usize];
        read_exact_at(&slab, &mut buf, unit * UNIT, nowait)?;
        let header = Header::decode(&buf)?;
        if header.key != *key {
            return Err(Damage::WrongKey.into());
        }
        if header.record_len() != u64::from(len) {
            return Err(Damage::Lengths.into());
        }
        header.verify(&buf)?;
        let bytes = Bytes::from(buf);
        let meta_end = HEADER_LEN + header.meta_len as usize;
        Ok(SlabRecord {
            header,
            meta: bytes.slice(HEADER_LEN..meta_end),
            body: bytes.slice(meta_end..),
        })
    }

    /// Opens the file of `key`, `len` bytes long, and checks its header and metadata.
    ///
    /// # Errors
    ///
    /// [`ReadError::Missing`] when there is no such file; [`ReadError::Damaged`] when it is
    /// not a valid record of `key` of that length; [`ReadError::Io`] when a read fails.
    pub fn open_file(&self, key: &StoreKey, len: u64) -> Result<OpenedFile, ReadError> {
        let file = match File::open(self.shared.layout.file_of(key)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) => return Err(e.into()),
        };
        let mut head = [0u8; HEADER_LEN];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => ReadError::Damaged(Damage::Truncated),
                _ => ReadError::Io(e),
            })?;
        let header = Header::decode(&head)?;
        if header.key != *key {
            return Err(Damage::WrongKey.into());
        }
        if header.record_len() != len || file.metadata()?.len() != len {
            return Err(Damage::Truncated.into());
        }
        let mut meta = vec![0u8; header.meta_len as usize];
        file.read_exact_at(&mut meta, HEADER_LEN as u64)?;
        header.verify_meta(&meta)?;
        Ok(OpenedFile {
            file,
            header,
            meta: Bytes::from(meta),
        })
    }

    /// Counts a record found damaged (or missing) by a reader; the first of each sync interval
    /// is logged.
    pub fn note_damaged(&self, key: &StoreKey, error: &ReadError) {
        self.shared
            .faults
            .record(Fault::Damaged, &format!("reading {key}"), error);
    }

    /// Counts a failed read.
    pub fn note_read_error(&self, error: &io::Error) {
        self.shared
            .faults
            .record(Fault::of(error), "reading a record", error);
    }
}
