//! `meshcache digest show URL|FILE`: what a Cache Digest holds — its control block, fill and
//! false-positive rates — read from a file or fetched from a cache (Squid serves its own at
//! `http://HOST:PORT/squid-internal-periodic/store_digest`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context as _};
use meshcache_summary::CacheDigest;

/// Digest commands.
#[derive(clap::Subcommand)]
pub enum DigestCommand {
    /// Print a digest's header, fill and expected false-positive rate.
    Show {
        /// A file holding a digest body, or an http:// URL serving one.
        source: String,
        /// Also test whether these URLs are in it (GET keys).
        #[arg(long)]
        url: Vec<String>,
    },
}

/// Runs the command.
pub fn run(command: DigestCommand) -> anyhow::Result<()> {
    let DigestCommand::Show { source, url } = command;
    let body = if source.starts_with("http://") {
        fetch(&source)?
    } else {
        std::fs::read(&source).with_context(|| format!("cannot read {source}"))?
    };
    let d = CacheDigest::decode(&body).with_context(|| format!("{source}: not a usable digest"))?;
    println!("{source}: Cache Digest, {} bytes", body.len());
    println!(
        "  capacity {}, count {}, del_count {}, {} bits per entry, 4 hash functions",
        d.capacity(),
        d.count(),
        d.del_count(),
        d.bits_per_entry()
    );
    println!(
        "  mask {} bytes ({} bits), {} set: fill {:.1}%",
        d.mask().len(),
        d.mask().len() * 8,
        d.bits_set(),
        d.fill() * 100.0
    );
    println!(
        "  false-positive rate: {:.4}% from the fill (fill^4), {:.4}% by the Bloom formula for {} entries",
        d.observed_fp_rate() * 100.0,
        d.expected_fp_rate() * 100.0,
        d.count()
    );
    for u in url {
        let key = meshcache_store::StoreKey::get(&u);
        let verdict = if d.contains(key.as_bytes()) {
            "maybe present"
        } else {
            "absent"
        };
        println!("  {u}: {verdict} (key {})", key.to_hex());
    }
    Ok(())
}

/// GETs a digest as Squid's peers do (Accept: application/cache-digest, text/html).
fn fetch(url: &str) -> anyhow::Result<Vec<u8>> {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let mut s = TcpStream::connect(&addr).with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/cache-digest\r\n\
         Accept: text/html\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).context("reading the answer")?;
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no response head")?;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let body = buf[head_end + 4..].to_vec();
    if status != "200" {
        bail!(
            "{url} answered {}: {}",
            head.lines().next().unwrap_or(""),
            String::from_utf8_lossy(&body).trim()
        );
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        bail!("{url} sent a chunked body; digests are sent with a length");
    }
    Ok(body)
}
