//! The CPU floor of a cooperation protocol on this machine: what four processes spend doing
//! exactly the protocol's work for a stream of requests, with no proxy around them.
//!
//! Each node is a process with a non-blocking UDP socket on its own loopback address, one
//! epoll loop (mio) and nothing else. A *request* is a local hit (`--hit-ratio`: nothing to
//! do) or a miss, and what a miss costs depends on `--protocol`:
//!
//! - `icp`: a `QUERY` to every other node; the miss ends when all of them have replied. Every
//!   query is answered `MISS_NOFETCH`, as a meshcache sibling answers in the worst case.
//! - `summary` (Summary Cache, SC-ICP): the miss's key is looked up in the peers' summaries
//!   (`PeerSummaries`, the proxy's own state machine); a peer whose summary says "maybe" gets
//!   a `QUERY` (every one of them a false hit: nodes never share a key). Then the key enters
//!   the node's store (a ring of `--store` keys, the oldest evicted) and its counting filter
//!   (`LocalSummary`, sized for `--capacity` documents; by default the store's size). When
//!   the paper's threshold of changes is passed, at most every 250 ms, the pending changes go
//!   to every peer as `ICP_OP_DIRUPDATE` datagrams, to an inbox socket that nothing waits on
//!   and that is read before a lookup at most every 50 ms (or once a second when idle), as
//!   the proxy does.
//! - `none`: nothing (the miss ends as it starts), so that `protocol − none` is the floor of
//!   that protocol's *extra* CPU per request.
//!
//! Messages are encoded and decoded with `meshcache-wire`; one system call per datagram. That
//! is the least an implementation can do for these protocols: no HTTP, no store lookups for
//! peers' queries, the miss's key given.
//!
//! Two loads: `--concurrency C` keeps C requests in flight per node (a closed loop, as
//! `wrk -c C` drives a proxy), and `--rate R` starts R requests a second per node (an open
//! loop, nodes idle in between, as at the paper's load).
//!
//! The parent starts the nodes (this program again, with `--node I`), waits for them and adds
//! up their CPU: utime + stime, the scheduler's nanosecond run time, context switches. Every
//! node runs a bounded number of requests (`--requests`) and gives up after `--timeout`.
//! Loopback addresses only. Pin it as the nodes under test are pinned:
//!
//! ```sh
//! cargo run --release -p meshcache-dcm --example floor -- --cpu 1 --concurrency 4
//! cargo run --release -p meshcache-dcm --example floor -- --cpu 1 --rate 200 --protocol none
//! cargo run --release -p meshcache-dcm --example floor -- --cpu 1 --rate 240 --hit-ratio 0.25 \
//!     --protocol summary
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

// Summary Cache keeps the proxy's pace: updates at most every `UPDATE_SPACING`, the inbox read
// before a lookup at most every `INBOX_POLL`, and every `INBOX_IDLE` when idle.
use meshcache_dcm::summary::pace::{INBOX_IDLE, INBOX_POLL, UPDATE_SPACING};
use meshcache_dcm::summary::{LocalSummary, PeerSummaries, UpdateVerdict};
use meshcache_dcm::PeerId;
use meshcache_summary::Hashing;
use meshcache_wire::icp::{self, Message, Opcode};
use meshcache_wire::summary as wire;
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token};

/// A datagram that says "my requests are done" (too short to be ICP, so never confused).
const DONE: &[u8] = b"D";

/// A miss whose replies have not all come after this long is counted lost and ended.
const LOST_AFTER: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    None,
    Icp,
    Summary,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::None => "none",
            Protocol::Icp => "icp",
            Protocol::Summary => "summary",
        }
    }
}

#[derive(Clone, Debug)]
struct Args {
    nodes: u8,
    first: Ipv4Addr,
    port: u16,
    requests: u64,
    concurrency: u64,
    rate: f64,
    hit_ratio: f64,
    protocol: Protocol,
    store: u32,
    capacity: u32,
    bits_per_entry: u8,
    threshold: f64,
    cpu: Option<usize>,
    timeout: Duration,
    node: Option<u8>,
    /// `--datagram-cost N`: time N datagrams sent to and read back from one socket instead.
    datagram_cost: u64,
}

fn usage() -> &'static str {
    "usage: floor [--protocol icp|summary|none] [--concurrency 4 | --rate R] [--requests 20000]\n\
     \x20            [--hit-ratio 0] [--store 2000] [--capacity STORE] [--bits-per-entry 8]\n\
     \x20            [--threshold 0.01] [--nodes 4] [--first 127.0.0.51] [--port 3130] [--cpu N]\n\
     \x20            [--timeout 120]\n\
     \x20      floor --datagram-cost N [--cpu N] [--first 127.0.0.51] [--port 3130]\n\
     (the summary protocol's inboxes use port + 1; --capacity: what the summary is sized for)"
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        nodes: 4,
        first: Ipv4Addr::new(127, 0, 0, 51),
        port: 3130,
        requests: 20_000,
        concurrency: 4,
        rate: 0.0,
        hit_ratio: 0.0,
        protocol: Protocol::Icp,
        store: 2_000,
        capacity: 0,
        bits_per_entry: 8,
        threshold: meshcache_dcm::summary::DEFAULT_THRESHOLD,
        cpu: None,
        timeout: Duration::from_secs(120),
        node: None,
        datagram_cost: 0,
    };
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: cannot read {v:?}"))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--nodes" => a.nodes = num(&flag, it.next())?,
            "--first" => a.first = num(&flag, it.next())?,
            "--port" => a.port = num(&flag, it.next())?,
            // `--searches` is the name the first version of this program had.
            "--requests" | "--searches" => a.requests = num(&flag, it.next())?,
            "--concurrency" => a.concurrency = num(&flag, it.next())?,
            "--rate" => a.rate = num(&flag, it.next())?,
            "--hit-ratio" => a.hit_ratio = num(&flag, it.next())?,
            "--store" => a.store = num(&flag, it.next())?,
            "--capacity" => a.capacity = num(&flag, it.next())?,
            "--bits-per-entry" => a.bits_per_entry = num(&flag, it.next())?,
            "--threshold" => a.threshold = num(&flag, it.next())?,
            "--cpu" => a.cpu = Some(num(&flag, it.next())?),
            "--timeout" => a.timeout = Duration::from_secs(num(&flag, it.next())?),
            "--datagram-cost" => a.datagram_cost = num(&flag, it.next())?,
            "--node" => a.node = Some(num(&flag, it.next())?),
            "--protocol" => {
                a.protocol = match it.next().as_deref() {
                    Some("icp") => Protocol::Icp,
                    Some("summary") => Protocol::Summary,
                    Some("none") => Protocol::None,
                    other => {
                        return Err(format!("--protocol: icp, summary or none, not {other:?}"))
                    }
                }
            }
            "-h" | "--help" => return Err(usage().to_string()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if a.nodes < 2 || a.nodes > 200 {
        return Err("--nodes: 2 to 200".into());
    }
    if !a.first.is_loopback() || u32::from(a.first).checked_add(u32::from(a.nodes)).is_none() {
        return Err("--first must be a loopback address with room for every node".into());
    }
    if a.port == u16::MAX {
        return Err("--port: the inboxes need port + 1".into());
    }
    if a.rate <= 0.0 && a.concurrency == 0 {
        return Err("--concurrency must be at least 1 (or give --rate)".into());
    }
    if !a.rate.is_finite() || a.rate < 0.0 {
        return Err("--rate must be a positive number of requests a second".into());
    }
    if !(0.0..1.0).contains(&a.hit_ratio) {
        return Err("--hit-ratio: from 0 up to (not including) 1".into());
    }
    if a.store == 0 || !(1..=32).contains(&a.bits_per_entry) {
        return Err("--store must be at least 1 and --bits-per-entry 1 to 32".into());
    }
    if a.capacity == 0 {
        a.capacity = a.store;
    }
    if !(0.001..=0.1).contains(&a.threshold) {
        return Err("--threshold: 0.001 to 0.1".into());
    }
    Ok(a)
}

fn address(args: &Args, node: u8, port: u16) -> SocketAddr {
    let ip = Ipv4Addr::from(u32::from(args.first) + u32::from(node));
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

/// What a node did and spent, read from `/proc/self` when it is done. A node prints it as one
/// JSON line; the parent adds them up.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Spent {
    requests: u64,
    misses: u64,
    lost: u64,
    answered: u64,
    queries: u64,
    updates: u64,
    update_bytes: u64,
    utime_s: f64,
    stime_s: f64,
    run_ns: u64,
    voluntary: u64,
    involuntary: u64,
}

impl Spent {
    fn of_this_process() -> Result<Spent, String> {
        let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
        let stat = read("/proc/self/stat")?;
        // Fields after the command name's closing parenthesis; utime and stime are 14 and 15.
        let rest = stat
            .rsplit_once(')')
            .ok_or("/proc/self/stat: no command")?
            .1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> Result<f64, String> {
            let v: f64 = fields
                .get(i - 3)
                .and_then(|f| f.parse().ok())
                .ok_or("/proc/self/stat: short")?;
            Ok(v / user_hz())
        };
        let schedstat = read("/proc/self/schedstat")?;
        let run_ns = schedstat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or("/proc/self/schedstat: unreadable")?;
        let status = read("/proc/self/status")?;
        let switches = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Ok(Spent {
            utime_s: ticks(14)?,
            stime_s: ticks(15)?,
            run_ns,
            voluntary: switches("voluntary_ctxt_switches:"),
            involuntary: switches("nonvoluntary_ctxt_switches:"),
            ..Spent::default()
        })
    }

    fn add(&mut self, o: &Spent) {
        self.requests += o.requests;
        self.misses += o.misses;
        self.lost += o.lost;
        self.answered += o.answered;
        self.queries += o.queries;
        self.updates += o.updates;
        self.update_bytes += o.update_bytes;
        self.utime_s += o.utime_s;
        self.stime_s += o.stime_s;
        self.run_ns += o.run_ns;
        self.voluntary += o.voluntary;
        self.involuntary += o.involuntary;
    }
}

/// Clock ticks per second for `/proc/*/stat` times (`sysconf(_SC_CLK_TCK)`).
fn user_hz() -> f64 {
    rustix::param::clock_ticks_per_second().max(1) as f64
}

/// A well-mixed 64-bit value (splitmix64's finalizer): request numbers to hit-or-miss draws
/// and to keys that look like MD5 store keys.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Summary Cache state of a node.
struct Summary {
    local: LocalSummary,
    peers: PeerSummaries,
    /// The node's store, oldest first: the keys its summary holds.
    store: VecDeque<[u8; 16]>,
    /// How many objects the store holds (`--store`).
    holds: usize,
    inbox: std::net::UdpSocket,
    inbox_read: Instant,
    sent: Instant,
}

/// A node's state between events.
struct Node<'a> {
    args: &'a Args,
    me: u8,
    socket: UdpSocket,
    others: Vec<SocketAddr>,
    inboxes: Vec<SocketAddr>,
    summary: Option<Summary>,
    /// Request number → (replies still due, when the queries went out, the miss's key).
    outstanding: HashMap<u32, (usize, Instant, [u8; 16])>,
    next_reqnum: u32,
    started: u64,
    spent: Spent,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Node<'_> {
    fn send(&self, bytes: &[u8], to: SocketAddr) -> Result<(), String> {
        match self.socket.send_to(bytes, to) {
            Ok(_) => Ok(()),
            // A full buffer on loopback: the datagram is lost and its miss ends as lost.
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(format!("send to {to}: {e}")),
        }
    }

    fn key(&self, n: u64) -> [u8; 16] {
        let a = mix(u64::from(self.me) << 48 | n);
        let b = mix(a);
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&a.to_be_bytes());
        k[8..].copy_from_slice(&b.to_be_bytes());
        k
    }

    /// Start one request: a hit ends at once, a miss as its protocol says.
    fn start(&mut self) -> Result<(), String> {
        let n = self.started;
        self.started += 1;
        let draw = (mix(u64::from(self.me) << 56 ^ n) >> 11) as f64 / (1u64 << 53) as f64;
        let hit = draw < self.args.hit_ratio;
        if hit || self.args.protocol == Protocol::None {
            self.spent.requests += 1;
            self.spent.misses += u64::from(!hit);
            return Ok(());
        }
        self.spent.misses += 1;
        let key = self.key(n);
        // Summary Cache asks only the peers whose summary says "maybe"; ICP asks every peer.
        self.read_inbox(INBOX_POLL);
        let to: Vec<SocketAddr> = match &mut self.summary {
            None => self.others.clone(),
            Some(s) => {
                let hits = s.peers.candidates(&key, |_| true);
                hits.iter().map(|p| self.others[p.0]).collect()
            }
        };
        if to.is_empty() {
            return self.finish(key);
        }
        let reqnum = self.next_reqnum;
        self.next_reqnum = self.next_reqnum.wrapping_add(1).max(1);
        let url = format!("http://127.0.0.1:8080/floor/n{}/{n}?size=4096", self.me);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        icp::encode(&Message::query(reqnum, url), &mut out).map_err(|e| e.to_string())?;
        for &peer in &to {
            self.send(&out, peer)?;
        }
        self.out = out;
        self.spent.queries += to.len() as u64;
        self.outstanding
            .insert(reqnum, (to.len(), Instant::now(), key));
        Ok(())
    }

    /// A miss is over: the object enters the store (and, with Summary Cache, its summary).
    fn finish(&mut self, key: [u8; 16]) -> Result<(), String> {
        self.spent.requests += 1;
        let Some(s) = &mut self.summary else {
            return Ok(());
        };
        s.local.admitted(&key);
        s.store.push_back(key);
        while s.store.len() > s.holds {
            if let Some(old) = s.store.pop_front() {
                s.local.removed(&old);
            }
        }
        self.send_updates()
    }

    /// Summary Cache: the pending changes to every peer's inbox, when due.
    fn send_updates(&mut self) -> Result<(), String> {
        let Some(s) = &mut self.summary else {
            return Ok(());
        };
        if !s.local.due() || s.sent.elapsed() < UPDATE_SPACING {
            return Ok(());
        }
        s.sent = Instant::now();
        let updates = s.local.take_updates();
        let mut out = std::mem::take(&mut self.out);
        for u in &updates {
            out.clear();
            wire::encode_dirupdate(u, &mut out).map_err(|e| e.to_string())?;
            for &to in &self.inboxes {
                self.send(&out, to)?;
                self.spent.updates += 1;
                self.spent.update_bytes += out.len() as u64;
            }
        }
        self.out = out;
        Ok(())
    }

    /// Summary Cache: apply the peers' updates waiting in the inbox, if it was last read
    /// `within` ago or longer.
    fn read_inbox(&mut self, within: Duration) {
        let Some(s) = &mut self.summary else {
            return;
        };
        if s.inbox_read.elapsed() < within {
            return;
        }
        let now = Instant::now();
        s.inbox_read = now;
        while let Ok((len, from)) = s.inbox.recv_from(&mut self.buf) {
            let Some(peer) = self.others.iter().position(|&o| o == from) else {
                continue;
            };
            if let Ok(update) = wire::decode_dirupdate(&self.buf[..len]) {
                let verdict = s.peers.on_update(now, PeerId(peer), update, len as u64);
                debug_assert_eq!(verdict, UpdateVerdict::Applied);
            }
        }
    }

    /// Answer a query with `MISS_NOFETCH`, or count a reply towards its miss.
    fn receive(&mut self, len: usize, from: SocketAddr) -> Result<(), String> {
        let Ok(msg) = icp::decode(&self.buf[..len]) else {
            return Ok(());
        };
        if msg.opcode == Opcode::Query {
            let reply = Message::reply(Opcode::MissNoFetch, &msg).map_err(|e| e.to_string())?;
            let mut out = std::mem::take(&mut self.out);
            out.clear();
            icp::encode(&reply, &mut out).map_err(|e| e.to_string())?;
            self.send(&out, from)?;
            self.out = out;
            self.spent.answered += 1;
            return Ok(());
        }
        let Some((left, _, key)) = self.outstanding.get_mut(&msg.reqnum) else {
            return Ok(());
        };
        *left -= 1;
        let (left, key) = (*left, *key);
        // Every reply says the peer does not have it: for Summary Cache, a false hit.
        if let (Some(s), Some(peer)) = (
            &mut self.summary,
            self.others.iter().position(|&o| o == from),
        ) {
            s.peers.false_hit(PeerId(peer));
        }
        if left == 0 {
            self.outstanding.remove(&msg.reqnum);
            self.finish(key)?;
        }
        Ok(())
    }

    /// Misses whose replies were lost end as lost.
    fn expire(&mut self, now: Instant) -> Result<(), String> {
        let mut ended = Vec::new();
        self.outstanding.retain(|_, (_, since, key)| {
            let keep = now.duration_since(*since) < LOST_AFTER;
            if !keep {
                ended.push(*key);
            }
            keep
        });
        for key in ended {
            self.spent.lost += 1;
            self.finish(key)?;
        }
        Ok(())
    }
}

/// One node: bind, say so, wait for the go, then request and answer until every node's
/// requests are done.
fn node(args: &Args, me: u8) -> Result<Spent, String> {
    let here = address(args, me, args.port);
    let mut socket = UdpSocket::bind(here).map_err(|e| format!("bind {here}: {e}"))?;
    let mut poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    poll.registry()
        .register(&mut socket, Token(0), Interest::READABLE)
        .map_err(|e| format!("register: {e}"))?;
    let others: Vec<SocketAddr> = (0..args.nodes)
        .filter(|&n| n != me)
        .map(|n| address(args, n, args.port))
        .collect();
    let inboxes: Vec<SocketAddr> = (0..args.nodes)
        .filter(|&n| n != me)
        .map(|n| address(args, n, args.port + 1))
        .collect();
    let summary = match args.protocol {
        Protocol::Summary => {
            let inbox_at = address(args, me, args.port + 1);
            let inbox =
                std::net::UdpSocket::bind(inbox_at).map_err(|e| format!("bind {inbox_at}: {e}"))?;
            inbox
                .set_nonblocking(true)
                .map_err(|e| format!("inbox: {e}"))?;
            // Every summary starts empty and numbered alike, so each node can install its
            // peers' first (empty) arrays itself; from then on only updates travel.
            let fresh = || {
                LocalSummary::new(
                    args.capacity,
                    args.bits_per_entry,
                    Hashing::DIGEST,
                    args.threshold,
                    1,
                )
            };
            let mut local = fresh();
            if let SocketAddr::V4(v4) = here {
                local.set_sender(*v4.ip());
            }
            let now = Instant::now();
            let mut peers = PeerSummaries::new(others.len(), Duration::from_secs(1));
            for p in 0..others.len() {
                peers.install_full(now, PeerId(p), fresh().full_array(), 0);
            }
            Some(Summary {
                local,
                peers,
                store: VecDeque::with_capacity(args.store as usize + 1),
                holds: args.store as usize,
                inbox,
                inbox_read: now,
                sent: now,
            })
        }
        _ => None,
    };
    // Every node binds before any sends: tell the parent, and wait for its go (a byte, or
    // the end of standard input).
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut go = [0u8; 1];
    let _ = std::io::stdin().read(&mut go);

    let mut node = Node {
        args,
        me,
        socket,
        others,
        inboxes,
        summary,
        outstanding: HashMap::new(),
        next_reqnum: 1,
        started: 0,
        spent: Spent::default(),
        out: Vec::with_capacity(2048),
        buf: vec![0u8; icp::MAX_DATAGRAM + 1],
    };
    let pace = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    let mut done_peers = vec![false; usize::from(args.nodes)];
    done_peers[usize::from(me)] = true;
    let mut i_am_done = false;
    // A node still at work sends a datagram at least this often; once we are done, this much
    // silence means every other node is done too, even if its DONE was lost.
    let silence = pace
        .map_or(Duration::ZERO, |p| p * 3)
        .max(Duration::from_secs(2));
    let mut heard = Instant::now();
    let mut events = Events::with_capacity(64);
    let deadline = Instant::now() + args.timeout;
    let t0 = Instant::now();

    loop {
        let now = Instant::now();
        if now > deadline {
            return Err(format!(
                "node {me}: not done after {:?} ({} of {} requests)",
                args.timeout, node.spent.requests, args.requests
            ));
        }
        node.expire(now)?;
        match pace {
            // Open loop: start what is due.
            Some(pace) => {
                while node.started < args.requests && t0 + pace.mul_f64(node.started as f64) <= now
                {
                    node.start()?;
                }
            }
            // Closed loop: keep `concurrency` requests in flight.
            None => {
                while node.started < args.requests
                    && (node.outstanding.len() as u64) < args.concurrency
                {
                    node.start()?;
                }
            }
        }
        node.read_inbox(INBOX_IDLE);
        if !i_am_done && node.spent.requests >= args.requests {
            i_am_done = true;
            for &to in &node.others {
                node.send(DONE, to)?;
            }
        }
        if i_am_done && (done_peers.iter().all(|d| *d) || now.duration_since(heard) > silence) {
            break;
        }

        let timeout = match pace {
            Some(pace) if node.started < args.requests => {
                (t0 + pace.mul_f64(node.started as f64)).saturating_duration_since(now)
            }
            _ if !node.outstanding.is_empty() => LOST_AFTER,
            // Done and waiting for the others: repeat DONE now and then in case one was lost.
            _ => Duration::from_millis(200),
        };
        let timeout = match &node.summary {
            Some(_) => timeout.min(INBOX_IDLE),
            None => timeout,
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
        if events.is_empty() && i_am_done {
            for &to in &node.others {
                node.send(DONE, to)?;
            }
        }
        // Edge-triggered: read until the socket is empty.
        loop {
            let (len, from) = match node.socket.recv_from(&mut node.buf) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("recv: {e}")),
            };
            heard = Instant::now();
            if &node.buf[..len] == DONE {
                if let Some(n) = (0..args.nodes).find(|&n| address(args, n, args.port) == from) {
                    done_peers[usize::from(n)] = true;
                }
                continue;
            }
            node.receive(len, from)?;
            // Closed loop: a completed request is replaced at once, as a client's next one.
            if pace.is_none() {
                while node.started < args.requests
                    && (node.outstanding.len() as u64) < args.concurrency
                {
                    node.start()?;
                }
            }
        }
    }
    let proc = Spent::of_this_process()?;
    Ok(Spent {
        utime_s: proc.utime_s,
        stime_s: proc.stime_s,
        run_ns: proc.run_ns,
        voluntary: proc.voluntary,
        involuntary: proc.involuntary,
        ..node.spent
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("floor: {e}");
            return ExitCode::from(2);
        }
    };
    if args.datagram_cost > 0 {
        return match datagram_cost(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("floor: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(me) = args.node {
        return match node(&args, me) {
            Ok(spent) => match serde_json::to_string(&spent) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("floor: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("floor: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match parent(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The kernel's cost of one loopback datagram with nobody to wake: one socket sends to itself
/// and reads the datagram back, `--datagram-cost` times; beside it, a read that finds nothing
/// (a system call that does no work). Pinned to `--cpu` when given.
fn datagram_cost(args: &Args) -> Result<(), String> {
    if let Some(cpu) = args.cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("pin to {cpu}: {e}"))?;
    }
    let here = address(args, 0, args.port);
    let socket = std::net::UdpSocket::bind(here).map_err(|e| format!("bind {here}: {e}"))?;
    let mut out = Vec::new();
    icp::encode(
        &Message::query(1, "http://127.0.0.1:8080/floor/4096"),
        &mut out,
    )
    .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 2048];
    let n = args.datagram_cost;
    let t = Instant::now();
    for _ in 0..n {
        socket
            .send_to(&out, here)
            .map_err(|e| format!("send: {e}"))?;
        socket
            .recv_from(&mut buf)
            .map_err(|e| format!("recv: {e}"))?;
    }
    let datagram = t.elapsed();
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("non-blocking: {e}"))?;
    let t = Instant::now();
    for _ in 0..n {
        if socket.recv_from(&mut buf).is_ok() {
            return Err("a datagram nobody sent".into());
        }
    }
    let empty = t.elapsed();
    let per = |d: Duration| d.as_nanos() as f64 / n as f64;
    println!(
        "datagrams={n} bytes={} send_and_recv_ns={:.0} empty_recv_ns={:.0}",
        out.len(),
        per(datagram),
        per(empty)
    );
    Ok(())
}

/// Start every node, wait, and print the totals per request.
fn parent(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let mut children = Vec::new();
    for n in 0..args.nodes {
        let mut cmd = match args.cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string()]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(["--nodes", &args.nodes.to_string()])
            .args(["--first", &args.first.to_string()])
            .args(["--port", &args.port.to_string()])
            .args(["--requests", &args.requests.to_string()])
            .args(["--concurrency", &args.concurrency.to_string()])
            .args(["--rate", &args.rate.to_string()])
            .args(["--hit-ratio", &args.hit_ratio.to_string()])
            .args(["--store", &args.store.to_string()])
            .args(["--capacity", &args.capacity.to_string()])
            .args(["--bits-per-entry", &args.bits_per_entry.to_string()])
            .args(["--threshold", &args.threshold.to_string()])
            .args(["--protocol", args.protocol.name()])
            .args(["--timeout", &args.timeout.as_secs().to_string()])
            .args(["--node", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        children.push(cmd.spawn().map_err(|e| format!("start node {n}: {e}"))?);
    }
    // Every node has bound its sockets before any starts.
    let mut readers = Vec::new();
    for (n, child) in children.iter_mut().enumerate() {
        let mut reader = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("node {n}: {e}"))?;
        if line.trim() != "ready" {
            return Err(format!("node {n} did not start"));
        }
        readers.push(reader);
    }
    let wall = Instant::now();
    for child in &mut children {
        drop(child.stdin.take());
    }
    let mut total = Spent::default();
    let mut failed = Vec::new();
    for (n, (mut child, mut reader)) in children.into_iter().zip(readers).enumerate() {
        let mut text = String::new();
        reader
            .read_to_string(&mut text)
            .map_err(|e| format!("node {n}: {e}"))?;
        let status = child.wait().map_err(|e| format!("node {n}: {e}"))?;
        match (status.success(), serde_json::from_str::<Spent>(text.trim())) {
            (true, Ok(s)) => total.add(&s),
            _ => failed.push(n),
        }
    }
    if !failed.is_empty() {
        return Err(format!("nodes {failed:?} failed"));
    }
    let per = |x: f64| x / total.requests.max(1) as f64;
    println!(
        "protocol={} nodes={} load={} requests={} misses={} lost={} answered={} queries={} \
         updates={} update_bytes={} wall_s={:.2} cpu_us_per_request={:.2} user_us={:.2} \
         sys_us={:.2} run_us={:.2} voluntary_per_request={:.3} involuntary_per_request={:.3}",
        args.protocol.name(),
        args.nodes,
        if args.rate > 0.0 {
            format!("rate{}", args.rate)
        } else {
            format!("closed{}", args.concurrency)
        },
        total.requests,
        total.misses,
        total.lost,
        total.answered,
        total.queries,
        total.updates,
        total.update_bytes,
        wall.elapsed().as_secs_f64(),
        per((total.utime_s + total.stime_s) * 1e6),
        per(total.utime_s * 1e6),
        per(total.stime_s * 1e6),
        per(total.run_ns as f64 / 1e3),
        per(total.voluntary as f64),
        per(total.involuntary as f64),
    );
    Ok(())
}
