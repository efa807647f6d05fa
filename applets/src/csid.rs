//! `csid`: client-specific page assembly.
//!
//! The cached document is a plan, not a page. Each line reads
//!
//! ```text
//! <client id>: <path> <path> ...
//! ```
//!
//! (split at the first `:`, then the paths at whitespace). The client names itself with the
//! `client-id` cookie; the applet takes the first line for that id, or failing that the first
//! `*` line, and assembles the page from the bodies of the listed objects, which must all be
//! cached objects of the same origin. The response is 200, with the plan's `content-type`
//! (default `text/html`) and an `x-csid-client` header naming the plan line used; each part is
//! written straight from the cache (`out_item`), in plan order.
//!
//! No usable line, a part that is not cached, or an output bound reached: the origin.

#[path = "guest.rs"]
mod guest;

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let client = guest::cookie("client-id").unwrap_or_else(|| "*".to_string());
    let plan = String::from_utf8_lossy(&guest::read_all(guest::DOCUMENT)).into_owned();
    let (id, paths) = match choose_line(&plan, &client) {
        Some(line) => line,
        None => return guest::ORIGIN,
    };

    // Every part must be cached before anything is written.
    let mut parts = Vec::with_capacity(paths.len());
    for path in paths {
        match guest::open(path) {
            Some(handle) => parts.push(handle),
            None => return guest::ORIGIN,
        }
    }

    if emit(id, &parts) {
        guest::BUILT
    } else {
        guest::ORIGIN
    }
}

/// The plan line for `client` (else the `*` line): its id and its paths.
fn choose_line<'a>(plan: &'a str, client: &str) -> Option<(&'a str, Vec<&'a str>)> {
    let lines: Vec<(&str, &str)> = plan
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(id, paths)| (id.trim(), paths))
        .collect();
    let (id, paths) = lines
        .iter()
        .find(|(id, _)| *id == client)
        .or_else(|| lines.iter().find(|(id, _)| *id == "*"))?;
    Some((*id, paths.split_whitespace().collect()))
}

/// Builds the response; false as soon as the host refuses a part of it.
fn emit(id: &str, parts: &[i32]) -> bool {
    let content_type = guest::item_header_value(guest::DOCUMENT, "content-type")
        .unwrap_or_else(|| "text/html".to_string());
    if !guest::status(200)
        || !guest::add("content-type", &content_type)
        || !guest::add("x-csid-client", id)
    {
        return false;
    }
    parts.iter().all(|&handle| {
        let len = guest::len(handle);
        len == 0 || guest::out_item(handle, 0, len)
    })
}
