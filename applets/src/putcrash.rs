//! `putcrash`: fixture for the all-or-nothing rule of store and log writes.
//!
//! It writes `k = v` to the key/value store and appends the log record `x`, then traps when
//! the request has the cookie `crash=1` and serves the cached copy otherwise. Writes made by a
//! run that traps must be discarded; those of a run that completes must be kept.

#[path = "guest.rs"]
mod guest;

// `core::arch::wasm32::unreachable` is an unsafe function in older Rust (1.63 included) and a
// safe one in newer releases, hence the `unsafe` block and the allowance for it.
#[allow(unused_unsafe)]
#[no_mangle]
pub extern "C" fn run() -> i32 {
    guest::put("k", b"v");
    guest::log_record(b"x");
    if guest::cookie("crash").as_deref() == Some("1") {
        unsafe { core::arch::wasm32::unreachable() }
    }
    guest::CACHED
}
