//! CARP hashing against the vectors of `shared/spec/carp-and-hashing.md`, and its properties.
//!
//! The member hashes and multipliers of the three-peer vector were read back from a real
//! Squid 5.7 (`squidclient mgr:carp`); the per-peer URL hashes, combined hashes and scores
//! were computed from Squid's `carp.cc` rules (and agree with an independent implementation).

use meshcache_wire::carp::{
    carp_key, combine, load_factors, member_hash, multipliers, sorted_order, url_hash,
    url_hash_from, CarpArray,
};
use proptest::prelude::*;

const KEY: &[u8] = b"http://www.example.com/index.html";

fn spec_array() -> CarpArray {
    CarpArray::new([("p1.example", 1), ("p2.example", 1), ("p3.example", 2)])
}

/// `n` distinct synthetic URLs over 97 sites, the same on every run.
fn urls(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("http://site{}.example/obj/{i}", i % 97).into_bytes())
        .collect()
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[test]
fn member_hashes() {
    assert_eq!(member_hash(b"p1.example"), 0x7355_8761);
    assert_eq!(member_hash(b"p2.example"), 0x11cc_3dc5);
    assert_eq!(member_hash(b"p3.example"), 0xc393_ae98);
}

#[test]
fn load_factors_and_multipliers() {
    assert_eq!(load_factors(&[1, 1, 2]), [0.25, 0.25, 0.5]);
    let m = multipliers(&[1, 1, 2]);
    assert_eq!(
        m.iter().map(|&x| round6(x)).collect::<Vec<_>>(),
        [0.908560, 0.908560, 1.211414]
    );
    // The recurrence, worked by hand: X_1 = (3 × 0.25)^(1/3); X_2 = X_1 (equal factors);
    // X_3 = 0.25 / (X_1 · X_2) + X_2.
    let x1 = 0.75_f64.powf(1.0 / 3.0);
    assert!((m[0] - x1).abs() < 1e-15 && (m[1] - x1).abs() < 1e-15);
    assert!((m[2] - (0.25 / (x1 * x1) + x1)).abs() < 1e-12);
    // Returned in input order, whatever the weight order.
    let shuffled = multipliers(&[2, 1, 1]);
    assert_eq!(shuffled, [m[2], m[0], m[1]]);
    assert_eq!(sorted_order(&[2, 1, 1]), [1, 2, 0]);
}

#[test]
fn equal_weights_have_multiplier_one() {
    for k in 1..=8 {
        for x in multipliers(&vec![3; k]) {
            assert!((x - 1.0).abs() < 1e-12, "{k} members: {x}");
        }
    }
}

#[test]
fn single_pass_url_hash() {
    assert_eq!(url_hash(KEY), 0x9c15_05be);
    assert_eq!(
        carp_key("http://www.example.com/index.html").as_bytes(),
        KEY
    );
}

#[test]
fn squid_chained_scores_and_winner() {
    let array = spec_array();
    let scores = array.scores(KEY);
    let rows: Vec<(usize, u32, u32)> = scores
        .iter()
        .map(|s| (s.member, s.url_hash, s.combined))
        .collect();
    assert_eq!(
        rows,
        [
            (0, 0x9c15_05be, 0x7b4d_991d),
            (1, 0x516e_5887, 0x4996_9fb9),
            (2, 0x585a_cef9, 0xf4c3_c31b),
        ]
    );
    // Scores to the spec's four significant digits.
    let approx = [1.8795e9, 1.1217e9, 4.9746e9];
    for (s, want) in scores.iter().zip(approx) {
        assert!((s.score - want).abs() < 0.0001e9, "{} vs {want}", s.score);
    }
    assert_eq!(array.choose(KEY, |_| true), Some(2), "p3 wins");
    assert_eq!(array.order(KEY), [2, 0, 1]);
    // p3 down: the next highest is p1, and that is also Squid's pick among p1 and p2.
    assert_eq!(array.choose(KEY, |i| i != 2), Some(0));
    assert_eq!(array.choose(KEY, |_| false), None);
}

#[test]
fn draft_and_squid_chaining_differ() {
    let draft: Vec<u32> = ["p1.example", "p2.example", "p3.example"]
        .iter()
        .map(|n| combine(url_hash(KEY), member_hash(n.as_bytes())))
        .collect();
    assert_eq!(draft, [0x7b4d_991d, 0x8044_1e30, 0xe487_f61c]);
    let squid: Vec<u32> = spec_array()
        .scores(KEY)
        .iter()
        .map(|s| s.combined)
        .collect();
    assert_eq!(
        squid[0], draft[0],
        "only the first member's hash is the draft's"
    );
    assert_ne!(squid[1], draft[1]);
    assert_ne!(squid[2], draft[2]);
    // The chain: member i continues from member i − 1's URL hash.
    assert_eq!(url_hash_from(0x9c15_05be, KEY), 0x516e_5887);
    assert_eq!(url_hash_from(0x516e_5887, KEY), 0x585a_cef9);
}

#[test]
fn bytes_from_0x80_are_signed_chars() {
    // h = 0 + rotl(0, 19) + c, so a single byte's hash is the byte as Squid adds it.
    assert_eq!(url_hash(&[0x41]), 0x41);
    assert_eq!(url_hash(&[0x80]), 0xFFFF_FF80, "0x80 is −128");
    assert_eq!(url_hash(&[0xE9]), 0xFFFF_FFE9, "é's Latin-1 byte is −23");
    // Two bytes: h1 + rotl(h1, 19) + c2.
    let h1: u32 = 0xFFFF_FFE9;
    let want = h1.wrapping_add(h1.rotate_left(19)).wrapping_add(0x61);
    assert_eq!(url_hash(&[0xE9, 0x61]), want);
    // An unsigned-char build (ARM) would add 0xE9 and get another hash.
    assert_ne!(url_hash(&[0xE9, 0x61]), {
        let h: u32 = 0xE9;
        h.wrapping_add(h.rotate_left(19)).wrapping_add(0x61)
    });
    assert_ne!(
        member_hash("café.example".as_bytes()),
        member_hash(b"cafe.example")
    );
}

#[test]
fn mixed_hashes_have_bit_21_clear() {
    // h + h × 0x62531965 = h × 0x62531966 is even; rotl(21) moves that 0 bit to bit 21.
    for (i, url) in urls(1000).iter().enumerate() {
        assert_eq!(member_hash(url) & (1 << 21), 0);
        assert_eq!(combine(url_hash(url), i as u32) & (1 << 21), 0);
    }
}

#[test]
fn under_a_thousandth_rule() {
    // 1/1000 of the total is kept, anything below becomes 0.
    assert_eq!(load_factors(&[1, 999])[0], 0.001);
    assert_eq!(load_factors(&[1, 1000])[0], 0.0);
    // Squid then divides by a zero product: 0, +∞, then NaN.
    let m = multipliers(&[1, 2000]);
    assert_eq!(m[0], 0.0);
    assert_eq!(m[1], f64::INFINITY);
    let m = multipliers(&[1000, 1, 1000]);
    assert_eq!(m[1], 0.0);
    assert_eq!(m[0], f64::INFINITY);
    assert!(m[2].is_nan());
    // Two zeroed factors: 0/0 is NaN from the second member on.
    let m = multipliers(&[1, 1, 3000]);
    assert_eq!(m[0], 0.0);
    assert!(m[1].is_nan() && m[2].is_nan());

    // So Squid sends everything to the +∞ member and never picks the NaN one; ours ranks the
    // NaN member next (failover), the zero-factor member last.
    let array = CarpArray::new([("a", 1000), ("tiny", 1), ("b", 1000)]);
    for url in urls(200) {
        assert_eq!(array.choose(&url, |_| true), Some(0));
        assert_eq!(array.choose(&url, |i| i != 0), None);
        assert_eq!(array.order(&url), [0, 2, 1]);
    }
}

#[test]
fn weight_zero_is_outside_the_array() {
    let with_zero = CarpArray::new([
        ("p1.example", 1),
        ("z", 0),
        ("p2.example", 1),
        ("p3.example", 2),
    ]);
    assert_eq!(with_zero.sorted(), [0, 2, 3]);
    assert_eq!(with_zero.members()[1].multiplier, 0.0);
    // It neither changes the others' chain nor their multipliers.
    let scores: Vec<_> = with_zero
        .scores(KEY)
        .iter()
        .map(|s| (s.url_hash, s.combined))
        .collect();
    let plain: Vec<_> = spec_array()
        .scores(KEY)
        .iter()
        .map(|s| (s.url_hash, s.combined))
        .collect();
    assert_eq!(scores, plain);
    assert_eq!(with_zero.order(KEY), [3, 0, 2, 1]);
}

#[test]
fn distribution_follows_weights() {
    let keys = urls(20_000);
    for weights in [
        vec![1, 1, 2],
        vec![1, 2, 3, 4],
        vec![5, 1, 1],
        vec![1, 1, 1, 1],
        vec![3, 7],
    ] {
        let names: Vec<String> = (1..=weights.len())
            .map(|i| format!("p{i}.example"))
            .collect();
        let array = CarpArray::new(names.iter().zip(weights.iter().copied()));
        let mut won = vec![0usize; weights.len()];
        for key in &keys {
            if let Some(i) = array.choose(key, |_| true) {
                won[i] += 1;
            }
        }
        assert_eq!(won.iter().sum::<usize>(), keys.len());
        let total: u32 = weights.iter().sum();
        for (i, &w) in weights.iter().enumerate() {
            let share = won[i] as f64 / keys.len() as f64;
            let want = f64::from(w) / f64::from(total);
            assert!(
                (share - want).abs() < 0.03,
                "{weights:?}: member {i} got {share}, want {want}"
            );
        }
    }
}

/// Fraction of the keys not owned by `gone` whose winner changed when it went.
fn moved(
    keys: &[Vec<u8>],
    before: impl Fn(&[u8]) -> usize,
    after: impl Fn(&[u8]) -> usize,
    gone: usize,
) -> f64 {
    let (mut kept, mut others) = (0usize, 0usize);
    for key in keys {
        let w = before(key);
        if w != gone {
            others += 1;
            kept += usize::from(after(key) == w);
        }
    }
    1.0 - kept as f64 / others as f64
}

#[test]
fn a_down_member_moves_only_its_urls() {
    let keys = urls(20_000);
    for weights in [[1u32, 1, 2, 1], [1, 2, 3, 4]] {
        let array = CarpArray::new(["a", "b", "c", "d"].into_iter().zip(weights));
        for down in 0..4 {
            let all = |k: &[u8]| array.choose(k, |_| true).unwrap_or(usize::MAX);
            let without = |k: &[u8]| array.choose(k, |i| i != down).unwrap_or(usize::MAX);
            assert_eq!(
                moved(&keys, all, without, down),
                0.0,
                "{weights:?}, {down} down"
            );
            // Its URLs go to the next in our failover order.
            for key in keys.iter().take(2_000) {
                let order = array.order(key);
                if order[0] == down {
                    assert_eq!(array.choose(key, |i| i != down), Some(order[1]));
                }
            }
        }
    }
}

#[test]
fn removing_a_member_rechains_the_ones_after_it() {
    // Equal weights: every multiplier is 1, so only the chain decides.
    let keys = urls(20_000);
    let names = ["a", "b", "c", "d"];
    let array = CarpArray::new(names.iter().map(|n| (n, 1)));
    let before = |k: &[u8]| array.choose(k, |_| true).unwrap_or(usize::MAX);
    let removed = |gone: usize| {
        let kept: Vec<usize> = (0..4).filter(|&i| i != gone).collect();
        let smaller = CarpArray::new(kept.iter().map(|&i| (names[i], 1)));
        move |k: &[u8]| smaller.choose(k, |_| true).map_or(usize::MAX, |j| kept[j])
    };
    // The last member in sorted order: nobody else's chain changes, nothing else moves.
    assert_eq!(moved(&keys, before, removed(3), 3), 0.0);
    // The first: every other member re-chains, and about 2/3 of their URLs move
    // (a fresh draw among three).
    let m = moved(&keys, before, removed(0), 0);
    assert!((0.55..0.75).contains(&m), "{m}");
    // The draft's unchained rendezvous hashing keeps every other member's URLs.
    let draft = |members: &[usize], k: &[u8]| -> usize {
        let u = url_hash(k);
        let mut best = (0u32, usize::MAX);
        for &i in members {
            let c = combine(u, member_hash(names[i].as_bytes()));
            if c > best.0 {
                best = (c, i);
            }
        }
        best.1
    };
    let m = moved(
        &keys,
        |k| draft(&[0, 1, 2, 3], k),
        |k| draft(&[1, 2, 3], k),
        0,
    );
    assert_eq!(m, 0.0);
}

#[test]
fn key_is_the_effective_uri() {
    assert_eq!(
        carp_key("HTTP://WWW.EXAMPLE.COM:80/index.html"),
        "http://www.example.com/index.html"
    );
    assert_eq!(
        carp_key("http://www.example.com"),
        "http://www.example.com/"
    );
    assert_eq!(
        carp_key("http://www.example.com:8080/A?B"),
        "http://www.example.com:8080/A?B"
    );
    assert_eq!(
        carp_key("https://www.example.com:443/"),
        "https://www.example.com/"
    );
    assert_eq!(
        carp_key("ftp://u@ftp.example:21/pub/"),
        "ftp://ftp.example/pub/"
    );
    assert_eq!(
        carp_key("www.example.com:443"),
        "www.example.com:443",
        "CONNECT keeps its port"
    );
}

fn weights() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(0u32..=20, 1..8)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("parent{i}.example")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn order_is_a_permutation(ws in weights(), key in proptest::collection::vec(any::<u8>(), 0..80)) {
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let mut order = array.order(&key);
        order.sort_unstable();
        prop_assert_eq!(order, (0..ws.len()).collect::<Vec<_>>());
    }

    #[test]
    fn order_is_squids_ranking_then_the_rest(
        ws in proptest::collection::vec(0u32..=3, 1..40),
        key in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        // The ranking spelled out with stable sorts: scores above 0 by descending score (ties
        // in evaluation order), then the rest heaviest first, by descending combined hash,
        // then in build order.
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let scores = array.scores(&key);
        let mut head: Vec<_> = scores.iter().filter(|s| s.score > 0.0).collect();
        head.sort_by(|a, b| b.score.total_cmp(&a.score));
        let mut tail: Vec<(u32, u32, usize)> = scores
            .iter()
            .filter(|s| s.score <= 0.0)
            .map(|s| (ws[s.member], s.combined, s.member))
            .chain(
                (0..ws.len())
                    .filter(|&i| ws[i] == 0)
                    .map(|i| (0, combine(url_hash(&key), array.members()[i].hash), i)),
            )
            .collect();
        tail.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let expected: Vec<usize> = head
            .iter()
            .map(|s| s.member)
            .chain(tail.iter().map(|t| t.2))
            .collect();
        prop_assert_eq!(array.order(&key), expected);
    }

    #[test]
    fn top_is_a_prefix_of_order(
        ws in proptest::collection::vec(0u32..=3, 1..40),
        key in proptest::collection::vec(any::<u8>(), 0..80),
        k in 0usize..45,
    ) {
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let order = array.order(&key);
        prop_assert_eq!(array.top(&key, k), &order[..k.min(order.len())]);
    }

    #[test]
    fn weight_zero_is_never_first(ws in weights(), key in proptest::collection::vec(any::<u8>(), 0..80)) {
        prop_assume!(ws.iter().any(|&w| w > 0));
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let first = array.order(&key)[0];
        prop_assert!(ws[first] > 0);
        if let Some(i) = array.choose(&key, |_| true) {
            prop_assert!(ws[i] > 0);
        }
    }

    #[test]
    fn first_usable_in_order_is_squids_choice(
        ws in proptest::collection::vec(1u32..=100, 1..8),
        usable in proptest::collection::vec(any::<bool>(), 8),
        key in "[a-z]{1,8}://[a-z.]{1,20}/[ -~]{0,40}",
    ) {
        // Shares stay at 1/601 or more, above the 0.1 % rule, so every member can win.
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let ok = |i: usize| usable[i];
        let first = array.order(key.as_bytes()).into_iter().find(|&i| ok(i));
        prop_assert_eq!(array.choose(key.as_bytes(), ok), first);
    }

    #[test]
    fn scores_follow_the_chain(ws in weights(), key in proptest::collection::vec(any::<u8>(), 0..80)) {
        let array = CarpArray::new(names(ws.len()).iter().zip(ws.iter().copied()));
        let mut h = 0;
        for s in array.scores(&key) {
            h = url_hash_from(h, &key);
            prop_assert_eq!(s.url_hash, h);
            prop_assert_eq!(s.combined, combine(h, array.members()[s.member].hash));
        }
    }

    #[test]
    fn carp_key_is_idempotent(url in "[ -~]{0,60}") {
        let once = carp_key(&url);
        prop_assert_eq!(carp_key(&once), once.clone());
    }

    #[test]
    fn carp_key_of_urls_is_idempotent(url in "(http|HTTP|Https|ftp|FTP)://([a-zA-Z0-9]+@)?[a-zA-Z0-9.]{1,20}\\.?(:[0-9]{1,5})?(/[ -~]{0,30})?") {
        let once = carp_key(&url);
        prop_assert_eq!(carp_key(&once), once.clone());
        prop_assert!(once.starts_with(&url[..url.find("://").unwrap_or(0)].to_ascii_lowercase()));
    }
}
