//! Grouping configurations and taking medians over their repetitions.

use std::collections::BTreeMap;

use super::format::overhead_pct;
use crate::results::{ConfigResult, LatencySummary, NodeResult, Results};

/// One configuration, its repetitions folded together.
#[derive(Clone, Debug)]
pub struct Row {
    /// The figures: medians over the repetitions (latency bins and node CPU
    /// pooled); `latency_cdf` is the repetition whose mean latency is the median.
    pub config: ConfigResult,
    /// How many repetitions were folded.
    pub repetitions: usize,
    /// The nodes' CPU per repetition, in seconds (scheduler-exact where known, else user +
    /// system ticks), in repetition order.
    pub cpu_rounds: Vec<(u32, f64)>,
}

/// A configuration's CPU against the baseline's, paired within each round (repetition) of
/// an interleaved run, so that what drifts between rounds cancels out.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedCpu {
    /// Per round: the overhead over the baseline's run in the same round, in %.
    pub rounds: Vec<f64>,
    /// Their median.
    pub median: f64,
    /// A distribution-free interval for the median (order statistics `k` and `n + 1 − k`
    /// of the rounds), or `None` with fewer than 5 rounds.
    pub interval: Option<(f64, f64)>,
    /// The interval's confidence: 1 − 2·P(Binomial(n, ½) < k).
    pub confidence: f64,
}

impl PairedCpu {
    /// Pairs `rounds` with the baseline's `base` by repetition; `None` with no round in
    /// common.
    pub fn new(base: &[(u32, f64)], rounds: &[(u32, f64)]) -> Option<PairedCpu> {
        let overheads: Vec<f64> = rounds
            .iter()
            .filter_map(|&(rep, cpu)| {
                let &(_, b) = base.iter().find(|(r, _)| *r == rep)?;
                overhead_pct(b, cpu)
            })
            .collect();
        if overheads.is_empty() {
            return None;
        }
        let mut sorted = overheads.clone();
        sorted.sort_by(f64::total_cmp);
        let (interval, confidence) = median_interval(&sorted);
        Some(PairedCpu {
            median: median(&overheads),
            rounds: overheads,
            interval,
            confidence,
        })
    }
}

/// The narrowest distribution-free interval for the median of `sorted` values that holds
/// with at least 90 % confidence: `[x(k), x(n+1−k)]` for the largest such `k` (the sign
/// test's interval). `None` when even `[min, max]` falls short (fewer than 5 values).
fn median_interval(sorted: &[f64]) -> (Option<(f64, f64)>, f64) {
    let n = sorted.len();
    // P(Binomial(n, ½) ≤ j) for j = 0, 1, ….
    let mut below = Vec::with_capacity(n + 1);
    let (mut term, mut sum) = (0.5f64.powi(n as i32), 0.0);
    for j in 0..=n {
        sum += term;
        below.push(sum);
        term *= (n - j) as f64 / (j + 1) as f64;
    }
    let coverage = |k: usize| 1.0 - 2.0 * below[k - 1];
    match (1..=n / 2).rev().find(|&k| coverage(k) >= 0.9) {
        Some(k) => (Some((sorted[k - 1], sorted[n - k])), coverage(k)),
        None => (None, if n >= 2 { coverage(1) } else { 0.0 }),
    }
}

/// The configurations compared with one another (one Table 2).
#[derive(Clone, Debug)]
pub struct Group {
    /// `ConfigResult::group`.
    pub name: String,
    /// One row per configuration name, in the order first run.
    pub rows: Vec<Row>,
    /// Index in `rows` of the baseline, if one is marked.
    pub baseline: Option<usize>,
}

/// A configuration's name and its repetitions.
type NamedReps<'a> = (String, Vec<&'a ConfigResult>);

/// Groups the configurations (in the order first run) and folds each
/// configuration's repetitions into one [`Row`].
pub fn aggregate(results: &Results) -> Vec<Group> {
    // (group, [(configuration name, its repetitions)])
    let mut groups: Vec<(String, Vec<NamedReps>)> = Vec::new();
    for config in &results.configs {
        let gi = match groups.iter().position(|(g, _)| *g == config.group) {
            Some(i) => i,
            None => {
                groups.push((config.group.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        let names = &mut groups[gi].1;
        match names.iter_mut().find(|(n, _)| *n == config.name) {
            Some((_, reps)) => reps.push(config),
            None => names.push((config.name.clone(), vec![config])),
        }
    }
    groups
        .into_iter()
        .map(|(name, configs)| {
            let rows: Vec<Row> = configs
                .iter()
                .map(|(_, reps)| Row {
                    config: fold(reps),
                    repetitions: reps.len(),
                    cpu_rounds: reps
                        .iter()
                        .map(|c| {
                            let cpu = c.cpu_exact_s.unwrap_or(c.cpu_user_s + c.cpu_sys_s);
                            (c.repetition, cpu)
                        })
                        .collect(),
                })
                .collect();
            let baseline = rows.iter().position(|r| r.config.baseline);
            Group {
                name,
                rows,
                baseline,
            }
        })
        .collect()
}

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn fold(reps: &[&ConfigResult]) -> ConfigResult {
    let first = reps[0];
    if reps.len() == 1 {
        return first.clone();
    }
    let med =
        |f: &dyn Fn(&ConfigResult) -> f64| median(&reps.iter().map(|c| f(c)).collect::<Vec<_>>());
    let med_u = |f: &dyn Fn(&ConfigResult) -> u64| med(&|c| f(c) as f64).round() as u64;

    // The repetition whose mean latency is closest to the median stands for the CDF.
    let mean_median = med(&|c| c.latency_ms.mean);
    let representative = reps
        .iter()
        .min_by(|a, b| {
            (a.latency_ms.mean - mean_median)
                .abs()
                .total_cmp(&(b.latency_ms.mean - mean_median).abs())
        })
        .copied()
        .unwrap_or(first);

    let mut bins: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for c in reps {
        for &(edge, count) in &c.latency_bins {
            let e = bins.entry((edge * 1e6).round() as u64).or_insert((edge, 0));
            e.1 += count;
        }
    }
    let mut nodes: Vec<NodeResult> = Vec::new();
    for c in reps {
        for n in &c.nodes {
            match nodes.iter_mut().find(|m| m.name == n.name) {
                Some(m) => {
                    m.client_requests += n.client_requests;
                    m.local_hits += n.local_hits;
                    m.sibling_hits += n.sibling_hits;
                    m.parent_hits += n.parent_hits;
                    m.cpu_user_s += n.cpu_user_s;
                    m.cpu_sys_s += n.cpu_sys_s;
                    m.cpu_exact_s = m.cpu_exact_s.zip(n.cpu_exact_s).map(|(a, b)| a + b);
                    m.switches_voluntary += n.switches_voluntary;
                    m.switches_involuntary += n.switches_involuntary;
                    m.udp_sent += n.udp_sent;
                    m.udp_received += n.udp_received;
                    m.client_bytes += n.client_bytes;
                    m.hit_bytes += n.hit_bytes;
                    m.tcp_sent = m.tcp_sent.zip(n.tcp_sent).map(|(a, b)| a + b);
                    m.tcp_received = m.tcp_received.zip(n.tcp_received).map(|(a, b)| a + b);
                    m.client_s += n.client_s;
                    m.peer_s += n.peer_s;
                    m.search_s += n.search_s;
                    m.overhead_s += n.overhead_s;
                }
                None => nodes.push(n.clone()),
            }
        }
    }
    // A node's latency over the repetitions: each figure's median.
    for m in &mut nodes {
        let runs: Vec<&LatencySummary> = reps
            .iter()
            .flat_map(|c| &c.nodes)
            .filter(|n| n.name == m.name)
            .filter_map(|n| n.latency_ms.as_ref())
            .collect();
        if runs.is_empty() {
            continue;
        }
        let med =
            |f: fn(&LatencySummary) -> f64| median(&runs.iter().map(|l| f(l)).collect::<Vec<_>>());
        m.latency_ms = Some(LatencySummary {
            mean: med(|l| l.mean),
            median: med(|l| l.median),
            p95: med(|l| l.p95),
            p99: med(|l| l.p99),
            truncated_mean: med(|l| l.truncated_mean),
            truncated_share: med(|l| l.truncated_share),
            tail_mean: med(|l| l.tail_mean),
        });
    }

    ConfigResult {
        name: first.name.clone(),
        group: first.group.clone(),
        baseline: first.baseline,
        product: first.product.clone(),
        protocol: first.protocol.clone(),
        topology: first.topology.clone(),
        repetition: first.repetition,
        seed: first.seed,
        requests: med_u(&|c| c.requests),
        errors: med_u(&|c| c.errors),
        wall_s: med(&|c| c.wall_s),
        req_per_s: med(&|c| c.req_per_s),
        hit_ratio: med(&|c| c.hit_ratio),
        local_hit_ratio: med(&|c| c.local_hit_ratio),
        sibling_hit_ratio: med(&|c| c.sibling_hit_ratio),
        parent_hit_ratio: med(&|c| c.parent_hit_ratio),
        byte_hit_ratio: med(&|c| c.byte_hit_ratio),
        inherent_hit_ratio: med(&|c| c.inherent_hit_ratio),
        latency_ms: LatencySummary {
            mean: mean_median,
            median: med(&|c| c.latency_ms.median),
            p95: med(&|c| c.latency_ms.p95),
            p99: med(&|c| c.latency_ms.p99),
            truncated_mean: med(&|c| c.latency_ms.truncated_mean),
            truncated_share: med(&|c| c.latency_ms.truncated_share),
            tail_mean: med(&|c| c.latency_ms.tail_mean),
        },
        latency_cdf: representative.latency_cdf.clone(),
        latency_bins: bins.into_values().collect(),
        cpu_user_s: med(&|c| c.cpu_user_s),
        cpu_sys_s: med(&|c| c.cpu_sys_s),
        cpu_exact_s: reps
            .iter()
            .map(|c| c.cpu_exact_s)
            .collect::<Option<Vec<f64>>>()
            .map(|v| median(&v)),
        context_switches_per_request: med(&|c| c.context_switches_per_request),
        udp_messages: med_u(&|c| c.udp_messages),
        udp_datagrams_netns: med_u(&|c| c.udp_datagrams_netns),
        origin_requests: med_u(&|c| c.origin_requests),
        tcp_messages: med_u(&|c| c.tcp_messages),
        tcp_segments_netns: med_u(&|c| c.tcp_segments_netns),
        tcp_per_node: reps.iter().all(|c| c.tcp_per_node),
        intercache_messages_per_request: med(&|c| c.intercache_messages_per_request),
        protocol_messages_per_request: med(&|c| c.protocol_messages_per_request),
        intercache_bytes_per_request: med(&|c| c.intercache_bytes_per_request),
        summary: representative.summary.clone(),
        efficiency: med(&|c| c.efficiency),
        nodes,
    }
}

/// Whether a node split its CPU time into client / peer / search / overhead
/// (meshcache's instrumentation; Squid nodes do not).
pub fn reports_breakdown(node: &NodeResult) -> bool {
    node.client_s + node.peer_s + node.search_s > 0.0
}

/// The configuration's efficiency (share of CPU time spent on clients, 0–1),
/// or `None` when it is unknown: Squid, or no node reported a CPU breakdown.
pub fn efficiency(config: &ConfigResult) -> Option<f64> {
    let known = config.product != "squid"
        && config.efficiency.is_finite()
        && (config.efficiency > 0.0 || config.nodes.iter().any(reports_breakdown));
    known.then_some(config.efficiency)
}
