//! Fuzz the Summary Cache decoders (`meshcache_wire::summary`): they must never panic, and
//! every update or array they accept must re-encode to the same bytes.
//! The checks live in `meshcache_wire::fuzz_summary_decode` so the property tests run them on
//! stable Rust too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meshcache_wire::fuzz_summary_decode(data));
