//! # meshcache-summary
//!
//! Compact summaries of what a cache holds, for cooperation without a query
//! per miss (the Summary Cache paper; Squid's Cache Digests):
//!
//! * [`digest`]: Squid's Cache Digest — a Bloom filter over store keys, its
//!   wire format (control block + mask), and the receiver's checks;
//! * [`hashing`]: the hash functions — disjoint bit groups of the MD5 store
//!   key (the paper's rule; Squid's four words as the default);
//! * `bloom`: a neighbour's summary, a plain bit array kept current by
//!   delta updates;
//! * `counting`: the counting Bloom filter a node keeps over its own
//!   store, whose snapshot is a digest and whose bit changes are the delta
//!   updates a summary protocol sends.
//!
//! Keys are the 16-byte store keys (`MD5(method ‖ URL)`, Squid's) the store
//! already computes. Pure data structures: no I/O, no clock.

mod bloom;
mod counting;
pub mod digest;
pub mod hashing;

pub use bloom::BloomArray;
pub use counting::{BitChange, CountingBloom};
pub use digest::{bloom_fp_rate, CacheDigest, DigestError};
pub use hashing::Hashing;
