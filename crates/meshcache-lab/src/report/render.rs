//! The laid-out graphs written out: SVG by hand, PNG through plotters' bitmap backend.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::error::ReportError;
use super::figure::{Anchor, Figure, Item, Rgb};

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
    /// plotters (see `write_all_with`); text is drawn in `sans-serif`.
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
pub(super) fn load_font(paths: &[PathBuf]) -> Option<PathBuf> {
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
