//! `ads`: banner rotation.
//!
//! The cached document is HTML with zero or more `<!--#ad-->` markers. Each marker is replaced
//! by a banner image taken from a spec object, a second cached object of the same origin whose
//! path the document names in its stored `ad-spec` header (default `/ads/spec.txt`). The spec
//! lists banner image URLs, one per line; blank lines and lines starting with `#` are skipped.
//!
//! Rotation state lives in the origin's key/value store under `ads:next` (decimal text, absent
//! means 0). With that counter `c` and `n` banners, the `i`-th marker of a response (from 0)
//! becomes `<img src="SPEC[(c + i) % n]" alt="advertisement">`, and the counter is stored as
//! `(c + 1) % n`, so consecutive hits start one banner further along.
//!
//! Outcomes:
//! - no marker: the cached copy, counter untouched;
//! - markers, but the spec is not cached or lists no banner: the origin;
//! - otherwise a built response with the document's status and `content-type`, whose body is
//!   the document with its markers replaced. The unchanged ranges are written straight from
//!   the cache (`out_item`); only the image tags pass through the applet's memory. If the
//!   output bound is hit, the request goes to the origin and the counter is not advanced.

#[path = "guest.rs"]
mod guest;

const MARKER: &[u8] = b"<!--#ad-->";
const DEFAULT_SPEC: &str = "/ads/spec.txt";
const COUNTER_KEY: &str = "ads:next";

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let markers = marker_offsets();
    if markers.is_empty() {
        return guest::CACHED;
    }

    let spec_path = guest::item_header_value(guest::DOCUMENT, "ad-spec")
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_SPEC.to_string());
    let spec = match guest::open(&spec_path) {
        Some(handle) => String::from_utf8_lossy(&guest::read_all(handle)).into_owned(),
        None => return guest::ORIGIN,
    };
    let banners = banner_urls(&spec);
    if banners.is_empty() {
        return guest::ORIGIN;
    }
    let n = banners.len() as u64;
    // Reduced modulo n at once so that the sums below cannot overflow.
    let counter = read_counter() % n;

    if !emit(&markers, &banners, counter) {
        return guest::ORIGIN;
    }
    // A store that is full keeps the old counter; the page is served all the same.
    guest::put(COUNTER_KEY, ((counter + 1) % n).to_string().as_bytes());
    guest::BUILT
}

/// Offsets of the markers in the document, in order, not overlapping (searched by the host:
/// the document is not copied into the applet).
fn marker_offsets() -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = guest::find_in(guest::DOCUMENT, from, MARKER) {
        found.push(at);
        from = at + MARKER.len();
    }
    found
}

/// The banner URLs of a spec body: trimmed non-empty lines not starting with `#`.
fn banner_urls(spec: &str) -> Vec<&str> {
    spec.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')).collect()
}

/// The stored rotation counter; absent or unreadable counts as 0.
fn read_counter() -> u64 {
    guest::get(COUNTER_KEY)
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Builds the response; false as soon as the host refuses a part of it.
fn emit(markers: &[usize], banners: &[&str], counter: u64) -> bool {
    if !guest::status(guest::document_status()) {
        return false;
    }
    if let Some(content_type) = guest::item_header_value(guest::DOCUMENT, "content-type") {
        if !guest::add("content-type", &content_type) {
            return false;
        }
    }
    let n = banners.len() as u64;
    let mut copied_to = 0;
    for (i, &at) in markers.iter().enumerate() {
        if at > copied_to && !guest::out_item(guest::DOCUMENT, copied_to, at - copied_to) {
            return false;
        }
        let banner = banners[((counter + i as u64 % n) % n) as usize];
        if !guest::out(image_tag(banner).as_bytes()) {
            return false;
        }
        copied_to = at + MARKER.len();
    }
    let total = guest::len(guest::DOCUMENT);
    total <= copied_to || guest::out_item(guest::DOCUMENT, copied_to, total - copied_to)
}

/// The tag that replaces a marker. Characters that may not appear in a URL and would break
/// out of the attribute (`"`, `<`, `>`) are percent-encoded; any valid URL is kept as it is.
fn image_tag(url: &str) -> String {
    let mut src = String::with_capacity(url.len());
    for c in url.chars() {
        match c {
            '"' => src.push_str("%22"),
            '<' => src.push_str("%3C"),
            '>' => src.push_str("%3E"),
            _ => src.push(c),
        }
    }
    format!("<img src=\"{}\" alt=\"advertisement\">", src)
}
