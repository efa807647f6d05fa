//! Fuzz `meshcache_wire::directory::decode`: it must never panic, every datagram it accepts must
//! re-encode to the same bytes (a `DIR_ADD`/`DIR_DEL` also through the batcher), and every
//! error must be dropped rather than answered.
//! The checks live in `meshcache_wire::fuzz_directory_decode` so the property tests run them on
//! stable Rust too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meshcache_wire::fuzz_directory_decode(data));
