//! Line charts for the simulator's and the analytical model's results, written with
//! `plotters` as SVG text or PNG files.
//!
//! A [`Chart`] is data only: a title, axis labels, whether each axis is logarithmic, and named
//! [`Series`] of `(x, y)` points where `y` may be missing. A missing `y` (a point where the
//! model saturates, say) breaks the series' line and is marked by a small `×` in the series'
//! colour just above the x axis, one row per series; the legend says so. The y axis leaves
//! room at the top for the legend. [`to_svg`] returns the SVG
//! document as a string and [`to_png`] writes a PNG file.
//!
//! ## Fonts
//!
//! plotters measures text (tick labels, legend, title) with a TrueType font it must be given
//! at run time, for SVG as well as PNG: it keeps registered fonts in a table of its own for the
//! life of the process. The first use registers the first font of [`DEFAULT_FONT_PATHS`] that
//! exists (DejaVu Sans, Debian's `fonts-dejavu-core`, in the usual places), or call
//! [`use_font`] first to choose one. Without a font, drawing fails with
//! [`PlotError::NoFont`] and nothing is written.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Width of the charts, in pixels.
pub const WIDTH: u32 = 900;
/// Height of the charts, in pixels.
pub const HEIGHT: u32 = 560;

/// Where DejaVu Sans lives on Debian/Ubuntu (`fonts-dejavu-core`), Fedora, Arch and openSUSE.
pub const DEFAULT_FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/DejaVuSans.ttf",
];

/// Distinct colours for successive series (Tableau 10), cycled.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// What can go wrong while drawing a chart.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No usable TrueType font: plotters cannot lay out text without one.
    #[error(
        "no TrueType font found (tried {}); install DejaVu Sans (Debian: fonts-dejavu-core)",
        .tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoFont {
        /// The files tried.
        tried: Vec<PathBuf>,
    },
    /// plotters failed to draw or to write the file.
    #[error("cannot draw {target}: {message}")]
    Draw {
        /// `SVG` or the PNG file's path.
        target: String,
        /// What plotters reported.
        message: String,
    },
}

/// One named line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The name shown in the legend.
    pub name: String,
    /// The points in drawing order; a `None` y breaks the line there (e.g. saturation).
    pub points: Vec<(f64, Option<f64>)>,
}

/// A line chart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chart {
    /// Shown above the plot.
    pub title: String,
    /// The x axis' description, with its unit.
    pub x_label: String,
    /// The y axis' description, with its unit.
    pub y_label: String,
    /// Logarithmic x axis (points with x ≤ 0 are left out).
    pub log_x: bool,
    /// Logarithmic y axis (points with y ≤ 0 are left out).
    pub log_y: bool,
    /// The lines, each in its own colour.
    pub series: Vec<Series>,
}

/// The chart as an SVG document.
pub fn to_svg(chart: &Chart) -> Result<String, PlotError> {
    ensure_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        render(&root, chart).map_err(|message| PlotError::Draw {
            target: "SVG".into(),
            message,
        })?;
    }
    Ok(svg)
}

/// Writes the chart as a PNG file at `path`.
pub fn to_png(chart: &Chart, path: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    render(&root, chart).map_err(|message| PlotError::Draw {
        target: path.display().to_string(),
        message,
    })
}

/// The font registered with plotters, if any. plotters' font table is process-wide, so this
/// record of it is too.
static FONT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Registers the first font of `paths` that exists and parses as plotters' `sans-serif`, and
/// returns its path. plotters wants the font's bytes for the life of the process, so each
/// registration keeps one file in memory; registering again replaces the font.
pub fn use_font(paths: &[PathBuf]) -> Result<PathBuf, PlotError> {
    let mut font = FONT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(current) = font.as_ref().filter(|f| paths.first() == Some(f)) {
        return Ok(current.clone());
    }
    for path in paths {
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
            *font = Some(path.clone());
            return Ok(path.clone());
        }
    }
    Err(PlotError::NoFont {
        tried: paths.to_vec(),
    })
}

/// Registers a default font unless one is registered already.
fn ensure_font() -> Result<(), PlotError> {
    if FONT.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
        return Ok(());
    }
    let paths: Vec<PathBuf> = DEFAULT_FONT_PATHS.iter().map(PathBuf::from).collect();
    use_font(&paths).map(|_| ())
}

/// The extent of one axis: the values to fit, or a default when there are none. The y axis
/// (`y`) starts at zero when its values are positive and leaves [`HEADROOM`] above them.
fn extent(values: impl Iterator<Item = f64>, log: bool, y: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        if hi / lo < 1.5 {
            return (lo / 1.5, hi * 1.5);
        }
        return if y {
            (lo / 1.1, hi * (hi / lo).powf(HEADROOM))
        } else {
            (lo / 1.05, hi * 1.05)
        };
    }
    if y && lo >= 0.0 {
        lo = 0.0;
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
        return (lo - pad, hi + pad);
    }
    if y {
        (lo, hi + (hi - lo) * HEADROOM)
    } else {
        let pad = (hi - lo) * 0.02;
        (lo - pad, hi + pad)
    }
}

/// Share of the y range added above the highest point, for the legend.
const HEADROOM: f64 = 0.3;

/// Tick labels without float noise: `64`, `0.5`, `1.2e+06`.
fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), String> {
    let keep_x = |x: f64| x.is_finite() && (!chart.log_x || x > 0.0);
    let xs = extent(
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0)),
        chart.log_x,
        false,
    );
    let ys = extent(
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter(|p| keep_x(p.0)).filter_map(|p| p.1)),
        chart.log_y,
        true,
    );
    match (chart.log_x, chart.log_y) {
        (false, false) => draw(root, chart, xs.0..xs.1, ys.0..ys.1),
        (true, false) => draw(root, chart, (xs.0..xs.1).log_scale(), ys.0..ys.1),
        (false, true) => draw(root, chart, xs.0..xs.1, (ys.0..ys.1).log_scale()),
        (true, true) => draw(
            root,
            chart,
            (xs.0..xs.1).log_scale(),
            (ys.0..ys.1).log_scale(),
        ),
    }
}

fn draw<DB, X, Y>(root: &DrawingArea<DB, Shift>, chart: &Chart, x: X, y: Y) -> Result<(), String>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    let y_bottom = ctx.y_range().start;
    let in_x = |v: f64| v.is_finite() && (!chart.log_x || v > 0.0);
    let in_y = |v: f64| v.is_finite() && (!chart.log_y || v > 0.0);
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;

    for (i, series) in chart.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let line = color.stroke_width(2);
        // Runs of drawable points; a missing or undrawable y ends a run.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let mut gaps = Vec::new();
        for &(px, py) in &series.points {
            match py {
                Some(v) if in_x(px) && in_y(v) => {
                    if let Some(run) = runs.last_mut() {
                        run.push((px, v));
                    }
                }
                _ => {
                    if py.is_none() && in_x(px) {
                        gaps.push(px);
                    }
                    if runs.last().is_some_and(|r| !r.is_empty()) {
                        runs.push(Vec::new());
                    }
                }
            }
        }
        let name = if gaps.is_empty() {
            series.name.clone()
        } else {
            format!("{} (× saturated)", series.name)
        };
        // The first run carries the legend entry, even when empty.
        for (k, run) in runs.iter().enumerate() {
            let drawn = ctx
                .draw_series(LineSeries::new(run.iter().copied(), line))
                .map_err(e)?;
            if k == 0 {
                drawn.label(name.clone()).legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 24, ly)], color.stroke_width(2))
                });
            }
            ctx.draw_series(run.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
        let row = 8 + 10 * i32::try_from(i % 8).unwrap_or(0);
        ctx.draw_series(gaps.iter().map(|&gx| {
            EmptyElement::at((gx, y_bottom)) + Cross::new((0, -row), 4, color.stroke_width(2))
        }))
        .map_err(e)?;
    }

    if !chart.series.is_empty() {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .margin(12)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: Vec<Series>, log_x: bool) -> Chart {
        Chart {
            title: "Figure 6a & <friends>".into(),
            x_label: "proxy hosts N".into(),
            y_label: "mean latency (ms)".into(),
            log_x,
            log_y: false,
            series,
        }
    }

    fn series(name: &str, points: &[(f64, Option<f64>)]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn svg_has_the_title_the_labels_and_every_series_name() {
        let c = chart(
            vec![
                series(
                    "directory",
                    &[(2.0, None), (10.0, Some(31.7)), (30.0, Some(10.4))],
                ),
                series("icp", &[(10.0, None), (30.0, Some(11.2)), (80.0, None)]),
                series("multicast", &[(8.0, Some(30.8)), (30.0, Some(28.1))]),
            ],
            true,
        );
        let svg = to_svg(&c).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        // plotters escapes text for XML.
        assert!(
            svg.contains("Figure 6a &amp; &lt;friends&gt;"),
            "title missing"
        );
        assert!(svg.contains("proxy hosts N") && svg.contains("mean latency (ms)"));
        assert!(svg.contains("directory (× saturated)"));
        assert!(svg.contains("icp (× saturated)"));
        assert!(
            svg.contains(">multicast<") || svg.contains("multicast\n"),
            "multicast"
        );
        // Three distinct series colours.
        for c in &PALETTE[..3] {
            let rgb = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
            assert!(svg.contains(&rgb), "colour {rgb} unused");
        }
    }

    #[test]
    fn empty_and_all_saturated_charts_still_draw() {
        let empty = chart(Vec::new(), false);
        assert!(to_svg(&empty).unwrap().contains("proxy hosts N"));
        let nothing_finite = chart(
            vec![
                series("icp", &[(1.0, None), (2.0, None)]),
                series("nothing", &[]),
            ],
            true,
        );
        let svg = to_svg(&nothing_finite).unwrap();
        assert!(svg.contains("icp (× saturated)") && svg.contains("nothing"));
        let odd = chart(
            vec![series(
                "odd",
                &[
                    (0.0, Some(1.0)),
                    (-1.0, Some(2.0)),
                    (5.0, Some(f64::NAN)),
                    (5.0, Some(3.0)),
                ],
            )],
            true,
        );
        assert!(to_svg(&odd).unwrap().contains("odd"));
    }

    #[test]
    fn png_is_written() {
        let dir = std::env::temp_dir().join(format!("meshcache-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        let c = chart(
            vec![series("directory", &[(1.0, Some(1.0)), (2.0, Some(4.0))])],
            false,
        );
        to_png(&c, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_font_is_a_clear_error() {
        let err = use_font(&[PathBuf::from("/nonexistent/font.ttf")]).unwrap_err();
        assert!(matches!(err, PlotError::NoFont { ref tried } if tried.len() == 1));
        assert!(err.to_string().contains("fonts-dejavu-core"), "{err}");
    }

    #[test]
    fn ticks_read_cleanly() {
        assert_eq!(tick(64.0), "64");
        assert_eq!(tick(0.5), "0.5");
        assert_eq!(tick(10.349), "10.349");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(2e6), "2.0e6");
    }

    #[test]
    fn extents_fit_the_data() {
        assert_eq!(extent([1.0, 3.0].into_iter(), false, true), (0.0, 3.9));
        assert_eq!(extent(std::iter::empty(), true, false), (1.0, 10.0));
        assert_eq!(
            extent([2.0, -1.0, 512.0].into_iter(), true, false),
            (2.0 / 1.05, 512.0 * 1.05)
        );
        assert_eq!(extent([2.0, 52.0].into_iter(), false, false), (1.0, 53.0));
        let (lo, hi) = extent([5.0].into_iter(), false, false);
        assert!(lo < 5.0 && hi > 5.0);
    }
}
