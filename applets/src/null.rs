//! `null`: the applet that does nothing.
//!
//! Every hit is served from the cache exactly as if no applet were attached. It measures the
//! fixed cost of running an applet (instantiation, the call, the outcome) and nothing else.

#[path = "guest.rs"]
mod guest;

/// Serves the cached copy.
#[no_mangle]
pub extern "C" fn run() -> i32 {
    guest::CACHED
}
