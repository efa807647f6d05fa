//! Number formatting shared by the tables and the graphs.

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

pub(super) fn one_decimal(x: f64) -> String {
    let s = format!("{x:.1}");
    if s == "-0.0" {
        "0.0".into()
    } else {
        s
    }
}

pub(super) fn signed(x: f64, unit: &str) -> String {
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
