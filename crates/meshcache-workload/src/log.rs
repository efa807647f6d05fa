//! Squid access-log parsing.
//!
//! Two layouts are recognized, line by line (a log may even mix them):
//!
//! * Squid's **native** format, white-space separated:
//!   `time elapsed client code/status bytes method URL rfc931 hierarchy/peer type`,
//!   with `time` in seconds since the epoch with milliseconds
//!   (`1700000000.123`). The `rfc931`, `hierarchy/peer` and `type` fields
//!   may be missing (short lines from custom `logformat`s); fields after
//!   `type` are ignored.
//! * Squid's **common** format (Apache's CLF plus Squid's result code):
//!   `client ident user [22/Nov/2026:10:00:00 +0000] "GET url HTTP/1.1" 200 1234 TCP_MISS:HIER_DIRECT`.
//!   It has no elapsed time (0) and no content type (`-`); the trailing
//!   `code:hierarchy` field may be missing, and more fields after it (the
//!   `combined` format's referer and user agent) are ignored.
//!
//! [`LogReader`] iterates over the records of any [`BufRead`]; lines it
//! cannot parse are skipped and counted by [`BadReason`] in
//! [`LogReader::bad_lines`]. A bad line is never an error, and no input
//! makes the parser panic (a property test feeds it arbitrary strings).
//! Blank lines are skipped without being counted.

use std::collections::BTreeMap;
use std::io::BufRead;

use serde::{Deserialize, Serialize};

/// One request of an access log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// When the request completed, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// How long it took, milliseconds (0 in the common format).
    pub elapsed_ms: u64,
    /// The client's address as logged.
    pub client: String,
    /// Squid's result code, e.g. `TCP_HIT` (`-` when not logged).
    pub code: String,
    /// HTTP status (0 when Squid logged none).
    pub status: u16,
    /// Bytes sent to the client.
    pub bytes: u64,
    /// Request method, e.g. `GET`.
    pub method: String,
    /// The requested URL as logged.
    pub url: String,
    /// Hierarchy code, e.g. `HIER_DIRECT` or `DIRECT` (`-` when not logged).
    pub hierarchy: String,
    /// The peer or origin the hierarchy code refers to (`-` when not logged).
    pub peer: String,
    /// Content type of the reply (`-` when not logged).
    pub content_type: String,
}

/// Why a line was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadReason {
    /// Fewer fields than the format needs.
    TooFewFields,
    /// The time (native) or date (common) cannot be read.
    BadTime,
    /// The elapsed time is not a whole number.
    BadElapsed,
    /// The `code/status` field or the status is malformed.
    BadStatus,
    /// The byte count is not a whole number.
    BadBytes,
    /// The common format's quoted request line is malformed.
    BadRequestLine,
    /// The line could not be read (an I/O error; reading stops there).
    Unreadable,
}

impl std::fmt::Display for BadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            BadReason::TooFewFields => "too few fields",
            BadReason::BadTime => "bad time",
            BadReason::BadElapsed => "bad elapsed time",
            BadReason::BadStatus => "bad code/status",
            BadReason::BadBytes => "bad byte count",
            BadReason::BadRequestLine => "bad request line",
            BadReason::Unreadable => "unreadable",
        };
        f.write_str(s)
    }
}

/// Counts of skipped lines by reason.
pub type BadLines = BTreeMap<BadReason, u64>;

/// Parses one line (without its line end). Blank lines are [`BadReason::TooFewFields`].
pub fn parse_line(line: &str) -> Result<LogRecord, BadReason> {
    let line = line.trim();
    if line.contains(" [") && line.contains('"') {
        parse_common(line)
    } else {
        parse_native(line)
    }
}

fn parse_native(line: &str) -> Result<LogRecord, BadReason> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.len() < 7 {
        return Err(BadReason::TooFewFields);
    }
    let time_ms = parse_epoch(f[0]).ok_or(BadReason::BadTime)?;
    let elapsed_ms = f[1].parse::<u64>().map_err(|_| BadReason::BadElapsed)?;
    let (code, status) = f[3].split_once('/').ok_or(BadReason::BadStatus)?;
    let status = status.parse::<u16>().map_err(|_| BadReason::BadStatus)?;
    let bytes = f[4].parse::<u64>().map_err(|_| BadReason::BadBytes)?;
    let (hierarchy, peer) = match f.get(8) {
        Some(h) => match h.split_once('/') {
            Some((h, p)) => (h, p),
            None => (*h, "-"),
        },
        None => ("-", "-"),
    };
    Ok(LogRecord {
        time_ms,
        elapsed_ms,
        client: f[2].into(),
        code: code.into(),
        status,
        bytes,
        method: f[5].into(),
        url: f[6].into(),
        hierarchy: hierarchy.into(),
        peer: peer.into(),
        content_type: f.get(9).copied().unwrap_or("-").into(),
    })
}

/// `1700000000.123` → milliseconds (at most three decimals are kept).
fn parse_epoch(s: &str) -> Option<u64> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let mut ms = 0u64;
    for i in 0..3 {
        ms = ms * 10 + u64::from(frac.as_bytes().get(i).map_or(0, |b| b - b'0'));
    }
    secs.checked_mul(1000)?.checked_add(ms)
}

fn parse_common(line: &str) -> Result<LogRecord, BadReason> {
    let open = line.find(" [").ok_or(BadReason::BadTime)?;
    let head: Vec<&str> = line[..open].split_ascii_whitespace().collect();
    let client = head.first().ok_or(BadReason::TooFewFields)?;
    let rest = &line[open + 2..];
    let close = rest.find(']').ok_or(BadReason::BadTime)?;
    let time_ms = parse_clf_date(&rest[..close]).ok_or(BadReason::BadTime)?;
    let rest = rest[close + 1..].trim_start();
    let rest = rest.strip_prefix('"').ok_or(BadReason::BadRequestLine)?;
    let q = rest.find('"').ok_or(BadReason::BadRequestLine)?;
    let mut req = rest[..q].split_ascii_whitespace();
    let method = req.next().ok_or(BadReason::BadRequestLine)?;
    let url = req.next().ok_or(BadReason::BadRequestLine)?;
    let tail: Vec<&str> = rest[q + 1..].split_ascii_whitespace().collect();
    if tail.len() < 2 {
        return Err(BadReason::TooFewFields);
    }
    let status = tail[0].parse::<u16>().map_err(|_| BadReason::BadStatus)?;
    let bytes = if tail[1] == "-" {
        0
    } else {
        tail[1].parse::<u64>().map_err(|_| BadReason::BadBytes)?
    };
    let (code, hier) = match tail.get(2) {
        Some(t) => t.split_once(':').unwrap_or((t, "-")),
        None => ("-", "-"),
    };
    let (hierarchy, peer) = hier.split_once('/').unwrap_or((hier, "-"));
    Ok(LogRecord {
        time_ms,
        elapsed_ms: 0,
        client: (*client).into(),
        code: code.into(),
        status,
        bytes,
        method: method.into(),
        url: url.into(),
        hierarchy: hierarchy.into(),
        peer: peer.into(),
        content_type: "-".into(),
    })
}

/// `22/Nov/2026:10:00:00 +0000` → milliseconds since the epoch (UTC).
fn parse_clf_date(s: &str) -> Option<u64> {
    let (dt, zone) = s.trim().split_once(' ').unwrap_or((s.trim(), "+0000"));
    let mut parts = dt.splitn(4, ':');
    let date = parts.next()?;
    let num = |p: Option<&str>, max: i64| -> Option<i64> {
        let p = p?;
        if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let v: i64 = p.parse().ok()?;
        (v <= max).then_some(v)
    };
    let h = num(parts.next(), 23)?;
    let mi = num(parts.next(), 59)?;
    let sec = num(parts.next(), 60)?;
    let mut d = date.split('/');
    let day = num(d.next(), 31)?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mon = d.next()?;
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(mon))? as i64 + 1;
    let year = num(d.next(), 9999)?;
    if day == 0 || d.next().is_some() {
        return None;
    }
    let zone = zone.trim();
    let (sign, z) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    if z.len() != 4 || !z.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let offset = sign * (z[..2].parse::<i64>().ok()? * 3600 + z[2..].parse::<i64>().ok()? * 60);
    let secs = days_from_civil(year, month, day) * 86400 + h * 3600 + mi * 60 + sec - offset;
    u64::try_from(secs).ok()?.checked_mul(1000)
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Streams the records of a log, counting the lines it skips.
pub struct LogReader<R> {
    input: R,
    buf: Vec<u8>,
    bad: BadLines,
    lines: u64,
    done: bool,
}

impl<R: BufRead> LogReader<R> {
    /// Reads from `input`.
    pub fn new(input: R) -> Self {
        LogReader {
            input,
            buf: Vec::new(),
            bad: BadLines::new(),
            lines: 0,
            done: false,
        }
    }

    /// Lines skipped so far, by reason.
    pub fn bad_lines(&self) -> &BadLines {
        &self.bad
    }

    /// Lines read so far (blank and bad ones included).
    pub fn lines(&self) -> u64 {
        self.lines
    }
}

impl<R: BufRead> Iterator for LogReader<R> {
    type Item = LogRecord;

    fn next(&mut self) -> Option<LogRecord> {
        while !self.done {
            self.buf.clear();
            match self.input.read_until(b'\n', &mut self.buf) {
                Ok(0) => self.done = true,
                Ok(_) => {
                    self.lines += 1;
                    let line = String::from_utf8_lossy(&self.buf);
                    if line.trim().is_empty() {
                        continue;
                    }
                    match parse_line(&line) {
                        Ok(r) => return Some(r),
                        Err(reason) => *self.bad.entry(reason).or_default() += 1,
                    }
                }
                Err(_) => {
                    *self.bad.entry(BadReason::Unreadable).or_default() += 1;
                    self.done = true;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_line() {
        let r = parse_line("1700000000.123    456 10.0.0.7 TCP_MISS/200 5120 GET http://www.a.br/x.html - HIER_DIRECT/192.0.2.1 text/html").unwrap();
        assert_eq!(r.time_ms, 1_700_000_000_123);
        assert_eq!(r.elapsed_ms, 456);
        assert_eq!(r.client, "10.0.0.7");
        assert_eq!((r.code.as_str(), r.status), ("TCP_MISS", 200));
        assert_eq!(r.bytes, 5120);
        assert_eq!(r.method, "GET");
        assert_eq!(r.url, "http://www.a.br/x.html");
        assert_eq!(
            (r.hierarchy.as_str(), r.peer.as_str()),
            ("HIER_DIRECT", "192.0.2.1")
        );
        assert_eq!(r.content_type, "text/html");
    }

    #[test]
    fn native_variants() {
        // Missing type, and one-digit milliseconds.
        let r = parse_line("1700000000.5 3 c TCP_HIT/200 10 GET http://a/ - NONE/-").unwrap();
        assert_eq!(r.time_ms, 1_700_000_000_500);
        assert_eq!(r.content_type, "-");
        assert_eq!(r.hierarchy, "NONE");
        // Extra trailing fields.
        let r = parse_line("1700000001 3 c TCP_HIT/304 0 GET http://a/ - NONE/- - extra more\r")
            .unwrap();
        assert_eq!((r.time_ms, r.status), (1_700_000_001_000, 304));
        // Only up to the URL.
        let r = parse_line("1.000 0 c TCP_DENIED/403 0 CONNECT a:443").unwrap();
        assert_eq!((r.hierarchy.as_str(), r.peer.as_str()), ("-", "-"));
    }

    #[test]
    fn common_line() {
        let r = parse_line(r#"10.0.0.7 - - [22/Nov/2026:10:00:00 +0000] "GET http://www.a.com/ HTTP/1.1" 200 1234 TCP_MISS:HIER_DIRECT"#).unwrap();
        // 2026-11-22T10:00:00Z.
        assert_eq!(r.time_ms, 1_795_341_600_000);
        assert_eq!(r.client, "10.0.0.7");
        assert_eq!(
            (r.code.as_str(), r.status, r.bytes),
            ("TCP_MISS", 200, 1234)
        );
        assert_eq!(
            (r.method.as_str(), r.url.as_str()),
            ("GET", "http://www.a.com/")
        );
        assert_eq!(r.hierarchy, "HIER_DIRECT");
        // A zone offset, no Squid field, trailing combined fields.
        let r = parse_line(
            r#"c - bob [22/Nov/2026:12:00:00 +0200] "GET http://a/ HTTP/1.0" 404 - "-" "agent x""#,
        )
        .unwrap();
        assert_eq!(r.time_ms, 1_795_341_600_000);
        assert_eq!((r.status, r.bytes), (404, 0));
        assert_eq!(r.code, "\"-\"");
    }

    #[test]
    fn bad_lines_are_counted_by_reason() {
        let log = "\
1700000000.000 1 c TCP_MISS/200 10 GET http://a/ - DIRECT/x text/html
garbage
x 1 c TCP_MISS/200 10 GET http://a/
1 x c TCP_MISS/200 10 GET http://a/
1 1 c TCP_MISS200 10 GET http://a/
1 1 c TCP_MISS/200 ten GET http://a/

c - - [31/Foo/2026:10:00:00 +0000] \"GET http://a/ HTTP/1.1\" 200 1
c - - [22/Nov/2026:10:00:00 +0000] \"GET\" 200 1
1700000001.000 1 c TCP_HIT/200 10 GET http://a/ - NONE/- text/html
";
        let mut reader = LogReader::new(log.as_bytes());
        let records: Vec<_> = reader.by_ref().collect();
        assert_eq!(records.len(), 2);
        assert_eq!(reader.lines(), 10);
        let bad = reader.bad_lines();
        assert_eq!(bad[&BadReason::TooFewFields], 1);
        assert_eq!(bad[&BadReason::BadTime], 2);
        assert_eq!(bad[&BadReason::BadElapsed], 1);
        assert_eq!(bad[&BadReason::BadStatus], 1);
        assert_eq!(bad[&BadReason::BadBytes], 1);
        assert_eq!(bad[&BadReason::BadRequestLine], 1);
    }

    #[test]
    fn dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_clf_date("01/Jan/1970:00:00:01 +0000"), Some(1000));
        assert_eq!(parse_clf_date("01/Jan/1970:00:00:00 +0100"), None);
        assert_eq!(parse_clf_date("1/Jan/1970:25:00:00 +0000"), None);
    }

    #[test]
    fn invalid_utf8_is_not_fatal() {
        let log = b"1 1 c TCP_MISS/200 10 GET http://a/\xff\xfe - DIRECT/x -\n";
        let n = LogReader::new(&log[..]).count();
        assert_eq!(n, 1);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = parse_line(&s);
            let _ = LogReader::new(s.as_bytes()).count();
        }

        #[test]
        fn never_panics_on_near_misses(
            a in "[0-9.]{0,14}", b in "[0-9x-]{0,4}", c in "[A-Z_]{0,8}/?[0-9]{0,5}",
            d in "[0-9-]{0,21}", e in "\\[?[0-9A-Za-z/: +-]{0,30}\\]?", q in "\"?[A-Z]* ?[a-z:/]*\"?",
        ) {
            let _ = parse_line(&format!("{a} {b} h {c} {d} GET http://x/ - {e}"));
            let _ = parse_line(&format!("h - - {e} {q} {d} {b} {c}"));
        }
    }
}
