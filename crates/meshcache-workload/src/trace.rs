//! Traces: the request streams the lab replays and the simulator consumes.
//!
//! A trace is text, one request a line, fields separated by one space:
//!
//! ```text
//! # meshcache trace v1
//! # any other comment line, e.g. the generator's parameters
//! <time_ms> <client> <size> <url>
//! ```
//!
//! * `time_ms`: when the request is issued, in milliseconds from the start
//!   of the trace (non-decreasing; a closed-loop replay ignores it);
//! * `client`: the emulated client's number (0, 1, …); the lab assigns
//!   clients to caches (client mod number of caches, as the Summary Cache
//!   paper's benchmark does, unless an experiment says otherwise);
//! * `size`: the response body's length in bytes;
//! * `url`: an absolute `http://` URL without spaces. Generated URLs carry
//!   what the origin emulator needs in their query string (`?size=N`, and
//!   `&cc=…` for objects that are not cacheable by the origin's default).
//!
//! Lines starting with `#` and blank lines are skipped. The first line must
//! be the `# meshcache trace v1` header.

use std::io::{self, BufRead, Write};

/// The first line of every trace.
pub const HEADER: &str = "# meshcache trace v1";

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// Milliseconds from the start of the trace.
    pub time_ms: u64,
    /// The emulated client that issues it.
    pub client: u32,
    /// The response body's length in bytes.
    pub size: u64,
    /// Absolute `http://` URL, no spaces.
    pub url: String,
}

/// Why a trace could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The first line is not [`HEADER`].
    #[error("not a meshcache trace: the first line must be {HEADER:?}")]
    NoHeader,
    /// A request line is malformed.
    #[error("line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A request's URL cannot be written as one field.
    #[error("request {index}: the URL {url:?} is empty or has white space")]
    BadUrl {
        /// 0-based index of the request.
        index: usize,
        /// The offending URL.
        url: String,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Writes `requests` as a trace, with `comments` (one `#` line each) after the header.
pub fn write<W: Write>(
    mut out: W,
    comments: &[String],
    requests: &[Request],
) -> Result<(), TraceError> {
    writeln!(out, "{HEADER}")?;
    for c in comments {
        for line in c.lines() {
            writeln!(out, "# {line}")?;
        }
    }
    for (index, r) in requests.iter().enumerate() {
        if r.url.is_empty() || r.url.contains(char::is_whitespace) {
            return Err(TraceError::BadUrl {
                index,
                url: r.url.clone(),
            });
        }
        writeln!(out, "{} {} {} {}", r.time_ms, r.client, r.size, r.url)?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a whole trace. Comment lines are returned without their `# `.
pub fn read<R: BufRead>(input: R) -> Result<(Vec<String>, Vec<Request>), TraceError> {
    let mut comments = Vec::new();
    let mut requests = Vec::new();
    let mut last_time = 0;
    let mut saw_header = false;
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        let line = line.trim_end_matches('\r');
        if i == 0 {
            if line != HEADER {
                return Err(TraceError::NoHeader);
            }
            saw_header = true;
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            comments.push(c.strip_prefix(' ').unwrap_or(c).to_string());
            continue;
        }
        let r = parse_line(line).map_err(|reason| TraceError::Malformed {
            line: i + 1,
            reason,
        })?;
        if r.time_ms < last_time {
            return Err(TraceError::Malformed {
                line: i + 1,
                reason: format!("time {} ms goes back (previous {last_time} ms)", r.time_ms),
            });
        }
        last_time = r.time_ms;
        requests.push(r);
    }
    if !saw_header {
        return Err(TraceError::NoHeader);
    }
    Ok((comments, requests))
}

fn parse_line(line: &str) -> Result<Request, String> {
    let mut fields = line.split(' ');
    let mut next = |name: &str| {
        fields
            .next()
            .filter(|f| !f.is_empty())
            .ok_or_else(|| format!("missing {name}"))
    };
    let time_ms = next("time_ms")?;
    let client = next("client")?;
    let size = next("size")?;
    let url = next("url")?;
    if fields.next().is_some() {
        return Err("more than four fields".into());
    }
    let num = |name: &str, v: &str| -> Result<u64, String> {
        v.parse()
            .map_err(|_| format!("{name} {v:?} is not a whole number"))
    };
    let client = u32::try_from(num("client", client)?).map_err(|_| "client is too large")?;
    if !url.starts_with("http://") {
        return Err(format!("url {url:?} is not an absolute http:// URL"));
    }
    Ok(Request {
        time_ms: num("time_ms", time_ms)?,
        client,
        size: num("size", size)?,
        url: url.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: u64, c: u32, s: u64, u: &str) -> Request {
        Request {
            time_ms: t,
            client: c,
            size: s,
            url: u.into(),
        }
    }

    #[test]
    fn round_trip() {
        let reqs = vec![
            req(0, 0, 10, "http://a.br/1?size=10"),
            req(5, 3, 0, "http://b.com:8080/x"),
        ];
        let mut buf = Vec::new();
        write(&mut buf, &["seed 7".into()], &reqs).unwrap();
        let (comments, back) = read(&buf[..]).unwrap();
        assert_eq!(comments, vec!["seed 7".to_string()]);
        assert_eq!(back, reqs);
    }

    #[test]
    fn errors_name_the_line() {
        let text = format!("{HEADER}\n0 0 1 http://a/\n1 x 1 http://a/\n");
        match read(text.as_bytes()) {
            Err(TraceError::Malformed { line: 3, reason }) => assert!(reason.contains("client")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read(&b"0 0 1 http://a/\n"[..]),
            Err(TraceError::NoHeader)
        ));
        let back = format!("{HEADER}\n5 0 1 http://a/\n4 0 1 http://a/\n");
        assert!(matches!(
            read(back.as_bytes()),
            Err(TraceError::Malformed { line: 3, .. })
        ));
        let bad = [req(0, 0, 1, "http://a b/")];
        assert!(matches!(
            write(Vec::new(), &[], &bad),
            Err(TraceError::BadUrl { index: 0, .. })
        ));
    }
}
