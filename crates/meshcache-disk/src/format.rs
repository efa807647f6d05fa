//! The on-disk record: a 64-byte header, the holder's metadata, the body.
//!
//! Every object on disk, in the slab or in a file of its own, is one record:
//!
//! ```text
//!  0  magic       4  b"MCR1" (b"DEAD" once killed)
//!  4  kind        1  1 = an object, 2 = a Vary marker
//!  5  flags       1  0 (reserved)
//!  6  header_len  2  64
//!  8  serial      8  when it was written: (run << 32) | sequence, larger is newer
//! 16  key        16  the object's store key
//! 32  meta_len    4  bytes of metadata after the header
//! 36  meta_crc    4  CRC-32C of the metadata
//! 40  body_len    8  bytes of body after the metadata
//! 48  body_crc    4  CRC-32C of the body
//! 52  expires     4  fresh until (Unix seconds; 0: not fresh)
//! 56  stored      4  when it was stored (Unix seconds)
//! 60  header_crc  4  CRC-32C of bytes 0..60
//! ```
//!
//! All integers are little-endian. The metadata is opaque here: the proxy encodes its status,
//! headers and freshness there. Nothing of a record is trusted before its checksums match:
//! [`Header::decode`] checks magic, version, lengths and the header's own CRC, and
//! [`Header::verify`] the metadata and body against theirs. A record written over, torn by a
//! crash, truncated or foreign fails one of them. Decoding never panics, whatever the bytes.

use meshcache_store::StoreKey;

/// The header's length in bytes.
pub const HEADER_LEN: usize = 64;

/// Magic of a live record (format version 1).
pub const MAGIC: [u8; 4] = *b"MCR1";

/// Magic of a killed record: a removed object whose bytes are still there.
pub const DEAD: [u8; 4] = *b"DEAD";

/// The most metadata a record may carry (the proxy's response heads are far smaller).
pub const MAX_META: u32 = 1 << 20;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A stored response.
    Object,
    /// A URL's Vary marker: which request fields select its variants, and which variants exist.
    Vary,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Object => 1,
            Kind::Vary => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Object),
            2 => Some(Kind::Vary),
            _ => None,
        }
    }
}

/// A record's header, decoded and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the record holds.
    pub kind: Kind,
    /// Write order: larger is newer.
    pub serial: u64,
    /// The object's key.
    pub key: StoreKey,
    /// Bytes of metadata.
    pub meta_len: u32,
    /// CRC-32C of the metadata.
    pub meta_crc: u32,
    /// Bytes of body.
    pub body_len: u64,
    /// CRC-32C of the body.
    pub body_crc: u32,
    /// Fresh until (Unix seconds; 0: not fresh).
    pub expires: u32,
    /// When it was stored (Unix seconds).
    pub stored: u32,
}

/// Why bytes are not a valid record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// Fewer bytes than the header or the lengths it gives.
    #[error("truncated")]
    Truncated,
    /// Not a record of ours (or a version we do not know).
    #[error("not a record")]
    Foreign,
    /// A record that was removed.
    #[error("removed")]
    Dead,
    /// The header's own checksum does not match.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// Lengths out of range.
    #[error("impossible lengths")]
    Lengths,
    /// The metadata does not match its checksum.
    #[error("metadata checksum mismatch")]
    MetaChecksum,
    /// The body does not match its checksum.
    #[error("body checksum mismatch")]
    BodyChecksum,
    /// A valid record of another key than the one expected.
    #[error("another object's record")]
    WrongKey,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(word)
}

impl Header {
    /// A header for `meta` and `body`, their checksums computed.
    pub fn new(
        kind: Kind,
        serial: u64,
        key: StoreKey,
        meta: &[u8],
        body: &[u8],
        expires: u32,
        stored: u32,
    ) -> Header {
        Header {
            kind,
            serial,
            key,
            meta_len: meta.len() as u32,
            meta_crc: crc32c::crc32c(meta),
            body_len: body.len() as u64,
            body_crc: crc32c::crc32c(body),
            expires,
            stored,
        }
    }

    /// The record's whole length: header, metadata and body.
    pub fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.meta_len) + self.body_len
    }

    /// Where the body starts, from the record's start.
    pub fn body_offset(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.meta_len)
    }

    /// The 64 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.kind.byte();
        b[5] = 0;
        b[6..8].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.serial.to_le_bytes());
        b[16..32].copy_from_slice(&self.key.0);
        b[32..36].copy_from_slice(&self.meta_len.to_le_bytes());
        b[36..40].copy_from_slice(&self.meta_crc.to_le_bytes());
        b[40..48].copy_from_slice(&self.body_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.body_crc.to_le_bytes());
        b[52..56].copy_from_slice(&self.expires.to_le_bytes());
        b[56..60].copy_from_slice(&self.stored.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header from the first bytes of `bytes` (more may follow).
    ///
    /// # Errors
    ///
    /// What is wrong with it, if anything ([`Damage`]).
    pub fn decode(bytes: &[u8]) -> Result<Header, Damage> {
        let b = bytes.get(..HEADER_LEN).ok_or(Damage::Truncated)?;
        if b[0..4] == DEAD {
            return Err(Damage::Dead);
        }
        if b[0..4] != MAGIC || u16::from_le_bytes([b[6], b[7]]) != HEADER_LEN as u16 {
            return Err(Damage::Foreign);
        }
        if crc32c::crc32c(&b[..60]) != u32_at(b, 60) {
            return Err(Damage::HeaderChecksum);
        }
        let kind = Kind::from_byte(b[4]).ok_or(Damage::Foreign)?;
        let mut key = [0u8; 16];
        key.copy_from_slice(&b[16..32]);
        let header = Header {
            kind,
            serial: u64_at(b, 8),
            key: StoreKey(key),
            meta_len: u32_at(b, 32),
            meta_crc: u32_at(b, 36),
            body_len: u64_at(b, 40),
            body_crc: u32_at(b, 48),
            expires: u32_at(b, 52),
            stored: u32_at(b, 56),
        };
        if header.meta_len > MAX_META || header.body_len > u64::MAX / 2 {
            return Err(Damage::Lengths);
        }
        Ok(header)
    }

    /// Checks a whole record in `record` (header first) against this header: its length,
    /// the metadata's and the body's checksums. Returns the metadata and the body.
    ///
    /// # Errors
    ///
    /// [`Damage::Truncated`] if `record` is shorter than the header says, or the checksum that
    /// does not match.
    pub fn verify<'a>(&self, record: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), Damage> {
        let len = usize::try_from(self.record_len()).map_err(|_| Damage::Lengths)?;
        let record = record.get(..len).ok_or(Damage::Truncated)?;
        let meta_end = HEADER_LEN + self.meta_len as usize;
        let (meta, body) = (&record[HEADER_LEN..meta_end], &record[meta_end..]);
        if crc32c::crc32c(meta) != self.meta_crc {
            return Err(Damage::MetaChecksum);
        }
        if crc32c::crc32c(body) != self.body_crc {
            return Err(Damage::BodyChecksum);
        }
        Ok((meta, body))
    }

    /// As [`Header::verify`] for the metadata alone (`meta` is exactly the metadata).
    ///
    /// # Errors
    ///
    /// [`Damage::Truncated`] or [`Damage::MetaChecksum`].
    pub fn verify_meta(&self, meta: &[u8]) -> Result<(), Damage> {
        if meta.len() != self.meta_len as usize {
            return Err(Damage::Truncated);
        }
        if crc32c::crc32c(meta) != self.meta_crc {
            return Err(Damage::MetaChecksum);
        }
        Ok(())
    }
}

/// A whole record's bytes for `header`, `meta` and `body`, as the slab stores them.
#[cfg(test)]
pub fn encode_record(header: &Header, meta: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + meta.len() + body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(meta);
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(meta: &[u8], body: &[u8]) -> Header {
        Header::new(
            Kind::Object,
            (7 << 32) | 3,
            StoreKey::get("http://a.test/x"),
            meta,
            body,
            1_900_000_000,
            1_800_000_000,
        )
    }

    #[test]
    fn a_record_round_trips() {
        let h = header(b"meta", b"the body");
        let rec = encode_record(&h, b"meta", b"the body");
        assert_eq!(rec.len() as u64, h.record_len());
        let back = Header::decode(&rec).expect("decodes");
        assert_eq!(back, h);
        assert_eq!(back.verify(&rec), Ok((&b"meta"[..], &b"the body"[..])));
        assert_eq!(back.body_offset(), 68);
    }

    #[test]
    fn damage_is_named() {
        let h = header(b"meta", b"the body");
        let rec = encode_record(&h, b"meta", b"the body");
        assert_eq!(Header::decode(&rec[..63]), Err(Damage::Truncated));
        assert_eq!(h.verify(&rec[..rec.len() - 1]), Err(Damage::Truncated));
        let mut dead = rec.clone();
        dead[..4].copy_from_slice(&DEAD);
        assert_eq!(Header::decode(&dead), Err(Damage::Dead));
        let mut foreign = rec.clone();
        foreign[..4].copy_from_slice(b"ELF\x7f");
        assert_eq!(Header::decode(&foreign), Err(Damage::Foreign));
        let mut flipped = rec.clone();
        flipped[20] ^= 1;
        assert_eq!(Header::decode(&flipped), Err(Damage::HeaderChecksum));
        let mut meta = rec.clone();
        meta[65] ^= 1;
        assert_eq!(h.verify(&meta), Err(Damage::MetaChecksum));
        let mut body = rec.clone();
        *body.last_mut().expect("body") ^= 1;
        assert_eq!(h.verify(&body), Err(Damage::BodyChecksum));
    }

    proptest! {
        /// Any header, metadata and body come back exactly.
        #[test]
        fn round_trip(serial: u64, key: [u8; 16], meta in proptest::collection::vec(any::<u8>(), 0..300),
                      body in proptest::collection::vec(any::<u8>(), 0..3000), expires: u32, stored: u32,
                      vary: bool) {
            let kind = if vary { Kind::Vary } else { Kind::Object };
            let h = Header::new(kind, serial, StoreKey(key), &meta, &body, expires, stored);
            let rec = encode_record(&h, &meta, &body);
            let back = Header::decode(&rec).expect("decodes");
            prop_assert_eq!(back, h);
            let (m, b) = back.verify(&rec).expect("verifies");
            prop_assert_eq!(m, &meta[..]);
            prop_assert_eq!(b, &body[..]);
        }

        /// Arbitrary bytes never panic the decoder, and a flipped byte never passes.
        #[test]
        fn arbitrary_bytes_are_refused_not_panicked_on(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = Header::decode(&bytes) {
                let _ = h.verify(&bytes);
            }
        }

        #[test]
        fn any_flipped_bit_is_caught(body in proptest::collection::vec(any::<u8>(), 1..500), at: usize, bit in 0u8..8) {
            let h = header(b"m", &body);
            let mut rec = encode_record(&h, b"m", &body);
            let at = at % rec.len();
            rec[at] ^= 1 << bit;
            let ok = Header::decode(&rec).and_then(|h| h.verify(&rec).map(|_| ()));
            prop_assert!(ok.is_err(), "a flip at byte {} passed", at);
        }
    }
}
