//! `meshcache applet check FILE…` and `meshcache applet run FILE --url URL`: the applet author's
//! tools. `check` loads modules as the proxy would (compile, interface check); `run` runs one
//! against a document given on the command line, under the default limits, and prints what the
//! proxy would do with the hit.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use meshcache_applet::{AppletConfig, Invocation, Item, Items, Runtime, Verdict};

/// Applet commands.
#[derive(clap::Subcommand)]
pub enum AppletCommand {
    /// Load modules as the proxy would: compile them and check their imports and exports.
    Check {
        /// `.wasm` files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Run an applet once on a document, as on a cache hit, and print the outcome.
    Run {
        /// The `.wasm` file.
        file: PathBuf,
        /// The request URL (absolute, http://).
        #[arg(long)]
        url: String,
        /// The cached document's body, from a file (default: empty).
        #[arg(long)]
        body: Option<PathBuf>,
        /// A stored response header of the document, `Name: value` (repeatable).
        #[arg(long = "doc-header")]
        doc_headers: Vec<String>,
        /// A request header, `Name: value` (repeatable), e.g. `--header 'Cookie: a=1'`.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// The client's address.
        #[arg(long, default_value = "127.0.0.1")]
        client: IpAddr,
        /// The request method.
        #[arg(long, default_value = "GET")]
        method: Method,
    },
}

/// No other cached objects: `item_open` finds nothing.
struct NoItems;
impl Items for NoItems {
    fn open(&self, _url: &str, _request: &HeaderMap) -> Option<Item> {
        None
    }
}

fn header(text: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = text
        .split_once(':')
        .with_context(|| format!("{text:?}: expected `Name: value`"))?;
    Ok((
        HeaderName::from_bytes(name.trim().as_bytes())
            .with_context(|| format!("{name:?} is not a header name"))?,
        HeaderValue::from_str(value.trim())
            .with_context(|| format!("{value:?} is not a header value"))?,
    ))
}

/// Runs the command.
pub fn run(command: AppletCommand) -> anyhow::Result<()> {
    let runtime = Runtime::new(AppletConfig::default())?;
    match command {
        AppletCommand::Check { files } => {
            let mut failed = 0;
            for f in &files {
                let loaded = std::fs::read(f)
                    .with_context(|| format!("cannot read {}", f.display()))
                    .and_then(|bytes| {
                        runtime.compile(&bytes)?;
                        Ok(bytes.len())
                    });
                match loaded {
                    Ok(n) => println!("{}: ok ({n} bytes)", f.display()),
                    Err(e) => {
                        failed += 1;
                        println!("{}: {e:#}", f.display());
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} modules do not load", files.len());
            }
            Ok(())
        }
        AppletCommand::Run {
            file,
            url,
            body,
            doc_headers,
            headers,
            client,
            method,
        } => {
            let origin = meshcache_applet::header::origin_of(&url)
                .with_context(|| format!("{url}: not an absolute http:// URL"))?;
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let applet = runtime.compile(&bytes)?;
            let body = match body {
                Some(p) => {
                    std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?
                }
                None => Vec::new(),
            };
            let mut request = HeaderMap::new();
            for h in &headers {
                let (n, v) = header(h)?;
                request.append(n, v);
            }
            let stored = doc_headers
                .iter()
                .map(|h| header(h))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let invocation = Invocation {
                method,
                url,
                origin: Arc::from(origin.as_str()),
                headers: request,
                client,
                document: Item {
                    status: StatusCode::OK,
                    headers: Arc::from(stored),
                    body: Bytes::from(body),
                },
                log_to: Arc::from(format!("{origin}/")),
            };
            let started = std::time::Instant::now();
            let verdict = runtime.run(&applet, invocation, Arc::new(NoItems));
            let took = started.elapsed();
            match verdict {
                Verdict::Cached => println!("serve the cached copy"),
                Verdict::Origin(reason) => println!("send to the origin ({reason:?})"),
                Verdict::Built(b) => {
                    println!("serve a built response: {}", b.status);
                    for (n, v) in &b.headers {
                        println!("{n}: {}", String::from_utf8_lossy(v.as_bytes()));
                    }
                    println!();
                    println!("{}", String::from_utf8_lossy(&b.body()));
                }
            }
            let pending: Vec<String> = runtime.logs.destinations();
            for d in pending {
                if let Some(batch) = runtime.logs.take(&d, u64::MAX) {
                    eprintln!(
                        "log for {d}: {}",
                        String::from_utf8_lossy(&batch.body).trim_end()
                    );
                }
            }
            eprintln!("ran in {took:?}");
            Ok(())
        }
    }
}
