//! Measurements the lab takes around a measured phase: process CPU from
//! `/proc/PID/stat` (and, exactly, from `/proc/PID/task/*/schedstat`), context switches
//! from `/proc/PID/task/*/status`, the network namespace's UDP and TCP counters from
//! `/proc/net/snmp`, steal time from `/proc/stat`, and the nodes' own
//! counters (meshcache's `/stats`, Squid's cache manager `counters` page).
//!
//! Each reading is a snapshot; the report uses the difference of two
//! snapshots, taken right before and right after the measured phase.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// CPU time of a process (all its threads, and its waited-for children), in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cpu {
    /// User time.
    pub user_s: f64,
    /// System time.
    pub sys_s: f64,
}

impl Cpu {
    /// `self - earlier`.
    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }
}

/// Clock ticks per second of `/proc` CPU figures (`getconf CLK_TCK`, 100 if unknown).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&t| t > 0.0)
        .unwrap_or(100.0)
}

/// Parses the CPU fields of a `/proc/PID/stat` line: utime + cutime, stime + cstime.
pub fn parse_proc_stat(line: &str, ticks: f64) -> Option<Cpu> {
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, so index 11.
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some(Cpu {
        user_s: (n(11)? + n(13)?) / ticks,
        sys_s: (n(12)? + n(14)?) / ticks,
    })
}

/// A process's CPU time now.
pub fn process_cpu(pid: u32, ticks: f64) -> io::Result<Cpu> {
    let line = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_proc_stat(&line, ticks)
        .ok_or_else(|| io::Error::other(format!("cannot parse /proc/{pid}/stat")))
}

/// The CPU time each live thread of a process has had, in nanoseconds, by thread id (the
/// scheduler's own account, `/proc/PID/task/TID/schedstat`; `/proc/PID/stat` gives the same in
/// 10 ms ticks).
pub fn thread_runtimes(pid: u32) -> io::Result<BTreeMap<u32, u64>> {
    let mut out = BTreeMap::new();
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(task) = task else { continue };
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // A thread may exit between the listing and the read.
        if let Some(ns) = fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            out.insert(tid, ns);
        }
    }
    Ok(out)
}

/// The CPU time a process's threads had between two readings of [`thread_runtimes`], in
/// seconds; `None` when a thread of the first reading is gone (its time since would be lost)
/// or either reading is empty.
pub fn runtime_between(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> Option<f64> {
    if before.is_empty() || after.is_empty() || before.keys().any(|t| !after.contains_key(t)) {
        return None;
    }
    let ns: u64 = after
        .iter()
        .map(|(t, &a)| a.saturating_sub(before.get(t).copied().unwrap_or(0)))
        .sum();
    Some(ns as f64 / 1e9)
}

/// Context switches of a process's threads: voluntary (it waited: for a socket, a lock, a
/// timer) and involuntary (the scheduler took the core away).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    /// Voluntary switches.
    pub voluntary: u64,
    /// Involuntary switches.
    pub involuntary: u64,
}

impl Switches {
    /// `self - earlier`, per field.
    pub fn since(self, e: Switches) -> Switches {
        Switches {
            voluntary: self.voluntary.saturating_sub(e.voluntary),
            involuntary: self.involuntary.saturating_sub(e.involuntary),
        }
    }
}

/// A process's context switches, summed over its threads alive now (`/proc/PID/task/*/status`;
/// a thread that exits takes its count with it, and a process's own `status` counts only its
/// first thread).
pub fn process_switches(pid: u32) -> io::Result<Switches> {
    let mut total = Switches::default();
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(task) = task else { continue };
        // A thread may exit between the listing and the read.
        if let Ok(status) = fs::read_to_string(task.path().join("status")) {
            let s = parse_switches(&status);
            total.voluntary += s.voluntary;
            total.involuntary += s.involuntary;
        }
    }
    Ok(total)
}

/// The `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a `status` file.
pub fn parse_switches(status: &str) -> Switches {
    let mut s = Switches::default();
    for line in status.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim().parse().unwrap_or(0);
        match k {
            "voluntary_ctxt_switches" => s.voluntary = v,
            "nonvoluntary_ctxt_switches" => s.involuntary = v,
            _ => {}
        }
    }
    s
}

/// Namespace-wide datagram and segment counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// UDP datagrams received.
    pub udp_in: u64,
    /// UDP datagrams sent.
    pub udp_out: u64,
    /// TCP segments received.
    pub tcp_in: u64,
    /// TCP segments sent.
    pub tcp_out: u64,
}

impl NetCounters {
    /// `self - earlier`, per field.
    pub fn since(self, e: NetCounters) -> NetCounters {
        NetCounters {
            udp_in: self.udp_in.saturating_sub(e.udp_in),
            udp_out: self.udp_out.saturating_sub(e.udp_out),
            tcp_in: self.tcp_in.saturating_sub(e.tcp_in),
            tcp_out: self.tcp_out.saturating_sub(e.tcp_out),
        }
    }
}

/// Parses `/proc/net/snmp` (pairs of header and value lines per protocol).
pub fn parse_snmp(text: &str) -> NetCounters {
    let mut values: HashMap<(String, String), u64> = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [head, vals] = pair else { continue };
        let mut h = head.split_whitespace();
        let mut v = vals.split_whitespace();
        let (Some(proto), Some(_)) = (h.next(), v.next()) else {
            continue;
        };
        for (name, value) in h.zip(v) {
            if let Ok(value) = value.parse() {
                values.insert((proto.to_string(), name.to_string()), value);
            }
        }
    }
    let get = |p: &str, n: &str| {
        values
            .get(&(p.to_string(), n.to_string()))
            .copied()
            .unwrap_or(0)
    };
    NetCounters {
        udp_in: get("Udp:", "InDatagrams"),
        udp_out: get("Udp:", "OutDatagrams"),
        tcp_in: get("Tcp:", "InSegs"),
        tcp_out: get("Tcp:", "OutSegs"),
    }
}

/// The namespace's counters now.
pub fn net_counters() -> io::Result<NetCounters> {
    Ok(parse_snmp(&fs::read_to_string("/proc/net/snmp")?))
}

/// Total and steal jiffies summed over all CPUs (the `cpu` line of `/proc/stat`).
pub fn steal_jiffies() -> io::Result<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| io::Error::other("no cpu line in /proc/stat"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    Ok((v.iter().sum(), v.get(7).copied().unwrap_or(0)))
}

/// GET `target` (origin-form path, or an absolute URI for a proxy) from `addr` with
/// `Connection: close`; returns the body of a 200 answer.
pub fn http_get(addr: SocketAddr, target: &str, timeout: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no response head from {addr}{target}")))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(io::Error::other(format!(
            "{addr} answered {status} to GET {target}"
        )));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(body));
    }
    Ok(body.to_string())
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// A node's own counters at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeCounters {
    /// Inter-cache datagrams sent (ICP queries and replies).
    pub udp_sent: u64,
    /// Inter-cache datagrams received.
    pub udp_received: u64,
    /// CPU seconds attributed to clients / peers / own searches (meshcache only).
    pub client_s: f64,
    /// See `client_s`.
    pub peer_s: f64,
    /// See `client_s`.
    pub search_s: f64,
    /// HTTP requests received from peers.
    pub peer_requests: u64,
    /// Bytes of inter-cache datagrams sent (ICP, summary updates).
    pub udp_bytes_sent: u64,
    /// Bytes of whole summaries or digests served to peers.
    pub summary_bytes_served: u64,
    /// Misses looked up in peers' summaries (one per peer consulted).
    pub summary_lookups: u64,
    /// Lookups a summary answered "maybe".
    pub summary_hits: u64,
    /// Summary hits the peer did not have.
    pub false_hits: u64,
    /// False hits the Bloom formula expects over the lookups made (each lookup adds the
    /// formula's rate for the summary as it was then).
    pub expected_false_hits: f64,
    /// At the snapshot: documents in the node's own summary (a gauge).
    pub summary_entries: u64,
    /// At the snapshot: bytes of the node's counting filter plus its copies of peers'
    /// summaries (a gauge).
    pub summary_memory: u64,
}

impl NodeCounters {
    /// `self - earlier`.
    pub fn since(&self, e: &NodeCounters) -> NodeCounters {
        NodeCounters {
            udp_sent: self.udp_sent.saturating_sub(e.udp_sent),
            udp_received: self.udp_received.saturating_sub(e.udp_received),
            client_s: (self.client_s - e.client_s).max(0.0),
            peer_s: (self.peer_s - e.peer_s).max(0.0),
            search_s: (self.search_s - e.search_s).max(0.0),
            peer_requests: self.peer_requests.saturating_sub(e.peer_requests),
            udp_bytes_sent: self.udp_bytes_sent.saturating_sub(e.udp_bytes_sent),
            summary_bytes_served: self
                .summary_bytes_served
                .saturating_sub(e.summary_bytes_served),
            summary_lookups: self.summary_lookups.saturating_sub(e.summary_lookups),
            summary_hits: self.summary_hits.saturating_sub(e.summary_hits),
            false_hits: self.false_hits.saturating_sub(e.false_hits),
            expected_false_hits: (self.expected_false_hits - e.expected_false_hits).max(0.0),
            summary_entries: self.summary_entries,
            summary_memory: self.summary_memory,
        }
    }
}

/// Reads a meshcache node's `/stats` JSON into counters.
pub fn parse_meshcache_stats(json: &serde_json::Value) -> NodeCounters {
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let icp = &json["icp"];
    let eff = &json["efficiency"];
    let sum = &json["summary"];
    let peers = sum["peers"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let stat = |k: &str| peers.iter().map(|p| u(&p["stats"][k])).sum::<u64>();
    let lookups = stat("lookups");
    let expected_false_hits = peers
        .iter()
        .map(|p| f(&p["stats"]["expected_false_hits"]))
        .sum::<f64>();
    NodeCounters {
        // Multicast queries are in `icp.queries_sent` once per datagram actually sent: one
        // per search in IP multicast mode (one IP multicast datagram is one message, however
        // many members receive it, as the directory-based DCM paper's footnote 3 counts it),
        // one per member in logical mode. `multicast.queries_sent` repeats them and is not
        // added. Each member that receives a copy counts it in its `icp.queries_received`.
        udp_sent: u(&icp["queries_sent"])
            + u(&icp["replies_sent"])
            + u(&sum["updates_sent"])
            + u(&icp["directory_sent"]),
        // Summary updates received are counted per sending peer (decoded ones) and together
        // (the ones refused: malformed, or from a source we exchange no summaries with).
        udp_received: u(&icp["queries_received"])
            + u(&icp["replies_received"])
            + u(&icp["directory_received"])
            + stat("updates")
            + u(&sum["bad_updates"]),
        client_s: f(&eff["client_s"]),
        peer_s: f(&eff["peer_s"]),
        search_s: f(&eff["search_s"]),
        peer_requests: u(&json["requests_received"]["from_peers"]),
        udp_bytes_sent: u(&icp["bytes_sent"]),
        summary_bytes_served: u(&sum["served_bytes"]),
        summary_lookups: lookups,
        summary_hits: stat("summary_hits"),
        false_hits: stat("false_hits"),
        expected_false_hits,
        summary_entries: u(&sum["local"]["entries"]),
        summary_memory: u(&sum["local"]["counter_bytes"]) + u(&sum["peer_memory_bytes"]),
    }
}

/// Reads Squid's cache manager `counters` page into counters.
pub fn parse_squid_counters(text: &str) -> NodeCounters {
    let mut c = NodeCounters::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        match k.trim() {
            "icp.pkts_sent" => c.udp_sent = v,
            "icp.pkts_recv" => c.udp_received = v,
            "icp.kbytes_sent" => c.udp_bytes_sent = v * 1024,
            "cd.kbytes_sent" => c.summary_bytes_served = v * 1024,
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_with_spaces_in_the_name() {
        let line = "1234 (my proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 10 5 20 0 1 0 \
                    100 1000 10 18446744073709551615";
        let cpu = parse_proc_stat(line, 100.0).expect("parses");
        assert!((cpu.user_s - 2.6).abs() < 1e-9, "{cpu:?}");
        assert!((cpu.sys_s - 0.55).abs() < 1e-9, "{cpu:?}");
        assert!(parse_proc_stat("garbage", 100.0).is_none());
    }

    #[test]
    fn context_switches_of_a_status_file_and_of_this_process() {
        let status = "Name:\tmeshcache\nThreads:\t3\nvoluntary_ctxt_switches:\t1234\n\
                      nonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(
            parse_switches(status),
            Switches {
                voluntary: 1234,
                involuntary: 56
            }
        );
        assert_eq!(parse_switches("garbage"), Switches::default());
        let before = process_switches(std::process::id()).expect("own tasks");
        std::thread::sleep(Duration::from_millis(5));
        let after = process_switches(std::process::id()).expect("own tasks");
        assert!(after.since(before).voluntary >= 1, "{before:?} {after:?}");
    }

    #[test]
    fn thread_runtimes_are_exact_and_refuse_lost_threads() {
        // This thread's own account (other tests' threads come and go meanwhile).
        let me: u32 = fs::read_link("/proc/thread-self")
            .expect("thread-self")
            .to_string_lossy()
            .rsplit('/')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("tid");
        let mine = || {
            let all = thread_runtimes(std::process::id()).expect("own tasks");
            *all.get(&me)
                .unwrap_or_else(|| panic!("thread {me} not in {all:?}"))
        };
        let before = mine();
        // Work this thread until its account shows 20 ms, however busy the machine is (a
        // wall-clock loop got less than that on a loaded machine); at most 10 s.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after - before < 20_000_000 && t.elapsed() < Duration::from_secs(10) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            after = mine();
        }
        let wall = t.elapsed().as_secs_f64();
        let spent = (after - before) as f64 / 1e9;
        assert!(spent >= 0.02, "{spent} s in {wall} s");
        // One thread cannot run longer than the wall clock: the account is of this thread.
        assert!(spent <= wall + 0.001, "{spent} s in {wall} s");
        let m = |v: &[(u32, u64)]| v.iter().copied().collect::<BTreeMap<u32, u64>>();
        // A new thread counts from zero; a lost one makes the reading unusable.
        assert_eq!(
            runtime_between(&m(&[(1, 100)]), &m(&[(1, 1_100), (2, 500)])),
            Some(1_500e-9)
        );
        assert_eq!(
            runtime_between(&m(&[(1, 100), (2, 5)]), &m(&[(1, 900)])),
            None
        );
        assert_eq!(runtime_between(&m(&[]), &m(&[(1, 900)])), None);
    }

    #[test]
    fn own_process_cpu_reads() {
        let cpu = process_cpu(std::process::id(), clock_ticks()).expect("own stat");
        assert!(cpu.user_s >= 0.0 && cpu.sys_s >= 0.0);
    }

    #[test]
    fn snmp_counters() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm InSegs OutSegs\nTcp: 1 500 600\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams\nUdp: 10 0 0 12\n";
        let c = parse_snmp(text);
        assert_eq!(
            c,
            NetCounters {
                udp_in: 10,
                udp_out: 12,
                tcp_in: 500,
                tcp_out: 600
            }
        );
        assert!(net_counters().is_ok());
    }

    #[test]
    fn multicast_queries_count_once_per_datagram() {
        // Two searches in IP mode: two datagrams, however many members got them; one HIT.
        let stats = serde_json::json!({
            "icp": {"queries_sent": 2, "replies_sent": 0, "queries_received": 4,
                    "replies_received": 1, "directory_sent": 0, "directory_received": 0},
            "multicast": {"mode": "ip", "queries_sent": 2, "searches": 2, "hits": 1},
        });
        let c = parse_meshcache_stats(&stats);
        assert_eq!((c.udp_sent, c.udp_received), (2, 5));
    }

    #[test]
    fn summary_updates_count_as_received() {
        // Three peers sent 10, 12 and 0 updates; one more datagram was refused.
        let stats = serde_json::json!({
            "icp": {"queries_sent": 3, "replies_sent": 2, "queries_received": 2,
                    "replies_received": 3, "directory_sent": 0, "directory_received": 0},
            "summary": {"updates_sent": 30, "bad_updates": 1, "peers": [
                {"stats": {"updates": 10, "lookups": 5}},
                {"stats": {"updates": 12, "lookups": 5}},
                {"stats": {"updates": 0, "lookups": 5}},
            ]},
        });
        let c = parse_meshcache_stats(&stats);
        assert_eq!((c.udp_sent, c.udp_received), (35, 28));
        assert_eq!(c.summary_lookups, 15);
    }

    #[test]
    fn squid_counters_page() {
        let text =
            "sample_time = 1.2\nicp.pkts_sent = 42\nicp.pkts_recv = 40\nicp.queries_sent = 21\n";
        let c = parse_squid_counters(text);
        assert_eq!((c.udp_sent, c.udp_received), (42, 40));
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
