//! Property tests of the Summary Cache codec: round trips, strictness, and no panics on any
//! input (through the fuzz target's body, `fuzz_summary_decode`).

use std::net::Ipv4Addr;

use meshcache_wire::fuzz_summary_decode;
use meshcache_wire::summary::{
    decode_dirupdate, decode_full, encode_dirupdate, encode_full, DirUpdate, FullArray, HashParams,
    Update, MAX_UPDATES_PER_DATAGRAM,
};
use proptest::prelude::*;

fn params() -> impl Strategy<Value = HashParams> {
    (1u16..=32, 1u16..=32, 1u32..100_000).prop_map(|(functions, function_bits, bits)| HashParams {
        functions,
        function_bits,
        bits,
    })
}

fn dirupdate() -> impl Strategy<Value = DirUpdate> {
    (any::<u32>(), any::<u32>(), params()).prop_flat_map(|(seq, sender, params)| {
        proptest::collection::vec(
            (0..params.bits, any::<bool>()).prop_map(|(bit, set)| Update { bit, set }),
            0..=MAX_UPDATES_PER_DATAGRAM,
        )
        .prop_map(move |updates| DirUpdate {
            seq,
            sender: Ipv4Addr::from(sender),
            params,
            updates,
        })
    })
}

fn full_array() -> impl Strategy<Value = FullArray> {
    (any::<u32>(), any::<u32>(), params()).prop_flat_map(|(seq, entries, params)| {
        let len = (params.bits as usize).div_ceil(8);
        // Sparse masks (at most about a quarter of the bits set) stay under the fill limit.
        proptest::collection::vec(any::<u8>().prop_map(|b| b & 0x11), len).prop_map(
            move |mut mask| {
                let spare = params.bits % 8;
                if spare != 0 {
                    if let Some(last) = mask.last_mut() {
                        *last &= (1u8 << spare) - 1;
                    }
                }
                FullArray {
                    seq,
                    params,
                    entries,
                    mask,
                }
            },
        )
    })
}

proptest! {
    #[test]
    fn dirupdates_round_trip(msg in dirupdate()) {
        let mut wire = Vec::new();
        encode_dirupdate(&msg, &mut wire).expect("valid message encodes");
        prop_assert!(wire.len() <= 1472);
        prop_assert_eq!(decode_dirupdate(&wire), Ok(msg));
        fuzz_summary_decode(&wire);
    }

    #[test]
    fn truncated_dirupdates_are_refused(msg in dirupdate(), cut in 1usize..64) {
        let mut wire = Vec::new();
        encode_dirupdate(&msg, &mut wire).expect("valid message encodes");
        let cut = cut.min(wire.len());
        prop_assert!(decode_dirupdate(&wire[..wire.len() - cut]).is_err());
    }

    #[test]
    fn full_arrays_round_trip(a in full_array()) {
        let bytes = encode_full(&a).expect("valid array encodes");
        prop_assert_eq!(decode_full(&bytes), Ok(a));
        fuzz_summary_decode(&bytes);
        prop_assert!(decode_full(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        fuzz_summary_decode(&data);
    }

    #[test]
    fn plausible_headers_never_panic(mut data in proptest::collection::vec(any::<u8>(), 32..400)) {
        data[0] = 20;
        data[1] = 2;
        let len = data.len() as u16;
        data[2..4].copy_from_slice(&len.to_be_bytes());
        fuzz_summary_decode(&data);
        data[..4].copy_from_slice(b"MCSA");
        data[4..6].copy_from_slice(&1u16.to_be_bytes());
        fuzz_summary_decode(&data);
    }
}
