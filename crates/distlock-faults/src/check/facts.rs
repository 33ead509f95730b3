//! The history read into what the checkers judge: each acquisition put together from its
//! events, the fault windows, the abandoned guards, the loss signals and the late checks.

use std::collections::HashMap;

use serde_json::Value;

use super::{i, s, u};

/// One acquisition, put together from its events.
#[derive(Debug, Clone, Default)]
pub(super) struct Hold {
    pub(super) n: u64,
    pub(super) acq_t: i64,
    pub(super) fence: Option<u64>,
    pub(super) validity_ns: i64,
    /// The latest deadline claimed.
    pub(super) max_vu: i64,
    /// When renewals that succeeded were sent (claimed deadline − validity).
    pub(super) renew_sent: Vec<i64>,
    /// When it stopped acting as holder: release started, guard abandoned, future cancelled,
    /// process killed.
    pub(super) end_t: Option<i64>,
    /// A release that started at this time removed a lock it believed was its own.
    pub(super) release_held_at: Option<i64>,
    /// A reader's share of a read-write lock (it excludes writers only).
    pub(super) shared: bool,
    /// One of this many permits of a semaphore (0: not a permit).
    pub(super) permits: u32,
    /// When its acquire was invoked (the last invoke of its operation before the grant).
    pub(super) inv_t: i64,
}

impl Hold {
    /// Whether `self` and `other` may not both be held at once (a semaphore's permits are
    /// counted instead).
    pub(super) fn excludes(&self, other: &Hold) -> bool {
        self.permits == 0 && other.permits == 0 && !(self.shared && other.shared)
    }
}

/// A fault window, from the history.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) kind: String,
    pub(super) start: i64,
    pub(super) end: i64,
    /// Faults where the server itself loses or cuts leases (restart without persistence,
    /// clock jump, an external delete): violations in their window are counted as caveats.
    pub(super) server_side: bool,
    pub(super) worker: Option<u64>,
    pub(super) n: Option<u64>,
    /// Whether CK7 judges this history's lock freed after it (a kill); not when the killed
    /// hold took several names, judged as a whole instead (`many.rs`).
    pub(super) probe: bool,
}

/// Whether an event (a kill, an abandoned guard) starts a CK7 probe of this history: an event
/// marked `"ck7": false` is judged elsewhere (a multi-name hold, on its whole set of names).
fn probes(e: &Value) -> bool {
    e.get("ck7").and_then(Value::as_bool) != Some(false)
}

/// A history as the checkers read it.
#[derive(Debug)]
pub(super) struct Facts {
    /// Every acquisition, by the time it was granted (then by operation).
    pub(super) holds: Vec<Hold>,
    pub(super) faults: Vec<Fault>,
    /// Guards abandoned: (when, operation).
    pub(super) abandons: Vec<(i64, u64)>,
    /// When each operation was first told its lease was lost.
    pub(super) lost_at: HashMap<u64, i64>,
    /// CK9: checks that passed past their own deadline (op, by how much in ns).
    pub(super) late_checks: Vec<(u64, i64)>,
    /// Acquires that ended without the lock (`fail` or `info`).
    pub(super) acquire_failed: u64,
}

/// Reads `events` (the history) into the facts the checkers judge.
pub(super) fn read(events: &[Value]) -> Facts {
    let mut holds: HashMap<u64, Hold> = HashMap::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut abandons: Vec<(i64, u64)> = Vec::new();
    let mut lost_at: HashMap<u64, i64> = HashMap::new();
    let mut invoked: HashMap<u64, i64> = HashMap::new();
    // CK9: checks that passed past their own deadline (op, by how much in ns).
    let mut late_checks: Vec<(u64, i64)> = Vec::new();
    for e in events {
        let t = i(e, "t").unwrap_or(0);
        let n = u(e, "n");
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
                if s(e, "ev") == "abandon" && probes(e) {
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
                probe: probes(e),
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
    Facts {
        holds,
        faults,
        abandons,
        lost_at,
        late_checks,
        acquire_failed,
    }
}
