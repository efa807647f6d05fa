//! Multicast (the Berkeley protocol): one query to the group, answered by holders only
//! ([`Multicast`]).

use std::net::SocketAddr;
use std::time::Instant;

use crate::engine::{Miss, SearchProtocol, Send, Step};
use crate::icp::{IcpMesh, Reply};
use crate::multicast::Multicast;
use crate::select::Route;

impl SearchProtocol for Multicast {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        let s = Multicast::begin(self, now, mesh, miss.url, miss.host, miss.hierarchical);
        let reqnum = s.reqnum;
        Step {
            reqnum,
            sends: s
                .queries
                .into_iter()
                .map(|to| Send::Multicast { reqnum, to })
                .collect(),
            outcome: s.outcome,
        }
    }

    fn on_reply(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<Option<Route>> {
        Multicast::on_reply(self, now, mesh, from, reply)
    }

    fn on_deadline(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        Multicast::on_deadline(self, now, mesh, reqnum)
    }

    fn abandon(&mut self, reqnum: u32) {
        Multicast::abandon(self, reqnum);
    }
}
