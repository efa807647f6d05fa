//! Access rules over real sockets: each matcher allows and denies, rules apply in order, a
//! request no rule allows is denied, named lists come from files, and a client off this host
//! cannot reach the proxy's own host through it.
//!
//! Clients are told apart by source address (127.0.0.2, 127.0.0.3 …: each a loopback address of
//! its own). The test of clients off this host runs in a network namespace of its own, where
//! 10.77.0.0/24 is on the namespace's loopback interface: no packet leaves it.

mod common;

use std::net::IpAddr;
use std::process::Command;

use common::{access_rules as rules, node, request_from, Node, Reply};
use meshcache_lab::Origin;
use meshcache_proxy::Config;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("literal address")
}

/// A node with `rules`, `http.allow` open to every loopback address, CONNECT to `port`, and
/// the names `near.test` (127.0.0.1) and `far.test` (127.0.0.2) in its host table.
async fn with_rules(toml_rules: &str, connect_port: u16) -> Node {
    let access = rules(toml_rules);
    node(move |c: &mut Config| {
        c.access = access;
        c.http.connect_ports = vec![connect_port];
        c.dns.hosts.insert("near.test".into(), ip("127.0.0.1"));
        c.dns.hosts.insert("far.test".into(), ip("127.0.0.2"));
    })
    .await
}

async fn ask(node: &Node, from: &str, method: &str, url: &str) -> Reply {
    request_from(Some(ip(from)), node.addr, method, url, &[]).await
}

/// Asserts the reply's status, and for a 403 that it is ours and logged TCP_DENIED/403.
async fn expect(node: &Node, reply: &Reply, status: u16, what: &str) {
    assert_eq!(reply.status, status, "{what}: {:?}", reply.body);
    if status == 403 {
        assert_eq!(reply.header("x-meshcache-error"), "access-denied", "{what}");
        let n = node.log_lines(1).await.len();
        assert_eq!(node.log_code(n).await, "TCP_DENIED/403", "{what}");
    }
}

#[tokio::test]
async fn each_matcher_allows_and_denies() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let o = |host: &str, path: &str| format!("http://{host}:{port}{path}");
    // The current local minute, to build a window that holds it and one that does not.
    let now = jiff::Zoned::now();
    let minute = now.hour() as u16 * 60 + now.minute() as u16;
    let (inside, outside) = if minute < 12 * 60 {
        ("00:00-12:00", "12:00-24:00")
    } else {
        ("12:00-24:00", "00:00-12:00")
    };
    // (the rule's matcher, a request it matches, a request it does not)
    type Case<'a> = (
        String,
        (&'a str, &'a str, String),
        (&'a str, &'a str, String),
    );
    let cases: Vec<Case> = vec![
        (
            r#"src = ["127.0.0.2"]"#.into(),
            ("127.0.0.2", "GET", o("near.test", "/")),
            ("127.0.0.3", "GET", o("near.test", "/")),
        ),
        (
            r#"domain = [".near.test"]"#.into(),
            ("127.0.0.2", "GET", o("www.near.test", "/")),
            ("127.0.0.2", "GET", o("far.test", "/")),
        ),
        (
            r#"url_regex = ['(?i)\.EXE$']"#.into(),
            ("127.0.0.2", "GET", o("near.test", "/setup.exe")),
            ("127.0.0.2", "GET", o("near.test", "/setup.txt")),
        ),
        (
            format!(r#"port = ["{port}"]"#),
            ("127.0.0.2", "GET", o("near.test", "/")),
            ("127.0.0.2", "GET", "http://near.test:1/".into()),
        ),
        (
            r#"method = ["POST"]"#.into(),
            ("127.0.0.2", "POST", o("near.test", "/")),
            ("127.0.0.2", "GET", o("near.test", "/")),
        ),
        (
            r#"scheme = ["http"]"#.into(),
            ("127.0.0.2", "GET", o("near.test", "/")),
            ("127.0.0.2", "CONNECT", format!("near.test:{port}")),
        ),
        (
            r#"dst = ["127.0.0.2/32"]"#.into(),
            ("127.0.0.2", "GET", o("far.test", "/")),
            ("127.0.0.2", "GET", o("near.test", "/")),
        ),
        (
            format!(r#"time = ["{inside}"]"#),
            ("127.0.0.2", "GET", o("near.test", "/")),
            ("127.0.0.2", "GET", o("near.test", "/")),
        ),
    ];
    for (matcher, (from_yes, m_yes, u_yes), (from_no, m_no, u_no)) in &cases {
        // A deny rule with the matcher, then allow everything: the first request is refused,
        // the second reaches the origin (or fails there, never with our 403).
        let n = with_rules(
            &format!("[[access]]\naction = \"deny\"\n{matcher}\n[[access]]\naction = \"allow\"\n"),
            port,
        )
        .await;
        let r = ask(&n, from_yes, m_yes, u_yes).await;
        expect(
            &n,
            &r,
            403,
            &format!("{matcher} denies {m_yes} {u_yes} from {from_yes}"),
        )
        .await;
        assert_eq!(r.header("x-meshcache-error"), "access-denied");
        assert!(
            String::from_utf8_lossy(&r.body).contains("access rule 1"),
            "{:?}",
            r.body
        );
        if matcher.starts_with("time") {
            // The other half of the day: the same request passes.
            n.stop().await;
            let n = with_rules(&format!("[[access]]\naction = \"deny\"\ntime = [\"{outside}\"]\n[[access]]\naction = \"allow\"\n"), port).await;
            let r = ask(&n, from_no, m_no, u_no).await;
            assert_ne!(r.status, 403, "time = [{outside:?}] must not match now");
            n.stop().await;
            continue;
        }
        let r = ask(&n, from_no, m_no, u_no).await;
        assert_ne!(
            r.status, 403,
            "{matcher} must not deny {m_no} {u_no} from {from_no}: {:?}",
            r.body
        );
        n.stop().await;
    }
}

#[tokio::test]
async fn rules_apply_in_order_and_unmatched_requests_are_denied() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let url = format!("http://near.test:{port}/page?size=100");
    let n = with_rules(
        r#"
        [[access]]
        action = "allow"
        src = ["127.0.0.2"]
        [[access]]
        action = "deny"
        src = ["127.0.0.0/24"]
        [[access]]
        action = "allow"
        src = ["127.0.0.0/8"]
        "#,
        port,
    )
    .await;
    let r = ask(&n, "127.0.0.2", "GET", &url).await;
    expect(
        &n,
        &r,
        200,
        "rule 1 allows 127.0.0.2 before rule 2 denies it",
    )
    .await;
    let r = ask(&n, "127.0.0.3", "GET", &url).await;
    expect(&n, &r, 403, "rule 2 denies 127.0.0.3").await;
    assert!(String::from_utf8_lossy(&r.body).contains("access rule 2"));
    let r = ask(&n, "127.0.1.3", "GET", &url).await;
    expect(&n, &r, 200, "rule 3 allows 127.0.1.3").await;
    n.stop().await;

    // Once there is a rule, a request that matches none is denied.
    let n = with_rules(
        "[[access]]\naction = \"allow\"\nsrc = [\"127.0.0.2\"]\n",
        port,
    )
    .await;
    let r = ask(&n, "127.0.0.9", "GET", &url).await;
    expect(&n, &r, 403, "no rule matches 127.0.0.9").await;
    assert!(String::from_utf8_lossy(&r.body).contains("no access rule allows"));
    // http.allow is checked before the rules: a rule cannot let in what it refuses.
    n.stop().await;
    let access = rules("[[access]]\naction = \"allow\"\n");
    let n = node(move |c: &mut Config| {
        c.access = access;
        c.http.allow = vec!["127.0.0.2/32".parse().expect("net")];
    })
    .await;
    let r = ask(&n, "127.0.0.3", "GET", &url).await;
    assert_eq!(r.status, 403);
    n.stop().await;
}

#[tokio::test]
async fn connect_follows_the_rules_and_connect_ports() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    // Squid's Debian default: deny CONNECT !SSL_ports (here the origin's port stands for 443).
    let n = with_rules(
        &format!(
            "[[access]]\naction = \"deny\"\nmethod = [\"CONNECT\"]\nport = [\"!{port}\"]\n[[access]]\naction = \"allow\"\n"
        ),
        port,
    )
    .await;
    let r = ask(&n, "127.0.0.2", "CONNECT", &format!("127.0.0.1:{port}")).await;
    assert_eq!(r.status, 200, "a CONNECT to an allowed port is tunnelled");
    // http.connect_ports is checked first: port 22 never opens, whatever the rules say.
    let r = ask(&n, "127.0.0.2", "CONNECT", "127.0.0.1:22").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-meshcache-error"), "connect-port");
    n.stop().await;
}

#[tokio::test]
async fn named_lists_are_read_from_files() {
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let dir = tempfile::tempdir().expect("tmp");
    let list = dir.path().join("blocked.txt");
    let mut text = String::from("# a blocklist\n.ads.test\n");
    for i in 0..100_000 {
        text.push_str(&format!("host{i}.tracker.test\n"));
    }
    std::fs::write(&list, text).expect("list file");
    let access = rules(
        "[[access]]\naction = \"deny\"\ndomain = [\"@blocked\"]\n[[access]]\naction = \"allow\"\n",
    );
    let n = node(move |c: &mut Config| {
        c.access = access;
        c.lists.insert("blocked".into(), list);
        c.dns.hosts.insert("x.ads.test".into(), ip("127.0.0.1"));
        c.dns
            .hosts
            .insert("host99999.tracker.test".into(), ip("127.0.0.1"));
        c.dns.hosts.insert("fine.test".into(), ip("127.0.0.1"));
    })
    .await;
    for (host, status) in [
        ("x.ads.test", 403),
        ("host99999.tracker.test", 403),
        ("fine.test", 200),
    ] {
        let r = ask(
            &n,
            "127.0.0.1",
            "GET",
            &format!("http://{host}:{port}/?size=10"),
        )
        .await;
        expect(&n, &r, status, host).await;
    }
    n.stop().await;
}

#[test]
fn config_check_names_the_rule_and_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[access]]\naction = \"allow\"\nsrc = [\"10.0.0.0/8\"]\n[[access]]\naction = \"deny\"\nmethod = [\"CONNECT\"]\nport = [\"!443\", \"44x\"]\n",
    )
    .expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("meshcache config check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("access: rule 2, port: \"44x\""), "{stderr}");
    std::fs::write(
        &path,
        "[[access]]\naction = \"allow\"\nsrcc = [\"10.0.0.0/8\"]\n",
    )
    .expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("meshcache config check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("srcc"), "an unknown key is named: {stderr}");
}

/// Runs `test` (this binary's test of that name) again inside a network namespace of its own,
/// with `10.77.0.1/24` on its loopback interface. Returns false when already inside.
fn in_own_network(test: &str) -> bool {
    if std::env::var_os("MESHCACHE_TEST_NETNS").is_some() {
        return false;
    }
    let exe = std::env::current_exe().expect("test binary");
    let status = Command::new("unshare")
        .args([
            "--net",
            "sh",
            "-c",
            "ip link set lo up && ip addr add 10.77.0.1/24 dev lo && exec \"$0\" \"$@\"",
        ])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("MESHCACHE_TEST_NETNS", "1")
        .status()
        .expect("unshare (run the suite as root)");
    assert!(status.success(), "{test} failed in its network namespace");
    true
}

#[test]
fn clients_off_this_host_cannot_reach_it_through_the_proxy() {
    if in_own_network("clients_off_this_host_cannot_reach_it_through_the_proxy") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let origin = Origin::start().await.expect("origin");
        let port = origin.addr().port();
        let lan = |c: &mut Config| {
            c.http.listen = vec!["10.77.0.1:0".parse().expect("addr")];
            c.http.allow = vec!["10.77.0.0/24".parse().expect("net"), "127.0.0.0/8".parse().expect("net")];
            c.dns.hosts.insert("origin.test".into(), ip("127.0.0.1"));
        };
        // No rules: today's defaults, with the check.
        let n = node(lan).await;
        let (client, local) = ("10.77.0.9", "127.0.0.1");
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://origin.test:{port}/"),
            format!("http://[::1]:{port}/"),
            format!("http://0.0.0.0:{port}/"),
            format!("http://10.77.0.1:{}/stats", n.admin.port()),
        ] {
            let r = request_from(Some(ip(client)), n.addr, "GET", &url, &[]).await;
            assert_eq!(r.status, 403, "{url} from {client}");
            assert_eq!(r.header("x-meshcache-error"), "to-localhost", "{url}");
            let code = n.log_code(n.log_lines(1).await.len()).await;
            assert_eq!(code, "TCP_DENIED/403");
        }
        let r = request_from(Some(ip(client)), n.addr, "CONNECT", &format!("127.0.0.1:{port}"), &[]).await;
        assert_eq!(r.status, 403, "CONNECT to loopback from {client}");
        // A client on this host may.
        let r = request_from(Some(ip(local)), n.addr, "GET", &format!("http://127.0.0.1:{port}/"), &[]).await;
        assert_eq!(r.status, 200);
        n.stop().await;

        // A rule that names the destination allows it; one that does not, does not.
        let access = rules(
            "[[access]]\naction = \"allow\"\ndst = [\"127.0.0.1\"]\nurl_regex = [\"/open\"]\n[[access]]\naction = \"allow\"\nsrc = [\"10.77.0.0/24\"]\n",
        );
        let n = node(move |c: &mut Config| {
            lan(c);
            c.access = access;
        })
        .await;
        let r = request_from(Some(ip(client)), n.addr, "GET", &format!("http://origin.test:{port}/open"), &[]).await;
        assert_eq!(r.status, 200, "allowed by a rule naming dst");
        let r = request_from(Some(ip(client)), n.addr, "GET", &format!("http://origin.test:{port}/closed"), &[]).await;
        assert_eq!(r.status, 403, "allowed by a rule that does not name dst");
        assert_eq!(r.header("x-meshcache-error"), "to-localhost");
        n.stop().await;
    });
}

#[tokio::test]
async fn error_pages_come_from_squids_templates() {
    let templates = std::path::Path::new("/usr/share/squid/errors/templates");
    assert!(
        templates.join("ERR_ACCESS_DENIED").exists(),
        "Squid's error templates are missing: scripts/test.sh installs squid"
    );
    let access = rules("[[access]]\naction = \"deny\"\nurl_regex = [\"/blocked\"]\n[[access]]\naction = \"allow\"\n");
    let n = node(move |c: &mut Config| {
        c.access = access;
        c.errors.directory = Some(templates.to_owned());
        c.errors.admin = "ops@example.org".into();
    })
    .await;
    let r = ask(&n, "127.0.0.1", "GET", "http://127.0.0.1:9/blocked?a='x'&b").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    let page = String::from_utf8_lossy(&r.body);
    assert!(page.contains("ERR_ACCESS_DENIED"), "{page}");
    assert!(
        page.contains("http://127.0.0.1:9/blocked?a=&#39;x&#39;&amp;b"),
        "the URL, escaped: {page}"
    );
    assert!(!page.contains("'x'"), "{page}");
    assert!(page.contains("ops@example.org"), "{page}");
    assert!(page.contains("testcache"), "the node's name: {page}");
    assert!(!page.contains("%U") && !page.contains("%w"), "{page}");
    // A page the directory lacks is the built-in one.
    let r = ask(&n, "127.0.0.1", "GET", "https://127.0.0.1:9/").await;
    assert_eq!(r.status, 501);
    n.stop().await;
}
