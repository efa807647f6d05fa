//! `flood`: hostile fixture that writes without end.
//!
//! It appends 64 KiB blocks to the built body until the host refuses one (the output bound),
//! tries ten more times after that, and then claims a built response. The proxy must cap the
//! output and, since the bound was overrun, send the request to the origin instead.

#[path = "guest.rs"]
mod guest;

const BLOCK: usize = 64 << 10;
const EXTRA_TRIES: usize = 10;

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let block = vec![b'x'; BLOCK];
    while guest::out(&block) {}
    for _ in 0..EXTRA_TRIES {
        guest::out(&block);
    }
    guest::BUILT
}
