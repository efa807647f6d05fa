//! Each protocol's upkeep state, as the node keeps it: what the UDP side hands datagrams to
//! and the node's tasks run on. Above the protocols' files, below the UDP side and the search.

use std::sync::Arc;

use super::directory::DirectoryState;
use super::multicast::MulticastState;
use super::summary::Summaries;

/// The protocols' upkeep state (each present when the configured protocol keeps it).
#[derive(Default)]
pub(crate) struct Upkeep {
    /// Our summary and the peers' (summary and digest protocols).
    pub(crate) summaries: Option<Arc<Summaries>>,
    /// The directory's upkeep (directory protocol).
    pub(crate) directory: Option<Arc<DirectoryState>>,
    /// The multicast sockets' state (multicast protocol).
    pub(crate) multicast: Option<Arc<MulticastState>>,
}
