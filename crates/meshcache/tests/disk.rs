//! The disk store over real sockets and real files: restarts serve what was stored before,
//! everything a memory hit does works on a disk hit, invalidations and damage are never served,
//! a directory serves one node at a time.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{get, node, request, Node};
use meshcache_lab::Origin;
use meshcache_proxy::config::DiskSection;
use meshcache_proxy::Config;

/// A node whose store is `memory` bytes of memory and one disk in `dir`.
fn with_disk(dir: &Path, memory: u64) -> impl FnOnce(&mut Config) + '_ {
    move |c: &mut Config| {
        c.store.memory = memory;
        c.store.max_object_size = 16 << 20;
        c.store.disks = vec![DiskSection {
            path: dir.join("cache"),
            size: 64 << 20,
            sync_interval: Duration::from_millis(200),
        }];
    }
}

/// Waits (at most 10 s) until the node's disks have found what they hold.
async fn rebuilt(node: &Node) {
    for _ in 0..1000 {
        if node.proxy.cache().disks_rebuilt() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the disks were not rebuilt within 10 s");
}

/// Writes out what the node's disks have queued.
async fn flushed(node: &Node) {
    let cache = node.proxy.cache().clone();
    let ok = tokio::task::spawn_blocking(move || cache.flush_disks(Duration::from_secs(10)))
        .await
        .expect("joined");
    assert!(ok, "the disks' queues were written");
}

fn disk_stats(stats: &serde_json::Value) -> &serde_json::Value {
    &stats["store"]["disks"][0]
}

#[tokio::test]
async fn a_restart_serves_what_was_stored_before_as_hits() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let paths: Vec<String> = [100usize, 5_000, 40_000, 300_000, 3_000_000]
        .iter()
        .map(|size| format!("/o{size}?size={size}&text=object-{size}&cc=max-age%3D600"))
        .collect();
    let proxy = node(with_disk(dir.path(), 256 << 10)).await;
    rebuilt(&proxy).await;
    for p in &paths {
        let r = get(proxy.addr, &origin.url(p)).await;
        assert_eq!((r.status, r.x_cache()), (200, "MISS"), "{p}");
    }
    flushed(&proxy).await;
    let stats = proxy.stats().await;
    assert_eq!(disk_stats(&stats)["objects"], paths.len(), "{stats}");
    proxy.stop().await;

    let proxy = node(with_disk(dir.path(), 256 << 10)).await;
    rebuilt(&proxy).await;
    assert_eq!(
        disk_stats(&proxy.stats().await)["rebuild_found"],
        paths.len()
    );
    for (i, p) in paths.iter().enumerate() {
        let r = get(proxy.addr, &origin.url(p)).await;
        assert_eq!((r.status, r.x_cache()), (200, "HIT"), "{p}");
        assert!(
            r.header("cache-status").contains("detail=disk"),
            "{p}: {:?}",
            r.headers
        );
        let size: usize = p[2..]
            .split('?')
            .next()
            .expect("size")
            .parse()
            .expect("size");
        assert_eq!(r.body.len(), size, "{p}");
        assert!(
            r.body.starts_with(format!("object-{size}").as_bytes()),
            "{p}"
        );
        assert_eq!(
            origin.hits(p),
            1,
            "{p} was fetched once, before the restart"
        );
        assert_eq!(proxy.log_code(i + 1).await, "TCP_HIT/200", "{p}");
    }
    // A small object read from disk again comes back into memory within a few reads.
    let mut codes = Vec::new();
    for _ in 0..8 {
        let again = get(proxy.addr, &origin.url(&paths[0])).await;
        assert_eq!(again.x_cache(), "HIT");
        let n = proxy.log_lines(1).await.len();
        codes.push(proxy.log_code(n).await);
    }
    assert_eq!(
        codes.last().map(String::as_str),
        Some("TCP_MEM_HIT/200"),
        "{codes:?}"
    );
    let stats = proxy.stats().await;
    assert!(
        disk_stats(&stats)["hits"].as_u64() >= Some(paths.len() as u64),
        "{stats}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn disk_hits_answer_ranges_heads_variants_and_revalidations() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let small = "/r?size=4000&text=ranged&cc=max-age%3D600";
    let large = "/R?size=200000&text=large-ranged&cc=max-age%3D600";
    let varying = "/v?size=100&cc=max-age%3D600&vary=Accept-Language";
    let stale = "/s?size=100&cc=max-age%3D2&etag=v1";
    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    for p in [small, large, stale] {
        assert_eq!(get(proxy.addr, &origin.url(p)).await.x_cache(), "MISS");
    }
    for lang in ["en", "fr"] {
        let r = request(
            proxy.addr,
            "GET",
            &origin.url(varying),
            &[("accept-language", lang)],
        )
        .await;
        assert_eq!(r.x_cache(), "MISS");
    }
    flushed(&proxy).await;
    proxy.stop().await;

    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    for (p, body) in [(small, &b"ranged"[..]), (large, &b"large-ranged"[..])] {
        let r = request(proxy.addr, "GET", &origin.url(p), &[("range", "bytes=2-5")]).await;
        assert_eq!((r.status, r.x_cache()), (206, "HIT"), "{p}");
        assert_eq!(&r.body[..], &body[2..6], "{p}");
        let h = request(proxy.addr, "HEAD", &origin.url(p), &[]).await;
        assert_eq!(
            (h.status, h.x_cache(), h.body.len()),
            (200, "HIT", 0),
            "{p}"
        );
        assert!(h.header("content-length").parse::<usize>().expect("length") > 1000);
    }
    for lang in ["en", "fr"] {
        let r = request(
            proxy.addr,
            "GET",
            &origin.url(varying),
            &[("accept-language", lang)],
        )
        .await;
        assert_eq!(r.x_cache(), "HIT", "variant {lang} after the restart");
    }
    let other = request(
        proxy.addr,
        "GET",
        &origin.url(varying),
        &[("accept-language", "de")],
    )
    .await;
    assert_eq!(other.x_cache(), "MISS", "a variant never stored");
    assert_eq!(origin.hits(varying), 3);

    // A stale disk object is revalidated (304 from the origin), and the refreshed head
    // reaches the disk: after another restart it is fresh, served without the origin.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(proxy.addr, &origin.url(stale)).await;
    assert_eq!(r.x_cache(), "HIT");
    let lines = proxy.log_lines(1).await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("TCP_REFRESH_UNMODIFIED") && l.contains("/s?")),
        "{lines:?}"
    );
    let fetched = origin.hits(stale);
    flushed(&proxy).await;
    proxy.stop().await;
    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    let r = get(proxy.addr, &origin.url(stale)).await;
    assert_eq!(r.x_cache(), "HIT");
    assert_eq!(
        origin.hits(stale),
        fetched,
        "the merged head was on disk: no revalidation"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn invalidations_reach_the_disk() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let small = "/i?size=1000&cc=max-age%3D600";
    let large = "/I?size=100000&cc=max-age%3D600";
    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    for p in [small, large] {
        get(proxy.addr, &origin.url(p)).await;
        let r = request(proxy.addr, "POST", &origin.url(p), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            get(proxy.addr, &origin.url(p)).await.x_cache(),
            "MISS",
            "{p}"
        );
        request(proxy.addr, "DELETE", &origin.url(p), &[]).await;
    }
    flushed(&proxy).await;
    proxy.stop().await;
    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    for p in [small, large] {
        assert_eq!(
            get(proxy.addr, &origin.url(p)).await.x_cache(),
            "MISS",
            "{p}"
        );
    }
    assert_eq!(disk_stats(&proxy.stats().await)["rebuild_found"], 0);
    proxy.stop().await;
}

#[tokio::test]
async fn a_second_node_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let first = node(with_disk(dir.path(), 1 << 20)).await;
    let mut config = Config::default();
    with_disk(dir.path(), 1 << 20)(&mut config);
    config.http.listen = vec!["127.0.0.1:0".parse().expect("addr")];
    let err = match meshcache_proxy::Proxy::new(config) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a second node on a locked directory must be refused"),
    };
    assert!(err.contains("in use by another meshcache"), "{err}");
    assert!(
        err.contains(&std::process::id().to_string()),
        "names the holder: {err}"
    );
    first.stop().await;
}

#[tokio::test]
async fn damaged_truncated_and_foreign_files_are_dropped_not_served() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let paths: Vec<String> = (0..6)
        .map(|i| {
            let size = if i % 2 == 0 { 3000 } else { 90_000 };
            format!("/d{i}?size={size}&text=damage-{i}&cc=max-age%3D600")
        })
        .collect();
    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    for p in &paths {
        get(proxy.addr, &origin.url(p)).await;
    }
    flushed(&proxy).await;
    proxy.stop().await;

    // Every slab record's body gets one flipped byte; one large file is truncated, another
    // replaced by garbage; foreign files appear beside ours.
    let cache = dir.path().join("cache");
    let slab = std::fs::read(cache.join("slab")).expect("slab");
    let mut damaged = slab.clone();
    for (at, w) in slab.windows(8).enumerate() {
        if w == b"damage-0" || w == b"damage-2" {
            damaged[at + 7] ^= 0x55;
        }
    }
    std::fs::write(cache.join("slab"), &damaged).expect("write");
    let mut files: Vec<_> = walk(&cache.join("files"));
    files.sort();
    assert_eq!(files.len(), 3);
    let len = std::fs::metadata(&files[0]).expect("file").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .expect("open")
        .set_len(len / 2)
        .expect("truncate");
    std::fs::write(&files[1], b"not a record at all").expect("garbage");
    std::fs::write(files[2].with_file_name("notes"), "left by someone").expect("foreign");
    std::fs::write(cache.join("README"), "left by someone").expect("foreign");

    let proxy = node(with_disk(dir.path(), 1 << 20)).await;
    rebuilt(&proxy).await;
    let stats = proxy.stats().await;
    assert_eq!(disk_stats(&stats)["rebuild_found"], 2, "{stats}");
    assert_eq!(disk_stats(&stats)["rebuild_damaged"], 4, "{stats}");
    assert_eq!(disk_stats(&stats)["faults"]["damaged"], 4, "{stats}");
    for (i, p) in paths.iter().enumerate() {
        let r = get(proxy.addr, &origin.url(p)).await;
        assert_eq!(r.status, 200);
        assert!(r.body.starts_with(format!("damage-{i}").as_bytes()), "{p}");
    }
    // Exactly the two intact objects were hits; the four damaged ones went to the origin.
    let refetched = paths.iter().filter(|p| origin.hits(p) == 2).count();
    assert_eq!(refetched, 4);
    assert!(
        cache.join("README").exists(),
        "foreign files are left alone"
    );
    proxy.stop().await;
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn after_a_restart_the_digest_and_the_metrics_cover_the_disk() {
    let origin = Origin::start().await.expect("origin");
    let dir = tempfile::tempdir().expect("tmp");
    let with_digest = |c: &mut Config| {
        with_disk(dir.path(), 256 << 10)(c);
        c.cooperation.protocol = meshcache_proxy::config::Protocol::Digest;
        // Far longer than the test: a digest it serves is the one built when the rebuild ended.
        c.cooperation.digest_rebuild_period = Duration::from_secs(600);
    };
    let paths: Vec<String> = (0..20)
        .map(|i| format!("/g{i}?size={}&cc=max-age%3D600", 500 + i * 5000))
        .collect();
    let proxy = node(with_digest).await;
    rebuilt(&proxy).await;
    for p in &paths {
        get(proxy.addr, &origin.url(p)).await;
    }
    flushed(&proxy).await;
    proxy.stop().await;

    let proxy = node(with_digest).await;
    rebuilt(&proxy).await;
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let digest = loop {
        // Origin-form, as Squid asks a peer for its digest.
        let req = http::Request::get("/squid-internal-periodic/store_digest")
            .header("host", proxy.addr.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let r = common::send(proxy.addr, req).await;
        assert_eq!(r.status, 200);
        let d = meshcache_summary::CacheDigest::decode(&r.body).expect("a digest");
        if d.count() as usize >= paths.len() || std::time::Instant::now() > until {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for p in &paths {
        let key = meshcache_store::StoreKey::get(&origin.url(p));
        assert!(
            digest.contains(key.as_bytes()),
            "{p} is in the digest after the restart (count {})",
            digest.count()
        );
    }
    let metrics = String::from_utf8_lossy(&proxy.admin_get("/metrics").await.body).into_owned();
    let objects = metrics
        .lines()
        .find(|l| l.starts_with("meshcache_disk_objects{disk=\"0\""))
        .unwrap_or_else(|| panic!("no disk metrics:\n{metrics}"));
    assert!(objects.ends_with(&format!(" {}", paths.len())), "{objects}");
    assert!(metrics.contains("meshcache_disk_faults_total{disk=\"0\",kind=\"damaged\"} 0"));
    proxy.stop().await;
}
