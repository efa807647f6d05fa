//! Proxy authentication over real sockets, with real curl: an htpasswd file made by Apache's
//! `htpasswd`, and Squid's own `basic_ncsa_auth` helper from Debian's squid package. Without
//! credentials a rule that names users answers 407 with a challenge; with them the request
//! passes, the access log names the user, and the credentials never reach the origin.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use common::{access_rules as rules, node, request, Node};
use meshcache_auth::AuthConfig;
use meshcache_policy::RuleConfig;
use meshcache_proxy::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An origin that answers every request with a short 200 and keeps each request head.
async fn recording_origin() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock()
                    .expect("heads")
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncache-control: no-store\r\nconnection: close\r\n\r\nok")
                    .await;
            });
        }
    });
    (addr, heads)
}

fn htpasswd(file: &Path, flags: &str, user: &str, password: &str) {
    let mut cmd = Command::new("htpasswd");
    cmd.arg(if file.exists() { "-b" } else { "-cb" });
    if !flags.is_empty() {
        cmd.arg(flags);
    }
    let out = cmd
        .arg(file)
        .args([user, password])
        .output()
        .expect("htpasswd (Debian's apache2-utils; scripts/test.sh installs it)");
    assert!(out.status.success(), "{out:?}");
}

/// curl through `proxy`, with `-U user:password` when given: (status, stderr).
async fn curl(proxy: SocketAddr, url: &str, credentials: Option<&str>) -> u16 {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
        "-x",
    ])
    .arg(format!("http://{proxy}"));
    if let Some(c) = credentials {
        cmd.args(["-U", c]);
    }
    let out = cmd.arg(url).output().await.expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The user field (8th) of the last access-log line.
async fn logged_user(node: &Node) -> String {
    let lines = node.log_lines(1).await;
    lines
        .last()
        .and_then(|l| l.split_whitespace().nth(7))
        .unwrap_or("")
        .to_owned()
}

/// A node whose rules ask every request for a user, except those to `/public`.
async fn guarded(auth: AuthConfig) -> Node {
    let access = rules(
        r#"
        [[access]]
        action = "allow"
        url_regex = ["/public"]
        [[access]]
        action = "allow"
        user = ["*"]
        "#,
    );
    node(move |c: &mut Config| {
        c.access = access;
        c.auth = Some(auth);
    })
    .await
}

async fn check_guarded(node: &Node, origin: SocketAddr, heads: &Mutex<Vec<String>>) {
    let url = format!("http://{origin}/private");
    // No credentials: 407 with a challenge, logged TCP_DENIED/407.
    let r = request(node.addr, "GET", &url, &[]).await;
    assert_eq!(r.status, 407);
    assert_eq!(
        r.header("proxy-authenticate"),
        "Basic realm=\"office\", charset=\"UTF-8\""
    );
    assert_eq!(r.header("x-meshcache-error"), "auth-required");
    let n = node.log_lines(1).await.len();
    assert_eq!(node.log_code(n).await, "TCP_DENIED/407");
    // Wrong password, unknown user, malformed headers: 407, never a crash.
    assert_eq!(curl(node.addr, &url, Some("alice:wrong")).await, 407);
    assert_eq!(
        logged_user(node).await,
        "alice",
        "the rejected name is logged, as Squid"
    );
    assert_eq!(curl(node.addr, &url, Some("mallory:x")).await, 407);
    for bad in [
        "Basic",
        "Basic !!!",
        "Basic YWxpY2U=",
        "Digest x",
        "Basic Og==",
        "",
    ] {
        let r = request(node.addr, "GET", &url, &[("proxy-authorization", bad)]).await;
        assert_eq!(r.status, 407, "{bad:?}");
    }
    // Bytes no header value should hold (obs-text, a very long value).
    let mut hostile =
        format!("GET {url} HTTP/1.1\r\nHost: {origin}\r\nProxy-Authorization: Basic ").into_bytes();
    hostile.extend_from_slice(b"\xff\xfe\x80");
    hostile.extend(std::iter::repeat_n(b'A', 20_000));
    hostile.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let answer = common::raw(node.addr, &hostile).await;
    assert!(answer.starts_with("HTTP/1.1 407"), "{answer}");
    // Right: 200, the user in the log, and no credentials at the origin.
    assert_eq!(curl(node.addr, &url, Some("alice:s3cret")).await, 200);
    assert_eq!(logged_user(node).await, "alice");
    assert_eq!(curl(node.addr, &url, Some("bob:hunter2")).await, 200);
    assert_eq!(logged_user(node).await, "bob");
    // Requests the first rule allows need no credentials.
    assert_eq!(
        curl(node.addr, &format!("http://{origin}/public"), None).await,
        200
    );
    assert_eq!(logged_user(node).await, "-");
    let heads = heads.lock().expect("heads");
    assert!(heads.len() >= 3, "{heads:?}");
    for head in heads.iter() {
        assert!(
            !head.to_ascii_lowercase().contains("proxy-authorization"),
            "credentials reached the origin: {head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_against_an_htpasswd_file() {
    let (origin, heads) = recording_origin().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("users.htpasswd");
    htpasswd(&file, "-B", "alice", "s3cret");
    htpasswd(&file, "-s", "bob", "hunter2");
    let auth = AuthConfig {
        realm: "office".into(),
        htpasswd: Some(file),
        ..AuthConfig::default()
    };
    let n = guarded(auth).await;
    check_guarded(&n, origin, &heads).await;
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_through_squids_basic_ncsa_auth() {
    let helper = "/usr/lib/squid/basic_ncsa_auth";
    assert!(
        Path::new(helper).exists(),
        "{helper} is missing: scripts/test.sh installs squid"
    );
    let (origin, heads) = recording_origin().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("passwd");
    // basic_ncsa_auth reads crypt(3) and MD5 hashes; apr1 (`-m`) is what Squid's docs use.
    htpasswd(&file, "-m", "alice", "s3cret");
    htpasswd(&file, "-m", "bob", "hunter2");
    let auth = AuthConfig {
        realm: "office".into(),
        helper: Some(vec![helper.into(), file.display().to_string()]),
        children: 2,
        ..AuthConfig::default()
    };
    let n = guarded(auth).await;
    check_guarded(&n, origin, &heads).await;
    n.stop().await;
}

#[test]
fn rules_naming_users_need_auth() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[[access]]\naction = \"allow\"\nuser = [\"*\"]\n").expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("meshcache config check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("access: rule 1: user and group need proxy authentication"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_a_parent_only_with_login_pass() {
    let (origin, heads) = recording_origin().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("users.htpasswd");
    htpasswd(&file, "-B", "alice", "s3cret");
    let parent = guarded(AuthConfig {
        realm: "office".into(),
        htpasswd: Some(file),
        ..AuthConfig::default()
    })
    .await;
    let child = |login: Option<meshcache_proxy::config::PeerLogin>| {
        let parent = parent.addr;
        node(move |c: &mut Config| {
            let mut peer = meshcache_proxy::config::PeerConfig::new(
                "parent",
                meshcache_dcm::Role::Parent,
                parent,
                None,
            );
            peer.login = login;
            c.name = "child".into();
            c.peers = vec![peer];
            c.never_direct = vec![RuleConfig::new(meshcache_policy::Action::Allow)];
        })
    };
    let url = format!("http://{origin}/private");
    let passing = child(Some(meshcache_proxy::config::PeerLogin::Pass)).await;
    assert_eq!(curl(passing.addr, &url, Some("alice:s3cret")).await, 200);
    assert_eq!(logged_user(&parent).await, "alice");
    passing.stop().await;
    let keeping = child(None).await;
    assert_eq!(
        curl(keeping.addr, &url, Some("alice:s3cret")).await,
        407,
        "the parent never saw the credentials"
    );
    keeping.stop().await;
    parent.stop().await;
    for head in heads.lock().expect("heads").iter() {
        assert!(
            !head.to_ascii_lowercase().contains("proxy-authorization"),
            "{head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_through_squids_ext_unix_group_acl() {
    let helper = "/usr/lib/squid/ext_unix_group_acl";
    assert!(
        Path::new(helper).exists(),
        "{helper} is missing: scripts/test.sh installs squid"
    );
    let (origin, _heads) = recording_origin().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("users.htpasswd");
    // `root` is in the group `root` on every Debian system; `alice` is no system user.
    htpasswd(&file, "-B", "root", "toor");
    htpasswd(&file, "-B", "alice", "s3cret");
    let access = rules(
        r#"
        [[access]]
        action = "allow"
        group = ["root"]
        "#,
    );
    let n = node(move |c: &mut Config| {
        c.access = access;
        c.auth = Some(AuthConfig {
            realm: "office".into(),
            htpasswd: Some(file),
            group_helper: Some(vec![helper.into(), "-p".into()]),
            ..AuthConfig::default()
        });
    })
    .await;
    let url = format!("http://{origin}/staff-only");
    assert_eq!(curl(n.addr, &url, Some("root:toor")).await, 200);
    assert_eq!(logged_user(&n).await, "root");
    assert_eq!(
        curl(n.addr, &url, Some("alice:s3cret")).await,
        403,
        "not in the group"
    );
    assert_eq!(curl(n.addr, &url, None).await, 407);
    n.stop().await;
}
