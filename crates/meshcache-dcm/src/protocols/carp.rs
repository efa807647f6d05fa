//! CARP: no search; the URL's hash ranking of the parents is the route
//! ([`crate::carp::CarpRouter`]).

use std::time::Instant;

use crate::carp::CarpRouter;
use crate::engine::{Miss, SearchProtocol, Step};
use crate::icp::{IcpMesh, Outcome};

/// CARP's routing.
#[derive(Clone, Debug)]
pub struct CarpSearch {
    router: CarpRouter,
    /// We are a member of our own array (hash routing among equals).
    member: bool,
}

impl CarpSearch {
    /// Routes by `router`; `member` when the router lists us (`CarpRouter::with_self`).
    pub fn new(router: CarpRouter, member: bool) -> CarpSearch {
        CarpSearch { router, member }
    }

    /// The router.
    pub fn router(&self) -> &CarpRouter {
        &self.router
    }
}

impl SearchProtocol for CarpSearch {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, miss: Miss<'_>) -> Step {
        let peers = mesh.peers();
        let usable = |id: crate::PeerId| peers[id.0].http_up(now);
        let route = match miss.ranking {
            Some(ranking) => self
                .router
                .route_ranked(miss.url, ranking, miss.host, usable),
            None => self.router.route(miss.url, miss.host, usable),
        };
        if route.hops.len() == 1 && !self.member {
            // Every CARP parent is down (or none serves the host): the other parents in
            // Squid's order, then the origin. (A member of its own array fetches what it wins
            // itself.)
            if let Outcome::Decided(r) = mesh.begin(now, miss.url, miss.host, false).outcome {
                return Step::decided(r);
            }
        }
        Step::decided(route)
    }
}
