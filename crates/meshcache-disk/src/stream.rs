//! A large object written to disk as its body arrives, so that it never has to fit in memory.
//!
//! Each piece is queued for the writer like any write: when the queue is full the stream is
//! abandoned (the client's download goes on; only the disk copy is given up). Dropping a stream
//! before [`DiskStream::finish`] abandons it too: the file being written is removed.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use meshcache_store::StoreKey;

use crate::disk::{Job, Shared};

/// A large object being written; see the module's documentation.
pub struct DiskStream {
    shared: Arc<Shared>,
    id: u64,
    key: StoreKey,
    serial: u64,
    /// Given up: nothing more is sent.
    broken: bool,
    done: bool,
}

impl std::fmt::Debug for DiskStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStream")
            .field("key", &self.key)
            .field("serial", &self.serial)
            .field("broken", &self.broken)
            .finish()
    }
}

impl DiskStream {
    pub(crate) fn new(shared: Arc<Shared>, id: u64, key: StoreKey, serial: u64) -> DiskStream {
        DiskStream {
            shared,
            id,
            key,
            serial,
            broken: false,
            done: false,
        }
    }

    /// Queues the next piece of the body; `false` once the stream was given up (the queue was
    /// full), after which pieces are ignored.
    pub fn push(&mut self, chunk: Bytes) -> bool {
        if self.broken {
            return false;
        }
        let bytes = chunk.len() as u64;
        if self
            .shared
            .queue
            .offer(Job::StreamChunk { id: self.id, chunk }, bytes)
            .is_err()
        {
            self.shared.counters.dropped.fetch_add(1, Relaxed);
            self.abort();
        }
        !self.broken
    }

    /// The body is complete: the writer finishes the file and indexes it; `guard` is held until
    /// then. A stream given up does nothing.
    pub fn finish(mut self, guard: Option<Box<dyn Send>>) {
        self.done = true;
        if self.broken {
            return;
        }
        let _ = self
            .shared
            .queue
            .force(Job::StreamEnd { id: self.id, guard });
    }

    /// Whether it was given up.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The object's key.
    pub fn key(&self) -> StoreKey {
        self.key
    }

    fn abort(&mut self) {
        if !std::mem::replace(&mut self.broken, true) {
            let _ = self.shared.queue.force(Job::StreamAbort { id: self.id });
        }
    }
}

impl Drop for DiskStream {
    fn drop(&mut self) {
        if !self.done {
            self.abort();
        }
    }
}
