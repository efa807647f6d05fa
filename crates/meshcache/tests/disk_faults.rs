//! The disk store when things go wrong, with the `meshcache` binary in a process of its own:
//! killed with SIGKILL in the middle of writes, a full file system, a file system made
//! read-only, its directory removed. The node keeps serving; what it serves after is whole and
//! right; what it wrote more than `sync_interval` before a kill is still there.
//!
//! The full and read-only file systems are small tmpfs mounts in a mount namespace of the
//! node's own (`unshare --mount`), which needs root, as the rest of the suite does.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{get, send, Reply};
use http::Request;
use http_body_util::Empty;
use meshcache_lab::origin::body_byte;
use meshcache_lab::Origin;

const SYNC_INTERVAL: Duration = Duration::from_millis(200);

/// A `meshcache run` process; killed when dropped.
struct Running {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Writes a config for a node with `memory` of memory and one disk at `cache`.
fn config(dir: &Path, cache: &Path, memory: &str) -> (PathBuf, SocketAddr, SocketAddr) {
    config_sized(dir, cache, memory, "64 MiB")
}

/// [`config`] with a disk of `disk` bytes.
fn config_sized(
    dir: &Path,
    cache: &Path,
    memory: &str,
    disk: &str,
) -> (PathBuf, SocketAddr, SocketAddr) {
    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let path = dir.join(format!("meshcache-{}.toml", proxy.port()));
    let text = format!(
        "[http]\nlisten = [\"{proxy}\"]\n[admin]\nlisten = \"{admin}\"\n[log]\naccess = \"off\"\n\
         [store]\nmemory = \"{memory}\"\nmax_object_size = \"8 MiB\"\n\
         [[store.disk]]\npath = \"{}\"\nsize = \"{disk}\"\nsync_interval = \"{}ms\"\n",
        cache.display(),
        SYNC_INTERVAL.as_millis()
    );
    std::fs::write(&path, text).expect("config");
    (path, proxy, admin)
}

/// Starts `meshcache run -c CONFIG`, behind `wrapper` (a command and its arguments, the
/// meshcache command line appended) if given, and waits until it answers on its admin port.
async fn run(config: (PathBuf, SocketAddr, SocketAddr), wrapper: &[&str]) -> Running {
    let (path, proxy, admin) = config;
    let bin = env!("CARGO_BIN_EXE_meshcache");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let child = cmd
        .args(["run", "-c"])
        .arg(&path)
        .env("MESHCACHE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn meshcache");
    let mut node = Running {
        child,
        proxy,
        admin,
    };
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("meshcache exited at start: {status}");
        }
        if tokio::net::TcpStream::connect(admin).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < until,
            "meshcache did not start within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.rebuilt().await;
    node
}

impl Running {
    async fn stats(&self) -> serde_json::Value {
        let req = Request::get("/stats")
            .header("host", self.admin.to_string())
            .body(Empty::<Bytes>::new())
            .expect("request");
        let reply = send(self.admin, req).await;
        serde_json::from_slice(&reply.body).expect("stats")
    }

    async fn disk(&self) -> serde_json::Value {
        self.stats().await["store"]["disks"][0].clone()
    }

    async fn rebuilt(&self) {
        for _ in 0..1000 {
            if self.disk().await["rebuilding"] == false {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the disk was not rebuilt within 10 s");
    }

    async fn fault(&self, kind: &str) -> u64 {
        self.disk().await["faults"][kind].as_u64().unwrap_or(0)
    }

    /// Waits (at most 10 s) until the disk counts a fault of `kind`.
    async fn until_fault(&self, kind: &str) {
        for _ in 0..500 {
            if self.fault(kind).await > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no {kind} fault counted: {}", self.disk().await);
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// An object of the test: its path at the origin, and its body.
struct Object {
    path: String,
    text: String,
    size: usize,
}

impl Object {
    fn new(name: &str, size: usize) -> Object {
        let text = format!("{name}:");
        Object {
            path: format!("/{name}?size={size}&text={text}&cc=max-age%3D3600"),
            text,
            size,
        }
    }

    /// Whether `body` is exactly this object's (its text, then the origin's pattern).
    fn is_body(&self, body: &[u8]) -> bool {
        body.len() == self.size
            && body.starts_with(self.text.as_bytes())
            && body
                .iter()
                .enumerate()
                .skip(self.text.len())
                .all(|(i, &b)| b == body_byte(i as u64))
    }
}

const SIZES: [usize; 7] = [300, 2_000, 9_000, 31_000, 40_000, 150_000, 1_100_000];

/// GETs `object` through `proxy`; the body must be the object's.
async fn fetch(proxy: SocketAddr, origin: &Origin, object: &Object) -> Reply {
    let r = get(proxy, &origin.url(&object.path)).await;
    assert_eq!(r.status, 200, "{}", object.path);
    assert!(
        object.is_body(&r.body),
        "{}: a wrong or truncated body of {} bytes was served",
        object.path,
        r.body.len()
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_writes_never_serves_a_damaged_object() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path().join("cache");
    // (object, when it was received whole); objects of the rounds so far.
    let mut stored: Vec<(Object, Instant)> = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // A short loop here; `scripts/bench-crash.sh` runs the long one (20 rounds).
    let rounds: usize = std::env::var("MESHCACHE_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut kept = (0usize, 0usize);
    let mut checked = 0usize;
    // Room for every round's objects (a round stores at most about 40 MiB), so an object that
    // is gone was lost to a kill, not replaced.
    let disk = format!("{} MiB", 64 + 48 * rounds);
    for round in 0..=rounds {
        let node = run(config_sized(dir.path(), &cache, "1 MiB", &disk), &[]).await;
        // Everything stored before: right bytes or a miss; old enough: a hit.
        let killed_at = Instant::now();
        for (object, received) in &stored {
            let r = fetch(node.proxy, &origin, object).await;
            checked += 1;
            if killed_at.duration_since(*received) > SYNC_INTERVAL * 2 {
                kept.1 += 1;
                if r.x_cache() == "HIT" {
                    kept.0 += 1;
                }
            }
        }
        if round == rounds {
            break;
        }
        // Load for a random while, two clients at once, then SIGKILL.
        let load = Duration::from_millis(300 + random() % 900);
        let until = Instant::now() + load;
        let clients: Vec<_> = (0..2)
            .map(|client| {
                let proxy = node.proxy;
                let origin_url = origin.url("/");
                tokio::spawn(async move {
                    let mut done = Vec::new();
                    let mut i = 0;
                    while Instant::now() < until && i < 400 {
                        let object = Object::new(
                            &format!("crash-{round}-{client}-{i}"),
                            SIZES[i % SIZES.len()],
                        );
                        let url = format!("{}{}", origin_url.trim_end_matches('/'), object.path);
                        let r = get(proxy, &url).await;
                        assert!(object.is_body(&r.body), "{}", object.path);
                        done.push((object, Instant::now()));
                        i += 1;
                    }
                    done
                })
            })
            .collect();
        for c in clients {
            stored.extend(c.await.expect("client"));
        }
        let mut node = node;
        Command::new("kill")
            .args(["-KILL", &node.pid().to_string()])
            .status()
            .expect("kill");
        let _ = node.child.wait();
    }
    assert!(
        stored.len() > 30,
        "the load stored {} objects",
        stored.len()
    );
    let (hits, old) = kept;
    println!(
        "crash loop: {rounds} kills, {} objects stored, {checked} read back whole and right \
         (0 damaged or truncated), {hits} of {old} stored more than twice sync_interval before \
         a kill were hits",
        stored.len()
    );
    assert!(
        hits * 100 >= old * 99,
        "{hits} of {old} objects stored more than twice sync_interval before a kill were hits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_directory_is_made_again_and_used() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path().join("cache");
    let node = run(config(dir.path(), &cache, "64 KiB"), &[]).await;
    for i in 0..5 {
        fetch(
            node.proxy,
            &origin,
            &Object::new(&format!("before-{i}"), 10_000),
        )
        .await;
    }
    std::fs::remove_dir_all(&cache).expect("remove the directory");
    node.until_fault("removed").await;
    // The node keeps serving, from the origin, and writes to the directory made again.
    for _ in 0..250 {
        if cache.join("slab").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cache.join("slab").exists(), "the directory was made again");
    let writes = node.disk().await["writes"].as_u64().unwrap_or(0);
    for i in 0..5 {
        fetch(
            node.proxy,
            &origin,
            &Object::new(&format!("before-{i}"), 10_000),
        )
        .await;
        fetch(
            node.proxy,
            &origin,
            &Object::new(&format!("after-{i}"), 10_000),
        )
        .await;
    }
    for _ in 0..250 {
        if node.disk().await["writes"].as_u64().unwrap_or(0) >= writes + 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let disk = node.disk().await;
    assert!(disk["writes"].as_u64() >= Some(writes + 5), "{disk}");
    assert!(disk["objects"].as_u64() >= Some(5), "{disk}");
}

/// Mounts a tmpfs of `size` at `at` in a mount namespace of the node's own, and runs the node
/// there; `nsenter` reaches the namespace afterwards.
fn in_small_tmpfs(at: &Path, size: &str) -> Vec<String> {
    std::fs::create_dir_all(at).expect("mount point");
    vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount -t tmpfs -o size={size} meshcache-test {} && exec \"$0\" \"$@\"",
            at.display()
        ),
    ]
}

fn in_namespace_of(node: &Running, command: &str) {
    let status = Command::new("nsenter")
        .args([
            "--target",
            &node.pid().to_string(),
            "--mount",
            "sh",
            "-c",
            command,
        ])
        .status()
        .expect("nsenter");
    assert!(
        status.success(),
        "`{command}` in the node's namespace failed"
    );
}

/// Whether mount namespaces and tmpfs mounts can be used here (root, or the capability).
fn can_mount() -> bool {
    Command::new("unshare")
        .args(["--mount", "sh", "-c", "mount -t tmpfs none /mnt"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_then_read_only_file_system_leaves_the_node_serving() {
    assert!(
        can_mount(),
        "this test mounts a small tmpfs in a mount namespace: run the suite as root"
    );
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path().join("cache");
    let wrapper = in_small_tmpfs(&cache, "2m");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let node = run(config(dir.path(), &cache, "256 KiB"), &wrapper).await;

    // 3 MiB of objects into a 2 MiB file system: writes fail with ENOSPC, the node serves on.
    let objects: Vec<Object> = (0..30)
        .map(|i| Object::new(&format!("full-{i}"), 100_000))
        .collect();
    for o in &objects {
        fetch(node.proxy, &origin, o).await;
    }
    node.until_fault("no_space").await;
    for o in &objects {
        fetch(node.proxy, &origin, o).await;
    }
    let on_disk = node.disk().await["objects"].as_u64().unwrap_or(0);
    assert!(
        (1..30).contains(&on_disk),
        "{on_disk} objects on a 2 MiB disk"
    );

    // Read-only (a read-only mount over the directory: files can no longer be made there):
    // writes fail, what is on disk is still served.
    in_namespace_of(
        &node,
        &format!(
            "mount --bind {0} {0} && mount -o remount,bind,ro {0}",
            cache.display()
        ),
    );
    // Writes were paused after the full disk; new objects keep coming until one is tried.
    let until = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        fetch(
            node.proxy,
            &origin,
            &Object::new(&format!("ro-{i}"), 50_000),
        )
        .await;
        if node.fault("read_only").await > 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "no read_only fault: {}",
            node.disk().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hits_before = node.disk().await["hits"].as_u64().unwrap_or(0);
    for o in &objects {
        fetch(node.proxy, &origin, o).await;
    }
    assert!(node.disk().await["hits"].as_u64().unwrap_or(0) > hits_before);
    assert_eq!(
        node.stats().await["requests_by_result"]["NONE_NONE"],
        0,
        "no request failed"
    );
}
