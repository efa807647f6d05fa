//! What a credential check costs: the cached case (the next request of a logged-in user, by far
//! the most common), its parts, and the uncached round trip through Debian's `basic_ncsa_auth`.
//! Run with `cargo bench -p meshcache-auth`; the crate docs quote the figures.

// criterion's macros generate undocumented functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::io::Write as _;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use meshcache_auth::htpasswd::{md5_crypt, PasswordHash};
use meshcache_auth::{basic_value, parse_basic, AuthConfig, Authenticator, Verdict};

fn cached(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("passwords");
    let mut f = std::fs::File::create(&file).expect("create");
    // A bcrypt user (cost 5, htpasswd -B's default): the cache is what makes it affordable.
    let bcrypt = bcrypt_line("alice", "correct horse");
    writeln!(f, "{bcrypt}").expect("write");
    let auth = runtime.block_on(async {
        Authenticator::start(&AuthConfig {
            htpasswd: Some(file.clone()),
            ..AuthConfig::default()
        })
        .expect("starts")
    });
    let value = basic_value("alice", "correct horse");
    assert_eq!(
        runtime.block_on(auth.check(value.as_bytes())),
        Verdict::User("alice".into())
    );

    let mut group = c.benchmark_group("check");
    group.bench_function("cached (htpasswd bcrypt user)", |b| {
        b.iter(|| runtime.block_on(auth.check(black_box(value.as_bytes()))))
    });
    group.bench_function("parse_basic", |b| {
        b.iter(|| parse_basic(black_box(value.as_bytes())))
    });
    group.bench_function("block_on(ready) (the harness's own cost)", |b| {
        b.iter(|| runtime.block_on(async { black_box(1) }))
    });
    group.finish();

    let mut group = c.benchmark_group("verify (uncached)");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    let apr1 = PasswordHash::parse(&md5_crypt(b"correct horse", "$apr1$", "saltsalt"));
    group.bench_function("apr1", |b| {
        b.iter(|| apr1.verify(black_box("correct horse")))
    });
    let bcrypt = PasswordHash::parse(bcrypt.split_once(':').map_or("", |(_, h)| h));
    group.bench_function("bcrypt cost 5 (htpasswd -B)", |b| {
        b.iter(|| bcrypt.verify(black_box("correct horse")))
    });
    group.finish();

    helper_round_trip(c, &runtime);
}

/// An uncached check through `basic_ncsa_auth` (credentials_ttl 0): parse, escape, the pipe
/// both ways, the helper's own MD5 check.
fn helper_round_trip(c: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let ncsa = "/usr/lib/squid/basic_ncsa_auth";
    if !std::path::Path::new(ncsa).exists() {
        eprintln!("note: {ncsa} missing (squid package): helper round trip not measured");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("passwords");
    std::fs::write(
        &file,
        format!("bob:{}\n", md5_crypt(b"pw", "$apr1$", "saltsalt")),
    )
    .expect("write");
    let auth = runtime.block_on(async {
        Authenticator::start(&AuthConfig {
            helper: Some(vec![ncsa.into(), file.to_string_lossy().into_owned()]),
            children: 1,
            credentials_ttl: Duration::ZERO,
            ..AuthConfig::default()
        })
        .expect("starts")
    });
    let value = basic_value("bob", "pw");
    assert_eq!(
        runtime.block_on(auth.check(value.as_bytes())),
        Verdict::User("bob".into())
    );
    let mut group = c.benchmark_group("helper");
    group.sample_size(20);
    group.bench_function("uncached via basic_ncsa_auth (apr1)", |b| {
        b.iter(|| runtime.block_on(auth.check(black_box(value.as_bytes()))))
    });
    group.finish();
}

/// `htpasswd -nbB user password` when Apache's tool is there, else the bcrypt crate's own hash.
fn bcrypt_line(user: &str, password: &str) -> String {
    let out = std::process::Command::new("htpasswd")
        .args(["-nbB", user, password])
        .output();
    match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => format!("{user}:{}", bcrypt::hash(password, 5).expect("bcrypt hash")),
    }
}

criterion_group!(benches, cached);
criterion_main!(benches);
