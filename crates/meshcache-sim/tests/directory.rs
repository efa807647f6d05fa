//! The directory protocol (dbDCM) in the simulator: exact message counts by hand, and the
//! directory paper's scaling claim.

use meshcache_sim::spec::{Protocol, Replay};
use meshcache_sim::{Results, SimSpec, Trace};
use meshcache_store::StoreKey;
use meshcache_workload::generate::{generate, Benchmark, WorkloadSpec};
use meshcache_workload::Request;

mod common;
use common::{req, run, serial};

/// The `n`-th URL (of `http://h/<prefix><i>`) whose directory entry the leaf `owner` keeps
/// in a mesh of four.
fn owned_by(owner: u32, prefix: &str, n: usize) -> String {
    owned_by_with(owner, prefix, "", n)
}

/// As [`owned_by`], of `http://h/<prefix><i><suffix>`.
fn owned_by_with(owner: u32, prefix: &str, suffix: &str, n: usize) -> String {
    // The members' names, as the simulated nodes call themselves.
    let names: Vec<String> = (0..4).map(|i| meshcache_sim::mesh::name(i, 4)).collect();
    (0..)
        .map(|i| format!("http://h/{prefix}{i}{suffix}"))
        .filter(|u| {
            let at = meshcache_wire::directory::owner_index(&names, &StoreKey::get(u).0);
            at == Some(owner as usize)
        })
        .nth(n)
        .expect("some URL is owned by every member")
}

/// Per-request costs: what each request of `trace` added to the counters of the run of the
/// requests before it.
#[derive(Debug, PartialEq)]
struct Step {
    directory: u64,
    directory_bytes: u64,
    icp_queries: u64,
    icp_replies: u64,
    peer_http: u64,
    origin: u64,
}

fn steps(spec: &SimSpec, reqs: &[Request]) -> Vec<Step> {
    let totals: Vec<Results> = (0..=reqs.len())
        .map(|n| {
            let trace = Trace::new(&reqs[..n], 0, 1);
            run(spec, &trace)
        })
        .collect();
    totals
        .windows(2)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let origin = |r: &Results| r.nodes.iter().map(|n| n.origin_fetches).sum::<u64>();
            Step {
                directory: b.traffic.directory_messages - a.traffic.directory_messages,
                directory_bytes: b.traffic.directory_bytes - a.traffic.directory_bytes,
                icp_queries: b.traffic.icp_queries - a.traffic.icp_queries,
                icp_replies: b.traffic.icp_replies - a.traffic.icp_replies,
                peer_http: b.traffic.peer_http - a.traffic.peer_http,
                origin: origin(b) - origin(a),
            }
        })
        .collect()
}

/// Four siblings, one request at a time, α = 1, 2 and 0 (every holder): c0 fetches `a`,
/// whose entry c2 keeps; its `DIR_ADD` reaches c2 before the next request (the mesh is quiet
/// only once the 10 ms drain has sent it). A miss at a member that has heard from c2 costs
/// the lookup and its answer, then α candidate queries; a URL nobody holds costs the lookup
/// and its answer, then the origin.
#[test]
fn directory_by_hand() {
    let a = owned_by(2, "a", 0);
    let w1 = owned_by(2, "w", 0);
    let w3 = owned_by(2, "w", 1);
    let z = owned_by(2, "z", 0);
    let reqs = [
        // A first lookup at an owner never heard from goes out, but is not waited for.
        req(0, &a),
        req(1, &w1),
        // Now c1 has heard from c2: it waits for the holders (c0) and queries α of them.
        req(1, &a),
        // Nobody holds z: the lookup, its (empty) answer, the origin.
        req(1, &z),
        req(3, &w3),
        // Two holders now (c0, c1).
        req(3, &a),
    ];
    let url_len = |u: &str| u.len() as u64;
    let get = |u: &str| 20 + 6 + url_len(u) + 1;
    let data = |n: u64, u: &str| 20 + 2 + 6 * n + url_len(u) + 1;
    let add = 20 + 6 + 16;
    for alpha in [1u32, 2, 0] {
        let mut spec = serial(4, Protocol::Directory);
        spec.protocol.directory_alpha = alpha;
        let asked = if alpha == 1 { 1 } else { 2 };
        let miss = |u: &str, holders: u64| Step {
            directory: 3,
            directory_bytes: get(u) + data(holders, u) + add,
            icp_queries: 0,
            icp_replies: 0,
            peer_http: 0,
            origin: 1,
        };
        let hit = |u: &str, holders: u64, asked: u64| Step {
            directory: 3,
            directory_bytes: get(u) + data(holders, u) + add,
            icp_queries: asked,
            icp_replies: asked,
            peer_http: 1,
            origin: 0,
        };
        let expected = vec![
            miss(&a, 0),
            miss(&w1, 0),
            hit(&a, 1, 1),
            miss(&z, 0),
            miss(&w3, 0),
            hit(&a, 2, asked),
        ];
        assert_eq!(steps(&spec, &reqs), expected, "alpha {alpha}");
        let trace = Trace::new(&reqs, 0, 1);
        let r = run(&spec, &trace);
        let o = &r.answered;
        assert_eq!(
            (o.requests, o.sibling_hits, o.misses),
            (6, 2, 4),
            "alpha {alpha}"
        );
        assert_eq!(r.traffic.directory_messages, 18);
        // The owner only answered and listened: it sent 6 DIR_DATA, received 6 DIR_GET and
        // 6 DIR_ADD.
        assert_eq!(r.nodes[2].datagrams, 18);
        assert_eq!(r.nodes[2].origin_fetches, 0);
    }
}

/// The owner's own lookups cost nothing: a URL whose entry the requester keeps is looked up
/// in its own share, and with no holder goes to the origin without a message.
#[test]
fn own_entries_cost_no_message() {
    let mine = owned_by(1, "m", 0);
    let trace = Trace::new(&[req(1, &mine)], 0, 1);
    let r = run(&serial(4, Protocol::Directory), &trace);
    assert_eq!(r.answered.misses, 1);
    assert_eq!(r.traffic.datagrams(), 0, "{:?}", r.traffic);
}

/// Search variant 2: the owner queries the holder for the requester, whose reply comes
/// straight from the holder; the owner sends no `DIR_DATA` when it asked exactly α.
#[test]
fn owner_variant_forwards_the_query() {
    let a = owned_by(2, "a", 0);
    let w1 = owned_by(2, "w", 0);
    let reqs = [req(0, &a), req(1, &w1), req(1, &a)];
    let mut spec = serial(4, Protocol::Directory);
    spec.protocol.directory_variant = meshcache_sim::spec::DirVariant::Owner;
    let s = steps(&spec, &reqs);
    // No holder of `a` yet, nor of `w1`: DIR_DATA says so (fewer than α asked).
    assert_eq!((s[0].directory, s[1].directory), (3, 3));
    // c1's miss of `a`: DIR_GET; the owner forwards one query to c0 (no DIR_DATA); c0's HIT
    // goes to c1; then c1's DIR_ADD.
    assert_eq!(
        s[2],
        Step {
            directory: 2,
            directory_bytes: (20 + 6 + a.len() as u64 + 1) + 42,
            icp_queries: 1,
            icp_replies: 1,
            peer_http: 1,
            origin: 0,
        }
    );
}

/// Optimistic updates: the owner enters the requester at lookup time, so no `DIR_ADD`
/// follows the fetch; an object that is not stored is taken back with a `DIR_DEL`.
#[test]
fn optimistic_updates() {
    let a = owned_by(2, "a", 0);
    let nostore = owned_by_with(2, "n", "?cc=no-store", 0);
    let mut spec = serial(4, Protocol::Directory);
    spec.protocol.directory_updates = meshcache_sim::spec::DirUpdateMode::Optimistic;
    let s = steps(&spec, &[req(0, &a), req(0, &nostore)]);
    assert_eq!(s[0].directory, 2, "DIR_GET and DIR_DATA only: {:?}", s[0]);
    assert_eq!(s[1].directory, 3, "DIR_GET, DIR_DATA, DIR_DEL: {:?}", s[1]);
    assert_eq!(
        s[1].directory_bytes,
        (20 + 6 + nostore.len() as u64 + 1) + (20 + 2 + nostore.len() as u64 + 1) + 42
    );
    // Pessimistic: the object not stored costs no update.
    spec.protocol.directory_updates = meshcache_sim::spec::DirUpdateMode::Pessimistic;
    let s = steps(&spec, &[req(0, &a), req(0, &nostore)]);
    assert_eq!((s[0].directory, s[1].directory), (3, 2));
}

/// Holder records expire after the TTL, and every member announces its whole store again
/// every half of it (one `DIR_ADD` per owner): c0's copy of `a`, announced at 10 ms with a
/// 2 s TTL, is still listed at 2.5 s, after two renewals. The run ends with the last request,
/// although renewals would go on.
#[test]
fn records_are_renewed_every_half_ttl() {
    let a = owned_by(2, "a", 0);
    let w1 = owned_by(2, "w", 0);
    let at = |ms: u64, client: u32, url: &str| Request {
        time_ms: ms,
        ..req(client, url)
    };
    let trace = Trace::new(&[at(0, 0, &a), at(0, 1, &w1), at(2_500, 1, &a)], 0, 1);
    let mut spec = serial(4, Protocol::Directory);
    spec.replay.mode = Replay::Timed;
    spec.protocol.directory_ttl = std::time::Duration::from_secs(2);
    // Short waits, so that no search's deadline outlives the last request.
    spec.protocol.icp_timeout_ceiling = std::time::Duration::from_millis(100);
    let r = run(&spec, &trace);
    assert_eq!(r.answered.sibling_hits, 1, "{:?}", r.answered);
    // Two lookups with their answers and DIR_ADDs; renewals at 1 s and 2 s by c0 (`a`) and
    // c1 (`w1`); c1's lookup of `a`, its answer, its DIR_ADD.
    assert_eq!(r.traffic.directory_messages, 6 + 4 + 3);
    assert!(r.simulated_seconds < 3.0, "{}", r.simulated_seconds);
    // A 4 s TTL: one renewal before the last request, at 2 s.
    spec.protocol.directory_ttl = std::time::Duration::from_secs(4);
    let r = run(&spec, &trace);
    assert_eq!(r.answered.sibling_hits, 1);
    assert_eq!(r.traffic.directory_messages, 6 + 2 + 3);
}

/// The benchmark trace (shared URLs: `disjoint = false`) of `caches` caches with
/// `clients_per_cache` clients each, issued at `rate` requests per second per cache, objects
/// of 10 KiB (the size of the directory paper's measurements, Figure 2).
fn benchmark(caches: u32, clients_per_cache: u32, per_client: u32, rate: f64) -> Trace {
    let spec = WorkloadSpec::Benchmark(Benchmark {
        clients: caches * clients_per_cache,
        requests_per_client: per_client,
        groups: 4,
        disjoint: false,
        pareto_k: 10 * 1024,
        max_size: 10 * 1024,
        rate: rate * f64::from(caches),
        ..Benchmark::default()
    });
    Trace::new(&generate(&spec, 7).expect("generates"), 0, 3)
}

/// The mean latency of each protocol for each mesh size, printed with what explains it.
fn scaling(
    sizes: &[u32],
    clients_per_cache: u32,
    per_client: u32,
    rate: f64,
) -> Vec<(Protocol, Vec<f64>)> {
    let protocols = [Protocol::Directory, Protocol::Icp, Protocol::Multicast];
    let mut table: Vec<(Protocol, Vec<f64>)> = protocols.iter().map(|&p| (p, Vec::new())).collect();
    for &n in sizes {
        let trace = benchmark(n, clients_per_cache, per_client, rate);
        for (protocol, means) in &mut table {
            let mut spec = SimSpec::default();
            spec.mesh.caches = n;
            spec.protocol.name = *protocol;
            spec.replay.mode = Replay::Timed;
            // Every other parameter is the default network and host model. The origin side is
            // not a bottleneck: the benchmark puts each group's URLs on one host, so a few
            // simulated web servers would carry the whole load of 64 caches, whatever the
            // protocol. The question is the caches' own traffic.
            spec.net.origin_bandwidth = 0;
            let r = run(&spec, &trace);
            println!(
                "{:>9} {:>3} caches: mean {:7.2} ms  p90 {:7.2} ms  {:6.2} messages/request  \
                 hit ratio {:.3} (remote {:.3})",
                protocol.as_str(),
                n,
                r.latency_ms.mean,
                r.latency_ms.p90,
                r.messages_per_request,
                r.hit_ratio,
                r.remote_hit_ratio,
            );
            means.push(r.latency_ms.mean);
        }
    }
    table
}

/// How much the mean latency grew from the smallest mesh to the largest.
fn growth(table: &[(Protocol, Vec<f64>)], p: Protocol) -> f64 {
    let means = &table.iter().find(|(q, _)| *q == p).expect("ran").1;
    means[means.len() - 1] / means[0]
}

/// The directory paper's claim (§4, §5, Figure 6a): with directory-limited unicast the mean
/// latency stays flat as caches are added (the load per cache constant), while ICP, which
/// queries every sibling on every miss, saturates the network between the caches and its
/// latency grows. 300 requests per second per cache, 4, 16 and 64 caches.
#[test]
fn directory_latency_stays_flat_as_caches_grow() {
    let table = scaling(&[4, 16, 64], 10, 20, 300.0);
    let (dir, icp) = (
        growth(&table, Protocol::Directory),
        growth(&table, Protocol::Icp),
    );
    let mc = growth(&table, Protocol::Multicast);
    println!("mean latency, 4 → 64 caches: directory ×{dir:.2}, icp ×{icp:.2}, multicast ×{mc:.2}");
    assert!(dir < 1.1, "the directory's latency stays flat: ×{dir:.2}");
    assert!(icp > 1.5, "ICP's latency grows with the caches: ×{icp:.2}");
    let at = |p: Protocol| table.iter().find(|(q, _)| *q == p).expect("ran").1[2];
    assert!(
        at(Protocol::Icp) > 1.5 * at(Protocol::Directory),
        "at 64 caches ICP is far slower than the directory"
    );
}

/// The same up to 128 caches, longer: `cargo test -p meshcache-sim --release --test
/// directory -- --ignored --nocapture`.
#[test]
#[ignore = "minutes in debug builds (10 s in release)"]
fn directory_latency_stays_flat_as_caches_grow_large() {
    let table = scaling(&[4, 16, 64, 128], 10, 60, 300.0);
    let (dir, icp) = (
        growth(&table, Protocol::Directory),
        growth(&table, Protocol::Icp),
    );
    println!("mean latency, 4 → 128 caches: directory ×{dir:.2}, icp ×{icp:.2}");
    assert!(dir < 1.1, "the directory's latency stays flat: ×{dir:.2}");
    assert!(icp > 2.0, "ICP's latency grows with the caches: ×{icp:.2}");
}
