//! The aggregate ICP model (`protocol.icp_model = "aggregate"`): a search's queries and
//! replies are computed together, when the search starts, instead of travelling as one event
//! per datagram.
//!
//! A 100-cache ICP mesh sends 2 × 99 datagrams per miss; as events they bound the simulator
//! to a few million datagrams, tens of thousands of requests, per second. Most of those
//! datagrams decide nothing: the search ends at the first HIT, or after the last MISS. So this
//! model works out only the replies that can decide — the holders' (from an index of which
//! node holds what, kept from the stores' events) and, when no HIT comes, the last target's
//! and the parents' — from the same sending order, CPU, interface and network model as the
//! per-datagram engine, and charges every other responder its CPU and interface time as
//! background work that its next busy period absorbs (a node idle long enough absorbs it
//! entirely). The route is decided by the node's `IcpMesh` ([`IcpMesh::route_after`]), as
//! the proxy decides it.
//!
//! What is the same as the per-datagram engine: which peers are asked (every sibling, and the
//! parents when at least two may serve the host), who answers HIT, which HIT wins when the
//! mesh is idle (the first holder in query order), the fallback to the best parent or the
//! origin, the wait of a node that has not heard from its peers yet, the deadline, and every
//! count (datagrams and bytes by kind, per node sent and received, CPU). What is approximated:
//! a responder's reply is timed against its backlog when the search starts (the per-datagram
//! engine sees its backlog when the query arrives, some hundreds of µs later); responders
//! that decide nothing are assumed no busier than the last target; peers' ICP counters and
//! round-trip times in the `IcpMesh` tables are not kept per peer (one running round trip
//! per node sets the deadline). `tests/engine.rs` checks the agreement.
//!
//! The multicast protocol's group queries take the same shortcut ([`Fanout::group_query`],
//! [`Fanout::first_reply`]): the silent members' receives are background work, and of the holders only
//! the one whose HIT would be read first gets the query as an event; the others' HITs are
//! background work too.
//!
//! The engine lends the model what it reads and books — the spec, the trace, the nodes, the
//! shared network, the traffic counters — as a [`World`]; a search returns its [`Decision`],
//! which the engine follows or schedules. Nothing here imports the engine.
//!
//! [`IcpMesh::route_after`]: meshcache_dcm::IcpMesh::route_after

use std::time::Instant;

use meshcache_dcm::{PeerId, Route};
use smallvec::SmallVec;

use crate::counters::{Kind, Traffic};
use crate::mesh::{Node, NodeIx};
use crate::net::{self, icp_query_bytes, icp_reply_bytes, ns, Link, UDP_IP};
use crate::spec::SimSpec;
use crate::trace::Trace;

/// What the model reads and books of a simulation, lent by the engine for one call.
pub(crate) struct World<'a> {
    pub(crate) spec: &'a SimSpec,
    pub(crate) trace: &'a Trace,
    /// The `Instant` of virtual time 0.
    pub(crate) base: Instant,
    pub(crate) nodes: &'a mut [Node],
    /// The shared network between proxies.
    pub(crate) net: &'a mut Link,
    pub(crate) traffic: &'a mut Traffic,
}

impl World<'_> {
    /// Virtual time `t` as the `Instant` the dcm machines take.
    fn at(&self, t: u64) -> Instant {
        self.base + std::time::Duration::from_nanos(t)
    }
}

/// An aggregate search's outcome: the route, and when it is decided (at once when not after
/// the request's own time).
pub(crate) struct Decision {
    pub(crate) route: Route,
    pub(crate) when: u64,
}

/// The aggregate model's state.
#[derive(Default)]
pub(crate) struct Fanout {
    /// Per object: the nodes that stored it, in node order (which is query order). Evictions
    /// are not followed here: a search checks a listed node's store when it gets to it and
    /// drops the node if it no longer holds the object, which costs less than looking up
    /// every evicted key.
    holders: Vec<SmallVec<[NodeIx; 2]>>,
    /// Background work every leaf owes for answering its siblings' searches, summed over all
    /// searches so far: CPU ns, interface ns, datagrams received (one sent back for each).
    shared: Owed,
    /// Background work every node owes for the multicast group's queries it received and
    /// did not answer (it does not hold the object), summed over all queries so far.
    group: Owed,
    /// Per node: how much of `shared` it has taken on (or was never asked: its own searches),
    /// and what it owes on its own (a parent's answers, a node's replies to read).
    nodes: Vec<NodeOwed>,
    /// Per node, a bit per node it lists as a peer (whose multicast queries it answers).
    lists: Vec<Vec<u64>>,
}

#[derive(Clone, Copy, Default)]
struct Owed {
    /// CPU, ns.
    cpu: u64,
    /// Interface time, ns.
    nic: u64,
    /// Queries answered (one datagram in, one out).
    answered: u64,
    /// Queries received and not answered (one datagram in).
    silent: u64,
}

impl Owed {
    /// One query answered: two datagrams of CPU (`c` each: the query in, the reply out) and
    /// the reply's time on the interface.
    fn answer(&mut self, c: u64, reply_tx: u64) {
        self.cpu += 2 * c;
        self.nic += reply_tx;
        self.answered += 1;
    }

    /// One query received and not answered: a datagram's CPU.
    fn ignore(&mut self, c: u64) {
        self.cpu += c;
        self.silent += 1;
    }
}

#[derive(Clone, Copy, Default)]
struct NodeOwed {
    /// The part of [`Fanout::shared`] already settled (or not owed).
    taken: Owed,
    /// The part of [`Fanout::group`] already settled (or not owed).
    taken_group: Owed,
    /// Work of its own not yet settled.
    own: Owed,
    /// Replies to its own searches it read, not yet counted.
    replies_read: u64,
    /// Queries it sent, not yet counted.
    queries_sent: u64,
    /// When it has heard from its peers (its first search's replies are in): before that, a
    /// search sends its queries but does not wait, as `IcpMesh` does for peers not yet alive.
    alive_from: Option<u64>,
    /// Running mean ICP round trip, ms (over at most 50 searches, as Squid and `Peer`
    /// average), and its sample count.
    rtt_ms: Option<u32>,
    rtt_samples: u32,
}

impl Fanout {
    pub(crate) fn new(nodes: &[Node], objects: usize) -> Fanout {
        let words = nodes.len().div_ceil(64);
        let lists = nodes
            .iter()
            .map(|n| {
                let mut bits = vec![0u64; words];
                for &p in &n.peer_nodes {
                    bits[p as usize / 64] |= 1 << (p % 64);
                }
                bits
            })
            .collect();
        Fanout {
            holders: vec![SmallVec::new(); objects],
            nodes: vec![NodeOwed::default(); nodes.len()],
            lists,
            ..Fanout::default()
        }
    }

    /// Whether `node` lists `peer` in its peer table.
    fn lists(&self, node: NodeIx, peer: NodeIx) -> bool {
        self.lists[node as usize][peer as usize / 64] & (1 << (peer % 64)) != 0
    }

    /// `node` stored object `obj`.
    pub(crate) fn stored(&mut self, node: NodeIx, obj: u32) {
        let list = &mut self.holders[obj as usize];
        if let Err(at) = list.binary_search(&node) {
            list.insert(at, node);
        }
    }
}

/// One target of a search: the peer in `node`'s table, and the node behind it.
#[derive(Clone, Copy)]
struct Target {
    peer: PeerId,
    node: NodeIx,
    /// Its place in the order queries are sent.
    index: u64,
}

impl Fanout {
    /// Takes on what `node` (`n`) owes: CPU and interface time as backlog (absorbed by idle
    /// time since its CPU or interface was last free), datagrams as counts.
    pub(crate) fn settle(&mut self, spec: &SimSpec, node: NodeIx, n: &mut Node) {
        let o = &mut self.nodes[node as usize];
        let leaf = node < spec.mesh.caches && spec.mesh.siblings;
        let mut due = o.own;
        o.own = Owed::default();
        if leaf {
            due.cpu += self.shared.cpu - o.taken.cpu;
            due.nic += self.shared.nic - o.taken.nic;
            due.answered += self.shared.answered - o.taken.answered;
            o.taken = self.shared;
        }
        due.cpu += self.group.cpu - o.taken_group.cpu;
        due.silent += self.group.silent - o.taken_group.silent;
        o.taken_group = self.group;
        let read = std::mem::take(&mut o.replies_read);
        let sent = std::mem::take(&mut o.queries_sent);
        if due.cpu == 0
            && due.nic == 0
            && due.answered == 0
            && due.silent == 0
            && read == 0
            && sent == 0
        {
            return;
        }
        n.cpu_free += due.cpu;
        n.stats.cpu_ns += due.cpu;
        n.nic.absorb(due.nic);
        n.stats.datagrams_received += due.answered + due.silent + read;
        n.stats.datagrams_sent += due.answered + sent;
    }

    /// Settles every node (before the results are read).
    pub(crate) fn settle_all(&mut self, spec: &SimSpec, nodes: &mut [Node]) {
        for (i, n) in nodes.iter_mut().enumerate() {
            self.settle(spec, i as NodeIx, n);
        }
    }

    /// A multicast query for `obj` from `node` to the group every node has joined, in the
    /// aggregate model: the holders of `obj` (other than `node`, in node order), whose copies
    /// travel as events and are answered as the per-datagram engine answers them; every other
    /// member receives its copy as background work (a datagram's CPU, one datagram in), and keeps
    /// silent, as a member that does not hold the object does. Unlike the per-datagram engine, the
    /// silent members' multicast and peer-table query counters are not kept.
    pub(crate) fn group_query(
        &mut self,
        w: &World<'_>,
        node: NodeIx,
        obj: u32,
    ) -> SmallVec<[NodeIx; 4]> {
        let key = &w.trace.objects[obj as usize].key;
        let c = ns(w.spec.net.cpu_datagram);
        let nodes = &w.nodes;
        self.holders[obj as usize].retain(|h| nodes[*h as usize].store.contains(key));
        let holders: SmallVec<[NodeIx; 4]> = self.holders[obj as usize]
            .iter()
            .copied()
            .filter(|&h| h != node)
            .collect();
        self.group.ignore(c);
        for &n in holders.iter().chain([&node]) {
            self.nodes[n as usize].taken_group.ignore(c);
        }
        holders
    }

    /// When the reply (`reply` bytes) of `to` to a query from `node` that reached it at `arrives`
    /// is read at `node`: two datagrams of CPU at `to` (the query in, the reply out) after its
    /// backlog, its interface and the shared network as they stand now, then a datagram's CPU at
    /// `node`.
    fn reply_read_at(
        &mut self,
        w: &mut World<'_>,
        node: NodeIx,
        to: NodeIx,
        arrives: u64,
        reply: u64,
    ) -> u64 {
        self.settle(w.spec, to, &mut w.nodes[to as usize]);
        let net = &w.spec.net;
        let (c, lat) = (ns(net.cpu_datagram), ns(net.latency));
        let r = &w.nodes[to as usize];
        let answered = arrives.max(r.cpu_free) + 2 * c;
        let out = r.nic.peek(answered, reply + UDP_IP, net.proxy_bandwidth);
        let crossed = w.net.peek(out, reply + UDP_IP, net.network_bandwidth) + lat;
        crossed.max(w.nodes[node as usize].cpu_free) + c
    }

    /// The HITs of `holders` to a multicast group query from `node` that reached them at
    /// `arrives`, in the aggregate model (a holder that does not list `node` as a peer drops the
    /// query, as background work): the holder whose reply (`reply` bytes) would be read
    /// first is returned, to get the query as an event and answer it through its `Multicast`
    /// machine; the others' HITs, which decide nothing (the search has ended when they come), are
    /// background work as an ICP responder's: two datagrams of CPU and a reply's interface time at
    /// each, the network's time, and a datagram's CPU at `node` for each reply it reads. Not kept:
    /// the late HITs' marks in `node`'s peer table (its per-peer counters, and liveness).
    pub(crate) fn first_reply(
        &mut self,
        w: &mut World<'_>,
        node: NodeIx,
        holders: &[NodeIx],
        arrives: u64,
        reply: u64,
    ) -> Option<NodeIx> {
        // A holder answers only a member of its own peer table (`Multicast::on_query`); the
        // others receive the query and drop it.
        let (answering, dropping): (SmallVec<[NodeIx; 4]>, SmallVec<[NodeIx; 4]>) =
            holders.iter().copied().partition(|&h| self.lists(h, node));
        let c = ns(w.spec.net.cpu_datagram);
        for &h in &dropping {
            self.nodes[h as usize].own.ignore(c);
        }
        let holders = &answering[..];
        let mut first: Option<(u64, NodeIx)> = None;
        for &h in holders {
            let when = self.reply_read_at(w, node, h, arrives, reply);
            if first.is_none_or(|(w, _)| when < w) {
                first = Some((when, h));
            }
        }
        let (_, first) = first?;
        let rest = holders.len() as u64 - 1;
        if rest > 0 {
            let net = &w.spec.net;
            let reply_tx = net::wire(reply + UDP_IP, net.proxy_bandwidth);
            w.net
                .absorb(rest * net::wire(reply + UDP_IP, net.network_bandwidth));
            w.traffic.count_many(Kind::Multicast, rest, reply);
            for &h in holders.iter().filter(|&&h| h != first) {
                self.nodes[h as usize].own.answer(c, reply_tx);
            }
            let me = &mut self.nodes[node as usize];
            me.own.cpu += rest * c;
            me.replies_read += rest;
        }
        Some(first)
    }

    /// An ICP search for request `req`'s object `obj`, a miss at `node` whose request was handled
    /// at `t`: queries booked, the deciding replies timed, the route decided.
    pub(crate) fn search(
        &mut self,
        w: &mut World<'_>,
        req: u32,
        node: NodeIx,
        obj: u32,
        t: u64,
    ) -> Decision {
        let trace = w.trace;
        let r = &trace.requests[req as usize];
        let at = w.at(t);
        let caches = w.spec.mesh.caches;
        let n = &w.nodes[node as usize];
        let peers = n.engine.mesh().peers();
        // The host matters only to parents (their domains): the object's record is not read
        // for a mesh of siblings.
        let host: &str = if n.engine.mesh().parents().is_empty() {
            ""
        } else {
            &trace.objects[obj as usize].host
        };
        // Siblings (every other leaf, in table order), then the parents that may serve the host.
        let siblings = if node < caches && w.spec.mesh.siblings {
            u64::from(caches - 1)
        } else {
            0
        };
        let parents: SmallVec<[Target; 4]> =
            meshcache_dcm::select::eligible_among(peers, n.engine.mesh().parents(), host, at)
                .into_iter()
                .filter(|id| peers[id.0].spec.queried())
                .enumerate()
                .map(|(k, peer)| Target {
                    peer,
                    node: n.peer_nodes[peer.0],
                    index: siblings + k as u64,
                })
                .collect();
        if siblings == 0 && parents.len() < 2 {
            // Nothing to ask whose answer could change the route.
            let route = w.nodes[node as usize]
                .engine
                .mesh_mut()
                .route_after(at, host, None, None, false);
            return Decision { route, when: t };
        }
        let count = siblings + parents.len() as u64;
        let net = &w.spec.net;
        let (c, lat) = (ns(net.cpu_datagram), ns(net.latency));
        let (proxy_bw, net_bw) = (net.proxy_bandwidth, net.network_bandwidth);
        let query = icp_query_bytes(r.url_len as usize);
        let reply = icp_reply_bytes(r.url_len as usize);

        // The queries leave one after the other: CPU, the node's interface, the shared network.
        self.settle(w.spec, node, &mut w.nodes[node as usize]);
        let sent_last = w.nodes[node as usize].book_cpu(t, count * c);
        let sent = |i: u64| sent_last - (count - 1 - i) * c;
        let nic = w.nodes[node as usize].nic.book_train(
            sent(0),
            sent_last,
            count,
            query + UDP_IP,
            proxy_bw,
        );
        let left = |i: u64| nic.out(i, sent(i));
        let wire = w
            .net
            .book_train(left(0), left(count - 1), count, query + UDP_IP, net_bw);
        let arrives = |i: u64| wire.out(i, left(i)) + lat;

        // When the reply of target `i` at `to` is read at `node`.
        let replied = |f: &mut Fanout, w: &mut World<'_>, i: u64, to: NodeIx| {
            f.reply_read_at(w, node, to, arrives(i), reply)
        };

        // Which targets hold the object.
        let target_of = |h: NodeIx| -> Option<Target> {
            if h < caches {
                (siblings > 0 && h != node).then(|| {
                    let index = u64::from(if h < node { h } else { h - 1 });
                    Target {
                        peer: PeerId(index as usize),
                        node: h,
                        index,
                    }
                })
            } else {
                parents.iter().copied().find(|p| p.node == h)
            }
        };
        // The first HIT: holders in query order, until the next could not reply sooner even
        // with no queue anywhere.
        let soonest_reply =
            3 * c + net::wire(reply + UDP_IP, proxy_bw) + net::wire(reply + UDP_IP, net_bw) + lat;
        let listed = self.holders[obj as usize].clone();
        let mut gone: SmallVec<[NodeIx; 4]> = SmallVec::new();
        let mut first_hit: Option<(u64, Target)> = None;
        for h in listed.iter().filter_map(|&h| target_of(h)) {
            if first_hit.is_some_and(|(w, _)| arrives(h.index) + soonest_reply >= w) {
                break;
            }
            if !w.nodes[h.node as usize].store.contains(&r.key) {
                gone.push(h.node);
                continue;
            }
            let when = replied(self, w, h.index, h.node);
            if first_hit.is_none_or(|(w, _)| when < w) {
                first_hit = Some((when, h));
            }
        }
        if !gone.is_empty() {
            self.holders[obj as usize].retain(|h| !gone.contains(h));
        }
        // The replies cross the shared network; the last ones queue behind the others (the
        // holders' above were timed against the backlog before them).
        let reply_net = net::wire(reply + UDP_IP, net_bw);
        w.net.absorb(count * reply_net);
        // Without a HIT: the last reply, and the parents' MISSes ranked as `IcpMesh` ranks them.
        let last = Target {
            peer: PeerId(0),
            node: if siblings > 0 {
                let i = count - 1 - parents.len() as u64;
                // Sibling index `i`, as `target_of` numbers them.
                let n = i as NodeIx;
                if n >= node {
                    n + 1
                } else {
                    n
                }
            } else {
                parents[parents.len() - 1].node
            },
            index: if siblings > 0 {
                siblings - 1
            } else {
                count - 1
            },
        };
        let mut all_in = replied(self, w, last.index, last.node);
        let mut misses: SmallVec<[(u64, u64, PeerId); 4]> = SmallVec::new();
        for p in &parents {
            let when = replied(self, w, p.index, p.node);
            all_in = all_in.max(when);
            let weight = u64::from(
                w.nodes[node as usize].engine.mesh().peers()[p.peer.0]
                    .spec
                    .weight
                    .max(1),
            );
            misses.push((when, (when - t) / 1_000 / weight, p.peer));
        }

        // Everyone's work: each target answers (two datagrams of CPU, a reply on its interface),
        // the node reads every reply.
        let reply_tx = net::wire(reply + UDP_IP, proxy_bw);
        let f = &mut *self;
        if siblings > 0 {
            f.shared.answer(c, reply_tx);
            f.nodes[node as usize].taken.answer(c, reply_tx);
        }
        for p in &parents {
            f.nodes[p.node as usize].own.answer(c, reply_tx);
        }
        let me = &mut f.nodes[node as usize];
        me.own.cpu += count * c;
        me.replies_read += count;
        me.queries_sent += count;
        let alive = me.alive_from.is_some_and(|from| from <= t);
        if me.alive_from.is_none() {
            me.alive_from = Some(all_in);
        }
        // The deadline: twice the mean round trip, within the floor and the ceiling.
        let spec = &w.spec.protocol;
        let wait = match me.rtt_ms {
            Some(ms) => std::time::Duration::from_millis(2 * u64::from(ms))
                .clamp(spec.icp_timeout_floor, spec.icp_timeout_ceiling),
            None => spec.icp_timeout_ceiling,
        };
        let rtt = std::time::Duration::from_nanos(all_in - t);
        let ms = u32::try_from(rtt.as_millis()).unwrap_or(u32::MAX).max(1);
        if ms <= 10_000 {
            me.rtt_samples = (me.rtt_samples + 1).min(50);
            let k = me.rtt_samples;
            me.rtt_ms = Some(me.rtt_ms.map_or(ms, |avg| (avg * (k - 1) + ms) / k));
        }
        let deadline = t + ns(wait);
        w.traffic.count_many(Kind::IcpQuery, count, query);
        w.traffic.count_many(Kind::IcpReply, count, reply);

        // Nobody known to be alive yet: the queries go (their replies revive the peers), the
        // request does not wait.
        let (when, hit, timed_out) = if !alive {
            (t, None, false)
        } else if let Some((when, hit)) = first_hit.filter(|(w, _)| *w <= deadline) {
            (when, Some(hit.peer), false)
        } else {
            (all_in.min(deadline), None, all_in > deadline)
        };
        let best = if hit.is_none() && alive {
            misses
                .iter()
                .filter(|(w, _, _)| *w <= when)
                .min_by_key(|(_, score, _)| *score)
                .map(|(_, _, peer)| *peer)
        } else {
            None
        };
        let at = w.at(when);
        let route = w.nodes[node as usize]
            .engine
            .mesh_mut()
            .route_after(at, host, hit, best, timed_out);
        Decision { route, when }
    }
}
