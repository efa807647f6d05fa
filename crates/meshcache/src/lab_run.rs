//! `meshcache lab run EXPERIMENT.toml --out DIR`: runs an experiment file
//! (see `meshcache_lab::experiment`) and writes `results.json`,
//! `results.md` and the graphs into DIR.
//!
//! Unless told otherwise (`--netns off`), the command first moves itself
//! into a network namespace of its own (`unshare --net`, loopback up, with
//! multicast on loopback where the kernel allows it), so
//! the UDP and TCP counters it reads count only the experiment's traffic and
//! nothing it starts can reach beyond this machine's loopback. It first makes
//! sure it may (`meshcache_lab::preflight::netns_problem`): with `--netns on`
//! it refuses, saying why and what to do; with `auto` it goes on without one
//! and says so. Everything else the run needs from the machine is checked by
//! the run before its first configuration (`meshcache_lab::preflight`); each
//! problem found is printed on a line of its own and the command fails.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context as _};
use meshcache_lab::experiment::{Experiment, Product};
use meshcache_lab::preflight;
use meshcache_lab::run::{run_experiment, RunOptions};

/// Set in the environment of the re-executed command inside its namespace.
const IN_NETNS: &str = "MESHCACHE_LAB_NETNS";

/// Network namespace handling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Netns {
    /// Use a namespace of its own when this user may create one.
    Auto,
    /// Require a namespace of its own.
    On,
    /// Stay in the current namespace (the UDP/TCP counts then include other traffic).
    Off,
}

/// Arguments of `lab run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The experiment file.
    experiment: PathBuf,
    /// Results directory (default: target/lab/NAME).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only the configurations of this name (repeatable).
    #[arg(long)]
    only: Vec<String>,
    /// Run only this product (repeatable): meshcache or squid.
    #[arg(long, value_parser = parse_product)]
    product: Vec<Product>,
    /// Network namespace of its own.
    #[arg(long, value_enum, default_value = "auto")]
    netns: Netns,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Parse and check the experiment file, print the runs it would make, and stop.
    #[arg(long)]
    check: bool,
    /// Measure the configurations at the same time instead of one after the other: one
    /// `lab run` per configuration, each in a network namespace of its own, every pass of each
    /// starting together with the same pass of the others. What the machine does during a
    /// pass then touches every configuration alike, which makes small CPU differences
    /// measurable (docs/lab.md); each configuration also sees the others' load.
    #[arg(long)]
    concurrent: bool,
}

fn parse_product(s: &str) -> Result<Product, String> {
    match s {
        "meshcache" => Ok(Product::Meshcache),
        "squid" => Ok(Product::Squid),
        _ => Err(format!("unknown product {s:?} (meshcache or squid)")),
    }
}

/// Runs the command.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.experiment)
        .with_context(|| format!("cannot read {}", args.experiment.display()))?;
    let exp = Experiment::from_toml(&text)
        .with_context(|| format!("{} is not a valid experiment", args.experiment.display()))?;
    if args.check {
        println!("{}: ok", args.experiment.display());
        for c in &exp.config {
            println!(
                "  {} (topology {}, protocol {})",
                c.name, c.topology, c.protocol
            );
        }
        return Ok(());
    }
    if args.concurrent {
        return run_concurrent(&args, &exp);
    }
    let in_netns = std::env::var_os(IN_NETNS).is_some();
    if !in_netns && args.netns != Netns::Off {
        match preflight::netns_problem() {
            None => std::process::exit(reexec_in_netns()?),
            Some(p) if args.netns == Netns::On => return refuse(vec![p]),
            Some(p) => eprintln!(
                "meshcache lab: {}; the run goes on in this namespace (its UDP/TCP counts \
                 include other traffic, and its addresses must be free here)",
                p.what
            ),
        }
    }
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("target/lab").join(&exp.name));
    // Folders made here let Squid's user through (a given --out is left as it is: the run
    // checks it); nodes get absolute paths, as Squid changes its working directory.
    meshcache_lab::folders::create_reachable(&out)
        .with_context(|| format!("cannot create {}", out.display()))?;
    let out = out
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", out.display()))?;
    let opts = RunOptions {
        out: out.clone(),
        meshcache: std::env::current_exe().context("cannot find the meshcache binary")?,
        own_netns: in_netns,
        only: args.only,
        products: args.product,
        progress: !args.quiet,
        revision: revision(&args.experiment),
        base: args
            .experiment
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default(),
        barrier: meshcache_lab::barrier::Barrier::from_env().map_err(anyhow::Error::msg)?,
    };
    crate::init_tracing();
    // The clients and origins are this process's threads: pinned before the runtime starts
    // them, so that they all inherit it (the nodes are pinned by their own `taskset`).
    if !exp.clients.cpus.is_empty() {
        meshcache_lab::pin::pin_this_process(&exp.clients.cpus).with_context(|| {
            format!(
                "clients.cpus = {:?} cannot pin the lab here: name CPUs this machine lets it \
                 use, or none",
                exp.clients.cpus
            )
        })?;
    }
    let outcome = crate::runtime()?.block_on(async {
        // Stop on SIGINT/SIGTERM, and (inside our namespace) when the command that re-executed
        // us is gone, however it died: an experiment never outlives the command that started it.
        let parent = parent_pid();
        let orphaned = async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                if in_netns && parent_pid() != parent {
                    break;
                }
            }
        };
        let interrupt = async {
            tokio::select! {
                () = crate::shutdown_signal() => {}
                () = orphaned => eprintln!("meshcache lab: the launching command is gone; stopping"),
            }
        };
        run_experiment(&exp, &text, &opts, interrupt).await
    });
    let results = match outcome {
        Ok(results) => results,
        Err(e) => match e.downcast::<preflight::Refused>() {
            Ok(refused) => return refuse(refused.0),
            Err(e) => return Err(e),
        },
    };
    println!(
        "{}: {} runs in {:.0} s; results in {}",
        exp.name,
        results.configs.len(),
        results.duration_s,
        out.display()
    );
    if let Ok(md) = std::fs::read_to_string(out.join("results.md")) {
        println!("\n{md}");
    }
    Ok(())
}

/// Prints each problem that keeps the run from starting on a line of its own, and fails.
fn refuse(problems: Vec<preflight::Problem>) -> anyhow::Result<()> {
    for p in &problems {
        eprintln!("meshcache lab: {p}");
    }
    bail!(
        "the run did not start ({} problem{} above)",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    )
}

/// `lab run --concurrent`: one child `lab run` per selected configuration, started together
/// and held together pass by pass; their results merged into one report in `--out`.
fn run_concurrent(args: &RunArgs, exp: &Experiment) -> anyhow::Result<()> {
    use meshcache_lab::barrier;
    let names: Vec<String> = exp
        .config
        .iter()
        .map(|c| c.name.clone())
        .filter(|n| args.only.is_empty() || args.only.contains(n))
        .collect();
    if names.len() < 2 {
        bail!("--concurrent needs at least two configurations (selected: {names:?})");
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/lab").join(&exp.name));
    let parts_dir = out.join("concurrent");
    let rendezvous = parts_dir.join("rendezvous");
    if args.netns != Netns::Off {
        // Each configuration needs a namespace of its own: in one, they would share addresses.
        if let Some(p) = preflight::netns_problem() {
            return refuse(vec![p]);
        }
    }
    if parts_dir.exists() {
        std::fs::remove_dir_all(&parts_dir)
            .with_context(|| format!("cannot clear {}", parts_dir.display()))?;
    }
    meshcache_lab::folders::create_reachable(&rendezvous)
        .with_context(|| format!("cannot create {}", rendezvous.display()))?;
    let exe = std::env::current_exe().context("cannot find the meshcache binary")?;
    let netns = match args.netns {
        Netns::Auto => "auto",
        Netns::On => "on",
        Netns::Off => "off",
    };
    if args.netns == Netns::Off {
        eprintln!(
            "meshcache lab: --concurrent with --netns off: the configurations share this \
             namespace's addresses and will collide"
        );
    }
    let mut children = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let party = format!("{i:02}");
        let dir = parts_dir.join(&party);
        let log = parts_dir.join(format!("{party}.log"));
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.args(["lab", "run"])
            .arg(&args.experiment)
            .args(["--only", name, "--netns", netns, "--quiet", "--out"])
            .arg(&dir)
            .env(barrier::DIR_VAR, &rendezvous)
            .env(barrier::PARTY_VAR, &party)
            .env(barrier::PARTIES_VAR, names.len().to_string())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        for p in &args.product {
            cmd.args(["--product", p.name()]);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the run of {name:?}"))?;
        eprintln!(
            "meshcache lab: {name:?} runs as pid {} (log {})",
            child.id(),
            log.display()
        );
        children.push((name, dir, log, child));
    }
    // One failed run would leave the others waiting at every pass for it: stop them all.
    let mut statuses: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let mut stopped = vec![false; children.len()];
    while statuses.iter().any(Option::is_none) {
        for (i, (name, _, _, child)) in children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child
                    .try_wait()
                    .with_context(|| format!("waiting for {name:?}"))?;
            }
        }
        if statuses.iter().flatten().any(|s| !s.success()) {
            for (i, (_, _, _, child)) in children.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    // Its own copy inside the namespace sees it gone and stops its nodes.
                    let _ = child.kill();
                    statuses[i] = child.wait().ok();
                    stopped[i] = true;
                }
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut parts = Vec::new();
    let mut failed = Vec::new();
    for (((name, dir, log, _), status), stopped) in children.into_iter().zip(statuses).zip(stopped)
    {
        let status = status.context("a run's exit status was lost")?;
        if stopped {
            failed.push(format!("{name:?} (stopped)"));
            continue;
        }
        if !status.success() {
            failed.push(format!("{name:?} ({status}; see {})", log.display()));
            continue;
        }
        let path = dir.join("results.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        parts.push(
            serde_json::from_str::<meshcache_lab::results::Results>(&text)
                .with_context(|| format!("{} is not a lab result", path.display()))?,
        );
    }
    if !failed.is_empty() {
        bail!("concurrent runs failed: {}", failed.join(", "));
    }
    let merged =
        meshcache_lab::run::merge_concurrent(parts, &names).context("no results to merge")?;
    let written = meshcache_lab::report::write_all(&merged, &out).context("writing the report")?;
    for w in &written.warnings {
        eprintln!("meshcache lab: {w}");
    }
    println!(
        "{}: {} runs of {} configurations at the same time in {:.0} s; results in {}",
        exp.name,
        merged.configs.len(),
        names.len(),
        merged.duration_s,
        out.display()
    );
    if let Ok(md) = std::fs::read_to_string(out.join("results.md")) {
        println!("\n{md}");
    }
    Ok(())
}

/// This process's parent (field 4 of `/proc/self/stat`), or 0 when unknown.
fn parent_pid() -> u32 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Runs this same command again inside a new network namespace with loopback up (and, where
/// allowed, multicast on loopback with a route for 224.0.0.0/4); returns its exit code. Whether
/// that is allowed here is for [`preflight::netns_problem`] to find out first. The child is in this process's process group, so ctrl-c reaches it.
fn reexec_in_netns() -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("cannot find the meshcache binary")?;
    let status = Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            // Loopback multicast for the multicast search's group (tolerated if refused: the
            // nodes then fall back to logical multicast by themselves).
            "ip link set lo up && { { ip link set lo multicast on && ip route add 224.0.0.0/4 dev lo; } 2>/dev/null; exec \"$0\" \"$@\"; }",
        ])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(IN_NETNS, "1")
        .status()
        .context("cannot run unshare")?;
    Ok(status.code().unwrap_or(1))
}

/// `git describe --always --dirty` of the experiment file's repository, or "unknown".
fn revision(experiment: &std::path::Path) -> String {
    let dir = experiment
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    revision_of(dir)
}

/// `git describe --always --dirty` of the repository holding `dir`, or "unknown".
pub(crate) fn revision_of(dir: &std::path::Path) -> String {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
