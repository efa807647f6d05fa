//! `ssi`: server-side includes, the `echo` directive.
//!
//! Every `<!--#echo var="NAME" -->` in the cached document is replaced by the value of the
//! variable NAME. Whitespace is allowed (not required) after `<!--#echo`, around the `=`, and
//! before `-->`; the name must be quoted with double quotes. Variables:
//!
//! - `DATE_GMT`, `DATE_LOCAL`: the host's `now` in Apache's default time format
//!   (`%A, %d-%b-%Y %H:%M:%S %Z`), e.g. `Tuesday, 24-Nov-2026 01:02:03 GMT`. The sandbox has
//!   no time zone, so local time is UTC as well.
//! - `REMOTE_ADDR`, `REMOTE_HOST`: the client's address (the sandbox does no DNS look-ups).
//! - anything else: `(none)`.
//!
//! Values are entity-encoded as Apache's `echo` does by default. Text that starts like a
//! directive but does not parse within 512 bytes (for instance, with no closing `-->`) is left
//! as it is. The host finds the directives (`item_find`): the document is never copied into
//! the applet, so its cost hardly grows with the document's size.
//!
//! A document without directives is served from the cache. Otherwise the applet builds the
//! response: the document's status and `content-type`, and the document's body with the
//! directives expanded, its unchanged ranges written straight from the cache (`out_item`).

#[path = "guest.rs"]
mod guest;

const OPEN: &[u8] = b"<!--#echo";
const CLOSE: &[u8] = b"-->";
/// The longest directive parsed.
const WINDOW: usize = 512;

/// One directive found in the document: its byte range and the variable it names.
struct Directive {
    start: usize,
    end: usize,
    name: String,
}

#[no_mangle]
pub extern "C" fn run() -> i32 {
    let directives = find_directives();
    if directives.is_empty() {
        return guest::CACHED;
    }
    if emit(&directives) {
        guest::BUILT
    } else {
        guest::ORIGIN
    }
}

/// All well-formed directives of the document, in order.
/// The directives of the document, in order. The host finds each `<!--#echo`; only a window
/// of [`WINDOW`] bytes from there is read to parse it (a longer directive is left as it is).
fn find_directives() -> Vec<Directive> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(start) = guest::find_in(guest::DOCUMENT, from, OPEN) {
        let window = guest::read_at(guest::DOCUMENT, start, WINDOW);
        match parse_directive(&window, 0) {
            Some(d) => {
                from = start + d.end;
                found.push(Directive {
                    start,
                    end: start + d.end,
                    name: d.name,
                });
            }
            None => from = start + OPEN.len(),
        }
    }
    found
}

fn parse_directive(doc: &[u8], start: usize) -> Option<Directive> {
    let mut at = skip_space(doc, start + OPEN.len());
    at = expect(doc, at, b"var")?;
    at = skip_space(doc, at);
    at = expect(doc, at, b"=")?;
    at = skip_space(doc, at);
    at = expect(doc, at, b"\"")?;
    let name_start = at;
    let name_len = doc[name_start..].iter().position(|&b| b == b'"')?;
    at = skip_space(doc, name_start + name_len + 1);
    at = expect(doc, at, CLOSE)?;
    Some(Directive {
        start,
        end: at,
        name: String::from_utf8_lossy(&doc[name_start..name_start + name_len]).into_owned(),
    })
}

/// The offset after any ASCII whitespace at `at`.
fn skip_space(doc: &[u8], mut at: usize) -> usize {
    while at < doc.len() && doc[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// The offset after `token` if `doc` has it at `at`.
fn expect(doc: &[u8], at: usize, token: &[u8]) -> Option<usize> {
    if doc.len() >= at && doc[at..].starts_with(token) {
        Some(at + token.len())
    } else {
        None
    }
}

/// Builds the response; false as soon as the host refuses a part of it.
fn emit(directives: &[Directive]) -> bool {
    if !guest::status(guest::document_status()) {
        return false;
    }
    if let Some(content_type) = guest::item_header_value(guest::DOCUMENT, "content-type") {
        if !guest::add("content-type", &content_type) {
            return false;
        }
    }
    // Inputs are fetched once, and only if a directive asks for them.
    let mut date: Option<String> = None;
    let mut client: Option<String> = None;
    let mut copied_to = 0;
    for d in directives {
        if d.start > copied_to && !guest::out_item(guest::DOCUMENT, copied_to, d.start - copied_to)
        {
            return false;
        }
        let value = match d.name.as_str() {
            "DATE_GMT" | "DATE_LOCAL" => date.get_or_insert_with(apache_date).clone(),
            "REMOTE_ADDR" | "REMOTE_HOST" => {
                client.get_or_insert_with(|| guest::get_input_string(guest::CLIENT_ADDR)).clone()
            }
            _ => "(none)".to_string(),
        };
        if !guest::out(entity_encode(&value).as_bytes()) {
            return false;
        }
        copied_to = d.end;
    }
    let total = guest::len(guest::DOCUMENT);
    total <= copied_to || guest::out_item(guest::DOCUMENT, copied_to, total - copied_to)
}

/// Now, as `Tuesday, 24-Nov-2026 01:02:03 GMT`.
fn apache_date() -> String {
    let t = guest::UtcTime::from_unix_ms(guest::now());
    format!(
        "{}, {:02}-{}-{:04} {:02}:{:02}:{:02} GMT",
        t.weekday_name(),
        t.day,
        t.month_abbr(),
        t.year,
        t.hour,
        t.minute,
        t.second
    )
}

/// Escapes the characters HTML gives a meaning to.
fn entity_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}
