//! The evaluation lab end to end: `meshcache lab run` on small experiments, with meshcache and
//! (Debian's) Squid nodes, a link relay, and the shipped experiment files checked.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_meshcache")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn lab(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("lab")
        .args(args)
        .output()
        .expect("meshcache runs")
}

/// `meshcache lab run FILE --concurrent --out OUT`, with any `extra` arguments before `--out`.
fn lab_concurrent(file: &Path, extra: &[&str], out: &Path) -> Output {
    let file = file.to_str().expect("path");
    let out = out.to_str().expect("path");
    let mut args = vec!["run", file];
    args.extend_from_slice(extra);
    args.extend(["--concurrent", "--out", out]);
    lab(&args)
}

/// Runs that start nodes use fixed addresses (127.0.0.10 and up); inside a network namespace of
/// their own they cannot collide, but where none can be made they must take turns.
static NODES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn squid_installed() -> bool {
    ["/usr/sbin/squid", "/usr/bin/squid"]
        .iter()
        .any(|p| Path::new(p).is_file())
}

fn results(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("results.json")).expect("results.json written");
    serde_json::from_str(&text).expect("results.json is JSON")
}

/// Runs an experiment that must succeed; returns its results.
fn run_ok(file: &Path, out_dir: &Path) -> serde_json::Value {
    let out = lab(&[
        "run",
        file.to_str().expect("path"),
        "--out",
        out_dir.to_str().expect("path"),
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    results(out_dir)
}

fn config<'a>(r: &'a serde_json::Value, group: &str, name: &str) -> &'a serde_json::Value {
    r["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .find(|c| c["group"] == group && c["name"] == name)
        .unwrap_or_else(|| panic!("no {group} / {name} in {r:#}"))
}

#[test]
fn shipped_experiments_are_valid() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("experiments")).expect("experiments/") {
        let file = entry.expect("entry").path();
        if file.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let out = lab(&["run", file.to_str().expect("path"), "--check"]);
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} experiment files found");
}

#[test]
fn bad_experiments_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("topology = \"5.5\"", "config[0].topology"),
        ("topology = \"4.0\"\nprotocl = \"icp\"", "protocl"),
        (
            "topology = \"4.0\"\nprotocol = \"smoke\"",
            "config[0].protocol",
        ),
    ];
    for (config, key) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(
            &file,
            format!("name = \"bad\"\n[workload]\nmodel = \"benchmark\"\n[[config]]\nname = \"a\"\n{config}\n"),
        )
        .expect("write");
        let out = lab(&["run", file.to_str().expect("path"), "--check"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config} accepted");
        assert!(err.contains(key), "{config}: {err}");
    }
    // A bad workload is named too, when the run generates it.
    let file = dir.path().join("bad-workload.toml");
    std::fs::write(
        &file,
        "name = \"bad\"\n[workload]\nmodel = \"benchmark\"\ninherent_hit_ratio = 1.5\n\
         [[config]]\nname = \"a\"\ntopology = \"2.0\"\n",
    )
    .expect("write");
    let out = lab(&[
        "run",
        file.to_str().expect("path"),
        "--out",
        dir.path().join("out").to_str().expect("path"),
        "--quiet",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("inherent_hit_ratio"), "{err}");
}

/// An experiment of two siblings, six clients of 20 requests each (120 in all), disjoint
/// streams, objects fresh for an hour: `none` (the baseline) and `icp`. `head` holds the
/// top-level keys, `workload` extra `[workload]` keys.
fn two_siblings(head: &str, workload: &str) -> String {
    format!(
        r#"{head}
[workload]
model = "benchmark"
clients = 6
requests_per_client = 20
groups = 2
disjoint = true
{workload}
[origins]
delay = "2ms"
cache_control = "max-age=3600"
[nodes]
memory = "64 MiB"
[[config]]
name = "none"
topology = "2.0"
protocol = "none"
baseline = true
[[config]]
name = "icp"
topology = "2.0"
protocol = "icp"
"#
    )
}

/// Two siblings, no cooperation against ICP, with meshcache and with Squid: the figures the
/// Summary Cache paper's Table 2 reports come out, consistent with the workload.
#[test]
fn siblings_with_and_without_icp() {
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let squid = squid_installed();
    let products = if squid {
        "[\"meshcache\", \"squid\"]"
    } else {
        eprintln!("squid is not installed: the Squid half of this test is skipped");
        "[\"meshcache\"]"
    };
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        two_siblings(
            &format!("name = \"siblings\"\nproducts = {products}"),
            "inherent_hit_ratio = 0.3",
        ),
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let r = run_ok(&file, &out_dir);
    let mut groups = vec!["meshcache"];
    if squid {
        groups.push("squid");
    }
    for g in groups {
        let none = config(&r, g, "none");
        let icp = config(&r, g, "icp");
        for c in [none, icp] {
            assert_eq!(c["requests"], 120, "{c:#}");
            assert_eq!(c["errors"], 0, "{c:#}");
            // Caches big enough for everything: the hit ratio is the workload's.
            let hit = c["hit_ratio"].as_f64().expect("hit ratio");
            let inherent = c["inherent_hit_ratio"].as_f64().expect("inherent");
            assert!((hit - inherent).abs() < 1e-9, "{g}: {hit} vs {inherent}");
            assert_eq!(
                c["sibling_hit_ratio"], 0.0,
                "disjoint streams: no remote hit"
            );
            let nodes = c["nodes"].as_array().expect("nodes");
            let served: u64 = nodes
                .iter()
                .map(|n| n["client_requests"].as_u64().expect("count"))
                .sum();
            assert_eq!((nodes.len(), served), (2, 120), "{g}: {c:#}");
            // Every miss, and nothing else, reached an origin.
            let misses = (120.0 * (1.0 - hit)).round() as u64;
            assert_eq!(c["origin_requests"], misses, "{g}: {c:#}");
        }
        assert_eq!(none["udp_messages"], 0, "{g}: no cooperation, no datagrams");
        // A miss asks the one sibling: a query and a reply, each counted where it is sent and
        // where it is received. Both products ask for every miss (the lab waits until Squid
        // counts its sibling up before it measures).
        let misses = (120.0 * (1.0 - icp["hit_ratio"].as_f64().expect("hit"))).round() as u64;
        let udp = icp["udp_messages"].as_u64().expect("udp");
        assert_eq!(udp, 4 * misses, "{g}: {udp} datagrams for {misses} misses");
        assert!(
            icp["intercache_messages_per_request"]
                .as_f64()
                .expect("per request")
                > 0.0
        );
    }
    let md = std::fs::read_to_string(out_dir.join("results.md")).expect("results.md");
    assert!(md.contains("| overhead |"), "{md}");
    assert!(out_dir.join("heg.svg").is_file());
    assert!(
        out_dir.join("latency-meshcache.svg").is_file() || out_dir.join("latency.svg").is_file()
    );
    // Nothing left running: every node's address is free again.
    for i in 0..2 {
        let addr = format!("127.0.0.{}:3128", 10 + i);
        assert!(
            std::net::TcpStream::connect(&addr).is_err(),
            "a node still listens on {addr}"
        );
    }
}

/// `--concurrent`: each configuration in a `lab run` of its own, in its own namespace, the
/// passes started together; one merged report, round by round.
#[test]
fn configurations_measured_at_the_same_time() {
    let can_unshare = Command::new("unshare")
        .args(["--net", "--", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can_unshare {
        eprintln!("no network namespaces here: concurrent runs would share addresses; skipped");
        return;
    }
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        two_siblings(
            "name = \"together\"\nproducts = [\"meshcache\"]\nrepetitions = 2",
            "",
        ),
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let one = lab_concurrent(&file, &["--only", "icp"], &out_dir);
    assert!(!one.status.success());
    assert!(
        String::from_utf8_lossy(&one.stderr).contains("at least two configurations"),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    // A run that fails stops the others, which would otherwise wait for it at every pass.
    let failing = dir.path().join("failing.toml");
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(
        &failing,
        format!("{text}[[config]]\nname = \"squid only\"\ntopology = \"2.0\"\nprotocol = \"icp\"\nproducts = [\"squid\"]\n"),
    )
    .expect("write");
    let failed_dir = dir.path().join("failed");
    let started = std::time::Instant::now();
    let failed = lab_concurrent(&failing, &[], &failed_dir);
    assert!(!failed.status.success());
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(
        err.contains("\"squid only\" (exit status") && err.contains("\"none\" (stopped)"),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{err}"
    );
    let needle = failed_dir.to_string_lossy().to_string();
    let t = std::time::Instant::now();
    while !processes_mentioning(&needle).is_empty()
        && t.elapsed() < std::time::Duration::from_secs(15)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        processes_mentioning(&needle).is_empty(),
        "left behind: {:?}",
        processes_mentioning(&needle)
    );

    let out = lab_concurrent(&file, &[], &out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = results(&out_dir);
    assert_eq!(r["concurrent"], true);
    let runs: Vec<(u64, &str)> = r["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .map(|c| {
            assert_eq!(c["requests"], 120, "{c:#}");
            assert_eq!(c["errors"], 0, "{c:#}");
            (
                c["repetition"].as_u64().expect("repetition"),
                c["name"].as_str().expect("name"),
            )
        })
        .collect();
    assert_eq!(runs, [(0, "none"), (0, "icp"), (1, "none"), (1, "icp")]);
    // Each configuration ran in a namespace of its own: the no-cooperation runs saw no
    // datagram, although the ICP runs sent theirs at the same time.
    for c in r["configs"].as_array().expect("configs") {
        let udp = c["udp_datagrams_netns"].as_u64().expect("udp");
        if c["name"] == "none" {
            assert_eq!(udp, 0, "{c:#}");
        } else {
            assert!(udp > 0, "{c:#}");
        }
    }
    // Both parties arrived at both passes, then left.
    let mut arrived: Vec<String> = std::fs::read_dir(out_dir.join("concurrent/rendezvous"))
        .expect("rendezvous")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    arrived.sort();
    assert_eq!(
        arrived,
        ["0.00", "0.01", "1.00", "1.01", "done.00", "done.01"]
    );
    let md = std::fs::read_to_string(out_dir.join("results.md")).expect("results.md");
    assert!(md.contains("at the same time"), "{md}");
    assert!(md.contains("round by round"), "{md}");
}

/// A child and its lone parent across an emulated 40 ms link: the round trip shows in the
/// latency, and the lone parent is polled only when asked to.
#[test]
fn a_lone_parent_across_a_link() {
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        r#"
name = "pair"
[workload]
model = "benchmark"
clients = 2
requests_per_client = 4
groups = 1
inherent_hit_ratio = 0.0
[origins]
cache_control = "max-age=3600"
[[link]]
name = "far"
from = "child"
to = "parent"
profile = { delay = "20ms" }
[[config]]
name = "quiet"
topology = "pair"
protocol = "icp"
baseline = true
[[config]]
name = "polls"
topology = "pair"
protocol = "icp"
query_lone_parent = true
"#,
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let r = run_ok(&file, &out_dir);
    let quiet = config(&r, "meshcache", "quiet");
    let polls = config(&r, "meshcache", "polls");
    for c in [quiet, polls] {
        assert_eq!(c["requests"], 8, "{c:#}");
        assert_eq!(c["errors"], 0, "{c:#}");
        // Every request crosses the link once each way at least: 40 ms.
        let p50 = c["latency_ms"]["median"].as_f64().expect("median");
        assert!(p50 >= 40.0, "{c:#}");
    }
    assert_eq!(quiet["udp_messages"], 0, "a lone parent is not polled");
    assert!(polls["udp_messages"].as_u64().expect("udp") > 0);
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// Stopping `lab run` midway (SIGTERM to the command) leaves no node behind.
#[test]
fn an_interrupted_run_leaves_nothing_behind() {
    interrupt_midway("meshcache", "TERM");
}

/// The same with Squid nodes, and Ctrl-C (SIGINT) instead of SIGTERM.
#[test]
fn an_interrupted_squid_run_leaves_nothing_behind() {
    if !squid_installed() {
        eprintln!("squid is not installed: skipped");
        return;
    }
    interrupt_midway("squid", "INT");
}

/// Starts a long run of `product` nodes, sends `signal` to `lab run` once they serve, and checks
/// that every process the run started is gone within 15 s.
fn interrupt_midway(product: &str, signal: &str) {
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        format!(
            r#"
name = "long"
products = ["{product}"]
[workload]
model = "benchmark"
clients = 4
requests_per_client = 500
groups = 2
[origins]
delay = "100ms"
[[config]]
name = "long"
topology = "2.0"
protocol = "icp"
"#
        ),
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let mut child = Command::new(bin())
        .args(["lab", "run"])
        .arg(&file)
        .arg("--out")
        .arg(&out_dir)
        .arg("--quiet")
        .spawn()
        .expect("lab run starts");
    // Wait until the nodes run.
    let conf_name = if product == "squid" {
        "squid.conf"
    } else {
        "meshcache.toml"
    };
    let conf = out_dir.join(format!("runs/00-{product}-long/n1/{conf_name}"));
    let started = std::time::Instant::now();
    while !conf.exists() && started.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(conf.exists(), "the nodes never started");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let needle = dir.path().to_string_lossy().to_string();
    assert!(
        processes_mentioning(&needle).len() >= 2,
        "nodes should be running: {:?}",
        processes_mentioning(&needle)
    );
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let _ = child.wait();
    // The command's own namespace copy stops its nodes (SIGTERM, SIGKILL after 3 s).
    let mut left = processes_mentioning(&needle);
    let t = std::time::Instant::now();
    while !left.is_empty() && t.elapsed() < std::time::Duration::from_secs(15) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = processes_mentioning(&needle);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The URLs (7th field of Squid's native format) a node's access log holds, in a run's folder.
fn logged_urls(run: &Path, node: &str) -> Vec<String> {
    std::fs::read_to_string(run.join(node).join("access.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(6).map(str::to_string))
        .collect()
}

fn host_of(url: &str) -> &str {
    url.trim_start_matches("http://")
        .split(['/', ':'])
        .next()
        .unwrap_or("")
}

/// The hierarchy paper's 3.1, 2.2 and 2.2.dom arrangements end to end, with workload variants,
/// repetitions, emulated links between the clients and a node and between a node and the
/// origins, and think time.
#[test]
fn hierarchies_variants_repetitions_links_and_think_time() {
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        r#"
name = "lab-features"
seed = 11
repetitions = 2
products = ["meshcache"]
[workload]
model = "characterized"
requests = 240
clients = 6
[[workload.group]]
host = "www.shop.br"
domain_ratio = 0.5
hot_ratio = 0.6
hot_set_size = 10
hot_set_popularity = 0.8
[[workload.group]]
host = "www.news.com"
domain_ratio = 0.5
hot_ratio = 0.6
hot_set_size = 10
hot_set_popularity = 0.8
[[variant]]
name = "full"
[[variant]]
name = "short"
workload = { requests = 120 }
[origins]
cache_control = "max-age=86400"
[nodes]
memory = "64 MiB"
[clients]
outstanding = 1
think = "10ms"
[[link]]
name = "last-mile"
from = "clients"
to = "c0"
profile = { delay = "15ms" }
[[link]]
name = "transit"
from = "p0"
to = "origins"
profile = { delay = "25ms" }
[[config]]
name = "3.1"
topology = "3.1"
protocol = "icp"
baseline = true
[[config]]
name = "3.1 direct"
topology = "3.1"
protocol = "icp"
links = []
[[config]]
name = "2.2"
topology = "2.2"
protocol = "icp"
links = []
[[config]]
name = "2.2.dom"
topology = "2.2.dom"
protocol = "icp"
links = []
"#,
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let r = run_ok(&file, &out_dir);
    let configs = r["configs"].as_array().expect("configs");
    assert_eq!(
        configs.len(),
        16,
        "4 configurations × 2 variants × 2 repetitions"
    );
    for (variant, requests) in [("full", 240), ("short", 120)] {
        let group = format!("meshcache {variant}");
        let runs: Vec<_> = configs.iter().filter(|c| c["group"] == group).collect();
        assert_eq!(runs.len(), 8, "{group}");
        let inherent = &runs[0]["inherent_hit_ratio"];
        for c in &runs {
            assert_eq!(c["requests"], requests, "{c:#}");
            assert_eq!(c["errors"], 0, "{c:#}");
            assert_eq!(c["seed"], runs[0]["seed"], "repetitions use the same seeds");
            assert_eq!(
                &c["inherent_hit_ratio"], inherent,
                "one workload per variant"
            );
        }
        for name in ["3.1", "3.1 direct", "2.2", "2.2.dom"] {
            let mut reps: Vec<u64> = runs
                .iter()
                .filter(|c| c["name"] == name)
                .map(|c| c["repetition"].as_u64().expect("repetition"))
                .collect();
            reps.sort_unstable();
            assert_eq!(reps, [0, 1], "{group} / {name}");
        }
    }

    let full = |name: &str| {
        configs
            .iter()
            .find(|c| c["group"] == "meshcache full" && c["name"] == name && c["repetition"] == 0)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // Links: a third of the requests (c0's clients) cross 15 ms each way; c0's misses also
    // cross 25 ms each way from p0 to the origins, so more than 5 % of requests take 80 ms.
    // Without the links, loopback answers in a few milliseconds (30 leaves room for a busy
    // machine).
    let p95 = |c: &serde_json::Value| c["latency_ms"]["p95"].as_f64().expect("p95");
    let linked = full("3.1");
    let direct = full("3.1 direct");
    assert!(p95(linked) >= 75.0, "{:#}", linked["latency_ms"]);
    assert!(p95(direct) < 30.0, "{:#}", direct["latency_ms"]);
    // Think time: each client sends its 40 requests one after another, 10 ms apart.
    let wall = direct["wall_s"].as_f64().expect("wall");
    assert!(
        wall >= 0.39,
        "6 clients × 40 requests with 10 ms think took {wall} s"
    );

    // TCP segments per node, from the nodes' sockets: every child got each of its clients'
    // requests in at least one segment and answered in at least one; the parent talked to
    // the children and the origins; the nodes' segments are a part of the namespace's.
    for c in configs {
        assert_eq!(c["tcp_per_node"], true, "{c:#}");
        let mut nodes_total = 0;
        for n in c["nodes"].as_array().expect("nodes") {
            let (sent, received) = (
                n["tcp_sent"].as_u64().expect("tcp_sent"),
                n["tcp_received"].as_u64().expect("tcp_received"),
            );
            let requests = n["client_requests"].as_u64().expect("client_requests");
            if n["role"] == "parent" {
                assert!(sent > 0 && received > 0, "{n:#}");
                // Parents have no clients of their own: no client figures.
                assert_eq!(requests, 0, "{n:#}");
                assert!(n["latency_ms"].is_null(), "{n:#}");
                assert_eq!(n["client_bytes"], 0, "{n:#}");
            } else {
                assert!(
                    requests > 0 && sent >= requests && received >= requests,
                    "{n:#}"
                );
                // A child's own clients: their hits and bytes, and their latency.
                let count = |k: &str| n[k].as_u64().expect(k);
                let hits = count("local_hits") + count("sibling_hits") + count("parent_hits");
                assert!(hits <= requests, "{n:#}");
                assert!(count("hit_bytes") <= count("client_bytes"), "{n:#}");
                assert!(count("client_bytes") > 0, "{n:#}");
                let l = &n["latency_ms"];
                let (p50, p99) = (
                    l["median"].as_f64().expect("median"),
                    l["p99"].as_f64().expect("p99"),
                );
                assert!(0.0 < p50 && p50 <= p99, "{n:#}");
            }
            nodes_total += sent + received;
        }
        assert_eq!(c["tcp_messages"], nodes_total, "{c:#}");
        // Every node waited for its sockets, so it switched out.
        assert!(
            c["context_switches_per_request"]
                .as_f64()
                .expect("switches")
                > 0.0,
            "{c:#}"
        );
        for n in c["nodes"].as_array().expect("nodes") {
            assert!(
                n["switches_voluntary"].as_u64().expect("voluntary") > 0,
                "{n:#}"
            );
            // The scheduler's exact CPU time agrees with /proc/PID/stat's 10 ms ticks: user and
            // system time are each rounded down there, so each reading is short by less than
            // two ticks and their difference is off by less than 20 ms.
            let exact = n["cpu_exact_s"]
                .as_f64()
                .expect("a node's threads all lived");
            let ticks =
                n["cpu_user_s"].as_f64().expect("user") + n["cpu_sys_s"].as_f64().expect("sys");
            assert!(exact > 0.0 && (exact - ticks).abs() <= 0.03, "{n:#}");
        }
        assert!(
            nodes_total <= c["tcp_segments_netns"].as_u64().expect("netns"),
            "{c:#}"
        );
    }

    // 2.2.dom: p0 is the parent for .br only, p1 for everything else; in 2.2 both parents
    // serve every domain.
    let runs_dir = out_dir.join("runs");
    let run_of = |name: &str| {
        std::fs::read_dir(&runs_dir)
            .expect("runs")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(&format!("-meshcache-full-{name}")))
            })
            .unwrap_or_else(|| panic!("no run folder for {name}"))
    };
    let dom = run_of("2.2.dom");
    let (br, rest) = (logged_urls(&dom, "p0"), logged_urls(&dom, "p1"));
    assert!(!br.is_empty() && !rest.is_empty(), "{br:?} {rest:?}");
    assert!(br.iter().all(|u| host_of(u).ends_with(".br")), "{br:?}");
    assert!(
        rest.iter().all(|u| !host_of(u).ends_with(".br")),
        "{rest:?}"
    );
    let plain = run_of("2.2");
    let parents: Vec<String> = [logged_urls(&plain, "p0"), logged_urls(&plain, "p1")].concat();
    assert!(parents.iter().any(|u| host_of(u).ends_with(".br")));
    assert!(parents.iter().any(|u| !host_of(u).ends_with(".br")));
}

/// `trace = "FILE"`: a trace written by `meshcache workload generate` is replayed as it is.
#[test]
fn a_trace_file_is_replayed() {
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.txt");
    let out = Command::new(bin())
        .args([
            "workload",
            "generate",
            "--clients",
            "3",
            "--requests-per-client",
            "10",
        ])
        .args([
            "--hit-ratio",
            "0.5",
            "--groups",
            "1",
            "--seed",
            "5",
            "--out",
        ])
        .arg(&trace)
        .output()
        .expect("generate runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        r#"
name = "replay"
[workload]
trace = "trace.txt"
[origins]
cache_control = "max-age=3600"
[clients]
serial = true
[[config]]
name = "one"
topology = "1.0"
protocol = "none"
baseline = true
"#,
    )
    .expect("write");
    let out_dir = dir.path().join("out");
    let r = run_ok(&file, &out_dir);
    let c = config(&r, "meshcache", "one");
    assert_eq!(c["requests"], 30, "{c:#}");
    assert_eq!(c["errors"], 0, "{c:#}");
    // One cache big enough for all, one request at a time: it hits exactly where the trace
    // repeats a URL.
    let text = std::fs::read_to_string(&trace).expect("trace");
    let mut seen = std::collections::HashSet::new();
    let repeats = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter(|l| !seen.insert(l.split_whitespace().nth(3).unwrap_or("").to_string()))
        .count();
    let hits = (c["hit_ratio"].as_f64().expect("hit ratio") * 30.0).round() as usize;
    assert_eq!(hits, repeats, "{c:#}");
    // Serial replay: the node saw the trace's URLs in the trace's order (after the lab's own
    // pre-warming request; the origins listen on port 8080).
    let logged: Vec<String> = logged_urls(&out_dir.join("runs").join("00-meshcache-one"), "n0")
        .into_iter()
        .filter(|u| !u.contains("/lab-prewarm/"))
        .map(|u| u.replacen(":8080/", "/", 1))
        .collect();
    let traced: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().nth(3).unwrap_or("").to_string())
        .collect();
    assert_eq!(logged, traced);
}

/// `lab load --think`: an emulated client pauses between a response and its next request.
#[test]
fn the_client_emulator_thinks_between_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut origin = Command::new(bin())
        .args(["lab", "origin", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("origin starts");
    let up = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // One client, five requests.
    let trace = dir.path().join("trace.txt");
    let lines: String = (0..5)
        .map(|i| format!("0 0 100 http://127.0.0.1:{port}/t{i}?size=100\n"))
        .collect();
    std::fs::write(&trace, format!("# meshcache trace v1\n{lines}")).expect("write");
    let load = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(bin())
            .args(["lab", "load", "--origin", "--json", "--trace"])
            .arg(&trace)
            .args(extra)
            .output()
            .expect("load runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON report")
    };
    let (quick, thinking) = if up {
        (load(&[]), load(&["--think", "100ms"]))
    } else {
        (serde_json::Value::Null, serde_json::Value::Null)
    };
    let _ = origin.kill();
    let _ = origin.wait();
    assert!(up, "the origin did not start");
    for r in [&quick, &thinking] {
        assert_eq!(r["requests"], 5, "{r:#}");
        assert_eq!(r["errors"]["connect"], 0, "{r:#}");
    }
    let wall = |r: &serde_json::Value| r["wall_s"].as_f64().expect("wall");
    assert!(
        wall(&thinking) >= 0.4,
        "four pauses of 100 ms: {thinking:#}"
    );
    assert!(wall(&quick) < 0.3, "no think time: {quick:#}");
    // Think time is not latency.
    assert!(
        thinking["latency_ms"]["p50"].as_f64().expect("p50") < 100.0,
        "{thinking:#}"
    );
}
