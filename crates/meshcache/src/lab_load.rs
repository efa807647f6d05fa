//! `meshcache lab load`: the client emulator on its own, against any proxy
//! (Squid included) or an origin: either a trace's clients replayed, or, like
//! wrk, C connections requesting one URL for a while.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use meshcache_lab::client::{self, Classifier, Job, Outcome, Report, Target};

/// Arguments of `lab load`.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Replay this trace (see `meshcache workload generate`): one emulated client per client id.
    #[arg(long, conflicts_with = "url")]
    trace: Option<PathBuf>,
    /// Request this URL over and over (throughput mode).
    #[arg(long)]
    url: Option<String>,
    /// The proxy to send absolute-URI requests to.
    #[arg(long, conflicts_with = "origin")]
    proxy: Option<SocketAddr>,
    /// Send origin-form requests straight to the URL's authority instead.
    #[arg(long)]
    origin: bool,
    /// Connections in throughput mode.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// How long throughput mode runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Outstanding requests per emulated client (trace mode).
    #[arg(long, default_value_t = 1)]
    outstanding: usize,
    /// Pause between a response and the emulated client's next request (trace mode).
    #[arg(long, conflicts_with = "url", value_parser = humantime::parse_duration)]
    think: Option<Duration>,
    /// Per-request timeout.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The proxy's name in X-Cache headers (tells its own hits from its peers').
    #[arg(long, default_value = "")]
    name: String,
    /// Names of the proxy's parents (repeatable).
    #[arg(long)]
    parent: Vec<String>,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print a JSON report.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = if let Some(url) = &args.url {
        let target = target(&args, url)?;
        rt.block_on(client::hammer(
            target,
            std::slice::from_ref(url),
            args.connections,
            args.duration,
            args.timeout,
            None,
        ))
    } else if let Some(path) = &args.trace {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let (_, requests) = meshcache_workload::trace::read(std::io::BufReader::new(file))
            .with_context(|| format!("{} is not a valid trace", path.display()))?;
        let Some(first) = requests.first() else {
            bail!("{} has no requests", path.display());
        };
        let target = target(&args, &first.url)?;
        let mut streams: std::collections::BTreeMap<u32, Vec<_>> = Default::default();
        for r in requests {
            streams.entry(r.client).or_default().push(r);
        }
        let job = Job {
            target,
            streams: streams.into_values().collect(),
            outstanding: args.outstanding,
            think: args.think,
            timeout: args.timeout,
            deadline: None,
            classifier: Classifier {
                local: args.name.clone(),
                parents: args.parent.clone(),
            },
        };
        rt.block_on(client::run(&job, None))
    } else {
        bail!("give --trace FILE or --url URL");
    };
    print_report(&report, args.json);
    Ok(())
}

fn target(args: &LoadArgs, url: &str) -> anyhow::Result<Target> {
    if let Some(p) = args.proxy {
        return Ok(Target::Proxy(p));
    }
    if !args.origin {
        bail!("give --proxy ADDR, or --origin to send requests straight to the URL's authority");
    }
    let authority = url
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .with_context(|| format!("{url} is not an http:// URL"))?;
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    })
    .with_context(|| format!("cannot resolve {authority}"))?
    .next()
    .with_context(|| format!("{authority} has no address"))?;
    Ok(Target::Origin(addr))
}

fn print_report(r: &Report, json: bool) {
    let ms = |q: f64| r.latency.value_at_quantile(q) as f64 / 1000.0;
    if json {
        let outcomes: serde_json::Map<String, serde_json::Value> = Outcome::ALL
            .iter()
            .map(|o| (o.name().to_string(), r.count(*o).into()))
            .collect();
        let v = serde_json::json!({
            "requests": r.requests,
            "errors": r.errors,
            "bytes": r.bytes,
            "wall_s": r.wall.as_secs_f64(),
            "req_per_s": r.rate(),
            "latency_ms": {
                "mean": r.latency.mean() / 1000.0,
                "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99),
                "max": r.latency.max() as f64 / 1000.0,
            },
            "outcomes": outcomes,
        });
        println!("{v:#}");
        return;
    }
    println!(
        "{} requests in {:.2} s: {:.0} req/s, {:.1} MB/s",
        r.requests,
        r.wall.as_secs_f64(),
        r.rate(),
        r.bytes as f64 / r.wall.as_secs_f64().max(1e-9) / 1e6
    );
    println!(
        "latency ms: mean {:.3}, p50 {:.3}, p90 {:.3}, p99 {:.3}, max {:.3}",
        r.latency.mean() / 1000.0,
        ms(0.5),
        ms(0.9),
        ms(0.99),
        r.latency.max() as f64 / 1000.0
    );
    let outcomes: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| format!("{} {}", o.name(), r.count(*o)))
        .collect();
    println!("outcomes: {}", outcomes.join(", "));
    println!(
        "errors: connect {}, timeout {}, protocol {}, 5xx {}",
        r.errors.connect, r.errors.timeout, r.errors.protocol, r.errors.status_5xx
    );
}
