//! Small pieces of SVG written by hand: escaping, a time scale, axis ticks, fault bands.

use std::fmt::Write;

use super::history::FaultView;

/// Text for HTML and SVG.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Seconds `from..to` onto pixels `left..left + width`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    pub(crate) from: f64,
    pub(crate) to: f64,
    pub(crate) left: f64,
    pub(crate) width: f64,
}

impl Scale {
    /// `t` in pixels, clamped to the scale's ends.
    pub(crate) fn x(&self, t: f64) -> f64 {
        let span = (self.to - self.from).max(1e-9);
        self.left + ((t - self.from) / span).clamp(0.0, 1.0) * self.width
    }

    /// Whether `a..b` shows on this scale.
    pub(crate) fn overlaps(&self, a: f64, b: f64) -> bool {
        b >= self.from && a <= self.to
    }
}

/// A round step near `span / count` (1, 2 or 5 times a power of ten).
pub(crate) fn step(span: f64, count: f64) -> f64 {
    let raw = (span / count).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// Vertical grid lines and their labels (seconds) along `sc`, from `top` to `bottom`.
pub(crate) fn time_axis(out: &mut String, sc: Scale, top: f64, bottom: f64) {
    let st = step(sc.to - sc.from, 10.0);
    let mut t = (sc.from / st).ceil() * st;
    while t <= sc.to + 1e-9 {
        let x = sc.x(t);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{x:.1}" x2="{x:.1}" y1="{top:.1}" y2="{bottom:.1}"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}s</text>"#,
            bottom + 11.0,
            trim(t)
        );
        t += st;
    }
}

/// A number of seconds without trailing zeros.
pub(crate) fn trim(t: f64) -> String {
    let s = format!("{t:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The fault's class: faults of the server (they break leases on purpose), of one worker, or
/// of everybody's links.
pub(crate) fn fault_class(f: &FaultView) -> &'static str {
    if f.server_side {
        "fs"
    } else if f.worker.is_some() {
        "fw"
    } else {
        "fa"
    }
}

/// A fault's tooltip.
pub(crate) fn fault_title(f: &FaultView) -> String {
    let mut s = format!(
        "{} from {:.3} s for {:.0} ms",
        f.kind,
        f.start,
        (f.end - f.start) * 1e3
    );
    if let Some(w) = f.worker {
        let _ = write!(s, ", worker {w}");
    }
    if let Some(n) = f.holder {
        let _ = write!(s, ", holder op {n}");
    }
    if f.server_side {
        s.push_str(" (server-side)");
    }
    esc(&s)
}

/// Bands for every fault on `sc`, from `top` to `bottom` (at least 2 px wide, so an instant
/// fault such as a kill shows).
pub(crate) fn fault_bands(
    out: &mut String,
    faults: &[FaultView],
    sc: Scale,
    top: f64,
    bottom: f64,
) {
    for f in faults.iter().filter(|f| sc.overlaps(f.start, f.end)) {
        let (a, b) = (sc.x(f.start), sc.x(f.end));
        let _ = write!(
            out,
            r#"<rect class="{}" x="{a:.1}" y="{top:.1}" width="{:.1}" height="{:.1}"><title>{}</title></rect>"#,
            fault_class(f),
            (b - a).max(2.0),
            bottom - top,
            fault_title(f)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(step(12.0, 10.0), 2.0);
        assert_eq!(step(60.0, 10.0), 10.0);
        assert_eq!(step(5.0, 10.0), 0.5);
        assert_eq!(trim(2.5), "2.5");
        assert_eq!(trim(3.0), "3");
        assert_eq!(esc("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
    }

    #[test]
    fn the_scale_clamps() {
        let sc = Scale {
            from: 10.0,
            to: 20.0,
            left: 50.0,
            width: 100.0,
        };
        assert_eq!(sc.x(15.0), 100.0);
        assert_eq!(sc.x(0.0), 50.0);
        assert_eq!(sc.x(99.0), 150.0);
        assert!(sc.overlaps(5.0, 10.0) && !sc.overlaps(20.5, 30.0));
    }
}
