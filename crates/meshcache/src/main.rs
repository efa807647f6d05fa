//! The `meshcache` command: runs a proxy node and the operator tools.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use meshcache_proxy::{Config, Listeners, Proxy, DEFAULT_CONFIG};

/// mimalloc instead of glibc's malloc: a hit allocates and frees a few dozen small blocks, and
/// glibc's consolidation of its fast bins showed up in profiles of the hit path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod applet;
mod digest;
mod lab_link;
mod lab_load;
mod lab_run;
mod sim;
mod sim_model;
mod sim_sweep;
mod store;
mod workload;

/// meshcache: a cooperative web proxy cache.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a proxy node (with no -c: the embedded default, 127.0.0.1:3128).
    Run {
        /// TOML config file.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// The disk store: check (and repair) a disk's directory offline.
    Store {
        #[command(subcommand)]
        command: store::StoreCommand,
    },
    /// Print or check configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// ICP operator tools.
    Icp {
        #[command(subcommand)]
        command: IcpCommand,
    },
    /// The evaluation lab: experiments and the emulators they are made of.
    Lab {
        #[command(subcommand)]
        command: LabCommand,
    },
    /// Cache Digests (Squid's summaries of cache contents).
    Digest {
        #[command(subcommand)]
        command: digest::DigestCommand,
    },
    /// Active Cache applets: check modules, run one on a document.
    Applet {
        #[command(subcommand)]
        command: applet::AppletCommand,
    },
    /// Workloads: characterize an access log, generate a synthetic request stream.
    Workload {
        #[command(subcommand)]
        command: workload::WorkloadCommand,
    },
    /// The simulator (meshes far larger than one machine) and the analytical model.
    Sim {
        #[command(subcommand)]
        command: sim::SimCommand,
    },
}

#[derive(Subcommand)]
enum IcpCommand {
    /// Ask a peer whether it holds URL; prints its reply and the round trip.
    Query {
        /// The peer's ICP address (host:port).
        peer: std::net::SocketAddr,
        /// The absolute URL to ask about.
        url: String,
        /// Local address to send from (peers answer only the address they have configured).
        #[arg(long, default_value = "0.0.0.0:0")]
        from: std::net::SocketAddr,
        /// How long to wait for the reply.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
}

#[derive(Subcommand)]
enum LabCommand {
    /// Run the origin emulator: responses shaped by the query string (?size=N&cc=...).
    Origin {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Delay every reply by this long (unless the URL's delay_ms says otherwise).
        #[arg(long, value_parser = humantime::parse_duration, group = "delay_dist")]
        delay: Option<std::time::Duration>,
        /// Delay every reply by a uniform draw between MIN and MAX.
        #[arg(long, value_name = "MIN,MAX", value_parser = parse_duration_pair, group = "delay_dist")]
        delay_uniform: Option<(std::time::Duration, std::time::Duration)>,
        /// Delay every reply by an exponential draw of this mean.
        #[arg(long, value_name = "MEAN", value_parser = humantime::parse_duration, group = "delay_dist")]
        delay_exp: Option<std::time::Duration>,
        /// Delay every reply by a log-normal draw of this median and sigma (e.g. 800ms,0.6).
        #[arg(long, value_name = "MEDIAN,SIGMA", value_parser = parse_lognormal, group = "delay_dist")]
        delay_lognormal: Option<(std::time::Duration, f64)>,
        /// Cache-Control of responses whose URL has no cc.
        #[arg(long)]
        cache_control: Option<String>,
        /// Last-Modified this long before now, for URLs without lm (e.g. 1day).
        #[arg(long, value_parser = humantime::parse_duration)]
        last_modified: Option<std::time::Duration>,
        /// Send an ETag derived from the path and query, for URLs without etag.
        #[arg(long)]
        etag: bool,
        /// Seed of the delay draws.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Run the client emulator against a proxy (or an origin) and report latency and outcomes.
    Load(lab_load::LoadArgs),
    /// Run an emulated link (delay, jitter, loss, bandwidth) between two addresses.
    Link(lab_link::LinkArgs),
    /// Run an experiment file: start origins and nodes, replay workloads, write results.
    Run(lab_run::RunArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the commented default config.
    Default,
    /// Validate a config file.
    Check {
        /// TOML config file.
        file: PathBuf,
    },
}

fn load(path: &PathBuf) -> anyhow::Result<Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Config::from_toml(&text).with_context(|| format!("{} is not a valid config", path.display()))
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config {
            command: ConfigCommand::Default,
        } => {
            print!("{DEFAULT_CONFIG}");
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => load(&file).map(|_| println!("{}: ok", file.display())),
        Command::Run { config } => run(config),
        Command::Icp {
            command:
                IcpCommand::Query {
                    peer,
                    url,
                    from,
                    timeout,
                },
        } => icp_query(peer, &url, from, timeout),
        Command::Lab {
            command: origin @ LabCommand::Origin { .. },
        } => lab_origin(origin),
        Command::Lab {
            command: LabCommand::Load(args),
        } => lab_load::run(args),
        Command::Lab {
            command: LabCommand::Link(args),
        } => lab_link::run(args),
        Command::Lab {
            command: LabCommand::Run(args),
        } => lab_run::run(args),
        Command::Workload { command } => workload::run(command),
        Command::Sim { command } => sim::run(command),
        Command::Digest { command } => digest::run(command),
        Command::Applet { command } => applet::run(command),
        Command::Store { command } => store::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meshcache: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MESHCACHE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// `meshcache config default | head` and the like: when the reader of our standard output goes
/// away, `print!` panics on the broken pipe. A Unix tool stops quietly instead (as if killed by
/// SIGPIPE, exit status 141); every other panic keeps the default report.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn lab_origin(args: LabCommand) -> anyhow::Result<()> {
    use meshcache_lab::origin::{Delay, OriginConfig};
    let LabCommand::Origin {
        listen,
        delay,
        delay_uniform,
        delay_exp,
        delay_lognormal,
        cache_control,
        last_modified,
        etag,
        seed,
    } = args
    else {
        anyhow::bail!("not the origin command");
    };
    let delay = match (delay, delay_uniform, delay_exp, delay_lognormal) {
        (Some(d), ..) => Delay::Fixed(d),
        (_, Some((min, max)), ..) => Delay::Uniform { min, max },
        (_, _, Some(mean), _) => Delay::Exponential { mean },
        (.., Some((median, sigma))) => Delay::LogNormal { median, sigma },
        _ => Delay::default(),
    };
    let config = OriginConfig {
        delay,
        cache_control,
        last_modified,
        etag,
        seed,
    };
    config.validate()?;
    init_tracing();
    runtime()?
        .block_on(meshcache_lab::origin::run_origin_with(listen, &config))
        .with_context(|| format!("origin emulator on {listen}"))
}

/// `A,B`: two durations (`--delay-uniform 500ms,1500ms`).
fn parse_duration_pair(s: &str) -> Result<(std::time::Duration, std::time::Duration), String> {
    let (a, b) = s.split_once(',').ok_or("expected MIN,MAX")?;
    let parse = |d: &str| humantime::parse_duration(d.trim()).map_err(|e| format!("{d:?}: {e}"));
    Ok((parse(a)?, parse(b)?))
}

/// `MEDIAN,SIGMA` (`--delay-lognormal 800ms,0.6`).
fn parse_lognormal(s: &str) -> Result<(std::time::Duration, f64), String> {
    let (median, sigma) = s.split_once(',').ok_or("expected MEDIAN,SIGMA")?;
    let median =
        humantime::parse_duration(median.trim()).map_err(|e| format!("{median:?}: {e}"))?;
    let sigma = sigma
        .trim()
        .parse()
        .map_err(|_| format!("{sigma:?}: not a number"))?;
    Ok((median, sigma))
}

fn run(config: Option<PathBuf>) -> anyhow::Result<()> {
    init_tracing();
    transparent_huge_pages_off();
    descriptors_to_the_hard_limit();
    let config = match &config {
        Some(path) => load(path)?,
        None => Config::from_toml(DEFAULT_CONFIG).context("embedded default config")?,
    };
    runtime()?.block_on(async {
        let listeners = Listeners::bind(&config)?;
        let proxy = Proxy::new(config)?;
        tokio::select! {
            served = proxy.serve(listeners, shutdown_signal()) => served?,
            () = rotate_on_signal(&proxy) => {}
        }
        Ok(())
    })
}

/// Turns transparent huge pages off for the proxy's process, unless `MIMALLOC_ALLOW_THP` is set
/// (mimalloc then does as it says). A cache allocates and frees object memory all the time, and
/// mimalloc hands freed memory back to the kernel after a short delay; with huge pages the
/// kernel zeroes a whole 2 MiB page to fault it back in. At the Summary Cache paper's load,
/// measured against the default at the same time, a node used 5.3 % less CPU and about a
/// quarter less resident memory without them; the hit benchmark's figures are in
/// docs/benchmarks.md.
/// Processes the proxy starts would inherit the setting; it starts none.
fn transparent_huge_pages_off() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        match rustix::thread::disable_transparent_huge_pages(true) {
            Ok(()) => tracing::debug!("transparent huge pages off for this process"),
            Err(e) => tracing::debug!(error = %e, "transparent huge pages left as they are"),
        }
    }
}

/// Raises the soft limit on open files to the hard one, as servers do (nginx's
/// `worker_rlimit_nofile`, Squid's `max_filedescriptors`): client connections, upstream
/// connections and the disks' open large objects (`store.open_files`) each take one, and a
/// distribution's default soft limit is often 1,024.
fn descriptors_to_the_hard_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::debug!(to = ?limit.maximum, "open-file limit raised"),
            Err(e) => tracing::debug!(error = %e, "open-file limit left as it is"),
        }
    }
}

/// Rotates the proxy's access log on every SIGUSR1 (as `squid -k rotate`); never resolves.
async fn rotate_on_signal(proxy: &Proxy) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::user_defined1()) {
            Ok(mut usr1) => {
                while usr1.recv().await.is_some() {
                    proxy.rotate_logs();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "no SIGUSR1 handler: the access log cannot be rotated")
            }
        }
    }
    #[cfg(not(unix))]
    let _ = proxy;
    std::future::pending().await
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Sends one ICP query and prints the answer: `ICP_OP_MISS from 127.0.0.2:3130 in 0.4 ms (reqnum 1)`.
fn icp_query(
    peer: std::net::SocketAddr,
    url: &str,
    from: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    use meshcache_wire::icp;
    let socket = std::net::UdpSocket::bind(from).with_context(|| format!("cannot bind {from}"))?;
    socket.set_read_timeout(Some(timeout))?;
    let reqnum = std::process::id().max(1);
    let mut query = Vec::new();
    icp::encode(&icp::Message::query(reqnum, url.as_bytes()), &mut query)
        .context("cannot encode the query")?;
    let started = std::time::Instant::now();
    socket
        .send_to(&query, peer)
        .with_context(|| format!("cannot send to {peer}"))?;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let (n, src) = socket.recv_from(&mut buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                anyhow::anyhow!("no reply from {peer} within {timeout:?}")
            }
            _ => e.into(),
        })?;
        let rtt = started.elapsed();
        let reply = match icp::decode(&buf[..n]) {
            Ok(m) if m.reqnum == reqnum => m,
            Ok(_) => continue,
            Err(e) => anyhow::bail!("undecodable reply from {src}: {e}"),
        };
        let mut line = format!(
            "{} from {src} in {:.1} ms (reqnum {})",
            reply.opcode.name(),
            rtt.as_secs_f64() * 1000.0,
            reply.reqnum
        );
        if let Some(r) = reply.src_rtt() {
            line.push_str(&format!(", origin rtt {} ms, {} hops", r.rtt_ms, r.hops));
        }
        println!("{line}");
        return Ok(());
    }
}
