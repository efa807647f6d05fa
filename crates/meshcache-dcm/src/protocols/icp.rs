//! ICP (RFC 2186/2187 as Squid runs it): every eligible peer is asked at once, and the peer
//! table's own search ([`IcpMesh::begin`]) weighs the replies.

use std::time::Instant;

use crate::engine::{Miss, SearchProtocol, Step};
use crate::icp::IcpMesh;

/// ICP's search.
#[derive(Clone, Copy, Debug, Default)]
pub struct IcpSearch;

impl SearchProtocol for IcpSearch {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        mesh.begin(now, miss.url, miss.host, miss.hierarchical)
            .into()
    }
}
