//! `meshcache digest show` on Squid 5.7's digest, from a file and over HTTP, and on bad input.

use std::io::{Read, Write};
use std::process::Command;

const SQUID: &[u8] =
    include_bytes!("../../meshcache-summary/tests/vectors/squid-5.7-store_digest.bin");

fn show(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["digest", "show"])
        .args(args)
        .output()
        .expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn shows_a_digest_file_and_tests_urls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("d.bin");
    std::fs::write(&file, SQUID).expect("write");
    let (ok, text) = show(&[
        file.to_str().expect("path"),
        "--url",
        "http://127.0.0.1:18086/obj/v7?size=2000",
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("capacity 92, count 91"), "{text}");
    assert!(text.contains("254 set: fill 54.7%"), "{text}");
    assert!(text.contains("v7?size=2000: maybe present"), "{text}");
    // A damaged digest is refused with the reason.
    let mut bad = SQUID.to_vec();
    bad[21] = 5;
    std::fs::write(&file, &bad).expect("write");
    let (ok, text) = show(&[file.to_str().expect("path")]);
    assert!(!ok);
    assert!(text.contains("5 hash functions"), "{text}");
}

#[test]
fn fetches_a_digest_as_a_peer_does() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = c.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            req.extend_from_slice(&buf[..n]);
        }
        let head = format!(
            "HTTP/1.1 200 Cache Digest OK\r\nContent-Type: application/cache-digest\r\nContent-Length: {}\r\n\r\n",
            SQUID.len()
        );
        c.write_all(head.as_bytes()).expect("write");
        c.write_all(SQUID).expect("write");
        String::from_utf8_lossy(&req).to_string()
    });
    let url = format!("http://{addr}/squid-internal-periodic/store_digest");
    let (ok, text) = show(&[&url]);
    assert!(ok, "{text}");
    assert!(text.contains("mask 58 bytes"), "{text}");
    let request = server.join().expect("server");
    assert!(request.starts_with("GET /squid-internal-periodic/store_digest HTTP/1.1\r\n"));
    assert!(
        request.contains("Accept: application/cache-digest\r\n"),
        "{request}"
    );
}

/// `meshcache config default | head -1`: the reader goes away after one line; the command stops
/// quietly (status 141, as a tool killed by SIGPIPE), no panic report.
#[test]
fn a_closed_stdout_stops_the_output_quietly() {
    // A pipe whose reading end is closed before the command starts: its first write fails.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_meshcache"))
        .args(["config", "default"])
        .stdout(writer)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
