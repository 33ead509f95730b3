//! The timeline: a lane per worker, cut into strips of a few seconds stacked down the page, so
//! that a 60 s run with a thousand acquisitions stays readable. Each operation is its acquire
//! (the wait), its hold (coloured by what its write met) and its release; reads and writes
//! are ticks, a refused stale write a red cross; faults are shaded bands, on the lane of the
//! worker they hit or across the strip.

use std::collections::HashMap;
use std::fmt::Write;

use super::history::{End, OpView, RunView};
use super::svg::{Scale, esc, fault_bands, fault_title, time_axis};

const WIDTH: f64 = 1320.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 12.0;
const LABELS: f64 = 14.0;
const LANE: f64 = 22.0;
const AXIS: f64 = 18.0;
/// Acquisitions per lane in one strip, about.
const PER_STRIP: f64 = 30.0;
/// Past this many operations, only the strips with faults or flagged operations are drawn.
const MAX_OPS: usize = 8000;

/// The strip length (s): a round length that puts about [`PER_STRIP`] acquisitions (or writes,
/// when a hold writes many times, as a group's partition owner does) in a lane.
pub(crate) fn strip_len(v: &RunView) -> f64 {
    let held = v.ops.iter().filter(|o| o.held()).count();
    let writes: usize = v.ops.iter().map(|o| o.writes.len()).sum();
    let rate = held.max(writes) as f64 / v.workers.max(1) as f64 / v.length.max(1e-3);
    let lens = [
        0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    ];
    let len = lens
        .into_iter()
        .take_while(|l| rate * l <= PER_STRIP)
        .last()
        .unwrap_or(lens[0]);
    len.min(v.length.max(0.1))
}

/// When the operation starts and ends, as drawn.
fn extent(o: &OpView) -> (f64, f64) {
    let start = o
        .acq_invoke
        .or(o.acq_end.map(|a| a.0))
        .or(o.hold.map(|h| h.0))
        .or(o.reads.first().copied())
        .unwrap_or(0.0);
    let end = [
        o.acq_end.map(|a| a.0),
        o.hold.map(|h| h.1),
        o.release.map(|r| r.1.unwrap_or(r.0)),
        o.writes.last().map(|w| w.0),
        o.reads.last().copied(),
    ]
    .into_iter()
    .flatten()
    .fold(start, f64::max);
    (start, end)
}

fn end_class(prefix: &str, e: End) -> String {
    let s = match e {
        End::Ok => "ok",
        End::Fail => "fail",
        End::Info => "info",
        End::Open => "open",
    };
    format!("{prefix}-{s}")
}

/// The hold's colour: what its write met.
fn hold_class(o: &OpView) -> &'static str {
    if o.writes.iter().any(|w| !w.1) {
        "h-ref"
    } else if o.writes.iter().any(|w| w.1) {
        "h-acc"
    } else if o.skipped_write.is_some() || o.lost.is_some() {
        "h-lost"
    } else {
        "h-read"
    }
}

fn ms(a: f64, b: f64) -> String {
    format!("{:.1} ms", (b - a) * 1e3)
}

fn title(o: &OpView, flags: Option<&Vec<String>>) -> String {
    let mut s = format!("op {} · worker {}", o.n, o.w);
    if let Some(f) = o.fence {
        let _ = write!(s, " · fence {f}");
    }
    if o.shared {
        s.push_str(" · shared");
    }
    if let (Some(a), Some((b, e))) = (o.acq_invoke, o.acq_end) {
        let _ = write!(s, "\nacquire {:?} after {}", e, ms(a, b));
    }
    if let Some((a, b)) = o.hold {
        let _ = write!(s, "\nheld {a:.3}–{b:.3} s ({})", ms(a, b));
        if let Some(why) = o.ended_by {
            let _ = write!(s, ", ended by {why}");
        }
    }
    for (t, ok) in &o.writes {
        let _ = write!(
            s,
            "\nwrite at {t:.3} s {}",
            if *ok { "accepted" } else { "REFUSED (stale)" }
        );
    }
    if let Some(t) = o.skipped_write {
        let _ = write!(s, "\nno write: lease not held at {t:.3} s");
    }
    if let Some(t) = o.lost {
        let _ = write!(s, "\nlost signal at {t:.3} s");
    }
    if let Some((a, b, e)) = o.release {
        let _ = match b {
            Some(b) => write!(s, "\nrelease {e:?} after {}", ms(a, b)),
            None => write!(s, "\nrelease never answered"),
        };
    }
    if let Some(f) = flags {
        let _ = write!(s, "\nfirst offending operation of {}", f.join(", "));
    }
    esc(&s)
}

/// One operation's shapes on a strip.
fn op_shapes(
    out: &mut String,
    o: &OpView,
    sc: Scale,
    y: f64,
    anchor: bool,
    flags: Option<&Vec<String>>,
) {
    let id = if anchor {
        format!(r#" id="op-{}""#, o.n)
    } else {
        String::new()
    };
    let _ = write!(
        out,
        r#"<g class="op"{id}><title>{}</title>"#,
        title(o, flags)
    );
    let rect = |out: &mut String, class: &str, a: f64, b: f64, dy: f64, h: f64| {
        if sc.overlaps(a, b) {
            let (xa, xb) = (sc.x(a), sc.x(b));
            let _ = write!(
                out,
                r#"<rect class="{class}" x="{xa:.1}" y="{:.1}" width="{:.1}" height="{h}"/>"#,
                y + dy,
                (xb - xa).max(1.0)
            );
        }
    };
    if let Some(a) = o.acq_invoke {
        let (b, e) = o.acq_end.unwrap_or((o.hold.map_or(a, |h| h.0), End::Open));
        rect(out, &end_class("a", e), a, b, 8.0, 6.0);
    }
    if let Some((a, b)) = o.hold {
        let mut class = hold_class(o).to_owned();
        if o.ended_by.is_some() {
            class.push_str(" h-end");
        }
        rect(out, &class, a, b, 4.0, 14.0);
    }
    if let Some((a, b, e)) = o.release {
        rect(out, &end_class("r", e), a, b.unwrap_or(a), 8.0, 6.0);
    }
    for &t in o.reads.iter().filter(|&&t| sc.overlaps(t, t)) {
        let x = sc.x(t);
        let _ = write!(
            out,
            r#"<line class="rd" x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}"/>"#,
            y + 1.0,
            y + 6.0
        );
    }
    for &(t, ok) in o.writes.iter().filter(|w| sc.overlaps(w.0, w.0)) {
        let x = sc.x(t);
        if ok {
            let _ = write!(
                out,
                r#"<line class="wr" x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}"/>"#,
                y + 14.0,
                y + 21.0
            );
        } else {
            let (c, d) = (y + 11.0, 4.5);
            let _ = write!(
                out,
                r#"<path class="stale" d="M{:.1},{:.1}L{:.1},{:.1}M{:.1},{:.1}L{:.1},{:.1}"/>"#,
                x - d,
                c - d,
                x + d,
                c + d,
                x - d,
                c + d,
                x + d,
                c - d
            );
        }
    }
    if let Some(t) = o.lost.filter(|&t| sc.overlaps(t, t)) {
        let x = sc.x(t);
        let _ = write!(
            out,
            r#"<path class="lost" d="M{:.1},{:.1}l4,-6h-8z"/>"#,
            x,
            y + 8.0
        );
    }
    if flags.is_some() {
        let (a, b) = extent(o);
        if sc.overlaps(a, b) {
            let (xa, xb) = (sc.x(a), sc.x(b));
            let _ = write!(
                out,
                r#"<rect class="flag" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
                xa - 2.0,
                y + 1.0,
                (xb - xa).max(1.0) + 4.0,
                LANE - 2.0
            );
        }
    }
    out.push_str("</g>");
}

/// The timeline's strips; `flagged` maps an operation to the checks it is the first offender
/// of (its shapes are outlined in red, and anchored as `#op-<n>` for the verdicts' links).
pub(crate) fn timeline(v: &RunView, flagged: &HashMap<u64, Vec<String>>) -> String {
    let len = strip_len(v);
    let strips = ((v.length / len).ceil() as usize).max(1);
    let lanes = v.workers.max(1) as f64;
    let height = LABELS + lanes * LANE + AXIS + 4.0;
    let thin = v.ops.len() > MAX_OPS;
    let mut out = String::new();
    let mut skipped = 0;
    // Each operation is anchored in the strip where it starts.
    let home = |o: &OpView| ((extent(o).0 / len).floor().max(0.0) as usize).min(strips - 1);
    for k in 0..strips {
        let sc = Scale {
            from: k as f64 * len,
            to: (k as f64 + 1.0) * len,
            left: LEFT,
            width: WIDTH - LEFT - RIGHT,
        };
        let busy = v.faults.iter().any(|f| sc.overlaps(f.start, f.end))
            || v.ops
                .iter()
                .any(|o| flagged.contains_key(&o.n) && home(o) == k);
        if thin && !busy {
            skipped += 1;
            continue;
        }
        let _ = write!(
            out,
            r#"<svg class="strip" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">"#
        );
        for w in 0..v.workers {
            let y = LABELS + w as f64 * LANE;
            let _ = write!(
                out,
                r#"<rect class="lane{}" x="{LEFT}" y="{y:.1}" width="{:.1}" height="{LANE}"/><text class="lbl" x="4" y="{:.1}">w{w}</text>"#,
                w % 2,
                WIDTH - LEFT - RIGHT,
                y + 15.0
            );
        }
        let bottom = LABELS + lanes * LANE;
        let (each, all): (Vec<_>, Vec<_>) =
            v.faults.iter().cloned().partition(|f| f.worker.is_some());
        fault_bands(&mut out, &all, sc, 0.0, bottom);
        // The faults' names, where there is room.
        for f in v.faults.iter().filter(|f| sc.overlaps(f.start, f.end)) {
            let (a, b) = (sc.x(f.start), sc.x(f.end));
            if b - a >= 40.0 || f.start >= sc.from {
                let _ = write!(
                    out,
                    r#"<text class="fl" x="{:.1}" y="10"><title>{}</title>{}</text>"#,
                    a + 2.0,
                    fault_title(f),
                    esc(&f.kind)
                );
            }
        }
        for o in &v.ops {
            let (a, b) = extent(o);
            if !sc.overlaps(a, b) {
                continue;
            }
            let y = LABELS + o.w as f64 * LANE;
            op_shapes(&mut out, o, sc, y, home(o) == k, flagged.get(&o.n));
        }
        // A worker's own faults over its lane, so that they show through its boxes.
        out.push_str(r#"<g class="wf">"#);
        for f in each.iter().filter(|f| sc.overlaps(f.start, f.end)) {
            let y = LABELS + f.worker.unwrap_or(0) as f64 * LANE;
            fault_bands(
                &mut out,
                std::slice::from_ref(f),
                sc,
                y + 1.0,
                y + LANE - 1.0,
            );
        }
        out.push_str("</g>");
        time_axis(&mut out, sc, LABELS, bottom);
        out.push_str("</svg>\n");
    }
    if skipped > 0 {
        let _ = write!(
            out,
            r#"<p class="note">{skipped} of {strips} strips without faults or flagged operations are left out ({} operations in all).</p>"#,
            v.ops.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::history::FaultView;

    fn op(n: u64, w: usize, at: f64) -> OpView {
        let mut o = OpView::new(n, w);
        o.acq_invoke = Some(at);
        o.acq_end = Some((at + 0.01, End::Ok));
        o.hold = Some((at + 0.01, at + 0.2));
        o.writes = vec![(at + 0.15, n.is_multiple_of(2))];
        o.release = Some((at + 0.2, Some(at + 0.21), End::Ok));
        o
    }

    #[test]
    fn each_operation_is_anchored_once_and_stale_writes_are_crossed() {
        let v = RunView {
            ops: (0..40)
                .map(|n| op(n, (n % 4) as usize, n as f64 * 0.3))
                .collect(),
            faults: vec![FaultView {
                kind: "pause-holder".into(),
                start: 1.0,
                end: 2.5,
                worker: Some(1),
                holder: Some(5),
                server_side: false,
            }],
            workers: 4,
            length: 12.0,
        };
        let flagged = HashMap::from([(7, vec!["CK1".to_owned()])]);
        let html = timeline(&v, &flagged);
        for n in 0..40 {
            assert_eq!(
                html.matches(&format!(r#"id="op-{n}""#)).count(),
                1,
                "op {n}"
            );
        }
        assert_eq!(html.matches(r#"class="stale""#).count(), 20);
        assert_eq!(html.matches(r#"class="flag""#).count(), 1);
        assert!(html.contains("pause-holder"));
        assert!(html.contains("first offending operation of CK1"));
    }

    #[test]
    fn a_long_busy_run_is_cut_into_readable_strips() {
        let mut v = RunView {
            workers: 4,
            length: 60.0,
            ..RunView::default()
        };
        v.ops = (0..1200)
            .map(|n| op(n, (n % 4) as usize, n as f64 * 0.05))
            .collect();
        // 5 acquisitions a second per lane: 5 s strips.
        assert_eq!(strip_len(&v), 5.0);
        let html = timeline(&v, &HashMap::new());
        assert_eq!(html.matches("<svg").count(), 12);
        assert!(html.len() < 3_000_000, "{} bytes", html.len());
        // 120 holds that write ten times each (as a group's owners do): the writes set the
        // length (the holds alone would make it 60 s).
        for o in &mut v.ops {
            o.writes = (0..10)
                .map(|k| (o.hold.unwrap_or_default().0, k > 0))
                .collect();
        }
        v.ops.truncate(120);
        assert_eq!(strip_len(&v), 5.0);
    }
}
