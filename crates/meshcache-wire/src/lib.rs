//! # meshcache-wire — pure wire codecs
//!
//! This crate turns protocol messages into bytes and bytes into messages, and nothing else: no
//! sockets, no clock, no globals, no tokio. The cooperation driver in `meshcache-proxy` owns the
//! UDP sockets, and the sans-IO state machines in `meshcache-dcm` decide what to send; both
//! call into this crate to speak the exact bytes a Squid 5.7 peer sends and accepts.
//!
//! ## Layout
//!
//! - [`icp`] — ICP v2 (RFC 2186/2187) as Squid 5.7 speaks it: [`icp::Message`], [`icp::decode`],
//!   [`icp::encode`], option flags, the SRC_RTT packing, and which malformed datagrams Squid
//!   answers with `ICP_OP_ERR` versus silently drops ([`Verdict`]). The facts come from
//!   `shared/spec/icp.md`; the byte vectors in `tests/vectors/` were captured from Debian's
//!   Squid 5.7 (`tests/vectors/README.md` says how).
//! - `error` — [`WireError`], the crate's one error enum, and [`Verdict`].
//!
//! - [`summary`] — Summary Cache (SC-ICP): `ICP_OP_DIRUPDATE` delta updates and the whole
//!   array served over HTTP.
//!
//! - [`carp`] — CARP v1 hash routing (draft-vinod-carp-v1-03) as Squid 5.7 computes it: URL,
//!   member and combined hashes, load-factor multipliers, and [`carp::CarpArray`], which ranks
//!   the members for a URL with Squid's pick first.
//!
//! - [`directory`] — directory-based DCM: `ICP_DIR_GET`, `ICP_DIR_DATA`, `ICP_DIR_ADD` and
//!   `ICP_DIR_DEL`, batching of holder updates, and the rendezvous placement of entries.
//!
//! - [`multicast`] — the multicast search's (Berkeley protocol's) query flag: answer a hit,
//!   stay silent on a miss.
//!
//! Later codecs get a module each next to these.
//!
//! ## Guarantees
//!
//! - Decoders never panic, on any input (property-tested, and a cargo-fuzz target in `fuzz/`).
//! - Decoding is strict: every datagram it accepts re-encodes to the identical bytes.
//! - Encoders refuse what a peer would reject (NUL inside a URL, datagrams over
//!   [`icp::MAX_DATAGRAM`] bytes) instead of sending it.

pub mod carp;
pub mod directory;
mod error;
pub mod icp;
pub mod multicast;
pub mod summary;

pub use error::{Verdict, WireError};

/// Body of the `summary_decode` cargo-fuzz target: decodes `data` as a delta update and as a
/// whole array; whatever decodes must re-encode to exactly `data`.
#[doc(hidden)]
pub fn fuzz_summary_decode(data: &[u8]) {
    if let Ok(m) = summary::decode_dirupdate(data) {
        let mut out = Vec::new();
        assert!(summary::encode_dirupdate(&m, &mut out).is_ok());
        assert_eq!(out, data, "a decoded update re-encodes identically");
    }
    if let Ok(a) = summary::decode_full(data) {
        assert_eq!(
            summary::encode_full(&a).ok().as_deref(),
            Some(data),
            "a decoded array re-encodes identically"
        );
    }
}

/// Body of the `directory_decode` cargo-fuzz target: decodes `data` as a directory message;
/// whatever decodes must re-encode to exactly `data` (and a `DIR_ADD`/`DIR_DEL`'s keys must
/// batch back into that one datagram); every error must be dropped, never answered.
#[doc(hidden)]
pub fn fuzz_directory_decode(data: &[u8]) {
    match directory::decode(data) {
        Ok(msg) => {
            assert!(
                data.first()
                    .is_some_and(|&op| directory::is_directory_opcode(op)),
                "decoded a datagram without a directory opcode"
            );
            let mut out = Vec::new();
            if let Err(e) = directory::encode(&msg, &mut out) {
                panic!("a decoded directory message does not re-encode: {e}");
            }
            assert_eq!(
                out, data,
                "a decoded directory message re-encodes identically"
            );
            assert_eq!(
                msg.encoded_len(),
                data.len(),
                "encoded_len disagrees with decode"
            );
            let holders = match &msg {
                directory::DirMessage::Add(m) => Some((directory::HolderOp::Add, m)),
                directory::DirMessage::Del(m) => Some((directory::HolderOp::Del, m)),
                _ => None,
            };
            if let Some((op, m)) = holders {
                let mut batches = Vec::new();
                let report = directory::encode_batches(
                    op,
                    m.seq,
                    m.sender,
                    m.holder,
                    &m.keys,
                    data.len(),
                    &mut batches,
                );
                assert_eq!(
                    report.map(|r| (r.datagrams, r.skipped)),
                    Ok((1, 0)),
                    "a decoded update's keys batch into one datagram"
                );
                assert_eq!(batches, [data], "batching a decoded update gives it back");
            }
        }
        Err(err) => {
            let _ = err.to_string();
            assert_eq!(
                err.verdict(),
                Verdict::Drop,
                "a directory error is answered"
            );
        }
    }
}

/// Body of the `icp_decode` cargo-fuzz target (`fuzz/fuzz_targets/icp_decode.rs`), kept here so
/// the property tests can run it on stable Rust.
///
/// Decodes `data`; on success checks that re-encoding gives back exactly `data`; on failure
/// checks that the error's [`Verdict`] and its `ICP_OP_ERR` reply are consistent. It panics only
/// when one of these codec invariants is broken, which is what a fuzzer looks for.
#[doc(hidden)]
pub fn fuzz_icp_decode(data: &[u8]) {
    match icp::decode(data) {
        Ok(msg) => {
            let mut out = Vec::new();
            if let Err(e) = icp::encode(&msg, &mut out) {
                panic!("a decoded message does not re-encode: {e}");
            }
            assert_eq!(
                out, data,
                "re-encoding a decoded datagram changed its bytes"
            );
            assert_eq!(
                msg.encoded_len(),
                data.len(),
                "encoded_len disagrees with decode"
            );
        }
        Err(err) => {
            let _ = err.to_string();
            match (err.verdict(), err.err_reply()) {
                (Verdict::Drop, None) => {}
                (Verdict::ReplyErr { reqnum }, Some(reply)) => {
                    assert_eq!(reply.reqnum, reqnum, "ERR reply does not echo the reqnum");
                    let mut out = Vec::new();
                    if let Err(e) = icp::encode(&reply, &mut out) {
                        panic!("the ERR reply for a malformed query does not encode: {e}");
                    }
                    assert_eq!(out.len(), icp::HEADER_LEN + 1, "ERR reply is not 21 bytes");
                }
                (verdict, reply) => {
                    panic!("verdict {verdict:?} inconsistent with ERR reply {reply:?}")
                }
            }
        }
    }
}
