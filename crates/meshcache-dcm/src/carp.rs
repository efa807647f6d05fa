//! Decision for `protocol = "carp"`: each URL has its own parent, found by hashing, no query.
//!
//! CARP (draft-vinod-carp-v1-03, as Squid 5.7's `carp.cc` implements it) scores every parent
//! for the request's URL and sends the request to the highest score. Parents therefore split
//! the URL space between them in proportion to their `weight`, each caching its own share,
//! and every child cache using the same parents sends a given URL to the same parent. The
//! hashing itself is pure and lives in [`meshcache_wire::carp`]; this module maps it onto the
//! peer table: which peers are members, which of them may take a request, and the
//! [`Route`] to try.
//!
//! Members are all the parents of the table (siblings never are), named and weighted as
//! configured; a parent's name must be the one Squid hashes (its `cache_peer` host as written,
//! or `name=`) for both to pick the same parent. Build a [`CarpRouter`] once per
//! configuration: membership changes re-chain Squid's URL hashes (see the wire module), so a
//! parent that is down stays a member and is only skipped.
//!
//! The route lists the parents that admit the host (their `domains`) and that the caller's
//! `usable` says can take a request now, best score first, each logged `CARP` — at most
//! [`MAX_PARENTS`] of them — then the origin. Its first hop is the parent Squid would pick among those; the rest are our
//! failover order (the draft's "next highest"), where Squid has no CARP-level retry.

use meshcache_wire::carp::{carp_key, CarpArray};

use crate::hier::HierCode;
use crate::peer::{PeerId, PeerSpec, Role};
use crate::select::{Hop, Route};

/// The most parents a CARP route tries before the origin: with the origin, Squid's default
/// `forward_max_tries` (25). Their order past the first is our failover extension, and in a
/// mesh of a thousand members a longer list would only cost time.
pub const MAX_PARENTS: usize = 24;

/// How much of the CARP order [`CarpRouter::ranking`] keeps: [`MAX_PARENTS`] and us.
pub const RANKED: usize = MAX_PARENTS + 1;

/// CARP over the parents of a peer table: hashes and multipliers computed once, a route per
/// request.
#[derive(Clone, Debug)]
pub struct CarpRouter {
    array: CarpArray,
    /// Each array member's peer and configuration (for its domain list), in array order.
    members: Vec<(PeerId, PeerSpec)>,
    /// We are a member too, at this array index (after the parents): hash routing among
    /// equals, where the URLs we win are ours to fetch.
    me: Option<usize>,
}

impl CarpRouter {
    /// Builds the router from the whole peer table: the n-th spec is `PeerId(n)`; its parents
    /// become the CARP members, in table order (which breaks ties between equal weights, as
    /// Squid's configuration order does).
    pub fn new<'a>(peers: impl IntoIterator<Item = &'a PeerSpec>) -> Self {
        let members: Vec<(PeerId, PeerSpec)> = peers
            .into_iter()
            .enumerate()
            .filter(|(_, spec)| spec.role == Role::Parent)
            .map(|(i, spec)| (PeerId(i), spec.clone()))
            .collect();
        let array = CarpArray::new(
            members
                .iter()
                .map(|(_, spec)| (spec.name.as_bytes(), spec.weight)),
        );
        CarpRouter {
            array,
            members,
            me: None,
        }
    }

    /// As [`CarpRouter::new`], with us in the array as well, named `name` with `weight`: a
    /// mesh of caches that split the URL space between them (each lists the others as
    /// parents). A URL we win goes to the origin from here; one a parent wins goes to it, and
    /// that parent, computing the same order, wins it too and fetches it itself — no loop as
    /// long as every member names the members alike. Squid's chained hash depends on the
    /// members' order, so here the array is in name order (not configuration order), the same
    /// on every member whatever its own configuration lists first.
    pub fn with_self<'a>(
        peers: impl IntoIterator<Item = &'a PeerSpec>,
        name: &str,
        weight: u32,
    ) -> Self {
        let mut r = CarpRouter::new(peers);
        r.members.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let me = r
            .members
            .partition_point(|(_, spec)| spec.name.as_str() < name);
        let mut entries: Vec<(&[u8], u32)> = r
            .members
            .iter()
            .map(|(_, spec)| (spec.name.as_bytes(), spec.weight))
            .collect();
        entries.insert(me, (name.as_bytes(), weight));
        r.array = CarpArray::new(entries);
        r.me = Some(me);
        r
    }

    /// The parent at array index `i` (`None` for us).
    fn member(&self, i: usize) -> Option<&(PeerId, PeerSpec)> {
        match self.me {
            Some(me) if i == me => None,
            Some(me) if i > me => self.members.get(i - 1),
            _ => self.members.get(i),
        }
    }

    /// The hashing state: member hashes, load factors and multipliers (what Squid's `mgr:carp`
    /// page shows), members in the order of [`CarpRouter::members`].
    pub fn array(&self) -> &CarpArray {
        &self.array
    }

    /// The member parents, in array order.
    pub fn members(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.members.iter().map(|(id, _)| *id)
    }

    /// Whether the table has no parent, so that every route is [`Route::direct`].
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The parent Squid picks for `url`: the best score among the parents that admit `host`
    /// and that `usable` accepts; `None` when there is none (Squid then falls back to its
    /// other ways of choosing a parent).
    pub fn choose(&self, url: &str, host: &str, usable: impl Fn(PeerId) -> bool) -> Option<PeerId> {
        let key = carp_key(url);
        self.array
            .choose(key.as_bytes(), |i| {
                Some(i) == self.me || self.admits(i, host, &usable)
            })
            .and_then(|i| self.member(i))
            .map(|(id, _)| *id)
    }

    /// Where a request for `url` (whose host is `host`) goes: the parents that admit `host`
    /// and that `usable` accepts, best CARP score first, each with [`HierCode::Carp`], at most
    /// [`MAX_PARENTS`] of them, then the origin. The key hashed is [`carp_key`] of `url`, so
    /// `url` may be given as received or already normalised.
    ///
    /// A parent `usable` rejects is left out rather than tried last; a caller that wants
    /// [`crate::select`]'s habit of trying down parents when none is up says so through
    /// `usable`.
    pub fn route(&self, url: &str, host: &str, usable: impl Fn(PeerId) -> bool) -> Route {
        self.route_ranked(url, &self.ranking(url), host, usable)
    }

    /// The array members most preferred for `url`, best first: the first [`RANKED`] of the
    /// CARP order (fewer when the array is smaller). It depends only on the array, so every
    /// router built on equal arrays ([`CarpRouter::array`]) ranks a URL alike, and a caller
    /// that routes the same URL many times may keep it for [`CarpRouter::route_ranked`].
    pub fn ranking(&self, url: &str) -> Vec<usize> {
        self.array.top(carp_key(url).as_bytes(), RANKED)
    }

    /// [`CarpRouter::route`], given the URL's [`CarpRouter::ranking`] (from this router or
    /// another on an equal array). The ranking decides the route unless too many of its
    /// parents are unusable, when the whole order is computed from `url`.
    pub fn route_ranked(
        &self,
        url: &str,
        ranking: &[usize],
        host: &str,
        usable: impl Fn(PeerId) -> bool,
    ) -> Route {
        let mut hops = Vec::new();
        if !self.walk(ranking, host, &usable, &mut hops) && ranking.len() < self.array.len() {
            hops.clear();
            let order = self.array.order(carp_key(url).as_bytes());
            self.walk(&order, host, &usable, &mut hops);
        }
        hops.push(Hop::Direct);
        Route {
            hops,
            timed_out: false,
        }
    }

    /// Appends to `hops` the parents of `order` that may take the request, up to us (the
    /// URLs we win, or that fall to us when the better ones are unusable, we fetch) or
    /// [`MAX_PARENTS`] of them; whether either ended the walk.
    fn walk(
        &self,
        order: &[usize],
        host: &str,
        usable: &impl Fn(PeerId) -> bool,
        hops: &mut Vec<Hop>,
    ) -> bool {
        for &i in order {
            if Some(i) == self.me || hops.len() == MAX_PARENTS {
                return true;
            }
            if self.admits(i, host, usable) {
                if let Some((id, _)) = self.member(i) {
                    hops.push(Hop::Peer {
                        peer: *id,
                        code: HierCode::Carp,
                    });
                }
            }
        }
        hops.len() == MAX_PARENTS
    }

    /// Whether array member `i` may take a request for `host` now.
    fn admits(&self, i: usize, host: &str, usable: &impl Fn(PeerId) -> bool) -> bool {
        self.member(i)
            .is_some_and(|(id, spec)| spec.serves(host) && usable(*id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://www.example.com/index.html";
    const HOST: &str = "www.example.com";

    fn spec(name: &str, role: Role, weight: u32) -> PeerSpec {
        let mut s = PeerSpec::new(name, role, "127.0.0.1:1".parse().unwrap(), None);
        s.weight = weight;
        s
    }

    /// The spec's vector: p1, p2 weight 1, p3 weight 2.
    fn table() -> Vec<PeerSpec> {
        vec![
            spec("p1.example", Role::Parent, 1),
            spec("p2.example", Role::Parent, 1),
            spec("p3.example", Role::Parent, 2),
        ]
    }

    fn names(peers: &[PeerSpec], r: &Route) -> Vec<String> {
        r.hops
            .iter()
            .map(|h| match h {
                Hop::Peer { peer, code } => format!("{}:{}", peers[peer.0].name, code.as_str()),
                Hop::Direct => "DIRECT".into(),
            })
            .collect()
    }

    #[test]
    fn p3_wins_the_spec_vector() {
        let peers = table();
        let router = CarpRouter::new(&peers);
        let r = router.route(URL, HOST, |_| true);
        assert_eq!(
            names(&peers, &r),
            [
                "p3.example:CARP",
                "p1.example:CARP",
                "p2.example:CARP",
                "DIRECT"
            ]
        );
        assert!(!r.timed_out);
        assert_eq!(router.choose(URL, HOST, |_| true), Some(PeerId(2)));
        // The URL as a client may write it hashes the same.
        let r = router.route("HTTP://WWW.EXAMPLE.COM:80/index.html", HOST, |_| true);
        assert_eq!(
            r.hops[0],
            Hop::Peer {
                peer: PeerId(2),
                code: HierCode::Carp
            }
        );
    }

    #[test]
    fn a_down_parent_leaves_the_next_highest_first() {
        let peers = table();
        let router = CarpRouter::new(&peers);
        let up = |id: PeerId| id != PeerId(2);
        let r = router.route(URL, HOST, up);
        assert_eq!(
            names(&peers, &r),
            ["p1.example:CARP", "p2.example:CARP", "DIRECT"]
        );
        assert_eq!(
            router.choose(URL, HOST, up),
            Some(PeerId(0)),
            "Squid agrees"
        );
        let r = router.route(URL, HOST, |_| false);
        assert_eq!(r, Route::direct());
        assert_eq!(router.choose(URL, HOST, |_| false), None);
    }

    #[test]
    fn siblings_are_not_members_and_ids_are_kept() {
        let mut peers = table();
        peers.insert(0, spec("s1.example", Role::Sibling, 5));
        peers.insert(2, spec("s2.example", Role::Sibling, 1));
        let router = CarpRouter::new(&peers);
        assert_eq!(
            router.members().collect::<Vec<_>>(),
            [PeerId(1), PeerId(3), PeerId(4)]
        );
        let r = router.route(URL, HOST, |_| true);
        assert_eq!(
            names(&peers, &r),
            [
                "p3.example:CARP",
                "p1.example:CARP",
                "p2.example:CARP",
                "DIRECT"
            ]
        );
    }

    #[test]
    fn domain_lists_filter_without_rechaining() {
        let mut peers = table();
        peers[2].domains = vec![".br".into()];
        let router = CarpRouter::new(&peers);
        // p3 does not take www.example.com; the others keep their scores (p3 is still a member).
        let r = router.route(URL, HOST, |_| true);
        assert_eq!(
            names(&peers, &r),
            ["p1.example:CARP", "p2.example:CARP", "DIRECT"]
        );
        // It does take a .br URL when it scores best there.
        let won = (0..200)
            .map(|i| format!("http://www.site{i}.br/"))
            .filter(|u| router.choose(u, "www.site.br", |_| true) == Some(PeerId(2)))
            .count();
        assert!(won > 50, "p3 (half the weight) won {won} of 200");
    }

    /// The route as the whole CARP order spells it: usable parents before us, at most
    /// [`MAX_PARENTS`], then the origin.
    fn spelled_out(router: &CarpRouter, url: &str, usable: impl Fn(PeerId) -> bool) -> Route {
        let mut hops: Vec<Hop> = router
            .array()
            .order(carp_key(url).as_bytes())
            .into_iter()
            .take_while(|&i| Some(i) != router.me)
            .filter_map(|i| router.member(i))
            .filter(|(id, _)| usable(*id))
            .map(|(id, _)| Hop::Peer {
                peer: *id,
                code: HierCode::Carp,
            })
            .take(MAX_PARENTS)
            .collect();
        hops.push(Hop::Direct);
        Route {
            hops,
            timed_out: false,
        }
    }

    #[test]
    fn long_routes_stop_at_max_parents_and_a_short_ranking_falls_back() {
        let peers: Vec<PeerSpec> = (0..60)
            .map(|i| spec(&format!("p{i}.example"), Role::Parent, 1))
            .collect();
        for router in [
            CarpRouter::new(&peers),
            CarpRouter::with_self(&peers, "me.example", 1),
        ] {
            for u in 0..200 {
                let url = format!("http://o.test/{u}");
                let ranking = router.ranking(&url);
                assert_eq!(ranking.len(), RANKED);
                for down in [0, 1, 10, 40, 60] {
                    // The `down` best-ranked parents unusable: from 2 on, the ranking alone
                    // cannot fill the route, and the whole order is computed.
                    let out: Vec<PeerId> = router
                        .array()
                        .order(carp_key(&url).as_bytes())
                        .into_iter()
                        .filter_map(|i| router.member(i).map(|m| m.0))
                        .take(down)
                        .collect();
                    let usable = |id: PeerId| !out.contains(&id);
                    let route = router.route_ranked(&url, &ranking, "o.test", usable);
                    assert_eq!(route, spelled_out(&router, &url, usable), "{url} {down}");
                    assert!(route.hops.len() <= MAX_PARENTS + 1);
                    assert_eq!(route, router.route(&url, "o.test", usable));
                }
            }
        }
    }

    #[test]
    fn no_parent_goes_direct() {
        let peers = vec![spec("s", Role::Sibling, 1)];
        let router = CarpRouter::new(&peers);
        assert!(router.is_empty());
        assert_eq!(router.route(URL, HOST, |_| true), Route::direct());
    }

    #[test]
    fn multipliers_are_squids() {
        let router = CarpRouter::new(&table());
        let m: Vec<String> = router
            .array()
            .members()
            .iter()
            .map(|m| format!("{:08x} {:.6}", m.hash, m.multiplier))
            .collect();
        assert_eq!(
            m,
            [
                "73558761 0.908560",
                "11cc3dc5 0.908560",
                "c393ae98 1.211414"
            ]
        );
    }

    #[test]
    fn a_member_of_its_own_array_fetches_what_it_wins() {
        let peers = [spec("b", Role::Parent, 1), spec("c", Role::Parent, 1)];
        let me = CarpRouter::with_self(&peers, "a", 1);
        let b = CarpRouter::with_self(
            &[spec("a", Role::Parent, 1), spec("c", Role::Parent, 1)],
            "b",
            1,
        );
        let mut won = [0usize; 3];
        for i in 0..3000 {
            let url = format!("http://o.test/{i}");
            let route = me.route(&url, "o.test", |_| true);
            match route.hops[0] {
                Hop::Direct => won[0] += 1,
                Hop::Peer { peer, code } => {
                    assert_eq!(code, HierCode::Carp);
                    won[1 + peer.0] += 1;
                    if peer.0 == 0 {
                        // b computes the same order: it wins the URL itself.
                        assert_eq!(b.route(&url, "o.test", |_| true).hops[0], Hop::Direct);
                    }
                }
            }
            // With every parent down, everything is ours.
            assert_eq!(me.route(&url, "o.test", |_| false).hops, vec![Hop::Direct]);
        }
        for w in won {
            assert!((800..1200).contains(&w), "{won:?}");
        }
    }
}
