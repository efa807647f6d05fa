//! Debian's default squid.conf access rules, translated to `[[access]]` rules, side by side with
//! a real Squid (Debian's 5.7) running the original: the same requests from the same client
//! addresses are denied by both or by neither.
//!
//! The LAN of Debian's `acl localnet src 10.0.0.0/8 …` is 127.0.0.2 here (only loopback is
//! used); 127.0.0.3 stands for a client on no allowed network. The manager lines
//! (`http_access allow localhost manager`) have no equivalent: meshcache's cache manager pages
//! are on its admin listener, not behind the proxy port.

mod common;
mod support;

use std::net::{IpAddr, Ipv4Addr};

use common::{node, request_from, Reply};
use meshcache_lab::Origin;
use meshcache_proxy::Config;
use support::{tool, Squid};

/// The original, as Debian ships it (with the LAN narrowed to 127.0.0.2).
const SQUID_RULES: &str = "\
acl lan src 127.0.0.2/32
acl SSL_ports port 443
acl Safe_ports port 80 21 443 70 210 1025-65535 280 488 591 777
acl CONNECT method CONNECT
http_access deny !Safe_ports
http_access deny CONNECT !SSL_ports
http_access allow lan
http_access allow localhost
http_access deny all";

/// The translation, as docs/access.md gives it.
const MESHCACHE_RULES: &str = r#"
[[access]]                      # http_access deny !Safe_ports
action = "deny"
port = ["!80", "!21", "!443", "!70", "!210", "!1025-65535", "!280", "!488", "!591", "!777"]

[[access]]                      # http_access deny CONNECT !SSL_ports
action = "deny"
method = ["CONNECT"]
port = ["!443"]

[[access]]                      # http_access allow localnet
action = "allow"
src = ["127.0.0.2"]

[[access]]                      # http_access allow localhost
action = "allow"
src = ["127.0.0.1", "::1"]
                                # http_access deny all: a request no rule matches is denied
"#;

fn denied(r: &Reply) -> bool {
    r.status == 403
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_default_rules_decide_as_squid_does() {
    let Some(squid_bin) = tool("squid") else {
        panic!("squid is not installed: scripts/test.sh installs it");
    };
    let origin = Origin::start().await.expect("origin");
    let port = origin.addr().port();
    let mut squid =
        Squid::new("access", Ipv4Addr::new(127, 0, 0, 140)).with_http_access(SQUID_RULES);
    squid.start(&squid_bin, "").await;
    let rules = common::access_rules(MESHCACHE_RULES);
    let mesh = node(move |c: &mut Config| {
        c.access = rules;
        // Debian's Squid lets CONNECT reach 443 only through its rules; so does this node.
        c.http.connect_ports = vec![443, port];
    })
    .await;
    let origin_url = format!("http://127.0.0.1:{port}/page?size=64");
    // (client, method, URL, denied?) — the last is what Squid's rules say; both must agree.
    let cases: Vec<(&str, &str, String, bool)> = vec![
        ("127.0.0.2", "GET", origin_url.clone(), false),
        ("127.0.0.2", "GET", "http://127.0.0.1:25/".into(), true),
        ("127.0.0.2", "GET", "http://127.0.0.1:1000/".into(), true),
        ("127.0.0.2", "GET", "http://127.0.0.1:80/".into(), false),
        ("127.0.0.2", "CONNECT", "127.0.0.1:443".into(), false),
        ("127.0.0.2", "CONNECT", format!("127.0.0.1:{port}"), true),
        ("127.0.0.3", "GET", origin_url.clone(), true),
        ("127.0.0.3", "GET", "http://127.0.0.1:80/".into(), true),
        ("127.0.0.1", "GET", origin_url.clone(), false),
        ("127.0.0.1", "CONNECT", "127.0.0.1:22".into(), true),
    ];
    for (from, method, url, expect_denied) in &cases {
        let from: IpAddr = from.parse().expect("address");
        let by_squid = request_from(Some(from), squid.http, method, url, &[]).await;
        let by_mesh = request_from(Some(from), mesh.addr, method, url, &[]).await;
        assert_eq!(
            denied(&by_squid),
            *expect_denied,
            "Squid: {method} {url} from {from}: {} {:?}\n{}",
            by_squid.status,
            by_squid.header("x-squid-error"),
            squid.diagnostics()
        );
        assert_eq!(
            denied(&by_mesh),
            *expect_denied,
            "meshcache: {method} {url} from {from}: {} {:?}",
            by_mesh.status,
            by_mesh.body
        );
        if *expect_denied {
            assert!(by_squid
                .header("x-squid-error")
                .starts_with("ERR_ACCESS_DENIED"));
            let n = mesh.log_lines(1).await.len();
            assert_eq!(mesh.log_code(n).await, "TCP_DENIED/403", "{method} {url}");
        }
    }
    mesh.stop().await;
}
