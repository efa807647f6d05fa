//! Each protocol's search, as the engine runs it ([`crate::engine::SearchProtocol`]): one
//! file per protocol, each mapping the protocol's state machine (elsewhere in this crate) onto
//! the engine's entry points. Adding a protocol is adding a file here.

mod carp;
mod directory;
mod icp;
mod multicast;
mod summary;

pub use carp::CarpSearch;
pub use icp::IcpSearch;
pub use summary::{DigestSearch, SummarySearch};
