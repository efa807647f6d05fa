//! Rule evaluation cost: 20 typical rules (Debian's default squid.conf translated, plus
//! blocklists and working hours) and a 100,000-entry domain blocklist, per request; and how long
//! the blocklist takes to load and compile.
//!
//! `cargo bench -p meshcache-policy --bench rules`

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use meshcache_policy::{Fact, Lists, Moment, Request, RuleConfig, Rules};

/// A blocklist of `n` names, half of them suffixes, of the shape real lists have.
fn blocklist(n: usize) -> String {
    let mut text = String::with_capacity(n * 24);
    for i in 0..n {
        let dot = if i % 2 == 0 { "." } else { "" };
        text.push_str(&format!("{dot}host{i}.tracker{}.example\n", i % 997));
    }
    text
}

const TYPICAL: &str = r#"
[[access]]
action = "deny"
domain = ["@blocked"]
[[access]]
action = "deny"
port = ["!80", "!21", "!443", "!70", "!210", "!1025-65535", "!280", "!488", "!591", "!777"]
[[access]]
action = "deny"
method = ["CONNECT"]
port = ["!443"]
[[access]]
action = "allow"
src = ["127.0.0.0/8", "::1"]
method = ["PURGE"]
[[access]]
action = "deny"
method = ["PURGE"]
[[access]]
action = "deny"
url_regex = ['(?i)\.(exe|msi|scr)$']
time = ["Mon-Fri 08:00-18:00"]
src = ["10.20.0.0/16"]
[[access]]
action = "deny"
domain = [".social.example", ".video.example"]
time = ["Mon-Fri 09:00-12:00", "Mon-Fri 13:00-17:00"]
[[access]]
action = "allow"
domain = [".intranet.example"]
[[access]]
action = "deny"
dst = ["169.254.0.0/16"]
domain = ["metadata.internal"]
[[access]]
action = "deny"
url_regex = ["/wp-login\\.php", "/xmlrpc\\.php"]
[[access]]
action = "deny"
method = ["TRACE", "TRACK"]
[[access]]
action = "allow"
src = ["192.168.100.0/24"]
scheme = ["http"]
domain = [".updates.example"]
[[access]]
action = "deny"
src = ["10.99.0.0/16"]
[[access]]
action = "deny"
domain = [".ads.example", ".doubleclick.example", ".tracking.example"]
[[access]]
action = "allow"
src = ["10.0.0.0/8"]
time = ["Sat,Sun"]
domain = [".games.example"]
[[access]]
action = "deny"
domain = [".games.example"]
[[access]]
action = "deny"
port = ["25", "587"]
[[access]]
action = "allow"
src = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fe80::/10"]
[[access]]
action = "allow"
src = ["127.0.0.0/8"]
[[access]]
action = "deny"
"#;

fn compile(lists: &Lists) -> Rules {
    #[derive(serde::Deserialize)]
    struct File {
        access: Vec<RuleConfig>,
    }
    let file: File = toml::from_str(TYPICAL).expect("bench rules");
    assert_eq!(file.access.len(), 20);
    Rules::compile(&file.access, lists).expect("valid rules")
}

fn bench(c: &mut Criterion) {
    let text = blocklist(100_000);
    let start = Instant::now();
    let lists = Lists::from_texts([("blocked", text.as_str())]);
    let rules = compile(&lists);
    eprintln!(
        "rules: 20 rules with a 100,000-entry domain list parsed and compiled in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let base = Request {
        src: "10.1.2.3".parse().expect("literal"),
        dst: Fact::Unknown,
        host: "www.news.example.org",
        port: 80,
        method: "GET",
        scheme: Some("http"),
        url: "http://www.news.example.org/2026/11/28/story.html?ref=front",
        user: Fact::Unknown,
        groups: &[],
        now: Moment {
            weekday: 2,
            minute: 10 * 60,
        },
    };
    let mut g = c.benchmark_group("rules");
    g.bench_function("allowed after all 20 (a LAN client, a plain page)", |b| {
        b.iter(|| black_box(rules.decide(black_box(&base), 0)))
    });
    let blocked = Request {
        host: "cdn.host4242.tracker254.example",
        url: "http://cdn.host4242.tracker254.example/pixel.gif",
        ..base
    };
    g.bench_function("denied by the 100,000-entry list", |b| {
        b.iter(|| black_box(rules.decide(black_box(&blocked), 0)))
    });
    g.bench_function("domain list lookup alone (miss, 5 labels)", |b| {
        let lists = Lists::from_texts([("blocked", text.as_str())]);
        let one = Rules::compile(
            &[RuleConfig {
                domain: vec!["@blocked".into()],
                ..RuleConfig::new(meshcache_policy::Action::Deny)
            }],
            &lists,
        )
        .expect("one rule");
        b.iter(|| black_box(one.decide(black_box(&base), 0)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
