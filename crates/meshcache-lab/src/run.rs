//! Running an experiment: `meshcache lab run EXPERIMENT.toml --out DIR`.
//!
//! Every workload variant's workload is generated once (seeded), all of them first; then what
//! the runs need from the machine is checked ([`crate::preflight`]: programs, Squid's user and
//! folders, CPUs, free addresses), and the run is refused with every problem found, before the
//! first configuration starts. Then every configuration runs with every product and repetition
//! (repetitions interleaved), each run on fresh processes:
//!
//! 1. origins: one origin emulator per host of the workload, on
//!    `127.0.1.(1+k)` (the nodes' host tables map the names there);
//! 2. links: user-space relays for every `[[link]]` the configuration uses;
//! 3. nodes: one process per node of the topology (meshcache, or Squid with
//!    a generated squid.conf) on `127.0.0.(10+i)`, started through
//!    `setpriv --pdeathsig KILL` so none outlives the lab;
//! 4. a short pre-warm (a request per node, so ICP peers hear of each other),
//!    the optional unmeasured warm-up pass, then the measured pass, with
//!    snapshots of CPU, the nodes' counters and the namespace's UDP/TCP
//!    counters right before and after it;
//! 5. everything stopped, the run's figures appended to the results, and
//!    the report rewritten (so an interrupted experiment keeps what it did).
//!
//! Clients are assigned to the nodes that take clients as the Summary Cache
//! paper's benchmark does: client `c` to the `c mod n`-th such node.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use meshcache_workload::Request;

use crate::experiment::{parse_size, Experiment, Product, RunConfig, Variant};
use crate::link::{Link, LinkConfig, TcpRelay, UdpPair};
use crate::measure::{self, Cpu, NetCounters, NodeCounters};
use crate::node::{self, Launcher, NodePlan, NodeProcess, PeerPlan};
use crate::preflight::{Needs, Program};
use crate::results::{ConfigResult, LatencySummary, Machine, NodeResult, Results};
use crate::squid_user::RunsAs;
use crate::topology::Topology;

/// How `lab run` runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Results directory.
    pub out: PathBuf,
    /// The meshcache binary the nodes run.
    pub meshcache: PathBuf,
    /// Whether this process has a network namespace of its own.
    pub own_netns: bool,
    /// Only configurations with these names (all when empty).
    pub only: Vec<String>,
    /// Only these products (the experiment's when empty).
    pub products: Vec<Product>,
    /// Progress bars on standard error.
    pub progress: bool,
    /// The revision the binary was built from.
    pub revision: String,
    /// Where relative paths of the experiment file (a workload trace) start.
    pub base: PathBuf,
    /// Other `lab run` processes measuring at the same time (`lab run --concurrent`): every
    /// measured pass starts when all of them reach it.
    pub barrier: Option<crate::barrier::Barrier>,
}

/// One run of the expansion.
struct Planned<'a> {
    variant: Option<&'a Variant>,
    product: Product,
    config: &'a RunConfig,
    repetition: u32,
}

/// A generated workload.
struct Workload {
    requests: Vec<Request>,
    /// Host name → origin address.
    origins: BTreeMap<String, Ipv4Addr>,
    unique_bytes: u64,
    inherent_hit_ratio: f64,
}

/// Runs the experiment; `interrupt` resolving stops it (what finished is kept).
pub async fn run_experiment(
    exp: &Experiment,
    text: &str,
    opts: &RunOptions,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Results> {
    let started = Instant::now();
    crate::folders::create_reachable(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let mut results = Results {
        experiment: exp.name.clone(),
        experiment_toml: text.to_string(),
        revision: opts.revision.clone(),
        seed: exp.seed,
        started: now_rfc3339(),
        machine: machine(opts.own_netns),
        concurrent: opts.barrier.as_ref().is_some_and(|b| b.parties() > 1),
        ..Results::default()
    };
    let plan = expand(exp, opts);
    if plan.is_empty() {
        bail!("nothing to run: no configuration matches the --only / --product selection");
    }
    // Every workload before the first configuration: a trace that cannot be read, or a variant
    // that cannot be generated, is found now rather than after the runs before it.
    let mut workloads: HashMap<Option<String>, Workload> = HashMap::new();
    for p in &plan {
        let key = p.variant.map(|v| v.name.clone());
        if let std::collections::hash_map::Entry::Vacant(slot) = workloads.entry(key) {
            let w =
                make_workload(exp, p.variant, &opts.base).with_context(|| match slot.key() {
                    Some(name) => format!("variant {name:?}"),
                    None => "the experiment's workload".into(),
                })?;
            slot.insert(w);
        }
    }
    // Then what the machine must give the runs, checked before anything starts.
    let needs = needs(exp, &plan, &workloads, opts);
    let problems = crate::preflight::check(&needs);
    if !problems.is_empty() {
        return Err(crate::preflight::Refused(problems).into());
    }
    // A directory reused for a new run must not mix two runs' node files (a refused run leaves
    // the last one's alone).
    let runs = opts.out.join("runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs)
            .with_context(|| format!("cannot clear {}", runs.display()))?;
    }
    crate::folders::create_reachable(&runs)
        .with_context(|| format!("cannot create {}", runs.display()))?;
    let launcher = Launcher {
        meshcache: opts.meshcache.clone(),
        squid: needs.squid_binary.clone().unwrap_or_default(),
        threads: exp.nodes.threads,
        cpus: exp.nodes.cpus.clone(),
        squid_user: needs
            .squid_user
            .as_ref()
            .and_then(RunsAs::dropped_to)
            .cloned(),
    };
    // Per-node TCP segments: the nodes' sockets' own counters, read with sock_diag.
    let tcp_monitor = crate::tcpcount::TcpMonitor::start()
        .map_err(|e| {
            tracing::warn!(
                "TCP segments will be counted for the whole network namespace, not per node \
                 (sock_diag destroy events need CAP_NET_ADMIN here): {e}"
            )
        })
        .ok();
    let bars = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let overall = bars.add(ProgressBar::new(plan.len() as u64));
    overall.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} runs, {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    overall.set_prefix(exp.name.clone());
    let (steal0_total, steal0) = measure::steal_jiffies().unwrap_or((0, 0));

    let body = async {
        for (index, p) in plan.iter().enumerate() {
            let key = p.variant.map(|v| v.name.clone());
            let workload = workloads
                .get(&key)
                .ok_or_else(|| anyhow!("no workload was made for {key:?}"))?;
            let name = run_name(p);
            overall.set_message(name.clone());
            let dir = opts
                .out
                .join("runs")
                .join(format!("{index:02}-{}", slug(&name)));
            let result = run_one(
                exp,
                p,
                workload,
                &launcher,
                &dir,
                &bars,
                tcp_monitor.as_ref(),
                opts.barrier.as_ref().map(|b| (b, index)),
            )
            .await
            .with_context(|| format!("run {name:?}"))?;
            let line = format!(
                "{name}: {} requests, hit ratio {:.1}%, latency mean {:.2} ms, p99 {:.2} ms, \
                 CPU {:.2}+{:.2} s, {:.3} inter-cache msgs/request",
                result.requests,
                result.hit_ratio * 100.0,
                result.latency_ms.mean,
                result.latency_ms.p99,
                result.cpu_user_s,
                result.cpu_sys_s,
                result.intercache_messages_per_request,
            );
            if opts.progress {
                bars.println(line)?;
            } else {
                eprintln!("{line}");
            }
            results.configs.push(result);
            results.duration_s = started.elapsed().as_secs_f64();
            crate::report::write_all(&results, &opts.out).context("writing the report")?;
            overall.inc(1);
        }
        anyhow::Ok(())
    };
    let outcome = tokio::select! {
        r = body => r,
        () = interrupt => Err(anyhow!("interrupted: the report holds the runs that finished")),
    };
    if let Some(b) = &opts.barrier {
        // Runs measuring at the same time must not wait for passes this one will not make.
        if let Err(e) = b.retire() {
            tracing::warn!("cannot leave the concurrent runs' rendezvous: {e}");
        }
    }
    overall.finish_and_clear();
    let (steal1_total, steal1) = measure::steal_jiffies().unwrap_or((0, 0));
    if steal1_total > steal0_total {
        results.machine.steal_pct = 100.0 * (steal1 - steal0) as f64
            / (steal1_total - steal0_total) as f64
            * results.machine.cores as f64;
    }
    results.duration_s = started.elapsed().as_secs_f64();
    let written = crate::report::write_all(&results, &opts.out).context("writing the report")?;
    for w in &written.warnings {
        eprintln!("meshcache lab: {w}");
    }
    outcome.map(|()| results)
}

/// One `Results` from the per-configuration results of `lab run --concurrent`: the runs in
/// round order (each round's configurations in `order`, the experiment file's), the earliest
/// start, the longest duration, the largest steal.
pub fn merge_concurrent(parts: Vec<Results>, order: &[String]) -> Option<Results> {
    let mut parts = parts.into_iter();
    let mut merged = parts.next()?;
    for part in parts {
        if part.started < merged.started {
            merged.started = part.started;
        }
        merged.duration_s = merged.duration_s.max(part.duration_s);
        merged.machine.steal_pct = merged.machine.steal_pct.max(part.machine.steal_pct);
        merged.machine.own_netns &= part.machine.own_netns;
        merged.configs.extend(part.configs);
    }
    let rank = |name: &str| order.iter().position(|o| o == name).unwrap_or(order.len());
    merged
        .configs
        .sort_by_key(|c| (c.repetition, rank(&c.name)));
    merged.concurrent = true;
    Some(merged)
}

fn expand<'a>(exp: &'a Experiment, opts: &RunOptions) -> Vec<Planned<'a>> {
    let variants: Vec<Option<&Variant>> = if exp.variant.is_empty() {
        vec![None]
    } else {
        exp.variant.iter().map(Some).collect()
    };
    let mut plan = Vec::new();
    for variant in variants {
        for &product in &exp.products {
            if !opts.products.is_empty() && !opts.products.contains(&product) {
                continue;
            }
            // Repetitions interleave (A B C, A B C, …): slow drifts of the machine then
            // touch every configuration alike.
            for repetition in 0..exp.repetitions {
                for config in &exp.config {
                    if !config.products.is_empty() && !config.products.contains(&product) {
                        continue;
                    }
                    if !opts.only.is_empty() && !opts.only.contains(&config.name) {
                        continue;
                    }
                    plan.push(Planned {
                        variant,
                        product,
                        config,
                        repetition,
                    });
                }
            }
        }
    }
    plan
}

/// What the planned runs need from this machine: the programs and binaries their nodes start
/// with, the user Squid runs as and the folder its nodes' folders go below, and every address their
/// nodes and origins listen on (link relays, on 127.0.2.x and up, are not checked).
fn needs(
    exp: &Experiment,
    plan: &[Planned<'_>],
    workloads: &HashMap<Option<String>, Workload>,
    opts: &RunOptions,
) -> Needs {
    let squid = plan.iter().any(|p| p.product == Product::Squid);
    let squid_binary = if squid { Launcher::find_squid() } else { None };
    let squid_user = squid_binary.as_deref().map(crate::squid_user::runs_as);
    let mut programs = vec![Program::new(
        "setpriv",
        "every node is started through it, so that none outlives the lab",
        "util-linux",
    )];
    if !exp.nodes.cpus.is_empty() {
        programs.push(Program::new(
            "taskset",
            "nodes.cpus pins the nodes with it",
            "util-linux",
        ));
    }
    let mut tcp = BTreeMap::new();
    let mut udp = BTreeMap::new();
    for p in plan {
        // A topology that does not build is the run's own error, named when it runs.
        let Ok(topo) = Topology::build(&p.config.topology, &exp.topology) else {
            continue;
        };
        for (i, n) in topo.nodes.iter().enumerate() {
            let ip = node::node_ip(i);
            tcp.entry(SocketAddr::from((ip, node::HTTP_PORT)))
                .or_insert_with(|| format!("HTTP port of node {}", n.name));
            if p.product == Product::Meshcache {
                tcp.entry(SocketAddr::from((ip, node::ADMIN_PORT)))
                    .or_insert_with(|| format!("admin port of node {}", n.name));
            }
            if node::speaks_icp(&p.config.protocol) {
                udp.entry(SocketAddr::from((ip, node::ICP_PORT)))
                    .or_insert_with(|| format!("ICP port of node {}", n.name));
            }
        }
    }
    for w in workloads.values() {
        for (host, ip) in &w.origins {
            tcp.entry(SocketAddr::from((*ip, exp.origin_port)))
                .or_insert_with(|| format!("origin {host}"));
        }
    }
    Needs {
        squid,
        squid_binary,
        squid_user,
        meshcache: plan
            .iter()
            .any(|p| p.product == Product::Meshcache)
            .then(|| opts.meshcache.clone()),
        programs,
        node_cpus: exp.nodes.cpus.clone(),
        tcp,
        udp,
        results_folder: opts.out.clone(),
    }
}

fn group_name(p: &Planned<'_>) -> String {
    match p.variant {
        Some(v) => format!("{} {}", p.product.name(), v.name),
        None => p.product.name().to_string(),
    }
}

fn run_name(p: &Planned<'_>) -> String {
    let mut name = format!("{} / {}", group_name(p), p.config.name);
    if p.repetition > 0 {
        name.push_str(&format!(" #{}", p.repetition + 1));
    }
    name
}

fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// The address of the `k`-th origin host.
fn origin_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, 1 + (k % 250) as u8)
}

/// The address of the `k`-th relay face.
fn relay_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 2 + (k / 250) as u8, 1 + (k % 250) as u8)
}

/// The most distinct origin hosts a workload may name (each gets its own address).
const MAX_ORIGINS: usize = 250;

fn make_workload(
    exp: &Experiment,
    variant: Option<&Variant>,
    base: &Path,
) -> anyhow::Result<Workload> {
    let spec = exp.workload_for(variant);
    let mut requests = crate::replay::generate(&spec, exp.seed, base)?;
    if requests.is_empty() {
        bail!("the workload has no requests");
    }
    // Every URL names its origin by host; give each host an origin and the experiment's port.
    let mut origins = BTreeMap::new();
    let mut seen = HashMap::new();
    let mut unique_bytes = 0u64;
    let mut rereferences = 0u64;
    for r in &mut requests {
        let (host, rest) = split_url(&r.url)
            .ok_or_else(|| anyhow!("the workload has a URL the lab cannot serve: {}", r.url))?;
        let host = host.to_ascii_lowercase();
        if !origins.contains_key(&host) {
            if origins.len() == MAX_ORIGINS {
                bail!("the workload names more than {MAX_ORIGINS} hosts");
            }
            origins.insert(host.clone(), origin_ip(origins.len()));
        }
        r.url = format!("http://{host}:{}{rest}", exp.origin_port);
        match seen.entry(r.url.clone()) {
            std::collections::hash_map::Entry::Occupied(_) => rereferences += 1,
            std::collections::hash_map::Entry::Vacant(v) => {
                unique_bytes += r.size;
                v.insert(());
            }
        }
    }
    let inherent_hit_ratio = rereferences as f64 / requests.len() as f64;
    Ok(Workload {
        requests,
        origins,
        unique_bytes,
        inherent_hit_ratio,
    })
}

/// `http://host[:port]/rest` → (host, /rest).
fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let slash = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..slash];
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let path = &rest[slash..];
    if host.is_empty() {
        return None;
    }
    Some((host, if path.is_empty() { "/" } else { path }))
}

/// What one party of a link is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Party {
    Clients,
    Origins,
    Node(usize),
}

fn party(name: &str, topo: &Topology) -> Option<Party> {
    match name {
        "clients" => Some(Party::Clients),
        "origins" => Some(Party::Origins),
        _ => topo
            .nodes
            .iter()
            .position(|n| n.name == name)
            .map(Party::Node),
    }
}

/// The link config seen from `a` (its `a_to_b` is what `a` sends).
fn oriented(l: &crate::experiment::Link, a_is_from: bool) -> LinkConfig {
    if a_is_from {
        l.profile
    } else {
        LinkConfig {
            a_to_b: l.profile.b_to_a,
            b_to_a: l.profile.a_to_b,
            ..l.profile
        }
    }
}

/// Everything a run started; dropping it stops all (nodes first).
struct Running {
    nodes: Vec<NodeProcess>,
    _links: Vec<Link>,
    origins: Vec<crate::origin::Origin>,
}

impl Drop for Running {
    fn drop(&mut self) {
        node::stop_all(&mut self.nodes, Duration::from_secs(3));
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_one(
    exp: &Experiment,
    p: &Planned<'_>,
    w: &Workload,
    launcher: &Launcher,
    dir: &Path,
    bars: &MultiProgress,
    tcp_monitor: Option<&crate::tcpcount::TcpMonitor>,
    barrier: Option<(&crate::barrier::Barrier, usize)>,
) -> anyhow::Result<ConfigResult> {
    let topo = Topology::build(&p.config.topology, &exp.topology).map_err(|e| anyhow!(e))?;
    crate::folders::create_reachable(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let origins = start_origins(exp, w).await?;

    let Wiring {
        links,
        hosts,
        peer_addrs,
        client_targets,
        node_links,
    } = wire(exp, p, &topo, w).await?;

    let plans = node_plans(exp, p, w, &topo, dir, &hosts, &peer_addrs, node_links)?;
    let mut running = Running {
        nodes: Vec::new(),
        _links: links,
        origins,
    };
    for plan in plans {
        running.nodes.push(launcher.start(plan)?);
    }
    let ready = tokio::task::block_in_place(|| {
        running
            .nodes
            .iter_mut()
            .try_for_each(|n| n.wait_ready(Duration::from_secs(20)))
    });
    ready?;

    let client_nodes = topo.client_nodes();
    let jobs = client_jobs(&topo, &client_nodes, w, &client_targets);
    prewarm(exp, w, &jobs).await?;
    tokio::task::block_in_place(|| squid_peers_up(&running, Duration::from_secs(10)))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    if matches!(p.config.protocol.as_str(), "summary" | "digest") {
        tokio::task::block_in_place(|| summaries_installed(&running, Duration::from_secs(20)))?;
    }
    let order = serial_order(exp, &client_nodes, w);
    if exp.clients.warmup_pass {
        if exp.clients.serial {
            crate::replay::serial(&jobs, &order, exp, None).await;
        } else {
            crate::replay::replay(&jobs, exp, None).await;
        }
    }

    // Measured pass.
    let total: u64 = jobs
        .iter()
        .flat_map(|j| &j.streams)
        .map(|s| s.len() as u64)
        .sum();
    let bar = bars.add(ProgressBar::new(total));
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} requests, {eta} left")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(p.config.name.clone());
    if let Some((barrier, pass)) = barrier {
        let together = barrier
            .wait(pass)
            .await
            .context("cannot reach the other concurrent runs")?;
        if !together {
            tracing::warn!(
                pass,
                "the other concurrent runs did not reach this pass in time; measuring alone"
            );
        }
    }
    let ticks = measure::clock_ticks();
    let before = snapshot(&running, ticks)?;
    let tcp_phase = tcp_monitor.and_then(|m| {
        tokio::task::block_in_place(|| m.begin())
            .map_err(|e| tracing::warn!("no per-node TCP counts for this configuration: {e}"))
            .ok()
    });
    let origin_before: u64 = running.origins.iter().map(|o| o.total()).sum();
    let wall = Instant::now();
    let reports = if exp.clients.serial {
        crate::replay::serial(&jobs, &order, exp, Some(&bar)).await
    } else {
        crate::replay::replay(&jobs, exp, Some(&bar)).await
    };
    let wall_s = wall.elapsed().as_secs_f64();
    let tcp = tcp_monitor.zip(tcp_phase).and_then(|(m, phase)| {
        tokio::task::block_in_place(|| m.end(phase))
            .map_err(|e| tracing::warn!("no per-node TCP counts for this configuration: {e}"))
            .ok()
    });
    let after = snapshot(&running, ticks)?;
    bar.finish_and_clear();
    bars.remove(&bar);

    let origin_after: u64 = running.origins.iter().map(|o| o.total()).sum();
    let mut result = summarize(
        p,
        &topo,
        &running,
        &jobs,
        &reports,
        (&before, &after),
        tcp.as_ref(),
        w,
        wall_s,
    );
    result.seed = exp.seed;
    result.origin_requests = origin_after - origin_before;
    drop(running);
    Ok(result)
}

/// What each node of `topo` is started with for configuration `p`: its store's size, its
/// peers as it sees them, the cooperation settings, the product's extra lines.
#[allow(clippy::too_many_arguments)]
fn node_plans(
    exp: &Experiment,
    p: &Planned<'_>,
    w: &Workload,
    topo: &Topology,
    dir: &Path,
    hosts: &[BTreeMap<String, IpAddr>],
    peer_addrs: &HashMap<(usize, usize), (SocketAddr, SocketAddr)>,
    node_links: bool,
) -> anyhow::Result<Vec<NodePlan>> {
    let n = topo.nodes.len();
    let memory = match exp.nodes.memory.as_str() {
        "auto" => {
            ((w.unique_bytes as f64 * exp.nodes.cache_share) / n as f64).max(1_048_576.0) as u64
        }
        m => parse_size(m).map_err(|e| anyhow!(e))?,
    };
    // A cache smaller than the largest object stores objects up to its own size.
    let max_object_size = parse_size(&exp.nodes.max_object_size)
        .map_err(|e| anyhow!(e))?
        .min(memory);
    let extra = match p.product {
        Product::Meshcache => &exp.nodes.meshcache_extra,
        Product::Squid => &exp.nodes.squid_extra,
    };
    let digest_period = p.config.digest_period.unwrap_or(Duration::from_secs(60));
    let cooperation = cooperation_lines(p, digest_period, node_links)?;
    let mut plans = Vec::new();
    for (i, tn) in topo.nodes.iter().enumerate() {
        let peers = tn
            .neighbours
            .iter()
            .map(|nb| {
                let (http, icp) = peer_addrs[&(i, nb.node)];
                PeerPlan {
                    name: topo.nodes[nb.node].name.clone(),
                    role: nb.role,
                    http,
                    icp,
                    domains: nb.domains.clone(),
                }
            })
            .collect();
        let plan = NodePlan {
            name: tn.name.clone(),
            product: p.product,
            ip: node::node_ip(i),
            dir: dir.join(&tn.name),
            memory,
            max_object_size,
            protocol: p.config.protocol.clone(),
            cooperation: cooperation.clone(),
            digest_period_s: digest_period.as_secs(),
            persistent: p.config.persistent.unwrap_or(exp.nodes.persistent),
            query_lone_parent: p.config.query_lone_parent,
            peers,
            hosts: hosts[i].clone(),
            extra: extra.clone(),
        };
        plans.push(plan);
    }
    Ok(plans)
}

/// The emulated origin servers, one per host of the workload.
async fn start_origins(
    exp: &Experiment,
    w: &Workload,
) -> anyhow::Result<Vec<crate::origin::Origin>> {
    let mut origins = Vec::new();
    for ip in w.origins.values() {
        let addr = SocketAddr::from((*ip, exp.origin_port));
        let listener = bind_listener(addr, REBIND_LIMIT)
            .await
            .with_context(|| format!("cannot bind an origin on {addr}"))?;
        origins.push(crate::origin::Origin::spawn_with(
            listener,
            &exp.origins,
            std::future::pending(),
        )?);
    }
    Ok(origins)
}

/// How the parties of a run reach each other: the emulated links' relays, and each party's
/// view of the others rewritten to the relays' faces.
struct Wiring {
    links: Vec<Link>,
    /// Per node: the address it resolves each origin host to.
    hosts: Vec<BTreeMap<String, IpAddr>>,
    /// (node, neighbour): the neighbour's HTTP and ICP addresses as the node sees them.
    peer_addrs: HashMap<(usize, usize), (SocketAddr, SocketAddr)>,
    /// Per node: where its clients send their requests.
    client_targets: Vec<SocketAddr>,
    /// A link joins two nodes (its ICP relay is the only path between them).
    node_links: bool,
}

/// Sets up the links `p` selects between the parties of `topo`.
async fn wire(
    exp: &Experiment,
    p: &Planned<'_>,
    topo: &Topology,
    w: &Workload,
) -> anyhow::Result<Wiring> {
    let n = topo.nodes.len();
    // Addresses as each party sees the others, before links.
    let mut hosts: Vec<BTreeMap<String, IpAddr>> = (0..n)
        .map(|_| {
            w.origins
                .iter()
                .map(|(h, ip)| (h.clone(), IpAddr::V4(*ip)))
                .collect()
        })
        .collect();
    let mut peer_addrs: HashMap<(usize, usize), (SocketAddr, SocketAddr)> = HashMap::new();
    for (i, node) in topo.nodes.iter().enumerate() {
        for nb in &node.neighbours {
            let ip = node::node_ip(nb.node);
            peer_addrs.insert(
                (i, nb.node),
                (
                    SocketAddr::from((ip, node::HTTP_PORT)),
                    SocketAddr::from((ip, node::ICP_PORT)),
                ),
            );
        }
    }
    let mut client_targets: Vec<SocketAddr> = (0..n)
        .map(|i| SocketAddr::from((node::node_ip(i), node::HTTP_PORT)))
        .collect();

    // Links: relays in between, and the parties' views rewritten to the relays' faces.
    let mut links = Vec::new();
    // A link between two nodes: its ICP relay is the only path between them.
    let mut node_links = false;
    let mut faces = 0usize;
    let mut face = || {
        faces += 1;
        relay_ip(faces - 1)
    };
    let seed = exp.seed;
    for (li, l) in exp.link.iter().enumerate() {
        if p.config
            .links
            .as_ref()
            .is_some_and(|sel| !sel.contains(&l.name))
        {
            continue;
        }
        let (Some(a), Some(b)) = (party(&l.from, topo), party(&l.to, topo)) else {
            bail!("link {:?}: unknown party", l.name);
        };
        let lseed = seed ^ ((li as u64 + 1) << 32);
        match (a, b) {
            (Party::Clients, Party::Node(x)) | (Party::Node(x), Party::Clients) => {
                let cfg = oriented(l, a == Party::Clients);
                let listen = SocketAddr::from((face(), node::HTTP_PORT));
                links.push(tcp_link(listen, client_targets[x], None, cfg, lseed).await?);
                client_targets[x] = listen;
            }
            (Party::Origins, Party::Node(x)) | (Party::Node(x), Party::Origins) => {
                let cfg = oriented(l, a == Party::Node(x));
                for (k, (host, ip)) in w.origins.iter().enumerate() {
                    let f = face();
                    let listen = SocketAddr::from((f, exp.origin_port));
                    let target = SocketAddr::from((*ip, exp.origin_port));
                    links.push(tcp_link(listen, target, None, cfg, lseed + k as u64).await?);
                    hosts[x].insert(host.clone(), IpAddr::V4(f));
                }
            }
            (Party::Node(x), Party::Node(y)) => {
                node_links = true;
                let cfg = oriented(l, true);
                let (fx, fy) = (face(), face()); // fx: x's view of y; fy: y's view of x
                let x_icp = SocketAddr::from((node::node_ip(x), node::ICP_PORT));
                let y_icp = SocketAddr::from((node::node_ip(y), node::ICP_PORT));
                let a_side = tokio::net::UdpSocket::bind((fx, node::ICP_PORT)).await?;
                let b_side = tokio::net::UdpSocket::bind((fy, node::ICP_PORT)).await?;
                links.push(Link::udp_pair(
                    a_side,
                    b_side,
                    UdpPair {
                        a: x_icp,
                        b: y_icp,
                        link: cfg,
                        seed: lseed,
                    },
                    std::future::pending(),
                )?);
                let x_sees_y = SocketAddr::from((fx, node::HTTP_PORT));
                let y_sees_x = SocketAddr::from((fy, node::HTTP_PORT));
                let y_http = SocketAddr::from((node::node_ip(y), node::HTTP_PORT));
                let x_http = SocketAddr::from((node::node_ip(x), node::HTTP_PORT));
                links.push(tcp_link(x_sees_y, y_http, Some(fy.into()), cfg, lseed + 1).await?);
                let back = oriented(l, false);
                links.push(tcp_link(y_sees_x, x_http, Some(fx.into()), back, lseed + 2).await?);
                peer_addrs.insert((x, y), (x_sees_y, SocketAddr::from((fx, node::ICP_PORT))));
                peer_addrs.insert((y, x), (y_sees_x, SocketAddr::from((fy, node::ICP_PORT))));
            }
            _ => bail!(
                "link {:?} joins {:?} and {:?}: a link needs a node at one end",
                l.name,
                l.from,
                l.to
            ),
        }
    }
    Ok(Wiring {
        links,
        hosts,
        peer_addrs,
        client_targets,
        node_links,
    })
}

/// The `[cooperation]` lines every node of `p` gets: the configuration's tuning, and the
/// multicast mode that the links allow.
fn cooperation_lines(
    p: &Planned<'_>,
    digest_period: Duration,
    node_links: bool,
) -> anyhow::Result<Vec<String>> {
    let mut cooperation = vec![format!(
        "digest_rebuild_period = \"{}s\"",
        digest_period.as_secs().max(1)
    )];
    if let Some(t) = p.config.summary_threshold {
        cooperation.push(format!("summary_threshold = {t}"));
    }
    if let Some(b) = p.config.bits_per_entry {
        cooperation.push(format!("summary_bits_per_entry = {b}"));
    }
    if let Some(a) = p.config.alpha {
        cooperation.push(format!("directory_alpha = {a}"));
    }
    if let Some(v) = &p.config.variant {
        cooperation.push(format!("directory_variant = \"{v}\""));
    }
    if let Some(u) = &p.config.updates {
        cooperation.push(format!("directory_updates = \"{u}\""));
    }
    if p.config.protocol == "carp" {
        cooperation.push("carp_member = true".into());
    }
    if p.config.protocol == "multicast" {
        // The nodes join the group on loopback, where the lab runs them. Queries sent to the
        // group would bypass an emulated link between two nodes (and arrive from an address
        // the receiver knows only by the relay's), so such runs unicast to each member.
        let mode = match (p.config.multicast_mode.as_deref(), node_links) {
            (Some("ip"), true) => bail!(
                "config {:?}: multicast_mode = \"ip\" with links between nodes: the group would bypass them",
                p.config.name
            ),
            (_, true) => "logical",
            (Some(m), false) => m,
            (None, false) => "auto",
        };
        cooperation.push(format!("multicast_mode = \"{mode}\""));
    }
    Ok(cooperation)
}

/// Pre-warm: a request per node and origin host, repeated until every node answers them
/// all (ICP peers hear of each other; a Squid that has not yet seen its parents alive answers
/// 502 for a moment after it starts), for 20 s at most.
async fn prewarm(
    exp: &Experiment,
    w: &Workload,
    jobs: &[crate::replay::NodeJob],
) -> anyhow::Result<()> {
    let warm_deadline = Instant::now() + Duration::from_secs(20);
    for attempt in 0u32.. {
        let warm: Vec<_> = jobs
            .iter()
            .map(|j| crate::replay::NodeJob {
                target: j.target,
                local: j.local.clone(),
                parents: j.parents.clone(),
                streams: vec![w
                    .origins
                    .keys()
                    .map(|host| Request {
                        time_ms: 0,
                        client: 0,
                        size: 16,
                        url: format!(
                            "http://{host}:{}/lab-prewarm/{}/{attempt}?size=16",
                            exp.origin_port, j.local
                        ),
                    })
                    .collect()],
            })
            .collect();
        let outcomes = crate::replay::replay(&warm, exp, None).await;
        let failed: u64 = outcomes.iter().map(|o| o.errors).sum();
        if failed == 0 {
            break;
        }
        if Instant::now() > warm_deadline {
            bail!("the nodes still fail requests after 20 s ({failed} of the last warm-up round)");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// The emulated clients' work per node that takes clients: client c goes to the
/// (c mod k)-th of them, through its target (the node, or the relay of a link in front of it).
fn client_jobs(
    topo: &Topology,
    client_nodes: &[usize],
    w: &Workload,
    client_targets: &[SocketAddr],
) -> Vec<crate::replay::NodeJob> {
    let n = topo.nodes.len();
    let mut streams: Vec<BTreeMap<u32, Vec<Request>>> = vec![BTreeMap::new(); n];
    for r in &w.requests {
        let node = client_nodes[r.client as usize % client_nodes.len()];
        streams[node].entry(r.client).or_default().push(r.clone());
    }
    client_nodes
        .iter()
        .map(|&i| crate::replay::NodeJob {
            target: client_targets[i],
            local: topo.nodes[i].name.clone(),
            parents: topo.parents_of(i),
            streams: std::mem::take(&mut streams[i]).into_values().collect(),
        })
        .collect()
}

/// Serial replay: every request in trace order, with the job (node) it belongs to; nothing
/// when the clients run at once.
fn serial_order(exp: &Experiment, client_nodes: &[usize], w: &Workload) -> Vec<(usize, Request)> {
    if !exp.clients.serial {
        return Vec::new();
    }
    let job_of: BTreeMap<usize, usize> = client_nodes
        .iter()
        .enumerate()
        .map(|(j, &i)| (i, j))
        .collect();
    w.requests
        .iter()
        .map(|r| {
            let node = client_nodes[r.client as usize % client_nodes.len()];
            (job_of[&node], r.clone())
        })
        .collect()
}

/// How long a listener's address may stay taken by the run before.
const REBIND_LIMIT: Duration = Duration::from_secs(5);

/// Binds `addr`, waiting up to `limit` while it is in use: the previous run's
/// origins and relays stop when their handles drop, but their tasks let go of the listening
/// sockets only when next polled, which can be after the next run asks for the same address.
async fn bind_listener(
    addr: SocketAddr,
    limit: Duration,
) -> std::io::Result<tokio::net::TcpListener> {
    let deadline = Instant::now() + limit;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            r => return r,
        }
    }
}

async fn tcp_link(
    listen: SocketAddr,
    target: SocketAddr,
    bind_out: Option<IpAddr>,
    link: LinkConfig,
    seed: u64,
) -> anyhow::Result<Link> {
    let listener = bind_listener(listen, REBIND_LIMIT)
        .await
        .with_context(|| format!("cannot bind a link relay on {listen}"))?;
    Ok(Link::tcp(
        listener,
        TcpRelay {
            target,
            bind_out,
            link,
            seed,
        },
        std::future::pending(),
    )?)
}

/// Waits until every meshcache node holds a valid summary (or digest) of each of its peers,
/// so that the measured pass does not start while some are still being fetched (a node that
/// starts before its peers retries its first fetches a little later). Squid nodes are not
/// asked. After `limit` it warns, naming the node and the peers, and lets the run go on (a
/// peer the node does not exchange summaries with never becomes valid).
fn summaries_installed(running: &Running, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    for n in running
        .nodes
        .iter()
        .filter(|n| n.plan.product == Product::Meshcache && !n.plan.peers.is_empty())
    {
        loop {
            let body = measure::http_get(n.plan.admin(), "/stats", Duration::from_secs(5))
                .with_context(|| format!("node {}: /stats", n.plan.name))?;
            let json: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("node {}: /stats is not JSON", n.plan.name))?;
            let peers = json["summary"]["peers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let missing: Vec<String> = peers
                .iter()
                .filter(|p| p["valid"] != serde_json::Value::Bool(true))
                .map(|p| p["name"].as_str().unwrap_or("?").to_owned())
                .collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    "node {}: no summary of {} after {} s; measuring anyway",
                    n.plan.name,
                    missing.join(", "),
                    limit.as_secs()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Waits until every Squid node counts all its peers up (for `limit` at most, then warns and
/// measures anyway). Squid probes a peer's HTTP port when it configures it; peers started
/// together often are not listening yet, and a peer whose probe failed is "dead": Squid neither
/// asks it nor expects its replies until a later probe, made at most once a second when the
/// peer is looked at, succeeds. Without this wait a short run can end before that happens and
/// measure siblings that never ask each other. Reading the cache manager's `server_list`
/// looks at every peer, so polling it also makes Squid probe again.
fn squid_peers_up(running: &Running, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    for n in running
        .nodes
        .iter()
        .filter(|n| n.plan.product == Product::Squid && n.plan.used_peers().next().is_some())
    {
        let url = format!(
            "http://{}:{}/squid-internal-mgr/server_list",
            n.plan.name,
            node::HTTP_PORT
        );
        loop {
            let body = measure::http_get(n.plan.http(), &url, Duration::from_secs(5))
                .with_context(|| format!("node {}: cache manager server_list", n.plan.name))?;
            let down = squid_peers_down(&body);
            if down.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    "node {}: Squid still counts {} down after {} s; measuring anyway",
                    n.plan.name,
                    down.join(", "),
                    limit.as_secs()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// The peers Squid's `server_list` page reports down, by name.
fn squid_peers_down(page: &str) -> Vec<String> {
    let mut down = Vec::new();
    let mut name = "?";
    for line in page.lines() {
        // A peer's entry opens with "<type>: <name>" ("Sibling    : n1").
        if let Some((kind, rest)) = line.split_once(':') {
            let (kind, rest) = (kind.trim(), rest.trim());
            if matches!(kind, "Parent" | "Sibling") || kind.starts_with("Multicast") {
                name = rest;
            } else if kind == "Status" && rest != "Up" {
                down.push(name.to_string());
            }
        }
    }
    down
}

/// Readings at one moment.
struct Snapshot {
    cpu: Vec<Cpu>,
    switches: Vec<measure::Switches>,
    runtimes: Vec<std::collections::BTreeMap<u32, u64>>,
    counters: Vec<NodeCounters>,
    http_requests: Vec<u64>,
    net: NetCounters,
}

fn snapshot(running: &Running, ticks: f64) -> anyhow::Result<Snapshot> {
    let mut s = Snapshot {
        cpu: Vec::new(),
        switches: Vec::new(),
        runtimes: Vec::new(),
        counters: Vec::new(),
        http_requests: Vec::new(),
        net: measure::net_counters().unwrap_or_default(),
    };
    for n in &running.nodes {
        s.cpu.push(
            measure::process_cpu(n.pid(), ticks)
                .with_context(|| format!("node {} is gone", n.plan.name))?,
        );
        s.switches
            .push(measure::process_switches(n.pid()).unwrap_or_default());
        s.runtimes
            .push(measure::thread_runtimes(n.pid()).unwrap_or_default());
        let timeout = Duration::from_secs(5);
        let (counters, requests) = match n.plan.product {
            Product::Meshcache => {
                let body = measure::http_get(n.plan.admin(), "/stats", timeout)
                    .with_context(|| format!("node {}: /stats", n.plan.name))?;
                let json: serde_json::Value = serde_json::from_str(&body)
                    .with_context(|| format!("node {}: /stats is not JSON", n.plan.name))?;
                (
                    measure::parse_meshcache_stats(&json),
                    json["requests"].as_u64().unwrap_or(0),
                )
            }
            Product::Squid => {
                let url = format!(
                    "http://{}:{}/squid-internal-mgr/counters",
                    n.plan.name,
                    node::HTTP_PORT
                );
                let body = measure::http_get(n.plan.http(), &url, timeout)
                    .with_context(|| format!("node {}: cache manager counters", n.plan.name))?;
                let requests = body
                    .lines()
                    .find_map(|l| l.strip_prefix("client_http.requests = "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                (measure::parse_squid_counters(&body), requests)
            }
        };
        s.counters.push(counters);
        s.http_requests.push(requests);
    }
    Ok(s)
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    p: &Planned<'_>,
    topo: &Topology,
    running: &Running,
    jobs: &[crate::replay::NodeJob],
    reports: &[crate::replay::JobOutcome],
    (before, after): (&Snapshot, &Snapshot),
    tcp: Option<&HashMap<IpAddr, crate::tcpcount::Segments>>,
    w: &Workload,
    wall_s: f64,
) -> ConfigResult {
    let merged = crate::replay::merge(reports);
    let net = after.net.since(before.net);
    let latency = latency_summary(&merged.latency);
    let requests = merged.requests;
    let per = |x: u64| {
        if requests == 0 {
            0.0
        } else {
            x as f64 / requests as f64
        }
    };
    let mut nodes = Vec::new();
    let (mut user, mut sys, mut udp, mut sent, mut peer_http) = (0.0, 0.0, 0u64, 0u64, 0u64);
    let mut bytes = 0u64;
    let mut tcp_nodes = 0u64;
    let mut sf = crate::results::SummaryFigures::default();
    let (mut fp_weighted, mut mem_per_object, mut summary_nodes) = (0.0, 0.0, 0u32);
    let (mut client_s, mut cpu_with_breakdown) = (0.0, 0.0);
    let mut switches = 0u64;
    let mut cpu_exact = Some(0.0);
    for (i, n) in running.nodes.iter().enumerate() {
        let cpu = after.cpu[i].since(before.cpu[i]);
        let sw = after.switches[i].since(before.switches[i]);
        switches += sw.voluntary + sw.involuntary;
        let exact = measure::runtime_between(&before.runtimes[i], &after.runtimes[i]);
        cpu_exact = cpu_exact.zip(exact).map(|(a, b)| a + b);
        let c = after.counters[i].since(&before.counters[i]);
        let job = jobs.iter().position(|j| j.local == n.plan.name);
        let own = job
            .map(|j| reports[j].requests + reports[j].errors)
            .unwrap_or(0);
        let received = after.http_requests[i].saturating_sub(before.http_requests[i]);
        // The cache manager page fetched for the second snapshot counts too (Squid).
        let mgr = u64::from(n.plan.product == Product::Squid);
        let from_peers = received.saturating_sub(own + mgr);
        user += cpu.user_s;
        sys += cpu.sys_s;
        udp += c.udp_sent + c.udp_received;
        sent += c.udp_sent;
        bytes += c.udp_bytes_sent + c.summary_bytes_served;
        sf.lookups += c.summary_lookups;
        sf.summary_hits += c.summary_hits;
        sf.false_hits += c.false_hits;
        fp_weighted += c.expected_false_hits;
        if c.summary_entries > 0 {
            mem_per_object += c.summary_memory as f64 / c.summary_entries as f64;
            summary_nodes += 1;
        }
        peer_http += from_peers;
        let node_tcp = tcp.map(|t| t.get(&IpAddr::V4(n.plan.ip)).copied().unwrap_or_default());
        tcp_nodes += node_tcp.map_or(0, |t| t.sent + t.received);
        let total = exact.unwrap_or(cpu.user_s + cpu.sys_s);
        let breakdown = n.plan.product == Product::Meshcache;
        if breakdown && topo.nodes[i].clients {
            // Efficiency is the requestor's perspective (the hierarchy paper's HEG): the nodes
            // that serve clients, their client time over their CPU time. The categories are time inside polls; under contention they can exceed the
            // CPU time the kernel charged, so the whole is whichever is larger.
            client_s += c.client_s;
            cpu_with_breakdown += total.max(c.client_s + c.peer_s + c.search_s);
        }
        let (lh, sh, ph) = job
            .map(|j| {
                (
                    reports[j].local_hits,
                    reports[j].sibling_hits,
                    reports[j].parent_hits,
                )
            })
            .unwrap_or_default();
        nodes.push(NodeResult {
            name: n.plan.name.clone(),
            role: topo.nodes[i].role(topo).to_string(),
            client_requests: own,
            local_hits: lh,
            sibling_hits: sh,
            parent_hits: ph,
            client_bytes: job.map_or(0, |j| reports[j].bytes),
            hit_bytes: job.map_or(0, |j| reports[j].hit_bytes),
            latency_ms: job
                .filter(|&j| !reports[j].latency.is_empty())
                .map(|j| latency_summary(&reports[j].latency).summary),
            cpu_user_s: cpu.user_s,
            cpu_sys_s: cpu.sys_s,
            cpu_exact_s: exact,
            switches_voluntary: sw.voluntary,
            switches_involuntary: sw.involuntary,
            udp_sent: c.udp_sent,
            udp_received: c.udp_received,
            tcp_sent: node_tcp.map(|t| t.sent),
            tcp_received: node_tcp.map(|t| t.received),
            client_s: c.client_s,
            peer_s: c.peer_s,
            search_s: c.search_s,
            overhead_s: if breakdown {
                (total - c.client_s - c.peer_s - c.search_s).max(0.0)
            } else {
                0.0
            },
        });
    }
    ConfigResult {
        name: p.config.name.clone(),
        group: group_name(p),
        baseline: p.config.baseline,
        product: p.product.name().into(),
        protocol: p.config.protocol.clone(),
        topology: topo.name.clone(),
        repetition: p.repetition,
        seed: 0,
        requests,
        errors: merged.errors,
        wall_s,
        req_per_s: if wall_s > 0.0 {
            requests as f64 / wall_s
        } else {
            0.0
        },
        hit_ratio: per(merged.local_hits + merged.sibling_hits + merged.parent_hits),
        local_hit_ratio: per(merged.local_hits),
        sibling_hit_ratio: per(merged.sibling_hits),
        parent_hit_ratio: per(merged.parent_hits),
        byte_hit_ratio: if merged.bytes == 0 {
            0.0
        } else {
            merged.hit_bytes as f64 / merged.bytes as f64
        },
        inherent_hit_ratio: w.inherent_hit_ratio,
        origin_requests: 0,
        latency_ms: latency.summary,
        latency_cdf: latency.cdf,
        latency_bins: latency.bins,
        cpu_user_s: user,
        cpu_sys_s: sys,
        cpu_exact_s: cpu_exact,
        context_switches_per_request: per(switches),
        udp_messages: udp,
        tcp_messages: if tcp.is_some() {
            tcp_nodes
        } else {
            net.tcp_in + net.tcp_out
        },
        tcp_segments_netns: net.tcp_in + net.tcp_out,
        tcp_per_node: tcp.is_some(),
        udp_datagrams_netns: net.udp_in + net.udp_out,
        intercache_messages_per_request: per(sent + 2 * peer_http),
        protocol_messages_per_request: per(
            sent + 2 * peer_http.saturating_sub(merged.sibling_hits + merged.parent_hits)
        ),
        intercache_bytes_per_request: per(bytes),
        // Squid reports no per-peer digest figures.
        summary: (matches!(p.config.protocol.as_str(), "summary" | "digest")
            && p.product == Product::Meshcache)
            .then(|| {
                let true_hits = sf.summary_hits.saturating_sub(sf.false_hits);
                let negatives = sf.lookups.saturating_sub(true_hits);
                crate::results::SummaryFigures {
                    observed_fp_rate: if negatives > 0 {
                        sf.false_hits as f64 / negatives as f64
                    } else {
                        0.0
                    },
                    formula_fp_rate: if sf.lookups > 0 {
                        fp_weighted / sf.lookups as f64
                    } else {
                        0.0
                    },
                    memory_per_object: if summary_nodes > 0 {
                        mem_per_object / f64::from(summary_nodes)
                    } else {
                        0.0
                    },
                    ..sf
                }
            }),
        efficiency: if cpu_with_breakdown > 0.0 {
            client_s / cpu_with_breakdown
        } else {
            0.0
        },
        nodes,
    }
}

/// A histogram's latency figures, as [`ConfigResult`] holds them.
#[derive(Clone, Debug, Default)]
pub struct LatencyFigures {
    /// Mean, percentiles, truncated and tail means.
    pub summary: LatencySummary,
    /// (ms, cumulative share) points.
    pub cdf: Vec<(f64, f64)>,
    /// (bin upper edge in s, count) in 0.25 s bins; the last bin (10.25) holds everything
    /// from 10 s up.
    pub bins: Vec<(f64, u64)>,
}

/// The latency figures of a histogram of microseconds.
pub fn latency_summary(h: &hdrhistogram::Histogram<u64>) -> LatencyFigures {
    let ms = |us: u64| us as f64 / 1000.0;
    let (mut short_sum, mut short_n, mut long_sum, mut long_n) = (0.0, 0u64, 0.0, 0u64);
    let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
    for v in h.iter_recorded() {
        let value = h.highest_equivalent(v.value_iterated_to());
        let count = v.count_at_value();
        if value < 5_000_000 {
            short_sum += ms(value) * count as f64;
            short_n += count;
        } else {
            long_sum += ms(value) * count as f64;
            long_n += count;
        }
        // 0.25 s bins, the last one open (≥ 10 s).
        let bin = (value / 250_000).min(40);
        *bins.entry(bin).or_default() += count;
    }
    let total = h.len();
    let summary = LatencySummary {
        mean: h.mean() / 1000.0,
        median: ms(h.value_at_quantile(0.5)),
        p95: ms(h.value_at_quantile(0.95)),
        p99: ms(h.value_at_quantile(0.99)),
        truncated_mean: if short_n > 0 {
            short_sum / short_n as f64
        } else {
            0.0
        },
        truncated_share: if total > 0 {
            short_n as f64 / total as f64
        } else {
            0.0
        },
        tail_mean: if long_n > 0 {
            long_sum / long_n as f64
        } else {
            0.0
        },
    };
    let mut cdf = Vec::new();
    if total > 0 {
        let mut qs: Vec<f64> = (0..=100).map(|q| q as f64 / 100.0).collect();
        qs.extend([0.995, 0.999]);
        qs.sort_by(f64::total_cmp);
        for q in qs {
            cdf.push((ms(h.value_at_quantile(q)), q));
        }
    }
    let bins = bins
        .into_iter()
        .map(|(b, c)| ((b + 1) as f64 * 0.25, c))
        .collect();
    LatencyFigures { summary, cdf, bins }
}

fn machine(own_netns: bool) -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel,
        own_netns,
        steal_pct: 0.0,
    }
}

fn now_rfc3339() -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Squid 5.7's `server_list` page, its sibling's first probe having failed.
    const SERVER_LIST_DOWN: &str = "\nSibling    : n1\nHost       : 127.0.0.11/3128/3130\n\
        Flags      : no-digest connection-auth=auto tls-disable\nAddress[0] : 127.0.0.11\n\
        Status     : Down\nFETCHES    : 0\nOPEN CONNS : 0\nAVG RTT    : 0 msec\n\
        LAST QUERY : 1795535219 seconds ago\nLAST REPLY : none received\n\
        PINGS SENT :        0\nPINGS ACKED:        0   0%\nIGNORED    :        0   0%\n\
        Histogram of PINGS ACKED:\n\
        Last failed connect() at: 24/Nov/2026:15:46:57 +0000\nkeep-alive ratio: 0%\n";

    /// The race a run's next configuration met: an origin dropped a moment ago still holds its
    /// address until its task is next polled.
    #[tokio::test(flavor = "current_thread")]
    async fn the_next_run_binds_an_address_the_last_run_is_letting_go_of() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let origin = crate::origin::Origin::spawn_with(
            listener,
            &crate::origin::OriginConfig::default(),
            std::future::pending(),
        )
        .expect("origin");
        tokio::task::yield_now().await;
        drop(origin);
        let e = tokio::net::TcpListener::bind(addr)
            .await
            .expect_err("still held");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        bind_listener(addr, Duration::from_secs(5))
            .await
            .expect("bound once the origin let go");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_address_that_stays_taken_is_an_error_after_the_limit() {
        let held = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = held.local_addr().expect("addr");
        let e = bind_listener(addr, Duration::from_millis(100))
            .await
            .expect_err("taken");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    }

    #[test]
    fn concurrent_parts_merge_into_rounds() {
        let part = |name: &str, started: &str, cpu: &[f64]| Results {
            started: started.into(),
            duration_s: cpu.len() as f64,
            concurrent: true,
            configs: cpu
                .iter()
                .enumerate()
                .map(|(r, &c)| ConfigResult {
                    name: name.into(),
                    repetition: r as u32,
                    cpu_exact_s: Some(c),
                    ..ConfigResult::default()
                })
                .collect(),
            ..Results::default()
        };
        let order = ["none".to_string(), "summary".to_string()];
        let m = merge_concurrent(
            vec![
                part("summary", "2026-01-01T00:00:02Z", &[2.0, 2.1, 2.2]),
                part("none", "2026-01-01T00:00:01Z", &[1.0, 1.1]),
            ],
            &order,
        )
        .expect("merged");
        let runs: Vec<(u32, &str)> = m
            .configs
            .iter()
            .map(|c| (c.repetition, c.name.as_str()))
            .collect();
        assert_eq!(
            runs,
            [
                (0, "none"),
                (0, "summary"),
                (1, "none"),
                (1, "summary"),
                (2, "summary")
            ]
        );
        assert_eq!(m.started, "2026-01-01T00:00:01Z");
        assert_eq!(m.duration_s, 3.0);
        assert!(m.concurrent);
        assert!(merge_concurrent(Vec::new(), &order).is_none());
    }

    #[test]
    fn squid_peers_down_are_named() {
        assert_eq!(squid_peers_down(SERVER_LIST_DOWN), ["n1"]);
        let two = format!(
            "{}{}",
            SERVER_LIST_DOWN.replace("Status     : Down", "Status     : Up"),
            SERVER_LIST_DOWN.replace("Sibling    : n1", "Parent     : p0")
        );
        assert_eq!(squid_peers_down(&two), ["p0"]);
        assert!(squid_peers_down(&SERVER_LIST_DOWN.replace(": Down", ": Up")).is_empty());
        assert!(squid_peers_down("There are no neighbors installed.\n").is_empty());
    }

    #[test]
    fn urls_split_into_host_and_rest() {
        assert_eq!(
            split_url("http://www.g0.br/o/1?size=5"),
            Some(("www.g0.br", "/o/1?size=5"))
        );
        assert_eq!(split_url("http://a.com:81/x"), Some(("a.com", "/x")));
        assert_eq!(split_url("http://a.com"), Some(("a.com", "/")));
        assert_eq!(split_url("https://a.com/"), None);
        assert_eq!(split_url("http:///x"), None);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("meshcache 25% / no ICP #2"), "meshcache-25-no-icp-2");
        assert_eq!(slug("squid / 2.2.dom"), "squid-2.2.dom");
    }

    #[test]
    fn latency_figures() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for _ in 0..90 {
            h.record(1_000_000).unwrap(); // 1 s
        }
        for _ in 0..10 {
            h.record(20_000_000).unwrap(); // 20 s
        }
        let LatencyFigures {
            summary: s,
            cdf,
            bins,
        } = latency_summary(&h);
        assert!((s.truncated_share - 0.9).abs() < 1e-9);
        assert!((s.truncated_mean - 1000.0).abs() < 2.0, "{s:?}");
        assert!((s.tail_mean - 20_000.0).abs() < 20.0, "{s:?}");
        assert!((s.median - 1000.0).abs() < 2.0);
        assert_eq!(cdf.last().map(|p| p.1), Some(1.0));
        assert_eq!(bins, vec![(1.25, 90), (10.25, 10)]);
    }
}
