//! Miss collapsing: concurrent checks of the same credentials share one verification.
//!
//! A browser opening a page sends a dozen requests at once with the same credentials; with a
//! cold cache each would otherwise ask the helper (or run bcrypt). The first caller runs the
//! work; the others wait for its result. If the first caller is cancelled (its client went
//! away), a waiting one takes the work over — tokio's `OnceCell` does that — so nobody waits on
//! a computation that nobody runs. The entry goes once the work has finished or the last
//! interested caller has left.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OnceCell;

/// Shared in-flight computations by key.
pub(crate) struct Coalescer<K, V> {
    inflight: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
}

impl<K: Hash + Eq + Clone, V: Clone> Coalescer<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `work` for `key`, or waits for the run already under way and returns its result.
    pub(crate) async fn run<F, Fut>(&self, key: K, work: F) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let cell = self.inflight.lock().entry(key.clone()).or_default().clone();
        let _leave = Leave {
            inflight: &self.inflight,
            key,
            cell: cell.clone(),
        };
        cell.get_or_init(work).await.clone()
    }

    /// How many computations are under way.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inflight.lock().len()
    }
}

/// Removes the entry when its work is done or its last caller leaves.
struct Leave<'a, K: Hash + Eq, V> {
    inflight: &'a Mutex<HashMap<K, Arc<OnceCell<V>>>>,
    key: K,
    cell: Arc<OnceCell<V>>,
}

impl<K: Hash + Eq, V> Drop for Leave<'_, K, V> {
    fn drop(&mut self) {
        let mut inflight = self.inflight.lock();
        let ours = inflight
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell));
        // Two references: the map's and ours. New callers clone under this lock, so the count
        // cannot grow while it is looked at.
        if ours && (self.cell.initialized() || Arc::strong_count(&self.cell) <= 2) {
            inflight.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_one_run() {
        let coalescer = Arc::new(Coalescer::<u32, u32>::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (coalescer, runs) = (coalescer.clone(), runs.clone());
            tasks.push(tokio::spawn(async move {
                coalescer
                    .run(7, || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        42
                    })
                    .await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.expect("task"), 42);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(coalescer.len(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_first_caller_hands_the_work_over() {
        let coalescer = Arc::new(Coalescer::<u32, u32>::new());
        let first = {
            let coalescer = coalescer.clone();
            tokio::spawn(async move {
                coalescer
                    .run(1, || async {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        0
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.run(1, || async { 5 }).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort();
        let got = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("no hang")
            .expect("task");
        assert_eq!(got, 5);
        assert_eq!(coalescer.len(), 0);
    }
}
