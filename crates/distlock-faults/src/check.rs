//! The checkers (CK1–CK8 of `shared/TESTING.md`), run on a finished history.
//!
//! Every event carries `t`, monotonic nanoseconds on the machine's one `CLOCK_MONOTONIC`.
//! A holder's *claim* is a deadline `vu` it reported (at acquire, at each renewal and at the
//! check before its write): it promised not to act as holder past it.

mod facts;
mod holders;
mod leaks;
mod liveness;
mod writes;

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::linear::Verdict;
use crate::resource::Register;

/// The SQL form's figures.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SqlFigures {
    pub(crate) w_accepted: u64,
    pub(crate) w_lost: u64,
    pub(crate) rw_accepted: u64,
    pub(crate) rw_lost: u64,
    pub(crate) rw_out_of_order: u64,
}

/// Limits the checkers hold the run to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// CK7: after a holder dies or gives its lock up, some waiter holds it within this.
    pub(crate) free_within_ns: i64,
    /// CK8: a loss on the server is reported by the holder within this.
    pub(crate) detect_within_ns: i64,
    /// A window after a server-side fault in which violations count as its caveats.
    pub(crate) caveat_window_ns: i64,
    /// The deployment can have two masters for a while (a replicated one that fails over
    /// asynchronously): renewals and releases that land on the old one, within a server-side
    /// fault's window, count as caveats too.
    pub(crate) split_brain: bool,
}

/// The figures of one scenario.
#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    pub(crate) acquisitions: u64,
    /// Acquires that ended without the lock (`fail` or `info`: a wait that timed out, an
    /// engine error).
    pub(crate) acquire_failed: u64,
    pub(crate) faults: HashMap<String, u64>,
    pub(crate) fenced: Option<Register>,
    pub(crate) unfenced: Register,
    /// CK1: fenced writes interleaved, with a lower token, or two owners with one token
    /// (outside, inside the aftermath of server-side faults).
    pub(crate) ck1: u64,
    pub(crate) ck1_caveat: u64,
    /// CK2: acknowledged updates lost in fenced mode.
    pub(crate) ck2: u64,
    /// CK3: token regressions, whatever the faults: no server-side fault excuses one (Redis's
    /// fence has a floor from the server's clock, so a restart that loses the counter must
    /// not take it back either).
    pub(crate) ck3: u64,
    /// CK5: acquisitions before an earlier holder's claimed deadline (outside, inside
    /// server-side faults).
    pub(crate) ck5: u64,
    pub(crate) ck5_caveat: u64,
    /// CK6 violations in a server-side fault's window.
    pub(crate) ck6_caveat: u64,
    /// CK6: renewals sent or releases that removed a lock after another holder took it.
    pub(crate) ck6: u64,
    /// CK7: probes, the longest time the lock stayed unusable, and probes past the bound.
    pub(crate) ck7_probes: u64,
    pub(crate) ck7_max_ms: f64,
    pub(crate) ck7: u64,
    /// Lock copies found on the servers when the run ended (excused or not).
    pub(crate) ck7_leaks: u64,
    /// The most live tasks a worker gained after its warm-up, and the most connections one
    /// worker had open to one server at the end.
    pub(crate) ck7_tasks_grown: u64,
    pub(crate) ck7_max_connections: u64,
    /// CK8: loss detection latencies (ms), and how many were past the bound.
    pub(crate) ck8_ms: Vec<f64>,
    pub(crate) ck8: u64,
    /// CK9: a holder's check that it may act (a guard's `is_held`, a leader's `is_leading`)
    /// passed at or after the deadline it reported: it did not step down at its local
    /// deadline.
    pub(crate) ck9: u64,
    /// The SQL form, when it ran: accepted writes and lost updates of row `w` (write fenced
    /// only) and row `rw` (read and write fenced).
    pub(crate) sql: Option<SqlFigures>,
    /// Group partitions: how long partitions stayed without an owner when they changed hands.
    pub(crate) handovers: Option<Handovers>,
    /// Examples of violations, for the report.
    pub(crate) examples: Vec<String>,
    /// The independent check: whether the fenced registers are linearizable (`linear.rs`).
    pub(crate) linear: Option<Verdict>,
}

fn i(v: &Value, k: &str) -> Option<i64> {
    v.get(k).and_then(Value::as_i64)
}

fn u(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// Keeps `text` as an example of a violation, for the report (up to 12 of them).
fn example(fig: &mut Figures, text: String) {
    if fig.examples.len() < 12 {
        fig.examples.push(text);
    }
}

/// Runs every checker on `events` (the history) and the resource's end state.
pub(crate) fn check(
    events: &[Value],
    fenced: Option<&Register>,
    unfenced: &Register,
    bounds: Bounds,
    run_end: i64,
) -> Figures {
    let facts = facts::read(events);
    let mut fig = Figures {
        acquisitions: facts.holds.len() as u64,
        acquire_failed: facts.acquire_failed,
        fenced: fenced.cloned(),
        unfenced: unfenced.clone(),
        ..Figures::default()
    };
    for f in &facts.faults {
        *fig.faults.entry(f.kind.clone()).or_default() += 1;
    }
    holders::late_checks(&facts, &mut fig);
    writes::fenced(events, fenced, &facts, &mut fig);
    writes::sql(events, &facts, &mut fig);
    holders::tokens(&facts, &mut fig);
    holders::claims(&facts, bounds, &mut fig);
    liveness::free(&facts, bounds, run_end, &mut fig);
    leaks::leftover(events, &facts, &mut fig);
    leaks::audits(events, &facts, &mut fig);
    leaks::resources(events, &mut fig);
    liveness::detection(&facts, bounds, &mut fig);
    fig.ck8_ms.sort_by(f64::total_cmp);
    fig
}

/// The `q` quantile of sorted samples.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(idx).copied()
}

impl Figures {
    /// Safety violations that no caveat covers (the figure that must be 0).
    pub(crate) fn violations(&self) -> u64 {
        let checkers = self.ck1 + self.ck2 + self.ck3 + self.ck5 + self.ck6 + self.ck7;
        let linear = self.linear.as_ref().map_or(0, Verdict::violations);
        checkers + self.ck8 + self.ck9 + linear
    }

    /// Adds the linearizability check's verdict (and its offending operation to the examples).
    pub(crate) fn set_linear(&mut self, v: Verdict) {
        if let Some(e) = v.example() {
            self.examples.push(e);
        }
        self.linear = Some(v);
    }

    /// The violations that no event recorded later can undo, so that a history cut short shows
    /// them as the whole one would (a control may end once it sees one): fenced writes out of
    /// order (CK1), a token below an earlier one (CK3), an acquisition before the previous
    /// holder's deadline (CK5), a foreign renewal or release (CK6), a check past its own
    /// deadline (CK9). Lost updates (CK2), liveness (CK7) and loss detection (CK8) are judged
    /// on the whole run only.
    pub(crate) fn settled_violations(&self) -> u64 {
        self.ck1 + self.ck3 + self.ck5 + self.ck6 + self.ck9
    }

    /// Lost acknowledged updates of the unfenced control, in percent of its accepted writes.
    pub(crate) fn unfenced_lost_pct(&self) -> f64 {
        let r = &self.unfenced;
        if r.accepted == 0 {
            0.0
        } else {
            100.0 * r.lost_updates() as f64 / r.accepted as f64
        }
    }

    /// The figures as JSON, for the report file.
    pub(crate) fn to_json(&self) -> Value {
        let reg = |r: &Register| {
            json!({"value": r.value, "accepted": r.accepted, "rejected": r.rejected,
                "lost": r.lost_updates(), "interleaved": r.interleaved,
                "token_down": r.token_down, "shared_token": r.shared_token})
        };
        json!({
            "acquisitions": self.acquisitions,
            "acquires_failed": self.acquire_failed,
            "faults": self.faults,
            "fenced": self.fenced.as_ref().map(reg),
            "unfenced": reg(&self.unfenced),
            "unfenced_lost_pct": self.unfenced_lost_pct(),
            "ck1_fenced_violations": self.ck1,
            "ck1_caveat": self.ck1_caveat,
            "ck2_lost_acknowledged": self.ck2,
            "ck3_token_regressions": self.ck3,
            "ck5_early_acquisitions": self.ck5,
            "ck5_caveat": self.ck5_caveat,
            "ck6_foreign_renew_release": self.ck6,
            "ck6_caveat": self.ck6_caveat,
            "ck7_probes": self.ck7_probes,
            "ck7_max_ms": self.ck7_max_ms,
            "ck7_violations": self.ck7,
            "ck7_leftover_copies": self.ck7_leaks,
            "ck7_tasks_grown": self.ck7_tasks_grown,
            "ck7_max_connections": self.ck7_max_connections,
            "ck8_p50_ms": quantile(&self.ck8_ms, 0.5),
            "ck8_p99_ms": quantile(&self.ck8_ms, 0.99),
            "ck8_samples": self.ck8_ms.len(),
            "ck8_violations": self.ck8,
            "ck9_checks_past_deadline": self.ck9,
            "sql": self.sql.map(|q| json!({"write_fenced_accepted": q.w_accepted,
                "write_fenced_lost": q.w_lost, "read_write_fenced_accepted": q.rw_accepted,
                "read_write_fenced_lost": q.rw_lost,
                "read_write_fenced_out_of_order": q.rw_out_of_order})),
            "handovers": self.handovers.as_ref().map(Handovers::to_json),
            "examples": self.examples,
            "linearizability": self.linear.as_ref().map(Verdict::to_json),
        })
    }
}

#[cfg(test)]
mod tests;

/// How long partitions stayed without an owner when they changed hands: from the end of one
/// ownership to the next one's grant (of another member, or the same one again), as the
/// workers saw them (ms).
#[derive(Debug, Clone, Default)]
pub(crate) struct Handovers {
    /// After an owner let it go (moved away, a leave, a dropped membership).
    pub(crate) released_ms: Vec<f64>,
    /// After an owner lost it: killed, or its lease lost or run out (a pause, a cut link).
    pub(crate) failed_ms: Vec<f64>,
}

impl Handovers {
    fn line(v: &[f64]) -> String {
        match (quantile(v, 0.5), quantile(v, 0.99), v.last()) {
            (Some(p50), Some(p99), Some(max)) => {
                format!("p50 {p50:.0} / p99 {p99:.0} / max {max:.0} ms")
            }
            _ => "none".to_owned(),
        }
    }

    /// For the scenario's line.
    pub(crate) fn summary(&self) -> String {
        format!(
            "partitions without an owner: {} after a let-go ({}), {} after a loss ({})",
            self.released_ms.len(),
            Handovers::line(&self.released_ms),
            self.failed_ms.len(),
            Handovers::line(&self.failed_ms),
        )
    }

    pub(crate) fn to_json(&self) -> Value {
        let one = |v: &[f64]| {
            json!({"count": v.len(), "p50_ms": quantile(v, 0.5), "p99_ms": quantile(v, 0.99),
                "max_ms": v.last()})
        };
        json!({"after_let_go": one(&self.released_ms), "after_loss": one(&self.failed_ms)})
    }
}
