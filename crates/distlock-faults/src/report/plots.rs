//! Latency and throughput over the run, with the faults' windows shaded behind them.

use std::fmt::Write;

use super::history::{End, RunView};
use super::svg::{Scale, fault_bands, step, time_axis, trim};

const WIDTH: f64 = 1320.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 8.0;
const PLOT: f64 = 170.0;
const AXIS: f64 = 18.0;
/// More points than this are thinned to one in k.
const MAX_POINTS: usize = 6000;

fn frame(v: &RunView) -> (String, Scale) {
    let height = TOP + PLOT + AXIS + 4.0;
    let sc = Scale {
        from: 0.0,
        to: v.length.max(1e-3),
        left: LEFT,
        width: WIDTH - LEFT - RIGHT,
    };
    let mut out = format!(
        r#"<svg class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg"><rect class="pane" x="{LEFT}" y="{TOP}" width="{:.1}" height="{PLOT}"/>"#,
        sc.width
    );
    fault_bands(&mut out, &v.faults, sc, TOP, TOP + PLOT);
    time_axis(&mut out, sc, TOP, TOP + PLOT);
    (out, sc)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn label_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", trim(ms / 1000.0))
    } else {
        format!("{} ms", trim(ms))
    }
}

/// Acquire latency (invoke to grant or give-up) and release latency, on a log scale; returns
/// the plot and its caption.
pub(crate) fn latency(v: &RunView) -> (String, String) {
    let mut acq: Vec<(f64, f64, End)> = v
        .ops
        .iter()
        .filter_map(|o| {
            let a = o.acq_invoke?;
            let (b, e) = o.acq_end?;
            // A grant recorded with its invoke's stamp (a group's ownership) has no latency.
            (b > a).then_some((b, (b - a) * 1e3, e))
        })
        .collect();
    let rel: Vec<(f64, f64)> = v
        .ops
        .iter()
        .filter_map(|o| {
            let (a, b, _) = o.release?;
            Some((b?, (b? - a) * 1e3))
        })
        .collect();
    let (mut out, sc) = frame(v);
    let all = acq.iter().map(|p| p.1).chain(rel.iter().map(|p| p.1));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), ms| (lo.min(ms), hi.max(ms)));
    let lo = lo.clamp(0.01, 1e6).log10().floor();
    let hi = hi.clamp(0.1, 1e6).log10().ceil().max(lo + 1.0);
    let y = |ms: f64| TOP + PLOT - (ms.max(1e-3).log10() - lo) / (hi - lo) * PLOT;
    let mut d = lo;
    while d <= hi {
        let yy = y(10f64.powf(d));
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 4.0,
            yy + 4.0,
            label_ms(10f64.powf(d))
        );
        d += 1.0;
    }
    let total = acq.len() + rel.len();
    let every = total.div_ceil(MAX_POINTS).max(1);
    for (t, ms) in rel.iter().step_by(every) {
        let _ = write!(
            out,
            r#"<circle class="pt-rel" cx="{:.1}" cy="{:.1}" r="1.5"/>"#,
            sc.x(*t),
            y(*ms)
        );
    }
    for (t, ms, e) in acq.iter().step_by(every) {
        let class = match e {
            End::Ok => "pt-ok",
            End::Fail => "pt-fail",
            _ => "pt-info",
        };
        let _ = write!(
            out,
            r#"<circle class="{class}" cx="{:.1}" cy="{:.1}" r="2.2"/>"#,
            sc.x(*t),
            y(*ms)
        );
    }
    out.push_str("</svg>\n");
    acq.sort_by(|a, b| a.1.total_cmp(&b.1));
    let ms: Vec<f64> = acq.iter().map(|p| p.1).collect();
    let failed = acq.iter().filter(|p| p.2 != End::Ok).count();
    let mut caption = format!(
        "Acquire latency, invoke to grant (green) or give-up (red: fail, orange: unknown), \
         log scale: {} acquires, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {failed} gave up. \
         Release latency in grey.",
        acq.len(),
        quantile(&ms, 0.5),
        quantile(&ms, 0.99),
        ms.last().copied().unwrap_or(0.0)
    );
    if every > 1 {
        let _ = write!(caption, " One point in {every} is drawn.");
    }
    (out, caption)
}

/// Grants, accepted writes and refused writes per second, in bins; returns the plot and its
/// caption.
pub(crate) fn throughput(v: &RunView) -> (String, String) {
    let bin = step(v.length, 100.0).max(0.1);
    let bins = ((v.length / bin).ceil() as usize).max(1);
    let mut grants = vec![0u32; bins];
    let mut acc = vec![0u32; bins];
    let mut refused = vec![0u32; bins];
    let at = |t: f64| ((t / bin).floor().max(0.0) as usize).min(bins - 1);
    for o in &v.ops {
        if let Some((t, _)) = o.hold {
            grants[at(t)] += 1;
        }
        for &(t, ok) in &o.writes {
            if ok {
                acc[at(t)] += 1;
            } else {
                refused[at(t)] += 1;
            }
        }
    }
    let (mut out, sc) = frame(v);
    let top = grants.iter().chain(&acc).copied().max().unwrap_or(0).max(1) as f64 / bin;
    let ymax = step(top, 4.0) * (top / step(top, 4.0)).ceil();
    let y = |per_s: f64| TOP + PLOT - per_s / ymax * PLOT;
    let mut g = 0.0;
    let gs = step(ymax, 4.0);
    while g <= ymax + 1e-9 {
        let yy = y(g);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}/s</text>"#,
            WIDTH - RIGHT,
            LEFT - 4.0,
            yy + 4.0,
            trim(g)
        );
        g += gs;
    }
    let w = sc.width / bins as f64;
    for (i, (&n, &r)) in grants.iter().zip(&refused).enumerate() {
        let x = sc.x(i as f64 * bin);
        let (yn, yr) = (y(f64::from(n) / bin), y(f64::from(r) / bin));
        let _ = write!(
            out,
            r#"<rect class="bar" x="{x:.1}" y="{yn:.1}" width="{:.1}" height="{:.1}"/>"#,
            (w - 1.0).max(0.5),
            TOP + PLOT - yn
        );
        if r > 0 {
            let _ = write!(
                out,
                r#"<rect class="bar-ref" x="{x:.1}" y="{yr:.1}" width="{:.1}" height="{:.1}"><title>{r} refused stale write(s)</title></rect>"#,
                (w - 1.0).max(0.5),
                TOP + PLOT - yr
            );
        }
    }
    let points: Vec<String> = acc
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            format!(
                "{:.1},{:.1}",
                sc.x((i as f64 + 0.5) * bin),
                y(f64::from(n) / bin)
            )
        })
        .collect();
    let _ = write!(
        out,
        r#"<polyline class="line-acc" points="{}"/></svg>"#,
        points.join(" ")
    );
    out.push('\n');
    let caption = format!(
        "Throughput in bins of {} s: grants per second (blue bars), accepted writes per second \
         (green line), refused stale writes per second (red bars): {} grants, {} writes \
         accepted, {} refused.",
        trim(bin),
        grants.iter().sum::<u32>(),
        acc.iter().sum::<u32>(),
        refused.iter().sum::<u32>()
    );
    (out, caption)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::history::OpView;

    #[test]
    fn the_plots_count_what_the_run_did() {
        let mut v = RunView {
            workers: 1,
            length: 10.0,
            ..RunView::default()
        };
        for n in 0..10u64 {
            let mut o = OpView::new(n, 0);
            let t = n as f64;
            o.acq_invoke = Some(t);
            o.acq_end = Some((t + 0.01 * (n + 1) as f64, End::Ok));
            o.hold = Some((t + 0.1, t + 0.5));
            o.writes = vec![(t + 0.3, n != 3)];
            v.ops.push(o);
        }
        let (svg, caption) = latency(&v);
        assert_eq!(svg.matches("pt-ok").count(), 10);
        assert!(caption.contains("10 acquires, p50 60.0 ms"), "{caption}");
        let (svg, caption) = throughput(&v);
        assert!(
            caption.contains("10 grants, 9 writes accepted, 1 refused"),
            "{caption}"
        );
        assert_eq!(svg.matches("bar-ref").count(), 1);
    }
}
