//! `meshcache workload ...`: characterize a Squid access log, generate a
//! synthetic request stream (or replay a log) as a trace.
//!
//! The work is done by the `meshcache-workload` crate; this module opens
//! the files, turns flags into specs and prints results.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;

use anyhow::{bail, Context};
use meshcache_workload::characterize::{characterize, Characterization, GroupStats};
use meshcache_workload::generate::{
    generate, replay, Benchmark, Characterized, Summary, WorkloadSpec, DEFAULT_CACHE_SHARE,
};
use meshcache_workload::log::LogReader;

/// Workload commands.
#[derive(clap::Subcommand)]
pub enum WorkloadCommand {
    /// Characterize a Squid access log (native or common format), per domain group.
    Characterize {
        /// The access log.
        log: PathBuf,
        /// A domain group: host suffixes separated by commas (e.g. `.br` or `.com,.net`);
        /// repeat for more groups. Hosts matching none form the group `rest`.
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Generate a trace: the benchmark model from flags or a spec file, the characterized
    /// model from a characterization (`--from`), or a log's replay (`--replay`).
    Generate {
        /// A TOML workload spec (the `[workload]` table of an experiment file, or a file
        /// holding only that table's keys).
        #[arg(long, conflicts_with_all = ["from", "replay"])]
        spec: Option<PathBuf>,
        /// Characterization JSON (from `characterize --json`) to build the characterized model.
        #[arg(long, conflicts_with = "replay")]
        from: Option<PathBuf>,
        /// An access log to replay as a trace.
        #[arg(long)]
        replay: Option<PathBuf>,
        /// Benchmark: number of clients.
        #[arg(long)]
        clients: Option<u32>,
        /// Benchmark: requests per client.
        #[arg(long)]
        requests_per_client: Option<u32>,
        /// Benchmark: inherent hit ratio (0..1).
        #[arg(long)]
        hit_ratio: Option<f64>,
        /// Benchmark: client groups (client mod groups).
        #[arg(long)]
        groups: Option<u32>,
        /// Benchmark: share of new URLs from a pool common to all groups (implies not disjoint).
        #[arg(long)]
        shared: Option<f64>,
        /// Characterized (`--from`): requests in all (default: as many as the log had).
        #[arg(long)]
        requests: Option<u32>,
        /// Requests per second over the stream (0: all at time 0).
        #[arg(long)]
        rate: Option<f64>,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Share of the unique bytes suggested as each node's cache size.
        #[arg(long, default_value_t = DEFAULT_CACHE_SHARE)]
        cache_share: f64,
        /// Where to write the trace.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Runs the command.
pub fn run(command: WorkloadCommand) -> anyhow::Result<()> {
    match command {
        WorkloadCommand::Characterize { log, groups, json } => {
            let file = File::open(&log).with_context(|| format!("opening {}", log.display()))?;
            let groups: Vec<Vec<String>> = groups
                .iter()
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .collect();
            let mut reader = LogReader::new(BufReader::new(file));
            let mut ch = characterize(reader.by_ref(), &groups, &Default::default());
            ch.bad_lines = reader.bad_lines().clone();
            if json {
                println!("{}", serde_json::to_string_pretty(&ch)?);
            } else {
                print_table(&ch, reader.lines());
            }
            Ok(())
        }
        WorkloadCommand::Generate {
            spec,
            from,
            replay: replay_log,
            clients,
            requests_per_client,
            hit_ratio,
            groups,
            shared,
            requests,
            rate,
            seed,
            cache_share,
            out,
        } => {
            if !(0.0..=1.0).contains(&cache_share) {
                bail!("--cache-share must be within 0..1, got {cache_share}");
            }
            let (requests_out, comments) = if let Some(log) = replay_log {
                let file =
                    File::open(&log).with_context(|| format!("opening {}", log.display()))?;
                let mut reader = LogReader::new(BufReader::new(file));
                let (reqs, stats) = replay(reader.by_ref());
                eprintln!(
                    "replay: {} requests kept, {} not GET, {} bad URLs, {} bad lines",
                    stats.kept,
                    stats.not_get,
                    stats.bad_url,
                    reader.bad_lines().values().sum::<u64>()
                );
                let name = log.file_name().map(|n| n.to_string_lossy().into_owned());
                (
                    reqs,
                    vec![format!("replay of {}", name.unwrap_or_default())],
                )
            } else {
                let spec = if let Some(path) = from {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let ch: Characterization = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not a characterization", path.display()))?;
                    let n = requests
                        .unwrap_or_else(|| u32::try_from(ch.overall.requests).unwrap_or(u32::MAX));
                    let mut c = Characterized::from_characterization(&ch, n, clients.unwrap_or(40));
                    if let Some(r) = rate {
                        c.rate = r;
                    }
                    WorkloadSpec::Characterized(c)
                } else {
                    let mut spec = match spec {
                        Some(path) => read_spec(&path)?,
                        None => WorkloadSpec::Benchmark(Benchmark::default()),
                    };
                    match &mut spec {
                        WorkloadSpec::Benchmark(b) => {
                            if let Some(v) = clients {
                                b.clients = v;
                            }
                            if let Some(v) = requests_per_client {
                                b.requests_per_client = v;
                            }
                            if let Some(v) = hit_ratio {
                                b.inherent_hit_ratio = v;
                            }
                            if let Some(v) = groups {
                                b.groups = v;
                            }
                            if let Some(v) = shared {
                                b.disjoint = false;
                                b.shared = v;
                            }
                            if let Some(v) = rate {
                                b.rate = v;
                            }
                        }
                        WorkloadSpec::Characterized(c) => {
                            if let Some(v) = clients {
                                c.clients = v;
                            }
                            if let Some(v) = requests {
                                c.requests = v;
                            }
                            if let Some(v) = rate {
                                c.rate = v;
                            }
                        }
                    }
                    spec
                };
                spec.validate()?;
                let reqs = generate(&spec, seed)?;
                let mut comments = vec![format!("seed = {seed}")];
                comments.push(toml::to_string(&spec).context("writing the spec")?);
                (reqs, comments)
            };
            let file = File::create(&out).with_context(|| format!("creating {}", out.display()))?;
            meshcache_workload::trace::write(BufWriter::new(file), &comments, &requests_out)
                .with_context(|| format!("writing {}", out.display()))?;
            let s = Summary::with_cache_share(&requests_out, cache_share);
            println!("trace:               {}", out.display());
            println!("requests:            {}", s.requests);
            println!("clients:             {}", s.clients);
            println!("unique objects:      {}", s.unique_objects);
            println!("unique bytes:        {}", s.unique_bytes);
            println!("inherent hit ratio:  {:.4}", s.inherent_hit_ratio);
            println!(
                "suggested cache:     {} bytes per node ({:.0}% of unique bytes)",
                s.suggested_cache_bytes,
                cache_share * 100.0
            );
            Ok(())
        }
    }
}

/// Reads a spec file: either the spec's keys at the top level or a `[workload]` table.
fn read_spec(path: &PathBuf) -> anyhow::Result<WorkloadSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
    let table = match value.get("workload") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => value,
    };
    let spec: WorkloadSpec = table
        .try_into()
        .with_context(|| format!("{}: bad workload spec", path.display()))?;
    Ok(spec)
}

fn print_table(ch: &Characterization, lines: u64) {
    let bad: u64 = ch.bad_lines.values().sum();
    println!(
        "lines read: {lines}, records: {}, bad lines: {bad}",
        ch.overall.requests
    );
    for (reason, n) in &ch.bad_lines {
        println!("  {reason}: {n}");
    }
    println!();
    let rows: Vec<&GroupStats> = ch.groups.iter().chain([&ch.overall]).collect();
    let width = rows
        .iter()
        .map(|g| g.name.len() + 2)
        .max()
        .unwrap_or(0)
        .max(14);
    let line = |label: &str, f: &dyn Fn(&GroupStats) -> String| {
        print!("{label:<26}");
        for g in &rows {
            print!("{:>width$}", f(g));
        }
        println!();
    };
    line("group", &|g| g.name.clone());
    line("requests", &|g| g.requests.to_string());
    line("domain ratio", &|g| format!("{:.3}", g.domain_ratio));
    line("hot set size", &|g| g.hot_set_size.to_string());
    line("hot ratio", &|g| format!("{:.3}", g.hot_ratio));
    line("hot set popularity", &|g| {
        format!("{:.3}", g.hot_set_popularity)
    });
    line("popularity slope", &|g| {
        format!("{:.3}", g.popularity_slope)
    });
    line("unique objects", &|g| g.unique_objects.to_string());
    line("unique bytes", &|g| g.unique_bytes.to_string());
    line("inherent hit ratio", &|g| {
        format!("{:.3}", g.inherent_hit_ratio)
    });
    line("one-timers (objects)", &|g| {
        format!("{:.3}", g.one_timer_objects)
    });
    line("one-timers (requests)", &|g| {
        format!("{:.3}", g.one_timer_requests)
    });
    line("cacheable", &|g| format!("{:.3}", g.cacheable));
    line("mean rate (req/s)", &|g| {
        format!("{:.2}", g.rate.mean_per_s)
    });
    line("peak minute (req/s)", &|g| {
        format!("{:.2}", g.rate.peak_minute_per_s)
    });
    line("size mean", &|g| format!("{:.0}", g.sizes.mean));
    line("size median", &|g| g.sizes.median.to_string());
    line("size p90", &|g| g.sizes.p90.to_string());
    line("size max", &|g| g.sizes.max.to_string());
    line("pareto k", &|g| g.sizes.pareto_k.to_string());
    line("pareto alpha", &|g| format!("{:.3}", g.sizes.pareto_alpha));
    line("lognormal mu", &|g| format!("{:.3}", g.sizes.lognormal_mu));
    line("lognormal sigma", &|g| {
        format!("{:.3}", g.sizes.lognormal_sigma)
    });
    line("stack distance median", &|g| g.locality.median.to_string());
    line("stack distance p90", &|g| g.locality.p90.to_string());
    line("re-refs within 10", &|g| {
        format!("{:.3}", g.locality.within_10)
    });
    line("re-refs within 100", &|g| {
        format!("{:.3}", g.locality.within_100)
    });
    line("re-refs within 1000", &|g| {
        format!("{:.3}", g.locality.within_1000)
    });
}
