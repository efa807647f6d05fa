//! A scripted origin: raw TCP on 127.0.0.1 that records every request exactly as it arrived
//! and answers with the bytes a script chooses.
//!
//! The lab origin (`meshcache_lab::Origin`) and any hyper server write well-formed HTTP/1.1
//! on their own terms: they cannot send an `HTTP/1.0` status line, interim 1xx responses before
//! the final one, or a header split over several field lines in a chosen order. Conformance
//! tests need exactly those, and need to see what the proxy sent upstream (which conditionals,
//! which `Vary` headers), so this origin parses only enough to find where a request ends and
//! keeps the request line and field lines as received.
//!
//! Every connection carries one exchange: the origin writes the script's bytes and closes.
//! Scripts should say so with `Connection: close` (what [`reply`] writes), so the proxy does
//! not try to reuse the connection. The origin accepts a bounded number of connections, bounds
//! every read, and stops (its connections too) when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The most bytes of one request head (request line and fields) the origin reads.
const MAX_HEAD: usize = 64 * 1024;
/// The most bytes of one request body the origin reads.
const MAX_BODY: usize = 1024 * 1024;
/// The most chunks of a chunked request body the origin reads.
const MAX_CHUNKS: usize = 4096;
/// How long the origin waits for the rest of a request before it gives up on the connection.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One request as the origin received it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The request line, e.g. `GET /a HTTP/1.1`.
    pub line: String,
    /// The field lines in the order received: name as sent, value with surrounding
    /// whitespace removed.
    pub fields: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Seen {
    /// The method of the request line.
    pub fn method(&self) -> &str {
        self.line.split(' ').next().unwrap_or("")
    }

    /// The request target of the request line (`/path?query` from a proxy).
    pub fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    /// Every value of the fields named `name` (case-insensitive), in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The first value of the field named `name`, if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }
}

/// What a script answers: the raw bytes to write for a request, given the request and how many
/// requests for the same target arrived before it.
pub type Script = dyn Fn(&Seen, usize) -> Vec<u8> + Send + Sync;

/// A running scripted origin; stops when dropped.
pub struct Scripted {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Scripted {
    /// Listens on 127.0.0.1 and answers at most `max_connections` connections with `script`.
    pub async fn start(
        max_connections: usize,
        script: impl Fn(&Seen, usize) -> Vec<u8> + Send + Sync + 'static,
    ) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let log = seen.clone();
        let task = tokio::spawn(async move {
            // Owned by this task: aborting it (on drop) drops the set, which aborts them all.
            let mut connections = JoinSet::new();
            for _ in 0..max_connections {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                connections.spawn(exchange(stream, log.clone(), script.clone()));
                while connections.try_join_next().is_some() {}
            }
            drop(listener);
            // Keep the last connections alive until they are done.
            while connections.join_next().await.is_some() {}
        });
        Scripted { addr, seen, task }
    }

    /// An absolute URL for `path` on this origin.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request received so far, in order of arrival.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// The requests received for `target` with `method`.
    pub fn requests_for(&self, method: &str, target: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .iter()
            .filter(|s| s.method() == method && s.target() == target)
            .cloned()
            .collect()
    }

    /// How many requests for `target` with `method` arrived.
    pub fn count(&self, method: &str, target: &str) -> usize {
        self.requests_for(method, target).len()
    }

    /// Waits (at most 5 s) until `n` requests for `target` with `method` have arrived, and
    /// returns them.
    pub async fn wait_for(&self, method: &str, target: &str, n: usize) -> Vec<Seen> {
        for _ in 0..500 {
            let got = self.requests_for(method, target);
            if got.len() >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{method} {target} never arrived {n} times: {:?}",
            self.requests()
        );
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A complete response: `status_line` (e.g. `HTTP/1.0 200 OK`), the fields in order,
/// `Content-Length` and `Connection: close`, then `body`.
pub fn reply(status_line: &str, fields: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = head(status_line, fields);
    out.truncate(out.len() - 2);
    out.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
    out
}

/// A head alone: `status_line` and the fields in order, ended by the empty line. For interim
/// (1xx) responses and bodiless ones (304) that must not get a `Content-Length`.
pub fn head(status_line: &str, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{status_line}\r\n");
    for (name, value) in fields {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// One connection: read a request, record it, write what the script says, close.
async fn exchange(mut stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>, script: Arc<Script>) {
    let Ok(Some(request)) = tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await
    else {
        return;
    };
    let before = {
        let mut log = seen.lock();
        let before = log
            .iter()
            .filter(|s| s.target() == request.target())
            .count();
        log.push(request.clone());
        before
    };
    let answer = script(&request, before);
    let _ = stream.write_all(&answer).await;
    let _ = stream.shutdown().await;
}

/// Reads one request: head up to the empty line, then a `Content-Length` or chunked body.
/// `None` when the peer closed first or broke a bound.
async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::with_capacity(1024);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD || !fill(stream, &mut buf).await {
            return None;
        }
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let line = lines.next()?.to_owned();
    let fields: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
        .collect();
    let mut rest = buf.split_off(end + 4);
    let mut request = Seen {
        line,
        fields,
        body: Vec::new(),
    };
    let chunked = request
        .all("transfer-encoding")
        .iter()
        .any(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        request.body = read_chunked(stream, &mut rest).await?;
    } else if let Some(n) = request
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        if n > MAX_BODY {
            return None;
        }
        while rest.len() < n {
            if !fill(stream, &mut rest).await {
                return None;
            }
        }
        rest.truncate(n);
        request.body = rest;
    }
    Some(request)
}

/// A chunked body, `buf` holding what was already read past the head.
async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    for _ in 0..MAX_CHUNKS {
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if buf.len() > MAX_HEAD || !fill(stream, buf).await {
                return None;
            }
        };
        let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        if body.len() + size > MAX_BODY {
            return None;
        }
        // The chunk, then its CRLF (the last chunk: no trailers expected, just CRLF).
        let need = line_end + 2 + size + 2;
        while buf.len() < need {
            if !fill(stream, buf).await {
                return None;
            }
        }
        body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
        buf.drain(..need);
        if size == 0 {
            return Some(body);
        }
    }
    None
}

/// Reads more bytes into `buf`; false when the peer closed or the read failed.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}
