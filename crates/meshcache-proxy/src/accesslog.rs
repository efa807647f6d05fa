//! The access log, in Squid's native format, so existing log tools (calamaris, squidanalyzer,
//! our own `workload characterize`) read it unchanged:
//!
//! ```text
//! 1763793801.123    12 127.0.0.1 TCP_MISS/200 1432 GET http://example.test/a - HIER_DIRECT/127.0.0.1 text/html
//! ```
//!
//! i.e. `time.ms elapsed-ms client result/status bytes method URL user hierarchy/peer type`
//! (Squid's `%ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %[un %Sh/%<a %mt`).
//! Lines go to a buffered writer that is flushed every second and on shutdown, so logging
//! costs no system call per request.
//!
//! Rotation works as Squid's `squid -k rotate` (both are SIGUSR1): [`AccessLog::rotate`]
//! writes out what is buffered, shifts `access.log.0` … to make room when `log.rotate` keeps
//! old files, and opens the path anew. With `log.rotate = 0` it only reopens, for logrotate
//! or any tool that has already moved the file away.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use crate::outcome::{HierCode, ResultCode};

/// One finished transaction, as logged.
#[derive(Clone, Debug)]
pub struct AccessRecord<'a> {
    /// When the request arrived.
    pub start: SystemTime,
    /// How long it took until the last byte was handed to the client socket.
    pub elapsed: Duration,
    /// The client's address.
    pub client: IpAddr,
    /// Squid result code.
    pub result: ResultCode,
    /// Status sent to the client (0 when none was).
    pub status: u16,
    /// Bytes sent to the client, head and body.
    pub bytes: u64,
    /// Request method.
    pub method: &'a str,
    /// Request URL as the client sent it.
    pub url: &'a str,
    /// Hierarchy code.
    pub hierarchy: HierCode,
    /// The ICP wait timed out (Squid prefixes the hierarchy code with `TIMEOUT_`).
    pub timed_out: bool,
    /// The response was not sent whole (Squid suffixes the result code with `_ABORTED`).
    pub aborted: bool,
    /// The upstream host the response came from, if any.
    pub peer: Option<&'a str>,
    /// Response content type, if any.
    pub content_type: Option<&'a str>,
    /// The authenticated user (or the user name of rejected credentials), if any.
    pub user: Option<&'a str>,
}

impl AccessRecord<'_> {
    /// Appends the record as one Squid native-format line (with the newline).
    pub fn write_line(&self, out: &mut String) {
        let since = self
            .start
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        // Hand-rolled number formatting: this runs once per request.
        let mut num = itoa::Buffer::new();
        out.push_str(num.format(since.as_secs()));
        out.push('.');
        push_padded(out, u64::from(since.subsec_millis()), 3, '0');
        out.push(' ');
        push_padded(
            out,
            u64::try_from(self.elapsed.as_millis()).unwrap_or(u64::MAX),
            6,
            ' ',
        );
        out.push(' ');
        let _ = write!(out, "{}", self.client);
        out.push(' ');
        out.push_str(self.result.as_str());
        if self.aborted {
            out.push_str("_ABORTED");
        }
        out.push('/');
        push_padded(out, u64::from(self.status), 3, '0');
        out.push(' ');
        out.push_str(num.format(self.bytes));
        out.push(' ');
        push_field(out, self.method);
        out.push(' ');
        push_field(
            out,
            if self.url.is_empty() {
                "error:invalid-request"
            } else {
                self.url
            },
        );
        out.push(' ');
        push_field(out, self.user.unwrap_or("-"));
        out.push(' ');
        if self.timed_out {
            out.push_str("TIMEOUT_");
        }
        out.push_str(self.hierarchy.as_str());
        out.push('/');
        push_field(out, self.peer.unwrap_or("-"));
        out.push(' ');
        let ctype = self
            .content_type
            .map(|t| t.split(';').next().unwrap_or(t).trim());
        push_field(out, ctype.filter(|t| !t.is_empty()).unwrap_or("-"));
        out.push('\n');
    }
}

/// Appends `n` right-aligned in `width` columns, padded with `pad`.
fn push_padded(out: &mut String, n: u64, width: usize, pad: char) {
    let mut num = itoa::Buffer::new();
    let digits = num.format(n);
    for _ in digits.len()..width {
        out.push(pad);
    }
    out.push_str(digits);
}

/// Appends a field, with anything but visible ASCII replaced by '%' so that a field can never
/// split or forge a line.
fn push_field(out: &mut String, field: &str) {
    if field.bytes().all(|b| b.is_ascii_graphic()) {
        out.push_str(field);
    } else {
        out.extend(
            field
                .chars()
                .map(|c| if c.is_ascii_graphic() { c } else { '%' }),
        );
    }
}

/// A buffered access-log file.
pub struct AccessLog {
    out: Mutex<(BufWriter<File>, String)>,
    write_through: bool,
    path: PathBuf,
    /// Old files kept by [`AccessLog::rotate`] (`path.0` the newest).
    keep: u32,
}

fn open_append(path: &Path) -> std::io::Result<BufWriter<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(BufWriter::with_capacity(64 * 1024, file))
}

impl AccessLog {
    /// Opens (appending) the log file; `write_through` writes each line at once. Rotation
    /// keeps no old file; see [`AccessLog::keeping`].
    pub fn open(path: &Path, write_through: bool) -> std::io::Result<AccessLog> {
        Ok(AccessLog {
            out: Mutex::new((open_append(path)?, String::with_capacity(256))),
            write_through,
            path: path.to_owned(),
            keep: 0,
        })
    }

    /// Rotation keeps `keep` old files, `path.0` (the newest) to `path.{keep-1}`.
    pub fn keeping(mut self, keep: u32) -> Self {
        self.keep = keep;
        self
    }

    /// Writes out what is buffered, moves the old files along (when some are kept) and goes on
    /// in a file newly opened at the path. Where that fails, the log goes on where it was and
    /// the error is returned (nothing is lost either way).
    pub fn rotate(&self) -> std::io::Result<()> {
        let mut guard = self.out.lock();
        guard.0.flush()?;
        if self.keep > 0 {
            let numbered = |i: u32| {
                let mut name = self.path.clone().into_os_string();
                name.push(format!(".{i}"));
                PathBuf::from(name)
            };
            // A file missing on the way (never made, or moved away by hand) is no error.
            let shift = |from: &Path, to: PathBuf| match std::fs::rename(from, to) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
            for i in (0..self.keep - 1).rev() {
                shift(&numbered(i), numbered(i + 1))?;
            }
            shift(&self.path, numbered(0))?;
        }
        guard.0 = open_append(&self.path)?;
        Ok(())
    }

    /// Logs one record. A write error is reported once per call through tracing and never
    /// fails the request.
    pub fn log(&self, record: &AccessRecord<'_>) {
        let mut guard = self.out.lock();
        let (writer, line) = &mut *guard;
        line.clear();
        record.write_line(line);
        let written = writer.write_all(line.as_bytes());
        let written = if self.write_through {
            written.and_then(|()| writer.flush())
        } else {
            written
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "access log write failed");
        }
    }

    /// Pushes buffered lines to the file.
    pub fn flush(&self) {
        if let Err(e) = self.out.lock().0.flush() {
            tracing::warn!(error = %e, "access log flush failed");
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let _ = self.out.get_mut().0.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(url: &str) -> AccessRecord<'_> {
        AccessRecord {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_793_801),
            elapsed: Duration::from_millis(1),
            client: IpAddr::from([127, 0, 0, 1]),
            result: ResultCode::TcpMiss,
            status: 200,
            bytes: 10,
            method: "GET",
            url,
            hierarchy: HierCode::Direct,
            timed_out: false,
            aborted: false,
            peer: None,
            content_type: None,
            user: None,
        }
    }

    #[test]
    fn rotation_keeps_the_configured_number_of_old_files() {
        let dir = std::env::temp_dir().join(format!("meshcache-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("access.log");
        let log = AccessLog::open(&path, false).expect("open").keeping(2);
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        for url in ["http://a/1", "http://a/2", "http://a/3", "http://a/4"] {
            log.log(&record(url));
            log.rotate().expect("rotate");
        }
        log.log(&record("http://a/5"));
        log.flush();
        assert!(read("access.log").contains("http://a/5"));
        assert!(read("access.log.0").contains("http://a/4"));
        assert!(read("access.log.1").contains("http://a/3"));
        assert!(
            !dir.join("access.log.2").exists(),
            "only two old files are kept"
        );
        // Reopening only: a file moved away by another tool is left where it was put.
        let only = AccessLog::open(&path, false).expect("open");
        only.log(&record("http://b/1"));
        std::fs::rename(&path, dir.join("moved")).expect("move");
        only.rotate().expect("reopen");
        only.log(&record("http://b/2"));
        only.flush();
        assert!(read("moved").contains("http://b/1"));
        assert!(read("access.log").contains("http://b/2") && !read("access.log").contains("b/1"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn squid_native_format() {
        let mut line = String::new();
        AccessRecord {
            start: SystemTime::UNIX_EPOCH + Duration::from_millis(1_763_793_801_123),
            elapsed: Duration::from_millis(12),
            client: "127.0.0.1".parse().expect("ip"),
            result: ResultCode::TcpMiss,
            status: 200,
            bytes: 1432,
            method: "GET",
            url: "http://example.test/a b",
            hierarchy: HierCode::Direct,
            timed_out: false,
            aborted: false,
            peer: Some("127.0.0.1"),
            content_type: Some("text/html; charset=utf-8"),
            user: None,
        }
        .write_line(&mut line);
        assert_eq!(
            line,
            "1763793801.123     12 127.0.0.1 TCP_MISS/200 1432 GET http://example.test/a%b - HIER_DIRECT/127.0.0.1 text/html\n"
        );
    }

    #[test]
    fn invalid_request_line() {
        let mut line = String::new();
        AccessRecord {
            start: SystemTime::UNIX_EPOCH,
            elapsed: Duration::ZERO,
            client: "::1".parse().expect("ip"),
            result: ResultCode::NoneNone,
            status: 400,
            bytes: 0,
            method: "NONE",
            url: "",
            hierarchy: HierCode::None,
            timed_out: false,
            aborted: false,
            peer: None,
            content_type: None,
            user: None,
        }
        .write_line(&mut line);
        assert_eq!(
            line,
            "0.000      0 ::1 NONE_NONE/400 0 NONE error:invalid-request - HIER_NONE/- -\n"
        );
    }
}
