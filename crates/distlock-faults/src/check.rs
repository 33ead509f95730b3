//! The checkers (CK1–CK8 of `shared/TESTING.md`), run on a finished history.
//!
//! Every event carries `t`, monotonic nanoseconds on the machine's one `CLOCK_MONOTONIC`.
//! A holder's *claim* is a deadline `vu` it reported (at acquire, at each renewal and at the
//! check before its write): it promised not to act as holder past it.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::linear::Verdict;
use crate::resource::Register;

/// One acquisition, put together from its events.
#[derive(Debug, Clone, Default)]
struct Hold {
    n: u64,
    acq_t: i64,
    fence: Option<u64>,
    validity_ns: i64,
    /// The latest deadline claimed.
    max_vu: i64,
    /// When renewals that succeeded were sent (claimed deadline − validity).
    renew_sent: Vec<i64>,
    /// When it stopped acting as holder: release started, guard abandoned, future cancelled,
    /// process killed.
    end_t: Option<i64>,
    /// A release that started at this time removed a lock it believed was its own.
    release_held_at: Option<i64>,
    /// A reader's share of a read-write lock (it excludes writers only).
    shared: bool,
    /// One of this many permits of a semaphore (0: not a permit).
    permits: u32,
    /// When its acquire was invoked (the last invoke of its operation before the grant).
    inv_t: i64,
}

impl Hold {
    /// Whether `self` and `other` may not both be held at once (a semaphore's permits are
    /// counted instead).
    fn excludes(&self, other: &Hold) -> bool {
        self.permits == 0 && other.permits == 0 && !(self.shared && other.shared)
    }
}

/// A fault window, from the history.
#[derive(Debug, Clone)]
struct Fault {
    kind: String,
    start: i64,
    end: i64,
    /// Faults where the server itself loses or cuts leases (restart without persistence,
    /// clock jump, an external delete): violations in their window are counted as caveats.
    server_side: bool,
    worker: Option<u64>,
    n: Option<u64>,
}

/// The SQL form's figures.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SqlFigures {
    pub(crate) w_accepted: u64,
    pub(crate) w_lost: u64,
    pub(crate) rw_accepted: u64,
    pub(crate) rw_lost: u64,
    pub(crate) rw_out_of_order: u64,
}

/// More live tasks than this over a worker's run is a leak.
const LEAK_TASKS: u64 = 32;
/// More resident memory than this (KiB) over a worker's run is a leak.
const LEAK_RSS_KB: u64 = 64 * 1024;
/// More open connections than this from one worker to one server is a leak.
const LEAK_CONNECTIONS: u64 = 8;

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

/// Runs every checker on `events` (the history) and the resource's end state.
pub(crate) fn check(
    events: &[Value],
    fenced: Option<&Register>,
    unfenced: &Register,
    bounds: Bounds,
    run_end: i64,
) -> Figures {
    let mut holds: HashMap<u64, Hold> = HashMap::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut abandons: Vec<(i64, u64)> = Vec::new();
    let mut lost_at: HashMap<u64, i64> = HashMap::new();
    let mut op_worker: HashMap<u64, u64> = HashMap::new();
    let mut invoked: HashMap<u64, i64> = HashMap::new();
    // CK9: checks that passed past their own deadline (op, by how much in ns).
    let mut late_checks: Vec<(u64, i64)> = Vec::new();
    for e in events {
        let t = i(e, "t").unwrap_or(0);
        let n = u(e, "n");
        if let (Some(n), Some(w)) = (n, u(e, "w")) {
            op_worker.insert(n, w);
        }
        match (s(e, "ev"), s(e, "f")) {
            ("invoke", "acquire") => {
                invoked.insert(n.unwrap_or(0), t);
            }
            ("ok", "acquire") => {
                let n = n.unwrap_or(0);
                let validity_ns = u(e, "validity_ms").unwrap_or(0) as i64 * 1_000_000;
                holds.insert(
                    n,
                    Hold {
                        n,
                        acq_t: t,
                        fence: u(e, "fence"),
                        validity_ns,
                        max_vu: i(e, "vu").unwrap_or(t),
                        shared: s(e, "kind") == "shared",
                        permits: u(e, "permits").unwrap_or(0) as u32,
                        inv_t: invoked.get(&n).copied().unwrap_or(t),
                        ..Hold::default()
                    },
                );
            }
            ("check", _)
                if i(e, "checked").is_some_and(|c| c >= i(e, "vu").unwrap_or(i64::MAX)) =>
            {
                late_checks.push((
                    n.unwrap_or(0),
                    i(e, "checked").unwrap_or(0) - i(e, "vu").unwrap_or(0),
                ));
                if let Some(h) = n.and_then(|n| holds.get_mut(&n)) {
                    h.max_vu = h.max_vu.max(i(e, "vu").unwrap_or(0));
                }
            }
            ("renewed", _) | ("check", _) => {
                if let Some(h) = n.and_then(|n| holds.get_mut(&n)) {
                    let vu = i(e, "vu").unwrap_or(0);
                    h.max_vu = h.max_vu.max(vu);
                    if s(e, "ev") == "renewed" {
                        h.renew_sent.push(vu - h.validity_ns);
                    }
                }
            }
            ("invoke", "release") | ("abandon", _) | ("cancel", _) => {
                if let Some(h) = n.and_then(|n| holds.get_mut(&n)) {
                    h.end_t.get_or_insert(t);
                }
                if s(e, "ev") == "abandon" {
                    abandons.push((t, n.unwrap_or(0)));
                }
            }
            ("ok", "release") => {
                if e.get("held").and_then(Value::as_bool) == Some(true)
                    && let Some(h) = n.and_then(|n| holds.get_mut(&n))
                {
                    h.release_held_at = h.end_t;
                }
            }
            ("lost", _) => {
                if let Some(n) = n {
                    lost_at.entry(n).or_insert(t);
                }
            }
            ("fault", _) => faults.push(Fault {
                kind: s(e, "kind").to_owned(),
                start: i(e, "start").unwrap_or(t),
                end: i(e, "end").unwrap_or(t),
                server_side: e.get("server_side").and_then(Value::as_bool) == Some(true),
                worker: u(e, "w"),
                n: u(e, "holder"),
            }),
            _ => {}
        }
    }
    // A killed worker stopped acting as holder when it died.
    for f in faults.iter().filter(|f| f.kind == "kill-holder") {
        if let Some(h) = f.n.and_then(|n| holds.get_mut(&n)) {
            h.end_t = Some(h.end_t.map_or(f.start, |e| e.min(f.start)));
        }
    }
    let acquire_failed = events
        .iter()
        .filter(|e| matches!(s(e, "ev"), "fail" | "info") && s(e, "f") == "acquire")
        .count() as u64;
    let mut holds: Vec<Hold> = holds.into_values().collect();
    holds.sort_by_key(|h| (h.acq_t, h.n));

    let mut fig = Figures {
        acquisitions: holds.len() as u64,
        acquire_failed,
        fenced: fenced.cloned(),
        unfenced: unfenced.clone(),
        ..Figures::default()
    };
    for f in &faults {
        *fig.faults.entry(f.kind.clone()).or_default() += 1;
    }
    fig.ck9 = late_checks.len() as u64;
    for &(n, late) in late_checks.iter().take(3) {
        fig.examples.push(format!(
            "CK9: op {n} believed it held the lock {:.1} ms past its own deadline",
            late as f64 / 1e6
        ));
    }
    let caveat = |from: i64, to: i64| {
        faults
            .iter()
            .any(|f| f.server_side && f.start <= to && f.end + bounds.caveat_window_ns >= from)
    };
    let example = |fig: &mut Figures, text: String| {
        if fig.examples.len() < 12 {
            fig.examples.push(text);
        }
    };

    // CK1 and CK2 on the fenced resource. CK1 is replayed from the accepted writes, so that
    // those after a server-side fault (a fence counter lost with the data stays low for
    // long) count as its caveats.
    if let Some(r) = fenced {
        fig.ck2 = r.lost_updates();
        let mut value = 0i64;
        let mut last: Option<(u64, u64)> = None;
        for e in events.iter().filter(|e| {
            s(e, "ev") == "write" && e.get("accepted").and_then(Value::as_bool) == Some(true)
        }) {
            let (t, n, v) = (
                i(e, "t").unwrap_or(0),
                u(e, "n").unwrap_or(0),
                i(e, "value"),
            );
            let v = v.unwrap_or(0);
            let mut bad = value != v - 1;
            if let (Some(f), Some((ln, lf))) = (u(e, "fence"), last) {
                bad |= f < lf || (f == lf && n != ln);
            }
            if bad {
                if faults.iter().any(|f| f.server_side && f.start <= t) {
                    fig.ck1_caveat += 1;
                } else {
                    fig.ck1 += 1;
                    example(
                        &mut fig,
                        format!("CK1: op {n}'s fenced write was accepted out of order"),
                    );
                }
            }
            if let Some(f) = u(e, "fence") {
                last = Some((n, f));
            }
            value = v;
        }
    }

    // The SQL form: row `rw` is held to CK1 and CK2 like the fenced register; row `w` (only
    // the write fenced) is reported.
    if let Some(fin) = events.iter().find(|e| s(e, "ev") == "sql-final") {
        let mut f = SqlFigures::default();
        let mut value = 0i64;
        let mut last: Option<u64> = None;
        for e in events.iter().filter(|e| s(e, "ev") == "write") {
            if e.get("sw_accepted").and_then(Value::as_bool) == Some(true) {
                f.w_accepted += 1;
            }
            if e.get("srw_accepted").and_then(Value::as_bool) != Some(true) {
                continue;
            }
            f.rw_accepted += 1;
            let v = i(e, "srw").unwrap_or(0);
            let fence = u(e, "fence");
            let bad = value != v - 1 || matches!((fence, last), (Some(a), Some(b)) if a < b);
            if bad {
                let t = i(e, "t").unwrap_or(0);
                if faults.iter().any(|f| f.server_side && f.start <= t) {
                    fig.ck1_caveat += 1;
                } else {
                    f.rw_out_of_order += 1;
                    fig.ck1 += 1;
                    example(
                        &mut fig,
                        format!(
                            "CK1: op {}'s SQL write was accepted out of order",
                            u(e, "n").unwrap_or(0)
                        ),
                    );
                }
            }
            value = v;
            last = fence.or(last);
        }
        let final_w = i(fin, "w").unwrap_or(0).max(0) as u64;
        let final_rw = i(fin, "rw").unwrap_or(0).max(0) as u64;
        f.w_lost = f.w_accepted.saturating_sub(final_w);
        f.rw_lost = f.rw_accepted.saturating_sub(final_rw);
        fig.ck2 += f.rw_lost;
        fig.sql = Some(f);
    }

    // CK3: each new holder's token is above every earlier one (a writer's or a permit's: a
    // reader's is its place among the writers, shared with the readers beside it).
    // Permits are held side by side, and their grants reported in any order: a permit's
    // fence is held above those granted before its acquire was sent, and to be its own.
    let mut seen_permit: HashMap<u64, u64> = HashMap::new();
    for b in holds.iter().filter(|h| h.permits > 0) {
        let Some(f) = b.fence else { continue };
        let before = holds
            .iter()
            .filter(|a| a.permits > 0 && a.acq_t < b.inv_t)
            .filter_map(|a| a.fence.map(|af| (a.n, af)))
            .find(|&(_, af)| af >= f);
        let twin = seen_permit.insert(f, b.n);
        if let Some((an, af)) = before {
            fig.ck3 += 1;
            example(
                &mut fig,
                format!("CK3: op {} got token {f} after op {an}'s {af}", b.n),
            );
        } else if let Some(a) = twin {
            fig.ck3 += 1;
            example(&mut fig, format!("CK3: ops {a} and {} got token {f}", b.n));
        }
    }
    let mut top: Option<u64> = None;
    for h in holds.iter().filter(|h| !h.shared && h.permits == 0) {
        let Some(f) = h.fence else { continue };
        if let Some(max) = top
            && f <= max
        {
            fig.ck3 += 1;
            example(
                &mut fig,
                format!("CK3: op {} got token {f} after token {max}", h.n),
            );
        }
        if top.is_none_or(|max| f > max) {
            top = Some(f);
        }
    }

    // CK5 and CK6: against every earlier holder. A reader beside readers is no overlap; a
    // permit is one when N earlier permits' claims still run.
    for (bi, b) in holds.iter().enumerate() {
        let mut overlapped = false;
        let mut permits_running = 0u32;
        for a in &holds[..bi] {
            if a.acq_t >= b.acq_t {
                continue;
            }
            // A holder's claim ends at its deadline, or earlier when it let go or was told
            // its lease was lost (it believes nothing after that: `is_held()` is false).
            let claim_end = [a.end_t, lost_at.get(&a.n).copied()]
                .into_iter()
                .flatten()
                .fold(a.max_vu, i64::min);
            let conflict = if b.permits > 0 && a.permits > 0 {
                if b.acq_t < claim_end {
                    permits_running += 1;
                }
                permits_running >= b.permits
            } else {
                b.excludes(a)
            };
            if !overlapped && conflict && b.acq_t < claim_end {
                overlapped = true;
                if caveat(a.acq_t, b.acq_t) {
                    fig.ck5_caveat += 1;
                } else {
                    fig.ck5 += 1;
                    example(
                        &mut fig,
                        format!(
                            "CK5: op {} acquired {:.1} ms before op {}'s claimed deadline",
                            b.n,
                            (claim_end - b.acq_t) as f64 / 1e6,
                            a.n
                        ),
                    );
                }
            }
        }
        // b's own renewals and release, after a later holder took the lock (one it excludes:
        // permits are counted by CK5 alone).
        for c in holds[bi + 1..].iter().filter(|c| b.excludes(c)) {
            let late_renew = b.renew_sent.iter().filter(|&&s| s > c.acq_t).count() as u64;
            let late_release = b.release_held_at.is_some_and(|r| r > c.acq_t);
            if late_renew > 0 || late_release {
                // With two masters for a while (the old one back from a pause before it is
                // demoted), each accepts its own holder: the renewals and releases in a
                // server-side fault's window are its caveats. Any later one is a violation.
                let in_window = |t: i64| bounds.split_brain && caveat(t, t);
                let excused = b
                    .renew_sent
                    .iter()
                    .filter(|&&s| s > c.acq_t && in_window(s))
                    .count() as u64
                    + u64::from(late_release && b.release_held_at.is_some_and(in_window));
                fig.ck6_caveat += excused;
                let counted = late_renew + u64::from(late_release) - excused;
                if counted == 0 {
                    break;
                }
                fig.ck6 += counted;
                example(
                    &mut fig,
                    format!(
                        "CK6: op {} {} after op {} acquired",
                        b.n,
                        if late_release {
                            "removed the lock"
                        } else {
                            "renewed the lock"
                        },
                        c.n
                    ),
                );
                break;
            }
        }
    }

    // CK7: after a holder dies or abandons its lock, somebody holds it within the bound.
    let mut probes: Vec<(i64, String)> = abandons
        .iter()
        .map(|&(t, n)| (t, format!("op {n} abandoned its lock")))
        .collect();
    for f in &faults {
        if f.kind == "kill-holder" {
            probes.push((f.start, format!("worker {:?} was killed", f.worker)));
        }
    }
    for (t, what) in probes {
        fig.ck7_probes += 1;
        let next = holds.iter().map(|h| h.acq_t).filter(|&a| a > t).min();
        let gap = next.unwrap_or(run_end) - t;
        fig.ck7_max_ms = fig.ck7_max_ms.max(gap as f64 / 1e6);
        if gap > bounds.free_within_ns {
            fig.ck7 += 1;
            example(
                &mut fig,
                format!(
                    "CK7: {what}; nobody held the lock for {:.0} ms after",
                    gap as f64 / 1e6
                ),
            );
        }
    }

    // CK7, leaks: when the run ends, every operation is over. A lock copy still on a server
    // must belong to an operation that did not let go cleanly (abandoned, cancelled, killed,
    // lost, or whose release failed); any other is a leak (a failed attempt that kept its
    // copies, a release that left one behind).
    let mut excused: HashSet<&str> = HashSet::new();
    let mut released_ok: HashSet<u64> = HashSet::new();
    for e in events {
        if s(e, "ev") == "ok" && s(e, "f") == "release" {
            released_ok.insert(u(e, "n").unwrap_or(0));
        }
    }
    let killed: HashSet<u64> = faults
        .iter()
        .filter(|f| f.kind == "kill-holder")
        .filter_map(|f| f.n)
        .collect();
    for e in events {
        if s(e, "ev") == "ok" && s(e, "f") == "acquire" {
            let n = u(e, "n").unwrap_or(0);
            if !released_ok.contains(&n) || killed.contains(&n) {
                excused.insert(s(e, "token"));
            }
        }
    }
    for e in events.iter().filter(|e| s(e, "ev") == "leftover") {
        for tok in e
            .get("tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            fig.ck7_leaks += 1;
            if !excused.contains(tok) {
                fig.ck7 += 1;
                example(
                    &mut fig,
                    format!("CK7: a lock copy with token {tok} outlived every operation"),
                );
            }
        }
    }

    // CK7, leaks during the run: a copy whose token no acquisition reported, seen on the same
    // server in consecutive audits for a third of a TTL or more, and not explained by a fault
    // of its owner's (a cut link, a pause, a kill: its clean-up could not get through). A
    // waiting client's attempts reuse one token, so the same token seen now and then in
    // separate audits is a string of short attempts, not a leak.
    let ttl_ns = events
        .iter()
        .find(|e| s(e, "ev") == "start")
        .and_then(|e| u(e, "ttl_ms"))
        .unwrap_or(1000) as i64
        * 1_000_000;
    let known: HashSet<&str> = events
        .iter()
        .filter(|e| s(e, "ev") == "ok" && s(e, "f") == "acquire")
        .map(|e| s(e, "token"))
        .collect();
    // (token, server) → (start of its current run of consecutive audits, the run's last audit
    // index); runs long enough are leaks (token, owner, first seen, last seen).
    let mut runs: HashMap<(&str, u64), (i64, usize)> = HashMap::new();
    let mut leaks: Vec<(&str, &str, i64, i64)> = Vec::new();
    for (idx, e) in events.iter().filter(|e| s(e, "ev") == "audit").enumerate() {
        let t = i(e, "t").unwrap_or(0);
        for c in e
            .get("copies")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let server = c.get(0).and_then(Value::as_u64).unwrap_or(0);
            let tok = c.get(1).and_then(Value::as_str).unwrap_or("");
            let owner = c.get(2).and_then(Value::as_str).unwrap_or("");
            if tok.is_empty() || known.contains(tok) {
                continue;
            }
            let run = runs.entry((tok, server)).or_insert((t, idx));
            if run.1 + 1 < idx {
                // Not seen in the audit before: a new run.
                run.0 = t;
            }
            run.1 = idx;
            if t - run.0 >= ttl_ns / 3 {
                match leaks.iter_mut().find(|l| l.0 == tok) {
                    Some(l) => l.3 = t,
                    None => leaks.push((tok, owner, run.0, t)),
                }
            }
        }
    }
    for (tok, owner, first, last) in leaks {
        let w: Option<u64> = owner.strip_prefix("worker-").and_then(|n| n.parse().ok());
        // A restart only removes copies; a paused server or slowed links can hold a clean-up
        // back, as can any fault of the owner's own.
        let explained = faults.iter().any(|f| {
            let relevant = f.worker == w
                || f.kind == "pause-server"
                || (f.kind == "delay-replies" && f.worker.is_none());
            relevant && f.start <= last && f.end + ttl_ns >= first
        });
        if !explained {
            fig.ck7 += 1;
            example(
                &mut fig,
                format!(
                    "CK7: {owner}'s lock copy {tok} belonged to no holder for {:.0} ms",
                    (last - first) as f64 / 1e6
                ),
            );
        }
    }

    // CK7, resources: a worker's live tasks and memory must not grow with the operations it
    // ran, and its open connections must stay few.
    let mut per_worker: HashMap<(u64, u64), Vec<(u64, u64)>> = HashMap::new();
    for e in events.iter().filter(|e| s(e, "ev") == "done") {
        if let (Some(w), Some(tasks), Some(rss)) = (u(e, "w"), u(e, "tasks"), u(e, "rss_kb")) {
            per_worker
                .entry((w, u(e, "inc").unwrap_or(0)))
                .or_default()
                .push((tasks, rss));
        }
    }
    for ((w, inc), samples) in &per_worker {
        // After a warm-up of 10 operations (connections, caches), growth means a leak.
        if samples.len() < 30 {
            continue;
        }
        let (t0, m0) = samples[9];
        let (t1, m1) = samples[samples.len() - 1];
        fig.ck7_tasks_grown = fig.ck7_tasks_grown.max(t1.saturating_sub(t0));
        if t1 > t0 + LEAK_TASKS || m1 > m0 + LEAK_RSS_KB {
            fig.ck7 += 1;
            example(
                &mut fig,
                format!(
                    "CK7: worker {w}.{inc} grew from {t0} to {t1} tasks and {m0} to {m1} KiB \
                     over {} operations",
                    samples.len()
                ),
            );
        }
    }
    for e in events.iter().filter(|e| s(e, "ev") == "connections") {
        for (w, per_server) in e
            .get("open")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for n in per_server
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
            {
                fig.ck7_max_connections = fig.ck7_max_connections.max(n);
                if n > LEAK_CONNECTIONS {
                    fig.ck7 += 1;
                    example(
                        &mut fig,
                        format!("CK7: worker {w} kept {n} connections to one server"),
                    );
                }
            }
        }
    }

    // CK8: server-side loss → the holder's lost signal.
    for f in faults.iter().filter(|f| f.kind == "steal") {
        let Some(n) = f.n else { continue };
        let Some(h) = holds.iter().find(|h| h.n == n) else {
            continue;
        };
        match lost_at.get(&n) {
            Some(&l) if h.end_t.is_none_or(|e| l <= e) => {
                let ms = (l - f.start) as f64 / 1e6;
                fig.ck8_ms.push(ms);
                if l - f.start > bounds.detect_within_ns {
                    fig.ck8 += 1;
                    example(
                        &mut fig,
                        format!("CK8: op {n} learned of its loss after {ms:.0} ms"),
                    );
                }
            }
            // It let go (or checked before writing) before the signal: no sample.
            _ => {}
        }
    }
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
