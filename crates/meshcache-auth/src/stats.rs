//! Counters of what the authenticator did, for `/metrics` and tests.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A snapshot of the counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AuthStats {
    /// `check` calls.
    pub checks: u64,
    /// Checks answered from the credential cache.
    pub cache_hits: u64,
    /// Verifications by the backend (a hash checked, or a helper asked): cache misses, less the
    /// checks that waited for the same credentials' verification already under way.
    pub verifications: u64,
    /// Checks that ended [`Verdict::User`](crate::Verdict::User).
    pub accepted: u64,
    /// Checks that ended [`Verdict::Rejected`](crate::Verdict::Rejected).
    pub rejected: u64,
    /// Checks that ended [`Verdict::Malformed`](crate::Verdict::Malformed).
    pub malformed: u64,
    /// Checks and group lookups that failed for good: [`Verdict::Unavailable`](crate::Verdict::Unavailable)
    /// and [`AuthError::Unavailable`](crate::AuthError::Unavailable).
    pub failures: u64,
    /// Request lines written to helpers (auth and group), retries included.
    pub helper_requests: u64,
    /// Helper children restarted after they ended (killed, crashed, hung).
    pub helper_restarts: u64,
    /// Helper attempts that failed without a timeout: `BH`, garbage, the child died.
    pub helper_errors: u64,
    /// Helper attempts unanswered within `helper_timeout`.
    pub timeouts: u64,
    /// `in_group` calls.
    pub group_checks: u64,
    /// Group lookups answered from the cache.
    pub group_cache_hits: u64,
    /// Times the htpasswd file was reloaded after a change.
    pub reloads: u64,
}

/// The live counters behind [`AuthStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) checks: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) verifications: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) helper_requests: AtomicU64,
    pub(crate) helper_restarts: AtomicU64,
    pub(crate) helper_errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) group_checks: AtomicU64,
    pub(crate) group_cache_hits: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, reloads: u64) -> AuthStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AuthStats {
            checks: get(&self.checks),
            cache_hits: get(&self.cache_hits),
            verifications: get(&self.verifications),
            accepted: get(&self.accepted),
            rejected: get(&self.rejected),
            malformed: get(&self.malformed),
            failures: get(&self.failures),
            helper_requests: get(&self.helper_requests),
            helper_restarts: get(&self.helper_restarts),
            helper_errors: get(&self.helper_errors),
            timeouts: get(&self.timeouts),
            group_checks: get(&self.group_checks),
            group_cache_hits: get(&self.group_cache_hits),
            reloads,
        }
    }
}
