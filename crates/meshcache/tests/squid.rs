//! ICP cooperation with a real Squid (Debian's 5.7): Squid as meshcache's sibling and parent,
//! meshcache as Squid's sibling, tshark dissecting every ICP datagram meshcache sends, and
//! failover from a Squid parent that is stopped (SIGSTOP) and then killed.
//!
//! Everything runs on loopback. Each test gives each Squid and each meshcache node its own
//! 127.0.0.x (Squid ignores ICP from its own address, whatever the port), picks free ports on
//! it, and stops its Squid by PID when done, also on panic (its logs are printed then). The
//! README's test command (`scripts/test.sh`) installs squid and tshark; without them these
//! tests fail and say so, unless MESHCACHE_SKIP_INTEROP=1.

mod common;
mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{bind, get, start, wait_icp_alive, Bound, Node};
use meshcache_dcm::Role;
use meshcache_lab::{expected_body, Origin};
use meshcache_proxy::config::PeerConfig;
use meshcache_proxy::Config;
use meshcache_wire::icp;
use support::{run, tool, Capture, Squid};

/// 127.0.0.n. This file uses 127.0.0.101..=127.0.0.136, one set per test.
fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// Binds a meshcache node with ICP, all of whose sockets are on `addr`.
fn mesh(name: &str, addr: Ipv4Addr, tweak: impl FnOnce(&mut Config)) -> Bound {
    bind(true, |c| {
        c.name = name.into();
        c.http.listen = vec![SocketAddr::from((addr, 0))];
        c.admin.listen = Some(SocketAddr::from((addr, 0)));
        c.cooperation.icp_listen = SocketAddr::from((addr, 0));
        tweak(c);
    })
}

fn peer(name: &str, role: Role, http: SocketAddr, icp: SocketAddr) -> PeerConfig {
    PeerConfig::new(name, role, http, Some(icp))
}

fn squid_peer(name: &str, role: Role, squid: &Squid) -> PeerConfig {
    peer(name, role, squid.http, squid.icp)
}

/// Field `i` (0-based) of a Squid-format access-log line: 3 = code/status, 5 = method,
/// 6 = URL, 8 = hierarchy/peer.
fn field(line: &str, i: usize) -> String {
    line.split_whitespace().nth(i).unwrap_or("").to_owned()
}

/// The meshcache access-log line for `url` (the `nth` one, 0-based), waiting up to 5 s.
async fn mesh_line(node: &Node, url: &str, nth: usize) -> String {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        if let Some(l) = text.lines().filter(|l| field(l, 6) == url).nth(nth) {
            return l.to_owned();
        }
        assert!(
            Instant::now() < until,
            "no access-log line #{nth} for {url} in:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 5 s) until Squid's cache manager shows a reply from its peer at `peer_ip`
/// ("PINGS ACKED" > 0), so Squid waits for that peer from now on.
async fn wait_squid_heard(squid: &Squid, peer_ip: Ipv4Addr) -> String {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let page = squid.mgr("server_list").await;
        // One block per peer; its "PINGS ACKED: N  P%" line counts the replies.
        let acked = page
            .lines()
            .skip_while(|l| !l.contains(&format!("{peer_ip}/")))
            .find(|l| l.trim_start().starts_with("PINGS ACKED"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if acked > 0 {
            return page;
        }
        assert!(
            Instant::now() < until,
            "squid {} never heard from {peer_ip}:\n{page}",
            squid.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// From a `server_list` page: how many `opcode` replies (e.g. "ICP_HIT") Squid counted from
/// its (only) peer, per its "Histogram of PINGS ACKED". Squid cuts the names to 12 characters
/// there (`ICP_MISS_NOFETCH` shows as `ICP_MISS_NOF`).
fn acked(page: &str, opcode: &str) -> u64 {
    page.lines()
        .find(|l| {
            let name = l.split(':').next().map(str::trim).unwrap_or("");
            !name.is_empty() && opcode.get(..12).unwrap_or(opcode) == name
        })
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Prints what Squid's cache.log says that looks like a complaint (for the record), and fails
/// on the ones that mean it rejected or mis-took something meshcache sent.
fn check_squid_log(squid: &Squid) {
    let complaints = squid.complaints();
    if !complaints.is_empty() {
        eprintln!(
            "squid {} cache.log warnings/errors:\n{}",
            squid.name,
            complaints.join("\n")
        );
    }
    let bad: Vec<&String> = complaints
        .iter()
        .filter(|l| {
            let u = l.to_ascii_uppercase();
            u.contains("REQNUM = 0")
                || u.contains("UNKNOWN OPCODE")
                || u.contains("UNUSED ICP VERSION")
                || u.contains("NON-PEER")
                || u.contains("FATAL")
                || u.contains("ASSERTION")
        })
        .collect();
    assert!(
        bad.is_empty(),
        "squid {} complained about ICP it received: {bad:#?}",
        squid.name
    );
}

fn cache_peer(ip: Ipv4Addr, kind: &str, node_http: SocketAddr, node_icp: SocketAddr) -> String {
    format!(
        "cache_peer {ip} {kind} {} {} name=meshcache no-digest no-netdb-exchange",
        node_http.port(),
        node_icp.port()
    )
}

/// 1. meshcache as Squid's sibling: Squid asks meshcache by ICP, fetches meshcache's hit
/// (`SIBLING_HIT/<meshcache>` in Squid's log, origin untouched), and goes DIRECT after
/// meshcache's MISS for what it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_fetches_hits_from_meshcache_as_its_sibling() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(101), ip(102));
    let mut squid = Squid::new("t1squid", s_ip);
    // Squid is a child of meshcache here: allowed to query, not a configured peer.
    let m = mesh("t1mesh", m_ip, |c| {
        c.cooperation.icp_allow = vec![format!("{s_ip}/32").parse().expect("net")];
    });
    let (m_http, m_icp) = (m.addr, m.icp.expect("icp"));
    let m = start(m, |_| {});
    squid
        .start(&squid_bin, &cache_peer(m_ip, "sibling", m_http, m_icp))
        .await;

    // meshcache holds an object.
    let held = origin.url("/t1-held?size=500&cc=max-age=600");
    let r = get(m.addr, &held).await;
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));

    // Warm-up: Squid queries meshcache for its first miss but, never having heard from it,
    // does not wait; meshcache's reply makes it a live peer.
    let warm = origin.url("/t1-warmup?size=1&cc=max-age=600");
    assert_eq!(get(squid.http, &warm).await.status, 200);
    wait_squid_heard(&squid, m_ip).await;

    // The hit: Squid fetches it from meshcache, not from the origin.
    let r = get(squid.http, &held).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, expected_body(500));
    assert_eq!(
        origin.hits("/t1-held?size=500&cc=max-age=600"),
        1,
        "served by meshcache"
    );
    let line = squid.http_line(&held).await;
    assert_eq!(field(&line, 8), format!("SIBLING_HIT/{m_ip}"), "{line}");
    eprintln!("squid's log for the sibling hit: {line}");
    eprintln!("client's headers through squid: {:?}", r.headers);
    // meshcache served Squid's only-if-cached request from its cache.
    let mline = mesh_line(&m, &held, 1).await;
    assert!(field(&mline, 3).contains("HIT/200"), "{mline}");
    assert_eq!(field(&mline, 2), s_ip.to_string(), "{mline}");

    // What meshcache lacks: it answers MISS (Squid is its child), Squid goes DIRECT.
    let lacked = origin.url("/t1-lacked?size=10&cc=max-age=600");
    let r = get(squid.http, &lacked).await;
    assert_eq!(r.status, 200);
    let line = squid.http_line(&lacked).await;
    assert_eq!(field(&line, 8), "HIER_DIRECT/127.0.0.1", "{line}");
    assert_eq!(origin.hits("/t1-lacked?size=10&cc=max-age=600"), 1);

    let s = m.stats().await;
    assert_eq!(
        s["icp"]["queries_received"], 3,
        "warm-up, held, lacked: {s}"
    );
    assert_eq!(s["icp"]["replies_sent"], 3, "{s}");
    assert_eq!(s["icp"]["denied"], 0, "{s}");
    assert_eq!(s["icp"]["dropped"], 0, "{s}");
    // Squid's own tally of meshcache's replies: one HIT, two MISSes.
    let page = squid.mgr("server_list").await;
    eprintln!("squid server_list:\n{page}");
    assert_eq!(acked(&page, "ICP_HIT"), 1, "{page}");
    assert_eq!(acked(&page, "ICP_MISS"), 2, "{page}");
    assert_eq!(acked(&page, "ICP_MISS_NOFETCH"), 0, "{page}");
    check_squid_log(&squid);
    m.stop().await;
}

/// 2. Squid as meshcache's sibling: after one warm-up exchange, meshcache's ICP query finds
/// Squid's copy (`SIBLING_HIT/<squid>` in meshcache's log, origin untouched); for what Squid
/// lacks it answers MISS and meshcache goes direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshcache_fetches_hits_from_squid_as_its_sibling() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(103), ip(104));
    let mut squid = Squid::new("t2squid", s_ip);
    squid.start(&squid_bin, "").await;
    let m = mesh("t2mesh", m_ip, |c| {
        // Decisions come from replies; a generous wait keeps a loaded machine from timing out.
        c.cooperation.icp_timeout_floor = Duration::from_secs(2);
    });
    let m = start(m, |c| {
        c.peers = vec![squid_peer("squid", Role::Sibling, &squid)]
    });

    // Squid holds an object.
    let held_pq = "/t2-held?size=700&cc=max-age=600";
    let held = origin.url(held_pq);
    assert_eq!(get(squid.http, &held).await.status, 200);
    assert_eq!(origin.hits(held_pq), 1);

    // Warm-up: meshcache queries Squid, does not wait for a peer never heard from, and the
    // reply (MISS) makes Squid a live peer.
    let warm = origin.url("/t2-warmup?size=1&cc=max-age=600");
    assert_eq!(get(m.addr, &warm).await.status, 200);
    let wline = mesh_line(&m, &warm, 0).await;
    assert_eq!(field(&wline, 8), "HIER_DIRECT/127.0.0.1", "{wline}");
    wait_icp_alive(&m, 0).await;

    let r = get(m.addr, &held).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, expected_body(700));
    assert_eq!(origin.hits(held_pq), 1, "served by squid, not the origin");
    let line = mesh_line(&m, &held, 0).await;
    assert_eq!(field(&line, 8), format!("SIBLING_HIT/{s_ip}"), "{line}");
    assert_eq!(field(&line, 3), "TCP_MISS/200", "{line}");
    eprintln!("meshcache's log for the sibling hit: {line}");
    eprintln!("client's headers through meshcache: {:?}", r.headers);
    // Squid logged our query as a UDP_HIT and served our only-if-cached fetch from memory.
    let q = squid
        .log_line(|l| field(l, 5) == "ICP_QUERY" && field(l, 6) == held)
        .await;
    assert_eq!(field(&q, 3), "UDP_HIT/000", "{q}");
    assert_eq!(field(&q, 2), m_ip.to_string(), "{q}");
    // (The first request for it in Squid's log is the one that filled its cache.)
    let fetched = squid.http_line_nth(&held, 1).await;
    assert!(field(&fetched, 3).contains("HIT/200"), "{fetched}");
    // meshcache kept a copy.
    assert_eq!(get(m.addr, &held).await.x_cache(), "HIT");

    // What Squid lacks: MISS, and meshcache goes to the origin itself.
    let lacked_pq = "/t2-lacked?size=3&cc=max-age=600";
    let lacked = origin.url(lacked_pq);
    assert_eq!(get(m.addr, &lacked).await.status, 200);
    let line = mesh_line(&m, &lacked, 0).await;
    assert_eq!(field(&line, 8), "HIER_DIRECT/127.0.0.1", "{line}");
    assert_eq!(origin.hits(lacked_pq), 1);
    let q = squid
        .log_line(|l| field(l, 5) == "ICP_QUERY" && field(l, 6) == lacked)
        .await;
    assert_eq!(field(&q, 3), "UDP_MISS/000", "{q}");

    let s = m.stats().await;
    let p = &s["peers"][0]["stats"];
    assert_eq!(p["queries"], 3, "{s}");
    assert_eq!(p["hits"], 1, "{s}");
    assert_eq!(p["misses"], 2, "{s}");
    assert_eq!(p["timeouts"], 0, "{s}");
    assert_eq!(p["late"], 0, "{s}");
    assert_eq!(s["icp"]["queries_sent"], 3, "{s}");
    assert_eq!(s["icp"]["replies_received"], 3, "{s}");
    check_squid_log(&squid);
    m.stop().await;
}

/// 3. Squid as meshcache's parent: with a second parent (a meshcache node) both queried,
/// what Squid holds is a `PARENT_HIT/<squid>`; with Squid the only parent, meshcache sends
/// no ICP at all and logs `SINGLE_PARENT/<squid>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_as_meshcache_parent() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip, n_ip, m2_ip) = (ip(105), ip(106), ip(107), ip(108));
    let mut squid = Squid::new("t3squid", s_ip);
    squid.start(&squid_bin, "").await;
    let other = mesh("t3other", n_ip, |c| {
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")];
    });
    let (n_http, n_icp) = (other.addr, other.icp.expect("icp"));
    let other = start(other, |_| {});
    let m = mesh("t3child", m_ip, |c| {
        c.cooperation.icp_timeout_floor = Duration::from_secs(2);
    });
    let m = start(m, |c| {
        c.peers = vec![
            squid_peer("squid", Role::Parent, &squid),
            peer("other", Role::Parent, n_http, n_icp),
        ]
    });

    let held_pq = "/t3-held?size=300&cc=max-age=600";
    let held = origin.url(held_pq);
    assert_eq!(get(squid.http, &held).await.status, 200);

    // Warm-up: both parents answer once.
    let warm = origin.url("/t3-warmup?size=1&cc=max-age=600");
    assert_eq!(get(m.addr, &warm).await.status, 200);
    wait_icp_alive(&m, 0).await;
    wait_icp_alive(&m, 1).await;

    let r = get(m.addr, &held).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, expected_body(300));
    assert_eq!(origin.hits(held_pq), 1, "served from squid's cache");
    let line = mesh_line(&m, &held, 0).await;
    assert_eq!(field(&line, 8), format!("PARENT_HIT/{s_ip}"), "{line}");

    // Neither holds it: both MISS, and the first parent MISS takes it (no TIMEOUT_ prefix).
    let lacked_pq = "/t3-lacked?size=5&cc=max-age=600";
    let lacked = origin.url(lacked_pq);
    assert_eq!(get(m.addr, &lacked).await.status, 200);
    let line = mesh_line(&m, &lacked, 0).await;
    let hier = field(&line, 8);
    assert!(
        hier == format!("FIRST_PARENT_MISS/{s_ip}") || hier == format!("FIRST_PARENT_MISS/{n_ip}"),
        "{line}"
    );
    let s = m.stats().await;
    assert_eq!(s["icp"]["queries_sent"], 6, "3 searches x 2 parents: {s}");
    assert_eq!(s["peers"][0]["stats"]["hits"], 1, "{s}");
    assert_eq!(s["peers"][0]["stats"]["timeouts"], 0, "{s}");
    assert_eq!(s["peers"][1]["stats"]["timeouts"], 0, "{s}");

    // Squid as the only parent: no ICP, SINGLE_PARENT.
    let m2 = mesh("t3single", m2_ip, |_| {});
    let m2 = start(m2, |c| {
        c.peers = vec![squid_peer("squid", Role::Parent, &squid)]
    });
    for i in 0..3 {
        let url = origin.url(&format!("/t3-single{i}?size=10&cc=max-age=600"));
        let r = get(m2.addr, &url).await;
        assert_eq!(r.status, 200);
        let line = mesh_line(&m2, &url, 0).await;
        assert_eq!(field(&line, 8), format!("SINGLE_PARENT/{s_ip}"), "{line}");
        let sline = squid.http_line(&url).await;
        assert_eq!(field(&sline, 3), "TCP_MISS/200", "{sline}");
        assert_eq!(field(&sline, 8), "HIER_DIRECT/127.0.0.1", "{sline}");
    }
    // The held object, through the single parent, is Squid's hit.
    let r = get(m2.addr, &held).await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits(held_pq), 1);
    let s2 = m2.stats().await;
    assert_eq!(s2["icp"]["queries_sent"], 0, "{s2}");
    assert_eq!(s2["peers"][0]["stats"]["queries"], 0, "{s2}");
    let text = std::fs::read_to_string(squid.access_log()).expect("squid log");
    assert!(
        !text
            .lines()
            .any(|l| field(l, 5) == "ICP_QUERY" && field(l, 2) == m2_ip.to_string()),
        "squid got ICP from the single-parent child:\n{text}"
    );
    check_squid_log(&squid);
    m2.stop().await;
    m.stop().await;
    other.stop().await;
}

/// One ICP datagram as tshark dissected it.
#[derive(Debug)]
struct Dissected {
    src: String,
    src_port: u16,
    opcode: u8,
    version: String,
    icp_len: usize,
    udp_len: usize,
    url: String,
}

/// 4. tshark dissects every ICP datagram meshcache sends (queries, HIT, MISS_NOFETCH, DENIED,
/// ERR) with no malformed-packet or expert warning, and counts as many as meshcache's
/// counters say it sent and received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tshark_decodes_every_icp_packet_meshcache_sends() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let Some(tshark) = tool("tshark") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(109), ip(110));
    let mut squid = Squid::new("t4squid", s_ip);
    let m = mesh("t4mesh", m_ip, |c| {
        c.cooperation.icp_timeout_floor = Duration::from_secs(2);
    });
    let (m_http, m_icp) = (m.addr, m.icp.expect("icp"));
    let port = m_icp.port();
    let mut capture = Capture::start(&tshark, &format!("udp and host {m_ip} and port {port}"));
    squid
        .start(&squid_bin, &cache_peer(m_ip, "sibling", m_http, m_icp))
        .await;
    let m = start(m, |c| {
        c.peers = vec![squid_peer("squid", Role::Sibling, &squid)]
    });

    // Each side caches one object, and the first exchange each way wakes the other side up:
    // meshcache queries Squid (MISS), Squid queries meshcache (MISS_NOFETCH: a sibling).
    let a = origin.url("/t4-a?size=100&cc=max-age=600");
    let b = origin.url("/t4-b?size=200&cc=max-age=600");
    assert_eq!(get(m.addr, &a).await.status, 200);
    assert_eq!(get(squid.http, &b).await.status, 200);
    wait_icp_alive(&m, 0).await;
    wait_squid_heard(&squid, m_ip).await;
    // Hits both ways (meshcache answers HIT, Squid answers HIT), then misses both ways.
    assert_eq!(get(m.addr, &b).await.status, 200);
    assert_eq!(
        field(&mesh_line(&m, &b, 0).await, 8),
        format!("SIBLING_HIT/{s_ip}")
    );
    assert_eq!(get(squid.http, &a).await.status, 200);
    assert_eq!(
        field(&squid.http_line(&a).await, 8),
        format!("SIBLING_HIT/{m_ip}")
    );
    assert_eq!(get(m.addr, &origin.url("/t4-c?size=1")).await.status, 200);
    assert_eq!(
        get(squid.http, &origin.url("/t4-d?size=1")).await.status,
        200
    );
    // A stranger's query (DENIED), a query without its NUL (ERR, empty URL) and one whose URL
    // has a space (ERR).
    let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let mut q = Vec::new();
    icp::encode(&icp::Message::query(77, origin.url("/t4-stranger")), &mut q).expect("encode");
    let no_nul = {
        let mut d = q.clone();
        d.pop();
        let len = d.len() as u16;
        d[2..4].copy_from_slice(&len.to_be_bytes());
        d[4..8].copy_from_slice(&78u32.to_be_bytes());
        d
    };
    let mut spaced = Vec::new();
    icp::encode(
        &icp::Message::query(79, "http://127.0.0.1:9/a b"),
        &mut spaced,
    )
    .expect("encode");
    let mut replies = Vec::new();
    for d in [&q, &no_nul, &spaced] {
        stranger.send_to(d, m_icp).await.expect("send");
        let mut buf = [0u8; 2048];
        let (n, _) = tokio::time::timeout(Duration::from_secs(2), stranger.recv_from(&mut buf))
            .await
            .expect("meshcache answered")
            .expect("recv");
        replies.push(icp::decode(&buf[..n]).expect("decodes").opcode);
    }
    assert_eq!(
        replies,
        [icp::Opcode::Denied, icp::Opcode::Err, icp::Opcode::Err]
    );
    // Squid's own tally of meshcache's replies: MISS_NOFETCH (b, d: Squid is its sibling), HIT (a).
    let page = squid.mgr("server_list").await;
    assert_eq!(acked(&page, "ICP_HIT"), 1, "{page}");
    assert_eq!(acked(&page, "ICP_MISS_NOFETCH"), 2, "{page}");
    assert_eq!(acked(&page, "ICP_MISS"), 0, "{page}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tshark_said = capture.stop();
    let s = m.stats().await;
    let c = &s["icp"];
    let n = |k: &str| c[k].as_u64().expect("counter") as usize;
    let sent = n("queries_sent") + n("replies_sent");
    let received = n("queries_received") + n("replies_received") + n("dropped");

    let file = capture.file.to_str().expect("utf-8 path").to_owned();
    let decode_as = format!("udp.port=={port},icp");
    let (ok, out, err) = run(
        &tshark,
        &[
            "-r",
            &file,
            "-d",
            &decode_as,
            "-Y",
            "icp",
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "ip.src",
            "-e",
            "udp.srcport",
            "-e",
            "icp.opcode",
            "-e",
            "icp.version",
            "-e",
            "icp.length",
            "-e",
            "udp.length",
            "-e",
            "icp.url",
        ],
    );
    assert!(ok, "tshark -r failed: {err}");
    let packets: Vec<Dissected> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            Dissected {
                src: f[0].into(),
                src_port: f[1].parse().expect("port"),
                // tshark prints it in hex ("0x02").
                opcode: u8::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(255),
                version: f[3].into(),
                icp_len: f[4].parse().unwrap_or(0),
                udp_len: f[5].parse().unwrap_or(0),
                url: f.get(6).copied().unwrap_or("").into(),
            }
        })
        .collect();
    let from_m: Vec<&Dissected> = packets
        .iter()
        .filter(|p| p.src == m_ip.to_string() && p.src_port == port)
        .collect();
    let to_m = packets.len() - from_m.len();
    eprintln!(
        "tshark: {} ICP datagrams, {} from meshcache (counters: {sent} sent), {to_m} to it \
         (counters: {received} received); capture: {tshark_said}",
        packets.len(),
        from_m.len()
    );
    assert_eq!(from_m.len(), sent, "{s}\n{packets:#?}");
    assert_eq!(to_m, received, "{s}\n{packets:#?}");
    for p in &from_m {
        assert_eq!(p.version, "2", "{p:?}");
        assert_eq!(p.icp_len + 8, p.udp_len, "length field = datagram: {p:?}");
    }
    let mut opcodes: Vec<u8> = from_m.iter().map(|p| p.opcode).collect();
    opcodes.sort_unstable();
    opcodes.dedup();
    // QUERY, HIT, ERR, MISS_NOFETCH, DENIED.
    assert_eq!(opcodes, [1, 2, 4, 21, 22], "{from_m:#?}");
    assert!(
        from_m.iter().any(|p| p.opcode == 2 && p.url == a),
        "{from_m:#?}"
    );

    // No malformed packet, no expert info, on anything meshcache sent.
    let from_filter = format!("ip.src=={m_ip} && udp.srcport=={port}");
    let flagged = format!("({from_filter}) && (_ws.malformed || _ws.expert || !icp)");
    let (ok, out, err) = run(&tshark, &["-r", &file, "-d", &decode_as, "-Y", &flagged]);
    assert!(ok, "{err}");
    if !out.trim().is_empty() {
        // Say why tshark flagged them: its expert notes and malformation markers.
        let (_, why, _) = run(
            &tshark,
            &["-r", &file, "-d", &decode_as, "-Y", &flagged, "-V"],
        );
        let notes: Vec<&str> = why
            .lines()
            .filter(|l| {
                l.contains("Expert")
                    || l.contains("Malformed")
                    || l.contains("[") && l.contains("]")
            })
            .collect();
        panic!("flagged packets:\n{out}\nwhy:\n{}", notes.join("\n"));
    }
    let (ok, verbose, err) = run(
        &tshark,
        &["-r", &file, "-d", &decode_as, "-Y", &from_filter, "-V"],
    );
    assert!(ok, "{err}");
    assert_eq!(
        verbose.matches("Internet Cache Protocol").count(),
        sent,
        "{verbose}"
    );
    for bad in ["Malformed", "Expert Info", "Exception", "[truncated]"] {
        assert!(!verbose.contains(bad), "tshark -V says {bad}:\n{verbose}");
    }
    let (ok, expert, err) = run(
        &tshark,
        &[
            "-r",
            &file,
            "-d",
            &decode_as,
            "-2",
            "-R",
            &from_filter,
            "-q",
            "-z",
            "expert",
        ],
    );
    assert!(ok, "{err}");
    eprintln!("tshark -z expert (meshcache's datagrams):\n{expert}");
    for bad in ["Malformed", "Error", "Warning"] {
        assert!(!expert.contains(bad), "-z expert reports {bad}:\n{expert}");
    }
    check_squid_log(&squid);
    m.stop().await;
}

/// Sends 30 requests for distinct URLs, one every 150 ms, stopping `squid` (SIGSTOP) before
/// request 10 and killing it (SIGKILL) before request 20. Every request must succeed within
/// `bound`. Returns the hierarchy field meshcache logged for each.
async fn failover_run(
    m: &Node,
    squid: &mut Squid,
    origin: &Origin,
    tag: &str,
    bound: Duration,
) -> Vec<String> {
    let mut hiers = Vec::new();
    for i in 0..30 {
        if i == 10 {
            squid.signal("-STOP");
        }
        if i == 20 {
            squid.signal("-KILL");
            squid.reap();
        }
        let url = origin.url(&format!("/{tag}-{i}?size=100&cc=max-age=600"));
        let t = Instant::now();
        let r = get(m.addr, &url).await;
        let took = t.elapsed();
        assert_eq!(r.status, 200, "request {i}: {:?}", r.body);
        assert_eq!(r.body, expected_body(100), "request {i}");
        assert!(took < bound, "request {i} took {took:?}");
        hiers.push(field(&mesh_line(m, &url, 0).await, 8));
        // Long enough for the 1 s back-off to run out while the Squid is still stopped.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    hiers
}

/// 5a. Failover between two parents taken in order (no ICP): the first, a Squid, is stopped
/// mid-run and later killed. No request fails; none takes more than `peer_response_timeout`
/// plus a margin; meshcache marks the Squid down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_then_killed_squid_parent_costs_no_request() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip, n_ip) = (ip(111), ip(112), ip(113));
    let mut squid = Squid::new("t5squid", s_ip);
    squid.start(&squid_bin, "").await;
    let other = mesh("t5other", n_ip, |_| {});
    let (n_http, n_icp) = (other.addr, other.icp.expect("icp"));
    let other = start(other, |_| {});
    let m = mesh("t5child", m_ip, |c| {
        c.cooperation.peer_response_timeout = Duration::from_millis(500);
    });
    let m = start(m, |c| {
        c.peers = vec![
            PeerConfig {
                no_query: true,
                ..squid_peer("squid", Role::Parent, &squid)
            },
            PeerConfig {
                no_query: true,
                ..peer("other", Role::Parent, n_http, n_icp)
            },
        ]
    });
    let started = Instant::now();
    let hiers = failover_run(&m, &mut squid, &origin, "t5", Duration::from_millis(1500)).await;
    eprintln!(
        "failover run took {:?}; hierarchy: {hiers:?}",
        started.elapsed()
    );
    // The dead Squid is down whenever looked at right after a request: skipped while backing
    // off, or probed (refused) and backing off again. If its back-off ran out since the last
    // request, one more request probes it.
    let mut s = m.stats().await;
    if s["peers"][0]["up"] == true {
        let url = origin.url("/t5-extra?size=1");
        assert_eq!(get(m.addr, &url).await.status, 200);
        s = m.stats().await;
    }
    let sq = &s["peers"][0];
    assert_eq!(sq["up"], false, "squid marked down: {s}");
    let failures = sq["stats"]["fetch_failures"].as_u64().expect("n");
    assert!(failures >= 2, "stalled, then refused: {s}");
    assert_eq!(s["peers"][1]["stats"]["fetch_failures"], 0, "{s}");
    assert_eq!(s["icp"]["queries_sent"], 0, "{s}");
    // While the Squid is down the other parent is the only one up: Squid's getSingleParent()
    // also counts only parents that are up, so both codes are right for it.
    for (i, h) in hiers.iter().enumerate() {
        let ok = if i < 10 {
            *h == format!("FIRSTUP_PARENT/{s_ip}")
        } else {
            *h == format!("FIRSTUP_PARENT/{n_ip}") || *h == format!("SINGLE_PARENT/{n_ip}")
        };
        assert!(ok, "request {i}: {hiers:?}");
    }
    m.stop().await;
    other.stop().await;
}

/// 5b. The same with both parents queried by ICP: a stopped Squid costs at most the ICP wait
/// (`TIMEOUT_FIRST_PARENT_MISS` to the other parent) until `dead_peer_timeout`, then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_icp_search_survives_a_stopped_then_killed_squid_parent() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip, n_ip) = (ip(114), ip(115), ip(116));
    let mut squid = Squid::new("t5bsquid", s_ip);
    squid.start(&squid_bin, "").await;
    let other = mesh("t5bother", n_ip, |c| {
        c.cooperation.icp_allow = vec!["127.0.0.0/8".parse().expect("net")];
    });
    let (n_http, n_icp) = (other.addr, other.icp.expect("icp"));
    let other = start(other, |_| {});
    let m = mesh("t5bchild", m_ip, |c| {
        c.cooperation.peer_response_timeout = Duration::from_millis(500);
        c.cooperation.icp_timeout_floor = Duration::from_millis(300);
        c.cooperation.icp_timeout_ceiling = Duration::from_millis(300);
        c.cooperation.dead_peer_timeout = Duration::from_secs(1);
    });
    let m = start(m, |c| {
        c.peers = vec![
            squid_peer("squid", Role::Parent, &squid),
            peer("other", Role::Parent, n_http, n_icp),
        ]
    });
    assert_eq!(
        get(m.addr, &origin.url("/t5b-warmup?size=1")).await.status,
        200
    );
    wait_icp_alive(&m, 0).await;
    wait_icp_alive(&m, 1).await;
    let hiers = failover_run(&m, &mut squid, &origin, "t5b", Duration::from_millis(1500)).await;
    let s = m.stats().await;
    eprintln!("ICP failover hierarchy: {hiers:?}");
    let sq = &s["peers"][0];
    assert_eq!(sq["icp_alive"], false, "{s}");
    assert!(sq["stats"]["timeouts"].as_u64().expect("n") >= 1, "{s}");
    assert_eq!(s["peers"][1]["icp_alive"], true, "{s}");
    for (i, h) in hiers.iter().enumerate() {
        let ok = if i < 10 {
            h.starts_with("FIRST_PARENT_MISS/")
        } else {
            *h == format!("FIRST_PARENT_MISS/{n_ip}")
                || *h == format!("TIMEOUT_FIRST_PARENT_MISS/{n_ip}")
        };
        assert!(ok, "request {i}: {hiers:?}");
    }
    // Once the stopped Squid is no longer waited for, requests take no ICP timeout.
    assert_eq!(hiers[29], format!("FIRST_PARENT_MISS/{n_ip}"), "{hiers:?}");
    m.stop().await;
    other.stop().await;
}

/// Waits (at most `secs`) until `node`'s summary of peer `i` satisfies `ok`.
async fn wait_peer_summary(
    node: &Node,
    i: usize,
    secs: u64,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = node.stats().await;
        if ok(&s["summary"]["peers"][i]) {
            return s;
        }
        assert!(Instant::now() < until, "{what}: {}", s["summary"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 6. Cache Digests, Squid reading ours: Squid fetches meshcache's digest at Squid's URL and
/// then goes straight to meshcache for what the digest shows (`CD_SIBLING_HIT`), with no ICP.
/// Squid 5.7 misreads part of the first buffer of a digest it fetches (its bug 5510: false
/// misses), so of many cached objects we ask for several and require that digest hits happen
/// and that every answer is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_reads_meshcaches_digest_and_fetches_its_hits() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(131), ip(132));
    let m = mesh("t6mesh", m_ip, |c| {
        c.cooperation.protocol = meshcache_proxy::config::Protocol::Digest;
        c.cooperation.digest_rebuild_period = Duration::from_secs(1);
    });
    let m_http = m.addr;
    let m = start(m, |_| {});
    let urls: Vec<String> = (0..40)
        .map(|i| origin.url(&format!("/t6-{i}?size=700&cc=max-age=3600")))
        .collect();
    for u in &urls {
        assert_eq!(get(m.addr, u).await.status, 200);
    }
    // The next rebuild (1 s) puts them in the digest Squid will fetch.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut squid = Squid::new("t6squid", s_ip);
    let extra = format!(
        "{}cache_peer {} sibling {} 0 name=mesh no-query\n",
        squid.digest_lines(5),
        m_http.ip(),
        m_http.port()
    );
    squid.create_swap_dirs(&squid_bin, &extra);
    squid.start(&squid_bin, &extra).await;
    // The first lookup that consults the peer's digest makes Squid fetch it.
    let warm = origin.url("/t6-warmup?size=1");
    assert_eq!(get(squid.http, &warm).await.status, 200);
    let until = Instant::now() + Duration::from_secs(20);
    while m.stats().await["summary"]["served"].as_u64().unwrap_or(0) == 0 {
        assert!(
            Instant::now() < until,
            "Squid never fetched meshcache's digest:\n{}",
            squid.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Squid logs neither its digest fetch nor when it starts using the digest: request the
    // spare objects (urls[20..]) one at a time until one is a CD_SIBLING_HIT, so the 20
    // measured below run against a digest Squid has installed.
    let mut spares = urls.iter().skip(20);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let Some(u) = spares.next() else {
            panic!(
                "no spare object became a CD_SIBLING_HIT:\n{}",
                squid.diagnostics()
            );
        };
        assert_eq!(get(squid.http, u).await.status, 200, "{u}");
        let line = squid.http_line(u).await;
        if field(&line, 8) == format!("CD_SIBLING_HIT/{m_ip}") {
            break;
        }
        assert!(
            Instant::now() < until,
            "Squid used meshcache's digest for none of the spare objects:\n{}",
            squid.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut cd_hits = 0;
    for u in urls.iter().take(20) {
        let r = get(squid.http, u).await;
        assert_eq!(r.status, 200, "{u}");
        assert_eq!(r.body, expected_body(700));
        let line = squid.http_line(u).await;
        if field(&line, 8) == format!("CD_SIBLING_HIT/{m_ip}") {
            cd_hits += 1;
        }
    }
    let s = m.stats().await;
    eprintln!(
        "Squid digest hits on meshcache: {cd_hits}/20; meshcache served {} digest(s)",
        s["summary"]["served"]
    );
    assert!(
        cd_hits >= 5,
        "CD_SIBLING_HIT for {cd_hits}/20:\n{}",
        squid.diagnostics()
    );
    assert_eq!(s["icp"]["queries_received"], 0, "no ICP was needed: {s}");
    m.stop().await;
}

/// 7. Cache Digests, meshcache reading Squid's: meshcache fetches Squid's digest and goes
/// straight to Squid (with `only-if-cached`) for what it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshcache_reads_squids_digest_and_fetches_its_hits() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(133), ip(134));
    let mut squid = Squid::new("t7squid", s_ip);
    let extra = squid.digest_lines(3);
    squid.create_swap_dirs(&squid_bin, &extra);
    squid.start(&squid_bin, &extra).await;
    let urls: Vec<String> = (0..30)
        .map(|i| origin.url(&format!("/t7-{i}?size=900&cc=max-age=3600")))
        .collect();
    for u in &urls {
        assert_eq!(get(squid.http, u).await.status, 200);
    }
    let m = mesh("t7mesh", m_ip, |c| {
        c.cooperation.protocol = meshcache_proxy::config::Protocol::Digest;
        c.cooperation.digest_rebuild_period = Duration::from_secs(1);
    });
    let s_http = squid.http;
    let m = start(m, |c| {
        c.peers = vec![PeerConfig::new("squid", Role::Sibling, s_http, None)];
    });
    // Squid rebuilds its digest every 3 s; meshcache refetches it at least every second.
    // Squid's store starts with its ~50 icons; wait for a digest built after our 30 objects.
    let first = wait_peer_summary(&m, 0, 30, "Squid's first digest", |p| p["valid"] == true).await;
    let icons = first["summary"]["peers"][0]["entries"]
        .as_u64()
        .unwrap_or(0);
    wait_peer_summary(&m, 0, 30, "Squid's digest with the objects", |p| {
        p["entries"].as_u64().unwrap_or(0) >= icons + 30
    })
    .await;
    let mut cd_hits = 0;
    for u in urls.iter().take(10) {
        let r = get(m.addr, u).await;
        assert_eq!(r.status, 200, "{u}");
        assert_eq!(r.body, expected_body(900));
        if mesh_line(&m, u, 0)
            .await
            .contains(&format!("CD_SIBLING_HIT/{s_ip}"))
        {
            cd_hits += 1;
        }
    }
    let s = m.stats().await;
    assert_eq!(cd_hits, 10, "every object Squid holds is a digest hit: {s}");
    assert_eq!(s["icp"]["queries_sent"], 0, "{s}");
    // Squid served them from its cache.
    let line = squid.http_line_nth(&urls[0], 1).await;
    assert!(field(&line, 3).contains("HIT"), "{line}");
    // Something Squid does not hold is not a digest hit (bar a Bloom false positive).
    let other = origin.url("/t7-not-at-squid?size=5");
    assert_eq!(get(m.addr, &other).await.status, 200);
    let peer = &m.stats().await["summary"]["peers"][0];
    eprintln!("Squid's digest as meshcache sees it: {peer}");
    m.stop().await;
}

/// 8. A restart with a disk: what meshcache stored before it stopped is on its disk; started
/// again, it answers Squid's ICP queries for those objects with HIT and serves them from the
/// disk (`SIBLING_HIT/<meshcache>` in Squid's log, `TCP_HIT` in meshcache's, origin untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_finds_meshcaches_restored_objects_after_a_restart() {
    let Some(squid_bin) = tool("squid") else {
        return;
    };
    let origin = Origin::start().await.expect("origin");
    let (s_ip, m_ip) = (ip(135), ip(136));
    let dir = tempfile::tempdir().expect("tmp");
    let with_disk = |c: &mut Config| {
        c.cooperation.icp_allow = vec![format!("{s_ip}/32").parse().expect("net")];
        c.store.disks = vec![meshcache_proxy::config::DiskSection {
            path: dir.path().join("cache"),
            size: 16 << 20,
            sync_interval: Duration::from_millis(200),
        }];
    };
    let paths: Vec<String> = (0..5)
        .map(|i| format!("/t8-{i}?size={}&cc=max-age=600", 300 + i * 20_000))
        .collect();
    let m = start(mesh("t8mesh", m_ip, with_disk), |_| {});
    for p in &paths {
        assert_eq!(get(m.addr, &origin.url(p)).await.x_cache(), "MISS");
    }
    let cache = m.proxy.cache().clone();
    assert!(
        tokio::task::spawn_blocking(move || cache.flush_disks(Duration::from_secs(10)))
            .await
            .expect("joined")
    );
    m.stop().await;

    let m = start(mesh("t8mesh", m_ip, with_disk), |_| {});
    let until = Instant::now() + Duration::from_secs(10);
    while !m.proxy.cache().disks_rebuilt() {
        assert!(Instant::now() < until, "the disk was not rebuilt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (m_http, m_icp) = (m.addr, m.proxy.config().cooperation.icp_listen);
    let mut squid = Squid::new("t8squid", s_ip);
    squid
        .start(&squid_bin, &cache_peer(m_ip, "sibling", m_http, m_icp))
        .await;
    let warm = origin.url("/t8-warmup?size=1&cc=max-age=600");
    assert_eq!(get(squid.http, &warm).await.status, 200);
    wait_squid_heard(&squid, m_ip).await;
    for (i, p) in paths.iter().enumerate() {
        let url = origin.url(p);
        let r = get(squid.http, &url).await;
        assert_eq!(r.status, 200, "{p}");
        assert_eq!(r.body, expected_body(300 + i * 20_000), "{p}");
        assert_eq!(origin.hits(p), 1, "{p}: served by meshcache from its disk");
        let line = squid.http_line(&url).await;
        assert_eq!(field(&line, 8), format!("SIBLING_HIT/{m_ip}"), "{line}");
        let mline = mesh_line(&m, &url, 0).await;
        assert!(field(&mline, 3).starts_with("TCP_HIT/200"), "{mline}");
    }
    check_squid_log(&squid);
    m.stop().await;
}
