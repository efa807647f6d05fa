//! Tests of the lab's reports on a hand-built [`Results`]: two groups, one
//! shaped like the Summary Cache paper's Table 2 (so the overheads can be
//! checked against the paper's), one like the hierarchy evaluation's four
//! topologies with repetitions and a Squid configuration.

use std::path::Path;

use meshcache_lab::report::{
    self, aggregate, bins_table, escape_cell, fmt_ms, fmt_overhead, fmt_pct, hierarchy_table,
    latency_table, median, overhead_pct, overhead_table, paired_cpu_table, PairedCpu,
    ReportOptions,
};
use meshcache_lab::results::{ConfigResult, LatencySummary, Machine, NodeResult, Results};

/// A node that reports its CPU split: `client` of its `cpu` seconds on clients.
fn node(name: &str, role: &str, cpu: f64, client: f64) -> NodeResult {
    NodeResult {
        name: name.into(),
        role: role.into(),
        client_requests: 1000,
        local_hits: 250,
        cpu_user_s: cpu * 0.6,
        cpu_sys_s: cpu * 0.4,
        client_s: client,
        peer_s: (cpu - client) / 2.0,
        search_s: (cpu - client) / 4.0,
        overhead_s: (cpu - client) / 4.0,
        ..NodeResult::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn config(
    group: &str,
    name: &str,
    baseline: bool,
    latency_mean: f64,
    user: f64,
    sys: f64,
    udp: u64,
    tcp: u64,
) -> ConfigResult {
    let parts: Vec<&str> = name.split('/').collect();
    ConfigResult {
        name: name.into(),
        group: group.into(),
        baseline,
        product: parts[0].into(),
        protocol: parts[1].into(),
        topology: parts[2].into(),
        seed: 7,
        requests: 24_000,
        wall_s: 60.0,
        req_per_s: 400.0,
        hit_ratio: 0.25,
        local_hit_ratio: 0.25,
        byte_hit_ratio: 0.2,
        inherent_hit_ratio: 0.25,
        latency_ms: LatencySummary {
            mean: latency_mean,
            median: latency_mean * 0.8,
            p95: latency_mean * 3.0,
            p99: latency_mean * 5.0,
            truncated_mean: latency_mean,
            truncated_share: 1.0,
            tail_mean: 0.0,
        },
        latency_cdf: vec![
            (latency_mean * 0.2, 0.01),
            (latency_mean * 0.5, 0.2),
            (latency_mean * 0.8, 0.5),
            (latency_mean * 2.0, 0.9),
            (latency_mean * 5.0, 0.99),
            (latency_mean * 9.0, 1.0),
        ],
        cpu_user_s: user,
        cpu_sys_s: sys,
        udp_messages: udp,
        udp_datagrams_netns: 0,
        origin_requests: 0,
        tcp_messages: tcp,
        intercache_messages_per_request: udp as f64 / 24_000.0,
        efficiency: 0.6,
        nodes: vec![
            node("c1", "sibling", 10.0, 6.0),
            node("c2", "sibling", 10.0, 6.0),
        ],
        ..ConfigResult::default()
    }
}

/// A configuration of the hierarchy group, with latencies at the 0.25 s scale.
fn hier(name: &str, rep: u32, hit: f64, eff: f64, mean: f64) -> ConfigResult {
    let mut c = config(
        "hierarchy",
        name,
        name == "meshcache/icp/4.0",
        mean,
        5.0,
        3.0,
        900,
        50_000,
    );
    c.repetition = rep;
    c.hit_ratio = hit;
    c.local_hit_ratio = hit * 0.5;
    c.sibling_hit_ratio = hit * 0.3;
    c.parent_hit_ratio = hit * 0.2;
    c.efficiency = eff;
    c.latency_ms.truncated_share = 0.9;
    c.latency_ms.tail_mean = 7_500.0;
    // 0.25 s bins: upper edge, count (one request in the ≥ 5 s tail).
    c.latency_bins = vec![
        (0.25, 10),
        (0.5, 40),
        (0.75, 30),
        (1.0, 10),
        (5.25, 0),
        (7.5, 10),
    ];
    c.nodes = vec![
        node("child-1", "child", 20.0, 20.0 * eff),
        node("parent-1", "parent", 20.0, 20.0 * eff),
    ];
    if c.product == "squid" {
        for n in &mut c.nodes {
            n.client_s = 0.0;
            n.peer_s = 0.0;
            n.search_s = 0.0;
            n.overhead_s = n.cpu_user_s + n.cpu_sys_s;
        }
        c.efficiency = 0.0;
    }
    c
}

fn sample() -> Results {
    let g = "summary cache | exp 1";
    let mut configs = vec![
        // The paper's Table 2, experiment 1 (latencies read as ms here).
        config(
            g,
            "meshcache/none/4.0",
            true,
            2.75,
            94.42,
            133.65,
            615,
            334_000,
        ),
        config(
            g,
            "meshcache/icp/4.0",
            false,
            3.07,
            116.87,
            146.50,
            54_774,
            328_000,
        ),
        config(
            g,
            "meshcache/digest/4.0",
            false,
            2.85,
            95.07,
            134.61,
            1_079,
            330_000,
        ),
    ];
    configs.push(hier("meshcache/icp/4.0", 0, 0.40, 0.55, 300.0));
    // Three repetitions: medians are 0.32 hit ratio and 320 ms.
    configs.push(hier("meshcache/icp/3.1", 0, 0.30, 0.60, 280.0));
    configs.push(hier("meshcache/icp/3.1", 1, 0.34, 0.64, 360.0));
    configs.push(hier("meshcache/icp/3.1", 2, 0.32, 0.62, 320.0));
    configs.push(hier("meshcache/icp/2.2", 0, 0.33, 0.66, 310.0));
    configs.push(hier("meshcache/icp/2.2.dom", 0, 0.35, 0.70, 305.0));
    configs.push(hier("squid/icp/4.0", 0, 0.39, 0.0, 330.0));
    Results {
        experiment: "report-test".into(),
        experiment_toml: "name = \"report-test\"\n".into(),
        revision: "v0.1-3-gabcdef".into(),
        seed: 42,
        started: "2026-11-23T00:00:00Z".into(),
        duration_s: 1234.5,
        machine: Machine {
            cpu: "Test CPU".into(),
            cores: 2,
            kernel: "6.1.0".into(),
            own_netns: true,
            steal_pct: 0.25,
        },
        configs,
        concurrent: false,
    }
}

/// The table line right after the one whose first cell is `name`.
fn line_after<'a>(table: &'a str, name: &str) -> &'a str {
    let lines: Vec<&str> = table.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with(&format!("| {name} |")))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    lines[i + 1]
}

fn cells(line: &str) -> Vec<String> {
    line.trim_matches('|')
        .split(" | ")
        .map(|c| c.trim().to_string())
        .collect()
}

#[test]
fn number_formats() {
    assert_eq!(fmt_pct(0.25), "25.0%");
    assert_eq!(fmt_pct(0.12345), "12.3%");
    assert_eq!(fmt_ms(2.75), "2.75");
    assert_eq!(fmt_ms(0.5234), "0.523");
    assert_eq!(fmt_ms(116.87), "116.9");
    assert_eq!(fmt_overhead(overhead_pct(2.75, 3.07)), "+11.6%");
    assert_eq!(fmt_overhead(overhead_pct(334.0, 328.0)), "-1.8%");
    assert_eq!(fmt_overhead(overhead_pct(10.0, 10.0)), "0.0%");
    assert_eq!(fmt_overhead(overhead_pct(0.0, 5.0)), "n/a");
    assert_eq!(escape_cell("a|b\nc"), "a\\|b c");
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
}

#[test]
fn overhead_rows_match_the_paper() {
    let groups = aggregate(&sample());
    assert_eq!(groups.len(), 2);
    let t = overhead_table(&groups[0]);
    // Columns after the name/product/protocol/topology cells: hit ratio,
    // mean, p50, p99, user, sys, UDP, TCP, inter-cache/req, req/s.
    let icp = cells(line_after(&t, "meshcache/icp/4.0"));
    assert_eq!(icp[0], "overhead");
    assert_eq!(icp[4], "0.0 pt", "hit ratio unchanged");
    assert_eq!(icp[5], "+11.6%", "latency 2.75 → 3.07 as in Table 2");
    assert_eq!(icp[8], "+23.8%", "user CPU");
    assert_eq!(icp[9], "+9.6%", "system CPU");
    assert_eq!(icp[10], "+8806.3%", "UDP messages");
    assert_eq!(icp[11], "-1.8%", "TCP messages");
    assert_eq!(icp[13], "0.0%", "req/s");
    let digest = cells(line_after(&t, "meshcache/digest/4.0"));
    assert_eq!(digest[5], "+3.6%");
    assert_eq!(digest[8], "+0.7%");
    assert_eq!(digest[10], "+75.4%");
    // No overhead row under the baseline; the baseline is marked.
    let base = cells(line_after(&t, "meshcache/none/4.0 (baseline)"));
    assert_eq!(base[0], "meshcache/icp/4.0");
    // The Markdown carries the same table, with the group name escaped.
    let md = report::markdown(&sample());
    assert!(md.contains(&t), "{md}");
    assert!(md.contains("## Group summary cache \\| exp 1"), "{md}");
    for row in t.lines() {
        assert_eq!(row.matches(" | ").count(), 13, "{row}");
    }
}

#[test]
fn header_says_where_the_run_happened() {
    let md = report::markdown(&sample());
    for s in [
        "# Experiment report-test",
        "| revision | v0.1-3-gabcdef |",
        "| seed | 42 |",
        "| started | 2026-11-23T00:00:00Z |",
        "| duration | 1234.5 s |",
        "Test CPU, 2 cores, kernel 6.1.0",
        "| network namespace | own",
    ] {
        assert!(md.contains(s), "missing {s:?} in\n{md}");
    }
}

#[test]
fn repetitions_are_folded_into_medians() {
    let groups = aggregate(&sample());
    let h = &groups[1];
    assert_eq!(h.rows.len(), 5, "three repetitions make one row");
    let r = &h.rows[1];
    assert_eq!(r.repetitions, 3);
    assert!((r.config.hit_ratio - 0.32).abs() < 1e-9);
    assert!((r.config.latency_ms.mean - 320.0).abs() < 1e-9);
    // Bins are pooled: 3 × 10 requests in the first bin.
    assert_eq!(r.config.latency_bins[0], (0.25, 30));

    let t = hierarchy_table(h);
    let row = cells(
        t.lines()
            .find(|l| l.starts_with("| meshcache/icp/3.1 |"))
            .unwrap_or_default(),
    );
    assert_eq!(row[4], "32.0%", "median hit ratio");
    assert_eq!(row[7], "62.0%", "median efficiency");
    let squid = cells(
        t.lines()
            .find(|l| l.starts_with("| squid/icp/4.0 |"))
            .unwrap_or_default(),
    );
    assert_eq!(squid[7], "n/a");

    let lat = latency_table(h);
    assert!(
        lat.contains("| meshcache/icp/3.1 | 24000 | 0 | 256.0 | 320.0 | 90.0% | 7500.0 |"),
        "{lat}"
    );
    let md = report::markdown(&sample());
    assert!(
        md.contains("the median over a configuration's repetitions"),
        "{md}"
    );
}

/// Five interleaved rounds of a baseline and one protocol: the machine drifts between rounds
/// (the baseline from 2.0 to 2.8 s); the protocol costs 5 % more in every round but one.
fn drifting_rounds() -> Results {
    let mut results = sample();
    results.configs.clear();
    let base = [2.0, 2.2, 2.4, 2.6, 2.8];
    let over = [5.0, 5.0, -1.0, 5.0, 5.0];
    for (rep, (&b, &o)) in base.iter().zip(&over).enumerate() {
        for (name, cpu) in [
            ("meshcache/none/4.0", b),
            ("meshcache/summary/4.0", b * (1.0 + o / 100.0)),
        ] {
            let mut c = config("cpu", name, name.contains("none"), 40.0, 1.0, 1.0, 0, 0);
            c.repetition = rep as u32;
            c.cpu_exact_s = Some(cpu);
            results.configs.push(c);
        }
    }
    results
}

#[test]
fn cpu_overheads_are_paired_round_by_round() {
    let groups = aggregate(&drifting_rounds());
    let g = &groups[0];
    let rounds = &g.rows[1].cpu_rounds;
    assert_eq!(rounds.len(), 5);
    let p = PairedCpu::new(&g.rows[0].cpu_rounds, rounds).expect("paired");
    assert_eq!(p.rounds.len(), 5);
    for (got, want) in p.rounds.iter().zip([5.0, 5.0, -1.0, 5.0, 5.0]) {
        assert!((got - want).abs() < 1e-9, "{got} {want}");
    }
    // The medians of each configuration's CPU alone (2.4 and 2.52 s) hide nothing here, but
    // the pairing is what takes the drift out: the median of the pairs is exactly 5 %.
    assert!((p.median - 5.0).abs() < 1e-9);
    // Five rounds: the sign test's interval is [min, max] at 1 − 2/32 = 93.75 %.
    let (lo, hi) = p.interval.expect("five rounds make an interval");
    assert!((lo + 1.0).abs() < 1e-9 && (hi - 5.0).abs() < 1e-9);
    assert!((p.confidence - 0.9375).abs() < 1e-12);

    let t = paired_cpu_table(g).expect("a baseline with rounds");
    let row = cells(line_after(&t, "meshcache/none/4.0 (baseline)"));
    assert_eq!(row[0], "meshcache/summary/4.0");
    assert_eq!(row[2], "+5.0%, +5.0%, -1.0%, +5.0%, +5.0%");
    assert_eq!(row[3], "+5.0%");
    assert_eq!(row[4], "-1.0% to +5.0% (93 %)");
    let md = report::markdown(&drifting_rounds());
    assert!(
        md.contains("### CPU against the baseline, round by round"),
        "{md}"
    );
}

#[test]
fn paired_intervals_need_five_rounds_and_narrow_with_more() {
    let pairs = |n: u32| -> Vec<(u32, f64)> { (0..n).map(|r| (r, 1.0)).collect() };
    // Rounds 1.00, 1.01, … 1.0(n−1) against 1.0: overheads 0 %, 1 %, … (n − 1) %.
    let rounds =
        |n: u32| -> Vec<(u32, f64)> { (0..n).map(|r| (r, 1.0 + f64::from(r) / 100.0)).collect() };
    let four = PairedCpu::new(&pairs(4), &rounds(4)).expect("paired");
    assert_eq!(four.interval, None, "[min, max] of 4 holds only 87.5 %");
    let ten = PairedCpu::new(&pairs(10), &rounds(10)).expect("paired");
    // k = 2: 1 − 2 · 11/1024 ≈ 97.9 % (k = 3 would be 89 %).
    let (lo, hi) = ten.interval.expect("interval");
    assert!(
        (lo - 1.0).abs() < 1e-9 && (hi - 8.0).abs() < 1e-9,
        "{lo} {hi}"
    );
    assert!((ten.confidence - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
    // Rounds the baseline lacks are left out.
    let some = PairedCpu::new(&pairs(2), &rounds(5)).expect("paired");
    assert_eq!(some.rounds.len(), 2);
    assert!(PairedCpu::new(&[], &rounds(3)).is_none());
}

#[test]
fn latency_bins_only_where_latencies_reach_a_quarter_second() {
    let results = sample();
    let groups = aggregate(&results);
    let bins = bins_table(&groups[1]);
    // 100 requests per repetition: 40 in the second bin, 10 at 7.5 s.
    assert!(bins.contains("| 0.25–0.50 | 40.0% | 40.0% |"), "{bins}");
    assert!(bins.contains("| ≥ 5.00 | 10.0% |"), "{bins}");
    assert!(
        bins.contains("| 1.00–5.00 | 0.0% |"),
        "empty bins folded: {bins}"
    );
    // Half the requests are in the first two bins: the median is the 50th.
    assert!(bins.contains("| median bin | 0.25–0.50 |"), "{bins}");
    let md = report::markdown(&results);
    assert_eq!(md.matches("### Latency in 0.25 s bins").count(), 1, "{md}");
}

#[test]
fn cpu_breakdown_per_node_with_na_for_squid() {
    let md = report::markdown(&sample());
    for row in [
        "| meshcache/icp/2.2.dom | child-1 | child | 20.00 | 70.0% | 15.0% | 7.5% | 7.5% |",
        // Three repetitions pooled: 60 s of which 37.2 s on clients.
        "| meshcache/icp/3.1 | parent-1 | parent | 60.00 | 62.0% |",
        "| squid/icp/4.0 | child-1 | child | 20.00 | n/a | n/a | n/a | n/a |",
    ] {
        assert!(md.contains(row), "missing {row:?} in\n{md}");
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn write_all_writes_json_markdown_and_graphs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let results = sample();
    let written = report::write_all(&results, dir.path()).expect("report written");

    // results.json parses back with the same key figures.
    let back: Results =
        serde_json::from_str(&read(&dir.path().join("results.json"))).expect("json");
    assert_eq!(back.experiment, results.experiment);
    assert_eq!(back.seed, 42);
    assert_eq!(back.configs.len(), results.configs.len());
    for (a, b) in back.configs.iter().zip(&results.configs) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.baseline, b.baseline);
        assert_eq!(a.latency_ms.mean, b.latency_ms.mean);
        assert_eq!(a.udp_messages, b.udp_messages);
        assert_eq!(a.latency_bins, b.latency_bins);
        assert_eq!(a.nodes.len(), b.nodes.len());
    }
    assert_eq!(
        read(&dir.path().join("results.md")),
        report::markdown(&results)
    );

    // The SVGs carry every plotted configuration's label.
    let heg = read(&dir.path().join("heg.svg"));
    assert!(heg.starts_with("<svg"));
    for name in [
        "meshcache/icp/3.1",
        "meshcache/icp/2.2.dom",
        "meshcache/none/4.0",
    ] {
        assert!(
            heg.contains(&format!(">{name}</text>")),
            "{name} not on the HEG"
        );
    }
    assert!(!heg.contains(">squid/icp/4.0<"), "Squid has no efficiency");
    assert!(written.warnings.iter().any(|w| w.contains("squid/icp/4.0")));
    // Two groups: one latency graph each, named after the group.
    let hier = read(&dir.path().join("latency-hierarchy.svg"));
    let exp1 = read(&dir.path().join("latency-summary_cache___exp_1.svg"));
    assert!(hier.contains(">squid/icp/4.0</text>") && hier.contains(">meshcache/icp/2.2</text>"));
    assert!(exp1.contains(">meshcache/digest/4.0</text>"));
    assert!(!dir.path().join("latency.svg").exists());

    let pngs = [
        "heg.png",
        "latency-hierarchy.png",
        "latency-summary_cache___exp_1.png",
    ];
    if written
        .warnings
        .iter()
        .any(|w| w.contains("no TrueType font"))
    {
        eprintln!(
            "note: no font installed, PNGs not checked: {:?}",
            written.warnings
        );
        return;
    }
    for png in pngs {
        let bytes = std::fs::read(dir.path().join(png)).expect("png written");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png} is not a PNG");
        assert_eq!(&bytes[12..16], b"IHDR");
        let w = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
        let h = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
        assert_eq!((w, h), (1000, 700));
    }
    if let Some(out) = std::env::var_os("REPORT_TEST_OUT") {
        // For looking at the graphs by eye.
        for f in &written.files {
            let _ = std::fs::copy(f, Path::new(&out).join(f.file_name().unwrap_or_default()));
        }
    }
}

#[test]
fn without_a_font_the_svgs_are_written_and_the_pngs_skipped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut results = sample();
    results.configs.retain(|c| c.group == "hierarchy");
    let options = ReportOptions {
        font_paths: vec![dir.path().join("no-such-font.ttf")],
    };
    let written = report::write_all_with(&results, dir.path(), &options).expect("report written");
    assert!(dir.path().join("heg.svg").exists());
    assert!(
        dir.path().join("latency.svg").exists(),
        "one group: one latency.svg"
    );
    assert!(!dir.path().join("heg.png").exists());
    assert!(!dir.path().join("latency.png").exists());
    assert!(
        written
            .warnings
            .iter()
            .any(|w| w.contains("no TrueType font")),
        "{:?}",
        written.warnings
    );
}

#[test]
fn empty_results_still_make_a_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let results = Results::default();
    let options = ReportOptions { font_paths: vec![] };
    report::write_all_with(&results, dir.path(), &options).expect("report written");
    let md = read(&dir.path().join("results.md"));
    assert!(md.starts_with("# Experiment unknown"), "{md}");
    assert!(read(&dir.path().join("heg.svg")).contains("no configuration reported a CPU breakdown"));
    assert!(read(&dir.path().join("latency.svg")).contains("no latency data"));
}
