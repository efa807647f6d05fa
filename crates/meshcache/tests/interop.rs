//! Interop with real tools: curl as the client, calamaris reading our access log, and the
//! `meshcache` binary itself. The README's test command installs the tools; without them these
//! tests fail and say so (set MESHCACHE_SKIP_INTEROP=1 to skip them knowingly).

mod common;

use std::process::{Command, Output, Stdio};

use common::{at_origin, get, node};
use meshcache_lab::Origin;

fn tool(name: &str) -> Option<()> {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(());
    }
    if std::env::var_os("MESHCACHE_SKIP_INTEROP").is_some() {
        eprintln!("skipping: {name} is not installed");
        return None;
    }
    panic!("{name} is not installed: run the README's test command (scripts/test.sh), which installs it, or set MESHCACHE_SKIP_INTEROP=1");
}

async fn run(cmd: &'static str, args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || Command::new(cmd).args(&args).output().expect("run tool"))
        .await
        .expect("join")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_the_proxy() {
    let Some(()) = tool("curl") else { return };
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    let p = proxy.addr.to_string();
    let url = origin.url("/curl?size=2048&cc=max-age=60");
    for (i, want) in ["MISS", "HIT"].iter().enumerate() {
        let o = run(
            "curl",
            vec![
                "-sS".into(),
                "-D".into(),
                "-".into(),
                "-o".into(),
                "/dev/null".into(),
                "-x".into(),
                p.clone(),
                url.clone(),
            ],
        )
        .await;
        let out = text(&o);
        assert!(o.status.success(), "curl #{i}: {out}");
        assert!(
            out.contains(&format!("x-cache: {want} from testcache")),
            "curl #{i}: {out}"
        );
    }
    // HTTP/1.0 proxy request, HEAD, and a refused CONNECT.
    let o = run(
        "curl",
        vec![
            "-sS".into(),
            "-i".into(),
            "--proxy1.0".into(),
            p.clone(),
            url.clone(),
        ],
    )
    .await;
    assert!(
        text(&o).starts_with("HTTP/1.0 200") || text(&o).starts_with("HTTP/1.1 200"),
        "{}",
        text(&o)
    );
    assert!(
        o.stdout.ends_with(&meshcache_lab::expected_body(2048)),
        "body through --proxy1.0"
    );
    let o = run(
        "curl",
        vec![
            "-sS".into(),
            "-I".into(),
            "-x".into(),
            p.clone(),
            url.clone(),
        ],
    )
    .await;
    assert!(text(&o).contains("content-length: 2048"), "{}", text(&o));
    let o = run(
        "curl",
        vec![
            "-sS".into(),
            "-p".into(),
            "-x".into(),
            p.clone(),
            "http://127.0.0.1:25/".into(),
        ],
    )
    .await;
    assert!(
        !o.status.success() && text(&o).contains("403"),
        "{}",
        text(&o)
    );
    assert_eq!(origin.hits("/curl?size=2048&cc=max-age=60"), 1);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calamaris_reads_our_access_log() {
    let Some(()) = tool("calamaris") else { return };
    let origin = Origin::start().await.expect("origin");
    let proxy = node(|_| {}).await;
    // A mix of outcomes: miss, hit, revalidation, error, denial, malformed, aborted.
    get(proxy.addr, &origin.url("/c1?size=100&cc=max-age=60")).await;
    get(proxy.addr, &origin.url("/c1?size=100&cc=max-age=60")).await;
    get(
        proxy.addr,
        &origin.url("/c2?cc=no-cache&etag=x&ct=text/html"),
    )
    .await;
    get(
        proxy.addr,
        &origin.url("/c2?cc=no-cache&etag=x&ct=text/html"),
    )
    .await;
    get(proxy.addr, &origin.url("/c3?status=404")).await;
    get(proxy.addr, "http://127.0.0.1:9/refused").await;
    common::raw(
        proxy.addr,
        b"CONNECT 127.0.0.1:25 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    common::raw(proxy.addr, b"NOT HTTP AT ALL\r\n\r\n").await;
    // A client that leaves while the origin thinks: TCP_MISS_ABORTED/000.
    let slow = origin.url("/c4?delay_ms=500");
    let _ = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        get(proxy.addr, &slow),
    )
    .await;
    let lines = proxy.log_lines(9).await;
    assert!(
        lines.iter().any(|l| l.contains(" TCP_MISS_ABORTED/000 ")),
        "{lines:?}"
    );
    let log = proxy.log.clone();
    let o = tokio::task::spawn_blocking(move || {
        Command::new("calamaris")
            .arg("-a")
            .stdin(std::fs::File::open(log).expect("log"))
            .output()
            .expect("calamaris")
    })
    .await
    .expect("join");
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        o.stderr.is_empty(),
        "calamaris complained: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let field = |label: &str| -> u64 {
        report
            .lines()
            .find(|l| l.starts_with(label))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {label:?} in report:\n{report}"))
    };
    assert_eq!(field("lines parsed:"), lines.len() as u64, "{report}");
    assert_eq!(field("invalid lines:"), 0, "{report}");
    assert!(field("Total amount cached:") >= 2, "{report}");
    proxy.stop().await;
}

#[tokio::test]
async fn the_binary_prints_and_checks_configs() {
    let bin = env!("CARGO_BIN_EXE_meshcache");
    let o = run_bin(bin, &["config", "default"]);
    assert!(o.status.success());
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.toml");
    std::fs::write(&good, &o.stdout).expect("write");
    let o = run_bin(bin, &["config", "check", good.to_str().expect("path")]);
    assert!(o.status.success(), "{}", text(&o));
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[store]\nmemory = \"1 MiB\"\nreplacment = \"lru\"\n").expect("write");
    let o = run_bin(bin, &["config", "check", bad.to_str().expect("path")]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("replacment"),
        "names the bad key: {}",
        text(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_a_proxy_and_stops_on_sigterm() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, addr) = spawn_bin(dir.path(), "").await;
    let r = get(addr, &origin.url("/bin?size=3")).await;
    assert_eq!(r.header("x-cache"), "MISS from bin");
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "clean exit on SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("a.log")).expect("log");
    assert!(
        log.contains("TCP_MISS/200"),
        "log flushed on shutdown: {log:?}"
    );
}

fn run_bin(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .expect("run meshcache")
}

/// Starts the binary on an ephemeral port with `extra` TOML (in `[http]`); returns it and its
/// address.
async fn spawn_bin(
    dir: &std::path::Path,
    extra: &str,
) -> (std::process::Child, std::net::SocketAddr) {
    let bin = env!("CARGO_BIN_EXE_meshcache");
    let port = common::dead_port().await.port();
    let conf = dir.join("node.toml");
    std::fs::write(
        &conf,
        format!(
            "name = \"bin\"\n[http]\nlisten = [\"127.0.0.1:{port}\"]\n{extra}\n[admin]\nlisten = \"off\"\n[log]\naccess = \"{}\"\n",
            dir.join("a.log").display()
        ),
    )
    .expect("write");
    let mut child = Command::new(bin)
        .args(["run", "-c", conf.to_str().expect("path")])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return (child, addr);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("proxy did not start");
}

/// The proxy turns transparent huge pages off for its process unless `MIMALLOC_ALLOW_THP`
/// says otherwise (measured: less CPU and memory for a busy cache).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_runs_without_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        eprintln!("MIMALLOC_ALLOW_THP is set: the proxy leaves huge pages to mimalloc");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, _addr) = spawn_bin(dir.path(), "").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    let status = status.expect("the proxy's /proc status");
    // Kernels without transparent huge pages do not report the flag.
    if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_an_in_flight_request_finish_then_exits() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tempdir");
    let (child, addr) = spawn_bin(dir.path(), "").await;
    let path = "/slow?delay_ms=700&size=50000";
    let url = origin.url(path);
    let in_flight = tokio::spawn(async move { get(addr, &url).await });
    // The request is at the origin, waiting out its delay, when the signal comes.
    at_origin(&origin, path).await;
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    let r = in_flight.await.expect("task");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        meshcache_lab::expected_body(50000),
        "the whole body"
    );
    let mut child = child;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "clean exit on SIGINT");
    // No new connection is taken any more.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_waiting_for_a_stalled_request_after_the_grace_period() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tempdir");
    let (child, addr) = spawn_bin(dir.path(), "shutdown_grace = \"300ms\"").await;
    // The origin sends the head, then stalls the body for a minute; the client keeps its
    // connection open (and reads nothing) for as long as the test lasts.
    let path = "/stall?stall_ms=60000&size=1000";
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url(path)).as_bytes())
        .await
        .expect("write");
    at_origin(&origin, path).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    let mut child = child;
    // Bounded by the grace period (300 ms), not by the stall (a minute) nor by the default
    // grace (10 s): the process is gone within a few seconds.
    let exited = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .expect("exited within the grace period, not the stall")
    .expect("join")
    .expect("wait");
    assert!(exited.success(), "{exited:?}");
    drop(client);
}

/// SIGUSR1 reopens the access log, as `squid -k rotate` does with `logfile_rotate 0`: what
/// logrotate moved away keeps the lines before the signal, and a new file at the configured
/// path gets the lines after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_access_log_for_logrotate() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, addr) = spawn_bin(dir.path(), "").await;
    let log = dir.path().join("a.log");
    let moved = dir.path().join("a.log.1");
    let wait_for = |path: std::path::PathBuf, want: &'static str| async move {
        for _ in 0..100 {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains(want) {
                return text;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("{want} never reached {}", path.display());
    };
    assert_eq!(get(addr, &origin.url("/before?size=3")).await.status, 200);
    wait_for(log.clone(), "/before").await;
    std::fs::rename(&log, &moved).expect("rotate the file away");
    Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .expect("kill");
    // The signal is handled asynchronously: until the new file appears, lines may still go
    // to the moved one, as with Squid.
    for _ in 0..100 {
        if log.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(log.exists(), "no new log after SIGUSR1");
    assert_eq!(get(addr, &origin.url("/after?size=3")).await.status, 200);
    let new = wait_for(log.clone(), "/after").await;
    assert!(!new.contains("/before"), "{new}");
    let old = std::fs::read_to_string(&moved).expect("moved log");
    assert!(old.contains("/before") && !old.contains("/after"), "{old}");
    let _ = child.kill();
    let _ = child.wait();
}
