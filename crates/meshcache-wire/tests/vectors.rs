//! Byte vectors for the ICP codec.
//!
//! Two kinds:
//! - **constructed**: computed by hand from the layout tables in `shared/spec/icp.md` §2–§5
//!   (and the spec's worked examples §11 A–C), one per opcode;
//! - **captured**: datagrams exchanged with Debian's Squid 5.7 (`5.7-2+deb12u6`) on loopback,
//!   stored as `tests/vectors/*.hex`; `tests/vectors/README.md` says exactly how each was made
//!   (`tests/vectors/capture/run.sh`). The spec's own captured examples (§11 D–F) are inline.
//!
//! Every vector is checked both ways: decode gives the expected message, and encoding that
//! message gives the same bytes.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use meshcache_wire::icp::{self, Message, Opcode, Options, Payload, SrcRtt, MAX_DATAGRAM};
use meshcache_wire::{Verdict, WireError};

/// Parse the vector notation used here and in the spec: hex byte pairs, `"quoted ASCII"`, and
/// `|` as a visual separator; `#` starts a comment that runs to the end of the line.
fn bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut rest = line;
        while let Some(start) = rest.find('"') {
            hex_words(&rest[..start], &mut out);
            let tail = &rest[start + 1..];
            let end = tail.find('"').expect("unterminated quote in vector");
            out.extend_from_slice(&tail.as_bytes()[..end]);
            rest = &tail[end + 1..];
        }
        hex_words(rest, &mut out);
    }
    out
}

fn hex_words(text: &str, out: &mut Vec<u8>) {
    for word in text.split_whitespace().filter(|w| *w != "|") {
        out.push(u8::from_str_radix(word, 16).unwrap_or_else(|_| panic!("bad hex {word:?}")));
    }
}

fn vector_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(format!("{name}.hex"))
}

/// A captured vector, or `None` when the file does not exist (Squid sent nothing).
fn captured(name: &str) -> Option<Vec<u8>> {
    let path = vector_path(name);
    path.exists()
        .then(|| bytes(&std::fs::read_to_string(&path).expect("read vector")))
}

fn load(name: &str) -> Vec<u8> {
    captured(name).unwrap_or_else(|| panic!("missing vector {}", vector_path(name).display()))
}

fn encoded(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    icp::encode(msg, &mut out).expect("encode");
    out
}

/// Decode must give `expected`, and encoding `expected` must give `wire` back.
fn both_ways(wire: &[u8], expected: &Message) {
    assert_eq!(icp::decode(wire).as_ref(), Ok(expected), "decode");
    assert_eq!(encoded(expected), wire, "encode");
}

fn url_msg(opcode: Opcode, reqnum: u32, url: &str) -> Message {
    Message {
        opcode,
        reqnum,
        options: Options::NONE,
        option_data: 0,
        sender: Ipv4Addr::UNSPECIFIED,
        payload: Payload::Url(url.into()),
    }
}

// ---- constructed from the spec's tables ------------------------------------------------------

/// Spec §11 A (constructed): QUERY with SRC_RTT, reqnum 42, length 20+4+23+1 = 48.
const SPEC_A_QUERY: &str = r#"01 02 00 30 | 00 00 00 2a | 40 00 00 00 | 00 00 00 00 | 00 00 00 00 |
    00 00 00 00 | "http://www.example.com/" 00"#;
/// Spec §11 B (constructed): MISS reply to A, SRC_RTT 3 hops / 45 ms, length 20+23+1 = 44.
const SPEC_B_MISS_RTT: &str = r#"03 02 00 2c | 00 00 00 2a | 40 00 00 00 | 00 03 00 2d |
    00 00 00 00 | "http://www.example.com/" 00"#;
/// Spec §11 C (constructed): MISS_NOFETCH (0x15), reqnum 43, 39 bytes.
const SPEC_C_MISS_NOFETCH: &str = "15 02 00 27 00 00 00 2b 00 00 00 00 00 00 00 00 00 00 00 00
    68 74 74 70 3a 2f 2f 61 2e 65 78 61 6d 70 6c 65 2f 78 00";
/// Constructed: SECHO (10) carries the URL only; 20 + 18 + 1 = 39 = 0x27.
const SECHO: &str = r#"0a 02 00 27 | 00 00 00 05 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 |
    "http://a.example/x" 00"#;
/// Constructed: DECHO (11), URL only (no requester address, unlike QUERY); 39 bytes.
const DECHO: &str = r#"0b 02 00 27 | 00 00 00 06 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 |
    "http://a.example/x" 00"#;
/// Constructed: HIT_OBJ (23): URL, NUL, unaligned u16 size 5, "hello"; 20+18+1+2+5 = 46.
const HIT_OBJ: &str = r#"17 02 00 2e | 00 00 00 07 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 |
    "http://a.example/x" 00 00 05 "hello""#;
/// Constructed: plain HIT (2) with a non-zero sender address, which Squid ignores; 39 bytes.
const HIT_WITH_SENDER: &str = r#"02 02 00 27 | 00 00 00 08 | 00 00 00 00 | 00 00 00 00 |
    0a 00 00 01 | "http://a.example/x" 00"#;

// ---- captured by the spec's authors (spec §11 D–F) -------------------------------------------

/// Spec §11 D: the query Squid sent to a sibling (reqnum 2), 58 bytes.
const SPEC_D_SQUID_QUERY: &str = r#"01 02 00 3a 00 00 00 02 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 "http://127.0.1.1:28765/viaicp.txt" 00"#;
/// Spec §11 E: Squid's HIT to reqnum 0x11223344, 51 bytes.
const SPEC_E_SQUID_HIT: &str = r#"02 02 00 33 11 22 33 44 00 00 00 00 00 00 00 00 00 00 00 00
    "http://127.0.0.1:28765/obj.txt" 00"#;
/// Spec §11 F: Squid's DENIED (0x16), 44 bytes.
const SPEC_F_SQUID_DENIED: &str = r#"16 02 00 2c 00 00 00 09 00 00 00 00 00 00 00 00 00 00 00 00
    "http://denied.example/x" 00"#;
/// Spec §11 F: Squid's ERR to a malformed query (empty URL), 21 bytes.
const SPEC_F_SQUID_ERR: &str = "04 02 00 15 00 00 00 0a 00 00 00 00 00 00 00 00 00 00 00 00 00";

#[test]
fn spec_a_query_with_src_rtt() {
    let wire = bytes(SPEC_A_QUERY);
    assert_eq!(wire.len(), 48);
    let msg = Message::query(42, "http://www.example.com/").with_options(Options::SRC_RTT);
    both_ways(&wire, &msg);
    assert_eq!(msg.src_rtt(), None, "in a query SRC_RTT is a request");
}

#[test]
fn spec_b_miss_with_rtt_and_hops() {
    let wire = bytes(SPEC_B_MISS_RTT);
    let query = icp::decode(&bytes(SPEC_A_QUERY)).unwrap();
    let mut reply = Message::reply(Opcode::Miss, &query).unwrap();
    reply.set_src_rtt(SrcRtt {
        hops: 3,
        rtt_ms: 45,
    });
    both_ways(&wire, &reply);
    assert_eq!(
        icp::decode(&wire).unwrap().src_rtt(),
        Some(SrcRtt {
            hops: 3,
            rtt_ms: 45
        })
    );
}

#[test]
fn spec_c_miss_nofetch() {
    both_ways(
        &bytes(SPEC_C_MISS_NOFETCH),
        &url_msg(Opcode::MissNoFetch, 43, "http://a.example/x"),
    );
}

#[test]
fn secho_decho_carry_the_url_only() {
    both_ways(
        &bytes(SECHO),
        &url_msg(Opcode::Secho, 5, "http://a.example/x"),
    );
    both_ways(
        &bytes(DECHO),
        &url_msg(Opcode::Decho, 6, "http://a.example/x"),
    );
}

#[test]
fn hit_obj_size_is_unaligned_after_the_nul() {
    let msg = Message {
        opcode: Opcode::HitObj,
        reqnum: 7,
        options: Options::NONE,
        option_data: 0,
        sender: Ipv4Addr::UNSPECIFIED,
        payload: Payload::HitObj {
            url: b"http://a.example/x".to_vec(),
            object: b"hello".to_vec(),
        },
    };
    let wire = bytes(HIT_OBJ);
    both_ways(&wire, &msg);
    // Object shorter or longer than its size field.
    let mut short = wire.clone();
    short[2..4].copy_from_slice(&45u16.to_be_bytes());
    short.pop();
    assert_eq!(
        icp::decode(&short),
        Err(WireError::Truncated { need: 46, have: 45 })
    );
    let mut long = wire.clone();
    long[2..4].copy_from_slice(&47u16.to_be_bytes());
    long.push(b'!');
    let err = icp::decode(&long).unwrap_err();
    assert_eq!(
        err,
        WireError::TrailingBytes {
            opcode: Opcode::HitObj,
            reqnum: 7,
            extra: 1
        }
    );
    assert_eq!(err.verdict(), Verdict::Drop);
}

#[test]
fn hit_keeps_a_sender_address() {
    let mut msg = url_msg(Opcode::Hit, 8, "http://a.example/x");
    msg.sender = Ipv4Addr::new(10, 0, 0, 1);
    both_ways(&bytes(HIT_WITH_SENDER), &msg);
}

#[test]
fn spec_d_to_f_captured_by_the_spec() {
    let d = bytes(SPEC_D_SQUID_QUERY);
    assert_eq!(d.len(), 58);
    both_ways(&d, &Message::query(2, "http://127.0.1.1:28765/viaicp.txt"));
    both_ways(
        &bytes(SPEC_E_SQUID_HIT),
        &url_msg(Opcode::Hit, 0x1122_3344, "http://127.0.0.1:28765/obj.txt"),
    );
    both_ways(
        &bytes(SPEC_F_SQUID_DENIED),
        &url_msg(Opcode::Denied, 9, "http://denied.example/x"),
    );
    let err = bytes(SPEC_F_SQUID_ERR);
    both_ways(&err, &Message::malformed_query_err(10));
}

// ---- captured from Squid 5.7 by tests/vectors/capture/run.sh ---------------------------------

/// (a) Squid's own queries to a sibling, and the replies we sent back that Squid accepted.
#[test]
fn squid_queries_to_a_sibling_and_our_accepted_replies() {
    let q1 = load("squid-query-1.recv");
    let query1 = Message::query(1, "http://127.0.0.1:18080/viaicp.txt");
    both_ways(&q1, &query1);

    // Squid logged "ICP_MISS from 127.0.0.2:13130" for this reply and marked the peer alive.
    let miss = Message::reply(Opcode::Miss, &icp::decode(&q1).unwrap()).unwrap();
    assert_eq!(encoded(&miss), load("meshcache-miss-reply-1.sent"));

    let q2 = load("squid-query-2.recv");
    let query2 = Message::query(2, "http://127.0.0.1:18080/sibling-hit.txt");
    both_ways(&q2, &query2);

    // Squid then fetched the URL from us (SIBLING_HIT/127.0.0.2, Cache-Control: only-if-cached).
    let hit = Message::reply(Opcode::Hit, &icp::decode(&q2).unwrap()).unwrap();
    assert_eq!(encoded(&hit), load("meshcache-hit-reply-2.sent"));
}

/// What our decoder says about a datagram we sent to Squid's icp_port.
enum Ours {
    /// Decodes; the responder handles it (Squid's answer is checked separately).
    Decodes,
    /// Rejected with exactly this error.
    Rejects(WireError),
}

/// Every datagram sent to Squid in (b), what our decoder makes of it, and what Squid did.
fn query_cases() -> Vec<(&'static str, Ours)> {
    use Ours::*;
    use WireError::*;
    let q = Opcode::Query;
    vec![
        ("miss", Decodes),
        ("hit", Decodes),
        ("denied", Decodes),
        ("src-rtt", Decodes),
        ("hit-obj-flag", Decodes),
        ("reqnum-zero", Decodes),
        ("reqnum-max", Decodes),
        ("sender-requester-set", Decodes),
        (
            "no-nul",
            Rejects(MissingNul {
                opcode: q,
                reqnum: 10,
            }),
        ),
        (
            "trailing-after-nul",
            Rejects(TrailingBytes {
                opcode: q,
                reqnum: 11,
                extra: 3,
            }),
        ),
        (
            "two-nuls",
            Rejects(TrailingBytes {
                opcode: q,
                reqnum: 12,
                extra: 1,
            }),
        ),
        (
            "embedded-nul",
            Rejects(TrailingBytes {
                opcode: q,
                reqnum: 13,
                extra: 2,
            }),
        ),
        ("whitespace", Decodes),
        ("empty-url", Decodes),
        ("bad-url", Decodes),
        ("bad-url-nospace", Decodes),
        (
            "query-24",
            Rejects(QueryTooShort {
                reqnum: 18,
                len: 24,
            }),
        ),
        (
            "query-22",
            Rejects(QueryTooShort {
                reqnum: 19,
                len: 22,
            }),
        ),
        (
            "query-20",
            Rejects(QueryTooShort {
                reqnum: 20,
                len: 20,
            }),
        ),
        (
            "query-21-nul",
            Rejects(QueryTooShort {
                reqnum: 21,
                len: 21,
            }),
        ),
        (
            "length-too-big",
            Rejects(LengthMismatch {
                header: 200,
                datagram: 59,
            }),
        ),
        (
            "length-too-small",
            Rejects(LengthMismatch {
                header: 30,
                datagram: 59,
            }),
        ),
        (
            "length-zero",
            Rejects(LengthMismatch {
                header: 0,
                datagram: 59,
            }),
        ),
        ("short-19", Rejects(Truncated { need: 20, have: 19 })),
        ("version-1", Rejects(BadVersion(1))),
        ("version-3", Rejects(BadVersion(3))),
        ("version-3-hit", Rejects(BadVersion(3))),
        ("opcode-0", Rejects(InvalidOpcode)),
        ("opcode-5", Rejects(UnknownOpcode(5))),
        ("opcode-secho", Decodes),
        ("opcode-hit-obj", Decodes),
        ("opcode-99", Rejects(UnknownOpcode(99))),
        ("max-16383", Decodes),
        (
            "max-16384",
            Rejects(TooLong {
                len: 16384,
                max: MAX_DATAGRAM,
            }),
        ),
        ("upper-case", Decodes),
    ]
}

/// Our accept/reject decisions and ERR-vs-drop verdicts agree with what Squid did.
#[test]
fn decoder_agrees_with_squid_on_every_sent_datagram() {
    for (name, ours) in query_cases() {
        let sent = load(&format!("q-{name}.sent"));
        let reply = captured(&format!("squid-{name}.recv"));
        match (ours, icp::decode(&sent)) {
            (Ours::Rejects(expected), Err(err)) => {
                assert_eq!(err, expected, "{name}");
                match (err.err_reply(), reply) {
                    // Squid answered ERR, and it is byte for byte the one we would send.
                    (Some(ours), Some(theirs)) => assert_eq!(encoded(&ours), theirs, "{name}"),
                    (None, None) => {}
                    // Squid answers a v3 query (in v2) and then crashes; we drop v3 on purpose.
                    (None, Some(_)) if name.starts_with("version-3") => {}
                    (ours, theirs) => panic!("{name}: ours {ours:?}, Squid {theirs:?}"),
                }
            }
            (Ours::Decodes, Ok(msg)) => {
                assert_eq!(encoded(&msg), sent, "{name}: re-encoding differs");
                if msg.opcode == Opcode::Query {
                    let theirs = reply.unwrap_or_else(|| panic!("{name}: Squid did not answer"));
                    let theirs = icp::decode(&theirs).unwrap();
                    assert_eq!(theirs.reqnum, msg.reqnum, "{name}: reqnum not echoed");
                } else {
                    // SECHO and HIT_OBJ decode fine, but Squid drops them ("UNKNOWN OPCODE").
                    assert!(reply.is_none(), "{name}: Squid answered a non-query");
                }
            }
            (ours, got) => panic!(
                "{name}: expected {}, got {got:?}",
                match ours {
                    Ours::Decodes => "Ok".to_string(),
                    Ours::Rejects(e) => format!("{e:?}"),
                }
            ),
        }
    }
}

/// Every reply Squid sent decodes, is version 2 with sender 0, and re-encodes identically.
#[test]
fn every_squid_reply_round_trips() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".recv.hex") else {
            continue;
        };
        let wire = load(&format!("{stem}.recv"));
        assert_eq!(wire[1], 2, "{stem}: version");
        let msg = icp::decode(&wire).unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert_eq!(msg.sender, Ipv4Addr::UNSPECIFIED, "{stem}: sender");
        assert_eq!(encoded(&msg), wire, "{stem}");
        seen += 1;
    }
    assert!(seen >= 25, "only {seen} captured replies found");
}

fn squid_reply(name: &str) -> Message {
    icp::decode(&load(&format!("squid-{name}.recv"))).expect("Squid's reply decodes")
}

fn sent_query(name: &str) -> Message {
    icp::decode(&load(&format!("q-{name}.sent"))).expect("the sent query decodes")
}

/// Squid's well-formed answers are exactly `Message::reply(opcode, &query)`.
#[test]
fn squid_answers_are_message_reply() {
    for (name, opcode) in [
        ("miss", Opcode::Miss),
        ("hit", Opcode::Hit),
        ("denied", Opcode::Denied),
        ("hit-obj-flag", Opcode::Hit),
        ("reqnum-zero", Opcode::Miss),
        ("reqnum-max", Opcode::Miss),
        ("sender-requester-set", Opcode::Miss),
        ("bad-url-nospace", Opcode::Err),
        ("max-16383", Opcode::Err),
        ("upper-case", Opcode::Miss),
    ] {
        let query = sent_query(name);
        let expected = Message::reply(opcode, &query).unwrap();
        assert_eq!(squid_reply(name), expected, "{name}");
    }
    // The requester address and option data Squid ignores.
    let q = sent_query("sender-requester-set");
    assert_eq!(q.sender, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(q.option_data, 0x1234_5678);
    assert!(matches!(
        q.payload,
        Payload::Query { requester, .. } if requester == Ipv4Addr::new(10, 1, 2, 3)
    ));
    // The biggest datagram Squid takes: 16383 bytes; its ERR echoes the whole URL.
    assert_eq!(load("q-max-16383.sent").len(), MAX_DATAGRAM);
    assert_eq!(load("squid-max-16383.recv").len(), MAX_DATAGRAM - 4);
}

#[test]
fn squid_src_rtt_reply() {
    let query = sent_query("src-rtt");
    assert!(query.options.contains(Options::SRC_RTT));
    let reply = squid_reply("src-rtt");
    // Squid (query_icmp off, pinger off) still answered with rtt 1 ms, 0 hops.
    let mut expected = Message::reply(Opcode::Miss, &query).unwrap();
    expected.set_src_rtt(SrcRtt { hops: 0, rtt_ms: 1 });
    assert_eq!(reply, expected);
    assert_eq!((reply.options, reply.option_data), (Options::SRC_RTT, 1));
}

#[test]
fn squid_err_replies() {
    // Malformed payloads: ERR, empty URL, reqnum echoed (21 bytes).
    for (name, reqnum) in [
        ("no-nul", 10),
        ("trailing-after-nul", 11),
        ("two-nuls", 12),
        ("embedded-nul", 13),
        ("empty-url", 15),
        ("query-24", 18),
        ("query-22", 19),
        ("query-20", 20),
        ("query-21-nul", 21),
    ] {
        let wire = load(&format!("squid-{name}.recv"));
        assert_eq!(wire.len(), 21, "{name}");
        both_ways(&wire, &Message::malformed_query_err(reqnum));
    }
    // A URL with whitespace: ERR with the URL percent-escaped (the responder's job).
    assert_eq!(
        squid_reply("whitespace"),
        url_msg(Opcode::Err, 14, "http://127.0.0.1:18080/a%20b")
    );
    assert_eq!(
        squid_reply("bad-url"),
        url_msg(Opcode::Err, 16, "not%20a%20url")
    );
}

#[test]
fn squid_answers_v3_queries_in_v2() {
    // Squid answered these (then died with SIGSEGV); the answers are plain v2.
    assert_eq!(
        squid_reply("version-3").opcode,
        Opcode::Miss,
        "v3 query for an unknown URL"
    );
    assert_eq!(
        squid_reply("version-3-hit").opcode,
        Opcode::Hit,
        "v3 query for a cached URL"
    );
}

/// Not a test: writes every vector and a few encoded messages in text2pcap's input format, for
/// the manual tshark check described in tests/vectors/README.md.
#[test]
#[ignore = "manual: MESHCACHE_WIRE_TEXT2PCAP=FILE, then text2pcap + tshark"]
fn dump_text2pcap() {
    let Ok(path) = std::env::var("MESHCACHE_WIRE_TEXT2PCAP") else {
        return;
    };
    let mut packets: Vec<Vec<u8>> = [
        SPEC_A_QUERY,
        SPEC_B_MISS_RTT,
        SPEC_C_MISS_NOFETCH,
        SECHO,
        DECHO,
        HIT_OBJ,
        HIT_WITH_SENDER,
        SPEC_D_SQUID_QUERY,
        SPEC_E_SQUID_HIT,
        SPEC_F_SQUID_DENIED,
        SPEC_F_SQUID_ERR,
    ]
    .iter()
    .map(|v| bytes(v))
    .collect();
    let query = Message::query(7, "http://example.com/dump");
    for op in [
        Opcode::Hit,
        Opcode::Miss,
        Opcode::Err,
        Opcode::MissNoFetch,
        Opcode::Denied,
    ] {
        packets.push(encoded(&Message::reply(op, &query).unwrap()));
    }
    packets.push(encoded(&query));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".hex"))
        .collect();
    names.sort();
    for name in names {
        let wire = load(name.trim_end_matches(".hex"));
        if icp::decode(&wire).is_ok() {
            packets.push(wire);
        }
    }
    let mut text = String::new();
    for packet in &packets {
        for (i, chunk) in packet.chunks(16).enumerate() {
            text.push_str(&format!("{:06x}", i * 16));
            for b in chunk {
                text.push_str(&format!(" {b:02x}"));
            }
            text.push('\n');
        }
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    eprintln!("wrote {} packets to {path}", packets.len());
}
