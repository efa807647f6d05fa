//! The writer's queue: jobs in order, bounded by the bytes they hold.
//!
//! Writing to disk never delays a client: a store that does not fit in the queue is refused at
//! once (the object stays in memory, or is fetched again next time). Removals and the ends of
//! streams are small and always taken, so that nothing the index forgot lingers on disk.

use std::collections::VecDeque;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// A FIFO of `T`s bounded by the bytes they hold; see the [module documentation](self).
#[derive(Debug)]
pub struct Queue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    limit: u64,
}

#[derive(Debug)]
struct State<T> {
    jobs: VecDeque<(T, u64)>,
    bytes: u64,
    closed: bool,
}

impl<T> Queue<T> {
    /// An empty queue holding at most `limit` bytes of refusable jobs.
    pub fn new(limit: u64) -> Queue<T> {
        Queue {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                bytes: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            limit,
        }
    }

    /// Queues `job` holding `bytes`; refused (and handed back) if that would pass the limit
    /// or the queue is closed.
    pub fn offer(&self, job: T, bytes: u64) -> Result<(), T> {
        let mut s = self.state.lock();
        if s.closed || s.bytes.saturating_add(bytes) > self.limit {
            return Err(job);
        }
        s.bytes += bytes;
        s.jobs.push_back((job, bytes));
        drop(s);
        self.ready.notify_one();
        Ok(())
    }

    /// Queues `job` whatever the bytes held (small jobs that must not be lost). Refused only
    /// when the queue is closed.
    pub fn force(&self, job: T) -> Result<(), T> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(job);
        }
        s.jobs.push_back((job, 0));
        drop(s);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job, waiting until `deadline` at most; `None` on timeout or once the queue is
    /// closed and empty.
    pub fn take(&self, deadline: Instant) -> Option<T> {
        let mut s = self.state.lock();
        loop {
            if let Some((job, bytes)) = s.jobs.pop_front() {
                s.bytes -= bytes;
                return Some(job);
            }
            if s.closed {
                return None;
            }
            if self.ready.wait_until(&mut s, deadline).timed_out() {
                return None;
            }
        }
    }

    /// Takes no more jobs; [`Queue::take`] returns what is left, then `None`.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_all();
    }

    /// Whether [`Queue::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Jobs and bytes queued now.
    pub fn len_and_bytes(&self) -> (usize, u64) {
        let s = self.state.lock();
        (s.jobs.len(), s.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn refuses_past_the_limit_but_forced_jobs_always_go() {
        let q = Queue::new(100);
        assert!(q.offer("a", 60).is_ok());
        assert_eq!(q.offer("b", 60), Err("b"));
        assert!(q.force("remove").is_ok());
        assert_eq!(q.len_and_bytes(), (2, 60));
        let soon = Instant::now() + Duration::from_millis(10);
        assert_eq!(q.take(soon), Some("a"));
        assert!(q.offer("b", 60).is_ok());
        assert_eq!(q.take(soon), Some("remove"));
        assert_eq!(q.take(soon), Some("b"));
        q.close();
        assert_eq!(q.take(Instant::now() + Duration::from_secs(5)), None);
        assert_eq!(q.force("late"), Err("late"));
    }
}
