//! ICP v2 (RFC 2186/2187) exactly as Squid 5.7 sends and accepts it.
//!
//! An ICP message is one UDP datagram: a fixed 20-byte header, then a payload that depends on
//! the opcode. All integers are big-endian.
//!
//! ```text
//! offset size  field
//!  0      1    opcode
//!  1      1    version (2)
//!  2      2    message length, header included
//!  4      4    request number
//!  8      4    options (flags)
//! 12      4    option data (SRC_RTT in replies: hops << 16 | rtt_ms; else 0)
//! 16      4    sender host address (Squid: always 0)
//! 20      ...  payload:
//!              QUERY    requester IPv4 (Squid: 0.0.0.0) | URL | NUL
//!              HIT_OBJ  URL | NUL | object size (u16, unaligned) | object
//!              others   URL | NUL
//! ```
//!
//! The rules that make a datagram acceptable to Squid, all enforced by [`decode`] and
//! guaranteed by [`encode`]:
//!
//! - the length field equals the datagram size, which is 20..=[`MAX_DATAGRAM`] bytes;
//! - the version is 2;
//! - the URL is followed by exactly one NUL, the last byte of the datagram (no padding, no
//!   embedded NUL, no trailing bytes); a `HIT_OBJ` object ends exactly at the datagram's end.
//!
//! What Squid does with a datagram that breaks a rule is in [`WireError::verdict`]: a malformed
//! `QUERY` payload is answered with `ICP_OP_ERR` (empty URL, reqnum echoed), everything else is
//! dropped silently. Decoding is strict, so every accepted datagram re-encodes byte for byte.
//!
//! What this module does **not** judge, because it is not about bytes: whether the URL parses
//! or contains whitespace (Squid answers `ICP_OP_ERR` with the URL percent-escaped), access
//! control (`ICP_OP_DENIED`), and what to do with opcodes Squid ignores on receipt (`ERR`,
//! `SECHO`, `HIT_OBJ`; see [`Opcode`]). Those belong to the responder.
//!
//! ```
//! use meshcache_wire::icp::{self, Message, Opcode};
//!
//! let query = Message::query(42, "http://www.example.com/");
//! let mut datagram = Vec::new();
//! icp::encode(&query, &mut datagram)?;
//! assert_eq!(datagram.len(), 48);
//!
//! let received = icp::decode(&datagram)?;
//! let reply = Message::reply(Opcode::Miss, &received)?;
//! assert_eq!((reply.reqnum, reply.url()), (42, &b"http://www.example.com/"[..]));
//! # Ok::<(), meshcache_wire::WireError>(())
//! ```

use std::fmt;
use std::net::Ipv4Addr;
use std::ops::{BitOr, BitOrAssign};

use crate::error::WireError;

/// Size of the fixed ICP header.
pub const HEADER_LEN: usize = 20;

/// Largest datagram Squid accepts: it reads into a 16,384-byte buffer minus one byte, so a
/// 16,384-byte datagram arrives truncated and fails the length check (verified on 5.7).
pub const MAX_DATAGRAM: usize = 16_383;

/// The Message Length field for a datagram of `len` bytes, or [`WireError::TooLong`] past
/// [`MAX_DATAGRAM`].
pub(crate) fn length_field(len: usize) -> Result<u16, WireError> {
    match u16::try_from(len) {
        Ok(length) if len <= MAX_DATAGRAM => Ok(length),
        _ => Err(WireError::TooLong {
            len,
            max: MAX_DATAGRAM,
        }),
    }
}

/// The fixed header of a datagram framed as ICP (ICP itself, and our extensions that share its
/// framing), its opcode not yet interpreted.
pub(crate) struct RawHeader {
    /// The opcode byte.
    pub opcode: u8,
    /// Request (or sequence) number.
    pub reqnum: u32,
    /// Option flags.
    pub options: u32,
    /// Option data.
    pub option_data: u32,
    /// Sender host address.
    pub sender: Ipv4Addr,
}

/// Checks the framing every ICP-style datagram shares, in Squid's order — size (at most
/// [`MAX_DATAGRAM`], at least [`HEADER_LEN`]), version 2, length field equal to the datagram
/// size — and splits it into its header and payload.
pub(crate) fn split_header(datagram: &[u8]) -> Result<(RawHeader, &[u8]), WireError> {
    let have = datagram.len();
    if have > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            len: have,
            max: MAX_DATAGRAM,
        });
    }
    let Some((header, body)) = datagram.split_first_chunk::<HEADER_LEN>() else {
        return Err(WireError::Truncated {
            need: HEADER_LEN,
            have,
        });
    };
    let version = header[1];
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    let length = be_u16(header, 2);
    if usize::from(length) != have {
        return Err(WireError::LengthMismatch {
            header: length,
            datagram: have,
        });
    }
    let raw = RawHeader {
        opcode: header[0],
        reqnum: be_u32(header, 4),
        options: be_u32(header, 8),
        option_data: be_u32(header, 12),
        sender: Ipv4Addr::from(be_u32(header, 16)),
    };
    Ok((raw, body))
}

/// The only ICP version meshcache speaks (and the only one Squid sends).
pub const VERSION: u8 = 2;

/// Default ICP port (`icp_port 3130`; Squid's own default is 0 = disabled).
pub const DEFAULT_PORT: u16 = 3130;

/// Size of the requester-address field that starts a `QUERY` payload.
const REQUESTER_LEN: usize = 4;

/// ICP opcodes that have a payload layout.
///
/// Opcode 0 (`ICP_OP_INVALID`) and the unused values 5–9, 12–20 and 24 and above are not
/// variants: [`decode`] rejects them ([`WireError::InvalidOpcode`], [`WireError::UnknownOpcode`])
/// and Squid drops them.
///
/// What Squid 5.7 does on receipt of a well-formed message: `QUERY` is answered; `HIT`, `MISS`,
/// `MISS_NOFETCH`, `DENIED` and `DECHO` are handled as replies; `ERR` is ignored silently;
/// `SECHO` and `HIT_OBJ` are logged as "UNKNOWN OPCODE" and dropped (verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    /// `ICP_OP_QUERY` (1): is this URL cached? Payload: requester address, URL.
    Query = 1,
    /// `ICP_OP_HIT` (2): cached and fresh for at least 30 s more.
    Hit = 2,
    /// `ICP_OP_MISS` (3): not cached (fetching through the replier is allowed).
    Miss = 3,
    /// `ICP_OP_ERR` (4): the query was malformed or its URL did not parse.
    Err = 4,
    /// `ICP_OP_SECHO` (10): query bounced off an origin's echo port. Squid 5 never sends it.
    Secho = 10,
    /// `ICP_OP_DECHO` (11): query bounced off a non-ICP cache's echo port (URL only, no
    /// requester address). Squid sends it instead of `QUERY` to a peer whose ICP port is 7.
    Decho = 11,
    /// `ICP_OP_MISS_NOFETCH` (21): not cached, and do not fetch through me right now.
    MissNoFetch = 21,
    /// `ICP_OP_DENIED` (22): access denied by the replier's `icp_access`.
    Denied = 22,
    /// `ICP_OP_HIT_OBJ` (23): hit with the object inline (RFC, not recommended). Squid 5
    /// never sends it and drops it on receipt.
    HitObj = 23,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 9] = [
        Opcode::Query,
        Opcode::Hit,
        Opcode::Miss,
        Opcode::Err,
        Opcode::Secho,
        Opcode::Decho,
        Opcode::MissNoFetch,
        Opcode::Denied,
        Opcode::HitObj,
    ];

    /// The opcode with this wire value, if it has a payload layout (not 0, not unused).
    pub const fn from_u8(value: u8) -> Option<Opcode> {
        Some(match value {
            1 => Opcode::Query,
            2 => Opcode::Hit,
            3 => Opcode::Miss,
            4 => Opcode::Err,
            10 => Opcode::Secho,
            11 => Opcode::Decho,
            21 => Opcode::MissNoFetch,
            22 => Opcode::Denied,
            23 => Opcode::HitObj,
            _ => return None,
        })
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Squid's and Wireshark's name, e.g. `ICP_OP_MISS_NOFETCH`.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Query => "ICP_OP_QUERY",
            Opcode::Hit => "ICP_OP_HIT",
            Opcode::Miss => "ICP_OP_MISS",
            Opcode::Err => "ICP_OP_ERR",
            Opcode::Secho => "ICP_OP_SECHO",
            Opcode::Decho => "ICP_OP_DECHO",
            Opcode::MissNoFetch => "ICP_OP_MISS_NOFETCH",
            Opcode::Denied => "ICP_OP_DENIED",
            Opcode::HitObj => "ICP_OP_HIT_OBJ",
        }
    }

    /// `true` for the answers to a query: HIT, MISS, ERR, MISS_NOFETCH, DENIED and HIT_OBJ.
    pub const fn is_reply(self) -> bool {
        matches!(
            self,
            Opcode::Hit
                | Opcode::Miss
                | Opcode::Err
                | Opcode::MissNoFetch
                | Opcode::Denied
                | Opcode::HitObj
        )
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The 32-bit Options field: a set of flags. Unknown bits are kept as received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Options(u32);

impl Options {
    /// No flags (what Squid sends unless `query_icmp on`).
    pub const NONE: Options = Options(0);
    /// `ICP_FLAG_HIT_OBJ`: in a query, "a HIT_OBJ reply is welcome". Squid 5 never sets it,
    /// ignores it, and never answers with HIT_OBJ; do not send it to Squid.
    pub const HIT_OBJ: Options = Options(0x8000_0000);
    /// `ICP_FLAG_SRC_RTT`: in a query, "include your RTT to the origin"; in a reply, the
    /// Option Data holds it (see [`SrcRtt`]).
    pub const SRC_RTT: Options = Options(0x4000_0000);
    /// `ICP_FLAG_POINTER`: experimental (Mirror Image), not in Squid; ignore.
    pub const POINTER: Options = Options(0x2000_0000);

    /// Options with exactly these bits.
    pub const fn from_bits(bits: u32) -> Options {
        Options(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// `true` if every bit of `other` is set.
    pub const fn contains(self, other: Options) -> bool {
        self.0 & other.0 == other.0
    }

    /// `true` if no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// These options plus `other`.
    pub const fn union(self, other: Options) -> Options {
        Options(self.0 | other.0)
    }

    /// These options without the bits of `other`.
    pub const fn difference(self, other: Options) -> Options {
        Options(self.0 & !other.0)
    }
}

impl BitOr for Options {
    type Output = Options;
    fn bitor(self, rhs: Options) -> Options {
        self.union(rhs)
    }
}

impl BitOrAssign for Options {
    fn bitor_assign(&mut self, rhs: Options) {
        *self = self.union(rhs);
    }
}

/// The measurement a reply carries in its Option Data when `ICP_FLAG_SRC_RTT` is set.
///
/// Squid packs `(hops & 0xFFFF) << 16 | (rtt_ms & 0xFFFF)`. The RFC defines only the low 16
/// bits (RTT in milliseconds); the hop count in the high 16 bits is a Squid extension. Squid
/// uses a sample only if `0 < rtt_ms < 0xFFFF`. (Wireshark's `icp.rtt` shows all 32 bits.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SrcRtt {
    /// Router hops to the origin (high 16 bits; 0 = unknown).
    pub hops: u16,
    /// Round-trip time to the origin in milliseconds (low 16 bits; 0 = unknown).
    pub rtt_ms: u16,
}

impl SrcRtt {
    /// Unpack an Option Data word.
    pub const fn from_option_data(data: u32) -> SrcRtt {
        SrcRtt {
            hops: (data >> 16) as u16,
            rtt_ms: (data & 0xFFFF) as u16,
        }
    }

    /// Pack into an Option Data word.
    pub const fn to_option_data(self) -> u32 {
        (self.hops as u32) << 16 | self.rtt_ms as u32
    }

    /// From wider measurements, saturating at 0xFFFF (Squid masks instead, so 65,536 ms would
    /// read as 0 = unknown; saturating keeps "very far" meaning far, and Squid ignores 0xFFFF).
    pub fn saturating(hops: u32, rtt_ms: u32) -> SrcRtt {
        SrcRtt {
            hops: u16::try_from(hops).unwrap_or(u16::MAX),
            rtt_ms: u16::try_from(rtt_ms).unwrap_or(u16::MAX),
        }
    }
}

/// The part of a message after the 20-byte header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Payload {
    /// `QUERY`: the original client's IPv4 address (Squid sends 0.0.0.0 and ignores it on
    /// receipt), then the URL.
    Query {
        /// Requester Host Address.
        requester: Ipv4Addr,
        /// The URL, without its NUL.
        url: Vec<u8>,
    },
    /// Every other opcode except `HIT_OBJ`: the URL alone, without its NUL.
    Url(Vec<u8>),
    /// `HIT_OBJ`: the URL and the object (at most 65,535 bytes by the u16 size field, and in
    /// practice less, since the whole datagram must fit [`MAX_DATAGRAM`]).
    HitObj {
        /// The URL, without its NUL.
        url: Vec<u8>,
        /// The object bytes.
        object: Vec<u8>,
    },
}

impl Payload {
    /// The URL, whatever the variant.
    pub fn url(&self) -> &[u8] {
        match self {
            Payload::Query { url, .. } | Payload::Url(url) | Payload::HitObj { url, .. } => url,
        }
    }

    /// Bytes this payload takes on the wire.
    fn encoded_len(&self) -> usize {
        match self {
            Payload::Query { url, .. } => REQUESTER_LEN + url.len() + 1,
            Payload::Url(url) => url.len() + 1,
            Payload::HitObj { url, object } => url.len() + 1 + 2 + object.len(),
        }
    }

    /// Whether this variant is the layout `opcode` uses.
    fn fits(&self, opcode: Opcode) -> bool {
        matches!(
            (opcode, self),
            (Opcode::Query, Payload::Query { .. })
                | (Opcode::HitObj, Payload::HitObj { .. })
                | (
                    Opcode::Hit
                        | Opcode::Miss
                        | Opcode::Err
                        | Opcode::Secho
                        | Opcode::Decho
                        | Opcode::MissNoFetch
                        | Opcode::Denied,
                    Payload::Url(_)
                )
        )
    }
}

/// One ICP v2 message. The version (always 2) and the length (always computed) are not
/// stored: [`decode`] checks them and [`encode`] writes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// What the message is.
    pub opcode: Opcode,
    /// Request number. Replies must echo the query's exactly; never send 0 to Squid (a reply
    /// with reqnum 0 makes it disable private keys for the rest of its life).
    pub reqnum: u32,
    /// Option flags.
    pub options: Options,
    /// Option Data (the SRC_RTT measurement in replies, else 0).
    pub option_data: u32,
    /// Sender Host Address. Squid always sends 0 and ignores it.
    pub sender: Ipv4Addr,
    /// The opcode-specific part.
    pub payload: Payload,
}

impl Message {
    /// A `QUERY` for `url` as Squid sends it: no flags, option data 0, sender and requester
    /// 0.0.0.0. Add `ICP_FLAG_SRC_RTT` with [`Message::with_options`] if wanted.
    pub fn query(reqnum: u32, url: impl Into<Vec<u8>>) -> Message {
        Message {
            opcode: Opcode::Query,
            reqnum,
            options: Options::NONE,
            option_data: 0,
            sender: Ipv4Addr::UNSPECIFIED,
            payload: Payload::Query {
                requester: Ipv4Addr::UNSPECIFIED,
                url: url.into(),
            },
        }
    }

    /// A reply to `query` as Squid builds it: the request number and the URL copied byte for
    /// byte, flags and option data 0, sender 0.0.0.0. `opcode` must be HIT, MISS, ERR,
    /// MISS_NOFETCH or DENIED; to answer a query that asked for `SRC_RTT`, follow with
    /// [`Message::set_src_rtt`].
    pub fn reply(opcode: Opcode, query: &Message) -> Result<Message, WireError> {
        match opcode {
            Opcode::Hit | Opcode::Miss | Opcode::Err | Opcode::MissNoFetch | Opcode::Denied => {
                Ok(Message {
                    opcode,
                    reqnum: query.reqnum,
                    options: Options::NONE,
                    option_data: 0,
                    sender: Ipv4Addr::UNSPECIFIED,
                    payload: Payload::Url(query.url().to_vec()),
                })
            }
            other => Err(WireError::NotAReply(other)),
        }
    }

    /// The `ICP_OP_ERR` Squid sends for a query whose payload is malformed: this request
    /// number and an empty URL (21 bytes on the wire).
    pub fn malformed_query_err(reqnum: u32) -> Message {
        Message {
            opcode: Opcode::Err,
            reqnum,
            options: Options::NONE,
            option_data: 0,
            sender: Ipv4Addr::UNSPECIFIED,
            payload: Payload::Url(Vec::new()),
        }
    }

    /// This message with `options` added to its flags.
    pub fn with_options(mut self, options: Options) -> Message {
        self.options |= options;
        self
    }

    /// The URL, without its NUL.
    pub fn url(&self) -> &[u8] {
        self.payload.url()
    }

    /// The URL as text, if it is UTF-8.
    pub fn url_str(&self) -> Option<&str> {
        std::str::from_utf8(self.url()).ok()
    }

    /// The SRC_RTT measurement of a reply: `Some` when the flag is set and the message is not
    /// a `QUERY` (in a query the flag is a request, not a measurement).
    pub fn src_rtt(&self) -> Option<SrcRtt> {
        (self.opcode != Opcode::Query && self.options.contains(Options::SRC_RTT))
            .then(|| SrcRtt::from_option_data(self.option_data))
    }

    /// Put a measurement in a reply the way Squid does for a query with `SRC_RTT`: the Option
    /// Data always gets the packed value, and the `SRC_RTT` flag is set only when `rtt_ms` is
    /// non-zero (cleared otherwise).
    pub fn set_src_rtt(&mut self, rtt: SrcRtt) {
        self.option_data = rtt.to_option_data();
        self.options = if rtt.rtt_ms != 0 {
            self.options.union(Options::SRC_RTT)
        } else {
            self.options.difference(Options::SRC_RTT)
        };
    }

    /// Bytes this message takes on the wire (the value of its length field).
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload.encoded_len()
    }

    /// Encode into a new vector; see [`encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(self.encoded_len());
        encode(self, &mut out)?;
        Ok(out)
    }
}

fn be_u16(bytes: &[u8], at: usize) -> u16 {
    match bytes.get(at..at + 2) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => 0,
    }
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    match bytes.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// Decode one ICP datagram (the whole UDP payload).
///
/// Checks, in Squid's order: size (at most [`MAX_DATAGRAM`], at least [`HEADER_LEN`]), version
/// 2, length field equal to the datagram size, a known opcode, then the payload layout. Never
/// panics. On error, [`WireError::verdict`] says whether Squid would answer `ICP_OP_ERR` or
/// drop the datagram.
///
/// Read datagrams with a buffer larger than [`MAX_DATAGRAM`] so that oversized ones are seen
/// (and rejected as [`WireError::TooLong`]) rather than truncated.
pub fn decode(datagram: &[u8]) -> Result<Message, WireError> {
    let (header, body) = split_header(datagram)?;
    let have = datagram.len();
    let opcode = match header.opcode {
        0 => return Err(WireError::InvalidOpcode),
        raw => Opcode::from_u8(raw).ok_or(WireError::UnknownOpcode(raw))?,
    };
    let reqnum = header.reqnum;
    let options = Options::from_bits(header.options);
    let option_data = header.option_data;
    let sender = header.sender;

    // The URL ends at the first NUL, which must be the last byte (or, for HIT_OBJ, be
    // followed by the object-size field and the object).
    let url_end = |bytes: &[u8]| {
        bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::MissingNul { opcode, reqnum })
    };
    let only_nul_after = |bytes: &[u8], nul: usize| match bytes.len() - nul - 1 {
        0 => Ok(()),
        extra => Err(WireError::TrailingBytes {
            opcode,
            reqnum,
            extra,
        }),
    };

    let payload = match opcode {
        Opcode::Query => {
            // Squid needs the requester address plus at least one byte ("too small packet").
            let Some((requester, rest)) = body.split_first_chunk::<REQUESTER_LEN>() else {
                return Err(WireError::QueryTooShort { reqnum, len: have });
            };
            if rest.is_empty() {
                return Err(WireError::QueryTooShort { reqnum, len: have });
            }
            let nul = url_end(rest)?;
            only_nul_after(rest, nul)?;
            Payload::Query {
                requester: Ipv4Addr::from(*requester),
                url: rest[..nul].to_vec(),
            }
        }
        Opcode::HitObj => {
            let nul = url_end(body)?;
            let after = &body[nul + 1..];
            let Some((size, object)) = after.split_first_chunk::<2>() else {
                return Err(WireError::Truncated {
                    need: HEADER_LEN + nul + 1 + 2,
                    have,
                });
            };
            let size = usize::from(u16::from_be_bytes(*size));
            if object.len() < size {
                return Err(WireError::Truncated {
                    need: HEADER_LEN + nul + 1 + 2 + size,
                    have,
                });
            }
            if object.len() > size {
                return Err(WireError::TrailingBytes {
                    opcode,
                    reqnum,
                    extra: object.len() - size,
                });
            }
            Payload::HitObj {
                url: body[..nul].to_vec(),
                object: object.to_vec(),
            }
        }
        _ => {
            let nul = url_end(body)?;
            only_nul_after(body, nul)?;
            Payload::Url(body[..nul].to_vec())
        }
    };

    Ok(Message {
        opcode,
        reqnum,
        options,
        option_data,
        sender,
        payload,
    })
}

/// Append the wire form of `msg` to `out`.
///
/// Writes version 2 and the exact length. Refuses, writing nothing: a payload variant that
/// does not fit the opcode ([`WireError::PayloadMismatch`]), a URL containing NUL
/// ([`WireError::UrlContainsNul`]), and a message over [`MAX_DATAGRAM`] bytes
/// ([`WireError::TooLong`]). An empty URL is allowed (Squid's ERR for a malformed query has
/// one).
pub fn encode(msg: &Message, out: &mut Vec<u8>) -> Result<(), WireError> {
    if !msg.payload.fits(msg.opcode) {
        return Err(WireError::PayloadMismatch { opcode: msg.opcode });
    }
    let url = msg.url();
    if let Some(at) = url.iter().position(|&b| b == 0) {
        return Err(WireError::UrlContainsNul { at });
    }
    let len = msg.encoded_len();
    let length = crate::icp::length_field(len)?;

    out.reserve(len);
    out.push(msg.opcode.as_u8());
    out.push(VERSION);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&msg.reqnum.to_be_bytes());
    out.extend_from_slice(&msg.options.bits().to_be_bytes());
    out.extend_from_slice(&msg.option_data.to_be_bytes());
    out.extend_from_slice(&msg.sender.octets());
    match &msg.payload {
        Payload::Query { requester, url } => {
            out.extend_from_slice(&requester.octets());
            out.extend_from_slice(url);
            out.push(0);
        }
        Payload::Url(url) => {
            out.extend_from_slice(url);
            out.push(0);
        }
        Payload::HitObj { url, object } => {
            out.extend_from_slice(url);
            out.push(0);
            // Cannot fail: the whole message fits in MAX_DATAGRAM < 65,536 bytes.
            let size = u16::try_from(object.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(object);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Verdict;

    #[test]
    fn opcode_values_round_trip() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op.as_u8()), Some(op));
        }
        let known: Vec<u8> = Opcode::ALL.iter().map(|op| op.as_u8()).collect();
        for raw in 0..=u8::MAX {
            assert_eq!(
                Opcode::from_u8(raw).is_some(),
                known.contains(&raw),
                "{raw}"
            );
        }
    }

    #[test]
    fn src_rtt_packing_matches_squid() {
        let rtt = SrcRtt {
            hops: 3,
            rtt_ms: 45,
        };
        assert_eq!(rtt.to_option_data(), 0x0003_002d);
        assert_eq!(
            SrcRtt::from_option_data(0x0001_0001),
            SrcRtt { hops: 1, rtt_ms: 1 }
        );
        assert_eq!(
            SrcRtt::saturating(70_000, 5),
            SrcRtt {
                hops: 0xFFFF,
                rtt_ms: 5
            }
        );
    }

    #[test]
    fn set_src_rtt_sets_flag_only_for_nonzero_rtt() {
        let query = Message::query(7, "http://a/").with_options(Options::SRC_RTT);
        let mut reply = Message::reply(Opcode::Miss, &query).unwrap();
        reply.set_src_rtt(SrcRtt { hops: 4, rtt_ms: 0 });
        assert_eq!(
            (reply.options, reply.option_data),
            (Options::NONE, 0x0004_0000)
        );
        assert_eq!(reply.src_rtt(), None);
        reply.set_src_rtt(SrcRtt { hops: 4, rtt_ms: 9 });
        assert_eq!(
            (reply.options, reply.option_data),
            (Options::SRC_RTT, 0x0004_0009)
        );
        assert_eq!(reply.src_rtt(), Some(SrcRtt { hops: 4, rtt_ms: 9 }));
        // In a query the flag is a request, not a measurement.
        assert_eq!(query.src_rtt(), None);
    }

    #[test]
    fn reply_refuses_non_reply_opcodes() {
        let query = Message::query(1, "http://a/");
        for op in [Opcode::Query, Opcode::Secho, Opcode::Decho, Opcode::HitObj] {
            assert_eq!(Message::reply(op, &query), Err(WireError::NotAReply(op)));
        }
    }

    #[test]
    fn encode_refuses_and_writes_nothing() {
        let mut out = vec![0xAA];
        let nul = Message::query(1, b"http://a/\0b".to_vec());
        assert_eq!(
            encode(&nul, &mut out),
            Err(WireError::UrlContainsNul { at: 9 })
        );
        let mut mismatch = Message::query(1, "http://a/");
        mismatch.opcode = Opcode::Hit;
        assert_eq!(
            encode(&mismatch, &mut out),
            Err(WireError::PayloadMismatch {
                opcode: Opcode::Hit
            })
        );
        let big = Message::query(1, vec![b'a'; MAX_DATAGRAM - 24]);
        assert_eq!(
            encode(&big, &mut out),
            Err(WireError::TooLong {
                len: MAX_DATAGRAM + 1,
                max: MAX_DATAGRAM
            })
        );
        let huge = Message::query(1, vec![b'a'; 70_000]);
        assert!(matches!(
            encode(&huge, &mut out),
            Err(WireError::TooLong { .. })
        ));
        assert_eq!(out, [0xAA]);
        // One byte less fits exactly.
        let max = Message::query(1, vec![b'a'; MAX_DATAGRAM - 25]);
        assert_eq!(max.to_bytes().unwrap().len(), MAX_DATAGRAM);
    }

    #[test]
    fn verdicts() {
        let query_err = WireError::MissingNul {
            opcode: Opcode::Query,
            reqnum: 5,
        };
        assert_eq!(query_err.verdict(), Verdict::ReplyErr { reqnum: 5 });
        let reply_err = WireError::MissingNul {
            opcode: Opcode::Hit,
            reqnum: 5,
        };
        assert_eq!(reply_err.verdict(), Verdict::Drop);
        assert!(!WireError::BadVersion(3).reply_with_err());
        assert_eq!(
            WireError::QueryTooShort { reqnum: 9, len: 22 }.err_reply(),
            Some(Message::malformed_query_err(9))
        );
    }
}
