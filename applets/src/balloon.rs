//! `balloon`: hostile fixture that exhausts memory.
//!
//! It allocates 1 MiB chunks forever, writes to every page of each (with volatile stores, so
//! the allocations cannot be optimised away) and keeps them all alive. Once the proxy's memory
//! limit refuses to grow the linear memory, the allocator fails and the run aborts with a
//! trap; the proxy must survive that and send the request to the origin.

#[path = "guest.rs"]
mod guest;

const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut stamp = guest::now() as u8;
    loop {
        let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK);
        let base = chunk.as_mut_ptr();
        for offset in (0..CHUNK).step_by(PAGE) {
            stamp = stamp.wrapping_add(1);
            unsafe { std::ptr::write_volatile(base.add(offset), stamp) };
        }
        kept.push(chunk);
    }
}
