//! The multicast search's query flag through the ICP codec.
//!
//! The byte vector is written out by hand from the layout in `meshcache_wire::multicast` (the
//! flag is ours; there is no other implementation to capture from) and checked both ways.

use meshcache_wire::directory::FORWARDED_QUERY;
use meshcache_wire::icp::{self, Message, Opcode, Options, HEADER_LEN};
use meshcache_wire::multicast::{self, is_multicast_query, MULTICAST_QUERY};
use meshcache_wire::{fuzz_icp_decode, WireError};

const URL: &[u8] = b"http://www.example.com/";

#[test]
fn the_flag_is_a_bit_of_its_own() {
    assert_eq!(MULTICAST_QUERY.bits(), 0x0080_0000);
    for other in [
        Options::HIT_OBJ,
        Options::SRC_RTT,
        Options::POINTER,
        FORWARDED_QUERY,
    ] {
        assert_eq!(MULTICAST_QUERY.bits() & other.bits(), 0, "{other:?}");
    }
}

#[test]
fn a_multicast_query_round_trips_through_icp() {
    #[rustfmt::skip]
    let wire: Vec<u8> = [
        &[0x01, 0x02, 0x00, 0x30][..], // QUERY, version 2, length 48
        &[0x00, 0x00, 0x00, 0x07],     // request number 7
        &[0x00, 0x80, 0x00, 0x00],     // options MULTICAST_QUERY
        &[0x00, 0x00, 0x00, 0x00],     // option data
        &[0x00, 0x00, 0x00, 0x00],     // sender
        &[0x00, 0x00, 0x00, 0x00],     // requester
        URL,
        &[0x00],
    ]
    .concat();
    let query = multicast::query(7, URL);
    assert_eq!(query.to_bytes().as_deref(), Ok(&wire[..]), "encode");
    let decoded = icp::decode(&wire).expect("decodes");
    assert_eq!(decoded, query, "decode");
    assert_eq!(decoded.encoded_len(), wire.len());
    assert_eq!(wire.len(), HEADER_LEN + 4 + URL.len() + 1);
    assert!(is_multicast_query(&decoded));
    fuzz_icp_decode(&wire);

    // With other flags alongside, both survive.
    let both = multicast::query(9, URL).with_options(Options::SRC_RTT);
    let bytes = both.to_bytes().expect("encodes");
    assert_eq!(bytes[8..12], [0x40, 0x80, 0x00, 0x00]);
    let back = icp::decode(&bytes).expect("decodes");
    assert!(back.options.contains(MULTICAST_QUERY) && back.options.contains(Options::SRC_RTT));
    assert_eq!(back, both);

    // An ordinary query is not one; neither is a reply, whatever its flags.
    assert!(!is_multicast_query(&Message::query(7, URL)));
    let mut hit = Message::reply(Opcode::Hit, &query).expect("a reply");
    assert!(hit.options.is_empty(), "the HIT carries no flag");
    hit.options = MULTICAST_QUERY;
    assert!(!is_multicast_query(&hit));

    // It stays an ICP query: not a directory or summary datagram.
    assert!(!meshcache_wire::directory::is_directory_opcode(wire[0]));
    assert_ne!(wire[0], meshcache_wire::summary::OPCODE_DIRUPDATE);
    assert_eq!(
        meshcache_wire::directory::decode(&wire),
        Err(WireError::NotDirectoryOpcode(1))
    );
}
