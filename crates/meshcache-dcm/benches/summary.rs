//! What the Summary Cache protocol costs a node per store event and per miss, through the
//! state machines the proxy drives: our summary following the store (an admission and an
//! eviction, with the updates they cause taken at the paper's 1 % threshold) and a miss
//! looked up in three peers' summaries. Run with `cargo bench -p meshcache-dcm`.

// criterion's macros generate undocumented functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meshcache_dcm::summary::{LocalSummary, PeerSummaries, DEFAULT_THRESHOLD};
use meshcache_dcm::PeerId;
use meshcache_summary::Hashing;
use meshcache_wire::summary::FullArray;

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

/// Documents in a node's store (the summary is sized for them, 8 bits each).
const DOCS: u64 = 20_000;

fn filled() -> LocalSummary {
    let mut l = LocalSummary::new(DOCS as u32, 8, Hashing::DIGEST, DEFAULT_THRESHOLD, 1);
    l.set_sender(Ipv4Addr::LOCALHOST);
    for i in 0..DOCS {
        l.admitted(&key(i));
    }
    let _ = l.take_updates();
    l
}

fn local(c: &mut Criterion) {
    let mut g = c.benchmark_group("local summary");
    g.throughput(Throughput::Elements(1));
    // Cache Digests follow the store the same way but never take delta updates.
    for (name, take) in [
        ("admit one, evict one, updates taken when due", true),
        ("admit one, evict one, updates never taken", false),
    ] {
        let mut l = filled();
        let mut i = DOCS;
        g.bench_function(name, |b| {
            b.iter(|| {
                l.admitted(&key(i));
                l.removed(&key(i - DOCS));
                if take && l.due() {
                    black_box(l.take_updates());
                }
                i += 1;
            })
        });
    }
    g.finish();
}

fn peers(c: &mut Criterion) {
    let mut g = c.benchmark_group("peer summaries");
    g.throughput(Throughput::Elements(1));
    let now = Instant::now();
    let mut p = PeerSummaries::new(3, Duration::from_secs(1));
    for peer in 0..3u64 {
        let mut l = LocalSummary::new(DOCS as u32, 8, Hashing::DIGEST, DEFAULT_THRESHOLD, 1);
        for i in 0..DOCS {
            l.admitted(&key((peer + 1) << 40 | i));
        }
        let full: FullArray = l.full_array();
        p.install_full(now, PeerId(peer as usize), full, 0);
    }
    let mut i = 1u64 << 50;
    g.bench_function("a miss looked up in three peers' summaries", |b| {
        b.iter(|| {
            i += 1;
            black_box(p.candidates(&key(i), |_| true))
        })
    });
    g.finish();
}

criterion_group!(benches, local, peers);
criterion_main!(benches);
