//! The CPU floor of ICP on this machine: what four processes spend exchanging exactly the
//! datagrams of ICP searches, with no proxy around them.
//!
//! Each node is a process with one non-blocking UDP socket on its own loopback address, one
//! epoll loop (mio) and nothing else. A *search* sends an ICP v2 `QUERY` to every other node
//! and ends when all of them have replied; a node answers every query with `MISS_NOFETCH`, as
//! a meshcache sibling answers in the worst case. Messages are encoded and decoded with this
//! crate's codec, so the user-space work is the least an implementation can do: decode,
//! encode, one system call per datagram.
//!
//! Two loads: `--concurrency C` keeps C searches in flight per node (a closed loop, as
//! `wrk -c C` drives a proxy), and `--rate R` starts R searches a second per node (an open
//! loop, nodes idle in between, as at the paper's load). `--protocol none` runs the same loop
//! and timers with no datagram (a search ends as it starts), so that `icp − none` is the
//! floor of ICP's *extra* CPU per request, the quantity the ICP-overhead benchmark measures
//! for meshcache and Squid.
//!
//! The parent starts the nodes (this program again, with `--node I`), waits for them and adds
//! up their CPU: utime + stime, the scheduler's nanosecond run time, context switches. Every
//! node runs a bounded number of searches (`--searches`) and gives up after `--timeout`.
//! Loopback addresses only. Pin it as the nodes under test are pinned:
//!
//! ```sh
//! cargo run --release -p meshcache-wire --example icp-floor -- --cpu 1 --concurrency 4
//! cargo run --release -p meshcache-wire --example icp-floor -- --cpu 1 --rate 200 --protocol none
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use meshcache_wire::icp::{self, Message, Opcode};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token};

/// A datagram that says "my searches are done" (too short to be ICP, so never confused).
const DONE: &[u8] = b"D";

/// A search whose replies have not all come after this long is counted lost and ended.
const LOST_AFTER: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
struct Args {
    nodes: u8,
    first: Ipv4Addr,
    port: u16,
    searches: u64,
    concurrency: u64,
    rate: f64,
    icp: bool,
    cpu: Option<usize>,
    timeout: Duration,
    node: Option<u8>,
}

fn usage() -> &'static str {
    "usage: icp-floor [--nodes 4] [--first 127.0.0.51] [--port 3130] [--searches 20000]\n\
     \x20                [--concurrency 4 | --rate R] [--protocol icp|none] [--cpu N]\n\
     \x20                [--timeout 120]"
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        nodes: 4,
        first: Ipv4Addr::new(127, 0, 0, 51),
        port: 3130,
        searches: 20_000,
        concurrency: 4,
        rate: 0.0,
        icp: true,
        cpu: None,
        timeout: Duration::from_secs(120),
        node: None,
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
            "--searches" => a.searches = num(&flag, it.next())?,
            "--concurrency" => a.concurrency = num(&flag, it.next())?,
            "--rate" => a.rate = num(&flag, it.next())?,
            "--cpu" => a.cpu = Some(num(&flag, it.next())?),
            "--timeout" => a.timeout = Duration::from_secs(num(&flag, it.next())?),
            "--node" => a.node = Some(num(&flag, it.next())?),
            "--protocol" => {
                a.icp = match it.next().as_deref() {
                    Some("icp") => true,
                    Some("none") => false,
                    other => return Err(format!("--protocol: icp or none, not {other:?}")),
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
    if a.rate <= 0.0 && a.concurrency == 0 {
        return Err("--concurrency must be at least 1 (or give --rate)".into());
    }
    if !a.rate.is_finite() || a.rate < 0.0 {
        return Err("--rate must be a positive number of searches a second".into());
    }
    Ok(a)
}

fn address(args: &Args, node: u8) -> SocketAddr {
    let ip = Ipv4Addr::from(u32::from(args.first) + u32::from(node));
    SocketAddr::V4(SocketAddrV4::new(ip, args.port))
}

/// What a node spent, read from `/proc/self` when it is done.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    searches: u64,
    lost: u64,
    answered: u64,
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

    fn line(&self) -> String {
        format!(
            "searches={} lost={} answered={} utime_s={} stime_s={} run_ns={} voluntary={} involuntary={}",
            self.searches,
            self.lost,
            self.answered,
            self.utime_s,
            self.stime_s,
            self.run_ns,
            self.voluntary,
            self.involuntary
        )
    }

    fn from_line(line: &str) -> Option<Spent> {
        let mut s = Spent::default();
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "searches" => s.searches = v.parse().ok()?,
                "lost" => s.lost = v.parse().ok()?,
                "answered" => s.answered = v.parse().ok()?,
                "utime_s" => s.utime_s = v.parse().ok()?,
                "stime_s" => s.stime_s = v.parse().ok()?,
                "run_ns" => s.run_ns = v.parse().ok()?,
                "voluntary" => s.voluntary = v.parse().ok()?,
                "involuntary" => s.involuntary = v.parse().ok()?,
                _ => return None,
            }
        }
        Some(s)
    }
}

/// Clock ticks per second for `/proc/*/stat` times (`sysconf(_SC_CLK_TCK)`).
fn user_hz() -> f64 {
    rustix::param::clock_ticks_per_second().max(1) as f64
}

/// A node's state between events.
struct Node<'a> {
    args: &'a Args,
    me: u8,
    socket: UdpSocket,
    others: Vec<SocketAddr>,
    /// Request number → (replies still due, when the queries went out).
    outstanding: HashMap<u32, (usize, Instant)>,
    next_reqnum: u32,
    started: u64,
    spent: Spent,
    out: Vec<u8>,
}

impl Node<'_> {
    fn send(&self, bytes: &[u8], to: SocketAddr) -> Result<(), String> {
        match self.socket.send_to(bytes, to) {
            Ok(_) => Ok(()),
            // A full buffer on loopback: the datagram is lost and its search ends as lost.
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(format!("send to {to}: {e}")),
        }
    }

    /// Start one search: with ICP, a query to every other node; without, done at once.
    fn start(&mut self) -> Result<(), String> {
        self.started += 1;
        if !self.args.icp {
            self.spent.searches += 1;
            return Ok(());
        }
        let reqnum = self.next_reqnum;
        self.next_reqnum = self.next_reqnum.wrapping_add(1).max(1);
        let url = format!(
            "http://127.0.0.1:8080/floor/n{}/{reqnum}?size=4096",
            self.me
        );
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        icp::encode(&Message::query(reqnum, url), &mut out).map_err(|e| e.to_string())?;
        for &to in &self.others {
            self.send(&out, to)?;
        }
        self.out = out;
        self.outstanding
            .insert(reqnum, (self.others.len(), Instant::now()));
        Ok(())
    }

    /// Answer a query with `MISS_NOFETCH`, or count a reply towards its search.
    fn receive(&mut self, datagram: &[u8], from: SocketAddr) -> Result<(), String> {
        let Ok(msg) = icp::decode(datagram) else {
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
        if let Some((left, _)) = self.outstanding.get_mut(&msg.reqnum) {
            *left -= 1;
            if *left == 0 {
                self.outstanding.remove(&msg.reqnum);
                self.spent.searches += 1;
            }
        }
        Ok(())
    }

    /// Searches whose replies were lost end as lost.
    fn expire(&mut self, now: Instant) {
        let spent = &mut self.spent;
        self.outstanding.retain(|_, (_, since)| {
            let keep = now.duration_since(*since) < LOST_AFTER;
            if !keep {
                spent.lost += 1;
                spent.searches += 1;
            }
            keep
        });
    }
}

/// One node: bind, say so, wait for the go, then search and answer until every node's
/// searches are done.
fn node(args: &Args, me: u8) -> Result<Spent, String> {
    let here = address(args, me);
    let mut socket = UdpSocket::bind(here).map_err(|e| format!("bind {here}: {e}"))?;
    let mut poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    poll.registry()
        .register(&mut socket, Token(0), Interest::READABLE)
        .map_err(|e| format!("register: {e}"))?;
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
        others: (0..args.nodes)
            .filter(|&n| n != me)
            .map(|n| address(args, n))
            .collect(),
        outstanding: HashMap::new(),
        next_reqnum: 1,
        started: 0,
        spent: Spent::default(),
        out: Vec::with_capacity(128),
    };
    let pace = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    let mut done_peers = vec![false; usize::from(args.nodes)];
    done_peers[usize::from(me)] = true;
    let mut i_am_done = false;
    // A node still searching sends a query at least this often; once we are done, this much
    // silence means every other node is done too, even if its DONE was lost.
    let silence = pace
        .map_or(Duration::ZERO, |p| p * 3)
        .max(Duration::from_secs(2));
    let mut heard = Instant::now();
    let mut buf = vec![0u8; icp::MAX_DATAGRAM + 1];
    let mut events = Events::with_capacity(64);
    let deadline = Instant::now() + args.timeout;
    let t0 = Instant::now();

    loop {
        let now = Instant::now();
        if now > deadline {
            return Err(format!(
                "node {me}: not done after {:?} ({} of {} searches)",
                args.timeout, node.spent.searches, args.searches
            ));
        }
        node.expire(now);
        match pace {
            // Open loop: start what is due.
            Some(pace) => {
                while node.started < args.searches && t0 + pace.mul_f64(node.started as f64) <= now
                {
                    node.start()?;
                }
            }
            // Closed loop: keep `concurrency` searches in flight.
            None => {
                while node.started < args.searches
                    && (node.outstanding.len() as u64) < args.concurrency
                {
                    node.start()?;
                }
            }
        }
        if !i_am_done && node.spent.searches >= args.searches {
            i_am_done = true;
            for &to in &node.others {
                node.send(DONE, to)?;
            }
        }
        if i_am_done && (done_peers.iter().all(|d| *d) || now.duration_since(heard) > silence) {
            break;
        }

        let timeout = match pace {
            Some(pace) if node.started < args.searches => {
                (t0 + pace.mul_f64(node.started as f64)).saturating_duration_since(now)
            }
            _ if !node.outstanding.is_empty() => LOST_AFTER,
            // Done and waiting for the others: repeat DONE now and then in case one was lost.
            _ => Duration::from_millis(200),
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
            let (len, from) = match node.socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("recv: {e}")),
            };
            heard = Instant::now();
            if &buf[..len] == DONE {
                if let Some(n) = (0..args.nodes).find(|&n| address(args, n) == from) {
                    done_peers[usize::from(n)] = true;
                }
                continue;
            }
            node.receive(&buf[..len], from)?;
            // Closed loop: a completed search is replaced at once, as a client's next request.
            if pace.is_none() {
                while node.started < args.searches
                    && (node.outstanding.len() as u64) < args.concurrency
                {
                    node.start()?;
                }
            }
        }
    }
    let proc = Spent::of_this_process()?;
    Ok(Spent {
        searches: node.spent.searches,
        lost: node.spent.lost,
        answered: node.spent.answered,
        ..proc
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("icp-floor: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(me) = args.node {
        return match node(&args, me) {
            Ok(spent) => {
                println!("{}", spent.line());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("icp-floor: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match parent(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("icp-floor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Start every node, wait, and print the totals per search.
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
            .args(["--searches", &args.searches.to_string()])
            .args(["--concurrency", &args.concurrency.to_string()])
            .args(["--rate", &args.rate.to_string()])
            .args(["--protocol", if args.icp { "icp" } else { "none" }])
            .args(["--timeout", &args.timeout.as_secs().to_string()])
            .args(["--node", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        children.push(cmd.spawn().map_err(|e| format!("start node {n}: {e}"))?);
    }
    // Every node has bound its socket before any starts searching.
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
        match (status.success(), Spent::from_line(text.trim())) {
            (true, Some(s)) => {
                total.searches += s.searches;
                total.lost += s.lost;
                total.answered += s.answered;
                total.utime_s += s.utime_s;
                total.stime_s += s.stime_s;
                total.run_ns += s.run_ns;
                total.voluntary += s.voluntary;
                total.involuntary += s.involuntary;
            }
            _ => failed.push(n),
        }
    }
    if !failed.is_empty() {
        return Err(format!("nodes {failed:?} failed"));
    }
    let per = |x: f64| x / total.searches.max(1) as f64;
    println!(
        "protocol={} nodes={} load={} searches={} lost={} answered={} wall_s={:.2} \
         cpu_us_per_search={:.2} user_us={:.2} sys_us={:.2} run_us={:.2} \
         voluntary_per_search={:.3} involuntary_per_search={:.3}",
        if args.icp { "icp" } else { "none" },
        args.nodes,
        if args.rate > 0.0 {
            format!("rate{}", args.rate)
        } else {
            format!("closed{}", args.concurrency)
        },
        total.searches,
        total.lost,
        total.answered,
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
