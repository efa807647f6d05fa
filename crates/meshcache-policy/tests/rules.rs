//! Rule lists decided against requests: order, each matcher, negation, lists, and the facts a
//! rule asks for.

use std::net::IpAddr;

use meshcache_policy::{Action, Decision, Fact, Lists, Moment, Need, Request, RuleConfig, Rules};

fn rules(toml_rules: &str, lists: &Lists) -> Result<Rules, meshcache_policy::RuleError> {
    #[derive(serde::Deserialize)]
    struct File {
        access: Vec<RuleConfig>,
    }
    let file: File = toml::from_str(toml_rules).expect("test TOML");
    Rules::compile(&file.access, lists)
}

fn compile(toml_rules: &str) -> Rules {
    rules(toml_rules, &Lists::default()).expect("valid rules")
}

/// Resolved addresses: one inside 192.0.2.0/24, one outside.
static DST_IN: [IpAddr; 2] = [
    IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7)),
    IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 9)),
];
static DST_OUT: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1))];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("literal address")
}

fn get(url: &'static str) -> Request<'static> {
    let rest = url.strip_prefix("http://").expect("http URL");
    let authority = rest.split('/').next().expect("authority");
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, p.parse().expect("port")),
        None => (authority, 80),
    };
    Request {
        src: ip("10.0.0.5"),
        dst: Fact::Unknown,
        host,
        port,
        method: "GET",
        scheme: Some("http"),
        url,
        user: Fact::Unknown,
        groups: &[],
        now: Moment {
            weekday: 2,
            minute: 600,
        },
    }
}

fn connect(authority: &'static str) -> Request<'static> {
    let (host, port) = authority.split_once(':').expect("host:port");
    Request {
        method: "CONNECT",
        scheme: None,
        url: authority,
        host,
        port: port.parse().expect("port"),
        ..get("http://x/")
    }
}

fn action(rules: &Rules, req: &Request<'_>) -> Option<Action> {
    match rules.decide(req, 0) {
        Decision::Matched { action, .. } => Some(action),
        Decision::NoMatch => None,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[test]
fn first_match_wins() {
    let r = compile(
        r#"
        [[access]]
        action = "deny"
        domain = ["bad.example"]
        [[access]]
        action = "allow"
        src = ["10.0.0.0/8"]
        [[access]]
        action = "deny"
        "#,
    );
    assert_eq!(action(&r, &get("http://bad.example/")), Some(Action::Deny));
    assert_eq!(
        action(&r, &get("http://good.example/")),
        Some(Action::Allow)
    );
    let outsider = Request {
        src: ip("192.0.2.1"),
        ..get("http://good.example/")
    };
    assert_eq!(
        r.decide(&outsider, 0),
        Decision::Matched {
            rule: 2,
            action: Action::Deny
        }
    );
}

#[test]
fn debian_connect_rules() {
    // Squid: http_access deny CONNECT !SSL_ports
    let r = compile(
        r#"
        [[access]]
        action = "deny"
        method = ["CONNECT"]
        port = ["!443", "!563"]
        [[access]]
        action = "allow"
        "#,
    );
    assert_eq!(action(&r, &connect("example.com:443")), Some(Action::Allow));
    assert_eq!(action(&r, &connect("example.com:563")), Some(Action::Allow));
    assert_eq!(action(&r, &connect("example.com:22")), Some(Action::Deny));
    assert_eq!(
        action(&r, &get("http://example.com:22/")),
        Some(Action::Allow)
    );
}

#[test]
fn every_matcher_selects() {
    let cases: &[(&str, Request<'static>, Request<'static>)] = &[
        (
            r#"src = ["10.0.0.0/24"]"#,
            get("http://a/"),
            Request {
                src: ip("10.0.1.5"),
                ..get("http://a/")
            },
        ),
        (
            r#"domain = [".example.com"]"#,
            get("http://www.example.com/"),
            get("http://example.org/"),
        ),
        (
            r#"url_regex = ["(?i)\\.EXE$"]"#,
            get("http://a/setup.exe"),
            get("http://a/setup.txt"),
        ),
        (
            r#"port = ["8000-8999"]"#,
            get("http://a:8080/"),
            get("http://a:80/"),
        ),
        (
            r#"method = ["GET"]"#,
            get("http://a/"),
            Request {
                method: "POST",
                ..get("http://a/")
            },
        ),
        (r#"scheme = ["http"]"#, get("http://a/"), connect("a:443")),
        (
            r#"time = ["Wed 09:00-11:00"]"#,
            get("http://a/"),
            Request {
                now: Moment {
                    weekday: 2,
                    minute: 660,
                },
                ..get("http://a/")
            },
        ),
        (
            r#"dst = ["192.0.2.0/24"]"#,
            Request {
                dst: Fact::Known(&DST_IN),
                ..get("http://a/")
            },
            Request {
                dst: Fact::Known(&DST_OUT),
                ..get("http://a/")
            },
        ),
        (
            r#"user = ["alice"]"#,
            Request {
                user: Fact::Known("alice"),
                ..get("http://a/")
            },
            Request {
                user: Fact::Known("bob"),
                ..get("http://a/")
            },
        ),
        (
            r#"group = ["staff"]"#,
            Request {
                user: Fact::Known("alice"),
                groups: &[("staff", true)],
                ..get("http://a/")
            },
            Request {
                user: Fact::Known("bob"),
                groups: &[("staff", false)],
                ..get("http://a/")
            },
        ),
    ];
    for (matcher, yes, no) in cases {
        let r = compile(&format!("[[access]]\naction = \"deny\"\n{matcher}\n"));
        assert_eq!(
            action(&r, yes),
            Some(Action::Deny),
            "{matcher} should match {yes:?}"
        );
        assert_eq!(action(&r, no), None, "{matcher} should not match {no:?}");
        let negated = matcher.replacen("[\"", "[\"!", 1);
        let r = compile(&format!("[[access]]\naction = \"deny\"\n{negated}\n"));
        assert_eq!(action(&r, yes), None, "{negated} should not match {yes:?}");
        assert_eq!(
            action(&r, no),
            Some(Action::Deny),
            "{negated} should match {no:?}"
        );
    }
}

#[test]
fn exclusions_inside_a_matcher() {
    let r = compile(
        r#"
        [[access]]
        action = "deny"
        domain = [".example.com", "!ok.example.com"]
        "#,
    );
    assert_eq!(
        action(&r, &get("http://ads.example.com/")),
        Some(Action::Deny)
    );
    assert_eq!(action(&r, &get("http://ok.example.com/")), None);
}

#[test]
fn costly_facts_are_asked_for_only_when_they_decide() {
    let r = compile(
        r#"
        [[access]]
        action = "deny"
        domain = ["internal.example"]
        dst = ["10.0.0.0/8"]
        [[access]]
        action = "allow"
        user = ["*"]
        "#,
    );
    // The domain does not match: no lookup; the second rule asks for the user.
    let req = get("http://www.example/");
    assert_eq!(
        r.decide(&req, 0),
        Decision::Need {
            rule: 1,
            need: Need::User
        }
    );
    let req = Request {
        user: Fact::Absent,
        ..req
    };
    assert_eq!(r.decide(&req, 1), Decision::Challenge { rule: 1 });
    let req = Request {
        user: Fact::Known("alice"),
        ..req
    };
    assert_eq!(
        r.decide(&req, 1),
        Decision::Matched {
            rule: 1,
            action: Action::Allow
        }
    );
    // The domain matches: the address decides.
    let req = get("http://internal.example/");
    assert_eq!(
        r.decide(&req, 0),
        Decision::Need {
            rule: 0,
            need: Need::Dst
        }
    );
    let addrs = [ip("192.0.2.1"), ip("10.1.1.1")];
    let resolved = Request {
        dst: Fact::Known(&addrs),
        ..req
    };
    assert_eq!(action(&r, &resolved), Some(Action::Deny));
    // No address: a plain dst item cannot match.
    let unresolved = Request {
        dst: Fact::Absent,
        user: Fact::Known("a"),
        ..req
    };
    assert_eq!(action(&r, &unresolved), Some(Action::Allow));
}

#[test]
fn groups_are_asked_one_at_a_time() {
    let r = compile(
        r#"
        [[access]]
        action = "allow"
        group = ["staff", "!contractors"]
        "#,
    );
    let base = Request {
        user: Fact::Known("alice"),
        ..get("http://a/")
    };
    assert_eq!(
        r.decide(&base, 0),
        Decision::Need {
            rule: 0,
            need: Need::Group("contractors")
        }
    );
    let g1 = [("contractors", false)];
    let req = Request {
        groups: &g1,
        ..base
    };
    assert_eq!(
        r.decide(&req, 0),
        Decision::Need {
            rule: 0,
            need: Need::Group("staff")
        }
    );
    let g2 = [("contractors", false), ("staff", true)];
    assert_eq!(
        action(
            &r,
            &Request {
                groups: &g2,
                ..base
            }
        ),
        Some(Action::Allow)
    );
    let g3 = [("contractors", true)];
    assert_eq!(
        action(
            &r,
            &Request {
                groups: &g3,
                ..base
            }
        ),
        None
    );
}

#[test]
fn named_lists() {
    let lists = Lists::from_texts([
        ("blocked", "# ads\n.ads.example\n\ntracker.example\n"),
        ("office", "10.1.0.0/16\n"),
        ("broken", "good.example\nbad host\n"),
    ]);
    let r = rules(
        r#"
        [[access]]
        action = "deny"
        domain = ["@blocked"]
        [[access]]
        action = "allow"
        src = ["@office"]
        "#,
        &lists,
    )
    .expect("valid");
    assert_eq!(
        action(&r, &get("http://x.ads.example/")),
        Some(Action::Deny)
    );
    assert_eq!(
        action(&r, &get("http://tracker.example/")),
        Some(Action::Deny)
    );
    let office = Request {
        src: ip("10.1.2.3"),
        ..get("http://fine.example/")
    };
    assert_eq!(action(&r, &office), Some(Action::Allow));
    let err = rules(
        "[[access]]\naction = \"deny\"\ndomain = [\"@broken\"]\n",
        &lists,
    )
    .expect_err("bad line");
    assert!(err.to_string().contains("line 2"), "{err}");
    let err = rules(
        "[[access]]\naction = \"deny\"\ndomain = [\"@missing\"]\n",
        &lists,
    )
    .expect_err("no such list");
    assert!(err.to_string().contains("rule 1, domain"), "{err}");
}

#[test]
fn errors_name_the_rule_and_key() {
    let err = rules(
        "[[access]]\naction = \"allow\"\n[[access]]\naction = \"deny\"\nport = [\"44x\"]\n",
        &Lists::default(),
    )
    .expect_err("bad port");
    assert_eq!(
        err.to_string(),
        "rule 2, port: \"44x\": not a port (0-65535) or a range of ports (1025-65535)"
    );
    for (key, bad) in [
        ("src", "10.0.0.1/8"),
        ("domain", "a b"),
        ("url_regex", "("),
        ("method", "GET /"),
        ("time", "Mon 9-5"),
    ] {
        let err = rules(
            &format!("[[access]]\naction = \"deny\"\n{key} = [{bad:?}]\n"),
            &Lists::default(),
        )
        .expect_err("bad item");
        assert!(
            err.to_string().starts_with(&format!("rule 1, {key}: ")),
            "{err}"
        );
    }
}
