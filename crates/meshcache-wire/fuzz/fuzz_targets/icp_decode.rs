//! Fuzz `meshcache_wire::icp::decode`: it must never panic, every datagram it accepts must
//! re-encode to the same bytes, and every malformed query must get a well-formed ERR reply.
//! The checks live in `meshcache_wire::fuzz_icp_decode` so the property tests run them on
//! stable Rust too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meshcache_wire::fuzz_icp_decode(data));
