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

/// A blocklist of `n` names, half of them suffixes, over three top-level domains, of the shape
/// real lists have (as `scripts/bench-access.sh` writes it).
fn blocklist(n: usize) -> String {
    let mut text = String::with_capacity(n * 24);
    for i in 0..n {
        let dot = if i % 2 == 0 { "." } else { "" };
        let tld = ["com", "net", "org"][i % 3];
        text.push_str(&format!("{dot}host{i}.tracker{}.{tld}\n", i % 997));
    }
    text
}

/// The twenty typical rules, shared with `scripts/bench-access.sh`.
const TYPICAL: &str = include_str!("typical-rules.toml");

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
        host: "cdn.host4242.tracker254.com",
        url: "http://cdn.host4242.tracker254.com/pixel.gif",
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
