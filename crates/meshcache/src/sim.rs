//! `meshcache sim …`: the simulator and the analytical model, from the command line.
//!
//! The work is done by `meshcache-sim`; this module reads specs and traces, applies `--set`
//! overrides, shows progress, stops cleanly on Ctrl-C (reporting what was simulated so far)
//! and writes the results.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use meshcache_sim::results::Provenance;
use meshcache_sim::{Control, Results, SimSpec, Trace};

/// Simulator commands.
#[derive(clap::Subcommand)]
pub enum SimCommand {
    /// Simulate one mesh over a trace and print (or write) what it measured.
    Run(RunArgs),
    /// Simulate a parameter's range for several protocols; write results.json and graphs.
    Sweep(SweepArgs),
    /// The directory paper's analytical model (its Figure 6).
    Model(crate::sim_model::ModelArgs),
}

/// Where the requests come from, and the spec.
#[derive(clap::Args)]
pub struct Input {
    /// The simulation spec (TOML: tables `mesh`, `protocol`, `net`, `replay`); without it, the
    /// defaults (4 sibling caches, ICP).
    #[arg(long)]
    spec: Option<PathBuf>,
    /// A trace (`meshcache workload generate` writes them).
    #[arg(long, conflicts_with_all = ["workload", "log"])]
    trace: Option<PathBuf>,
    /// A Squid access log (native or common format) to replay: its GET requests, clients
    /// numbered by address in order of appearance.
    #[arg(long, conflicts_with = "workload")]
    log: Option<PathBuf>,
    /// A workload spec to generate the trace from (as `workload generate --spec` takes).
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Seed for `--workload`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override one spec value, e.g. `--set mesh.caches=100 --set protocol.name=summary`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

impl Input {
    /// What the requests come from, for the results.
    pub(crate) fn provenance(&self) -> Provenance {
        let (input, seed) = match (&self.trace, &self.log, &self.workload) {
            (Some(t), _, _) => (format!("trace {}", t.display()), None),
            (None, Some(l), _) => (format!("log {}", l.display()), None),
            (None, None, Some(w)) => (format!("workload {}", w.display()), Some(self.seed)),
            (None, None, None) => (String::new(), None),
        };
        Provenance {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: crate::lab_run::revision_of(std::path::Path::new(".")),
            input,
            seed,
        }
    }
}

/// `sim run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) input: Input,
    /// Print the results as JSON instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also write results.json here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `sim sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub(crate) input: Input,
    /// The spec value to vary, e.g. `mesh.caches`.
    #[arg(long)]
    pub(crate) param: String,
    /// Its values, comma-separated (TOML values: `10,100,1000`, `"1ms","10ms"`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) values: Vec<String>,
    /// Protocols to compare, comma-separated (default: the spec's).
    #[arg(long, value_delimiter = ',')]
    pub(crate) protocols: Vec<meshcache_sim::Protocol>,
    /// Output directory.
    #[arg(long, default_value = "target/sim-sweep")]
    pub(crate) out: PathBuf,
}

/// Runs a simulator command.
pub fn run(command: SimCommand) -> anyhow::Result<()> {
    match command {
        SimCommand::Run(args) => run_one(args),
        SimCommand::Sweep(args) => crate::sim_sweep::run(args),
        SimCommand::Model(args) => crate::sim_model::run(args),
    }
}

fn run_one(args: RunArgs) -> anyhow::Result<()> {
    // First, so that a Ctrl-C while the trace loads stops the run as soon as it starts.
    let stop = interrupt_flag();
    let spec = load_spec(&args.input, &[])?;
    let trace = load_trace(&args.input, &spec)?;
    let results = simulate(&spec, &trace, &stop, "", &args.input.provenance())?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        write_json(&dir.join("results.json"), &results)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", summary(&results));
    }
    Ok(())
}

/// The spec: the file (or defaults), `--set` overrides, then `extra` ones; strict.
pub(crate) fn load_spec(input: &Input, extra: &[(String, String)]) -> anyhow::Result<SimSpec> {
    let text = match &input.spec {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None => String::new(),
    };
    let mut table: toml::Table = toml::from_str(&text).with_context(|| match &input.spec {
        Some(p) => format!("{}: not valid TOML", p.display()),
        None => String::new(),
    })?;
    let mut sets = Vec::new();
    for s in &input.sets {
        let Some((k, v)) = s.split_once('=') else {
            bail!("--set {s:?}: expected KEY=VALUE");
        };
        sets.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    for (key, value) in sets.iter().chain(extra) {
        set(&mut table, key, value)?;
    }
    let spec: SimSpec = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message()))
        .context("bad simulation spec")?;
    spec.validate().context("bad simulation spec")?;
    Ok(spec)
}

/// Sets the dotted `key` of `table` to `value` (a TOML value, or else a string).
fn set(table: &mut toml::Table, key: &str, value: &str) -> anyhow::Result<()> {
    let parsed = meshcache_sim::spec::toml_value(value);
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop() else {
        bail!("--set: empty key");
    };
    let mut at = table;
    for p in parts {
        at = at
            .entry(p)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("--set {key}: {p} is not a table"))?;
    }
    at.insert(last.to_owned(), parsed);
    Ok(())
}

/// The requests: a trace file, or a workload generated from a spec.
pub(crate) fn load_trace(input: &Input, spec: &SimSpec) -> anyhow::Result<Trace> {
    let requests = match (&input.trace, &input.workload) {
        (None, None) if input.log.is_some() => {
            let path = input.log.as_ref().expect("checked");
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let mut reader = meshcache_workload::log::LogReader::new(BufReader::new(file));
            let (requests, stats) = meshcache_workload::generate::replay(reader.by_ref());
            let bad: u64 = reader.bad_lines().values().sum();
            eprintln!(
                "{}: {} requests kept, {} not GET, {} bad URLs, {bad} bad lines skipped",
                path.display(),
                stats.kept,
                stats.not_get,
                stats.bad_url
            );
            requests
        }
        (Some(path), _) => {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let (_, requests) = meshcache_workload::trace::read(BufReader::new(file))
                .with_context(|| format!("{}", path.display()))?;
            requests
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let wspec: meshcache_workload::generate::WorkloadSpec = toml::from_str(&text)
                .with_context(|| format!("{}: bad workload spec", path.display()))?;
            meshcache_workload::generate::generate(&wspec, input.seed)
                .with_context(|| format!("{}", path.display()))?
        }
        (None, None) => bail!("give the requests: --trace FILE, --log FILE or --workload SPEC"),
    };
    if requests.is_empty() {
        bail!("the trace has no request");
    }
    Ok(Trace::new(
        &requests,
        spec.replay.limit,
        spec.net.origin_servers,
    ))
}

/// A flag Ctrl-C sets (once; a second Ctrl-C kills as usual).
pub(crate) fn interrupt_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
            eprintln!("meshcache: interrupted; reporting what was simulated so far");
            flag.store(true, Ordering::Relaxed);
            // A second Ctrl-C: out at once.
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
    });
    stop
}

/// Runs one simulation with a progress bar labelled `label`.
pub(crate) fn simulate(
    spec: &SimSpec,
    trace: &Trace,
    stop: &AtomicBool,
    label: &str,
    provenance: &Provenance,
) -> anyhow::Result<Results> {
    let bar = ProgressBar::new(trace.requests.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} requests, {per_sec}, eta {eta}",
        )
        .context("progress template")?
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("{label}{}", spec.protocol.name.as_str()));
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut progress = |done: u64| bar.set_position(done);
    let mut results = meshcache_sim::run(
        spec,
        trace,
        Control {
            stop,
            progress: &mut progress,
        },
    )
    .map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    results.provenance = Some(provenance.clone());
    Ok(results)
}

pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// A human summary of one run.
pub(crate) fn summary(r: &Results) -> String {
    let a = &r.answered;
    let pct = |x: f64| format!("{:.2} %", 100.0 * x);
    let mut s = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "{} caches + {} parents, protocol {}, {} of {} requests{}",
        r.spec.mesh.caches,
        r.spec.mesh.parents,
        r.spec.protocol.name.as_str(),
        a.requests,
        r.trace_requests.saturating_sub(r.spec.replay.warmup),
        if r.interrupted { " (interrupted)" } else { "" }
    );
    let _ = writeln!(
        s,
        "hit ratio {} (local {}, remote {}: {} sibling + {} parent hits), byte hit ratio {}",
        pct(r.hit_ratio),
        pct(r.local_hit_ratio),
        pct(r.remote_hit_ratio),
        a.sibling_hits,
        a.parent_hits,
        pct(r.byte_hit_ratio)
    );
    let _ = writeln!(
        s,
        "inter-cache: {:.4} protocol messages/request ({:.1} bytes; {:.4} datagrams), {:.3} peer HTTP requests/request",
        r.messages_per_request,
        r.message_bytes_per_request,
        r.datagrams_per_request,
        r.peer_http_per_request
    );
    let l = &r.latency_ms;
    let _ = writeln!(
        s,
        "latency ms: mean {:.2}, p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
        l.mean, l.p50, l.p90, l.p99, l.max
    );
    let _ = writeln!(
        s,
        "CPU utilisation: busiest node {:.1} %, mean {:.1} %",
        100.0 * r.max_cpu_utilisation,
        100.0 * r.mean_cpu_utilisation
    );
    let _ = writeln!(
        s,
        "simulated {:.1} s in {:.2} s of wall time: {:.0} requests/s",
        r.simulated_seconds, r.wall_seconds, r.requests_per_second
    );
    s
}
