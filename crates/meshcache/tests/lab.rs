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
    for name in ["icp-overhead", "hierarchies", "trans-pacific"] {
        let file = repo().join(format!("experiments/{name}.toml"));
        let out = lab(&["run", file.to_str().expect("path"), "--check"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
        format!(
            r#"
name = "siblings"
products = {products}
[workload]
model = "benchmark"
clients = 6
requests_per_client = 20
groups = 2
disjoint = true
inherent_hit_ratio = 0.3
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
        // where it is received. meshcache asks for every miss; Squid may skip a query (for a
        // while after a start it treats a silent sibling as not worth asking).
        let misses = (120.0 * (1.0 - icp["hit_ratio"].as_f64().expect("hit"))).round() as u64;
        let udp = icp["udp_messages"].as_u64().expect("udp");
        if g == "meshcache" {
            assert_eq!(udp, 4 * misses, "{g}: {udp} datagrams for {misses} misses");
        } else {
            assert!(
                udp > 0 && udp <= 4 * misses,
                "{g}: {udp} datagrams for {misses} misses"
            );
        }
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
    let _turn = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exp.toml");
    std::fs::write(
        &file,
        r#"
name = "long"
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
"#,
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
    let conf = out_dir.join("runs/00-meshcache-long/n1/meshcache.toml");
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
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let _ = child.wait();
    // The command's own namespace copy stops its nodes; give it a few seconds.
    let mut left = processes_mentioning(&needle);
    let t = std::time::Instant::now();
    while !left.is_empty() && t.elapsed() < std::time::Duration::from_secs(15) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = processes_mentioning(&needle);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}
