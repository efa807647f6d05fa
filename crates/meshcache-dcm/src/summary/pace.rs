//! The pace of a node's summary work: one definition for the proxy, the simulator and the
//! floor benchmark, which must keep the same time.

use std::time::Duration;

/// The least time between two of a node's updates. Changes that pass the threshold sooner go
/// out together in the next: at a few hundred misses a second the threshold is crossed several
/// times a quarter-second, and one update carrying them all is fewer datagrams than one per
/// crossing (0.09 against 0.15 per request in the four-sibling CPU experiment).
pub const UPDATE_SPACING: Duration = Duration::from_millis(250);

/// How often due fetches of peers' summaries are looked for (each wake-up of an idle node
/// costs CPU; a lost delta waits at most this long for its repair).
pub const FETCH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The shortest wait between two whole fetches from one peer ([`super::PeerSummaries::new`]).
pub const MIN_FETCH_INTERVAL: Duration = Duration::from_secs(1);

/// How often, at most, a summary lookup reads the update inbox (one non-blocking receive when
/// empty).
pub const INBOX_POLL: Duration = Duration::from_millis(50);

/// How often the inbox is read when no lookup did: an idle node's peers' updates wait this long.
pub const INBOX_IDLE: Duration = Duration::from_secs(1);

/// Squid's `store_avg_object_size`, used to size a summary from the store's byte budget.
pub const AVG_OBJECT_SIZE: u64 = 13 * 1024;

/// The capacity a summary is sized for by a store of `store_bytes` (at [`AVG_OBJECT_SIZE`] an
/// object, at least 100): the smallest a resize picks.
pub fn min_capacity(store_bytes: u64) -> u32 {
    u32::try_from(store_bytes / AVG_OBJECT_SIZE)
        .unwrap_or(u32::MAX)
        .max(100)
}
