//! Property tests for the ICP codec: round trips, never panicking on arbitrary or mutated
//! input (through the fuzz target's body, `fuzz_icp_decode`), and truncation always rejected
//! with a specific error.

use std::net::Ipv4Addr;

use meshcache_wire::icp::{self, Message, Opcode, Options, Payload, HEADER_LEN, MAX_DATAGRAM};
use meshcache_wire::{fuzz_icp_decode, Verdict, WireError};
use proptest::prelude::*;

/// URL bytes: anything but NUL (the codec does not judge URL syntax), usually short,
/// sometimes long enough to approach the datagram limit.
fn url() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(1u8..=255, 0..200),
        1 => proptest::collection::vec(1u8..=255, 0..(MAX_DATAGRAM - HEADER_LEN - 4)),
    ]
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

/// Any message that fits in a datagram.
fn message() -> impl Strategy<Value = Message> {
    (
        opcode(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        ipv4(),
        ipv4(),
        url(),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(opcode, reqnum, options, option_data, sender, requester, url, object)| {
                let payload = match opcode {
                    Opcode::Query => Payload::Query { requester, url },
                    Opcode::HitObj => Payload::HitObj { url, object },
                    _ => Payload::Url(url),
                };
                Message {
                    opcode,
                    reqnum,
                    options: Options::from_bits(options),
                    option_data,
                    sender,
                    payload,
                }
            },
        )
        .prop_filter("fits in a datagram", |m| m.encoded_len() <= MAX_DATAGRAM)
}

fn encode(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    icp::encode(msg, &mut out).expect("a generated message encodes");
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decode_inverts_encode(msg in message()) {
        let wire = encode(&msg);
        prop_assert_eq!(wire.len(), msg.encoded_len());
        prop_assert_eq!(usize::from(u16::from_be_bytes([wire[2], wire[3]])), wire.len());
        prop_assert_eq!(icp::decode(&wire), Ok(msg));
    }

    #[test]
    fn replies_copy_reqnum_and_url(msg in message(), op in opcode()) {
        match Message::reply(op, &msg) {
            Ok(reply) => {
                prop_assert_eq!(reply.reqnum, msg.reqnum);
                prop_assert_eq!(reply.url(), msg.url());
                let decoded = icp::decode(&encode(&reply));
                prop_assert_eq!(decoded, Ok(reply));
            }
            Err(e) => prop_assert_eq!(e, WireError::NotAReply(op)),
        }
    }

    /// Every proper prefix of a valid datagram is rejected, and the error says why.
    #[test]
    fn truncation_is_rejected_at_every_length(msg in message()) {
        let wire = encode(&msg);
        // Long datagrams: check every prefix near both ends, and a sample in between.
        let lengths: Vec<usize> = if wire.len() <= 600 {
            (0..wire.len()).collect()
        } else {
            (0..300).chain(wire.len() - 300..wire.len()).chain((300..wire.len() - 300).step_by(97)).collect()
        };
        for len in lengths {
            let err = icp::decode(&wire[..len]).expect_err("a truncated datagram decoded");
            prop_assert_eq!(err.verdict(), Verdict::Drop);
            if len < HEADER_LEN {
                prop_assert_eq!(err, WireError::Truncated { need: HEADER_LEN, have: len });
            } else {
                prop_assert_eq!(
                    err,
                    WireError::LengthMismatch { header: wire.len() as u16, datagram: len }
                );
            }
        }
    }

    /// Truncation that also fixes up the length field gets past the header check and is still
    /// rejected by the payload rules: a query earns an ERR, anything else is dropped.
    #[test]
    fn truncation_with_a_consistent_length_is_rejected(msg in message(), cut in 1usize..64) {
        let mut wire = encode(&msg);
        prop_assume!(wire.len() > HEADER_LEN);
        let len = wire.len().saturating_sub(cut).max(HEADER_LEN);
        wire.truncate(len);
        wire[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        let err = icp::decode(&wire).expect_err("a truncated payload decoded");
        let specific = matches!(
            err,
            WireError::MissingNul { .. }
                | WireError::QueryTooShort { .. }
                | WireError::Truncated { .. }
                | WireError::TrailingBytes { .. }
        );
        prop_assert!(specific, "{:?}", err);
        if msg.opcode == Opcode::Query {
            prop_assert_eq!(err.verdict(), Verdict::ReplyErr { reqnum: msg.reqnum });
        } else {
            prop_assert_eq!(err.verdict(), Verdict::Drop);
        }
    }

    /// Appending bytes breaks the exact-length rule.
    #[test]
    fn extra_bytes_are_rejected(msg in message(), extra in proptest::collection::vec(any::<u8>(), 1..8)) {
        let mut wire = encode(&msg);
        wire.extend_from_slice(&extra);
        let err = icp::decode(&wire).expect_err("padding accepted");
        let rejected = matches!(err, WireError::LengthMismatch { .. } | WireError::TooLong { .. });
        prop_assert!(rejected, "{:?}", err);
    }

    /// URLs containing NUL are refused by the encoder.
    #[test]
    fn encoder_refuses_nul_in_urls(mut url in url(), at in any::<proptest::sample::Index>()) {
        let pos = at.index(url.len() + 1);
        url.insert(pos, 0);
        let mut out = Vec::new();
        prop_assert_eq!(
            icp::encode(&Message::query(1, url), &mut out),
            Err(WireError::UrlContainsNul { at: pos })
        );
        prop_assert!(out.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// The fuzz target's body on arbitrary bytes: never panics (and checks its own oracles).
    #[test]
    fn fuzz_body_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..128)) {
        fuzz_icp_decode(&data);
    }

    /// Arbitrary bytes behind a plausible header (version 2, right length, known opcode), so
    /// the payload rules get exercised rather than the header checks.
    #[test]
    fn fuzz_body_on_plausible_headers(
        op in opcode(),
        reqnum in any::<u32>(),
        body in proptest::collection::vec(prop_oneof![3 => Just(0u8), 10 => any::<u8>()], 0..64),
    ) {
        let len = HEADER_LEN + body.len();
        let mut wire = vec![op.as_u8(), 2];
        wire.extend_from_slice(&(len as u16).to_be_bytes());
        wire.extend_from_slice(&reqnum.to_be_bytes());
        wire.extend_from_slice(&[0; 12]);
        wire.extend_from_slice(&body);
        fuzz_icp_decode(&wire);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Valid datagrams with random byte edits, insertions and deletions.
    #[test]
    fn fuzz_body_on_mutated_datagrams(
        msg in message(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let mut wire = encode(&msg);
        for (at, byte, kind) in edits {
            let pos = at.index(wire.len() + 1);
            match kind {
                0 if pos < wire.len() => wire[pos] = byte,
                1 => wire.insert(pos, byte),
                _ if pos < wire.len() => { wire.remove(pos); }
                _ => wire.push(byte),
            }
        }
        fuzz_icp_decode(&wire);
    }
}

#[test]
fn fuzz_body_on_edge_sizes() {
    for len in [
        0,
        1,
        19,
        20,
        21,
        24,
        25,
        MAX_DATAGRAM,
        MAX_DATAGRAM + 1,
        70_000,
    ] {
        fuzz_icp_decode(&vec![0; len]);
        fuzz_icp_decode(&vec![0xFF; len]);
        let mut plausible = vec![1u8; len];
        if len >= 4 {
            plausible[1] = 2;
            plausible[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        }
        fuzz_icp_decode(&plausible);
    }
}
