//! The discrete-event engine: a virtual clock, an event queue, and the life of every request
//! through the mesh.
//!
//! A client request reaches its cache (client `c` → leaf `c mod caches`, or a leaf at random
//! per request with `mesh.admission = "random"`), which looks in its
//! store; a miss joins a fetch already under way for the same object (collapsed forwarding)
//! or starts the protocol's search — the `meshcache-dcm` machine of the node, called exactly
//! as the proxy's cooperation driver calls it — and then tries the route's hops in order: a
//! sibling is asked `only-if-cached` (a miss there answers 504 and the next hop is tried), a
//! parent serves or fetches, the origin always serves. Responses are stored (unless the peer
//! is `proxy_only` or the object is not cacheable), which emits the store's events to the
//! protocol, and go back hop by hop to the client.
//!
//! Time: every datagram and HTTP exchange costs CPU at both ends (a FIFO server per node,
//! whose backlog is the node's queueing delay), serialization on the sender's interface and
//! on the shared network between proxies, and the link's latency. Protocol state changes take
//! effect when a message arrives; what the node sends in answer leaves when its CPU is done.
//! `meshcache-dcm` takes `std::time::Instant`s: virtual time `t` ns is `base + t`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use meshcache_dcm::engine::{Miss, Progress, SearchProtocol, Send, Step};
use meshcache_dcm::icp::{answer, Outcome};
use meshcache_dcm::multicast::Destination;
use meshcache_dcm::protocols::IcpSearch;
use meshcache_dcm::{Hop, IcpMesh, PeerId, Reply, ReplyKind, Role, Route};
use meshcache_store::StoreEvent;
use smallvec::SmallVec;

use crate::counters::{Classified, Kind, Outcome as Answered, Traffic};
use crate::fanout::{Decision, Fanout, World};
use crate::mesh::{self, icp_addr, node_at, Node, NodeIx};
use crate::net::{icp_query_bytes, icp_reply_bytes, ns, wire, Link, UDP_IP};
use crate::proto::{multicast, Cx, Effect, McMsg, Msg, Upkeep};
use crate::results::Results;
use crate::spec::{Admission, IcpModel, Protocol, Replay, SimSpec};
use crate::trace::Trace;

/// Where a response came from, as the requester sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// From this node's store.
    Store(NodeIx),
    /// Joined a fetch under way at this node (collapsed forwarding).
    Collapsed(NodeIx),
    /// From the origin (directly, or through parents that missed).
    Origin,
    /// `only-if-cached` and not held: 504.
    Refused,
}

/// Who is waiting for a job's response.
#[derive(Clone, Copy, Debug)]
enum From {
    /// The client of trace request `req`, issued at `issued`.
    Client { req: u32, issued: u64 },
    /// Another node's job.
    Peer(u32),
}

/// A request being handled at one node.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) node: NodeIx,
    pub(crate) req: u32,
    from: From,
    only_if_cached: bool,
    hops: Vec<Hop>,
    next: usize,
    /// The peer hop in progress.
    pub(crate) current: Option<PeerId>,
}

/// Something that happens at a virtual time.
#[derive(Debug)]
pub(crate) enum Ev {
    /// Trace request `req` is issued (timed replay, and serial replay with a gap).
    Issue { req: u32 },
    /// The warm-up is over and the mesh has been quiet for [`WARMUP_PAUSE`]: the measured
    /// replay starts.
    Measure,
    /// A job's request reaches its node.
    Arrive { job: u32 },
    /// A datagram reaches `to`.
    Datagram {
        to: NodeIx,
        from: NodeIx,
        payload: Payload,
    },
    /// The ICP wait of search `reqnum` at `node` ends.
    Deadline { node: NodeIx, reqnum: u32 },
    /// The response to `job`'s current hop arrives at its node.
    Response { job: u32, served: Served },
    /// The client of `req`, issued at `issued`, has its whole response.
    ClientDone {
        req: u32,
        issued: u64,
        served: Served,
        node: NodeIx,
    },
    /// A protocol's timer at `node` (digest rebuilds and fetches, directory upkeep).
    Tick { node: NodeIx },
    /// A protocol's periodic timer at `node` that does not keep the run going (the
    /// directory's renewal): the run ends when only these are left, and serial replay does
    /// not wait for them. Handled as a [`Ev::Tick`].
    Timer { node: NodeIx },
    /// An aggregate ICP search ([`crate::fanout`]) is decided: `job` follows `route`.
    Decided { job: u32, route: Route },
    /// A protocol's HTTP message (a summary or digest fetch, or its response, with `body`
    /// bytes) reaches `to`.
    Http {
        to: NodeIx,
        from: NodeIx,
        body: u64,
        msg: crate::proto::Msg,
    },
}

/// What a datagram carries.
#[derive(Debug)]
pub(crate) enum Payload {
    /// ICP_OP_QUERY for an object.
    IcpQuery { obj: u32, reqnum: u32 },
    /// The reply.
    IcpReply {
        obj: u32,
        reqnum: u32,
        kind: ReplyKind,
    },
    /// A protocol's own message (summary updates, directory operations, multicast queries).
    Proto(crate::proto::Msg),
}

/// The pause between the warm-up going quiet and the measured replay, as the lab pauses after
/// its pre-warm round (300 ms): the protocols' timers (the summary's 250 ms drain) then stand
/// where they stand in a live run when it starts measuring, not at the start of a period.
const WARMUP_PAUSE: u64 = 300_000_000;

/// A well-mixed 64-bit hash of `x` (SplitMix64's finalizer).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reports progress and honours interruption.
pub struct Control<'a> {
    /// Set to stop the run early; what was measured so far is reported.
    pub stop: &'a AtomicBool,
    /// Called now and then with the number of requests answered.
    pub progress: &'a mut dyn FnMut(u64),
}

/// A simulation in progress.
pub struct Sim<'a> {
    pub(crate) spec: &'a SimSpec,
    pub(crate) trace: &'a Trace,
    pub(crate) nodes: Vec<Node>,
    base: Instant,
    pub(crate) now: u64,
    seq: u64,
    /// Pending events by (time, sequence, slot in `events`): the heap moves 24-byte keys,
    /// whatever an event's size. (A radix heap keyed by time and sequence was tried: 1.7
    /// times slower on a 100-cache ICP mesh.)
    queue: BinaryHeap<Reverse<(u64, u64, u32)>>,
    events: Vec<Option<Ev>>,
    free_events: Vec<u32>,
    /// Events in the queue that are neither ICP deadlines nor protocol timers (serial replay
    /// waits until none is left).
    work: u64,
    /// [`Ev::Timer`]s in the queue.
    timers: u64,
    jobs: Vec<Option<Job>>,
    free_jobs: Vec<u32>,
    /// Closed loop: each client's requests, and how far it has gone.
    per_client: Vec<Vec<u32>>,
    cursor: Vec<usize>,
    /// Timed and serial replay: the next trace request to issue.
    next_req: usize,
    waiting_serial: bool,
    /// The first `warmup` requests are replayed first and not measured: each client's in
    /// order, the clients at once (as the lab's pre-warm round), then the mesh goes quiet.
    warmup: usize,
    /// Per client, its warm-up requests still to issue (last first).
    warm_per_client: Vec<Vec<u32>>,
    /// Warm-up requests not answered yet.
    warm_left: usize,
    warming: bool,
    /// When measurement started (the end of the warm-up).
    measure_from: u64,
    /// Timed replay after a warm-up: added to the trace's times, so that the measured
    /// requests keep their spacing instead of all being late.
    time_offset: u64,
    /// When the last client got its answer: the end of the simulated time (deadlines of
    /// searches decided long before may still be pending after it, and do not count).
    last_answer: u64,
    /// The shared network between proxies.
    pub(crate) net: Link,
    origin_free: Vec<u64>,
    classified: Classified,
    pub(crate) traffic: Traffic,
    latency: Histogram<u64>,
    /// The protocol's own per-node state (summaries, directory, multicast).
    pub(crate) proto: crate::proto::State,
    /// The aggregate ICP model's state, when it is the one chosen.
    pub(crate) fanout: Option<Fanout>,
    /// A store's events of the insert being handled (the buffer is reused).
    store_events: Vec<StoreEvent>,
    /// What the protocols' upkeep asked for, being carried out (the buffer is reused).
    effects: Vec<Effect>,
}

impl<'a> Sim<'a> {
    /// A mesh built from `spec`, ready to replay `trace`.
    pub fn new(spec: &'a SimSpec, trace: &'a Trace) -> Sim<'a> {
        Sim::with_protocol(spec, trace, |node, mesh| {
            crate::proto::search_protocol(spec, node, mesh)
        })
    }

    /// As [`Sim::new`], each node searching by what `protocol` gives it (given its index and
    /// peer table) instead of by `spec`'s protocol: a protocol of the caller's, run as the
    /// built-in ones are. `spec` still says which upkeep runs beside it (summaries, directory
    /// timers).
    pub fn with_protocol(
        spec: &'a SimSpec,
        trace: &'a Trace,
        protocol: impl FnMut(NodeIx, &IcpMesh) -> Box<dyn SearchProtocol>,
    ) -> Sim<'a> {
        let nodes = mesh::build(spec, protocol);
        let base = Instant::now();
        let proto = crate::proto::State::new(spec, &nodes, trace.objects.len(), base);
        let fanout = (matches!(spec.protocol.name, Protocol::Icp | Protocol::Multicast)
            && spec.protocol.icp_model == IcpModel::Aggregate)
            .then(|| Fanout::new(&nodes, trace.objects.len()));
        let mut per_client = vec![Vec::new(); trace.clients as usize];
        let warmup = (spec.replay.warmup as usize).min(trace.requests.len());
        let mut warm_per_client = vec![Vec::new(); trace.clients as usize];
        for (i, r) in trace.requests.iter().enumerate() {
            if i < warmup {
                warm_per_client[r.slot as usize].push(i as u32);
            } else if spec.replay.mode == Replay::Closed {
                per_client[r.slot as usize].push(i as u32);
            }
        }
        for list in &mut warm_per_client {
            list.reverse();
        }
        Sim {
            spec,
            trace,
            nodes,
            base,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free_events: Vec::new(),
            work: 0,
            timers: 0,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            cursor: vec![0; per_client.len()],
            per_client,
            next_req: warmup,
            waiting_serial: false,
            warmup,
            warm_per_client,
            warm_left: warmup,
            warming: warmup > 0,
            measure_from: 0,
            time_offset: 0,
            last_answer: 0,
            net: Link::default(),
            origin_free: vec![0; spec.net.origin_servers as usize],
            classified: Classified::default(),
            traffic: Traffic::default(),
            latency: crate::results::latency_histogram(),
            fanout,
            proto,
            store_events: Vec::new(),
            effects: Vec::new(),
        }
    }

    /// Runs the trace to the end (or until `control.stop` is set) and reports.
    pub fn run(mut self, control: Control<'_>) -> Results {
        let wall = Instant::now();
        self.upkeep(crate::proto::start);
        let mut interrupted = false;
        if self.warming {
            for c in 0..self.warm_per_client.len() {
                self.warm_next_of(c as u32, self.now);
            }
        } else {
            self.start_replay();
        }
        let mut steps: u64 = 0;
        loop {
            steps += 1;
            if steps % 65_536 == 0 {
                (control.progress)(self.classified.requests);
                if control.stop.load(Ordering::Relaxed) {
                    interrupted = true;
                    break;
                }
            }
            if self.waiting_serial && self.work == 0 {
                self.waiting_serial = false;
                if self.warming {
                    self.schedule(self.now + WARMUP_PAUSE, Ev::Measure);
                } else {
                    self.issue_serial();
                }
                continue;
            }
            if self.queue.len() as u64 == self.timers {
                // Only periodic timers left: nothing more will happen.
                break;
            }
            let Some(Reverse((t, _, slot))) = self.queue.pop() else {
                break;
            };
            let ev = self.events[slot as usize].take().expect("queued event");
            self.free_events.push(slot);
            match ev {
                Ev::Deadline { .. } => {}
                Ev::Timer { .. } => self.timers -= 1,
                _ => self.work -= 1,
            }
            self.now = t;
            self.handle(ev);
        }
        (control.progress)(self.classified.requests);
        self.settle_all();
        let wall = wall.elapsed();
        let mut results = crate::results::build(
            self.spec,
            self.trace,
            &self.nodes,
            self.classified.clone(),
            self.traffic.clone(),
            &self.latency,
            self.last_answer.saturating_sub(self.measure_from),
            wall,
            interrupted,
        );
        self.upkeep(|cx| crate::proto::report(cx, &mut results));
        results
    }

    /// Virtual time `t` as the `Instant` the dcm machines take.
    pub(crate) fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    pub(crate) fn schedule(&mut self, t: u64, ev: Ev) {
        match ev {
            Ev::Deadline { .. } => {}
            Ev::Timer { .. } => self.timers += 1,
            _ => self.work += 1,
        }
        self.seq += 1;
        let slot = match self.free_events.pop() {
            Some(slot) => {
                self.events[slot as usize] = Some(ev);
                slot
            }
            None => {
                self.events.push(Some(ev));
                (self.events.len() - 1) as u32
            }
        };
        self.queue.push(Reverse((t, self.seq, slot)));
    }

    /// Sets a periodic protocol timer of `node` for `t` ([`Ev::Timer`]).
    pub(crate) fn schedule_timer(&mut self, t: u64, node: NodeIx) {
        self.schedule(t, Ev::Timer { node });
    }

    /// Virtual time of an `Instant` the dcm machines returned.
    pub(crate) fn virtual_ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs `cost` on `node`'s CPU from `t`: when it is done.
    pub(crate) fn cpu(&mut self, node: NodeIx, t: u64, cost: u64) -> u64 {
        let n = &mut self.nodes[node as usize];
        if let Some(f) = self.fanout.as_mut() {
            f.settle(self.spec, node, n);
        }
        n.book_cpu(t, cost)
    }

    /// The aggregate model's state and the part of the simulation it reads and books, when it
    /// is the model chosen.
    fn aggregate(&mut self) -> Option<(&mut Fanout, World<'_>)> {
        let f = self.fanout.as_mut()?;
        let world = World {
            spec: self.spec,
            trace: self.trace,
            base: self.base,
            nodes: &mut self.nodes,
            net: &mut self.net,
            traffic: &mut self.traffic,
        };
        Some((f, world))
    }

    /// What the aggregate model still owes every node, taken on (before results are read).
    fn settle_all(&mut self) {
        if let Some(f) = self.fanout.as_mut() {
            f.settle_all(self.spec, &mut self.nodes);
        }
    }

    /// Sends `bytes` from proxy `from` to proxy `to` at `t`: when they have all arrived.
    fn between(&mut self, from: NodeIx, t: u64, bytes: u64) -> u64 {
        if let Some(f) = self.fanout.as_mut() {
            f.settle(self.spec, from, &mut self.nodes[from as usize]);
        }
        let net = &self.spec.net;
        let sent = self.nodes[from as usize]
            .nic
            .pass(t, bytes, net.proxy_bandwidth);
        let crossed = self.net.pass(sent, bytes, net.network_bandwidth);
        crossed + ns(net.latency)
    }

    // ----- clients -----

    /// Closed loop: `client` issues its next request at `t`.
    fn issue_next_of(&mut self, client: u32, t: u64) {
        let c = client as usize;
        if let Some(&r) = self.per_client[c].get(self.cursor[c]) {
            self.cursor[c] += 1;
            self.issue(r, t);
        }
    }

    /// Starts the measured replay.
    fn start_replay(&mut self) {
        match self.spec.replay.mode {
            Replay::Closed => {
                for c in 0..self.per_client.len() {
                    for _ in 0..self.spec.replay.outstanding {
                        self.issue_next_of(c as u32, self.now);
                    }
                }
            }
            Replay::Serial => self.issue_serial(),
            Replay::Timed => self.schedule_next_issue(),
        }
    }

    /// Timed replay: the next trace request is issued at its time (one such event is queued
    /// at a time).
    fn schedule_next_issue(&mut self) {
        if let Some(r) = self.trace.requests.get(self.next_req) {
            let t = self.now.max(r.time_ns.saturating_add(self.time_offset));
            let req = self.next_req as u32;
            self.next_req += 1;
            self.schedule(t, Ev::Issue { req });
        }
    }

    /// The warm-up is over: what happens from now on is measured.
    fn end_warmup(&mut self) {
        // What the aggregate model still owes from the warm-up belongs to it.
        self.settle_all();
        self.warming = false;
        self.measure_from = self.now;
        if let Some(first) = self.trace.requests.get(self.warmup) {
            self.time_offset = self.now.saturating_sub(first.time_ns);
        }
        self.classified = Classified::default();
        self.traffic = Traffic::default();
        self.latency.reset();
        for n in &mut self.nodes {
            n.stats = mesh::NodeStats::default();
        }
    }

    /// Warm-up: `client` issues its next warm-up request at `t`.
    fn warm_next_of(&mut self, client: u32, t: u64) {
        if let Some(r) = self.warm_per_client[client as usize].pop() {
            self.issue(r, t);
        }
    }

    fn issue_serial(&mut self) {
        if self.next_req < self.trace.requests.len() {
            let r = self.next_req as u32;
            self.next_req += 1;
            self.waiting_serial = false;
            // Not before its trace time (a trace with times spreads a serial replay out;
            // the lab's serial replay ignores times, which are all 0 in closed-loop traces).
            // The pause comes before each request, the first included.
            let gap = ns(self.spec.replay.serial_gap);
            let t = self.trace.requests[r as usize].time_ns;
            if gap == 0 {
                self.now = self.now.max(t);
                self.issue(r, self.now);
            } else {
                // A pause after the mesh went quiet, in which timers run (summary and
                // directory upkeep), as between two requests of a paced live run.
                self.schedule(t.max(self.now + gap), Ev::Issue { req: r });
            }
        }
    }

    /// Trace request `req` leaves its client at `t`.
    fn issue(&mut self, req: u32, t: u64) {
        let r = self.trace.requests[req as usize];
        let caches = self.spec.mesh.caches;
        let node = match self.spec.mesh.admission {
            Admission::Client => r.client % caches,
            Admission::Random => (mix(u64::from(req)) % u64::from(caches)) as u32,
        };
        self.nodes[node as usize].stats.client_requests += 1;
        let job = self.new_job(Job {
            node,
            req,
            from: From::Client { req, issued: t },
            only_if_cached: false,
            hops: Vec::new(),
            next: 0,
            current: None,
        });
        self.schedule(t + ns(self.spec.net.client_latency), Ev::Arrive { job });
    }

    fn new_job(&mut self, job: Job) -> u32 {
        match self.free_jobs.pop() {
            Some(i) => {
                self.jobs[i as usize] = Some(job);
                i
            }
            None => {
                self.jobs.push(Some(job));
                (self.jobs.len() - 1) as u32
            }
        }
    }

    pub(crate) fn job(&self, job: u32) -> &Job {
        self.jobs[job as usize].as_ref().expect("live job")
    }

    fn job_mut(&mut self, job: u32) -> &mut Job {
        self.jobs[job as usize].as_mut().expect("live job")
    }

    // ----- events -----

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Issue { req } => {
                self.issue(req, self.now);
                if !self.warming && self.spec.replay.mode == Replay::Timed {
                    self.schedule_next_issue();
                }
            }
            Ev::Measure => {
                self.end_warmup();
                self.start_replay();
            }
            Ev::Arrive { job } => self.arrive(job),
            Ev::Datagram { to, from, payload } => self.datagram(to, from, payload),
            Ev::Deadline { node, reqnum } => self.deadline(node, reqnum),
            Ev::Decided { job, route } => self.follow(job, route, self.now),
            Ev::Response { job, served } => self.response(job, served),
            Ev::ClientDone {
                req,
                issued,
                served,
                node,
            } => self.client_done(req, issued, served, node, self.now),
            Ev::Tick { node } | Ev::Timer { node } => {
                self.upkeep(|cx| crate::proto::on_tick(cx, node));
            }
            Ev::Http {
                to,
                from,
                body,
                msg,
            } => {
                let net = &self.spec.net;
                let cost = ns(net.cpu_request) + ns(net.cpu_per_kib) * body.div_ceil(1024);
                let t = self.cpu(to, self.now, cost);
                self.upkeep(|cx| crate::proto::on_message(cx, to, from, msg, t));
            }
        }
    }

    fn arrive(&mut self, job: u32) {
        let (node, req, only_if_cached, from_peer) = {
            let j = self.job(job);
            (
                j.node,
                j.req,
                j.only_if_cached,
                matches!(j.from, From::Peer(_)),
            )
        };
        let r = self.trace.requests[req as usize];
        let t = self.cpu(node, self.now, ns(self.spec.net.cpu_request));
        let n = &mut self.nodes[node as usize];
        if from_peer {
            n.stats.peer_requests += 1;
        }
        if n.store.get(&r.key).is_some() {
            n.stats.store_hits += 1;
            // A hit relays its body from the store.
            let t = self.cpu(
                node,
                t,
                ns(self.spec.net.cpu_per_kib) * r.size.div_ceil(1024),
            );
            self.respond(job, Served::Store(node), t);
            return;
        }
        if only_if_cached {
            self.respond(job, Served::Refused, t);
            return;
        }
        if r.cacheable {
            if let Some(waiting) = n.fetching.get_mut(&r.obj) {
                waiting.push(job);
                return;
            }
            n.fetching.insert(r.obj, smallvec::smallvec![job]);
        }
        self.search(job, t);
    }

    /// Starts the search for `job`'s object (a miss at its node): the node's engine says what
    /// to send and whether to wait.
    fn search(&mut self, job: u32, t: u64) {
        let (node, req) = {
            let j = self.job(job);
            (j.node, j.req)
        };
        let obj_ix = self.trace.requests[req as usize].obj;
        let obj = &self.trace.objects[obj_ix as usize];
        if self.nodes[node as usize].peer_nodes.is_empty() {
            self.follow(job, Route::direct(), t);
            return;
        }
        let icp = self.nodes[node as usize]
            .engine
            .protocol::<IcpSearch>()
            .is_some();
        if let Some((f, mut world)) = self.aggregate().filter(|_| icp) {
            // The aggregate model stands in for ICP's own search and its datagrams.
            let Decision { route, when } = f.search(&mut world, req, node, obj_ix, t);
            if when <= t {
                self.follow(job, route, t);
            } else {
                self.schedule(when, Ev::Decided { job, route });
            }
            return;
        }
        let at = self.at(t);
        let proto = &mut self.proto;
        let n = &mut self.nodes[node as usize];
        let ranking = proto.carp.get(node, obj_ix, &n.engine, &obj.url);
        let summaries = &mut proto.summary;
        let mut candidates = || summaries.candidates(node, &obj.key.0);
        // The engine's requests are all GETs: hierarchical, so siblings may be asked.
        let mut miss = Miss::new(&obj.url, &obj.key.0, &obj.host, true);
        miss.candidates = Some(&mut candidates);
        miss.ranking = ranking;
        let step = n.engine.begin(at, miss);
        self.take_step(job, node, obj_ix, step, t);
    }

    /// Sends what a step of `job`'s search (for `obj`, at `node`) sends, then follows its route
    /// or waits for it.
    fn take_step(&mut self, job: u32, node: NodeIx, obj: u32, step: Step, t: u64) {
        let mut directory = Vec::new();
        for send in step.sends {
            match send {
                Send::Query { reqnum, peer, addr } => {
                    self.send_icp_queries(node, obj, reqnum, &[(peer, addr)], t);
                }
                Send::Multicast { reqnum, to } => {
                    self.send_multicast_query(node, obj, reqnum, to, t);
                }
                Send::Directory(out) => directory.push(out),
            }
        }
        if !directory.is_empty() {
            self.upkeep(|cx| crate::proto::send_directory(cx, node, obj, directory, t));
        }
        self.start_search(job, node, step.reqnum, step.outcome, t);
    }

    /// Sends ICP queries for `obj` (search `reqnum`) from `node` to `peers` (as a search
    /// lists them: peer and ICP address), one after the other on its CPU from `t`.
    pub(crate) fn send_icp_queries(
        &mut self,
        node: NodeIx,
        obj: u32,
        reqnum: u32,
        peers: &[(PeerId, SocketAddr)],
        t: u64,
    ) {
        let bytes = icp_query_bytes(self.trace.objects[obj as usize].url.len());
        let mut sent = t;
        for (peer, _) in peers {
            let to = self.nodes[node as usize].peer_nodes[peer.0];
            sent = self.cpu(node, sent, ns(self.spec.net.cpu_datagram));
            self.send_datagram(
                node,
                to,
                sent,
                bytes,
                Kind::IcpQuery,
                Payload::IcpQuery { obj, reqnum },
            );
        }
    }

    /// Sends the query of search `reqnum` for `obj` from `node` to `to` (the proxy's `multicast::send_queries`):
    /// to the group, or to one member.
    fn send_multicast_query(
        &mut self,
        node: NodeIx,
        obj: u32,
        reqnum: u32,
        to: Destination,
        t: u64,
    ) {
        let trace = self.trace;
        let o = &trace.objects[obj as usize];
        let bytes = multicast::query_len(&o.url);
        let query = move || Msg::Multicast(McMsg::Query { obj, reqnum });
        match to {
            Destination::Group if self.fanout.is_some() => {
                let holders = match self.aggregate() {
                    Some((f, world)) => f.group_query(&world, node, obj),
                    None => SmallVec::new(),
                };
                let none = std::iter::empty();
                let arrives = self.send_group(node, none, bytes, Kind::Multicast, query, t);
                let reply = multicast::reply_len(&o.url);
                let first = self.aggregate().and_then(|(f, mut world)| {
                    f.first_reply(&mut world, node, &holders, arrives, reply)
                });
                if let Some(first) = first {
                    let payload = Payload::Proto(query());
                    self.schedule(
                        arrives,
                        Ev::Datagram {
                            to: first,
                            from: node,
                            payload,
                        },
                    );
                }
            }
            Destination::Group => {
                let everyone = self.nodes.len() as NodeIx;
                let others = (0..everyone).filter(|&n| n != node);
                self.send_group(node, others, bytes, Kind::Multicast, query, t);
            }
            Destination::Peer { addr, .. } => {
                if let Some(to) = node_at(addr) {
                    self.send_proto(node, to, bytes, Kind::Multicast, query(), t);
                }
            }
        }
    }

    /// Lends the protocols' upkeep the simulation (`f` gets a [`Cx`]), then carries out what
    /// it asked for, in order.
    fn upkeep<R>(&mut self, f: impl FnOnce(&mut Upkeep<'_>) -> R) -> R {
        let mut effects = std::mem::take(&mut self.effects);
        let r = f(&mut Cx::new(
            self.spec,
            self.trace,
            self.now,
            self.base,
            &mut self.nodes,
            &mut self.proto,
            &mut effects,
        ));
        for effect in effects.drain(..) {
            self.apply(effect);
        }
        self.effects = effects;
        r
    }

    /// Carries out one of the upkeep's effects.
    fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Tick { node, at } => self.schedule(at, Ev::Tick { node }),
            Effect::Timer { node, at } => self.schedule_timer(at, node),
            Effect::Datagram {
                node,
                to,
                bytes,
                kind,
                msg,
                t,
            } => self.send_proto(node, to, bytes, kind, msg, t),
            Effect::Http {
                node,
                to,
                body,
                msg,
                t,
            } => self.send_http(node, to, body, msg, t),
            Effect::Count { kind, bytes } => self.traffic.count(kind, bytes),
            Effect::IcpQuery {
                node,
                obj,
                reqnum,
                peer,
                t,
            } => self.send_icp_queries(node, obj, reqnum, &[peer], t),
            Effect::IcpReply {
                node,
                to,
                obj,
                reqnum,
                reply,
                counted,
                t,
            } => self.send_icp_reply(node, to, obj, reqnum, reply, counted, t),
            Effect::Decided {
                node,
                reqnum,
                route,
                t,
            } => self.decided(node, reqnum, route, t),
        }
    }

    /// Follows a decided search now, or waits for its replies until its deadline.
    pub(crate) fn start_search(
        &mut self,
        job: u32,
        node: NodeIx,
        reqnum: u32,
        outcome: Outcome,
        t: u64,
    ) {
        match outcome {
            Outcome::Decided(route) => self.follow(job, route, t),
            Outcome::Wait { deadline } => {
                self.nodes[node as usize].searches.insert(reqnum, job);
                let d = self.virtual_ns(deadline);
                self.schedule(d, Ev::Deadline { node, reqnum });
            }
        }
    }

    /// Search `reqnum` at `node` is decided: its job follows `route`.
    pub(crate) fn decided(&mut self, node: NodeIx, reqnum: u32, route: Route, t: u64) {
        self.progress(node, reqnum, Progress::Decided(route), t);
    }

    /// Search `reqnum` at `node` moved on: its job follows the route, or takes the next step.
    fn progress(&mut self, node: NodeIx, reqnum: u32, progress: Progress, t: u64) {
        let Some(job) = self.nodes[node as usize].searches.remove(&reqnum) else {
            return;
        };
        match progress {
            Progress::Decided(route) => self.follow(job, route, t),
            Progress::Next(step) => {
                let obj = self.trace.requests[self.job(job).req as usize].obj;
                self.take_step(job, node, obj, step, t);
            }
        }
    }

    pub(crate) fn send_datagram(
        &mut self,
        from: NodeIx,
        to: NodeIx,
        t: u64,
        bytes: u64,
        kind: Kind,
        payload: Payload,
    ) {
        self.traffic.count(kind, bytes);
        self.nodes[from as usize].stats.datagrams_sent += 1;
        let arrives = self.between(from, t, bytes + UDP_IP);
        self.schedule(arrives, Ev::Datagram { to, from, payload });
    }

    /// Sends a protocol message of `bytes` from `node` to an IP multicast group whose other
    /// members are `to`, after `t` on its CPU: one datagram (one message, one send, one
    /// crossing of the network) of which each member receives a copy.
    /// Returns when the copies arrive.
    pub(crate) fn send_group(
        &mut self,
        node: NodeIx,
        to: impl Iterator<Item = NodeIx>,
        bytes: u64,
        kind: Kind,
        msg: impl Fn() -> crate::proto::Msg,
        t: u64,
    ) -> u64 {
        let sent = self.cpu(node, t, ns(self.spec.net.cpu_datagram));
        self.traffic.count(kind, bytes);
        self.nodes[node as usize].stats.datagrams_sent += 1;
        let arrives = self.between(node, sent, bytes + UDP_IP);
        for member in to {
            let payload = Payload::Proto(msg());
            self.schedule(
                arrives,
                Ev::Datagram {
                    to: member,
                    from: node,
                    payload,
                },
            );
        }
        arrives
    }

    fn datagram(&mut self, to: NodeIx, from: NodeIx, payload: Payload) {
        let t = self.cpu(to, self.now, ns(self.spec.net.cpu_datagram));
        self.nodes[to as usize].stats.datagrams_received += 1;
        match payload {
            Payload::IcpQuery { obj, reqnum } => {
                let o = &self.trace.objects[obj as usize];
                let n = &mut self.nodes[to as usize];
                // A parent answers its children (the proxy's `icp_allow`).
                let asker = n.engine.mesh_mut().on_query(icp_addr(from), n.is_parent);
                let holding = n.holding(&o.key);
                let kind = answer(asker, holding);
                self.send_icp_reply(to, from, obj, reqnum, kind, Kind::IcpReply, t);
            }
            Payload::IcpReply { obj, reqnum, kind } => {
                self.upkeep(|cx| crate::proto::on_icp_reply(cx, to, from, kind));
                let at = self.at(self.now);
                let url = &self.trace.objects[obj as usize].url;
                let reply = Reply {
                    kind,
                    reqnum,
                    url,
                    src_rtt_ms: None,
                };
                let moved = self.nodes[to as usize]
                    .engine
                    .on_reply(at, icp_addr(from), reply);
                if let Some((reqnum, progress)) = moved {
                    self.progress(to, reqnum, progress, t);
                }
            }
            Payload::Proto(msg) => {
                self.upkeep(|cx| crate::proto::on_message(cx, to, from, msg, t));
            }
        }
    }

    /// Sends an ICP reply of `kind` for `obj` (search `reqnum`) from `node` to `to`, after
    /// `t` on its CPU.
    #[allow(clippy::too_many_arguments)]
    fn send_icp_reply(
        &mut self,
        node: NodeIx,
        to: NodeIx,
        obj: u32,
        reqnum: u32,
        kind: ReplyKind,
        counted: Kind,
        t: u64,
    ) {
        let bytes = icp_reply_bytes(self.trace.objects[obj as usize].url.len());
        let sent = self.cpu(node, t, ns(self.spec.net.cpu_datagram));
        self.send_datagram(
            node,
            to,
            sent,
            bytes,
            counted,
            Payload::IcpReply { obj, reqnum, kind },
        );
    }

    /// Sends a protocol's HTTP message from `node` to `to` at `t`: a request (`body` 0) or a
    /// response with `body` bytes, after the headers (`net.http_header_bytes`). The protocol's
    /// `on_message` gets `msg` at `to` once it has all arrived and `to`'s CPU has handled it
    /// (a request, plus the body relayed), as for a peer's HTTP fetch. The caller counts it.
    pub(crate) fn send_http(
        &mut self,
        node: NodeIx,
        to: NodeIx,
        body: u64,
        msg: crate::proto::Msg,
        t: u64,
    ) {
        let arrives = self.between(node, t, self.spec.net.http_header_bytes + body);
        self.schedule(
            arrives,
            Ev::Http {
                to,
                from: node,
                body,
                msg,
            },
        );
    }

    /// Sends a protocol message of `bytes` (payload, without IP/UDP headers) from `node` to
    /// `to`, after `t` on its CPU.
    pub(crate) fn send_proto(
        &mut self,
        node: NodeIx,
        to: NodeIx,
        bytes: u64,
        kind: Kind,
        msg: crate::proto::Msg,
        t: u64,
    ) {
        let sent = self.cpu(node, t, ns(self.spec.net.cpu_datagram));
        self.send_datagram(node, to, sent, bytes, kind, Payload::Proto(msg));
    }

    fn deadline(&mut self, node: NodeIx, reqnum: u32) {
        let at = self.at(self.now);
        if !self.nodes[node as usize].searches.contains_key(&reqnum) {
            return;
        }
        let progress = self.nodes[node as usize]
            .engine
            .on_deadline(at, reqnum)
            .unwrap_or_else(|| Progress::Decided(Route::direct()));
        self.progress(node, reqnum, progress, self.now);
    }

    /// `job` tries the hops of `route` in order, from `t`.
    pub(crate) fn follow(&mut self, job: u32, route: Route, t: u64) {
        let j = self.job_mut(job);
        j.hops = route.hops;
        j.next = 0;
        self.try_next(job, t);
    }

    /// Tries `job`'s next hop.
    fn try_next(&mut self, job: u32, t: u64) {
        let (node, req, hop) = {
            let j = self.job_mut(job);
            let hop = j.hops.get(j.next).copied().unwrap_or(Hop::Direct);
            j.next += 1;
            j.current = match hop {
                Hop::Peer { peer, .. } => Some(peer),
                Hop::Direct => None,
            };
            (j.node, j.req, hop)
        };
        let hdr = self.spec.net.http_header_bytes;
        match hop {
            Hop::Peer { peer, .. } => {
                let n = &mut self.nodes[node as usize];
                n.engine.mesh_mut().fetch_started(peer);
                let role = n.engine.mesh().peers()[peer.0].spec.role;
                let to = n.peer_nodes[peer.0];
                let child = self.new_job(Job {
                    node: to,
                    req,
                    from: From::Peer(job),
                    only_if_cached: role == Role::Sibling,
                    hops: Vec::new(),
                    next: 0,
                    current: None,
                });
                self.traffic.count(Kind::PeerHttp, hdr);
                let arrives = self.between(node, t, hdr);
                self.schedule(arrives, Ev::Arrive { job: child });
            }
            Hop::Direct => {
                let net = &self.spec.net;
                let r = self.trace.requests[req as usize];
                let server = r.server as usize % self.origin_free.len();
                self.nodes[node as usize].stats.origin_fetches += 1;
                let reaches = t + ns(net.origin_latency);
                let start = reaches.max(self.origin_free[server]);
                self.origin_free[server] = start + wire(r.size + hdr, net.origin_bandwidth);
                let back = self.origin_free[server] + ns(net.origin_latency);
                self.schedule(
                    back,
                    Ev::Response {
                        job,
                        served: Served::Origin,
                    },
                );
            }
        }
    }

    fn response(&mut self, job: u32, served: Served) {
        let (node, req, current) = {
            let j = self.job(job);
            (j.node, j.req, j.current)
        };
        let r = self.trace.requests[req as usize];
        let cost =
            ns(self.spec.net.cpu_request) + ns(self.spec.net.cpu_per_kib) * r.size.div_ceil(1024);
        let t = self.cpu(node, self.now, cost);
        let mut proxy_only = false;
        if let Some(peer) = current {
            let n = &mut self.nodes[node as usize];
            n.engine.mesh_mut().fetch_ok(peer);
            proxy_only = n.engine.mesh().peers()[peer.0].spec.proxy_only;
        }
        if served == Served::Refused {
            if let Some(peer) = current {
                self.upkeep(|cx| crate::proto::on_refused(cx, node, peer, r.obj));
            }
            self.try_next(job, t);
            return;
        }
        let mut events = std::mem::take(&mut self.store_events);
        events.clear();
        let n = &mut self.nodes[node as usize];
        if r.cacheable && !proxy_only {
            // An object too large to keep is not stored, and makes no event.
            let _ = n.store.insert_into(r.key, mesh::body(r.size), &mut events);
        }
        n.stats.evicted(&events);
        if let Some(f) = self.fanout.as_mut() {
            if events.iter().any(StoreEvent::is_admission) {
                f.stored(node, r.obj);
            }
        }
        self.upkeep(|cx| crate::proto::on_store_events(cx, node, r.obj, &events, t));
        self.store_events = events;
        let n = &mut self.nodes[node as usize];
        let followers = n.fetching.remove(&r.obj).unwrap_or_default();
        for f in followers.into_iter().filter(|&f| f != job) {
            self.respond(f, Served::Collapsed(node), t);
        }
        self.respond(job, served, t);
    }

    /// Sends `job`'s response (`served`) back to whoever asked, from `t`.
    fn respond(&mut self, job: u32, served: Served, t: u64) {
        let j = self.jobs[job as usize].take().expect("live job");
        self.free_jobs.push(job);
        let net = &self.spec.net;
        let r = self.trace.requests[j.req as usize];
        let body = if served == Served::Refused { 0 } else { r.size };
        let bytes = body + net.http_header_bytes;
        match j.from {
            From::Client { req, issued } => {
                let done = t + wire(bytes, net.client_bandwidth) + ns(net.client_latency);
                if self.spec.replay.mode == Replay::Closed && !self.warming {
                    // Nothing in the mesh waits for the client to have its answer: it is
                    // counted now, for `done`, when the client's next request leaves.
                    self.client_done(req, issued, served, j.node, done);
                } else {
                    self.schedule(
                        done,
                        Ev::ClientDone {
                            req,
                            issued,
                            served,
                            node: j.node,
                        },
                    );
                }
            }
            From::Peer(parent) => {
                self.traffic.peer_response(bytes);
                let arrives = self.between(j.node, t, bytes);
                let served = match served {
                    Served::Collapsed(n) => Served::Store(n),
                    s => s,
                };
                self.schedule(
                    arrives,
                    Ev::Response {
                        job: parent,
                        served,
                    },
                );
            }
        }
    }

    /// The client of `req` has its whole response at `done`.
    fn client_done(&mut self, req: u32, issued: u64, served: Served, node: NodeIx, done: u64) {
        let r = self.trace.requests[req as usize];
        let latency_us = (done - issued) / 1_000;
        self.latency.saturating_record(latency_us.max(1));
        let kind = match served {
            Served::Store(n) | Served::Collapsed(n) if n == node => Answered::Local,
            Served::Store(n) | Served::Collapsed(n) => {
                if self.nodes[n as usize].is_parent {
                    Answered::Parent
                } else {
                    Answered::Sibling
                }
            }
            Served::Origin | Served::Refused => Answered::Miss,
        };
        self.classified.add(kind, r.size);
        self.nodes[node as usize].stats.count(kind);
        self.last_answer = self.last_answer.max(done);
        match self.spec.replay.mode {
            _ if self.warming => {
                self.warm_left -= 1;
                self.warm_next_of(r.slot, done);
                self.waiting_serial = self.warm_left == 0;
            }
            Replay::Closed => self.issue_next_of(r.slot, done),
            Replay::Serial => self.waiting_serial = true,
            Replay::Timed => {}
        }
    }
}
