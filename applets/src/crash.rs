//! `crash`: hostile fixture that traps at once.
//!
//! Its first instruction is `unreachable`. The proxy must treat the trap like any failed run
//! and send the request to the origin.

#[path = "guest.rs"]
mod guest;

// `core::arch::wasm32::unreachable` is an unsafe function in older Rust (1.63 included) and a
// safe one in newer releases, hence the `unsafe` block and the allowance for it.
#[allow(unused_unsafe)]
#[no_mangle]
pub extern "C" fn run() -> i32 {
    unsafe { core::arch::wasm32::unreachable() }
}
