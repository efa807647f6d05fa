//! Decision: the ordered list of places a request may be forwarded to.
//!
//! A [`Route`] is tried hop by hop: if a hop fails (refused, timed out, stalled) the next is
//! tried, so one dead parent never fails a request while another parent, or the origin, can
//! serve it. Squid's preference order among parents is kept: the parent that answered the ICP
//! search best, then round-robin parents, then the others in configuration order, then the
//! `default` parent, and the origin last. Parents whose HTTP side is down are skipped while any
//! other parent is up.

use std::time::Instant;

use crate::hier::HierCode;
use crate::peer::{Peer, PeerId, Role};

/// One place to forward a request to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// A peer's HTTP port.
    Peer {
        /// Which peer.
        peer: PeerId,
        /// Why it was chosen, as logged.
        code: HierCode,
    },
    /// The origin server.
    Direct,
}

impl Hop {
    /// The hierarchy code to log when this hop serves the request.
    pub fn code(&self) -> HierCode {
        match self {
            Hop::Peer { code, .. } => *code,
            Hop::Direct => HierCode::Direct,
        }
    }
}

/// Where a request goes, in order of preference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Hops to try in order.
    pub hops: Vec<Hop>,
    /// The ICP search ended by timeout (Squid logs the code with a `TIMEOUT_` prefix).
    pub timed_out: bool,
}

impl Route {
    /// Straight to the origin.
    pub fn direct() -> Self {
        Route {
            hops: vec![Hop::Direct],
            timed_out: false,
        }
    }
}

/// The parents in a peer table, in table order.
pub fn parents_of(peers: &[Peer]) -> Vec<PeerId> {
    peers
        .iter()
        .enumerate()
        .filter(|(_, p)| p.spec.role == Role::Parent)
        .map(|(i, _)| PeerId(i))
        .collect()
}

/// Parents among `parents` (the table's parents, [`parents_of`]) that may take a request for
/// `host`, with the ones whose HTTP side is up first. A mesh keeps its parent list, so a miss
/// does not scan every sibling.
pub fn eligible_among(peers: &[Peer], parents: &[PeerId], host: &str, now: Instant) -> Vec<PeerId> {
    let all: Vec<PeerId> = parents
        .iter()
        .copied()
        .filter(|id| peers[id.0].spec.serves(host))
        .collect();
    let up: Vec<PeerId> = all
        .iter()
        .copied()
        .filter(|id| peers[id.0].http_up(now))
        .collect();
    if up.is_empty() {
        all
    } else {
        up
    }
}

/// Builds a route: `first` (an ICP hit or the best parent miss) if any, then the remaining
/// parents in Squid's order, then the origin.
pub fn route(
    peers: &mut [Peer],
    host: &str,
    now: Instant,
    first: Option<Hop>,
    timed_out: bool,
) -> Route {
    let parents = parents_of(peers);
    route_among(peers, &parents, host, now, first, timed_out)
}

/// As [`route`], with the table's parents given ([`parents_of`]).
pub fn route_among(
    peers: &mut [Peer],
    parents: &[PeerId],
    host: &str,
    now: Instant,
    first: Option<Hop>,
    timed_out: bool,
) -> Route {
    let parents = eligible_among(peers, parents, host, now);
    let mut hops: Vec<Hop> = first.into_iter().collect();
    let push = |hops: &mut Vec<Hop>, peer: PeerId, code: HierCode| {
        if !hops
            .iter()
            .any(|h| matches!(h, Hop::Peer { peer: p, .. } if *p == peer))
        {
            hops.push(Hop::Peer { peer, code });
        }
    };
    if parents.len() == 1 && first.is_none() {
        push(&mut hops, parents[0], HierCode::SingleParent);
    }
    // Round-robin: the least used (relative to weight) goes first.
    let mut rr: Vec<PeerId> = parents
        .iter()
        .copied()
        .filter(|id| peers[id.0].spec.round_robin)
        .collect();
    rr.sort_by_key(|id| {
        let p = &peers[id.0];
        (p.rr_count * 1000 / u64::from(p.spec.weight.max(1)), id.0)
    });
    if let Some(chosen) = rr.first() {
        if first.is_none() {
            peers[chosen.0].rr_count += 1;
        }
    }
    for id in rr {
        push(&mut hops, id, HierCode::RoundRobinParent);
    }
    for &id in &parents {
        if !peers[id.0].spec.default {
            push(&mut hops, id, HierCode::FirstUpParent);
        }
    }
    for &id in &parents {
        push(&mut hops, id, HierCode::DefaultParent);
    }
    hops.push(Hop::Direct);
    Route { hops, timed_out }
}

/// The route after peer `hit` answered HIT: that peer first (`PARENT_HIT` or `SIBLING_HIT` by
/// its role), then the usual parent order among `parents` ([`parents_of`]) and the origin.
pub fn hit_route_among(
    peers: &mut [Peer],
    parents: &[PeerId],
    hit: PeerId,
    host: &str,
    now: Instant,
) -> Route {
    let code = match peers[hit.0].spec.role {
        Role::Parent => HierCode::ParentHit,
        Role::Sibling => HierCode::SiblingHit,
    };
    let first = Some(Hop::Peer { peer: hit, code });
    route_among(peers, parents, host, now, first, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PeerSpec;
    use std::time::Duration;

    fn parent(name: &str, f: impl FnOnce(&mut PeerSpec)) -> Peer {
        let mut s = PeerSpec::new(name, Role::Parent, "127.0.0.1:1".parse().unwrap(), None);
        f(&mut s);
        Peer::new(s)
    }

    fn names(peers: &[Peer], r: &Route) -> Vec<String> {
        r.hops
            .iter()
            .map(|h| match h {
                Hop::Peer { peer, code } => {
                    format!("{}:{}", peers[peer.0].spec.name, code.as_str())
                }
                Hop::Direct => "DIRECT".into(),
            })
            .collect()
    }

    #[test]
    fn no_parents_goes_direct() {
        let mut peers: Vec<Peer> = vec![];
        assert_eq!(
            route(&mut peers, "a.test", Instant::now(), None, false),
            Route::direct()
        );
    }

    #[test]
    fn single_parent_then_direct() {
        let mut peers = vec![parent("p", |_| {})];
        let r = route(&mut peers, "a.test", Instant::now(), None, false);
        assert_eq!(names(&peers, &r), ["p:SINGLE_PARENT", "DIRECT"]);
    }

    #[test]
    fn order_first_rr_others_default() {
        let mut peers = vec![
            parent("d", |s| s.default = true),
            parent("a", |_| {}),
            parent("r1", |s| s.round_robin = true),
            parent("r2", |s| s.round_robin = true),
            parent("br", |s| s.domains = vec![".br".into()]),
        ];
        let now = Instant::now();
        let r = route(&mut peers, "x.test", now, None, false);
        assert_eq!(
            names(&peers, &r),
            [
                "r1:ROUNDROBIN_PARENT",
                "r2:ROUNDROBIN_PARENT",
                "a:FIRSTUP_PARENT",
                "d:DEFAULT_PARENT",
                "DIRECT"
            ]
        );
        // Round-robin alternates.
        let r = route(&mut peers, "x.test", now, None, false);
        assert_eq!(names(&peers, &r)[0], "r2:ROUNDROBIN_PARENT");
        // The domain parent serves its domain only.
        let r = route(&mut peers, "www.ufrj.br", now, None, false);
        assert!(names(&peers, &r).contains(&"br:FIRSTUP_PARENT".to_string()));
    }

    #[test]
    fn a_down_parent_is_skipped_while_another_is_up() {
        let now = Instant::now();
        let mut peers = vec![parent("p1", |_| {}), parent("p2", |_| {})];
        peers[0].fetch_failed(now);
        let r = route(&mut peers, "x.test", now, None, false);
        assert_eq!(names(&peers, &r), ["p2:SINGLE_PARENT", "DIRECT"]);
        // After the back-off it is probed again, in its place.
        let later = now + Duration::from_secs(2);
        let r = route(&mut peers, "x.test", later, None, false);
        assert_eq!(
            names(&peers, &r),
            ["p1:FIRSTUP_PARENT", "p2:FIRSTUP_PARENT", "DIRECT"]
        );
        // With every parent down, they are still tried before the origin.
        peers[1].fetch_failed(now);
        let r = route(&mut peers, "x.test", now, None, false);
        assert_eq!(
            names(&peers, &r),
            ["p1:FIRSTUP_PARENT", "p2:FIRSTUP_PARENT", "DIRECT"]
        );
    }

    #[test]
    fn first_hop_leads_and_is_not_repeated() {
        let mut peers = vec![parent("p1", |_| {}), parent("p2", |_| {})];
        let first = Hop::Peer {
            peer: PeerId(1),
            code: HierCode::FirstParentMiss,
        };
        let r = route(&mut peers, "x.test", Instant::now(), Some(first), true);
        assert_eq!(
            names(&peers, &r),
            ["p2:FIRST_PARENT_MISS", "p1:FIRSTUP_PARENT", "DIRECT"]
        );
        assert!(r.timed_out);
    }
}
