//! `meshcache sim model`: the directory-based DCM paper's analytical model (its §5, Table 1
//! and Figure 6), computed by `meshcache_sim::model`.
//!
//! Writes into `--out` (default `target/sim-model`):
//!
//! | file | what |
//! | --- | --- |
//! | `model.json` | the parameters, the breakdown of each family at those parameters, and every curve (the source of truth) |
//! | `figure6a.svg`, `.png` | mean latency per request against the number of proxy hosts |
//! | `figure6b.svg`, `.png` | … against the number of client hosts |
//! | `figure6c.svg`, `.png` | … against the Web object size |
//!
//! and prints the curves as tables, in milliseconds, with `saturated:<resource>` where a
//! resource's utilisation reaches 1. `--set KEY=VALUE` overrides a parameter of Table 1 for
//! every panel (a panel's own axis still sweeps its range).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use meshcache_sim::model::{self, Axis, Breakdown, Curve, Family, Latency, ModelParams, Resource};
use meshcache_sim::plot::{self, Chart, PlotError, Series};
use serde::Serialize;

/// Which panel of Figure 6 to compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AxisArg {
    /// Figure 6a: the number of proxy hosts.
    Proxies,
    /// Figure 6b: the number of client hosts.
    Clients,
    /// Figure 6c: the Web object size.
    Size,
    /// All three.
    All,
}

/// Arguments of `sim model`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// The panel(s) of Figure 6 to compute.
    #[arg(long, value_enum, default_value = "all")]
    pub axis: AxisArg,
    /// Override a model parameter (a Table 1 field of the model, e.g. `proxies=64`,
    /// `object_size=20KiB`, `network_bandwidth="2 Gbit/s"`, `timeout=20ms`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Output directory.
    #[arg(long, default_value = "target/sim-model")]
    pub out: PathBuf,
}

/// `model.json`.
#[derive(Serialize)]
struct Output<'a> {
    /// Where the model comes from.
    model: &'static str,
    /// The version of meshcache that computed it.
    version: &'static str,
    /// `git describe --always --dirty` of the working directory, or "unknown".
    revision: String,
    params: &'a ModelParams,
    /// Each family at `params`: loads, utilisations and the timing of the three outcomes.
    breakdown: Vec<Breakdown>,
    figures: Vec<Figure>,
}

/// One panel.
#[derive(Serialize)]
struct Figure {
    figure: &'static str,
    axis: Axis,
    x_label: &'static str,
    curves: Vec<Curve>,
}

/// Runs the command.
pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    let mut params = ModelParams::default();
    for item in &args.set {
        let Some((key, value)) = item.split_once('=') else {
            bail!("--set wants KEY=VALUE, got {item:?}");
        };
        params.set(key.trim(), value)?;
    }
    params.validate()?;
    let axes: Vec<Axis> = match args.axis {
        AxisArg::Proxies => vec![Axis::Proxies],
        AxisArg::Clients => vec![Axis::Clients],
        AxisArg::Size => vec![Axis::ObjectSize],
        AxisArg::All => Axis::ALL.to_vec(),
    };

    let mut figures = Vec::new();
    for axis in axes {
        let curves = model::sweep(&params, axis, &axis.default_values())?;
        figures.push(Figure {
            figure: axis.figure(),
            axis,
            x_label: axis.label(),
            curves,
        });
    }
    let breakdown = Family::ALL
        .iter()
        .map(|&f| model::breakdown(&params, f))
        .collect::<Result<Vec<_>, _>>()?;

    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let output = Output {
        model: "directory-based DCM paper, section 5 (Table 1, Figure 6)",
        version: env!("CARGO_PKG_VERSION"),
        revision: crate::lab_run::revision_of(std::path::Path::new(".")),
        params: &params,
        breakdown,
        figures,
    };
    let mut json = serde_json::to_string_pretty(&output)?;
    json.push('\n');
    write(&out.join("model.json"), json.as_bytes())?;

    let mut warnings = Vec::new();
    for figure in &output.figures {
        let chart = chart(figure);
        let stem = figure.figure;
        match plot::to_svg(&chart) {
            Ok(svg) => {
                write(&out.join(format!("{stem}.svg")), svg.as_bytes())?;
                let png = out.join(format!("{stem}.png"));
                plot::to_png(&chart, &png).with_context(|| format!("writing {}", png.display()))?;
            }
            Err(e @ PlotError::NoFont { .. }) => {
                warnings.push(format!("graphs not drawn: {e}"));
                break;
            }
            Err(e) => return Err(e).with_context(|| format!("drawing {stem}")),
        }
    }

    print_params(&params);
    for figure in &output.figures {
        println!();
        print_table(figure);
    }
    println!();
    println!("wrote {}", out.display());
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The legend name of a family: ours and the paper's.
fn series_name(f: Family) -> String {
    format!("{} ({})", f.as_str(), f.paper_name())
}

fn chart(figure: &Figure) -> Chart {
    let panel = figure.figure.trim_start_matches("figure");
    Chart {
        title: format!(
            "Figure {panel}: mean latency per request against {} (analytical model)",
            figure.x_label
        ),
        x_label: figure.x_label.to_string(),
        y_label: "mean latency per request (ms)".into(),
        log_x: figure.axis.log_x(),
        log_y: false,
        series: figure
            .curves
            .iter()
            .map(|c| Series {
                name: series_name(c.family),
                points: c.points.iter().map(|p| (p.x, p.latency.millis())).collect(),
            })
            .collect(),
    }
}

fn cell(latency: Latency) -> String {
    match latency {
        Latency::Finite(s) => format!("{:.2}", s * 1e3),
        Latency::Saturated { resource } => format!(
            "saturated:{}",
            match resource {
                Resource::ProxyHosts => "proxy",
                Resource::Network => "net",
                Resource::ServerHosts => "server",
                Resource::ClientHosts => "client",
            }
        ),
    }
}

fn print_params(params: &ModelParams) {
    let defaults = ModelParams::default();
    if *params == defaults {
        println!("parameters: Table 1 of the paper");
        return;
    }
    // The fields that differ from Table 1, as they would be written in a file.
    let table = |p: &ModelParams| toml::Value::try_from(p).ok();
    if let (Some(toml::Value::Table(ours)), Some(toml::Value::Table(paper))) =
        (table(params), table(&defaults))
    {
        let changed: Vec<String> = ours
            .iter()
            .filter(|(k, v)| paper.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        println!(
            "parameters: Table 1 of the paper, except {}",
            changed.join(", ")
        );
    }
}

fn print_table(figure: &Figure) {
    println!(
        "{}: mean latency per request (ms) against {}",
        figure.figure, figure.x_label
    );
    let width = 18;
    print!("{:>10}", figure.axis.as_str());
    for c in &figure.curves {
        print!(" {:>width$}", c.family.as_str());
    }
    println!();
    let rows = figure.curves.first().map_or(0, |c| c.points.len());
    for i in 0..rows {
        let x = figure.curves[0].points[i].x;
        print!("{:>10}", format!("{x}"));
        for c in &figure.curves {
            print!(" {:>width$}", cell(c.points[i].latency));
        }
        println!();
    }
}
