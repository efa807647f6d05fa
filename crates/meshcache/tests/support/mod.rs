//! Real Squid and tshark processes for the interop tests (`tests/squid.rs`).
//!
//! Each [`Squid`] runs `squid -N` (foreground, memory cache only) on its own loopback address
//! with ports picked free on that address, in a temporary directory owned by the `proxy` user,
//! and is stopped by PID when dropped, also when the test panics (its cache.log, stderr and
//! access log are printed then). Lessons from `meshcache-wire/tests/vectors/capture/`: Squid
//! ignores ICP from its own address, so every Squid gets its own 127.0.0.x and meshcache
//! another; Debian's Squid 5.7 goes DIRECT without ICP on loopback unless
//! `minimum_direct_rtt`/`minimum_direct_hops` are 0; never send it an ICP version-3 datagram
//! (it crashes).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use meshcache_wire::icp;

/// Where an interop tool is, or `None` (test skipped) when it is missing and
/// `MESHCACHE_SKIP_INTEROP` is set. Panics with instructions otherwise.
pub fn tool(name: &str) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    // Squid lives in /usr/sbin, which a non-root PATH may lack.
    let sbin = ["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from);
    if let Some(found) = from_path
        .iter()
        .chain(sbin.iter())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(found);
    }
    if std::env::var_os("MESHCACHE_SKIP_INTEROP").is_some() {
        eprintln!("skipping: {name} is not installed (MESHCACHE_SKIP_INTEROP is set)");
        return None;
    }
    panic!(
        "{name} is not installed: run the README's test command (scripts/test.sh), which \
         installs Debian's squid and tshark, or set MESHCACHE_SKIP_INTEROP=1 to skip the Squid \
         interop tests knowingly"
    );
}

/// A port that is free on `ip` for both TCP and UDP right now (the kernel picks it).
pub fn free_port(ip: Ipv4Addr) -> u16 {
    for _ in 0..50 {
        let tcp = std::net::TcpListener::bind((ip, 0)).expect("bind tcp");
        let port = tcp.local_addr().expect("addr").port();
        if std::net::UdpSocket::bind((ip, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {ip}");
}

fn kill(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Waits up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `n` lines of a file, or a note that it cannot be read.
pub fn tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            lines[from..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// A Squid process (see the module docs).
pub struct Squid {
    /// Short name: visible_hostname, service name, log prefix.
    pub name: String,
    /// Its loopback address (HTTP, ICP, and outgoing TCP).
    pub ip: Ipv4Addr,
    /// `http_port`.
    pub http: SocketAddr,
    /// `icp_port`.
    pub icp: SocketAddr,
    dir: tempfile::TempDir,
    child: Option<Child>,
    pid: u32,
    digests: bool,
    /// `http_access` lines (and their `acl`s) in place of "loopback clients only".
    http_access: Option<String>,
}

impl Squid {
    /// Picks ports on `ip`; nothing runs until [`Squid::start`].
    pub fn new(name: &str, ip: Ipv4Addr) -> Squid {
        let dir = tempfile::Builder::new()
            .prefix(&format!("meshcache-squid-{name}-"))
            .tempdir()
            .expect("tempdir");
        // Squid drops root for cache_effective_user (proxy); it must write its logs here.
        let _ = Command::new("chown")
            .arg("proxy:proxy")
            .arg(dir.path())
            .stderr(Stdio::null())
            .status();
        Squid {
            name: name.into(),
            ip,
            http: SocketAddr::from((ip, free_port(ip))),
            icp: SocketAddr::from((ip, free_port(ip))),
            dir,
            child: None,
            pid: 0,
            digests: false,
            http_access: None,
        }
    }

    /// Uses these `acl` and `http_access` lines instead of "every loopback client, nobody
    /// else" (`localnet` is 127.0.0.0/8; the lines may redefine other acls).
    pub fn with_http_access(mut self, lines: &str) -> Squid {
        self.http_access = Some(lines.to_owned());
        self
    }

    /// The temporary directory (logs, config).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Squid's access log.
    pub fn access_log(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    /// Squid's cache.log.
    pub fn cache_log(&self) -> PathBuf {
        self.dir.path().join("cache.log")
    }

    /// The process id (0 before start).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn config(&self, extra: &str) -> String {
        let dir = self.dir.path().display();
        let (ip, http, icp, name) = (self.ip, self.http.port(), self.icp.port(), &self.name);
        format!(
            "# generated by meshcache tests/support (tests/squid.rs)
http_port {ip}:{http}
icp_port {icp}
htcp_port 0
udp_incoming_address {ip}
tcp_outgoing_address {ip}
visible_hostname {name}
cache_effective_user proxy
pid_filename {dir}/squid.pid
cache_log {dir}/cache.log
access_log stdio:{dir}/access.log squid
cache_store_log none
coredump_dir {dir}
netdb_filename none
cache_mem 16 MB
max_filedescriptors 1024
shutdown_lifetime 1 seconds
strip_query_terms off
# Loopback origins look 'close': without these Squid goes DIRECT and sends no ICP at all.
pinger_enable off
query_icmp off
minimum_direct_rtt 0
minimum_direct_hops 0
# The dynamic ICP timeout falls to 5 ms on loopback; a loaded test machine misses that.
icp_query_timeout 2000
digest_generation off
acl localnet src 127.0.0.0/8
{http_access}
icp_access allow localnet
icp_access deny all
miss_access allow localnet
{miss_rest}
debug_options ALL,1 12,3 15,3
{extra}
",
            // Squid's own digest fetches have no client address: `deny all` would refuse them
            // with a local 403 (and Squid then waits 5 minutes before trying again).
            http_access = self
                .http_access
                .as_deref()
                .unwrap_or("http_access allow localnet\nhttp_access deny all"),
            miss_rest = if self.digests {
                "miss_access allow all"
            } else {
                "miss_access deny all"
            }
        )
    }

    /// Writes the config (the common part plus `extra` lines, e.g. `cache_peer`), starts
    /// `squid -N` and waits (at most 20 s) until its HTTP port accepts and its ICP port answers.
    pub async fn start(&mut self, squid_bin: &Path, extra: &str) {
        let conf = self.dir.path().join("squid.conf");
        std::fs::write(&conf, self.config(extra)).expect("write squid.conf");
        let stdout = std::fs::File::create(self.dir.path().join("stdout.log")).expect("stdout");
        let stderr = std::fs::File::create(self.dir.path().join("stderr.log")).expect("stderr");
        let service: String = format!("mc{}", self.name)
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let child = Command::new(squid_bin)
            .args(["-N", "-n", &service, "-f"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn squid");
        self.pid = child.id();
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let until = Instant::now() + Duration::from_secs(20);
        let probe = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("udp");
        let mut q = Vec::new();
        // A version-2 query (version 3 crashes Debian's Squid 5.7).
        icp::encode(
            &icp::Message::query(0x7fff_fff0, "http://127.0.0.1:9/squid-readiness-probe"),
            &mut q,
        )
        .expect("encode");
        let mut http_ok = false;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "squid {} exited during start-up ({status}):\n{}",
                    self.name,
                    self.diagnostics()
                );
            }
            if Instant::now() >= until {
                panic!(
                    "squid {} not ready within 20 s (http accepting: {http_ok}):\n{}",
                    self.name,
                    self.diagnostics()
                );
            }
            if !http_ok {
                http_ok = tokio::net::TcpStream::connect(self.http).await.is_ok();
            }
            if http_ok {
                let _ = probe.send_to(&q, self.icp).await;
                let mut buf = [0u8; 512];
                let got =
                    tokio::time::timeout(Duration::from_millis(200), probe.recv_from(&mut buf))
                        .await;
                if let Ok(Ok((n, from))) = got {
                    let reply = icp::decode(&buf[..n]).expect("squid's reply decodes");
                    assert_eq!(from, self.icp, "squid answers from its icp_port");
                    assert_eq!(reply.reqnum, 0x7fff_fff0);
                    return;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Config lines for a small disk cache with Cache Digests on (Squid builds digests only
    /// with a `cache_dir`), rebuilt and rewritten every `period_s` seconds. Call
    /// [`Squid::create_swap_dirs`] with the same `extra` before [`Squid::start`].
    pub fn digest_lines(&mut self, period_s: u32) -> String {
        self.digests = true;
        format!(
            "cache_dir ufs {}/cache 32 4 4\ndigest_generation on\ndigest_rebuild_period {period_s} seconds\ndigest_rewrite_period {period_s} seconds\n",
            self.dir.path().display()
        )
    }

    /// Writes the config and runs `squid -z` to create the cache_dir's swap directories.
    pub fn create_swap_dirs(&self, squid_bin: &Path, extra: &str) {
        let cache = self.dir.path().join("cache");
        std::fs::create_dir_all(&cache).expect("cache dir");
        let _ = Command::new("chown")
            .arg("proxy:proxy")
            .arg(&cache)
            .stderr(Stdio::null())
            .status();
        let conf = self.dir.path().join("squid.conf");
        std::fs::write(&conf, self.config(extra)).expect("write squid.conf");
        let service: String = format!("mc{}z", self.name)
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let out = Command::new(squid_bin)
            .args(["-N", "-z", "-n", &service, "-f"])
            .arg(&conf)
            .stdin(Stdio::null())
            .output()
            .expect("squid -z");
        assert!(
            out.status.success(),
            "squid -z failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
    }

    /// Sends a signal (`-STOP`, `-CONT`, `-KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        assert!(self.pid != 0, "not started");
        kill(signal, self.pid);
    }

    /// Waits (at most 5 s) for the process to be gone after `-KILL`, and reaps it.
    pub fn reap(&mut self) {
        if let Some(child) = self.child.as_mut() {
            assert!(
                wait_exit(child, Duration::from_secs(5)),
                "squid {} did not exit",
                self.name
            );
        }
    }

    /// Access-log lines (Squid's native format), waiting (at most 5 s) until one satisfies
    /// `want`; returns that line.
    pub async fn log_line(&self, want: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(self.access_log()).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| want(l)) {
                return l.to_owned();
            }
            if Instant::now() >= until {
                panic!(
                    "squid {}: no such access-log line; access.log:\n{text}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The access-log line of the first HTTP request for exactly `url` (not an ICP_QUERY line).
    pub async fn http_line(&self, url: &str) -> String {
        self.http_line_nth(url, 0).await
    }

    /// The access-log line of the `nth` (0-based) HTTP request for exactly `url`.
    pub async fn http_line_nth(&self, url: &str, nth: usize) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(self.access_log()).unwrap_or_default();
            let found = text
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 8 && f[5] != "ICP_QUERY" && f[6] == url
                })
                .nth(nth);
            if let Some(l) = found {
                return l.to_owned();
            }
            if Instant::now() >= until {
                panic!(
                    "squid {}: no request #{nth} for {url}; access.log:\n{text}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Squid's cache-manager page `name` (e.g. `server_list`), fetched from its HTTP port.
    pub async fn mgr(&self, name: &str) -> String {
        // Squid serves internal URLs for its visible_hostname and own http_port.
        let url = format!(
            "http://{}:{}/squid-internal-mgr/{name}",
            self.name,
            self.http.port()
        );
        let r = super::common::get(self.http, &url).await;
        String::from_utf8_lossy(&r.body).into_owned()
    }

    /// cache.log lines that suggest Squid disliked something a peer sent, or broke.
    pub fn complaints(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.cache_log()).unwrap_or_default();
        text.lines()
            .filter(|l| {
                let u = l.to_ascii_uppercase();
                u.contains("FATAL")
                    || u.contains("ASSERTION")
                    || u.contains("ERROR")
                    || u.contains("WARNING")
                    || u.contains("REQNUM = 0")
                    || u.contains("NON-PEER")
                    || u.contains("UNKNOWN OPCODE")
                    || u.contains("UNUSED ICP VERSION")
                    || u.contains("TOO SMALL")
                    || u.contains("BAD")
            })
            .map(str::to_owned)
            .collect()
    }

    /// Everything useful to read when something went wrong.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- squid {} ({}), stderr:\n{}\n--- cache.log (last 150 lines):\n{}\n--- access.log (last 60 lines):\n{}\n---",
            self.name,
            self.dir.path().display(),
            tail(&self.dir.path().join("stderr.log"), 40),
            tail(&self.cache_log(), 150),
            tail(&self.access_log(), 60),
        )
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                kill("-CONT", self.pid); // it may be SIGSTOPped
                kill("-TERM", self.pid);
                // shutdown_lifetime is 1 s.
                if !wait_exit(&mut child, Duration::from_secs(6)) {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
    }
}

/// A running `tshark -i lo` capture into a file.
pub struct Capture {
    child: Option<Child>,
    pid: u32,
    /// The pcapng file.
    pub file: PathBuf,
    stderr: Lines,
    _dir: tempfile::TempDir,
}

/// tshark's stderr, collected by a thread.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Lines {
    fn push(&self, l: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(l);
    }
    fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    }
}

impl Capture {
    /// Starts capturing loopback traffic matching the BPF `filter`, and waits (at most 20 s)
    /// until tshark says it is capturing. Stops by itself after 120 s at the latest.
    pub fn start(tshark: &Path, filter: &str) -> Capture {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("icp.pcapng");
        let mut child = Command::new(tshark)
            .args(["-i", "lo", "-f", filter, "-a", "duration:120", "-q", "-w"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tshark");
        let pid = child.id();
        let lines = Lines::default();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let stderr = child.stderr.take().expect("stderr");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("Capturing on") {
                    let _ = tx.send(());
                }
                sink.push(line);
            }
        });
        let mut capture = Capture {
            child: Some(child),
            pid,
            file,
            stderr: lines,
            _dir: dir,
        };
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let text = capture.stderr.text();
            capture.stop();
            panic!("tshark did not start capturing on lo within 20 s: {text}");
        }
        // "Capturing on" comes as the capture starts; give the kernel filter a moment.
        std::thread::sleep(Duration::from_millis(300));
        capture
    }

    /// Stops the capture (SIGINT, so the file is completed) and returns tshark's messages.
    pub fn stop(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            kill("-INT", self.pid);
            if !wait_exit(&mut child, Duration::from_secs(10)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        self.stderr.text()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a command to completion (at most 60 s, by coreutils' `timeout`) and returns
/// (success, stdout, stderr).
pub fn run(cmd: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("timeout")
        .arg("60")
        .arg(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", cmd.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
