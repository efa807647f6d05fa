//! The graphs laid out once, in pixels: the Hit Ratio Efficiency Graph and the latency CDFs.

use super::group::{aggregate, efficiency, Group, Row};
use crate::results::Results;

pub(super) type Rgb = (u8, u8, u8);

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
pub(super) enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Clone, Debug)]
pub(super) enum Item {
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
    pub(super) width: f64,
    pub(super) height: f64,
    pub(super) items: Vec<Item>,
}

/// An estimate of a text's width in pixels (DejaVu Sans averages a little
/// over half an em per character; this errs on the wide side).
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.6
}

impl Figure {
    /// A note centred in `area`, for a graph with nothing to draw.
    fn note(&mut self, area: &Area, text: &str) {
        let centre = (
            (area.left + area.right) / 2.0,
            (area.top + area.bottom) / 2.0,
        );
        self.text(centre, text, LABEL_FONT, Anchor::Middle);
    }

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
pub(super) fn heg_missing(groups: &[Group]) -> Vec<String> {
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
        fig.note(&area, "no configuration reported a CPU breakdown");
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

pub(super) fn group_label(name: &str) -> String {
    if name.is_empty() {
        "(no group)".into()
    } else {
        name.to_string()
    }
}

/// File stems of the latency graphs, with the index of their group.
pub(super) fn latency_stems(groups: &[Group]) -> Vec<(String, usize)> {
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
        fig.note(&area, "no latency data");
    }
    fig.legend(&area, &legend, &obstacles);
    fig
}
