//! Smoke tests of `meshcache workload`: generate a trace from flags and from
//! a spec file, characterize a log, build the characterized model from the
//! characterization, replay a log.

use std::path::Path;
use std::process::Command;

fn meshcache(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(args)
        .output()
        .expect("run meshcache");
    assert!(
        out.status.success(),
        "meshcache {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn trace_len(path: &Path) -> usize {
    let file = std::fs::File::open(path).expect("open the trace");
    meshcache_workload::trace::read(std::io::BufReader::new(file))
        .expect("read the trace")
        .1
        .len()
}

#[test]
fn generate_characterize_replay() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();

    // Benchmark from flags.
    let out = meshcache(&[
        "workload",
        "generate",
        "--clients",
        "4",
        "--requests-per-client",
        "250",
        "--hit-ratio",
        "0.4",
        "--groups",
        "2",
        "--seed",
        "3",
        "--out",
        &p("a.trace"),
    ]);
    assert!(out.contains("requests:            1000"), "{out}");
    assert_eq!(trace_len(&dir.path().join("a.trace")), 1000);
    let text = std::fs::read_to_string(p("a.trace")).unwrap();
    assert!(text.contains("# seed = 3") && text.contains("# model = \"benchmark\""));
    // Same flags, same bytes.
    meshcache(&[
        "workload",
        "generate",
        "--clients",
        "4",
        "--requests-per-client",
        "250",
        "--hit-ratio",
        "0.4",
        "--groups",
        "2",
        "--seed",
        "3",
        "--out",
        &p("b.trace"),
    ]);
    assert_eq!(text, std::fs::read_to_string(p("b.trace")).unwrap());

    // A spec file with a [workload] table; a bad value names its key.
    std::fs::write(
        p("spec.toml"),
        "[workload]\nmodel = \"benchmark\"\nclients = 3\nrequests_per_client = 10\ngroups = 1\n",
    )
    .unwrap();
    let out = meshcache(&[
        "workload",
        "generate",
        "--spec",
        &p("spec.toml"),
        "--out",
        &p("c.trace"),
    ]);
    assert!(out.contains("requests:            30"), "{out}");
    let bad = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args([
            "workload",
            "generate",
            "--hit-ratio",
            "1.5",
            "--out",
            &p("d.trace"),
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("inherent_hit_ratio"));

    // A log from the trace, characterized.
    let (_, reqs) = meshcache_workload::trace::read(std::io::BufReader::new(
        std::fs::File::open(p("a.trace")).unwrap(),
    ))
    .unwrap();
    let mut log = String::new();
    for (i, r) in reqs.iter().enumerate() {
        log.push_str(&format!(
            "{}.000 5 10.0.0.{} TCP_MISS/200 {} GET {} - HIER_DIRECT/o text/html\n",
            1_700_000_000 + i,
            r.client,
            r.size,
            r.url
        ));
    }
    log.push_str("not a log line\n");
    std::fs::write(p("access.log"), log).unwrap();
    let table = meshcache(&[
        "workload",
        "characterize",
        &p("access.log"),
        "--group",
        ".lab",
    ]);
    assert!(table.contains("too few fields: 1"), "{table}");
    assert!(table.contains("hot ratio"), "{table}");
    let json = meshcache(&[
        "workload",
        "characterize",
        &p("access.log"),
        "--group",
        "group0.lab",
        "--json",
    ]);
    std::fs::write(p("ch.json"), &json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["overall"]["requests"], 1000);
    let ratio = v["groups"][0]["domain_ratio"].as_f64().unwrap();
    assert!((ratio - 0.5).abs() < 1e-9, "{ratio}");

    // The characterized model from it, scaled down; and the log replayed.
    let out = meshcache(&[
        "workload",
        "generate",
        "--from",
        &p("ch.json"),
        "--requests",
        "500",
        "--out",
        &p("e.trace"),
    ]);
    assert!(out.contains("requests:            500"), "{out}");
    let out = meshcache(&[
        "workload",
        "generate",
        "--replay",
        &p("access.log"),
        "--out",
        &p("f.trace"),
    ]);
    assert!(out.contains("requests:            1000"), "{out}");
    assert_eq!(trace_len(&dir.path().join("f.trace")), 1000);
}
