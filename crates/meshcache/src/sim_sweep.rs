//! `meshcache sim sweep`: one spec value over a range, for several protocols; every run's
//! results in `results.json`, a table on standard output, and one graph per measure
//! (`<measure>.svg` and `.png`) with a curve per protocol.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use anyhow::Context;
use meshcache_sim::plot::{self, Chart, Series};
use meshcache_sim::{Protocol, Results};
use serde::Serialize;

use crate::sim::{interrupt_flag, load_spec, load_trace, simulate, write_json, SweepArgs};

/// One point of the sweep.
#[derive(Serialize)]
struct Point {
    protocol: Protocol,
    /// The swept value, as given.
    value: String,
    results: Results,
}

/// What `results.json` holds.
#[derive(Serialize)]
struct Sweep<'a> {
    param: &'a str,
    values: &'a [String],
    points: Vec<Point>,
    /// Ctrl-C ended the sweep: later points are missing, the last one may be partial.
    interrupted: bool,
}

/// A measure graphed against the swept value.
struct Measure {
    file: &'static str,
    title: &'static str,
    y_label: &'static str,
    get: fn(&Results) -> f64,
}

const MEASURES: [Measure; 6] = [
    Measure {
        file: "hit-ratio",
        title: "Hit ratio",
        y_label: "hit ratio (%)",
        get: |r| 100.0 * r.hit_ratio,
    },
    Measure {
        file: "remote-hit-ratio",
        title: "Remote hit ratio",
        y_label: "remote hits (% of requests)",
        get: |r| 100.0 * r.remote_hit_ratio,
    },
    Measure {
        file: "messages",
        title: "Inter-cache messages per request",
        y_label: "protocol messages per request",
        get: |r| r.messages_per_request,
    },
    Measure {
        file: "message-bytes",
        title: "Inter-cache protocol bytes per request",
        y_label: "bytes per request",
        get: |r| r.message_bytes_per_request,
    },
    Measure {
        file: "latency",
        title: "Mean client latency",
        y_label: "latency (ms)",
        get: |r| r.latency_ms.mean,
    },
    Measure {
        file: "load",
        title: "Busiest cache's CPU",
        y_label: "CPU utilisation (%)",
        get: |r| 100.0 * r.max_cpu_utilisation,
    },
];

/// Runs the sweep.
pub fn run(args: SweepArgs) -> anyhow::Result<()> {
    let base = load_spec(&args.input, &[])?;
    let protocols = if args.protocols.is_empty() {
        vec![base.protocol.name]
    } else {
        args.protocols.clone()
    };
    // Every spec first, so that a bad value stops the sweep before any run.
    let mut specs = Vec::new();
    for &protocol in &protocols {
        for value in &args.values {
            let extra = [
                (args.param.clone(), value.clone()),
                (
                    "protocol.name".to_owned(),
                    format!("{:?}", protocol.as_str()),
                ),
            ];
            let spec = load_spec(&args.input, &extra)
                .with_context(|| format!("{} = {value}", args.param))?;
            specs.push((protocol, value.clone(), spec));
        }
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let stop = interrupt_flag();
    let provenance = args.input.provenance();
    let mut points = Vec::new();
    let total = specs.len();
    // The trace depends on the spec only through replay.limit and the origin count: loaded
    // again only when one of those changes.
    let mut loaded: Option<((u64, u32), meshcache_sim::Trace)> = None;
    for (i, (protocol, value, spec)) in specs.into_iter().enumerate() {
        let wanted = (spec.replay.limit, spec.net.origin_servers);
        let trace = match &mut loaded {
            Some((k, t)) if *k == wanted => &*t,
            slot => &slot.insert((wanted, load_trace(&args.input, &spec)?)).1,
        };
        let label = format!("[{}/{total}] {} = {value}, ", i + 1, args.param);
        let results = simulate(&spec, trace, &stop, &label, &provenance)?;
        eprintln!(
            "{label}{}: hit ratio {:.2} %, {:.3} messages/request, latency {:.2} ms, {:.0} requests/s",
            protocol.as_str(),
            100.0 * results.hit_ratio,
            results.messages_per_request,
            results.latency_ms.mean,
            results.requests_per_second
        );
        points.push(Point {
            protocol,
            value,
            results,
        });
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    let interrupted = stop.load(Ordering::Relaxed);
    let sweep = Sweep {
        param: &args.param,
        values: &args.values,
        points,
        interrupted,
    };
    write_json(&args.out.join("results.json"), &sweep)?;
    print!("{}", table(&sweep));
    graphs(&sweep, &protocols, &args.out)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn table(sweep: &Sweep<'_>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| {} | protocol | hit ratio | remote hits | messages/request | bytes/request | latency mean ms | p99 ms | busiest CPU | simulated req/s |",
        sweep.param
    );
    let _ = writeln!(
        s,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for p in &sweep.points {
        let r = &p.results;
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} % | {:.2} % | {:.4} | {:.1} | {:.2} | {:.2} | {:.1} % | {:.0} |",
            p.value,
            p.protocol.as_str(),
            100.0 * r.hit_ratio,
            100.0 * r.remote_hit_ratio,
            r.messages_per_request,
            r.message_bytes_per_request,
            r.latency_ms.mean,
            r.latency_ms.p99,
            100.0 * r.max_cpu_utilisation,
            r.requests_per_second
        );
    }
    s
}

fn graphs(sweep: &Sweep<'_>, protocols: &[Protocol], dir: &std::path::Path) -> anyhow::Result<()> {
    // A numeric axis when every value is a number (else the values' rank).
    let numeric: Option<Vec<f64>> = sweep.values.iter().map(|v| v.trim().parse().ok()).collect();
    let x_of = |value: &str| -> f64 {
        match &numeric {
            Some(_) => value.trim().parse().unwrap_or(0.0),
            None => sweep.values.iter().position(|v| v == value).unwrap_or(0) as f64,
        }
    };
    let log_x = numeric.as_ref().is_some_and(|v| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0_f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        lo > 0.0 && hi / lo >= 20.0
    });
    for m in &MEASURES {
        let series = protocols
            .iter()
            .map(|&proto| Series {
                name: proto.as_str().to_owned(),
                points: sweep
                    .points
                    .iter()
                    .filter(|p| p.protocol == proto)
                    .map(|p| (x_of(&p.value), Some((m.get)(&p.results))))
                    .collect(),
            })
            .collect();
        let chart = Chart {
            title: format!("{} vs {}", m.title, sweep.param),
            x_label: sweep.param.to_owned(),
            y_label: m.y_label.to_owned(),
            log_x,
            log_y: false,
            series,
        };
        let svg = match plot::to_svg(&chart) {
            Ok(svg) => svg,
            Err(e @ plot::PlotError::NoFont { .. }) => {
                eprintln!("meshcache: graphs not drawn ({e}); results.json and the table are");
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("graph {}", m.file)),
        };
        std::fs::write(dir.join(format!("{}.svg", m.file)), svg)
            .with_context(|| format!("cannot write {}.svg", m.file))?;
        plot::to_png(&chart, &dir.join(format!("{}.png", m.file)))
            .with_context(|| format!("graph {}.png", m.file))?;
    }
    Ok(())
}
