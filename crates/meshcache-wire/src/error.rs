//! The crate's error type, [`WireError`], and what a responder should do about a datagram that
//! failed to decode, [`Verdict`].
//!
//! Every variant is specific enough to match on and to log. Decode errors say what Squid 5.7
//! (Debian `5.7-2+deb12u6`, the build our vectors were captured from) does with the same
//! datagram, so a meshcache responder can behave identically: see [`WireError::verdict`].

use crate::icp::{Message, Opcode};

/// Everything that can go wrong while decoding or encoding a wire message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The datagram is shorter than its structure requires: under the 20-byte ICP header, a
    /// `HIT_OBJ` whose object is cut short, or a directory message cut inside its fixed part
    /// (`need` is then the smallest well-formed size given the fields read so far, e.g. a
    /// `DIR_DATA` whose count promises more node addresses than it carries). Squid ignores it.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the structure needs.
        need: usize,
        /// Bytes present.
        have: usize,
    },

    /// The datagram is longer than the largest ICP message Squid can receive (decode), or the
    /// message would encode to more than that (encode).
    #[error("message of {len} bytes exceeds the {max}-byte ICP maximum")]
    TooLong {
        /// Size of the datagram, or of the message that was to be encoded.
        len: usize,
        /// The limit, [`crate::icp::MAX_DATAGRAM`].
        max: usize,
    },

    /// The header's Message Length field differs from the number of bytes received. Squid drops
    /// the datagram without a reply.
    #[error("length field says {header} bytes but the datagram has {datagram}")]
    LengthMismatch {
        /// Value of the header's length field.
        header: u16,
        /// Bytes in the datagram.
        datagram: usize,
    },

    /// The version byte is not 2. Squid drops versions other than 2 and 3; it answers a
    /// version-3 query in v2 format (and Debian's 5.7-2+deb12u6 then crashes), but meshcache
    /// speaks v2 only and drops v3 too.
    #[error("unsupported ICP version {0} (only 2 is spoken)")]
    BadVersion(u8),

    /// Opcode 0, `ICP_OP_INVALID`. Squid ignores it without logging.
    #[error("opcode 0 (ICP_OP_INVALID)")]
    InvalidOpcode,

    /// An opcode with no ICP v2 meaning (5–9, 12–20, 24 and above). Squid logs
    /// "UNKNOWN OPCODE" and drops it.
    #[error("unknown ICP opcode {0}")]
    UnknownOpcode(u8),

    /// A `QUERY` too short to hold the requester address and a NUL-terminated URL (under 25
    /// bytes). Squid answers `ICP_OP_ERR` with an empty URL.
    #[error("ICP query of {len} bytes is too short for a requester address and a URL")]
    QueryTooShort {
        /// Request number of the query (echoed in the ERR reply).
        reqnum: u32,
        /// Datagram length.
        len: usize,
    },

    /// No NUL byte ends the URL. A `QUERY` gets `ICP_OP_ERR` with an empty URL; anything else
    /// is dropped.
    #[error("{opcode} URL is not NUL-terminated")]
    MissingNul {
        /// Opcode of the message.
        opcode: Opcode,
        /// Request number of the message.
        reqnum: u32,
    },

    /// Bytes follow the NUL that ends the URL (a second NUL, padding, or a URL with an embedded
    /// NUL), or follow a `HIT_OBJ` object. A `QUERY` gets `ICP_OP_ERR` with an empty URL;
    /// anything else is dropped.
    #[error("{extra} unexpected bytes after the end of the {opcode} payload")]
    TrailingBytes {
        /// Opcode of the message.
        opcode: Opcode,
        /// Request number of the message.
        reqnum: u32,
        /// How many bytes follow the end of the payload.
        extra: usize,
    },

    /// Encode: the URL contains a NUL byte, which would end it early on the wire.
    #[error("URL contains a NUL byte at offset {at}")]
    UrlContainsNul {
        /// Offset of the first NUL in the URL.
        at: usize,
    },

    /// Encode: the payload variant does not fit the opcode (a `QUERY` needs
    /// `Payload::Query`, a `HIT_OBJ` needs `Payload::HitObj`, every other opcode
    /// `Payload::Url`).
    #[error("payload variant does not match opcode {opcode}")]
    PayloadMismatch {
        /// The message's opcode.
        opcode: Opcode,
    },

    /// `Message::reply` was asked for an opcode that is not a plain URL reply (only HIT, MISS,
    /// ERR, MISS_NOFETCH and DENIED are).
    #[error("{0} is not a reply opcode")]
    NotAReply(Opcode),

    /// A summary's hash parameters are out of range (1–32 functions of 1–32 bits, an array of
    /// 1 to 2^31 − 1 bits).
    #[error(
        "bad summary parameters: {functions} functions of {function_bits} bits, {bits}-bit array"
    )]
    BadSummaryParams {
        /// Number of hash functions.
        functions: u16,
        /// Bits per function.
        function_bits: u16,
        /// Array size in bits.
        bits: u32,
    },

    /// A summary update names a bit beyond the array.
    #[error("bit {bit} is beyond the {bits}-bit array")]
    BitOutOfRange {
        /// The bit index.
        bit: u32,
        /// Array size in bits.
        bits: u32,
    },

    /// A summary update's count disagrees with its length.
    #[error("update count {count} does not match the {payload} payload bytes")]
    CountMismatch {
        /// The count field.
        count: u32,
        /// Bytes after the update header.
        payload: usize,
    },

    /// A `DIRUPDATE` with options or option data set (ours never has them).
    #[error("summary update with options set")]
    UnexpectedOptions,

    /// A summary array without its magic number.
    #[error("not a summary array (bad magic)")]
    BadMagic,

    /// A summary array of a version we do not read.
    #[error("unknown summary array version {0}")]
    UnknownSummaryVersion(u16),

    /// A summary array with non-zero reserved bytes, or padding bits beyond the array set.
    #[error("summary array has reserved or padding bits set")]
    ReservedBitsSet,

    /// A summary array whose mask is longer than its size says.
    #[error("{extra} bytes after the end of the summary array")]
    SummaryTrailing {
        /// Bytes beyond the mask.
        extra: usize,
    },

    /// A summary array with so many bits set that it would call almost anything a hit.
    #[error("summary array is useless: {set} of {bits} bits set (over 65%)")]
    TooFull {
        /// Bits set.
        set: u64,
        /// Array size in bits.
        bits: u32,
    },

    /// The directory decoder was given a datagram whose opcode is not a directory message
    /// (`DIR_GET` 15, `DIR_DATA` 16, `DIR_ADD` 17, `DIR_DEL` 19); see
    /// [`crate::directory::is_directory_opcode`].
    #[error("opcode {0} is not a directory message")]
    NotDirectoryOpcode(u8),

    /// A directory message with option bits its opcode does not define (`DIR_GET` defines
    /// 0x1 and 0x2, `DIR_DATA` 0x1, `DIR_ADD` and `DIR_DEL` none). Dropped.
    #[error("directory opcode {opcode}: undefined option bits {bits:#010x}")]
    DirUnknownFlags {
        /// Opcode of the message.
        opcode: u8,
        /// The undefined bits that were set.
        bits: u32,
    },

    /// A `DIR_DATA`, `DIR_ADD` or `DIR_DEL` with non-zero option data (only `DIR_GET` uses
    /// the field, for alpha). Dropped.
    #[error("directory opcode {opcode}: option data {value:#010x} must be 0")]
    DirOptionData {
        /// Opcode of the message.
        opcode: u8,
        /// The option data received.
        value: u32,
    },

    /// A `DIR_GET` or `DIR_DATA` with no URL: the payload ends right after its fixed part.
    #[error("directory opcode {opcode}: no URL")]
    DirNoUrl {
        /// Opcode of the message.
        opcode: u8,
    },

    /// A `DIR_GET` or `DIR_DATA` with an empty URL: a NUL right after the fixed part (decode),
    /// or an empty URL given to the encoder.
    #[error("directory opcode {opcode}: empty URL")]
    DirEmptyUrl {
        /// Opcode of the message.
        opcode: u8,
    },

    /// A `DIR_GET` or `DIR_DATA` whose last byte is not the NUL ending its URL.
    #[error("directory opcode {opcode}: URL is not NUL-terminated")]
    DirMissingNul {
        /// Opcode of the message.
        opcode: u8,
    },

    /// Bytes after the end of a directory payload: in a `DIR_GET` or `DIR_DATA`, after the NUL
    /// that ends its URL (a second NUL, a second URL, padding); in a `DIR_ADD` or `DIR_DEL`, a
    /// partial key, i.e. the bytes after the holder address are not a multiple of 16 (even
    /// when fewer than 16 follow it).
    #[error("directory opcode {opcode}: {extra} unexpected bytes after the end of the payload")]
    DirTrailingBytes {
        /// Opcode of the message.
        opcode: u8,
        /// How many bytes follow the URL's NUL, or the last whole key (the bytes after the
        /// holder address mod 16).
        extra: usize,
    },

    /// A `DIR_ADD` or `DIR_DEL` with no key: nothing follows the holder address (decode), or
    /// an empty key list (encode).
    #[error("directory opcode {opcode}: no store key")]
    DirNoKeys {
        /// Opcode of the message.
        opcode: u8,
    },
}

/// What a responder should do with a datagram that failed to decode, matching Squid 5.7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Send nothing back (Squid at most logs it).
    Drop,
    /// Answer the sender with `ICP_OP_ERR`, this request number and an empty URL (a 21-byte
    /// datagram); [`WireError::err_reply`] builds it.
    ReplyErr {
        /// Request number to echo.
        reqnum: u32,
    },
}

impl WireError {
    /// What Squid does with a datagram that fails to decode with this error.
    ///
    /// Only a malformed `QUERY` payload (too short, no final NUL, bytes after the NUL) is
    /// answered, with `ICP_OP_ERR`; every header error, every unknown opcode and every
    /// malformed reply is dropped. Encode-side errors return [`Verdict::Drop`]: there is no
    /// datagram to answer.
    pub fn verdict(&self) -> Verdict {
        match *self {
            WireError::QueryTooShort { reqnum, .. } => Verdict::ReplyErr { reqnum },
            WireError::MissingNul {
                opcode: Opcode::Query,
                reqnum,
            }
            | WireError::TrailingBytes {
                opcode: Opcode::Query,
                reqnum,
                ..
            } => Verdict::ReplyErr { reqnum },
            _ => Verdict::Drop,
        }
    }

    /// `true` when the sender should get an `ICP_OP_ERR` reply (see [`WireError::verdict`]).
    pub fn reply_with_err(&self) -> bool {
        matches!(self.verdict(), Verdict::ReplyErr { .. })
    }

    /// The exact reply Squid sends for this error, if it sends one: `ICP_OP_ERR`, version 2,
    /// the query's request number, flags and option data 0, sender 0, and an empty URL.
    pub fn err_reply(&self) -> Option<Message> {
        match self.verdict() {
            Verdict::ReplyErr { reqnum } => Some(Message::malformed_query_err(reqnum)),
            Verdict::Drop => None,
        }
    }
}
