//! `log`: an access log kept for the origin.
//!
//! On every hit it appends one record to the log object the proxy delivers to the origin:
//!
//! ```text
//! <IMF-fixdate> <client address> <METHOD> <URL>\n
//! ```
//!
//! for example `Tue, 24 Nov 2026 01:02:03 GMT 192.0.2.7 GET http://example.com/a.html`. The
//! date is the host's `now`. The cached copy is served unchanged, so an origin sees the hits
//! that a cache would otherwise hide from it.

#[path = "guest.rs"]
mod guest;

/// Appends the record and serves the cached copy.
#[no_mangle]
pub extern "C" fn run() -> i32 {
    let date = guest::UtcTime::from_unix_ms(guest::now()).imf_fixdate();
    let record = format!(
        "{} {} {} {}\n",
        date,
        guest::get_input_string(guest::CLIENT_ADDR),
        guest::get_input_string(guest::METHOD),
        guest::get_input_string(guest::URL),
    );
    // A full log budget drops the record; the hit is still served.
    guest::log_record(record.as_bytes());
    guest::CACHED
}
