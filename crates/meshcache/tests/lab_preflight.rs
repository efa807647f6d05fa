//! The lab's checks before a run, end to end: a run of Squid nodes into a results folder made
//! private (mode 0700, as `mktemp -d` makes it). Squid started by root drops to its own user
//! before it opens its logs below that folder, which that user cannot enter: the run must be
//! refused before anything starts, with a line that names the folder and the `chmod` that
//! fixes it, and that fix must be enough. Run by another user, Squid keeps that user, and the
//! same run simply works.
//!
//! Squid must be installed (the README's test command installs it): without it this test fails,
//! unless MESHCACHE_SKIP_INTEROP=1 skips it knowingly.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether Squid is installed; without it the test fails, unless MESHCACHE_SKIP_INTEROP=1.
fn squid_installed() -> bool {
    if ["/usr/sbin/squid", "/usr/local/sbin/squid", "/usr/bin/squid"]
        .iter()
        .any(|p| Path::new(p).is_file())
    {
        return true;
    }
    if std::env::var_os("MESHCACHE_SKIP_INTEROP").is_some_and(|v| v == "1") {
        eprintln!("skipping: squid is not installed (MESHCACHE_SKIP_INTEROP=1)");
        return false;
    }
    panic!(
        "squid is not installed: run the README's test command (scripts/test.sh), which \
         installs Debian's squid, or set MESHCACHE_SKIP_INTEROP=1 to skip this test knowingly"
    );
}

/// Whether this process's effective user is root.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|ids| ids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// What a finished command did.
struct Ran {
    ok: bool,
    stderr: String,
    took: Duration,
}

/// `meshcache lab run FILE --out OUT --quiet`, killed if it takes longer than `limit`.
fn lab_run(file: &Path, out: &Path, logs: &Path, limit: Duration) -> Ran {
    let err_path = logs.join("stderr");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["lab", "run"])
        .arg(file)
        .arg("--out")
        .arg(out)
        .arg("--quiet")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("lab run starts");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "lab run took more than {limit:?}: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        ok: status.success(),
        stderr: std::fs::read_to_string(&err_path).expect("stderr"),
        took: started.elapsed(),
    }
}

#[test]
fn a_squid_run_into_a_private_folder_is_refused_up_front_or_works() {
    if !squid_installed() {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("exp.toml");
    std::fs::write(
        &file,
        r#"
name = "private"
products = ["squid"]
[workload]
model = "benchmark"
clients = 2
requests_per_client = 5
groups = 1
[origins]
delay = "1ms"
[nodes]
memory = "16 MiB"
[clients]
deadline = "20s"
[[config]]
name = "none"
topology = "2.0"
protocol = "none"
"#,
    )
    .expect("write");
    let private = tempfile::Builder::new()
        .prefix("lab-private")
        .tempdir()
        .expect("tempdir");
    let out: PathBuf = private.path().to_path_buf();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let limit = Duration::from_secs(60);

    if is_root() {
        // Refused before anything started: one line that names the folder and its fix.
        let ran = lab_run(&file, &out, work.path(), limit);
        assert!(!ran.ok, "the run should have been refused: {}", ran.stderr);
        let line = ran
            .stderr
            .lines()
            .find(|l| l.contains("may not enter"))
            .unwrap_or_else(|| panic!("no refusal naming the folder: {}", ran.stderr));
        let dir = out.display();
        assert!(
            line.starts_with("meshcache lab: Squid runs as user ")
                && line.contains(&format!("may not enter {dir} (mode 0700"))
                && line.contains(&format!(": chmod o+x {dir} ")),
            "{line}"
        );
        assert!(
            ran.stderr
                .contains("the run did not start (1 problem above)"),
            "{}",
            ran.stderr
        );
        let left: Vec<_> = std::fs::read_dir(&out).expect("out").collect();
        assert!(left.is_empty(), "a refused run wrote {left:?}");
        let mode = std::fs::metadata(&out).expect("out").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the given folder is not the lab's to change");
        assert!(
            ran.took < Duration::from_secs(10),
            "refused only after {:?}",
            ran.took
        );
        // The fix the line names is enough.
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o701)).expect("o+x");
    }
    let ran = lab_run(&file, &out, work.path(), limit);
    assert!(ran.ok, "{}", ran.stderr);
    let results = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let r: serde_json::Value = serde_json::from_str(&results).expect("JSON");
    assert_eq!(r["configs"][0]["requests"], 10, "{r:#}");
}
