//! When a member tells the owners what its store did: the store's events wait [`DRAIN_INTERVAL`]
//! after the first of a burst (an idle member does not wake at all), then go out as batched
//! `DIR_ADD` / `DIR_DEL`; every `ttl / 2` the whole store is announced again, so that the
//! records of long-lived objects do not expire. The proxy and the simulator both run this
//! machine: they feed it events and wake it at the times it names.

use std::time::{Duration, Instant};

use super::{Directory, Outgoing};

/// How long store events wait to be turned into directory updates once one arrives: short
/// enough that an owner hears of a new copy before most requests for it, long enough to batch a
/// burst.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(10);

/// A member's directory upkeep.
#[derive(Clone, Debug)]
pub struct Upkeep {
    /// Store events not drained yet: key, and admitted (true) or removed.
    events: Vec<([u8; 16], bool)>,
    /// When the drain that takes them is due.
    drain_at: Option<Instant>,
    /// When the whole store is next announced again.
    renew_at: Instant,
    /// Half the records' TTL: the renewal period.
    half_ttl: Duration,
    /// Events were lost: the next drain announces the whole store.
    resync: bool,
}

impl Upkeep {
    /// The upkeep of a member that starts at `start`, whose records live `ttl`: the first
    /// renewal is at `start + ttl / 2`.
    pub fn new(start: Instant, ttl: Duration) -> Upkeep {
        let half_ttl = ttl / 2;
        Upkeep {
            events: Vec::new(),
            drain_at: None,
            renew_at: start + half_ttl,
            half_ttl,
            resync: false,
        }
    }

    /// The store did `events` (key, admitted or not), and the directory has `queued` updates
    /// waiting (an optimistic entry a fetch's end took back): when a drain is newly due, its
    /// time, for the driver to wake then.
    pub fn note(
        &mut self,
        now: Instant,
        events: impl IntoIterator<Item = ([u8; 16], bool)>,
        queued: usize,
    ) -> Option<Instant> {
        self.events.extend(events);
        let pending = !self.events.is_empty() || queued > 0 || self.resync;
        if pending && self.drain_at.is_none() {
            let due = now + DRAIN_INTERVAL;
            self.drain_at = Some(due);
            return Some(due);
        }
        None
    }

    /// Some of the store's events were lost: the next drain announces the whole store (adds are
    /// idempotent; a lost removal expires with its TTL). When a drain is newly due, its time.
    pub fn lost(&mut self, now: Instant) -> Option<Instant> {
        self.resync = true;
        self.note(now, [], 0)
    }

    /// The next time to wake: the drain if one is due, else the renewal.
    pub fn next_wake(&self) -> Instant {
        self.drain_at
            .map_or(self.renew_at, |d| d.min(self.renew_at))
    }

    /// When the whole store is next announced.
    pub fn renew_at(&self) -> Instant {
        self.renew_at
    }

    /// Woken at `now`: when a drain or the renewal is due, the store's events go to `dir`
    /// (with the whole store, `keys`, on a renewal or after lost events) and what `dir` has to
    /// send comes back, with whether this was a renewal (the next one is at
    /// [`Upkeep::renew_at`]). `None`: nothing was due.
    pub fn wake<K: IntoIterator<Item = [u8; 16]>>(
        &mut self,
        now: Instant,
        dir: &mut Directory,
        keys: impl FnOnce() -> K,
    ) -> Option<(Vec<Outgoing>, bool)> {
        let draining = self.drain_at.is_some_and(|d| now >= d);
        let renewing = now >= self.renew_at;
        if !draining && !renewing {
            return None;
        }
        self.drain_at = None;
        for (key, admitted) in self.events.drain(..) {
            if admitted {
                dir.on_admitted(now, key);
            } else {
                dir.on_removed(now, key);
            }
        }
        if renewing {
            while self.renew_at <= now {
                self.renew_at += self.half_ttl;
            }
        }
        if renewing || std::mem::take(&mut self.resync) {
            for key in keys() {
                dir.on_admitted(now, key);
            }
        }
        Some((dir.take_updates(), renewing))
    }
}
