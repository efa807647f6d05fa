//! The Markdown report: the header and, per group of configurations, the papers' tables.

use std::fmt::Write as _;

use super::figure::{group_label, heg_missing, latency_stems};
use super::format::{
    escape_cell, fmt_ms, fmt_overhead, fmt_pct, one_decimal, overhead_pct, signed,
};
use super::group::{aggregate, efficiency, reports_breakdown, Group, PairedCpu, Row};
use crate::results::{ConfigResult, Results};

/// Requests at or above this latency form the "tail" in the trans-Pacific paper's terms.
const TRUNCATION_S: f64 = 5.0;
/// Width of a latency histogram bin, in seconds.
const BIN_S: f64 = 0.25;

/// A Markdown table from a header and rows of already formatted cells
/// (escaped here). Numeric columns are right-aligned: `numeric(i)` is true for them.
fn table(header: &[&str], numeric: impl Fn(usize) -> bool, rows: &[Vec<String>]) -> String {
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
        if numeric(i) {
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
        table(&["run", ""], |_| false, &rows)
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
    table(&header, |i| i >= 4, &rows)
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
    table(&header, |i| i >= 2, &rows)
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
    table(&header, |i| i >= 1, &rows)
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
    table(&header, |i| i >= 3, &rows)
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
    Some(table(&header, |i| i == 3, &rows))
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
    table(&header, |i| i >= 3, &rows)
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
    table(&header, |i| i >= 1, &rows)
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
    table(&header, |i| i >= 1, &rows)
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
