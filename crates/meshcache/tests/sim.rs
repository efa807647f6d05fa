//! The simulator against live meshcache nodes: the same trace through `meshcache lab run` and
//! through `meshcache-sim`. Replayed one request at a time, both must agree exactly on every
//! node's hits and on the datagrams each node sent; replayed by concurrent clients, on the hit
//! ratio within 2 points. Also the `sim` commands' surface: errors that name the bad value,
//! and a sweep that writes its results and graphs.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use meshcache_sim::spec::{NetSpec, Protocol, Replay};
use meshcache_sim::{Control, Results, SimSpec, Trace};
use meshcache_workload::generate::{generate, Benchmark, WorkloadSpec};
use meshcache_workload::Request;

/// Lab runs use fixed addresses (127.0.0.10 and up, the origins' port): inside a network
/// namespace of their own they cannot collide, but where none can be made they must take
/// turns.
static NODES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lab's default origin port, which it puts in every URL.
const LAB_ORIGIN_PORT: u16 = 8080;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_meshcache")
}

/// A small workload with remote hits: `clients` over 4 caches, a third of new URLs from a
/// pool every group draws from, objects of 1–32 KiB.
fn workload(clients: u32, requests_per_client: u32) -> Vec<Request> {
    let spec = WorkloadSpec::Benchmark(Benchmark {
        clients,
        requests_per_client,
        groups: 4,
        disjoint: false,
        shared: 0.35,
        shared_objects: 60,
        pareto_k: 1024,
        max_size: 32 * 1024,
        ..Benchmark::default()
    });
    generate(&spec, 11).expect("generates")
}

/// What the lab's pre-warm round sends before the measured pass: one request per node and
/// origin host, for a URL of its own (so every node queries every peer once, and hears them).
fn prewarm(requests: &[Request], caches: u32) -> Vec<Request> {
    let mut hosts: Vec<&str> = requests
        .iter()
        .map(|r| meshcache_sim::trace::host_of(&r.url))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    (0..caches)
        .flat_map(|node| {
            hosts.iter().map(move |host| Request {
                time_ms: 0,
                client: node,
                size: 16,
                url: format!("http://{host}/lab-prewarm/n{node}/0?size=16"),
            })
        })
        .collect()
}

fn simulate(spec: &SimSpec, requests: &[Request]) -> Results {
    let trace = Trace::new(requests, 0, spec.net.origin_servers);
    let stop = AtomicBool::new(false);
    let mut progress = |_| {};
    meshcache_sim::run(
        spec,
        &trace,
        Control {
            stop: &stop,
            progress: &mut progress,
        },
    )
    .expect("simulates")
}

/// What a lab run and its simulation share besides the trace.
#[derive(Clone, Copy)]
struct Setup {
    /// Each node's store.
    memory_mib: u64,
    /// Serial replay: the pause before each request.
    gap_ms: u64,
    /// Concurrent replay: each client's pause between an answer and its next request.
    think_ms: u64,
}

const PLAIN: Setup = Setup {
    memory_mib: 64,
    gap_ms: 0,
    think_ms: 0,
};

/// Concurrent clients that pause 20 ms between requests: the run lasts a few seconds, long
/// enough for Summary Cache's 250 ms update tick to come round many times (with a run
/// shorter than a tick, whether the summaries change before the end depends on the tick's
/// phase, which a live run does not control).
const THINKING: Setup = Setup {
    memory_mib: 64,
    gap_ms: 0,
    think_ms: 20,
};

/// Small stores and pauses longer than the proxy's 250 ms summary tick and 10 ms directory
/// drain, so that upkeep happens between requests in both worlds.
const PACED: Setup = Setup {
    memory_mib: 4,
    gap_ms: 300,
    think_ms: 0,
};

/// Per node: (local, sibling, parent hits), and the datagrams it sent.
#[derive(Debug, PartialEq)]
struct Figures {
    hits: Vec<(u64, u64, u64)>,
    datagrams: Vec<u64>,
}

/// The simulation of a lab run: 4 siblings with the lab's store, an instantaneous network,
/// the lab's pre-warm round replayed first and not measured, then the trace in `mode`.
fn simulated(protocol: Protocol, mode: Replay, requests: &[Request], setup: Setup) -> Results {
    simulated_on(protocol, mode, requests, setup, NetSpec::instant())
}

/// As [`simulated`], on `net`.
fn simulated_on(
    protocol: Protocol,
    mode: Replay,
    requests: &[Request],
    setup: Setup,
    net: NetSpec,
) -> Results {
    let mut spec = SimSpec::default();
    spec.mesh.caches = 4;
    spec.mesh.cache_size.0 = setup.memory_mib << 20;
    spec.replay.serial_gap = std::time::Duration::from_millis(setup.gap_ms);
    spec.protocol.name = protocol;
    // The lab's digest nodes rebuild every second.
    spec.protocol.digest_interval = std::time::Duration::from_secs(1);
    spec.net = net;
    spec.replay.mode = mode;
    let mut all = prewarm(requests, 4);
    spec.replay.warmup = all.len() as u64;
    all.extend_from_slice(requests);
    // The URLs as the lab sends them: with its origins' port (CARP hashes the whole URL).
    for r in &mut all {
        let host = meshcache_sim::trace::host_of(&r.url).to_owned();
        r.url = r
            .url
            .replacen(&host, &format!("{host}:{LAB_ORIGIN_PORT}"), 1);
    }
    simulate(&spec, &all)
}

/// A network like the lab's: every party on one host, links of ~100 µs, no bandwidth limit
/// worth modelling, meshcache's own CPU costs; and clients that take `request` per request, as
/// the live run's clients did (the directory's updates go out on a 10 ms timer, so how many
/// requests pass between two of them decides what it knows).
fn loopback(request: std::time::Duration) -> NetSpec {
    let hop = std::time::Duration::from_micros(100);
    NetSpec {
        latency: hop,
        client_latency: request / 2,
        origin_latency: hop,
        proxy_bandwidth: 0,
        client_bandwidth: 0,
        origin_bandwidth: 0,
        network_bandwidth: 0,
        ..NetSpec::default()
    }
}

fn sim_figures(r: &Results) -> Figures {
    Figures {
        hits: r
            .nodes
            .iter()
            .map(|n| (n.local_hits, n.sibling_hits, n.parent_hits))
            .collect(),
        datagrams: r.nodes.iter().map(|n| n.datagrams_sent).collect(),
    }
}

/// Runs the lab on `requests` with 4 meshcache siblings, one config per protocol.
fn lab(
    requests: &[Request],
    protocols: &[Protocol],
    serial: bool,
    setup: Setup,
    dir: &Path,
) -> serde_json::Value {
    let trace = dir.join("t.trace");
    let file = std::fs::File::create(&trace).expect("trace file");
    meshcache_workload::trace::write(std::io::BufWriter::new(file), &[], requests)
        .expect("writes the trace");
    let mut exp = format!(
        "name = \"sim-validation\"\nseed = 1\nproducts = [\"meshcache\"]\n\
         origin_port = {LAB_ORIGIN_PORT}\n\
         [workload]\ntrace = \"t.trace\"\n\
         [origins]\ncache_control = \"max-age=86400\"\n\
         [nodes]\nmemory = \"{} MiB\"\n\
         [clients]\nserial = {serial}\nserial_gap = \"{}ms\"\n",
        setup.memory_mib, setup.gap_ms
    );
    if setup.think_ms > 0 {
        exp += &format!("think = \"{}ms\"\n", setup.think_ms);
    }
    for (i, p) in protocols.iter().enumerate() {
        exp += &format!(
            "[[config]]\nname = \"{0}\"\ntopology = \"4.0\"\nprotocol = \"{0}\"\nbaseline = {1}\n",
            p.as_str(),
            i == 0
        );
        if *p == Protocol::Digest {
            exp += "digest_period = \"1s\"\n";
        }
    }
    std::fs::write(dir.join("exp.toml"), exp).expect("experiment file");
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(bin())
        .args(["lab", "run"])
        .arg(dir.join("exp.toml"))
        .arg("--out")
        .arg(dir.join("out"))
        .arg("--quiet")
        .output()
        .expect("meshcache runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join("out/results.json")).expect("results.json");
    serde_json::from_str(&text).expect("JSON")
}

fn lab_config<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no config {name} in {r:#}"))
}

fn lab_figures(config: &serde_json::Value) -> Figures {
    let nodes = config["nodes"].as_array().expect("nodes");
    let u = |v: &serde_json::Value| v.as_u64().expect("a count");
    Figures {
        hits: nodes
            .iter()
            .map(|n| {
                (
                    u(&n["local_hits"]),
                    u(&n["sibling_hits"]),
                    u(&n["parent_hits"]),
                )
            })
            .collect(),
        datagrams: nodes.iter().map(|n| u(&n["udp_sent"])).collect(),
    }
}

#[test]
fn serial_lab_run_and_simulator_agree_exactly() {
    agree_exactly(
        &workload(12, 40),
        &[Protocol::None, Protocol::Icp, Protocol::Carp],
        PLAIN,
    );
}

/// The multicast search, the directory and Summary Cache (whose upkeep runs on timers),
/// paced so that upkeep runs between requests (and after the last one, before the lab's
/// counters are read).
#[test]
fn paced_serial_lab_run_and_simulator_agree_exactly() {
    agree_exactly(
        &workload(8, 12),
        &[Protocol::Multicast, Protocol::Directory, Protocol::Summary],
        PACED,
    );
}

/// Cache Digests, paced so that every request finds its peers' digests holding everything
/// stored before the previous one, in both worlds, whatever the phase of the live nodes'
/// wall-clock timers: an object stored just after a rebuild is in the next one (1 s later),
/// and a peer whose copy was fetched just before that rebuild keeps it at least 1 s (the
/// proxy's shortest refresh) and fetches at its next check (every 1 s): at most 3 s and the
/// fetch itself, so 4 s between requests. A workload of few, much-shared URLs, so that 40
/// requests make remote hits.
#[test]
fn paced_serial_digests_agree_exactly() {
    let requests = generate(
        &WorkloadSpec::Benchmark(Benchmark {
            clients: 8,
            requests_per_client: 5,
            groups: 4,
            disjoint: false,
            shared: 0.8,
            shared_objects: 6,
            pareto_k: 1024,
            max_size: 32 * 1024,
            ..Benchmark::default()
        }),
        11,
    )
    .expect("generates");
    let setup = Setup {
        memory_mib: 4,
        gap_ms: 4000,
        think_ms: 0,
    };
    agree_exactly(&requests, &[Protocol::Digest], setup);
}

fn agree_exactly(requests: &[Request], protocols: &[Protocol], setup: Setup) {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = lab(requests, protocols, true, setup, dir.path());
    let mut differ = Vec::new();
    for &p in protocols {
        let live = lab_figures(lab_config(&r, p.as_str()));
        let sim = sim_figures(&simulated(p, Replay::Serial, requests, setup));
        let remote: u64 = live.hits.iter().map(|h| h.1).sum();
        if p != Protocol::None {
            assert!(remote > 0, "{}: the workload has remote hits", p.as_str());
        }
        if sim != live {
            differ.push(format!(
                "{}:\n  simulator {sim:?}\n  lab       {live:?}",
                p.as_str()
            ));
        }
        // Unicast on loopback: every datagram one node counts as sent, another counts as
        // received (an IP multicast datagram is sent once and received by every member).
        if p != Protocol::Multicast {
            let nodes = lab_config(&r, p.as_str())["nodes"]
                .as_array()
                .expect("nodes");
            let total = |k: &str| nodes.iter().map(|n| n[k].as_u64().expect(k)).sum::<u64>();
            let (sent, received) = (total("udp_sent"), total("udp_received"));
            if sent != received {
                differ.push(format!(
                    "{}: the nodes sent {sent} datagrams and received {received}",
                    p.as_str()
                ));
            }
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Every protocol, concurrent clients: the hit ratios within 2 points, the simulated clients
/// taking as long per request as the live ones did without cooperation.
#[test]
fn concurrent_lab_run_and_simulator_agree_on_hit_ratio() {
    let requests = workload(12, 160);
    let dir = tempfile::tempdir().expect("tempdir");
    let protocols = [
        Protocol::None,
        Protocol::Icp,
        Protocol::Carp,
        Protocol::Summary,
        Protocol::Directory,
        Protocol::Multicast,
        Protocol::Digest,
    ];
    let r = lab(&requests, &protocols, false, THINKING, dir.path());
    // The live clients' time per request without cooperation.
    let per_request =
        lab_config(&r, "none")["wall_s"].as_f64().expect("wall_s") * 12.0 / requests.len() as f64;
    let net = loopback(std::time::Duration::from_secs_f64(per_request));
    let mut differ = Vec::new();
    for p in protocols {
        let c = lab_config(&r, p.as_str());
        let nodes = c["nodes"].as_array().expect("nodes");
        let sum = |k: &str| {
            nodes
                .iter()
                .map(|n| n[k].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let requests_done = sum("client_requests");
        let live = (sum("local_hits") + sum("sibling_hits") + sum("parent_hits")) as f64
            / requests_done as f64;
        let sim = simulated_on(p, Replay::Closed, &requests, THINKING, net.clone()).hit_ratio;
        eprintln!(
            "{}: hit ratio simulated {sim:.4}, live {live:.4}",
            p.as_str()
        );
        if (live - sim).abs() > 0.02 {
            differ.push(format!(
                "{}: hit ratio simulated {sim:.4} vs live {live:.4}",
                p.as_str()
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[test]
fn sim_commands_name_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.trace");
    std::fs::write(
        &bad,
        "# meshcache trace v1\n0 1 100 http://a/x\n0 x 5 http://a/y\n",
    )
    .expect("writes");
    let run = |args: &[&str]| {
        let out = Command::new(bin())
            .arg("sim")
            .args(args)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let trace = bad.to_str().expect("path");
    assert!(
        run(&["run", "--trace", trace]).contains("line 3"),
        "names the line"
    );
    let good = dir.path().join("good.trace");
    std::fs::write(&good, "# meshcache trace v1\n0 1 100 http://a/x\n").expect("writes");
    let good = good.to_str().expect("path");
    let e = run(&["run", "--trace", good, "--set", "mesh.caches=0"]);
    assert!(e.contains("mesh.caches: at least one cache"), "{e}");
    let e = run(&["run", "--trace", good, "--set", "mesh.cashes=4"]);
    assert!(e.contains("unknown field `cashes`"), "{e}");
    let e = run(&["run", "--trace", good, "--set", "protocol.name=gossip"]);
    assert!(e.contains("gossip"), "{e}");
}

#[test]
fn sweep_writes_results_and_graphs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.trace");
    let file = std::fs::File::create(&trace).expect("trace file");
    meshcache_workload::trace::write(std::io::BufWriter::new(file), &[], &workload(12, 40))
        .expect("writes");
    let out = dir.path().join("sweep");
    let status = Command::new(bin())
        .args(["sim", "sweep", "--trace"])
        .arg(&trace)
        .args([
            "--param",
            "mesh.caches",
            "--values",
            "2,4,8",
            "--protocols",
            "none,icp",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("json"))
            .expect("JSON");
    let points = results["points"].as_array().expect("points");
    assert_eq!(points.len(), 6);
    for m in ["hit-ratio", "messages", "latency", "load"] {
        let svg = std::fs::read_to_string(out.join(format!("{m}.svg"))).expect("svg");
        assert!(
            svg.contains("icp") && svg.contains("none"),
            "{m}.svg names both curves"
        );
        assert!(out.join(format!("{m}.png")).is_file());
    }
    // More caches, more ICP messages per request; none sends none.
    let msgs = |proto: &str, caches: &str| {
        points
            .iter()
            .find(|p| p["protocol"] == proto && p["value"] == caches)
            .map(|p| {
                p["results"]["messages_per_request"]
                    .as_f64()
                    .expect("number")
            })
            .expect("point")
    };
    assert!(msgs("icp", "8") > msgs("icp", "2"));
    assert_eq!(msgs("none", "8"), 0.0);
}

#[test]
fn a_squid_log_is_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    std::fs::write(
        &log,
        "1700000000.000     12 10.0.0.1 TCP_MISS/200 1500 GET http://a.example/x - HIER_DIRECT/192.0.2.1 text/html\n\
         1700000001.000      1 10.0.0.1 TCP_HIT/200 1500 GET http://a.example/x - HIER_NONE/- text/html\n\
         this line is not a log line\n\
         1700000002.000      9 10.0.0.2 TCP_MISS/200 300 POST http://a.example/form - HIER_DIRECT/192.0.2.1 text/html\n\
         1700000003.000      2 10.0.0.2 TCP_MISS/200 1500 GET http://a.example/x - HIER_DIRECT/192.0.2.1 text/html\n",
    )
    .expect("writes");
    let out = Command::new(bin())
        .args([
            "sim",
            "run",
            "--json",
            "--set",
            "mesh.caches=1",
            "--set",
            "replay.mode=\"serial\"",
            "--log",
        ])
        .arg(&log)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("3 requests kept, 1 not GET"), "{stderr}");
    assert!(stderr.contains("1 bad lines skipped"), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["answered"]["requests"], 3);
    assert_eq!(r["answered"]["local_hits"], 2);
    assert_eq!(r["trace_objects"], 1);
}

/// Ctrl-C stops a run and it reports what it simulated (a second one would exit at once).
#[test]
fn an_interrupted_run_reports_what_it_has() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = dir.path().join("w.toml");
    std::fs::write(
        &workload,
        "model = \"benchmark\"\nclients = 600\nrequests_per_client = 500\ngroups = 300\n\
         disjoint = false\n",
    )
    .expect("writes");
    // Into files: a pipe nobody reads until the end would fill and stall the child.
    let stdout = dir.path().join("out.json");
    let stderr = dir.path().join("err.txt");
    let mut child = Command::new(bin())
        .args([
            "sim",
            "run",
            "--json",
            "--set",
            "mesh.caches=300",
            "--workload",
        ])
        .arg(&workload)
        .stdout(std::fs::File::create(&stdout).expect("file"))
        .stderr(std::fs::File::create(&stderr).expect("file"))
        .spawn()
        .expect("starts");
    std::thread::sleep(std::time::Duration::from_secs(4));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop within 60 s of Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = child.wait().expect("exit status");
    let err = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(status.success(), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let out = std::fs::read_to_string(&stdout).expect("stdout");
    let r: serde_json::Value = serde_json::from_str(&out).expect("JSON on stdout");
    assert_eq!(r["interrupted"], true);
    let done = r["answered"]["requests"].as_u64().expect("a count");
    assert!(done < 300_000, "stopped early: {done}");
}
