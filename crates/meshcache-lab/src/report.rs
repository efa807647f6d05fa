//! The lab's reports: what a `lab run` leaves in its output directory.
//!
//! [`write_all`] turns one [`Results`] into:
//!
//! | file | what |
//! | --- | --- |
//! | `results.json` | the whole [`Results`], pretty-printed (the source of truth; everything else is derived) |
//! | `results.md` | a header (experiment, revision, seed, machine…) and, per group of configurations, the tables below |
//! | `heg.svg`, `heg.png` | the Hit Ratio Efficiency Graph: one labelled point per configuration, efficiency against hit ratio |
//! | `latency.svg`, `latency.png` | the client latency CDF of every configuration, log x axis; one `latency-<group>.*` per group when there are several |
//!
//! The Markdown tables follow the papers the lab reproduces:
//!
//! * **Overhead** (the Summary Cache paper's Table 2): one row per
//!   configuration with hit ratio, client latency, CPU, UDP/TCP messages,
//!   inter-cache messages per request and throughput, and under each
//!   non-baseline row an *overhead* row: the % increase of each figure over
//!   the group's baseline (the configuration with `baseline = true`).
//! * **Hierarchy** (the hierarchy evaluation framework's Table 3): hits split
//!   into local / sibling / parent, byte hit ratio and efficiency.
//! * **CPU per node** (its Tables 4–5): each node's CPU time split into
//!   client / peer / search / overhead. Squid does not report this split, so
//!   its nodes read "n/a" and its configurations are left off the HEG. Beside
//!   it, the node's context switches, voluntary and involuntary.
//! * **Per node**: each node's clients' hit ratios (local / sibling / parent),
//!   byte hit ratio and latency, and its UDP datagrams and TCP segments, sent
//!   and received (the Summary Cache paper's per-proxy netstat figures).
//! * **Latency** (the trans-Pacific cache study): median, the mean of the
//!   requests under 5 s with the share it covers, the mean of the tail, p95
//!   and p99; and for groups whose latencies reach a quarter second, the
//!   histogram in 0.25 s bins with the median bin.
//!
//! When a configuration ran several times (repetitions), every figure is the
//! median over its repetitions ([`aggregate`]); latency bins and the nodes'
//! CPU seconds are pooled (summed) instead, so that shares stay shares.
//!
//! Everything that produces text is a pure function of the data
//! ([`markdown`], [`overhead_table`], [`heg_svg`]…), so tests compare
//! strings; only [`write_all`] touches the file system.
//!
//! ## Graphs and fonts
//!
//! The graphs are laid out once, in pixels, by this module ([`Figure`]), and
//! then written twice: as SVG text by hand (no font needed: the viewer draws
//! the text) and as PNG through `plotters`' bitmap backend, which rasterises
//! text with a TrueType font loaded at run time from the usual system places
//! ([`ReportOptions::font_paths`], DejaVu Sans by default). Without a font
//! the SVGs are still written and the PNGs are skipped, with a warning in
//! [`Written::warnings`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::results::{ConfigResult, LatencySummary, NodeResult, Results};

/// Requests at or above this latency form the "tail" in the trans-Pacific paper's terms.
const TRUNCATION_S: f64 = 5.0;
/// Width of a latency histogram bin, in seconds.
const BIN_S: f64 = 0.25;

/// What can go wrong while writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Creating the output directory or writing one of its files failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Serialising the results to JSON failed.
    #[error("cannot serialise the results to JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Rendering a PNG failed (the SVG of the same graph may have been written).
    #[error("cannot render {path}: {message}")]
    Render {
        /// The PNG file.
        path: PathBuf,
        /// What plotters reported.
        message: String,
    },
}

/// What [`write_all_with`] should do beyond the defaults.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// TrueType fonts to try, in order, for the text of the PNG graphs; the
    /// first that exists and parses is used. Empty: no PNGs.
    pub font_paths: Vec<PathBuf>,
}

impl Default for ReportOptions {
    /// DejaVu Sans where Debian/Ubuntu (`fonts-dejavu-core`), Fedora, Arch and
    /// openSUSE put it.
    fn default() -> Self {
        let paths = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/DejaVuSans.ttf",
        ];
        Self {
            font_paths: paths.iter().map(PathBuf::from).collect(),
        }
    }
}

/// What [`write_all`] wrote.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
    /// Things the caller should tell the user (e.g. PNGs skipped for want of a font).
    pub warnings: Vec<String>,
}

/// Writes `results.json`, `results.md` and the graphs into `dir` (created if
/// missing), looking for a font in the default places.
pub fn write_all(results: &Results, dir: &Path) -> Result<Written, ReportError> {
    write_all_with(results, dir, &ReportOptions::default())
}

/// [`write_all`] with explicit options.
pub fn write_all_with(
    results: &Results,
    dir: &Path,
    options: &ReportOptions,
) -> Result<Written, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Written::default();
    let write = |name: &str, text: &str, written: &mut Written| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| ReportError::Io {
            path: path.clone(),
            source,
        })?;
        written.files.push(path);
        Ok::<(), ReportError>(())
    };

    let mut json = serde_json::to_string_pretty(results)?;
    json.push('\n');
    write("results.json", &json, &mut written)?;
    write("results.md", &markdown(results), &mut written)?;

    let groups = aggregate(results);
    let mut figures = vec![("heg".to_string(), heg_figure(&groups))];
    figures.extend(latency_figures(&groups));
    for (stem, figure) in &figures {
        write(&format!("{stem}.svg"), &figure.to_svg(), &mut written)?;
    }

    let missing = heg_missing(&groups);
    if !missing.is_empty() {
        written.warnings.push(format!(
            "left off the HEG (no CPU breakdown reported): {}",
            missing.join(", ")
        ));
    }

    match load_font(&options.font_paths) {
        Some(_) => {
            for (stem, figure) in &figures {
                let path = dir.join(format!("{stem}.png"));
                figure.to_png(&path)?;
                written.files.push(path);
            }
        }
        None => written.warnings.push(format!(
            "no TrueType font found (tried {}): wrote the SVG graphs only, no PNGs; \
             install DejaVu Sans (Debian: fonts-dejavu-core) to get them",
            options
                .font_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    Ok(written)
}

// ---------------------------------------------------------------------------
// Grouping and medians over repetitions
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Number formatting
// ---------------------------------------------------------------------------

/// A share (0–1) as a percentage with one decimal: `0.25` → `"25.0%"`.
pub fn fmt_pct(share: f64) -> String {
    if !share.is_finite() {
        return "n/a".into();
    }
    format!("{}%", one_decimal(share * 100.0))
}

/// Milliseconds with two or three significant decimals: `2.75` → `"2.75"`,
/// `0.5234` → `"0.523"`, `116.87` → `"116.9"`.
pub fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        return "n/a".into();
    }
    let a = ms.abs();
    if a >= 100.0 {
        format!("{ms:.1}")
    } else if a >= 1.0 || a == 0.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

/// The relative increase of `value` over `base`, in %, or `None` when `base` is 0.
pub fn overhead_pct(base: f64, value: f64) -> Option<f64> {
    (base != 0.0 && base.is_finite() && value.is_finite()).then(|| (value - base) / base * 100.0)
}

/// An overhead as the paper prints it, signed with one decimal: `"+11.6%"`,
/// `"-1.0%"`, `"0.0%"`; `"n/a"` for `None` (a zero baseline).
pub fn fmt_overhead(pct: Option<f64>) -> String {
    match pct {
        None => "n/a".into(),
        Some(p) => signed(p, "%"),
    }
}

fn one_decimal(x: f64) -> String {
    let s = format!("{x:.1}");
    if s == "-0.0" {
        "0.0".into()
    } else {
        s
    }
}

fn signed(x: f64, unit: &str) -> String {
    let s = one_decimal(x);
    if s == "0.0" || s.starts_with('-') {
        format!("{s}{unit}")
    } else {
        format!("+{s}{unit}")
    }
}

/// Makes `text` safe inside a Markdown table cell: `|` is escaped, line
/// breaks become spaces, `<` cannot open HTML.
pub fn escape_cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '|' => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Markdown
// ---------------------------------------------------------------------------

/// A Markdown table from a header and rows of already formatted cells
/// (escaped here). Numeric columns are right-aligned: `align[i]` is true for them.
fn table(header: &[&str], align_right: &[bool], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let cells = |cells: &mut dyn Iterator<Item = String>| {
        let mut line = String::from("|");
        for c in cells {
            line.push(' ');
            line.push_str(&c);
            line.push_str(" |");
        }
        line.push('\n');
        line
    };
    s.push_str(&cells(&mut header.iter().map(|h| escape_cell(h))));
    s.push_str(&cells(&mut (0..header.len()).map(|i| {
        if align_right.get(i).copied().unwrap_or(false) {
            "---:".to_string()
        } else {
            "---".to_string()
        }
    })));
    for row in rows {
        s.push_str(&cells(&mut row.iter().map(|c| escape_cell(c))));
    }
    s
}

/// The whole `results.md`.
pub fn markdown(results: &Results) -> String {
    let groups = aggregate(results);
    let mut s = header_markdown(results);
    let max_reps = groups
        .iter()
        .flat_map(|g| g.rows.iter().map(|r| r.repetitions))
        .max()
        .unwrap_or(0);
    if max_reps > 1 {
        let _ = writeln!(
            s,
            "\nConfigurations ran up to {max_reps} times: every figure is the median over \
             a configuration's repetitions (latency bins and node CPU seconds are pooled)."
        );
    }
    for g in &groups {
        let _ = writeln!(s, "\n## Group {}\n", escape_cell(&group_label(&g.name)));
        s.push_str(&group_markdown(g));
    }
    s.push_str("\n## Graphs\n\n![Hit ratio efficiency graph](heg.svg)\n\n");
    let missing = heg_missing(&groups);
    if !missing.is_empty() {
        let _ = writeln!(
            s,
            "Not on the HEG (no CPU breakdown reported): {}.\n",
            escape_cell(&missing.join(", "))
        );
    }
    for (stem, _) in latency_stems(&groups) {
        let _ = writeln!(s, "![Latency CDF]({stem}.svg)\n");
    }
    s
}

/// The header: experiment, revision, seed, start, duration, machine, netns.
pub fn header_markdown(results: &Results) -> String {
    let m = &results.machine;
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.to_string()
        }
    };
    let netns = if m.own_netns {
        "own (the namespace-wide UDP and TCP counts are the run's alone)"
    } else {
        "shared with the host (namespace-wide counts include the host's traffic)"
    };
    let rows = vec![
        vec!["revision".into(), or_unknown(&results.revision)],
        vec!["seed".into(), results.seed.to_string()],
        vec!["started".into(), or_unknown(&results.started)],
        vec!["duration".into(), format!("{:.1} s", results.duration_s)],
        vec![
            "machine".into(),
            format!(
                "{}, {} cores, kernel {}, steal {}% of a core",
                or_unknown(&m.cpu),
                m.cores,
                or_unknown(&m.kernel),
                one_decimal(m.steal_pct)
            ),
        ],
        vec!["network namespace".into(), netns.into()],
        vec![
            "configurations measured".into(),
            if results.concurrent {
                "at the same time, one process and namespace each, passes started together"
            } else {
                "one after the other"
            }
            .into(),
        ],
        vec!["configurations".into(), results.configs.len().to_string()],
    ];
    format!(
        "# Experiment {}\n\n{}",
        escape_cell(&or_unknown(&results.experiment)),
        table(&["run", ""], &[false, false], &rows)
    )
}

/// One group's section: overhead, hierarchy, CPU, latency and (when the
/// latencies reach the 0.25 s scale) latency-bin tables.
pub fn group_markdown(group: &Group) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Overhead\n");
    s.push_str(&overhead_table(group));
    match group.baseline {
        Some(b) => {
            let _ = writeln!(
                s,
                "\nOverhead rows: increase over the baseline {} (hit ratio in percentage \
                 points, everything else in % of the baseline's figure).",
                escape_cell(&group.rows[b].config.name)
            );
        }
        None => s.push_str("\nNo baseline in this group: no overhead rows.\n"),
    }
    if group.rows.iter().any(|r| !r.config.tcp_per_node) {
        s.push_str(
            "\nTCP msgs: segments in the whole network namespace (per-node counts were not \
             available in this run).\n",
        );
    } else {
        s.push_str(
            "\nUDP and TCP msgs: datagrams and segments the cache nodes sent plus received \
             (per node below).\n",
        );
    }
    let _ = writeln!(s, "\n### Hierarchy\n");
    s.push_str(&hierarchy_table(group));
    if group.rows.iter().any(|r| r.config.protocol != "none") {
        let _ = writeln!(s, "\n### Inter-cache traffic\n");
        s.push_str(&cooperation_table(group));
        let _ = writeln!(
            s,
            "\nMessages: ICP and summary-update datagrams sent, plus two per HTTP request between \
             caches (object fetches and summary or digest transfers). Protocol messages: the same \
             less the object fetches that brought a hit (the cost of finding hits, the Summary \
             Cache paper's measure; with parents, the misses they resolve count too). Bytes: the \
             datagrams and the summaries or digests served, not the objects. \"vs ICP\": how many \
             times fewer protocol messages than the same product's ICP row. False-positive rates: \
             observed (false \
             hits over lookups of objects the peer did not hold) and the Bloom formula's \
             `(1 − e^(−kn/m))^k` for the summaries' sizes."
        );
    }
    if let Some(t) = paired_cpu_table(group) {
        let _ = writeln!(s, "\n### CPU against the baseline, round by round\n");
        s.push_str(&t);
        let _ = writeln!(
            s,
            "\nEach round ran every configuration once; a configuration's overhead is taken \
             against the baseline's run in the same round, so that what drifts between rounds \
             (the machine, the page cache) cancels out. Interval: where the median overhead lies, \
             with the confidence shown, whatever the rounds' distribution (the sign test's \
             interval, from the sorted rounds); an overhead smaller than the interval's width is \
             not resolved by this many rounds."
        );
    }
    let _ = writeln!(s, "\n### CPU per node\n");
    s.push_str(&cpu_table(group));
    let _ = writeln!(s, "\n### Per node\n");
    s.push_str(&nodes_table(group));
    let _ = writeln!(
        s,
        "\nHit ratios and latency: the requests of the node's own clients. UDP: inter-cache \
         datagrams (the node's own counters). TCP: segments the node's sockets sent and \
         received, with its clients, peers and origins (the kernel's per-socket counters), as \
         the Summary Cache paper's netstat counted per proxy machine."
    );
    let _ = writeln!(s, "\n### Latency\n");
    s.push_str(&latency_table(group));
    let _ = writeln!(
        s,
        "\nTruncated mean: mean of the requests under {TRUNCATION_S:.0} s (share: how many \
         they are); tail mean: mean of the rest."
    );
    if reaches_bin_scale(group) {
        let _ = writeln!(s, "\n### Latency in {BIN_S} s bins\n");
        s.push_str(&bins_table(group));
    }
    s
}

/// The group's Table 2: one row per configuration and an overhead row under
/// each non-baseline row.
pub fn overhead_table(group: &Group) -> String {
    let header = [
        "configuration",
        "product",
        "protocol",
        "topology",
        "hit ratio",
        "latency mean (ms)",
        "p50 (ms)",
        "p99 (ms)",
        "user CPU (s)",
        "system CPU (s)",
        "UDP msgs",
        "TCP msgs",
        "inter-cache msgs/req",
        "req/s",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 4).collect();
    type Figure = fn(&ConfigResult) -> f64;
    let figures: [Figure; 9] = [
        |c| c.latency_ms.mean,
        |c| c.latency_ms.median,
        |c| c.latency_ms.p99,
        |c| c.cpu_user_s,
        |c| c.cpu_sys_s,
        |c| c.udp_messages as f64,
        |c| c.tcp_messages as f64,
        |c| c.intercache_messages_per_request,
        |c| c.req_per_s,
    ];
    let base = group.baseline.map(|b| &group.rows[b].config);
    let mut rows = Vec::new();
    for (i, row) in group.rows.iter().enumerate() {
        let c = &row.config;
        let mut name = c.name.clone();
        if Some(i) == group.baseline {
            name.push_str(" (baseline)");
        }
        rows.push(vec![
            name,
            c.product.clone(),
            c.protocol.clone(),
            c.topology.clone(),
            fmt_pct(c.hit_ratio),
            fmt_ms(c.latency_ms.mean),
            fmt_ms(c.latency_ms.median),
            fmt_ms(c.latency_ms.p99),
            format!("{:.2}", c.cpu_user_s),
            format!("{:.2}", c.cpu_sys_s),
            c.udp_messages.to_string(),
            c.tcp_messages.to_string(),
            format!("{:.2}", c.intercache_messages_per_request),
            format!("{:.1}", c.req_per_s),
        ]);
        if let (Some(b), false) = (base, Some(i) == group.baseline) {
            let mut over = vec![
                "overhead".to_string(),
                String::new(),
                String::new(),
                String::new(),
                signed((c.hit_ratio - b.hit_ratio) * 100.0, " pt"),
            ];
            over.extend(
                figures
                    .iter()
                    .map(|f| fmt_overhead(overhead_pct(f(b), f(c)))),
            );
            rows.push(over);
        }
    }
    table(&header, &align, &rows)
}

/// Inter-cache messages and bytes per request, the reduction against ICP, and how the
/// summaries did (lookups, false hits, observed and formula false-positive rates, memory).
pub fn cooperation_table(group: &Group) -> String {
    let header = [
        "configuration",
        "protocol",
        "msgs/req",
        "protocol msgs/req",
        "bytes/req",
        "vs ICP",
        "hit ratio",
        "lookups",
        "false hits",
        "FP observed",
        "FP formula",
        "summary B/object",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 2).collect();
    let icp = |product: &str| {
        group
            .rows
            .iter()
            .map(|r| &r.config)
            .find(|c| c.protocol == "icp" && c.product == product)
    };
    let rows: Vec<Vec<String>> = group
        .rows
        .iter()
        .map(|r| {
            let c = &r.config;
            let vs = match icp(&c.product) {
                Some(i) if c.protocol != "icp" && c.protocol_messages_per_request > 0.0 => {
                    format!(
                        "{:.0}x fewer",
                        i.protocol_messages_per_request / c.protocol_messages_per_request
                    )
                }
                _ => String::new(),
            };
            let mut row = vec![
                c.name.clone(),
                c.protocol.clone(),
                format!("{:.3}", c.intercache_messages_per_request),
                format!("{:.3}", c.protocol_messages_per_request),
                format!("{:.1}", c.intercache_bytes_per_request),
                vs,
                fmt_pct(c.hit_ratio),
            ];
            match &c.summary {
                Some(f) => row.extend([
                    f.lookups.to_string(),
                    f.false_hits.to_string(),
                    format!("{:.2}%", f.observed_fp_rate * 100.0),
                    format!("{:.2}%", f.formula_fp_rate * 100.0),
                    format!("{:.2}", f.memory_per_object),
                ]),
                None => row.extend((0..5).map(|_| String::new())),
            }
            row
        })
        .collect();
    table(&header, &align, &rows)
}

/// Hits split by where they were found (local / sibling / parent), byte hit
/// ratio, the workload's inherent hit ratio and the efficiency.
pub fn hierarchy_table(group: &Group) -> String {
    let header = [
        "configuration",
        "local",
        "sibling",
        "parent",
        "total hit ratio",
        "byte hit ratio",
        "inherent",
        "efficiency",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 1).collect();
    let rows: Vec<Vec<String>> = group
        .rows
        .iter()
        .map(|r| {
            let c = &r.config;
            vec![
                c.name.clone(),
                fmt_pct(c.local_hit_ratio),
                fmt_pct(c.sibling_hit_ratio),
                fmt_pct(c.parent_hit_ratio),
                fmt_pct(c.hit_ratio),
                fmt_pct(c.byte_hit_ratio),
                fmt_pct(c.inherent_hit_ratio),
                efficiency(c).map_or_else(|| "n/a".into(), fmt_pct),
            ]
        })
        .collect();
    table(&header, &align, &rows)
}

/// Each node's clients' hit ratios and latency, and its UDP datagrams and TCP segments.
pub fn nodes_table(group: &Group) -> String {
    let header = [
        "configuration",
        "node",
        "role",
        "client requests",
        "hit ratio (local / sibling / parent)",
        "byte hit ratio",
        "latency mean / p50 / p99 (ms)",
        "UDP sent",
        "UDP received",
        "TCP sent",
        "TCP received",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 3).collect();
    let or_na = |x: Option<u64>| x.map_or_else(|| "n/a".to_string(), |x| x.to_string());
    let rows: Vec<Vec<String>> = group
        .rows
        .iter()
        .flat_map(|r| {
            r.config.nodes.iter().map(move |n| {
                let share = |x: u64| {
                    if n.client_requests == 0 {
                        "-".to_string()
                    } else {
                        fmt_pct(x as f64 / n.client_requests as f64)
                    }
                };
                let hits = if n.client_requests == 0 {
                    "-".to_string()
                } else {
                    format!(
                        "{} ({} / {} / {})",
                        share(n.local_hits + n.sibling_hits + n.parent_hits),
                        share(n.local_hits),
                        share(n.sibling_hits),
                        share(n.parent_hits)
                    )
                };
                let bytes = if n.client_bytes == 0 {
                    "-".to_string()
                } else {
                    fmt_pct(n.hit_bytes as f64 / n.client_bytes as f64)
                };
                let latency = n.latency_ms.as_ref().map_or_else(
                    || "-".to_string(),
                    |l| {
                        format!(
                            "{} / {} / {}",
                            fmt_ms(l.mean),
                            fmt_ms(l.median),
                            fmt_ms(l.p99)
                        )
                    },
                );
                vec![
                    r.config.name.clone(),
                    n.name.clone(),
                    n.role.clone(),
                    n.client_requests.to_string(),
                    hits,
                    bytes,
                    latency,
                    n.udp_sent.to_string(),
                    n.udp_received.to_string(),
                    or_na(n.tcp_sent),
                    or_na(n.tcp_received),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return "No node reported.\n".into();
    }
    table(&header, &align, &rows)
}

/// The nodes' CPU per round and each configuration's overhead over the baseline, paired by
/// round; `None` without a baseline or with a single round.
pub fn paired_cpu_table(group: &Group) -> Option<String> {
    let base = &group.rows[group.baseline?];
    if base.cpu_rounds.len() < 2 {
        return None;
    }
    let header = [
        "configuration",
        "CPU per round (s)",
        "overhead per round",
        "median overhead",
        "interval",
    ];
    let per_round = |r: &Row| {
        r.cpu_rounds
            .iter()
            .map(|(_, c)| format!("{c:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut rows = vec![vec![
        format!("{} (baseline)", base.config.name),
        per_round(base),
        String::new(),
        String::new(),
        String::new(),
    ]];
    for (i, row) in group.rows.iter().enumerate() {
        if Some(i) == group.baseline {
            continue;
        }
        let Some(p) = PairedCpu::new(&base.cpu_rounds, &row.cpu_rounds) else {
            continue;
        };
        let interval = match p.interval {
            Some((lo, hi)) => format!(
                "{} to {} ({:.0} %)",
                signed(lo, "%"),
                signed(hi, "%"),
                (p.confidence * 100.0).floor()
            ),
            None => "too few rounds".into(),
        };
        rows.push(vec![
            row.config.name.clone(),
            per_round(row),
            p.rounds
                .iter()
                .map(|o| signed(*o, "%"))
                .collect::<Vec<_>>()
                .join(", "),
            signed(p.median, "%"),
            interval,
        ]);
    }
    Some(table(&header, &[false, false, false, true, false], &rows))
}

/// Each node's CPU time split into client / peer / search / overhead (% of its CPU time).
pub fn cpu_table(group: &Group) -> String {
    let header = [
        "configuration",
        "node",
        "role",
        "CPU (s)",
        "client",
        "peer",
        "search",
        "overhead",
        "context switches (voluntary / involuntary)",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 3).collect();
    let mut rows = Vec::new();
    for r in &group.rows {
        for n in &r.config.nodes {
            let total = n.cpu_exact_s.unwrap_or(n.cpu_user_s + n.cpu_sys_s);
            let share = |x: f64| {
                if reports_breakdown(n) && total > 0.0 {
                    fmt_pct(x / total)
                } else {
                    "n/a".to_string()
                }
            };
            rows.push(vec![
                r.config.name.clone(),
                n.name.clone(),
                n.role.clone(),
                format!("{total:.2}"),
                share(n.client_s),
                share(n.peer_s),
                share(n.search_s),
                share(n.overhead_s),
                format!("{} / {}", n.switches_voluntary, n.switches_involuntary),
            ]);
        }
    }
    if rows.is_empty() {
        return "No node reported its CPU time.\n".into();
    }
    table(&header, &align, &rows)
}

/// Latency in the trans-Pacific paper's terms.
pub fn latency_table(group: &Group) -> String {
    let header = [
        "configuration",
        "requests",
        "errors",
        "median (ms)",
        "truncated mean (ms)",
        "share under 5 s",
        "tail mean (ms)",
        "p95 (ms)",
        "p99 (ms)",
    ];
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 1).collect();
    let rows: Vec<Vec<String>> = group
        .rows
        .iter()
        .map(|r| {
            let c = &r.config;
            let l = &c.latency_ms;
            vec![
                c.name.clone(),
                c.requests.to_string(),
                c.errors.to_string(),
                fmt_ms(l.median),
                fmt_ms(l.truncated_mean),
                fmt_pct(l.truncated_share),
                if l.truncated_share >= 1.0 || l.tail_mean == 0.0 {
                    "–".into()
                } else {
                    fmt_ms(l.tail_mean)
                },
                fmt_ms(l.p95),
                fmt_ms(l.p99),
            ]
        })
        .collect();
    table(&header, &align, &rows)
}

/// Whether some configuration of the group has latencies at the 0.25 s
/// scale (p99 at a quarter second or more, with bins to show).
pub fn reaches_bin_scale(group: &Group) -> bool {
    group.rows.iter().any(|r| {
        r.config.latency_ms.p99 >= BIN_S * 1000.0 && r.config.latency_bins.iter().any(|b| b.1 > 0)
    })
}

/// The share of requests in each 0.25 s bin, one column per configuration;
/// bins from 5 s up are folded into one row, and so is each run of bins empty
/// for every configuration; the last row names the median bin.
pub fn bins_table(group: &Group) -> String {
    let names: Vec<String> = group.rows.iter().map(|r| r.config.name.clone()).collect();
    let mut header: Vec<&str> = vec!["latency (s)"];
    header.extend(names.iter().map(String::as_str));
    let align: Vec<bool> = (0..header.len()).map(|i| i >= 1).collect();
    let last_bin = (TRUNCATION_S / BIN_S).round() as usize; // bins below 5 s
    let highest = group
        .rows
        .iter()
        .flat_map(|r| r.config.latency_bins.iter())
        .filter(|b| b.1 > 0)
        .map(|b| bin_index(b.0))
        .max()
        .unwrap_or(0);
    let shown = highest.min(last_bin - 1);
    // counts[config][bin], with bin `last_bin` the ≥ 5 s tail.
    let counts: Vec<Vec<u64>> = group
        .rows
        .iter()
        .map(|r| {
            let mut v = vec![0u64; last_bin + 1];
            for &(edge, count) in &r.config.latency_bins {
                v[bin_index(edge).min(last_bin)] += count;
            }
            v
        })
        .collect();
    let mut rows = Vec::new();
    let mut i = 0;
    while i <= shown {
        // A run of bins empty for every configuration makes one row.
        let mut end = i;
        while end < shown && counts.iter().all(|c| c[end] == 0 && c[end + 1] == 0) {
            end += 1;
        }
        let mut row = vec![format!(
            "{:.2}–{:.2}",
            i as f64 * BIN_S,
            (end + 1) as f64 * BIN_S
        )];
        row.extend(counts.iter().map(|c| share_of(c[i..=end].iter().sum(), c)));
        rows.push(row);
        i = end + 1;
    }
    if highest >= last_bin {
        let mut row = vec![format!("≥ {TRUNCATION_S:.2}")];
        row.extend(counts.iter().map(|c| share_of(c[last_bin], c)));
        rows.push(row);
    }
    let mut row = vec!["median bin".to_string()];
    row.extend(counts.iter().map(|c| median_bin(c, last_bin)));
    rows.push(row);
    table(&header, &align, &rows)
}

/// The bin (0-based, 0.25 s wide) whose upper edge is `edge` seconds.
fn bin_index(edge: f64) -> usize {
    ((edge / BIN_S).round() as usize).saturating_sub(1)
}

fn share_of(count: u64, all: &[u64]) -> String {
    let total: u64 = all.iter().sum();
    if total == 0 {
        "n/a".into()
    } else {
        fmt_pct(count as f64 / total as f64)
    }
}

fn median_bin(counts: &[u64], last_bin: usize) -> String {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return "n/a".into();
    }
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen * 2 >= total {
            return if i >= last_bin {
                format!("≥ {TRUNCATION_S:.2}")
            } else {
                format!("{:.2}–{:.2}", i as f64 * BIN_S, (i + 1) as f64 * BIN_S)
            };
        }
    }
    "n/a".into()
}

// ---------------------------------------------------------------------------
// Graphs: layout
// ---------------------------------------------------------------------------

type Rgb = (u8, u8, u8);

/// Series colours (Tableau 10: distinct, and readable on white).
const PALETTE: [Rgb; 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];
const INK: Rgb = (30, 30, 30);
const GRID: Rgb = (222, 222, 222);
const MINOR_GRID: Rgb = (240, 240, 240);
const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 700.0;
const TICK_FONT: f64 = 15.0;
const LABEL_FONT: f64 = 17.0;
const TITLE_FONT: f64 = 22.0;
const POINT_FONT: f64 = 15.0;
const LEGEND_FONT: f64 = 15.0;

/// Where a text is anchored horizontally (it is always centred vertically on its `y`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Clone, Debug)]
enum Item {
    Line {
        points: Vec<(f64, f64)>,
        color: Rgb,
        width: f64,
    },
    Rect {
        corners: (f64, f64, f64, f64),
        fill: Option<Rgb>,
        stroke: Option<Rgb>,
    },
    Circle {
        center: (f64, f64),
        radius: f64,
        color: Rgb,
    },
    Text {
        at: (f64, f64),
        text: String,
        size: f64,
        color: Rgb,
        anchor: Anchor,
        vertical: bool,
        bold: bool,
    },
}

/// A graph laid out in pixels, ready to be written as SVG ([`Figure::to_svg`])
/// or PNG ([`Figure::to_png`]).
#[derive(Clone, Debug)]
pub struct Figure {
    width: f64,
    height: f64,
    items: Vec<Item>,
}

/// An estimate of a text's width in pixels (DejaVu Sans averages a little
/// over half an em per character; this errs on the wide side).
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.6
}

impl Figure {
    fn new() -> Self {
        Self {
            width: WIDTH,
            height: HEIGHT,
            items: Vec::new(),
        }
    }

    fn line(&mut self, points: Vec<(f64, f64)>, color: Rgb, width: f64) {
        self.items.push(Item::Line {
            points,
            color,
            width,
        });
    }

    fn text(&mut self, at: (f64, f64), text: &str, size: f64, anchor: Anchor) {
        self.items.push(Item::Text {
            at,
            text: text.to_string(),
            size,
            color: INK,
            anchor,
            vertical: false,
            bold: false,
        });
    }

    /// Title, axis labels and the plot area's frame.
    fn frame(&mut self, area: &Area, title: &str, x_label: &str, y_label: &str) {
        self.items.push(Item::Text {
            at: (self.width / 2.0, 28.0),
            text: title.to_string(),
            size: TITLE_FONT,
            color: INK,
            anchor: Anchor::Middle,
            vertical: false,
            bold: true,
        });
        self.text(
            ((area.left + area.right) / 2.0, self.height - 24.0),
            x_label,
            LABEL_FONT,
            Anchor::Middle,
        );
        self.items.push(Item::Text {
            at: (22.0, (area.top + area.bottom) / 2.0),
            text: y_label.to_string(),
            size: LABEL_FONT,
            color: INK,
            anchor: Anchor::Middle,
            vertical: true,
            bold: false,
        });
    }

    fn border(&mut self, area: &Area) {
        self.items.push(Item::Rect {
            corners: (area.left, area.top, area.right, area.bottom),
            fill: None,
            stroke: Some(INK),
        });
    }

    /// A legend box in the corner of `area` that covers the fewest `obstacles`.
    fn legend(&mut self, area: &Area, entries: &[(String, Rgb, bool)], obstacles: &[(f64, f64)]) {
        if entries.is_empty() {
            return;
        }
        let row = LEGEND_FONT * 1.6;
        let w = entries
            .iter()
            .map(|(t, _, _)| text_width(t, LEGEND_FONT))
            .fold(0.0, f64::max)
            + 52.0;
        let h = row * entries.len() as f64 + 12.0;
        let m = 10.0;
        let corners = [
            (area.right - m - w, area.bottom - m - h),
            (area.right - m - w, area.top + m),
            (area.left + m, area.top + m),
            (area.left + m, area.bottom - m - h),
        ];
        let covered = |&(x, y): &(f64, f64)| {
            obstacles
                .iter()
                .filter(|p| p.0 >= x && p.0 <= x + w && p.1 >= y && p.1 <= y + h)
                .count()
        };
        let (x, y) = corners
            .iter()
            .copied()
            .min_by_key(covered)
            .unwrap_or(corners[0]);
        self.items.push(Item::Rect {
            corners: (x, y, x + w, y + h),
            fill: Some((255, 255, 255)),
            stroke: Some((160, 160, 160)),
        });
        for (i, (label, color, is_line)) in entries.iter().enumerate() {
            let cy = y + 6.0 + row * (i as f64 + 0.5);
            if *is_line {
                self.line(vec![(x + 10.0, cy), (x + 38.0, cy)], *color, 3.0);
            } else {
                self.items.push(Item::Circle {
                    center: (x + 24.0, cy),
                    radius: 6.0,
                    color: *color,
                });
            }
            self.text((x + 46.0, cy), label, LEGEND_FONT, Anchor::Start);
        }
    }
}

/// The plot area, in pixels.
#[derive(Clone, Copy, Debug)]
struct Area {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

impl Area {
    fn standard() -> Self {
        Self {
            left: 95.0,
            top: 60.0,
            right: WIDTH - 30.0,
            bottom: HEIGHT - 75.0,
        }
    }
}

/// A linear axis from `lo` to `hi` with ticks every `step`.
#[derive(Clone, Copy, Debug)]
struct Linear {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Linear {
    /// An axis with round ticks covering `min..=max` (padded), kept within `bounds`.
    fn covering(min: f64, max: f64, bounds: (f64, f64)) -> Self {
        let (mut min, mut max) = if min.is_finite() && max.is_finite() {
            (min, max)
        } else {
            bounds
        };
        let pad = ((max - min) * 0.1).max(2.0);
        min = (min - pad).max(bounds.0);
        max = (max + pad).min(bounds.1);
        let raw = (max - min) / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|k| k * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        Self {
            lo: (min / step).floor() * step,
            hi: (max / step).ceil() * step,
            step,
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=n).map(|i| self.lo + i as f64 * self.step).collect()
    }

    fn fraction(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step.fract() == 0.0 {
        format!("{v:.0}")
    } else if (step * 10.0).fract() == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Names of the configurations (with their group) that the HEG cannot show.
fn heg_missing(groups: &[Group]) -> Vec<String> {
    groups
        .iter()
        .flat_map(|g| g.rows.iter())
        .filter(|r| efficiency(&r.config).is_none())
        .map(|r| r.config.name.clone())
        .collect()
}

/// The Hit Ratio Efficiency Graph as SVG text.
pub fn heg_svg(results: &Results) -> String {
    heg_figure(&aggregate(results)).to_svg()
}

/// The latency CDF graphs as (file stem, SVG text): one `latency`, or one
/// `latency-<group>` per group when there are several.
pub fn latency_svgs(results: &Results) -> Vec<(String, String)> {
    latency_figures(&aggregate(results))
        .into_iter()
        .map(|(stem, f)| (stem, f.to_svg()))
        .collect()
}

/// The Hit Ratio Efficiency Graph of the (aggregated) groups: one point per
/// configuration with a known efficiency, coloured by group, labelled with its name.
pub fn heg_figure(groups: &[Group]) -> Figure {
    let mut fig = Figure::new();
    let area = Area::standard();
    // (x %, y %, label, colour)
    let mut points: Vec<(f64, f64, String, Rgb)> = Vec::new();
    let mut legend = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let color = PALETTE[gi % PALETTE.len()];
        let before = points.len();
        for r in &g.rows {
            if let (Some(e), true) = (efficiency(&r.config), r.config.hit_ratio.is_finite()) {
                points.push((
                    e * 100.0,
                    r.config.hit_ratio * 100.0,
                    r.config.name.clone(),
                    color,
                ));
            }
        }
        if points.len() > before {
            legend.push((group_label(&g.name), color, false));
        }
    }
    let xs = points.iter().map(|p| p.0);
    let ys = points.iter().map(|p| p.1);
    let x = Linear::covering(
        xs.clone().fold(f64::INFINITY, f64::min),
        xs.fold(f64::NEG_INFINITY, f64::max),
        (0.0, 100.0),
    );
    let y = Linear::covering(
        ys.clone().fold(f64::INFINITY, f64::min),
        ys.fold(f64::NEG_INFINITY, f64::max),
        (0.0, 100.0),
    );
    let px = |v: f64| area.left + x.fraction(v) * (area.right - area.left);
    let py = |v: f64| area.bottom - y.fraction(v) * (area.bottom - area.top);

    for t in x.ticks() {
        fig.line(vec![(px(t), area.top), (px(t), area.bottom)], GRID, 1.0);
        fig.text(
            (px(t), area.bottom + 16.0),
            &fmt_tick(t, x.step),
            TICK_FONT,
            Anchor::Middle,
        );
    }
    for t in y.ticks() {
        fig.line(vec![(area.left, py(t)), (area.right, py(t))], GRID, 1.0);
        fig.text(
            (area.left - 8.0, py(t)),
            &fmt_tick(t, y.step),
            TICK_FONT,
            Anchor::End,
        );
    }
    fig.border(&area);
    fig.frame(
        &area,
        "Hit ratio efficiency graph",
        "efficiency: share of the caches' CPU time spent on their clients (%)",
        "hit ratio (%)",
    );
    if points.is_empty() {
        fig.text(
            (
                (area.left + area.right) / 2.0,
                (area.top + area.bottom) / 2.0,
            ),
            "no configuration reported a CPU breakdown",
            LABEL_FONT,
            Anchor::Middle,
        );
        return fig;
    }

    let centres: Vec<(f64, f64)> = points.iter().map(|p| (px(p.0), py(p.1))).collect();
    // Label boxes placed so far: (x0, y0, x1, y1).
    let mut boxes: Vec<(f64, f64, f64, f64)> = centres
        .iter()
        .map(|&(cx, cy)| (cx - 7.0, cy - 7.0, cx + 7.0, cy + 7.0))
        .collect();
    let mut obstacles = centres.clone();
    for ((_, _, label, color), &(cx, cy)) in points.iter().zip(&centres) {
        fig.items.push(Item::Circle {
            center: (cx, cy),
            radius: 7.0,
            color: *color,
        });
        let w = text_width(label, POINT_FONT);
        let h = POINT_FONT * 1.2;
        let candidates = [
            ((cx + 12.0, cy), Anchor::Start, (cx + 12.0, cy - h / 2.0)),
            ((cx - 12.0, cy), Anchor::End, (cx - 12.0 - w, cy - h / 2.0)),
            (
                (cx, cy - 20.0),
                Anchor::Middle,
                (cx - w / 2.0, cy - 20.0 - h / 2.0),
            ),
            (
                (cx, cy + 20.0),
                Anchor::Middle,
                (cx - w / 2.0, cy + 20.0 - h / 2.0),
            ),
            (
                (cx + 12.0, cy - 20.0),
                Anchor::Start,
                (cx + 12.0, cy - 20.0 - h / 2.0),
            ),
            (
                (cx + 12.0, cy + 20.0),
                Anchor::Start,
                (cx + 12.0, cy + 20.0 - h / 2.0),
            ),
        ];
        let fits = |&(_, _, (x0, y0)): &((f64, f64), Anchor, (f64, f64))| {
            let inside = x0 >= area.left + 2.0
                && x0 + w <= area.right - 2.0
                && y0 >= area.top
                && y0 + h <= area.bottom;
            let clear = boxes
                .iter()
                .all(|b| x0 + w <= b.0 || x0 >= b.2 || y0 + h <= b.1 || y0 >= b.3);
            inside && clear
        };
        let (at, anchor, (x0, y0)) = candidates
            .iter()
            .copied()
            .find(fits)
            .or_else(|| {
                candidates.iter().copied().find(|&(_, _, (x0, y0))| {
                    x0 >= area.left
                        && x0 + w <= area.right
                        && y0 >= area.top
                        && y0 + h <= area.bottom
                })
            })
            .unwrap_or(candidates[0]);
        boxes.push((x0, y0, x0 + w, y0 + h));
        obstacles.extend([
            (x0, y0),
            (x0 + w, y0),
            (x0 + w / 2.0, y0 + h / 2.0),
            (x0, y0 + h),
            (x0 + w, y0 + h),
        ]);
        fig.text(at, label, POINT_FONT, anchor);
    }
    if legend.len() > 1 {
        fig.legend(&area, &legend, &obstacles);
    }
    fig
}

fn group_label(name: &str) -> String {
    if name.is_empty() {
        "(no group)".into()
    } else {
        name.to_string()
    }
}

/// File stems of the latency graphs, with the index of their group.
fn latency_stems(groups: &[Group]) -> Vec<(String, usize)> {
    if groups.len() <= 1 {
        return vec![("latency".to_string(), 0)];
    }
    let mut used: Vec<String> = Vec::new();
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let clean: String = g
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut stem = if clean.trim_matches(['_', '.']).is_empty() {
                format!("latency-{}", i + 1)
            } else {
                format!("latency-{clean}")
            };
            if used.contains(&stem) {
                stem = format!("{stem}-{}", i + 1);
            }
            used.push(stem.clone());
            (stem, i)
        })
        .collect()
}

/// The latency CDFs as (file stem, figure): `latency`, or `latency-<group>`
/// per group when there are several.
pub fn latency_figures(groups: &[Group]) -> Vec<(String, Figure)> {
    let several = groups.len() > 1;
    latency_stems(groups)
        .into_iter()
        .map(|(stem, i)| {
            let title = match (several, groups.get(i)) {
                (true, Some(g)) => format!("Client latency CDF: {}", group_label(&g.name)),
                _ => "Client latency CDF".to_string(),
            };
            let rows: &[Row] = groups.get(i).map_or(&[], |g| &g.rows);
            (stem, latency_figure(&title, rows))
        })
        .collect()
}

fn latency_figure(title: &str, rows: &[Row]) -> Figure {
    let mut fig = Figure::new();
    let area = Area::standard();
    let positive = || {
        rows.iter()
            .flat_map(|r| r.config.latency_cdf.iter())
            .map(|p| p.0)
            .filter(|ms| *ms > 0.0 && ms.is_finite())
    };
    let min = positive().fold(f64::INFINITY, f64::min);
    let max = positive().fold(f64::NEG_INFINITY, f64::max);
    let (lo, mut hi) = if min.is_finite() {
        (min.log10().floor(), max.log10().ceil())
    } else {
        (0.0, 3.0)
    };
    if hi <= lo {
        hi = lo + 1.0;
    }
    let px = |ms: f64| area.left + (ms.log10() - lo) / (hi - lo) * (area.right - area.left);
    let py = |share: f64| area.bottom - share.clamp(0.0, 1.0) * (area.bottom - area.top);

    for d in (lo as i32)..(hi as i32) {
        for k in 2..10 {
            let v = k as f64 * 10f64.powi(d);
            fig.line(
                vec![(px(v), area.top), (px(v), area.bottom)],
                MINOR_GRID,
                1.0,
            );
        }
    }
    for d in (lo as i32)..=(hi as i32) {
        let v = 10f64.powi(d);
        fig.line(vec![(px(v), area.top), (px(v), area.bottom)], GRID, 1.0);
        let label = if d < 0 {
            format!("{:.*}", (-d) as usize, v)
        } else {
            format!("{v:.0}")
        };
        fig.text(
            (px(v), area.bottom + 16.0),
            &label,
            TICK_FONT,
            Anchor::Middle,
        );
    }
    for i in 0..=10 {
        let s = i as f64 / 10.0;
        fig.line(vec![(area.left, py(s)), (area.right, py(s))], GRID, 1.0);
        fig.text(
            (area.left - 8.0, py(s)),
            &format!("{}%", i * 10),
            TICK_FONT,
            Anchor::End,
        );
    }
    fig.border(&area);
    fig.frame(
        &area,
        title,
        "client latency (ms, log scale)",
        "requests completed within (cumulative %)",
    );

    let mut legend = Vec::new();
    let mut obstacles = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points: Vec<(f64, f64)> = r
            .config
            .latency_cdf
            .iter()
            .filter(|p| p.0 > 0.0 && p.0.is_finite() && p.1.is_finite())
            .map(|&(ms, share)| (px(ms), py(share)))
            .collect();
        if points.is_empty() {
            continue;
        }
        for pair in points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            let steps = ((x1 - x0).hypot(y1 - y0) / 8.0).ceil().max(1.0) as usize;
            for s in 0..steps {
                let t = s as f64 / steps as f64;
                obstacles.push((x0 + (x1 - x0) * t, y0 + (y1 - y0) * t));
            }
        }
        obstacles.extend(points.last().copied());
        fig.line(points, color, 2.5);
        legend.push((r.config.name.clone(), color, true));
    }
    if legend.is_empty() {
        fig.text(
            (
                (area.left + area.right) / 2.0,
                (area.top + area.bottom) / 2.0,
            ),
            "no latency data",
            LABEL_FONT,
            Anchor::Middle,
        );
    }
    fig.legend(&area, &legend, &obstacles);
    fig
}

// ---------------------------------------------------------------------------
// Graphs: output
// ---------------------------------------------------------------------------

fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn svg_rgb((r, g, b): Rgb) -> String {
    format!("rgb({r},{g},{b})")
}

impl Figure {
    /// The figure as a standalone SVG document (text is left to the viewer's fonts).
    pub fn to_svg(&self) -> String {
        let (w, h) = (self.width, self.height);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\">\n\
             <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n"
        );
        for item in &self.items {
            let _ = match item {
                Item::Line {
                    points,
                    color,
                    width,
                } => {
                    let pts: Vec<String> = points
                        .iter()
                        .map(|(x, y)| format!("{x:.1},{y:.1}"))
                        .collect();
                    writeln!(
                        s,
                        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" \
                         stroke-width=\"{width}\" stroke-linejoin=\"round\"/>",
                        pts.join(" "),
                        svg_rgb(*color)
                    )
                }
                Item::Rect {
                    corners: (x0, y0, x1, y1),
                    fill,
                    stroke,
                } => writeln!(
                    s,
                    "<rect x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
                     fill=\"{}\" stroke=\"{}\"/>",
                    x1 - x0,
                    y1 - y0,
                    fill.map_or_else(|| "none".into(), svg_rgb),
                    stroke.map_or_else(|| "none".into(), svg_rgb),
                ),
                Item::Circle {
                    center: (x, y),
                    radius,
                    color,
                } => writeln!(
                    s,
                    "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{radius}\" fill=\"{}\" \
                     stroke=\"white\" stroke-width=\"1.5\"/>",
                    svg_rgb(*color)
                ),
                Item::Text {
                    at: (x, y),
                    text,
                    size,
                    color,
                    anchor,
                    vertical,
                    bold,
                } => {
                    let anchor = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                        Anchor::End => "end",
                    };
                    let rotate = if *vertical {
                        format!(" transform=\"rotate(-90 {x:.1} {y:.1})\"")
                    } else {
                        String::new()
                    };
                    let weight = if *bold { " font-weight=\"bold\"" } else { "" };
                    writeln!(
                        s,
                        "<text x=\"{x:.1}\" y=\"{y:.1}\" dy=\"0.35em\" font-size=\"{size}\" \
                         text-anchor=\"{anchor}\" fill=\"{}\"{weight}{rotate}>{}</text>",
                        svg_rgb(*color),
                        xml_escape(text)
                    )
                }
            };
        }
        s.push_str("</svg>\n");
        s
    }

    /// Renders the figure to a PNG file. Needs a font registered with
    /// plotters (see [`write_all_with`]); text is drawn in `sans-serif`.
    pub fn to_png(&self, path: &Path) -> Result<(), ReportError> {
        let render = |message: String| ReportError::Render {
            path: path.to_path_buf(),
            message,
        };
        let root =
            BitMapBackend::new(path, (self.width as u32, self.height as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| render(e.to_string()))?;
        let color = |(r, g, b): Rgb| RGBColor(r, g, b);
        let pt = |(x, y): (f64, f64)| (x.round() as i32, y.round() as i32);
        for item in &self.items {
            let drawn = match item {
                Item::Line {
                    points,
                    color: c,
                    width,
                } => root.draw(&PathElement::new(
                    points.iter().copied().map(pt).collect::<Vec<_>>(),
                    color(*c).stroke_width(width.round().max(1.0) as u32),
                )),
                Item::Rect {
                    corners: (x0, y0, x1, y1),
                    fill,
                    stroke,
                } => {
                    let corners = [pt((*x0, *y0)), pt((*x1, *y1))];
                    let filled = match fill {
                        Some(f) => root.draw(&Rectangle::new(corners, color(*f).filled())),
                        None => Ok(()),
                    };
                    filled.and_then(|()| match stroke {
                        Some(c) => root.draw(&Rectangle::new(corners, color(*c).stroke_width(1))),
                        None => Ok(()),
                    })
                }
                Item::Circle {
                    center,
                    radius,
                    color: c,
                } => root
                    .draw(&Circle::new(
                        pt(*center),
                        radius.round() as i32 + 1,
                        WHITE.filled(),
                    ))
                    .and_then(|()| {
                        root.draw(&Circle::new(
                            pt(*center),
                            radius.round() as i32,
                            color(*c).filled(),
                        ))
                    }),
                Item::Text {
                    at,
                    text,
                    size,
                    color: c,
                    anchor,
                    vertical,
                    bold,
                } => {
                    let h = match anchor {
                        Anchor::Start => HPos::Left,
                        Anchor::Middle => HPos::Center,
                        Anchor::End => HPos::Right,
                    };
                    let weight = if *bold {
                        FontStyle::Bold
                    } else {
                        FontStyle::Normal
                    };
                    // plotters sizes text by its line height; SVG by its em.
                    let mut style = ("sans-serif", size * 1.24, weight)
                        .into_font()
                        .color(&color(*c))
                        .pos(Pos::new(h, VPos::Center));
                    if *vertical {
                        style = style.transform(FontTransform::Rotate270);
                    }
                    root.draw(&Text::new(text.as_str(), pt(*at), style))
                }
            };
            drawn.map_err(|e| render(e.to_string()))?;
        }
        root.present().map_err(|e| render(e.to_string()))
    }
}

/// Fonts already handed to plotters, by path. plotters keeps registered fonts
/// in a table of its own for the life of the process and wants `'static`
/// bytes, so each font file is read (and leaked) at most once.
static REGISTERED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers the first usable font of `paths` as plotters' `sans-serif`
/// (and its `-Bold` sibling, if there is one, as the bold style); returns its path.
fn load_font(paths: &[PathBuf]) -> Option<PathBuf> {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    for path in paths {
        if registered.contains(path) {
            return Some(path.clone());
        }
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
            continue;
        }
        let bold = path.with_file_name(format!(
            "{}-Bold.ttf",
            path.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
        ));
        if let Ok(bold_bytes) = std::fs::read(bold) {
            let bold_bytes: &'static [u8] = Box::leak(bold_bytes.into_boxed_slice());
            // Without it, bold text falls back to the regular face.
            let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, bold_bytes);
        }
        registered.push(path.clone());
        return Some(path.clone());
    }
    None
}
