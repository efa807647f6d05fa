//! Summary Cache and Cache Digests: only the peers whose summary says "maybe" are worth a
//! look. Summary Cache asks them by ICP, one at a time ([`Walk`]); Cache Digests fetches from
//! them straight away. The summaries themselves are the driver's ([`Miss::candidates`]).

use std::collections::HashMap;
use std::time::Instant;

use crate::engine::{Miss, Progress, SearchProtocol, Step};
use crate::icp::{IcpMesh, Outcome};
use crate::peer::PeerId;
use crate::select::Route;
use crate::summary::Walk;

/// The candidates of a miss: none when the request may not consult siblings and no parent
/// could take it (the summaries are not even read).
fn candidates(mesh: &IcpMesh, miss: &mut Miss<'_>) -> Option<Vec<PeerId>> {
    let has_parents = !mesh.parents().is_empty();
    let hits = if miss.hierarchical || has_parents {
        miss.take_candidates()
    } else {
        Vec::new()
    };
    // No summary says "maybe" and no parent could take it: the origin, with no search to set
    // up (the common case of a summary mesh).
    (has_parents || !hits.is_empty()).then_some(hits)
}

/// Summary Cache's search: the candidates asked one at a time, fastest first.
#[derive(Debug, Default)]
pub struct SummarySearch {
    /// Walks waiting for a step's reply, by that step's request number.
    walks: HashMap<u32, Walking>,
}

/// A walk under way, and what its next step needs.
#[derive(Debug)]
struct Walking {
    walk: Walk,
    url: String,
    host: String,
    hierarchical: bool,
}

impl SummarySearch {
    /// Takes `w`'s next steps: those decided at once follow one another (their queries all
    /// sent), up to the first that waits for a reply or ends the walk.
    fn walk_on(&mut self, now: Instant, mesh: &mut IcpMesh, mut w: Walking) -> Step {
        let mut sends = Vec::new();
        loop {
            let step = Step::from(w.walk.step(mesh, now, &w.url, &w.host, w.hierarchical));
            sends.extend(step.sends);
            match step.outcome {
                Outcome::Decided(route) if !w.walk.ends(&route) => continue,
                outcome => {
                    if matches!(outcome, Outcome::Wait { .. }) {
                        self.walks.insert(step.reqnum, w);
                    }
                    return Step {
                        reqnum: step.reqnum,
                        sends,
                        outcome,
                    };
                }
            }
        }
    }
}

impl SearchProtocol for SummarySearch {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, mut miss: Miss<'_>) -> Step {
        let Some(hits) = candidates(mesh, &mut miss) else {
            return Step::decided(Route::direct());
        };
        let walk = Walk::new(mesh, &hits, miss.hierarchical);
        let w = Walking {
            walk,
            url: miss.url.to_owned(),
            host: miss.host.to_owned(),
            hierarchical: miss.hierarchical,
        };
        self.walk_on(now, mesh, w)
    }

    fn decided(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32, route: Route) -> Progress {
        match self.walks.remove(&reqnum) {
            Some(w) if !w.walk.ends(&route) => Progress::Next(self.walk_on(now, mesh, w)),
            _ => Progress::Decided(route),
        }
    }

    fn abandon(&mut self, reqnum: u32) {
        self.walks.remove(&reqnum);
    }
}

/// Cache Digests' search: none; the peers whose digest says hit go first.
#[derive(Clone, Copy, Debug, Default)]
pub struct DigestSearch;

impl SearchProtocol for DigestSearch {
    fn begin(&mut self, now: Instant, mesh: &mut IcpMesh, mut miss: Miss<'_>) -> Step {
        let route = match candidates(mesh, &mut miss) {
            Some(hits) => mesh.digest_route(now, miss.host, miss.hierarchical, &hits),
            None => Route::direct(),
        };
        Step::decided(route)
    }
}
