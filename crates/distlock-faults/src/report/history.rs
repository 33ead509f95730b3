//! The history as the page draws it: each operation's acquire, hold and release with their
//! outcomes, its reads and writes, and the fault windows, on seconds from the run's start.

use std::collections::HashMap;

use serde_json::Value;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Ok,
    Fail,
    /// Ambiguous (a lost reply, a timeout).
    Info,
    /// No answer recorded (the worker was killed, or the run ended).
    Open,
}

/// One operation of one worker.
#[derive(Debug, Clone)]
pub(crate) struct OpView {
    pub(crate) n: u64,
    pub(crate) w: usize,
    pub(crate) acq_invoke: Option<f64>,
    pub(crate) acq_end: Option<(f64, End)>,
    /// From the grant to the moment it stopped acting as holder (release, abandon, cancel,
    /// kill, end of its operation).
    pub(crate) hold: Option<(f64, f64)>,
    pub(crate) release: Option<(f64, Option<f64>, End)>,
    pub(crate) fence: Option<u64>,
    pub(crate) shared: bool,
    pub(crate) reads: Vec<f64>,
    /// Writes: when, and whether the resource accepted them.
    pub(crate) writes: Vec<(f64, bool)>,
    pub(crate) skipped_write: Option<f64>,
    pub(crate) lost: Option<f64>,
    /// How its hold ended when not by a release: "abandon", "cancel", "killed".
    pub(crate) ended_by: Option<&'static str>,
    done: Option<f64>,
}

/// A fault window.
#[derive(Debug, Clone)]
pub(crate) struct FaultView {
    pub(crate) kind: String,
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub(crate) worker: Option<usize>,
    pub(crate) holder: Option<u64>,
    pub(crate) server_side: bool,
}

/// The run, ready to draw.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunView {
    pub(crate) ops: Vec<OpView>,
    pub(crate) faults: Vec<FaultView>,
    pub(crate) workers: usize,
    /// The run's length (s): from its `start` event to its `end` event.
    pub(crate) length: f64,
}

impl OpView {
    /// An operation of which nothing is known yet.
    pub(crate) fn new(n: u64, w: usize) -> OpView {
        OpView {
            n,
            w,
            acq_invoke: None,
            acq_end: None,
            hold: None,
            release: None,
            fence: None,
            shared: false,
            reads: Vec::new(),
            writes: Vec::new(),
            skipped_write: None,
            lost: None,
            ended_by: None,
            done: None,
        }
    }

    /// Whether it held the lock at all.
    pub(crate) fn held(&self) -> bool {
        self.hold.is_some()
    }
}

/// Puts the run together from its events; `fenced` says which of a write's answers is the one
/// its worker acted on (the fenced resource's, when the engine has fencing tokens).
pub(crate) fn view(events: &[Value], fenced: bool) -> RunView {
    let f = |e: &Value, k: &str| e.get(k).and_then(Value::as_i64);
    let t0 = events
        .iter()
        .find(|e| e["ev"] == "start")
        .and_then(|e| f(e, "t"))
        .or_else(|| events.iter().filter_map(|e| f(e, "t")).min())
        .unwrap_or(0);
    let t1 = events
        .iter()
        .rev()
        .find(|e| e["ev"] == "end")
        .and_then(|e| f(e, "t"))
        .or_else(|| events.iter().filter_map(|e| f(e, "t")).max())
        .unwrap_or(t0);
    let sec = |ns: i64| (ns - t0) as f64 / 1e9;
    let mut ops: Vec<OpView> = Vec::new();
    let mut at: HashMap<u64, usize> = HashMap::new();
    let mut faults = Vec::new();
    let mut workers = 0;
    for e in events {
        let ev = e["ev"].as_str().unwrap_or("");
        let t = sec(f(e, "t").unwrap_or(t0));
        if ev == "fault" {
            faults.push(FaultView {
                kind: e["kind"].as_str().unwrap_or("fault").to_owned(),
                start: f(e, "start").map_or(t, sec),
                end: f(e, "end").map_or(t, sec),
                worker: e["w"].as_u64().map(|w| w as usize),
                holder: e["holder"].as_u64(),
                server_side: e["server_side"] == true,
            });
            continue;
        }
        let (Some(n), Some(w)) = (e["n"].as_u64(), e["w"].as_u64()) else {
            continue;
        };
        let w = w as usize;
        workers = workers.max(w + 1);
        let i = *at.entry(n).or_insert_with(|| {
            ops.push(OpView::new(n, w));
            ops.len() - 1
        });
        let op = &mut ops[i];
        let end = match ev {
            "ok" => End::Ok,
            "fail" => End::Fail,
            _ => End::Info,
        };
        let stop = |op: &mut OpView, why: Option<&'static str>| {
            if let Some((from, to)) = &mut op.hold
                && *to == f64::INFINITY
            {
                *to = t.max(*from);
                op.ended_by = why;
            }
        };
        match (ev, e["f"].as_str().unwrap_or("")) {
            ("invoke", "acquire") => {
                op.acq_invoke.get_or_insert(t);
            }
            ("ok", "acquire") => {
                op.acq_end = Some((t, End::Ok));
                op.hold = Some((t, f64::INFINITY));
                op.fence = e["fence"].as_u64();
                op.shared = e["kind"] == "shared";
            }
            ("fail" | "info", "acquire") => op.acq_end = Some((t, end)),
            ("invoke", "release") => {
                stop(op, None);
                op.release = Some((t, None, End::Open));
            }
            ("ok" | "fail" | "info", "release") => {
                let from = op.release.map_or(t, |r| r.0);
                op.release = Some((from, Some(t), end));
            }
            ("abandon", _) => stop(op, Some("abandon")),
            ("cancel", _) => stop(op, Some("cancel")),
            ("read", _) => op.reads.push(t),
            ("write", _) => {
                let field = if fenced { "accepted" } else { "uaccepted" };
                op.writes.push((t, e[field] == true));
            }
            ("skip-write", _) => op.skipped_write = Some(t),
            ("lost", _) => {
                op.lost.get_or_insert(t);
            }
            ("done", _) => op.done = Some(t),
            _ => {}
        }
    }
    // A killed holder stopped at its kill; any other hold still open, at its operation's end
    // or the run's.
    for fv in faults.iter().filter(|fv| fv.kind == "kill-holder") {
        if let Some(&i) = fv.holder.and_then(|n| at.get(&n)) {
            let op = &mut ops[i];
            if let Some((from, to)) = &mut op.hold
                && fv.start < *to
            {
                *to = fv.start.max(*from);
                op.ended_by = Some("killed");
            }
        }
    }
    let length = sec(t1).max(0.0);
    for op in &mut ops {
        if let Some((_, to)) = &mut op.hold
            && *to == f64::INFINITY
        {
            *to = op.done.unwrap_or(length).max(0.0);
        }
    }
    faults.sort_by(|a, b| a.start.total_cmp(&b.start));
    RunView {
        ops,
        faults,
        workers,
        length,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_operation_is_put_together_from_its_events() {
        let s = 1_000_000_000i64;
        let events = vec![
            json!({"ev": "start", "t": 10 * s}),
            json!({"ev": "invoke", "f": "acquire", "n": 1, "w": 2, "t": 11 * s}),
            json!({"ev": "ok", "f": "acquire", "n": 1, "w": 2, "t": 12 * s, "fence": 7}),
            json!({"ev": "read", "n": 1, "w": 2, "t": 12 * s + s / 2}),
            json!({"ev": "write", "n": 1, "w": 2, "t": 13 * s, "accepted": false,
                "uaccepted": true}),
            json!({"ev": "invoke", "f": "release", "n": 1, "w": 2, "t": 14 * s}),
            json!({"ev": "ok", "f": "release", "n": 1, "w": 2, "t": 15 * s}),
            json!({"ev": "invoke", "f": "acquire", "n": 2, "w": 0, "t": 14 * s}),
            json!({"ev": "ok", "f": "acquire", "n": 2, "w": 0, "t": 15 * s}),
            json!({"ev": "fault", "kind": "kill-holder", "w": 0, "holder": 2,
                "start": 16 * s, "end": 16 * s, "t": 16 * s}),
            json!({"ev": "end", "t": 20 * s}),
        ];
        let v = view(&events, true);
        assert_eq!((v.workers, v.length, v.ops.len()), (3, 10.0, 2));
        let a = &v.ops[0];
        assert_eq!(a.acq_invoke, Some(1.0));
        assert_eq!(a.hold, Some((2.0, 4.0)));
        assert_eq!(a.release, Some((4.0, Some(5.0), End::Ok)));
        assert_eq!(
            (a.reads.clone(), a.writes.clone()),
            (vec![2.5], vec![(3.0, false)])
        );
        let b = &v.ops[1];
        assert_eq!((b.hold, b.ended_by), (Some((5.0, 6.0)), Some("killed")));
        assert_eq!(v.faults[0].worker, Some(0));
        assert_eq!(view(&events, false).ops[0].writes, vec![(3.0, true)]);
    }
}
