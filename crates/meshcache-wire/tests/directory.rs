//! Tests of the directory (dbDCM) codec and placement function.
//!
//! The byte vectors are written out by hand from the layout in `docs/protocols/directory.md`
//! (there is no other implementation to capture from) and checked both ways: decode gives the
//! expected message, and encoding that message gives the same bytes. Then every rejection,
//! batching, the forwarded-query flag through the ICP codec, property-tested round trips, the
//! fuzz target's body on random input, and the placement function (pinned values, minimal
//! movement, even shares).

use std::net::{Ipv4Addr, SocketAddrV4};

use meshcache_wire::directory::{
    self, encode_batches, is_directory_opcode, owner, owner_index, owner_score, Batches, DirData,
    DirGet, DirMessage, HolderOp, HolderUpdate, DEFAULT_BATCH_LEN, FORWARDED_QUERY, OPCODE_DIR_ADD,
    OPCODE_DIR_DATA, OPCODE_DIR_DEL, OPCODE_DIR_GET,
};
use meshcache_wire::icp::{self, Options, Payload, HEADER_LEN, MAX_DATAGRAM};
use meshcache_wire::{fuzz_directory_decode, fuzz_icp_decode, Verdict, WireError};
use proptest::prelude::*;

const URL: &[u8] = b"http://www.example.com/";

fn node(a: u8, b: u8, c: u8, d: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), port)
}

fn encode(msg: &DirMessage<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    directory::encode(msg, &mut out).expect("a valid message encodes");
    out
}

/// Checks a vector both ways.
fn both_ways(wire: &[u8], msg: &DirMessage<'_>) {
    assert_eq!(directory::decode(wire).as_ref(), Ok(msg), "decode");
    assert_eq!(encode(msg), wire, "encode");
    assert_eq!(msg.encoded_len(), wire.len(), "encoded_len");
    assert_eq!(msg.to_bytes().as_deref(), Ok(wire), "to_bytes");
    fuzz_directory_decode(wire);
}

/// Sets the length field to the datagram's size, for mutations that change the size.
fn fix_length(wire: &mut [u8]) {
    let len = wire.len() as u16;
    wire[2..4].copy_from_slice(&len.to_be_bytes());
}

fn get_vector() -> Vec<u8> {
    [
        &[0x0F, 0x02, 0x00, 0x32][..], // DIR_GET (15), version 2, length 50
        &[0x00, 0x00, 0x00, 0x2A],     // reqnum 42 (the search number)
        &[0x00, 0x00, 0x00, 0x03],     // options: OPTIMISTIC (0x1) | FORWARD (0x2)
        &[0x00, 0x00, 0x00, 0x02],     // option data: alpha = 2
        &[0x0A, 0x00, 0x00, 0x01],     // sender 10.0.0.1
        &[0x0A, 0x00, 0x00, 0x01],     // requester 10.0.0.1
        &[0x0C, 0x3A],                 //   port 3130
        b"http://www.example.com/",    // URL, 23 bytes
        &[0x00],                       // its NUL, the last byte
    ]
    .concat()
}

fn get_message() -> DirMessage<'static> {
    DirMessage::Get(DirGet {
        reqnum: 42,
        optimistic: true,
        forward: true,
        alpha: 2,
        sender: Ipv4Addr::new(10, 0, 0, 1),
        requester: node(10, 0, 0, 1, 3130),
        url: URL,
    })
}

fn data_vector() -> Vec<u8> {
    [
        &[0x10, 0x02, 0x00, 0x3A][..], // DIR_DATA (16), version 2, length 58
        &[0x00, 0x00, 0x00, 0x2A],     // reqnum 42, echoed
        &[0x00, 0x00, 0x00, 0x01],     // options: FORWARDED (0x1)
        &[0x00, 0x00, 0x00, 0x00],     // option data 0
        &[0x0A, 0x00, 0x00, 0x02],     // sender 10.0.0.2 (the owner)
        &[0x00, 0x02],                 // count 2
        &[0x0A, 0x00, 0x00, 0x03],     // node 1: 10.0.0.3
        &[0x0C, 0x3A],                 //   port 3130
        &[0xC0, 0xA8, 0x01, 0x14],     // node 2: 192.168.1.20
        &[0x12, 0xDB],                 //   port 4827
        b"http://www.example.com/",    // URL, 23 bytes
        &[0x00],                       // its NUL, the last byte
    ]
    .concat()
}

fn data_message() -> DirMessage<'static> {
    DirMessage::Data(DirData {
        reqnum: 42,
        forwarded: true,
        sender: Ipv4Addr::new(10, 0, 0, 2),
        nodes: vec![node(10, 0, 0, 3, 3130), node(192, 168, 1, 20, 4827)],
        url: URL,
    })
}

/// A store key with NUL bytes in it (first, inside and last): keys are raw, not NUL-framed.
const NUL_KEY: [u8; 16] = [
    0x00, 0x01, 0x00, 0x00, 0xDE, 0xAD, 0x00, 0xBE, 0xEF, 0x00, 0x00, 0x00, 0x7F, 0x80, 0xFF, 0x00,
];

fn add_vector() -> Vec<u8> {
    [
        &[0x11, 0x02, 0x00, 0x3A][..], // DIR_ADD (17), version 2, length 58 = 20 + 6 + 2 × 16
        &[0x01, 0x02, 0x03, 0x04],     // reqnum: sequence number 0x01020304
        &[0x00, 0x00, 0x00, 0x00],     // options 0
        &[0x00, 0x00, 0x00, 0x00],     // option data 0
        &[0x0A, 0x00, 0x00, 0x03],     // sender 10.0.0.3
        &[0x0A, 0x00, 0x00, 0x03],     // holder 10.0.0.3
        &[0x0C, 0x3A],                 //   port 3130
        &EXAMPLE_KEY,                  // key 1: MD5(0x01 || "http://www.example.com/")
        &NUL_KEY,                      // key 2, with NUL bytes; its last byte ends the datagram
    ]
    .concat()
}

fn add_update() -> HolderUpdate {
    HolderUpdate {
        seq: 0x0102_0304,
        sender: Ipv4Addr::new(10, 0, 0, 3),
        holder: node(10, 0, 0, 3, 3130),
        keys: vec![EXAMPLE_KEY, NUL_KEY],
    }
}

fn del_vector() -> Vec<u8> {
    [
        &[0x13, 0x02, 0x00, 0x2A][..], // DIR_DEL (19), version 2, length 42 = 20 + 6 + 16
        &[0xFF, 0xFF, 0xFF, 0xFF],     // reqnum: sequence number 2^32 - 1
        &[0x00, 0x00, 0x00, 0x00],     // options 0
        &[0x00, 0x00, 0x00, 0x00],     // option data 0
        &[0x00, 0x00, 0x00, 0x00],     // sender 0.0.0.0
        &[0x7F, 0x00, 0x00, 0x01],     // holder 127.0.0.1
        &[0x0C, 0x3B],                 //   port 3131
        &[0x00; 16],                   // key: all zero bytes
    ]
    .concat()
}

fn del_message() -> DirMessage<'static> {
    DirMessage::Del(HolderUpdate {
        seq: u32::MAX,
        sender: Ipv4Addr::UNSPECIFIED,
        holder: node(127, 0, 0, 1, 3131),
        keys: vec![[0; 16]],
    })
}

#[test]
fn dir_get_byte_for_byte() {
    both_ways(&get_vector(), &get_message());
    // No flags, alpha 0 (all candidates).
    let wire = [
        &[0x0F, 0x02, 0x00, 0x1C][..], // DIR_GET, version 2, length 28
        &[0x00, 0x00, 0x00, 0x01],     // reqnum 1
        &[0x00, 0x00, 0x00, 0x00],     // options: none (pessimistic, variant 1)
        &[0x00, 0x00, 0x00, 0x00],     // alpha 0 = all
        &[0x00, 0x00, 0x00, 0x00],     // sender 0.0.0.0
        &[0x0A, 0x00, 0x00, 0x09],     // requester 10.0.0.9
        &[0x00, 0x50],                 //   port 80
        b"u",                          // URL, 1 byte (the shortest)
        &[0x00],                       // NUL
    ]
    .concat();
    let msg = DirMessage::Get(DirGet {
        reqnum: 1,
        optimistic: false,
        forward: false,
        alpha: 0,
        sender: Ipv4Addr::UNSPECIFIED,
        requester: node(10, 0, 0, 9, 80),
        url: b"u",
    });
    both_ways(&wire, &msg);
    // Each flag alone.
    let mut optimistic = wire.clone();
    optimistic[11] = 0x01;
    let mut forward = wire;
    forward[11] = 0x02;
    let DirMessage::Get(m) = directory::decode(&optimistic).expect("decodes") else {
        panic!("not a DIR_GET")
    };
    assert!(m.optimistic && !m.forward);
    let DirMessage::Get(m) = directory::decode(&forward).expect("decodes") else {
        panic!("not a DIR_GET")
    };
    assert!(!m.optimistic && m.forward);
}

#[test]
fn dir_data_byte_for_byte() {
    both_ways(&data_vector(), &data_message());
    // An owner that knows no holder: count 0, not forwarded.
    let wire = [
        &[0x10, 0x02, 0x00, 0x2E][..], // DIR_DATA, version 2, length 46
        &[0x00, 0x00, 0x00, 0x07],     // reqnum 7
        &[0x00, 0x00, 0x00, 0x00],     // options: none
        &[0x00, 0x00, 0x00, 0x00],     // option data 0
        &[0x0A, 0x00, 0x00, 0x02],     // sender 10.0.0.2
        &[0x00, 0x00],                 // count 0
        b"http://www.example.com/",    // URL, 23 bytes
        &[0x00],                       // NUL
    ]
    .concat();
    let msg = DirMessage::Data(DirData {
        reqnum: 7,
        forwarded: false,
        sender: Ipv4Addr::new(10, 0, 0, 2),
        nodes: vec![],
        url: URL,
    });
    both_ways(&wire, &msg);
}

#[test]
fn dir_add_and_del_byte_for_byte() {
    both_ways(&add_vector(), &DirMessage::Add(add_update()));
    both_ways(&del_vector(), &del_message());
    // The same update as a DEL differs only in the opcode byte.
    let mut del = add_vector();
    del[0] = OPCODE_DIR_DEL;
    both_ways(&del, &DirMessage::Del(add_update()));
}

#[test]
fn message_accessors() {
    let msgs = [
        get_message(),
        data_message(),
        DirMessage::Add(add_update()),
        del_message(),
    ];
    let opcodes: Vec<u8> = msgs.iter().map(DirMessage::opcode).collect();
    assert_eq!(
        opcodes,
        [
            OPCODE_DIR_GET,
            OPCODE_DIR_DATA,
            OPCODE_DIR_ADD,
            OPCODE_DIR_DEL
        ]
    );
    assert_eq!(opcodes, [15, 16, 17, 19]);
    let reqnums: Vec<u32> = msgs.iter().map(DirMessage::reqnum).collect();
    assert_eq!(reqnums, [42, 42, 0x0102_0304, u32::MAX]);
    assert_eq!(msgs[1].sender(), Ipv4Addr::new(10, 0, 0, 2));
    for op in 0..=u8::MAX {
        assert_eq!(is_directory_opcode(op), matches!(op, 15 | 16 | 17 | 19));
    }
}

fn decode_err(wire: &[u8]) -> WireError {
    let err = directory::decode(wire).expect_err("a malformed datagram decoded");
    assert_eq!(err.verdict(), Verdict::Drop, "{err:?} would be answered");
    fuzz_directory_decode(wire);
    err
}

#[test]
fn short_datagrams_are_refused() {
    for len in 0..HEADER_LEN {
        assert_eq!(
            decode_err(&get_vector()[..len]),
            WireError::Truncated {
                need: HEADER_LEN,
                have: len
            }
        );
    }
    // Cut inside the fixed part, with the length field fixed up: `need` is the smallest
    // well-formed size.
    let cases: [(Vec<u8>, usize, usize); 3] = [
        (get_vector(), 25, 28),  // requester address cut short
        (data_vector(), 21, 24), // count cut short
        (add_vector(), 23, 42),  // holder address cut short
    ];
    for (vector, len, need) in cases {
        let mut wire = vector[..len].to_vec();
        fix_length(&mut wire);
        assert_eq!(decode_err(&wire), WireError::Truncated { need, have: len });
    }
    // Every proper prefix without fix-up fails the length check.
    for vector in [get_vector(), data_vector(), add_vector(), del_vector()] {
        for len in HEADER_LEN..vector.len() {
            assert_eq!(
                decode_err(&vector[..len]),
                WireError::LengthMismatch {
                    header: vector.len() as u16,
                    datagram: len
                }
            );
        }
    }
}

#[test]
fn header_errors_are_refused() {
    for version in [0, 1, 3, 0xFF] {
        let mut wire = get_vector();
        wire[1] = version;
        assert_eq!(decode_err(&wire), WireError::BadVersion(version));
    }
    let mut padded = add_vector();
    padded.push(0);
    assert_eq!(
        decode_err(&padded),
        WireError::LengthMismatch {
            header: 58,
            datagram: 59
        }
    );
    let mut lying = del_vector();
    lying[3] = 0x30;
    assert_eq!(
        decode_err(&lying),
        WireError::LengthMismatch {
            header: 0x30,
            datagram: 42
        }
    );
    let huge = vec![OPCODE_DIR_ADD; MAX_DATAGRAM + 1];
    assert_eq!(
        decode_err(&huge),
        WireError::TooLong {
            len: MAX_DATAGRAM + 1,
            max: MAX_DATAGRAM
        }
    );
    for opcode in [0, 1, 2, 3, 14, 18, 20, 21, 0xFF] {
        let mut wire = get_vector();
        wire[0] = opcode;
        assert_eq!(decode_err(&wire), WireError::NotDirectoryOpcode(opcode));
    }
}

#[test]
fn undefined_flags_and_option_data_are_refused() {
    let flag_cases = [
        (get_vector(), 0x0000_0004, 0x0000_0004),
        (get_vector(), 0x8000_0003, 0x8000_0000),
        (data_vector(), 0x0000_0002, 0x0000_0002),
        (data_vector(), 0x0001_0001, 0x0001_0000),
        (add_vector(), 0x0000_0001, 0x0000_0001),
        (del_vector(), 0x4000_0000, 0x4000_0000),
        // The forwarded-query flag belongs to ICP queries, not to directory messages.
        (get_vector(), 0x0100_0000, 0x0100_0000),
        (add_vector(), 0x0100_0000, 0x0100_0000),
    ];
    for (mut wire, options, bits) in flag_cases {
        wire[8..12].copy_from_slice(&u32::to_be_bytes(options));
        let opcode = wire[0];
        assert_eq!(
            decode_err(&wire),
            WireError::DirUnknownFlags { opcode, bits }
        );
    }
    for mut wire in [data_vector(), add_vector(), del_vector()] {
        wire[15] = 1;
        let opcode = wire[0];
        assert_eq!(
            decode_err(&wire),
            WireError::DirOptionData { opcode, value: 1 }
        );
    }
    // DIR_GET's option data is alpha: any value.
    let mut wire = get_vector();
    wire[12..16].copy_from_slice(&[0xFF; 4]);
    let DirMessage::Get(m) = directory::decode(&wire).expect("decodes") else {
        panic!("not a DIR_GET")
    };
    assert_eq!(m.alpha, u32::MAX);
}

/// `vector` with its payload from `at` on replaced by `tail`, length fixed up.
fn with_tail(vector: &[u8], at: usize, tail: &[u8]) -> Vec<u8> {
    let mut wire = [&vector[..at], tail].concat();
    fix_length(&mut wire);
    wire
}

#[test]
fn url_errors_are_refused() {
    let get = get_vector();
    let data = data_vector();
    // Offsets of the URL part: DIR_GET 26, DIR_DATA 22 + 6·2 = 34.
    let (g, d) = (26, 34);
    let (get_op, data_op) = (15, 16);
    let cases: Vec<(Vec<u8>, WireError)> = vec![
        // No NUL at the end.
        (
            with_tail(&get, g, b"http://a/"),
            WireError::DirMissingNul { opcode: get_op },
        ),
        (
            with_tail(&data, d, b"http://a/"),
            WireError::DirMissingNul { opcode: data_op },
        ),
        // An extra NUL.
        (
            with_tail(&get, g, b"http://a/\0\0"),
            WireError::DirTrailingBytes {
                opcode: get_op,
                extra: 1,
            },
        ),
        (
            with_tail(&data, d, b"http://a/\0\0"),
            WireError::DirTrailingBytes {
                opcode: data_op,
                extra: 1,
            },
        ),
        // Trailing bytes after the URL's NUL (a second URL, junk, a NUL inside the URL).
        (
            with_tail(&get, g, b"http://a/\0http://b/\0"),
            WireError::DirTrailingBytes {
                opcode: get_op,
                extra: 10,
            },
        ),
        (
            with_tail(&get, g, b"http://a/\0junk"),
            WireError::DirTrailingBytes {
                opcode: get_op,
                extra: 4,
            },
        ),
        (
            with_tail(&data, d, b"http\0://a/\0"),
            WireError::DirTrailingBytes {
                opcode: data_op,
                extra: 6,
            },
        ),
        // Empty URLs.
        (
            with_tail(&get, g, b"\0"),
            WireError::DirEmptyUrl { opcode: get_op },
        ),
        (
            with_tail(&data, d, b"\0"),
            WireError::DirEmptyUrl { opcode: data_op },
        ),
        // No URL at all.
        (
            with_tail(&get, g, b""),
            WireError::DirNoUrl { opcode: get_op },
        ),
        (
            with_tail(&data, d, b""),
            WireError::DirNoUrl { opcode: data_op },
        ),
    ];
    for (wire, want) in cases {
        assert_eq!(decode_err(&wire), want, "{wire:02x?}");
    }
}

#[test]
fn key_list_errors_are_refused() {
    let add = add_vector();
    let del = del_vector();
    // The keys start after the header and the holder address.
    let h = 26;
    let (add_op, del_op) = (17, 19);
    let two_keys = [EXAMPLE_KEY, NUL_KEY].concat();
    let cases: Vec<(Vec<u8>, WireError)> = vec![
        // No key at all: the datagram ends with the holder address.
        (
            with_tail(&add, h, b""),
            WireError::DirNoKeys { opcode: add_op },
        ),
        (
            with_tail(&del, h, b""),
            WireError::DirNoKeys { opcode: del_op },
        ),
        // A partial key alone: `extra` is the bytes after the holder mod 16.
        (
            with_tail(&add, h, &[0x00]),
            WireError::DirTrailingBytes {
                opcode: add_op,
                extra: 1,
            },
        ),
        (
            with_tail(&del, h, &EXAMPLE_KEY[..15]),
            WireError::DirTrailingBytes {
                opcode: del_op,
                extra: 15,
            },
        ),
        // Whole keys then a partial one.
        (
            with_tail(&add, h, &[&EXAMPLE_KEY[..], &[0xAB]].concat()),
            WireError::DirTrailingBytes {
                opcode: add_op,
                extra: 1,
            },
        ),
        (
            with_tail(&add, h, &two_keys[..31]),
            WireError::DirTrailingBytes {
                opcode: add_op,
                extra: 15,
            },
        ),
        // Trailing bytes after the last whole key: a NUL terminator, padding.
        (
            with_tail(&del, h, &[&[0u8; 16][..], &[0]].concat()),
            WireError::DirTrailingBytes {
                opcode: del_op,
                extra: 1,
            },
        ),
        (
            with_tail(&add, h, &[&two_keys[..], &[0, 0, 0]].concat()),
            WireError::DirTrailingBytes {
                opcode: add_op,
                extra: 3,
            },
        ),
        // The old URL-list layout: URL, NUL.
        (
            with_tail(&add, h, b"http://a/\0"),
            WireError::DirTrailingBytes {
                opcode: add_op,
                extra: 10,
            },
        ),
    ];
    for (wire, want) in cases {
        assert_eq!(decode_err(&wire), want, "{wire:02x?}");
    }
    // Any bytes at all make a key, NUL included; 1, 2 and 3 keys decode.
    for n in 1..=3 {
        let body: Vec<u8> = (0..16 * n).map(|i| (i % 3) as u8).collect();
        let wire = with_tail(&del, h, &body);
        let DirMessage::Del(update) = directory::decode(&wire).expect("decodes") else {
            panic!("not a DIR_DEL")
        };
        assert_eq!(update.keys.len(), n);
        assert_eq!(update.keys.concat(), body);
        both_ways(&wire, &DirMessage::Del(update));
    }
}

#[test]
fn a_count_larger_than_the_payload_is_refused() {
    // The vector has 2 nodes and a 24-byte URL part (36 bytes after the count).
    let mut wire = data_vector();
    wire[20..22].copy_from_slice(&10u16.to_be_bytes());
    assert_eq!(
        decode_err(&wire),
        WireError::Truncated {
            need: 20 + 2 + 60 + 2,
            have: 58
        }
    );
    wire[20..22].copy_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(
        decode_err(&wire),
        WireError::Truncated {
            need: 20 + 2 + 6 * 65_535 + 2,
            have: 58
        }
    );
    // Exactly enough bytes for the nodes and none for the URL.
    wire[20..22].copy_from_slice(&6u16.to_be_bytes());
    assert_eq!(decode_err(&wire), WireError::DirNoUrl { opcode: 16 });
    // A count that leaves part of a node before the URL's NUL.
    let wire = with_tail(&data_vector(), 20, &[0x00, 0x01, 0x0A, 0x00, 0x00]);
    assert_eq!(
        decode_err(&wire),
        WireError::Truncated {
            need: 20 + 2 + 6 + 2,
            have: 25
        }
    );
}

#[test]
fn encode_refuses_and_writes_nothing() {
    let mut out = vec![0xAA];
    let get = |url: &'static [u8]| {
        DirMessage::Get(DirGet {
            reqnum: 1,
            optimistic: false,
            forward: false,
            alpha: 0,
            sender: Ipv4Addr::UNSPECIFIED,
            requester: node(10, 0, 0, 1, 3130),
            url,
        })
    };
    assert_eq!(
        directory::encode(&get(b""), &mut out),
        Err(WireError::DirEmptyUrl { opcode: 15 })
    );
    assert_eq!(
        directory::encode(&get(b"http://a/\0b"), &mut out),
        Err(WireError::UrlContainsNul { at: 9 })
    );
    let DirMessage::Data(mut data) = data_message() else {
        unreachable!()
    };
    data.url = b"";
    assert_eq!(
        directory::encode(&DirMessage::Data(data.clone()), &mut out),
        Err(WireError::DirEmptyUrl { opcode: 16 })
    );
    data.url = b"u";
    data.nodes = vec![node(1, 2, 3, 4, 5); 2727];
    assert_eq!(
        directory::encode(&DirMessage::Data(data.clone()), &mut out),
        Err(WireError::TooLong {
            len: MAX_DATAGRAM + 3,
            max: MAX_DATAGRAM
        })
    );
    // 2,726 nodes and a one-byte URL fit: 20 + 2 + 6 × 2,726 + 2 = 16,380 bytes.
    data.nodes.truncate(2726);
    let wire = encode(&DirMessage::Data(data.clone()));
    assert_eq!(wire.len(), 16_380);
    assert_eq!(directory::decode(&wire), Ok(DirMessage::Data(data)));

    let mut update = add_update();
    update.keys.clear();
    assert_eq!(
        directory::encode(&DirMessage::Add(update.clone()), &mut out),
        Err(WireError::DirNoKeys { opcode: 17 })
    );
    assert_eq!(
        directory::encode(&DirMessage::Del(update.clone()), &mut out),
        Err(WireError::DirNoKeys { opcode: 19 })
    );
    // 1,023 keys are 20 + 6 + 16 × 1,023 = 16,394 bytes, too many.
    update.keys = vec![NUL_KEY; 1023];
    assert_eq!(
        directory::encode(&DirMessage::Del(update.clone()), &mut out),
        Err(WireError::TooLong {
            len: 16_394,
            max: MAX_DATAGRAM
        })
    );
    // 1,022 fit: 16,378 bytes.
    update.keys.truncate(1022);
    let wire = encode(&DirMessage::Del(update.clone()));
    assert_eq!(wire.len(), 16_378);
    assert_eq!(directory::decode(&wire), Ok(DirMessage::Del(update)));

    let long = vec![b'a'; MAX_DATAGRAM - 26];
    let msg = DirMessage::Get(DirGet {
        reqnum: 1,
        optimistic: false,
        forward: false,
        alpha: 0,
        sender: Ipv4Addr::UNSPECIFIED,
        requester: node(10, 0, 0, 1, 3130),
        url: &long,
    });
    assert_eq!(
        directory::encode(&msg, &mut out),
        Err(WireError::TooLong {
            len: MAX_DATAGRAM + 1,
            max: MAX_DATAGRAM
        })
    );
    assert_eq!(out, [0xAA]);
    // One byte less is the largest DIR_GET.
    let DirMessage::Get(mut get) = msg else {
        unreachable!()
    };
    get.url = &long[1..];
    let wire = encode(&DirMessage::Get(get.clone()));
    assert_eq!(wire.len(), MAX_DATAGRAM);
    assert_eq!(directory::decode(&wire), Ok(DirMessage::Get(get)));
}

fn decode_batch(wire: &[u8]) -> (HolderOp, HolderUpdate) {
    match directory::decode(wire) {
        Ok(DirMessage::Add(m)) => (HolderOp::Add, m),
        Ok(DirMessage::Del(m)) => (HolderOp::Del, m),
        other => panic!("not a holder update: {other:?}"),
    }
}

#[test]
fn batches_byte_for_byte() {
    let holder = node(10, 0, 0, 3, 3130);
    let sender = *holder.ip();
    // (60 − 26) / 16 = 2 keys per datagram.
    let keys = [EXAMPLE_KEY, NUL_KEY, [0; 16]];
    let mut out = vec![b"earlier".to_vec()];
    let report = encode_batches(HolderOp::Del, u32::MAX, sender, holder, &keys, 60, &mut out)
        .expect("batches");
    assert_eq!(
        report,
        Batches {
            datagrams: 2,
            next_seq: 1,
            skipped: 0
        }
    );
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], b"earlier");
    let want = [
        [
            &[0x13, 0x02, 0x00, 0x3A][..], // DIR_DEL, version 2, length 58
            &[0xFF, 0xFF, 0xFF, 0xFF],     // seq 2^32 - 1 (first_seq)
            &[0; 8],                       // options 0, option data 0
            &[0x0A, 0x00, 0x00, 0x03],     // sender 10.0.0.3
            &[0x0A, 0x00, 0x00, 0x03],     // holder 10.0.0.3
            &[0x0C, 0x3A],                 //   port 3130
            &EXAMPLE_KEY,                  // two keys, in order
            &NUL_KEY,
        ]
        .concat(),
        [
            &[0x13, 0x02, 0x00, 0x2A][..], // length 42
            &[0x00, 0x00, 0x00, 0x00],     // seq wraps to 0
            &[0; 8],
            &[0x0A, 0x00, 0x00, 0x03],
            &[0x0A, 0x00, 0x00, 0x03],
            &[0x0C, 0x3A],
            &[0; 16], // the third key
        ]
        .concat(),
    ];
    assert_eq!(out[1..], want);
    for wire in &out[1..] {
        fuzz_directory_decode(wire);
    }
    // The first two keys as one DIR_ADD at the default limit give the ADD vector.
    let mut out = Vec::new();
    let report = encode_batches(
        HolderOp::Add,
        0x0102_0304,
        sender,
        holder,
        &keys[..2],
        DEFAULT_BATCH_LEN,
        &mut out,
    )
    .expect("batches");
    assert_eq!(report.datagrams, 1);
    assert_eq!(out, [add_vector()]);
}

#[test]
fn batches_hold_90_keys_at_the_default_limit() {
    let holder = node(192, 168, 1, 20, 4827);
    let sender = Ipv4Addr::new(192, 168, 1, 20);
    let all = keys(200, 1);
    let mut out = Vec::new();
    let report = encode_batches(
        HolderOp::Add,
        u32::MAX - 1,
        sender,
        holder,
        &all,
        DEFAULT_BATCH_LEN,
        &mut out,
    )
    .expect("batches");
    assert_eq!(
        report,
        Batches {
            datagrams: 3,
            next_seq: 1,
            skipped: 0
        }
    );
    let lens: Vec<usize> = out.iter().map(Vec::len).collect();
    // 26 + 90 × 16 = 1466 (the six bytes left over cannot hold a key), then 20 keys.
    assert_eq!(lens, [1466, 1466, 346]);
    let mut seen = Vec::new();
    for (wire, seq) in out.iter().zip([u32::MAX - 1, u32::MAX, 0]) {
        let (op, update) = decode_batch(wire);
        assert_eq!(op, HolderOp::Add);
        assert_eq!(update.seq, seq);
        assert_eq!(update.sender, sender);
        assert_eq!(update.holder, holder);
        seen.extend(update.keys);
    }
    assert_eq!(seen, all);

    // At the largest datagram: 1,022 keys each.
    let mut out = Vec::new();
    let report = encode_batches(
        HolderOp::Del,
        0,
        sender,
        holder,
        &keys(2045, 2),
        MAX_DATAGRAM,
        &mut out,
    )
    .expect("batches");
    assert_eq!(report.datagrams, 3);
    let lens: Vec<usize> = out.iter().map(Vec::len).collect();
    assert_eq!(lens, [16_378, 16_378, 42]);
}

#[test]
fn batches_below_one_key_skip_everything() {
    let holder = node(10, 0, 0, 3, 3130);
    let sender = *holder.ip();
    let keys = [EXAMPLE_KEY, NUL_KEY, [0; 16]];
    // 42 bytes hold exactly one key.
    let mut out = Vec::new();
    let report =
        encode_batches(HolderOp::Add, 5, sender, holder, &keys, 42, &mut out).expect("batches");
    assert_eq!(
        report,
        Batches {
            datagrams: 3,
            next_seq: 8,
            skipped: 0
        }
    );
    assert!(out.iter().all(|wire| wire.len() == 42));
    // 57 bytes still hold one key only.
    let mut out = Vec::new();
    let report =
        encode_batches(HolderOp::Add, 5, sender, holder, &keys, 57, &mut out).expect("batches");
    assert_eq!(report.datagrams, 3);
    // Under 42 none fits: nothing is sent, every key is skipped, the sequence is not used.
    for max_len in [0, 1, 20, 26, 41] {
        let mut out = vec![b"earlier".to_vec()];
        assert_eq!(
            encode_batches(HolderOp::Del, 5, sender, holder, &keys, max_len, &mut out),
            Ok(Batches {
                datagrams: 0,
                next_seq: 5,
                skipped: 3
            })
        );
        assert_eq!(out, [b"earlier"]);
    }
    // No keys: no datagrams.
    let mut out = Vec::new();
    assert_eq!(
        encode_batches(HolderOp::Add, 9, sender, holder, &[], 1472, &mut out),
        Ok(Batches {
            datagrams: 0,
            next_seq: 9,
            skipped: 0
        })
    );
    assert!(out.is_empty());
}

#[test]
fn batches_refuse_an_oversized_limit_and_append_nothing() {
    let holder = node(10, 0, 0, 3, 3130);
    let sender = *holder.ip();
    let mut out = Vec::new();
    for keys in [&[EXAMPLE_KEY][..], &[]] {
        assert_eq!(
            encode_batches(
                HolderOp::Add,
                0,
                sender,
                holder,
                keys,
                MAX_DATAGRAM + 1,
                &mut out
            ),
            Err(WireError::TooLong {
                len: MAX_DATAGRAM + 1,
                max: MAX_DATAGRAM
            })
        );
    }
    assert!(out.is_empty());
}

// ---------------------------------------------------------------------------------------------
// The forwarded-query flag.

#[test]
fn forwarded_query_round_trips_through_icp() {
    assert_eq!(FORWARDED_QUERY.bits(), 0x0100_0000);
    // Not one of ICP's flags.
    for flag in [Options::HIT_OBJ, Options::SRC_RTT, Options::POINTER] {
        assert!(!FORWARDED_QUERY.contains(flag) && !flag.contains(FORWARDED_QUERY));
    }
    let requester = node(10, 0, 0, 9, 3131);
    for extra in [Options::NONE, Options::SRC_RTT] {
        let mut query = icp::Message::query(77, URL).with_options(FORWARDED_QUERY | extra);
        query.option_data = u32::from(requester.port());
        query.sender = Ipv4Addr::new(10, 0, 0, 2); // the owner that forwards it
        query.payload = Payload::Query {
            requester: *requester.ip(),
            url: URL.to_vec(),
        };
        let mut wire = Vec::new();
        icp::encode(&query, &mut wire).expect("encodes");
        assert_eq!(wire.len(), HEADER_LEN + 4 + URL.len() + 1);
        assert_eq!(wire[0], 1, "an ICP_OP_QUERY");
        assert_eq!(
            wire[8..12],
            (0x0100_0000 | extra.bits()).to_be_bytes(),
            "options"
        );
        assert_eq!(
            wire[12..16],
            [0x00, 0x00, 0x0C, 0x3B],
            "option data: port 3131"
        );
        assert_eq!(wire[16..20], [10, 0, 0, 2], "sender: the owner");
        assert_eq!(wire[20..24], [10, 0, 0, 9], "requester host address");
        let decoded = icp::decode(&wire).expect("decodes");
        assert_eq!(decoded, query);
        assert!(decoded.options.contains(FORWARDED_QUERY));
        assert_eq!(decoded.option_data, 3131);
        assert!(matches!(
            decoded.payload,
            Payload::Query { requester: r, .. } if r == Ipv4Addr::new(10, 0, 0, 9)
        ));
        fuzz_icp_decode(&wire);
        // It is an ICP query, not a directory message.
        assert!(!is_directory_opcode(wire[0]));
        assert_eq!(
            directory::decode(&wire),
            Err(WireError::NotDirectoryOpcode(1))
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests.

/// URL bytes: anything but NUL, non-empty, usually short.
fn url() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(1u8..=255, 1..120),
        1 => proptest::collection::vec(1u8..=255, 1..4000),
    ]
}

/// Store keys: uniform bytes, or mostly NUL bytes (keys are raw, not NUL-framed).
fn key() -> impl Strategy<Value = [u8; 16]> {
    prop_oneof![
        any::<[u8; 16]>(),
        proptest::array::uniform16(prop_oneof![3 => Just(0u8), 1 => any::<u8>()]),
    ]
}

fn addr() -> impl Strategy<Value = SocketAddrV4> {
    (any::<u32>(), any::<u16>()).prop_map(|(ip, port)| SocketAddrV4::new(Ipv4Addr::from(ip), port))
}

/// The owned parts of any directory message; [`Parts::message`] borrows them.
#[derive(Debug, Clone)]
struct Parts {
    kind: u8,
    reqnum: u32,
    flags: (bool, bool),
    alpha: u32,
    sender: Ipv4Addr,
    addr: SocketAddrV4,
    nodes: Vec<SocketAddrV4>,
    url: Vec<u8>,
    keys: Vec<[u8; 16]>,
}

impl Parts {
    fn update(&self) -> HolderUpdate {
        HolderUpdate {
            seq: self.reqnum,
            sender: self.sender,
            holder: self.addr,
            keys: self.keys.clone(),
        }
    }

    fn message(&self) -> DirMessage<'_> {
        match self.kind {
            0 => DirMessage::Get(DirGet {
                reqnum: self.reqnum,
                optimistic: self.flags.0,
                forward: self.flags.1,
                alpha: self.alpha,
                sender: self.sender,
                requester: self.addr,
                url: &self.url,
            }),
            1 => DirMessage::Data(DirData {
                reqnum: self.reqnum,
                forwarded: self.flags.0,
                sender: self.sender,
                nodes: self.nodes.clone(),
                url: &self.url,
            }),
            2 => DirMessage::Add(self.update()),
            _ => DirMessage::Del(self.update()),
        }
    }
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        0u8..4,
        any::<u32>(),
        any::<(bool, bool)>(),
        any::<u32>(),
        any::<u32>().prop_map(Ipv4Addr::from),
        addr(),
        proptest::collection::vec(addr(), 0..40),
        url(),
        prop_oneof![
            8 => proptest::collection::vec(key(), 1..12),
            1 => proptest::collection::vec(key(), 1..1023),
        ],
    )
        .prop_map(
            |(kind, reqnum, flags, alpha, sender, addr, nodes, url, keys)| Parts {
                kind,
                reqnum,
                flags,
                alpha,
                sender,
                addr,
                nodes,
                url,
                keys,
            },
        )
        .prop_filter("fits in a datagram", |p| {
            p.message().encoded_len() <= MAX_DATAGRAM
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decode_inverts_encode(p in parts()) {
        let msg = p.message();
        let wire = encode(&msg);
        prop_assert_eq!(wire.len(), msg.encoded_len());
        prop_assert_eq!(usize::from(u16::from_be_bytes([wire[2], wire[3]])), wire.len());
        prop_assert_eq!(directory::decode(&wire), Ok(msg));
        fuzz_directory_decode(&wire);
    }

    /// Every proper prefix is refused; with the length fixed up, still refused.
    #[test]
    fn truncation_is_refused(p in parts(), cut in 1usize..64) {
        let wire = encode(&p.message());
        let len = wire.len().saturating_sub(cut);
        prop_assert!(directory::decode(&wire[..len]).is_err());
        if len >= HEADER_LEN {
            let mut fixed = wire[..len].to_vec();
            fix_length(&mut fixed);
            // A DIR_DATA cut inside its URL can never be valid; neither can a GET. A holder
            // update cut exactly between two of its keys is a valid shorter update.
            let result = directory::decode(&fixed);
            let cut_between_keys = p.kind >= 2 && len >= 42 && (len - 26) % 16 == 0;
            prop_assert_eq!(result.is_ok(), cut_between_keys, "{:?}", result);
            fuzz_directory_decode(&fixed);
        }
    }

    /// Appended bytes are refused, with or without the length fixed up.
    #[test]
    fn extra_bytes_are_refused(p in parts(), extra in proptest::collection::vec(1u8..=255, 1..16)) {
        let mut wire = encode(&p.message());
        wire.extend_from_slice(&extra);
        prop_assert!(directory::decode(&wire).is_err());
        if wire.len() <= MAX_DATAGRAM {
            fix_length(&mut wire);
            // Non-NUL bytes after a URL's final NUL, or fewer than 16 after the last key: never
            // a valid datagram.
            prop_assert!(directory::decode(&wire).is_err());
        }
    }

    /// Batching then decoding gives back the keys in order, within the size limit.
    #[test]
    fn batches_round_trip(
        keys in proptest::collection::vec(key(), 0..400),
        max_len in prop_oneof![1 => 0usize..60, 4 => 0usize..=MAX_DATAGRAM],
        first_seq in any::<u32>(),
        del in any::<bool>(),
        holder in addr(),
        sender in any::<u32>().prop_map(Ipv4Addr::from),
    ) {
        let op = if del { HolderOp::Del } else { HolderOp::Add };
        let mut out = Vec::new();
        let report = encode_batches(op, first_seq, sender, holder, &keys, max_len, &mut out)
            .expect("a limit within MAX_DATAGRAM batches");
        prop_assert_eq!(report.datagrams, out.len());
        prop_assert_eq!(report.next_seq, first_seq.wrapping_add(out.len() as u32));
        let per = max_len.saturating_sub(26) / 16;
        if per == 0 {
            prop_assert_eq!(report.skipped, keys.len());
            prop_assert!(out.is_empty());
            return Ok(());
        }
        prop_assert_eq!(report.skipped, 0);
        prop_assert_eq!(out.len(), keys.len().div_ceil(per));
        let mut seen = Vec::new();
        for (i, wire) in out.iter().enumerate() {
            prop_assert!(wire.len() <= max_len);
            let (got_op, update) = decode_batch(wire);
            prop_assert_eq!(got_op, op);
            prop_assert_eq!(update.seq, first_seq.wrapping_add(i as u32));
            prop_assert_eq!(update.sender, sender);
            prop_assert_eq!(update.holder, holder);
            // Full: every datagram but the last carries as many keys as fit.
            if i + 1 < out.len() {
                prop_assert_eq!(update.keys.len(), per);
            }
            seen.extend(update.keys);
        }
        prop_assert_eq!(seen, keys);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// The fuzz target's body on arbitrary bytes: never panics (and checks its own oracles).
    #[test]
    fn fuzz_body_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..128)) {
        fuzz_directory_decode(&data);
    }

    /// Arbitrary bytes behind a plausible header (directory opcode, version 2, right length,
    /// few flags), so the payload rules get exercised rather than the header checks.
    #[test]
    fn fuzz_body_on_plausible_headers(
        op in proptest::sample::select(vec![15u8, 16, 17, 19]),
        reqnum in any::<u32>(),
        options in prop_oneof![4 => Just(0u32), 1 => 0u32..4],
        option_data in prop_oneof![4 => Just(0u32), 1 => any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        // About one byte in four a NUL, so URL boundaries land in interesting places.
        let body: Vec<u8> = body.into_iter().map(|b| if b < 64 { 0 } else { b }).collect();
        let len = HEADER_LEN + body.len();
        let mut wire = vec![op, 2];
        wire.extend_from_slice(&(len as u16).to_be_bytes());
        wire.extend_from_slice(&reqnum.to_be_bytes());
        wire.extend_from_slice(&options.to_be_bytes());
        wire.extend_from_slice(&option_data.to_be_bytes());
        wire.extend_from_slice(&[10, 0, 0, 1]);
        wire.extend_from_slice(&body);
        fuzz_directory_decode(&wire);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Valid datagrams with random byte edits, insertions and deletions.
    #[test]
    fn fuzz_body_on_mutated_datagrams(
        p in parts(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        fix in any::<bool>(),
    ) {
        let mut wire = encode(&p.message());
        for (at, byte, kind) in edits {
            let pos = at.index(wire.len() + 1);
            match kind {
                0 if pos < wire.len() => wire[pos] = byte,
                1 => wire.insert(pos, byte),
                _ if pos < wire.len() => { wire.remove(pos); }
                _ => wire.push(byte),
            }
        }
        if fix && wire.len() >= 4 && wire.len() <= MAX_DATAGRAM {
            fix_length(&mut wire);
        }
        fuzz_directory_decode(&wire);
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
        22,
        25,
        26,
        27,
        28,
        41,
        42,
        43,
        57,
        58,
        MAX_DATAGRAM,
        MAX_DATAGRAM + 1,
        70_000,
    ] {
        fuzz_directory_decode(&vec![0; len]);
        fuzz_directory_decode(&vec![0xFF; len]);
        for op in [15u8, 16, 17, 19] {
            for fill in [0u8, 1, b'a'] {
                let mut plausible = vec![fill; len];
                if len >= 20 {
                    plausible[0] = op;
                    plausible[1] = 2;
                    plausible[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                    plausible[8..16].fill(0);
                }
                if let Some(last) = plausible.last_mut() {
                    *last = 0;
                }
                fuzz_directory_decode(&plausible);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Placement.

/// `MD5(0x01 || "http://www.example.com/")`, the store key of a GET of that URL.
const EXAMPLE_KEY: [u8; 16] = [
    0xf3, 0x29, 0x9b, 0xe1, 0x5c, 0x55, 0xcd, 0xa9, 0x29, 0xc4, 0xad, 0x1f, 0xbc, 0x90, 0xf5, 0xc2,
];

const MEMBERS: [&str; 4] = [
    "10.0.0.1:3130",
    "10.0.0.2:3130",
    "10.0.0.3:3130",
    "10.0.0.4:3130",
];

/// Pinned values, computed with an independent implementation of the formula in the module
/// documentation. If one changes, members running different versions disagree on owners.
#[test]
fn placement_vectors() {
    // Only the first 8 bytes of the key count.
    let mut other_tail = EXAMPLE_KEY;
    other_tail[8..].fill(0);
    let scores: Vec<u64> = MEMBERS
        .iter()
        .map(|m| owner_score(m, &EXAMPLE_KEY))
        .collect();
    assert_eq!(
        scores,
        [
            0x92f9_9373_51e6_7cb6,
            0x9d34_38c1_86db_c858,
            0xf374_e0a2_707a_91a7,
            0x130d_1645_cfc7_5458,
        ]
    );
    assert_eq!(owner_score(MEMBERS[2], &other_tail), scores[2]);
    assert_eq!(owner(MEMBERS, &EXAMPLE_KEY), Some("10.0.0.3:3130"));
    assert_eq!(owner_index(&MEMBERS, &EXAMPLE_KEY), Some(2));

    let zero = [0u8; 16];
    assert_eq!(owner_score("", &zero), 0xf52a_15e9_a9b5_e89b);
    assert_eq!(owner_score(MEMBERS[3], &zero), 0xde48_8f4f_4723_fd9b);
    assert_eq!(owner(MEMBERS, &zero), Some("10.0.0.4:3130"));

    let counting: [u8; 16] = std::array::from_fn(|i| i as u8);
    assert_eq!(owner_score(MEMBERS[0], &counting), 0xa19e_d942_355d_2845);
    assert_eq!(owner(MEMBERS, &counting), Some("10.0.0.3:3130"));

    // MD5(0x01 || "http://www.example.com/a") and MD5(0x01 || "http://www.example.org/").
    let a: [u8; 16] = [
        0x43, 0xfe, 0x23, 0x8d, 0x13, 0x45, 0xa8, 0x1b, 0xd9, 0x88, 0x67, 0x9d, 0x82, 0x67, 0xe3,
        0xeb,
    ];
    let org: [u8; 16] = [
        0xae, 0x76, 0x18, 0xc0, 0x0a, 0xc8, 0x0d, 0x03, 0xb5, 0xba, 0x24, 0x11, 0x66, 0x40, 0x22,
        0x2f,
    ];
    assert_eq!(owner(MEMBERS, &a), Some("10.0.0.1:3130"));
    assert_eq!(owner(MEMBERS, &org), Some("10.0.0.2:3130"));
}

#[test]
fn placement_edge_cases() {
    assert_eq!(owner(std::iter::empty(), &EXAMPLE_KEY), None);
    assert_eq!(owner_index::<&str>(&[], &EXAMPLE_KEY), None);
    assert_eq!(owner(["only"], &EXAMPLE_KEY), Some("only"));
    // Order does not matter; a repeated name counts once (the first index wins).
    let mut reversed = MEMBERS;
    reversed.reverse();
    assert_eq!(owner(reversed, &EXAMPLE_KEY), Some("10.0.0.3:3130"));
    let repeated = ["10.0.0.3:3130", "10.0.0.1:3130", "10.0.0.3:3130"];
    assert_eq!(owner_index(&repeated, &EXAMPLE_KEY), Some(0));
    let owned: Vec<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    assert_eq!(owner_index(&owned, &EXAMPLE_KEY), Some(2));
}

/// Deterministic, well-mixed 16-byte keys standing in for MD5 keys (splitmix64).
fn keys(n: usize, seed: u64) -> Vec<[u8; 16]> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&next().to_be_bytes());
            key[8..].copy_from_slice(&next().to_be_bytes());
            key
        })
        .collect()
}

#[test]
fn shares_are_even() {
    let members: Vec<String> = (1..=16).map(|i| format!("10.0.0.{i}:3130")).collect();
    let mut counts = [0usize; 16];
    let total = 32_000;
    for key in keys(total, 7) {
        let index = owner_index(&members, &key).expect("members");
        counts[index] += 1;
    }
    let expected = total / members.len();
    for (member, count) in members.iter().zip(counts) {
        assert!(
            count.abs_diff(expected) * 4 <= expected,
            "{member} owns {count} of {total}, expected {expected} ± 25%: {counts:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Removing one member moves only the URLs it owned; adding it back restores them all.
    #[test]
    fn removing_a_member_moves_only_its_urls(
        n in 2usize..24,
        removed in any::<proptest::sample::Index>(),
        seed in any::<u64>(),
    ) {
        let members: Vec<String> = (0..n).map(|i| format!("cache-{i}.example.net")).collect();
        let removed = removed.index(n);
        let rest: Vec<&str> = members
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != removed)
            .map(|(_, m)| m.as_str())
            .collect();
        let mut moved = 0;
        for key in keys(300, seed) {
            let before = owner(members.iter().map(String::as_str), &key).expect("members");
            let after = owner(rest.iter().copied(), &key).expect("members");
            if before == members[removed] {
                prop_assert_ne!(after, before);
                moved += 1;
            } else {
                prop_assert_eq!(after, before);
            }
            // The index variant agrees.
            prop_assert_eq!(owner_index(&members, &key).map(|i| members[i].as_str()), Some(before));
        }
        prop_assert!(moved < 300);
    }
}
