//! What a summary costs per request: the lookups a miss makes in the peers' summaries, the
//! counting-filter upkeep per store event, and a digest rebuild. Run with
//! `cargo bench -p meshcache-summary`; `docs/benchmarks.md` has the figures and compares them
//! with what a request costs the proxy.

// criterion's macros generate undocumented functions.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use meshcache_summary::{BloomArray, CacheDigest, CountingBloom, Hashing};

/// Well-mixed stand-ins for MD5 store keys.
fn key(i: u64) -> [u8; 16] {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let b = mix(a ^ 0x5851_f42d_4c95_7f2d);
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

const DOCS: u64 = 20_000;

fn filled(hashing: Hashing) -> CountingBloom {
    let mut f = CountingBloom::with_hashing(DOCS as u32, 8, hashing);
    let mut sink = Vec::new();
    for i in 0..DOCS {
        f.add(&key(i), &mut sink);
        sink.clear();
    }
    f
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(1));
    for (name, hashing) in [
        ("k4", Hashing::DIGEST),
        ("k8", Hashing::with_functions(8).expect("valid")),
    ] {
        let f = filled(hashing);
        let peer = BloomArray::from_mask(hashing, f.bits(), f.mask(), DOCS);
        let mut i = 1u64 << 40;
        g.bench_function(format!("peer summary, {name}, 20k docs at 8 bits"), |b| {
            b.iter(|| {
                i += 1;
                black_box(peer.contains(&key(i)))
            })
        });
    }
    g.finish();
}

fn upkeep(c: &mut Criterion) {
    let mut g = c.benchmark_group("upkeep");
    g.throughput(Throughput::Elements(1));
    let mut f = filled(Hashing::DIGEST);
    let mut sink = Vec::with_capacity(8);
    let mut i = DOCS;
    g.bench_function("admit one, evict one (counting filter, k4)", |b| {
        b.iter(|| {
            f.add(&key(i), &mut sink);
            f.remove(&key(i - DOCS), &mut sink);
            sink.clear();
            i += 1;
        })
    });
    g.finish();
}

fn rebuild(c: &mut Criterion) {
    let f = filled(Hashing::DIGEST);
    c.bench_function("digest snapshot and encode, 20k docs", |b| {
        b.iter(|| black_box(f.snapshot().encode()))
    });
    let body = f.snapshot().encode();
    c.bench_function("digest decode (Squid's checks), 20k docs", |b| {
        b.iter_batched(
            || body.clone(),
            |body| black_box(CacheDigest::decode(&body)),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, lookups, upkeep, rebuild);
criterion_main!(benches);
