//! The directory (dbDCM): the URL's owner is asked who holds it, then α holders
//! ([`Directory`]).

use std::net::SocketAddr;
use std::time::Instant;

use crate::directory::Directory;
use crate::engine::{Miss, SearchProtocol, Send, Step};
use crate::icp::{IcpMesh, Reply};
use crate::select::Route;

impl SearchProtocol for Directory {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        let s = Directory::begin(
            self,
            now,
            mesh,
            miss.url,
            miss.key,
            miss.host,
            miss.hierarchical,
        );
        Step {
            reqnum: s.reqnum,
            sends: s.sends.into_iter().map(Send::Directory).collect(),
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
        Directory::on_reply(self, now, mesh, from, reply)
    }

    fn on_deadline(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        Directory::on_deadline(self, now, mesh, reqnum)
    }

    fn abandon(&mut self, reqnum: u32) {
        Directory::abandon(self, reqnum);
    }
}
