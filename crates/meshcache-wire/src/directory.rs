//! Directory-based DCM (dbDCM) messages, and the placement function that says which member
//! keeps the directory entry of a URL.
//!
//! In dbDCM the directory "which members hold a copy of URL u" is split across the members:
//! the entry for `u` lives on one member, its *owner*, chosen by [`owner`] from the URL's store
//! key. A member that misses asks the owner (`DIR_GET`), the owner answers with the holders it
//! knows (`DIR_DATA`), and members tell owners when they gain or lose a copy (`DIR_ADD`,
//! `DIR_DEL`, naming the objects by their 16-byte store keys: a holder's store reports what it
//! admitted or evicted by key, never by URL, and the directory is keyed by it anyway). The paper
//! names these four ICP extensions; the bytes below are ours.
//!
//! Every message is one UDP datagram that starts with the ICP v2 header, big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | opcode: 15 `DIR_GET`, 16 `DIR_DATA`, 17 `DIR_ADD`, 19 `DIR_DEL` |
//! | 1 | 1 | version, 2 |
//! | 2 | 2 | length of the whole datagram (must equal its size; at most 16,383) |
//! | 4 | 4 | request number (`DIR_GET`, `DIR_DATA`) or sequence number (`DIR_ADD`, `DIR_DEL`) |
//! | 8 | 4 | options (flags, per opcode) |
//! | 12 | 4 | option data (alpha in `DIR_GET`, else 0) |
//! | 16 | 4 | sender host address (IPv4) |
//! | 20 | … | payload |
//!
//! A *node address* is 6 bytes, a member's ICP address: IPv4 (4) then UDP port (2). A *key*
//! is 16 bytes, the object's MD5 store key (`MD5(0x01 || URL)`, the key [`owner`] places by),
//! sent as is: any byte value, NUL included, with no terminator. Payloads:
//!
//! ```text
//! DIR_GET   requester node address | URL | NUL
//!           options: 0x1 OPTIMISTIC (add the requester to the entry now),
//!                    0x2 FORWARD (the owner queries the holders for the requester)
//!           option data: alpha, the most holders to return or query (0 = all)
//! DIR_DATA  count (u16) | count node addresses | URL | NUL
//!           options: 0x1 FORWARDED (the owner already queried the listed nodes)
//! DIR_ADD   holder node address | key | key | ...   (N >= 1 keys; length 20 + 6 + 16 N)
//! DIR_DEL   same as DIR_ADD
//! ```
//!
//! The rules, enforced by [`decode`] and guaranteed by [`encode`]: version 2; the length field
//! equals the datagram size; undefined option bits are 0; option data is 0 except in `DIR_GET`;
//! the URL of a `DIR_GET`/`DIR_DATA` is non-empty, contains no NUL and is followed by exactly
//! one NUL, the datagram's last byte; a `DIR_ADD`/`DIR_DEL` carries at least one key and
//! nothing after its last whole key (the bytes after the holder are a non-zero multiple of
//! 16). Decoding is therefore strict: every accepted datagram re-encodes to the same bytes. A
//! malformed directory message is dropped without reply (its errors' [`crate::Verdict`] is
//! `Drop`): `ICP_OP_ERR` answers queries only.
//!
//! [`icp::decode`](crate::icp::decode) rejects these opcodes as unknown; a receiver checks
//! [`is_directory_opcode`] on the first byte and hands such datagrams here instead.
//!
//! [`encode_batches`] packs many `DIR_ADD`/`DIR_DEL` keys into as few datagrams as fit a size
//! limit ([`DEFAULT_BATCH_LEN`], one Ethernet payload, 90 keys, unless told otherwise).
//!
//! Search variant 2 (`DIR_GET` with FORWARD) also needs one flag in ordinary ICP queries,
//! [`FORWARDED_QUERY`]: the owner queries the holders on the requester's behalf, and the flag
//! tells them to reply to the requester.
//!
//! ```
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use meshcache_wire::directory::{self, DirGet, DirMessage, HolderUpdate};
//!
//! let me = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 3130);
//! let get = DirMessage::Get(DirGet {
//!     reqnum: 42,
//!     optimistic: true,
//!     forward: false,
//!     alpha: 2,
//!     sender: *me.ip(),
//!     requester: me,
//!     url: b"http://www.example.com/",
//! });
//! let mut datagram = Vec::new();
//! directory::encode(&get, &mut datagram)?;
//! assert_eq!(datagram.len(), 20 + 6 + 23 + 1);
//! assert_eq!(directory::decode(&datagram)?, get);
//!
//! // "I now hold the object with this store key", MD5(0x01 || "http://www.example.com/").
//! let add = DirMessage::Add(HolderUpdate {
//!     seq: 1,
//!     sender: *me.ip(),
//!     holder: me,
//!     keys: vec![[
//!         0xf3, 0x29, 0x9b, 0xe1, 0x5c, 0x55, 0xcd, 0xa9,
//!         0x29, 0xc4, 0xad, 0x1f, 0xbc, 0x90, 0xf5, 0xc2,
//!     ]],
//! });
//! let datagram = add.to_bytes()?;
//! assert_eq!(datagram.len(), 20 + 6 + 16);
//! assert_eq!(directory::decode(&datagram)?, add);
//! # Ok::<(), meshcache_wire::WireError>(())
//! ```
//!
//! ## Placement
//!
//! All members must agree on who owns a URL's entry, so the placement function is part of the
//! protocol: rendezvous (highest-random-weight) hashing over the 16-byte MD5 store key of the
//! URL (Squid's public key, `MD5(0x01 || URL)`; computed by the caller). For each member,
//!
//! ```text
//! score(member, key) = mix(K ^ fnv1a64(member))
//! K                  = key[0..8] read as a big-endian u64
//! fnv1a64(name)      = FNV-1a over the name's UTF-8 bytes: h = 0xcbf29ce484222325;
//!                      for each byte b { h ^= b; h = h * 0x100000001b3 (mod 2^64) }
//! mix(z)             = splitmix64's finalizer, all arithmetic mod 2^64:
//!                      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
//!                      z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//!                      z ^ (z >> 31)
//! ```
//!
//! The member with the highest score owns the entry; on equal scores the lexicographically
//! smaller name (bytewise) wins. Removing a member moves only the entries it owned, and adding
//! one moves only the entries it now wins.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::error::WireError;
use crate::icp::{HEADER_LEN, MAX_DATAGRAM, VERSION};

/// Opcode of `ICP_DIR_GET`: a requester asks a URL's owner for the holders of the URL.
pub const OPCODE_DIR_GET: u8 = 15;
/// Opcode of `ICP_DIR_DATA`: the owner's answer to a `DIR_GET`, the holders it knows.
pub const OPCODE_DIR_DATA: u8 = 16;
/// Opcode of `ICP_DIR_ADD`: "add me as a holder of the objects with these store keys".
pub const OPCODE_DIR_ADD: u8 = 17;
/// Opcode of `ICP_DIR_DEL`: "remove me as a holder of the objects with these store keys". (18
/// is skipped: a past experiment used it.)
pub const OPCODE_DIR_DEL: u8 = 19;

/// Bytes of a node address on the wire: IPv4 address (4) then UDP port (2), big-endian.
pub const NODE_ADDR_LEN: usize = 6;

/// Bytes of a store key on the wire: the object's 16-byte MD5 store key, `MD5(0x01 || URL)`,
/// as is (no terminator; it may contain NUL bytes).
pub const KEY_LEN: usize = 16;

/// Default size limit for [`encode_batches`]: 1472 bytes, the UDP payload of one Ethernet
/// frame (1500 − 20 IPv4 − 8 UDP), so a batch is never fragmented on a LAN. It carries 90
/// keys ((1472 − 26) / 16).
pub const DEFAULT_BATCH_LEN: usize = 1472;

/// The flag of an ICP `QUERY` that a directory owner sends on a requester's behalf (search
/// variant 2, a `DIR_GET` with FORWARD): the query's Requester Host Address field holds the
/// requester's IPv4 address and its Option Data the requester's ICP port (in the low 16 bits;
/// the high 16 are 0). A receiver that honours it (only when the sender and the requester are
/// both directory members) sends its reply to that address instead of to the sender.
///
/// It is not an ICP v2 flag: bit 0x0100_0000 is unused by ICP and by Squid. It is sent only to
/// directory members, so Squid never sees it. [`crate::icp::decode`] keeps it as received and
/// [`crate::icp::encode`] writes it back, like any option bit.
pub const FORWARDED_QUERY: crate::icp::Options = crate::icp::Options::from_bits(0x0100_0000);

/// `DIR_GET` option bit: the owner adds the requester to the entry now (optimistic update).
const GET_OPTIMISTIC: u32 = 0x1;
/// `DIR_GET` option bit: the owner queries the candidates on the requester's behalf.
const GET_FORWARD: u32 = 0x2;
/// `DIR_DATA` option bit: the owner already queried the listed nodes.
const DATA_FORWARDED: u32 = 0x1;

/// Bytes before the keys of a `DIR_ADD`/`DIR_DEL` (header and holder address).
const HOLDER_FIXED: usize = HEADER_LEN + NODE_ADDR_LEN;

/// The smallest `max_len` that [`encode_batches`] can fit a key in: 20 + 6 + 16 = 42.
pub const MIN_BATCH_LEN: usize = HOLDER_FIXED + KEY_LEN;

/// `true` for the four directory opcodes (15, 16, 17, 19): datagrams to give to [`decode`]
/// rather than to [`crate::icp::decode`].
pub const fn is_directory_opcode(opcode: u8) -> bool {
    matches!(
        opcode,
        OPCODE_DIR_GET | OPCODE_DIR_DATA | OPCODE_DIR_ADD | OPCODE_DIR_DEL
    )
}

/// `ICP_DIR_GET`: a requester asks the owner of `url`'s directory entry who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirGet<'a> {
    /// The requester's search number; the `DIR_DATA` answer echoes it.
    pub reqnum: u32,
    /// Option bit 0x1, OPTIMISTIC: the owner adds the requester to the entry right away,
    /// assuming it will get a copy (it sends `DIR_DEL` if it does not).
    pub optimistic: bool,
    /// Option bit 0x2, FORWARD (search variant 2): the owner sends the ICP queries to the
    /// candidates itself, naming the requester, so their replies go to the requester.
    pub forward: bool,
    /// Option data: the most candidates to return or query (0 = all).
    pub alpha: u32,
    /// The header's sender host address.
    pub sender: Ipv4Addr,
    /// The requester's ICP address (where `DIR_DATA` and the candidates' replies go).
    pub requester: SocketAddrV4,
    /// The URL, without its NUL; non-empty, no NUL inside.
    pub url: &'a [u8],
}

/// `ICP_DIR_DATA`: the owner's answer, the nodes its entry lists for `url`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirData<'a> {
    /// The `DIR_GET`'s request number, echoed.
    pub reqnum: u32,
    /// Option bit 0x1, FORWARDED: the owner already sent the ICP queries to `nodes`; the
    /// requester should expect their replies rather than query them.
    pub forwarded: bool,
    /// The header's sender host address.
    pub sender: Ipv4Addr,
    /// The holders' ICP addresses, in the owner's order (may be empty; at most 2,726 fit a
    /// datagram with a one-byte URL).
    pub nodes: Vec<SocketAddrV4>,
    /// The URL of the `DIR_GET`, without its NUL; non-empty, no NUL inside.
    pub url: &'a [u8],
}

/// `ICP_DIR_ADD` or `ICP_DIR_DEL`: a holder tells an owner that it now holds, or no longer
/// holds, the objects with these store keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderUpdate {
    /// The sender's sequence number (the request-number field; any value).
    pub seq: u32,
    /// The header's sender host address.
    pub sender: Ipv4Addr,
    /// The holder's ICP address: the node to add to or remove from each key's entry.
    pub holder: SocketAddrV4,
    /// The objects' 16-byte MD5 store keys (`MD5(0x01 || URL)`), in wire order: at least one
    /// (any bytes, NUL included); at most 1,022 fit a datagram.
    pub keys: Vec<[u8; KEY_LEN]>,
}

/// Which of the two holder updates: the opcode of a [`HolderUpdate`] datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HolderOp {
    /// `DIR_ADD` (17).
    Add,
    /// `DIR_DEL` (19).
    Del,
}

impl HolderOp {
    /// The wire opcode.
    pub const fn opcode(self) -> u8 {
        match self {
            HolderOp::Add => OPCODE_DIR_ADD,
            HolderOp::Del => OPCODE_DIR_DEL,
        }
    }
}

/// A directory message, borrowing the URL of a `DIR_GET`/`DIR_DATA` from the datagram
/// (decode) or from the caller (encode); the keys of a `DIR_ADD`/`DIR_DEL` are owned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DirMessage<'a> {
    /// `ICP_DIR_GET` (15).
    Get(DirGet<'a>),
    /// `ICP_DIR_DATA` (16).
    Data(DirData<'a>),
    /// `ICP_DIR_ADD` (17).
    Add(HolderUpdate),
    /// `ICP_DIR_DEL` (19).
    Del(HolderUpdate),
}

impl DirMessage<'_> {
    /// The wire opcode.
    pub const fn opcode(&self) -> u8 {
        match self {
            DirMessage::Get(_) => OPCODE_DIR_GET,
            DirMessage::Data(_) => OPCODE_DIR_DATA,
            DirMessage::Add(_) => OPCODE_DIR_ADD,
            DirMessage::Del(_) => OPCODE_DIR_DEL,
        }
    }

    /// The request-number field: the search number of a `DIR_GET`/`DIR_DATA`, the sequence
    /// number of a `DIR_ADD`/`DIR_DEL`.
    pub const fn reqnum(&self) -> u32 {
        match self {
            DirMessage::Get(m) => m.reqnum,
            DirMessage::Data(m) => m.reqnum,
            DirMessage::Add(m) | DirMessage::Del(m) => m.seq,
        }
    }

    /// The header's sender host address.
    pub const fn sender(&self) -> Ipv4Addr {
        match self {
            DirMessage::Get(m) => m.sender,
            DirMessage::Data(m) => m.sender,
            DirMessage::Add(m) | DirMessage::Del(m) => m.sender,
        }
    }

    /// Bytes this message takes on the wire (the value of its length field), whether or not
    /// it is small enough to encode.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match self {
                DirMessage::Get(m) => NODE_ADDR_LEN + m.url.len() + 1,
                DirMessage::Data(m) => 2 + NODE_ADDR_LEN * m.nodes.len() + m.url.len() + 1,
                DirMessage::Add(m) | DirMessage::Del(m) => NODE_ADDR_LEN + KEY_LEN * m.keys.len(),
            }
    }

    /// Encode into a new vector; see [`encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(self.encoded_len());
        encode(self, &mut out)?;
        Ok(out)
    }
}

/// What [`encode_batches`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Batches {
    /// Datagrams appended to `out`.
    pub datagrams: usize,
    /// The sequence number for the sender's next update (`first_seq` plus `datagrams`,
    /// wrapping).
    pub next_seq: u32,
    /// Keys left out because not even one fits in `max_len` bytes (all of them when `max_len`
    /// is under [`MIN_BATCH_LEN`], else none).
    pub skipped: usize,
}

fn node_addr(bytes: &[u8; NODE_ADDR_LEN]) -> SocketAddrV4 {
    let [a, b, c, d, p0, p1] = *bytes;
    SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), u16::from_be_bytes([p0, p1]))
}

fn put_node_addr(out: &mut Vec<u8>, node: &SocketAddrV4) {
    out.extend_from_slice(&node.ip().octets());
    out.extend_from_slice(&node.port().to_be_bytes());
}

/// Refuse option bits outside `defined`.
fn check_flags(opcode: u8, options: u32, defined: u32) -> Result<(), WireError> {
    match options & !defined {
        0 => Ok(()),
        bits => Err(WireError::DirUnknownFlags { opcode, bits }),
    }
}

fn check_no_option_data(opcode: u8, value: u32) -> Result<(), WireError> {
    match value {
        0 => Ok(()),
        value => Err(WireError::DirOptionData { opcode, value }),
    }
}

/// The single URL that ends a `DIR_GET`/`DIR_DATA`: `rest` must be `URL NUL` exactly.
fn single_url(opcode: u8, rest: &[u8]) -> Result<&[u8], WireError> {
    if rest.is_empty() {
        return Err(WireError::DirNoUrl { opcode });
    }
    match rest.iter().position(|&b| b == 0) {
        None => Err(WireError::DirMissingNul { opcode }),
        Some(0) => Err(WireError::DirEmptyUrl { opcode }),
        Some(nul) => match rest.split_at(nul) {
            (url, [0]) => Ok(url),
            (_, after) => Err(WireError::DirTrailingBytes {
                opcode,
                extra: after.len().saturating_sub(1),
            }),
        },
    }
}

/// The keys of a `DIR_ADD`/`DIR_DEL`: `rest` must be one or more whole 16-byte keys.
fn key_list(opcode: u8, rest: &[u8]) -> Result<Vec<[u8; KEY_LEN]>, WireError> {
    if rest.is_empty() {
        return Err(WireError::DirNoKeys { opcode });
    }
    let chunks = rest.chunks_exact(KEY_LEN);
    if !chunks.remainder().is_empty() {
        return Err(WireError::DirTrailingBytes {
            opcode,
            extra: chunks.remainder().len(),
        });
    }
    Ok(chunks
        .filter_map(|chunk| <[u8; KEY_LEN]>::try_from(chunk).ok())
        .collect())
}

/// Decode one directory datagram (the whole UDP payload).
///
/// Checks, in the order [`crate::icp::decode`] does: size (at most [`MAX_DATAGRAM`], at least
/// the 20-byte header), version 2, length field equal to the datagram size, a directory
/// opcode ([`WireError::NotDirectoryOpcode`] otherwise); then the option bits, the option
/// data, and the payload layout. Never panics. URLs are borrowed from `datagram`; a `DIR_ADD`
/// or `DIR_DEL` allocates one vector for its keys, a `DIR_DATA` one for its nodes.
///
/// A `DIR_ADD`/`DIR_DEL` with nothing after the holder address is [`WireError::DirNoKeys`];
/// one whose bytes after the holder are not a multiple of 16 is [`WireError::DirTrailingBytes`]
/// with `extra` the bytes of the partial key (that length mod 16), even when no whole key
/// precedes them.
pub fn decode(datagram: &[u8]) -> Result<DirMessage<'_>, WireError> {
    let (header, body) = crate::icp::split_header(datagram)?;
    let have = datagram.len();
    let crate::icp::RawHeader {
        opcode,
        reqnum,
        options,
        option_data,
        sender,
    } = header;

    match opcode {
        OPCODE_DIR_GET => {
            check_flags(opcode, options, GET_OPTIMISTIC | GET_FORWARD)?;
            let Some((requester, rest)) = body.split_first_chunk::<NODE_ADDR_LEN>() else {
                return Err(WireError::Truncated {
                    need: HEADER_LEN + NODE_ADDR_LEN + 2,
                    have,
                });
            };
            Ok(DirMessage::Get(DirGet {
                reqnum,
                optimistic: options & GET_OPTIMISTIC != 0,
                forward: options & GET_FORWARD != 0,
                alpha: option_data,
                sender,
                requester: node_addr(requester),
                url: single_url(opcode, rest)?,
            }))
        }
        OPCODE_DIR_DATA => {
            check_flags(opcode, options, DATA_FORWARDED)?;
            check_no_option_data(opcode, option_data)?;
            let Some((count, rest)) = body.split_first_chunk::<2>() else {
                return Err(WireError::Truncated {
                    need: HEADER_LEN + 2 + 2,
                    have,
                });
            };
            let nodes_len = usize::from(u16::from_be_bytes(*count)) * NODE_ADDR_LEN;
            if rest.len() < nodes_len {
                return Err(WireError::Truncated {
                    need: HEADER_LEN + 2 + nodes_len + 2,
                    have,
                });
            }
            let (nodes, rest) = rest.split_at(nodes_len);
            let url = single_url(opcode, rest)?;
            let nodes = nodes
                .chunks_exact(NODE_ADDR_LEN)
                .filter_map(|chunk| <&[u8; NODE_ADDR_LEN]>::try_from(chunk).ok())
                .map(node_addr)
                .collect();
            Ok(DirMessage::Data(DirData {
                reqnum,
                forwarded: options & DATA_FORWARDED != 0,
                sender,
                nodes,
                url,
            }))
        }
        OPCODE_DIR_ADD | OPCODE_DIR_DEL => {
            check_flags(opcode, options, 0)?;
            check_no_option_data(opcode, option_data)?;
            let Some((holder, rest)) = body.split_first_chunk::<NODE_ADDR_LEN>() else {
                return Err(WireError::Truncated {
                    need: HOLDER_FIXED + KEY_LEN,
                    have,
                });
            };
            let update = HolderUpdate {
                seq: reqnum,
                sender,
                holder: node_addr(holder),
                keys: key_list(opcode, rest)?,
            };
            Ok(if opcode == OPCODE_DIR_ADD {
                DirMessage::Add(update)
            } else {
                DirMessage::Del(update)
            })
        }
        other => Err(WireError::NotDirectoryOpcode(other)),
    }
}

/// Refuse a URL the wire cannot carry.
fn check_url(opcode: u8, url: &[u8]) -> Result<(), WireError> {
    if url.is_empty() {
        return Err(WireError::DirEmptyUrl { opcode });
    }
    match url.iter().position(|&b| b == 0) {
        Some(at) => Err(WireError::UrlContainsNul { at }),
        None => Ok(()),
    }
}

fn put_header(
    out: &mut Vec<u8>,
    opcode: u8,
    length: u16,
    reqnum: u32,
    options: u32,
    option_data: u32,
    sender: Ipv4Addr,
) {
    out.push(opcode);
    out.push(VERSION);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&reqnum.to_be_bytes());
    out.extend_from_slice(&options.to_be_bytes());
    out.extend_from_slice(&option_data.to_be_bytes());
    out.extend_from_slice(&sender.octets());
}

/// Append the wire form of `msg` to `out`.
///
/// Writes version 2, the exact length, the flags from the message's booleans (so no undefined
/// bit can be set) and 0 in every unused field. Refuses, writing nothing: an empty URL
/// ([`WireError::DirEmptyUrl`]), a URL containing NUL ([`WireError::UrlContainsNul`], `at` is
/// the offset within that URL), a `DIR_ADD`/`DIR_DEL` without keys ([`WireError::DirNoKeys`]),
/// and a message over [`MAX_DATAGRAM`] bytes ([`WireError::TooLong`]; a `DIR_ADD`/`DIR_DEL`
/// holds at most 1,022 keys).
pub fn encode(msg: &DirMessage<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    let opcode = msg.opcode();
    match msg {
        DirMessage::Get(DirGet { url, .. }) | DirMessage::Data(DirData { url, .. }) => {
            check_url(opcode, url)?;
        }
        DirMessage::Add(m) | DirMessage::Del(m) => {
            if m.keys.is_empty() {
                return Err(WireError::DirNoKeys { opcode });
            }
        }
    }
    let len = msg.encoded_len();
    let length = crate::icp::length_field(len)?;

    out.reserve(len);
    match msg {
        DirMessage::Get(m) => {
            let mut options = 0;
            if m.optimistic {
                options |= GET_OPTIMISTIC;
            }
            if m.forward {
                options |= GET_FORWARD;
            }
            put_header(out, opcode, length, m.reqnum, options, m.alpha, m.sender);
            put_node_addr(out, &m.requester);
            out.extend_from_slice(m.url);
            out.push(0);
        }
        DirMessage::Data(m) => {
            let options = if m.forwarded { DATA_FORWARDED } else { 0 };
            put_header(out, opcode, length, m.reqnum, options, 0, m.sender);
            // Cannot saturate: the whole message fits in MAX_DATAGRAM, so fewer than 2,727
            // nodes.
            let count = u16::try_from(m.nodes.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&count.to_be_bytes());
            for node in &m.nodes {
                put_node_addr(out, node);
            }
            out.extend_from_slice(m.url);
            out.push(0);
        }
        DirMessage::Add(m) | DirMessage::Del(m) => {
            put_header(out, opcode, length, m.seq, 0, 0, m.sender);
            put_node_addr(out, &m.holder);
            out.extend_from_slice(m.keys.as_flattened());
        }
    }
    Ok(())
}

/// Pack `keys` into as few `DIR_ADD` or `DIR_DEL` datagrams of at most `max_len` bytes as
/// possible, appending one `Vec<u8>` per datagram to `out`.
///
/// Keys keep their order; each datagram but the last carries (`max_len` − 26) / 16 of them (90
/// at [`DEFAULT_BATCH_LEN`]). Datagrams are numbered `first_seq`, `first_seq + 1`, …
/// (wrapping); each carries `sender` in its header and `holder` as the holder address. When
/// `max_len` is under [`MIN_BATCH_LEN`] (42) no key fits: nothing is sent and every key is
/// counted in [`Batches::skipped`] (the directory is a hint, and an owner that never hears of a
/// copy only misses a chance to use it). Pass [`DEFAULT_BATCH_LEN`] unless the path is known to
/// carry larger datagrams unfragmented.
///
/// Refuses, appending nothing, `max_len` over [`MAX_DATAGRAM`] ([`WireError::TooLong`]). No
/// keys give no datagrams.
pub fn encode_batches(
    op: HolderOp,
    first_seq: u32,
    sender: Ipv4Addr,
    holder: SocketAddrV4,
    keys: &[[u8; KEY_LEN]],
    max_len: usize,
    out: &mut Vec<Vec<u8>>,
) -> Result<Batches, WireError> {
    if max_len > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            len: max_len,
            max: MAX_DATAGRAM,
        });
    }
    let per_datagram = max_len.saturating_sub(HOLDER_FIXED) / KEY_LEN;
    let mut report = Batches {
        datagrams: 0,
        next_seq: first_seq,
        skipped: 0,
    };
    if per_datagram == 0 {
        report.skipped = keys.len();
        return Ok(report);
    }
    let opcode = op.opcode();
    for chunk in keys.chunks(per_datagram) {
        let len = HOLDER_FIXED + KEY_LEN * chunk.len();
        // Cannot saturate: len <= max_len <= MAX_DATAGRAM.
        let length = u16::try_from(len).unwrap_or(u16::MAX);
        let mut datagram = Vec::with_capacity(len);
        put_header(&mut datagram, opcode, length, report.next_seq, 0, 0, sender);
        put_node_addr(&mut datagram, &holder);
        datagram.extend_from_slice(chunk.as_flattened());
        out.push(datagram);
        report.datagrams += 1;
        report.next_seq = report.next_seq.wrapping_add(1);
    }
    Ok(report)
}

/// FNV-1a, 64 bits, over `bytes`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// splitmix64's finalizer: a bijective 64-bit mix.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rendezvous score of `member` for the URL whose MD5 store key is `url_key`:
/// `mix(K ^ fnv1a64(member))`, K being the key's first 8 bytes as a big-endian integer (see
/// the module documentation for `mix` and `fnv1a64`). The member with the highest score owns
/// the URL's directory entry.
pub fn owner_score(member: &str, url_key: &[u8; 16]) -> u64 {
    score_hashed(fnv1a64(member.as_bytes()), url_key)
}

/// [`owner_score`] with the member's name already hashed.
fn score_hashed(member_hash: u64, url_key: &[u8; 16]) -> u64 {
    let [a, b, c, d, e, f, g, h, ..] = *url_key;
    mix64(u64::from_be_bytes([a, b, c, d, e, f, g, h]) ^ member_hash)
}

/// A member set ready for many placements: [`owner_index`] with each name hashed once, for a
/// member that places every URL it looks up (the names' hash is most of a score's cost).
#[derive(Clone, Debug)]
pub struct Placement {
    names: Vec<String>,
    hashes: Vec<u64>,
}

impl Placement {
    /// The member set `names`, in the order [`Placement::owner_index`] counts them.
    pub fn new(names: Vec<String>) -> Placement {
        let hashes = names.iter().map(|n| fnv1a64(n.as_bytes())).collect();
        Placement { names, hashes }
    }

    /// The same answer as [`owner_index`] over the names.
    pub fn owner_index(&self, url_key: &[u8; 16]) -> Option<usize> {
        let hashed = self
            .names
            .iter()
            .map(String::as_str)
            .zip(self.hashes.iter().copied());
        best(hashed, url_key).map(|(index, _)| index)
    }
}

/// Whether `(score, name)` beats `(best_score, best_name)`: higher score, or equal score and a
/// smaller name. An identical name does not beat the earlier one.
fn beats(score: u64, name: &str, best_score: u64, best_name: &str) -> bool {
    score > best_score || (score == best_score && name < best_name)
}

/// The member that owns the directory entry of the URL whose MD5 store key is `url_key`: the
/// highest [`owner_score`], ties going to the lexicographically smaller name. `None` when
/// there are no members. Every member must pass the same set of names, spelled identically.
pub fn owner<'m>(
    members: impl IntoIterator<Item = &'m str>,
    url_key: &[u8; 16],
) -> Option<&'m str> {
    let hashed = members.into_iter().map(|m| (m, fnv1a64(m.as_bytes())));
    best(hashed, url_key).map(|(_, member)| member)
}

/// Like [`owner`], returning the owner's index in `members` (the first one if a name is
/// repeated).
pub fn owner_index<S: AsRef<str>>(members: &[S], url_key: &[u8; 16]) -> Option<usize> {
    let hashed = members
        .iter()
        .map(|m| (m.as_ref(), fnv1a64(m.as_ref().as_bytes())));
    best(hashed, url_key).map(|(index, _)| index)
}

/// The index and name of the member with the best score among `members` (name, name's hash).
fn best<'m>(
    members: impl Iterator<Item = (&'m str, u64)>,
    url_key: &[u8; 16],
) -> Option<(usize, &'m str)> {
    let mut best: Option<(u64, &'m str, usize)> = None;
    for (index, (member, hash)) in members.enumerate() {
        let score = score_hashed(hash, url_key);
        if best.is_none_or(|(best_score, best_name, _)| beats(score, member, best_score, best_name))
        {
            best = Some((score, member, index));
        }
    }
    best.map(|(_, member, index)| (index, member))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_agrees_with_owner_index() {
        let names: Vec<String> = (0..50).map(|i| format!("node-{i}")).collect();
        let mut repeated = names.clone();
        repeated.push("node-7".into());
        for set in [names, repeated, Vec::new()] {
            let placement = Placement::new(set.clone());
            for k in 0u32..500 {
                let mut key = [0u8; 16];
                key[..4].copy_from_slice(&k.wrapping_mul(2_654_435_761).to_be_bytes());
                key[4..8].copy_from_slice(&k.to_le_bytes());
                assert_eq!(placement.owner_index(&key), owner_index(&set, &key));
            }
        }
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn mix64_matches_splitmix64() {
        // splitmix64 seeded with 0 returns mix64(0x9e3779b97f4a7c15) first.
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }

    #[test]
    fn directory_opcodes() {
        let all: Vec<u8> = (0..=u8::MAX)
            .filter(|&op| is_directory_opcode(op))
            .collect();
        assert_eq!(all, [15, 16, 17, 19]);
        assert_eq!(HolderOp::Add.opcode(), OPCODE_DIR_ADD);
        assert_eq!(HolderOp::Del.opcode(), OPCODE_DIR_DEL);
    }
}
