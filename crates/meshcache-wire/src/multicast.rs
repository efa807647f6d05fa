//! The multicast search (the Berkeley protocol of the directory-based DCM paper, §2): its one
//! addition to ICP v2, the [`MULTICAST_QUERY`] flag.
//!
//! A multicast search sends one ordinary `ICP_OP_QUERY` to an IP multicast group (or, where the
//! network cannot carry the group, the same query unicast to every member: a *logical*
//! multicast). The members that hold a fresh copy answer `ICP_OP_HIT`; the others stay silent,
//! which plain ICP cannot express (an ICP v2 responder answers every query). The flag tells the
//! receiver which behaviour is asked for, whichever way the query came:
//!
//! ```text
//! 01 02 00 30              opcode 1 (ICP_OP_QUERY), version 2, length 48
//! 00 00 00 07              request number 7
//! 00 80 00 00              options MULTICAST_QUERY
//! 00 00 00 00              option data 0
//! 00 00 00 00              sender 0.0.0.0
//! 00 00 00 00              requester 0.0.0.0
//! "http://www.example.com/" 00
//! ```
//!
//! Everything else about the query and its `ICP_OP_HIT` reply is plain ICP v2: the reply echoes
//! the request number and the URL, and goes to the address the query came from.
//!
//! ```
//! use meshcache_wire::icp::{self, Message};
//! use meshcache_wire::multicast::{self, MULTICAST_QUERY};
//!
//! let datagram = multicast::query(7, "http://www.example.com/").to_bytes()?;
//! assert_eq!(datagram[8..12], [0x00, 0x80, 0x00, 0x00]);
//! let received = icp::decode(&datagram)?;
//! assert!(multicast::is_multicast_query(&received));
//! assert!(received.options.contains(MULTICAST_QUERY));
//! # Ok::<(), meshcache_wire::WireError>(())
//! ```

use crate::icp::{Message, Opcode, Options};

/// The flag of an ICP `QUERY` sent by a multicast search: "answer only if you hold a fresh
/// copy (`ICP_OP_HIT`), and stay silent otherwise" — the Berkeley protocol's rule, where a
/// miss is never answered and the searcher's timeout ends the search.
///
/// Like [`crate::directory::FORWARDED_QUERY`] (0x0100_0000) it is not an ICP v2 flag: bit
/// 0x0080_0000 is unused by ICP (whose flags are the top three bits) and by Squid. It is sent
/// only to members of the multicast search (the group, or each member in turn), so Squid never
/// sees it; a responder that does not know it would answer every query, misses included,
/// which costs messages but no correctness. [`crate::icp::decode`] keeps it as received and
/// [`crate::icp::encode`] writes it back, like any option bit.
pub const MULTICAST_QUERY: Options = Options::from_bits(0x0080_0000);

/// A multicast search's query for `url`: an ICP v2 `QUERY` as Squid builds one (option data,
/// sender and requester 0) with the [`MULTICAST_QUERY`] flag.
pub fn query(reqnum: u32, url: impl Into<Vec<u8>>) -> Message {
    Message::query(reqnum, url).with_options(MULTICAST_QUERY)
}

/// Whether `msg` is a query that asks to be answered only on a hit.
pub fn is_multicast_query(msg: &Message) -> bool {
    msg.opcode == Opcode::Query && msg.options.contains(MULTICAST_QUERY)
}
