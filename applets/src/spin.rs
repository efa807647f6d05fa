//! `spin`: hostile fixture that never finishes.
//!
//! It loops forever, calling the host's clock and folding the result into a running value, so
//! no optimiser can prove the loop empty and remove it. The proxy must stop it at its CPU
//! budget and send the request to the origin.

#[path = "guest.rs"]
mod guest;

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let mut acc: u64 = 1;
    loop {
        acc = acc.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(guest::now() as u64);
        // Keep the value observable: a volatile store cannot be elided.
        unsafe { std::ptr::write_volatile(&mut acc, acc) };
    }
}
