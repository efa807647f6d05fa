//! The digest format against a digest served by real Squid 5.7 (see `vectors/README.md`), and
//! property tests: decoding never panics, encoding round-trips.

use meshcache_store::StoreKey;
use meshcache_summary::digest::{CacheDigest, DigestError, CBLOCK_LEN};
use proptest::prelude::*;

const SQUID: &[u8] = include_bytes!("vectors/squid-5.7-store_digest.bin");

#[test]
fn reads_squid_5_7s_digest() {
    let d = CacheDigest::decode(SQUID).expect("Squid's digest decodes");
    assert_eq!(
        (d.capacity(), d.count(), d.del_count(), d.bits_per_entry()),
        (92, 91, 0, 5)
    );
    assert_eq!(d.mask().len(), 58);
    assert_eq!(d.bits_set(), 254);
    for i in 1..=40 {
        let url = format!("http://127.0.0.1:18086/obj/v{i}?size=2000");
        assert!(
            d.contains(StoreKey::get(&url).as_bytes()),
            "{url} is in Squid's digest"
        );
    }
    // Other URLs match at about the Bloom rate (the README: 9.4 % of 2,000).
    let false_hits = (0..2000)
        .filter(|i| {
            let url = format!("http://127.0.0.1:18086/other/{i}");
            d.contains(StoreKey::get(&url).as_bytes())
        })
        .count();
    let rate = false_hits as f64 / 2000.0;
    assert!((0.05..0.14).contains(&rate), "false-hit rate {rate}");
    assert!((d.expected_fp_rate() - 0.087).abs() < 0.001);
    // Written back, it is byte for byte what Squid served.
    assert_eq!(d.encode(), SQUID);
}

#[test]
fn a_digest_of_our_own_is_what_squid_would_serve() {
    let mut d = CacheDigest::new(92, 5);
    for i in 1..=40 {
        d.add(StoreKey::get(&format!("http://127.0.0.1:18086/obj/v{i}?size=2000")).as_bytes());
    }
    let squid = CacheDigest::decode(SQUID).expect("decodes");
    // Every bit ours sets, Squid's has too (Squid's also holds a few entries of its own).
    for (ours, theirs) in d.mask().iter().zip(squid.mask()) {
        assert_eq!(ours & theirs, *ours);
    }
    assert_eq!(
        &d.encode()[..20],
        &{
            let mut h = SQUID[..20].to_vec();
            h[8..12].copy_from_slice(&40u32.to_be_bytes());
            h
        }[..]
    );
}

proptest! {
    #[test]
    fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = CacheDigest::decode(&bytes);
    }

    #[test]
    fn mutated_squid_digests_decode_or_fail_cleanly(i in 0usize..186, v in any::<u8>()) {
        let mut b = SQUID.to_vec();
        b[i] = v;
        match CacheDigest::decode(&b) {
            Ok(d) => prop_assert_eq!(d.encode().len(), CBLOCK_LEN + d.mask().len()),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn round_trip(capacity in 1u32..5000, bpe in 1u8..20, keys in proptest::collection::vec(any::<[u8; 16]>(), 0..50)) {
        let mut d = CacheDigest::new(capacity, bpe);
        for k in &keys {
            d.add(k);
        }
        match CacheDigest::decode(&d.encode()) {
            Ok(back) => {
                prop_assert_eq!(&back, &d);
                for k in &keys {
                    prop_assert!(back.contains(k));
                }
            }
            Err(DigestError::TooFull { .. }) => prop_assert!(d.fill() > 0.65),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}
