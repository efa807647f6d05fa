//! Summary Cache (SC-ICP) messages: delta updates over ICP and the whole array over HTTP.
//!
//! The Summary Cache paper (Fan, Cao, Almeida, Broder, SIGCOMM 1998) adds one opcode to ICP v2,
//! `ICP_OP_DIRUPDATE` = 20 (Squid never uses 20). After the usual 20-byte ICP header come the
//! hash parameters and a list of updates, all big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 20 | 2 | number of hash functions |
//! | 22 | 2 | bits of the hash taken per function |
//! | 24 | 4 | array size in bits |
//! | 28 | 4 | number of updates N |
//! | 32 | 4·N | updates |
//!
//! Each update is a 32-bit word: the low 31 bits are a bit index, the top bit the bit's new
//! value — **1 means clear the bit, 0 means set it** (the prototype's convention). Updates carry
//! absolute values rather than flips, so a lost or repeated message corrupts nothing that a later
//! one does not put right. We use the ICP request number as the sender's update sequence
//! number (consecutive; a gap means a lost update), and leave options and option data at 0.
//!
//! The whole array ([`FullArray`]) travels over HTTP, for a peer that starts, restarts or lost
//! deltas: a 24-byte header (magic `MCSA`, version 1, the hash parameters, the sequence number
//! of the last update it includes, the number of documents), then the mask, least significant
//! bit first in each byte as in Squid's Cache Digest.
//!
//! Both decoders are strict (every accepted input re-encodes to the same bytes) and never panic.

use std::net::Ipv4Addr;

use crate::error::WireError;
use crate::icp::MAX_DATAGRAM;

/// ICP opcode of a directory update.
pub const OPCODE_DIRUPDATE: u8 = 20;
/// The ICP version a `DIRUPDATE` carries.
const ICP_VERSION: u8 = 2;
/// ICP header plus the update header.
pub const DIRUPDATE_HEADER: usize = 32;
/// Largest update count that keeps a `DIRUPDATE` inside a 1472-byte UDP payload (an Ethernet
/// MTU): (1472 − 32) / 4.
pub const MAX_UPDATES_PER_DATAGRAM: usize = 360;
/// Length of a [`FullArray`]'s header.
pub const FULL_ARRAY_HEADER: usize = 24;
/// The [`FullArray`] version we write and read.
pub const FULL_ARRAY_VERSION: u16 = 1;
/// Share of bits set above which an array is useless (Squid rejects digests over 65 % full).
pub const MAX_FILL: f64 = 0.65;
const MAGIC: &[u8; 4] = b"MCSA";
const CLEAR: u32 = 0x8000_0000;

/// A summary's hash functions and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HashParams {
    /// Number of hash functions.
    pub functions: u16,
    /// Bits of the hash each function takes.
    pub function_bits: u16,
    /// Array size in bits.
    pub bits: u32,
}

impl HashParams {
    /// 1–32 functions of 1–32 bits, an array of 1 to 2^31 − 1 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        let ok = (1..=32).contains(&self.functions)
            && (1..=32).contains(&self.function_bits)
            && self.bits > 0
            && self.bits < CLEAR;
        if ok {
            Ok(())
        } else {
            Err(WireError::BadSummaryParams {
                functions: self.functions,
                function_bits: self.function_bits,
                bits: self.bits,
            })
        }
    }

    fn mask_len(&self) -> usize {
        (self.bits as usize).div_ceil(8)
    }
}

/// One bit's new value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Update {
    /// The bit index.
    pub bit: u32,
    /// Its new value.
    pub set: bool,
}

/// An `ICP_OP_DIRUPDATE` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirUpdate {
    /// The sender's update sequence number (in the ICP request-number field).
    pub seq: u32,
    /// The ICP sender-address field.
    pub sender: Ipv4Addr,
    /// The hash parameters of the array the updates apply to.
    pub params: HashParams,
    /// The bits' new values.
    pub updates: Vec<Update>,
}

/// Appends the datagram for `msg` to `out`.
pub fn encode_dirupdate(msg: &DirUpdate, out: &mut Vec<u8>) -> Result<(), WireError> {
    msg.params.validate()?;
    let len = DIRUPDATE_HEADER + 4 * msg.updates.len();
    if len > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            len,
            max: MAX_DATAGRAM,
        });
    }
    if let Some(u) = msg.updates.iter().find(|u| u.bit >= msg.params.bits) {
        return Err(WireError::BitOutOfRange {
            bit: u.bit,
            bits: msg.params.bits,
        });
    }
    out.reserve(len);
    out.push(OPCODE_DIRUPDATE);
    out.push(ICP_VERSION);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&msg.seq.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&msg.sender.octets());
    out.extend_from_slice(&msg.params.functions.to_be_bytes());
    out.extend_from_slice(&msg.params.function_bits.to_be_bytes());
    out.extend_from_slice(&msg.params.bits.to_be_bytes());
    out.extend_from_slice(&(msg.updates.len() as u32).to_be_bytes());
    for u in &msg.updates {
        let word = if u.set { u.bit } else { u.bit | CLEAR };
        out.extend_from_slice(&word.to_be_bytes());
    }
    Ok(())
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes an `ICP_OP_DIRUPDATE` datagram.
pub fn decode_dirupdate(d: &[u8]) -> Result<DirUpdate, WireError> {
    if d.len() < DIRUPDATE_HEADER {
        return Err(WireError::Truncated {
            need: DIRUPDATE_HEADER,
            have: d.len(),
        });
    }
    if d.len() > MAX_DATAGRAM {
        return Err(WireError::TooLong {
            len: d.len(),
            max: MAX_DATAGRAM,
        });
    }
    if d[0] != OPCODE_DIRUPDATE {
        return Err(WireError::UnknownOpcode(d[0]));
    }
    if d[1] != ICP_VERSION {
        return Err(WireError::BadVersion(d[1]));
    }
    let header = be16(d, 2);
    if usize::from(header) != d.len() {
        return Err(WireError::LengthMismatch {
            header,
            datagram: d.len(),
        });
    }
    if be32(d, 8) != 0 || be32(d, 12) != 0 {
        return Err(WireError::UnexpectedOptions);
    }
    let params = HashParams {
        functions: be16(d, 20),
        function_bits: be16(d, 22),
        bits: be32(d, 24),
    };
    params.validate()?;
    let count = be32(d, 28);
    let payload = d.len() - DIRUPDATE_HEADER;
    if payload % 4 != 0 || (payload / 4) as u64 != u64::from(count) {
        return Err(WireError::CountMismatch { count, payload });
    }
    let mut updates = Vec::with_capacity(payload / 4);
    for w in d[DIRUPDATE_HEADER..].chunks_exact(4) {
        let word = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
        let bit = word & !CLEAR;
        if bit >= params.bits {
            return Err(WireError::BitOutOfRange {
                bit,
                bits: params.bits,
            });
        }
        updates.push(Update {
            bit,
            set: word & CLEAR == 0,
        });
    }
    Ok(DirUpdate {
        seq: be32(d, 4),
        sender: Ipv4Addr::new(d[16], d[17], d[18], d[19]),
        params,
        updates,
    })
}

/// A whole summary array, as served over HTTP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullArray {
    /// Sequence number of the last update the array includes (the receiver applies updates
    /// numbered after it).
    pub seq: u32,
    /// Hash parameters and size.
    pub params: HashParams,
    /// Documents summarised (informational).
    pub entries: u32,
    /// The mask: `ceil(bits / 8)` bytes, bit `b` in byte `b >> 3` at value `1 << (b & 7)`.
    pub mask: Vec<u8>,
}

/// Encodes a whole array.
pub fn encode_full(a: &FullArray) -> Result<Vec<u8>, WireError> {
    a.params.validate()?;
    let need = a.params.mask_len();
    if a.mask.len() != need {
        return Err(WireError::Truncated {
            need,
            have: a.mask.len(),
        });
    }
    let mut out = Vec::with_capacity(FULL_ARRAY_HEADER + need);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FULL_ARRAY_VERSION.to_be_bytes());
    out.extend_from_slice(&a.params.functions.to_be_bytes());
    out.extend_from_slice(&a.params.function_bits.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&a.params.bits.to_be_bytes());
    out.extend_from_slice(&a.seq.to_be_bytes());
    out.extend_from_slice(&a.entries.to_be_bytes());
    out.extend_from_slice(&a.mask);
    Ok(out)
}

/// Decodes a whole array; refuses one more than [`MAX_FILL`] full.
pub fn decode_full(b: &[u8]) -> Result<FullArray, WireError> {
    if b.len() < FULL_ARRAY_HEADER {
        return Err(WireError::Truncated {
            need: FULL_ARRAY_HEADER,
            have: b.len(),
        });
    }
    if &b[..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let version = be16(b, 4);
    if version != FULL_ARRAY_VERSION {
        return Err(WireError::UnknownSummaryVersion(version));
    }
    let params = HashParams {
        functions: be16(b, 6),
        function_bits: be16(b, 8),
        bits: be32(b, 12),
    };
    if be16(b, 10) != 0 {
        return Err(WireError::ReservedBitsSet);
    }
    params.validate()?;
    let need = FULL_ARRAY_HEADER + params.mask_len();
    if b.len() < need {
        return Err(WireError::Truncated {
            need,
            have: b.len(),
        });
    }
    if b.len() > need {
        return Err(WireError::SummaryTrailing {
            extra: b.len() - need,
        });
    }
    let mask = b[FULL_ARRAY_HEADER..].to_vec();
    let spare = params.bits % 8;
    if spare != 0 && mask.last().is_some_and(|&last| last >> spare != 0) {
        return Err(WireError::ReservedBitsSet);
    }
    let set: u64 = mask.iter().map(|x| u64::from(x.count_ones())).sum();
    if set as f64 > MAX_FILL * f64::from(params.bits) {
        return Err(WireError::TooFull {
            set,
            bits: params.bits,
        });
    }
    Ok(FullArray {
        seq: be32(b, 16),
        params,
        entries: be32(b, 20),
        mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: HashParams = HashParams {
        functions: 4,
        function_bits: 32,
        bits: 800,
    };

    #[test]
    fn a_dirupdate_byte_for_byte() {
        let msg = DirUpdate {
            seq: 0x0102_0304,
            sender: Ipv4Addr::new(127, 0, 0, 11),
            params: PARAMS,
            updates: vec![
                Update { bit: 0, set: true },
                Update { bit: 5, set: false },
                Update {
                    bit: 799,
                    set: true,
                },
            ],
        };
        let mut out = Vec::new();
        encode_dirupdate(&msg, &mut out).expect("encodes");
        let want: Vec<u8> = [
            &[20u8, 2, 0, 44][..],
            &[1, 2, 3, 4],
            &[0, 0, 0, 0],
            &[0, 0, 0, 0],
            &[127, 0, 0, 11],
            &[0, 4, 0, 32],
            &[0, 0, 3, 32],
            &[0, 0, 0, 3],
            &[0, 0, 0, 0],
            &[0x80, 0, 0, 5],
            &[0, 0, 3, 0x1F],
        ]
        .concat();
        assert_eq!(out, want);
        assert_eq!(decode_dirupdate(&want), Ok(msg));
    }

    #[test]
    fn dirupdate_mutations_are_refused() {
        let msg = DirUpdate {
            seq: 7,
            sender: Ipv4Addr::UNSPECIFIED,
            params: PARAMS,
            updates: vec![Update { bit: 9, set: true }],
        };
        let mut good = Vec::new();
        encode_dirupdate(&msg, &mut good).expect("encodes");
        let short = &good[..good.len() - 1];
        assert!(matches!(
            decode_dirupdate(short),
            Err(WireError::LengthMismatch { .. })
        ));
        let mut count = good.clone();
        count[31] = 2;
        assert!(matches!(
            decode_dirupdate(&count),
            Err(WireError::CountMismatch { .. })
        ));
        let mut beyond = good.clone();
        beyond[32..36].copy_from_slice(&800u32.to_be_bytes());
        assert_eq!(
            decode_dirupdate(&beyond),
            Err(WireError::BitOutOfRange {
                bit: 800,
                bits: 800
            })
        );
        let mut opts = good.clone();
        opts[11] = 1;
        assert_eq!(decode_dirupdate(&opts), Err(WireError::UnexpectedOptions));
        let mut funcs = good.clone();
        funcs[21] = 0;
        assert!(matches!(
            decode_dirupdate(&funcs),
            Err(WireError::BadSummaryParams { .. })
        ));
        let mut v3 = good;
        v3[1] = 3;
        assert_eq!(decode_dirupdate(&v3), Err(WireError::BadVersion(3)));
        let too_many = DirUpdate {
            updates: vec![Update { bit: 1, set: true }; 5000],
            ..msg
        };
        assert!(matches!(
            encode_dirupdate(&too_many, &mut Vec::new()),
            Err(WireError::TooLong { .. })
        ));
    }

    #[test]
    fn a_full_array_byte_for_byte() {
        let a = FullArray {
            seq: 9,
            params: HashParams {
                functions: 4,
                function_bits: 32,
                bits: 12,
            },
            entries: 1,
            mask: vec![0b1000_0001, 0b0000_1000],
        };
        let bytes = encode_full(&a).expect("encodes");
        let want: Vec<u8> = [
            &b"MCSA"[..],
            &[0, 1, 0, 4, 0, 32, 0, 0],
            &[0, 0, 0, 12],
            &[0, 0, 0, 9],
            &[0, 0, 0, 1],
            &[0x81, 0x08],
        ]
        .concat();
        assert_eq!(bytes, want);
        assert_eq!(decode_full(&want), Ok(a));
        let mut padding = want.clone();
        padding[25] = 0x18;
        assert_eq!(decode_full(&padding), Err(WireError::ReservedBitsSet));
        let mut full = want.clone();
        full[24] = 0xFF;
        full[25] = 0x0F;
        assert!(matches!(decode_full(&full), Err(WireError::TooFull { .. })));
        let mut trailing = want.clone();
        trailing.push(0);
        assert!(matches!(
            decode_full(&trailing),
            Err(WireError::SummaryTrailing { extra: 1 })
        ));
        assert!(matches!(
            decode_full(&want[..25]),
            Err(WireError::Truncated { .. })
        ));
        let mut v2 = want.clone();
        v2[5] = 2;
        assert_eq!(decode_full(&v2), Err(WireError::UnknownSummaryVersion(2)));
        let mut magic = want;
        magic[0] = b'X';
        assert_eq!(decode_full(&magic), Err(WireError::BadMagic));
    }
}
