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

use std::path::{Path, PathBuf};

use crate::results::Results;

mod error;
mod figure;
mod format;
mod group;
mod markdown;
mod render;

use figure::heg_missing;
use render::load_font;

pub use error::ReportError;
pub use figure::{heg_figure, heg_svg, latency_figures, latency_svgs, Figure};
pub use format::{escape_cell, fmt_ms, fmt_overhead, fmt_pct, overhead_pct};
pub use group::{aggregate, efficiency, median, reports_breakdown, Group, PairedCpu, Row};
pub use markdown::{
    bins_table, cooperation_table, cpu_table, group_markdown, header_markdown, hierarchy_table,
    latency_table, markdown, nodes_table, overhead_table, paired_cpu_table, reaches_bin_scale,
};

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
