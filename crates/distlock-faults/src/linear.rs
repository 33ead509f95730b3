//! An independent check of each history: is the protected resource, as the workers saw it, a
//! linearizable fenced register? It rests on nothing the checkers CK1–CK9 compute: the history's
//! reads and writes are taken one register at a time (the fenced counter of each key, and the
//! SQL form's rows `w` and `rw` when the scenario has them), each operation with the interval in
//! which it took effect, and [`wgl::check`] looks for an order of them that the register's
//! rules explain.
//!
//! Each register is checked on its own: linearizability is compositional (a history is
//! linearizable if and only if each object's subhistory is), so a multi-name or partitions
//! scenario is as many small searches.
//!
//! An operation's interval runs from the worker's request (`sent`, its `CLOCK_MONOTONIC` stamp;
//! in histories without it, the operation's previous event) to the orchestrator's record of the
//! answer (`t`). The in-memory registers are applied under the run's lock at `t`; the SQL
//! statements run on a PostgreSQL connection shared by concurrent tasks, between the two. A
//! SQL request that failed (`sql_error`) may or may not have taken effect: its read of row `rw`
//! (which raises the row's fence) and its writes are operations that never completed.

mod wgl;

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};

use self::wgl::{Action, Model, Op, Outcome, State};

/// Steps of the search per register before it gives up ("unknown"): a thousand times what a
/// 60 s history of four workers needs (about one step per operation), and under a second or
/// two of a debug build's time.
const LIMIT: u64 = 3_000_000;

/// The history's record of an operation, to name it in the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The operation (`n`) that read or wrote.
    pub(crate) n: u64,
    pub(crate) w: Option<u64>,
    /// When the answer was recorded.
    pub(crate) t: i64,
    /// What it did and was answered, in words.
    pub(crate) what: String,
}

/// One register's verdict.
#[derive(Debug, Clone)]
pub(crate) struct RegisterVerdict {
    pub(crate) name: String,
    pub(crate) ops: usize,
    pub(crate) steps: u64,
    pub(crate) outcome: Outcome,
    /// For a register that is not linearizable: the operation no order could place, and the
    /// register's value and floor after the longest order that fit before it.
    pub(crate) offender: Option<(Origin, State)>,
}

/// The verdict on a whole history.
#[derive(Debug, Clone, Default)]
pub(crate) struct Verdict {
    pub(crate) registers: Vec<RegisterVerdict>,
    pub(crate) ms: f64,
}

/// A register's operations as the history has them.
struct Register {
    model: Model,
    ops: Vec<Op>,
    origins: Vec<Origin>,
}

fn register<'a>(
    regs: &'a mut Vec<(String, Register)>,
    name: &str,
    read_raises: bool,
) -> &'a mut Register {
    let i = match regs.iter().position(|(n, _)| n == name) {
        Some(i) => i,
        None => {
            regs.push((
                name.to_owned(),
                Register {
                    model: Model { read_raises },
                    ops: Vec::new(),
                    origins: Vec::new(),
                },
            ));
            regs.len() - 1
        }
    };
    &mut regs[i].1
}

fn describe(a: Action) -> String {
    let fence = |f: Option<u64>| f.map_or("no fence".to_owned(), |f| format!("fence {f}"));
    match a {
        Action::Read { fence: f, value } => match value {
            Some(v) => format!("read with {} that returned {v}", fence(f)),
            None => format!("read with {} whose answer is unknown", fence(f)),
        },
        Action::Write {
            fence: f,
            value,
            accepted,
        } => format!(
            "write of {value} with {} {}",
            fence(f),
            match accepted {
                Some(true) => "that was accepted",
                Some(false) => "that was refused",
                None => "whose answer is unknown",
            }
        ),
    }
}

/// The registers' operations in `events`; the in-memory fenced registers only with an engine
/// that hands out fencing tokens (without one, the fenced resource is never written).
fn registers(events: &[Value], fenced_engine: bool) -> Vec<(String, Register)> {
    let mut regs: Vec<(String, Register)> = Vec::new();
    // The latest stamp of each operation's events so far, and its latest SQL read (`sw`,
    // `srw`) for each key: what its write for that key wrote when the answer is lost.
    let mut last_t: HashMap<u64, i64> = HashMap::new();
    let mut sql_read: HashMap<(u64, String), (Option<i64>, Option<i64>)> = HashMap::new();
    for e in events {
        let ev = e.get("ev").and_then(Value::as_str).unwrap_or("");
        let n = e.get("n").and_then(Value::as_u64).unwrap_or(0);
        let t = e.get("t").and_then(Value::as_i64).unwrap_or(0);
        if ev != "read" && ev != "write" {
            if e.get("n").is_some() {
                last_t.insert(n, t);
            }
            continue;
        }
        let call = e
            .get("sent")
            .and_then(Value::as_i64)
            .or_else(|| last_t.get(&n).copied())
            .unwrap_or(t)
            .min(t);
        last_t.insert(n, t);
        let fence = e.get("fence").and_then(Value::as_u64);
        let key = e.get("key").and_then(Value::as_str).unwrap_or("k");
        let int = |k: &str| e.get(k).and_then(Value::as_i64);
        let flag = |k: &str| e.get(k).and_then(Value::as_bool);
        let w = e.get("w").and_then(Value::as_u64);
        let sql_error = e.get("sql_error").is_some();
        let mut add = |name: &str, raises: bool, action: Action, done: bool| {
            let r = register(&mut regs, name, raises);
            r.ops.push(Op {
                call,
                ret: done.then_some(t),
                action,
            });
            r.origins.push(Origin {
                n,
                w,
                t,
                what: describe(action),
            });
        };
        if ev == "read" {
            if fenced_engine {
                let value = int("value");
                add(key, true, Action::Read { fence, value }, true);
            }
            if sql_error {
                sql_read.insert((n, key.to_owned()), (None, None));
                let value = None;
                add("sql rw", true, Action::Read { fence, value }, false);
            } else if int("sw").is_some() || int("srw").is_some() {
                sql_read.insert((n, key.to_owned()), (int("sw"), int("srw")));
                let value = int("sw");
                add("sql w", false, Action::Read { fence, value }, true);
                let value = int("srw");
                add("sql rw", true, Action::Read { fence, value }, true);
            }
            continue;
        }
        if fenced_engine {
            let value = int("value").unwrap_or(0);
            let accepted = flag("accepted");
            let action = Action::Write {
                fence,
                value,
                accepted,
            };
            add(key, true, action, true);
        }
        let rows = [("sql w", "sw", 0), ("sql rw", "srw", 1)];
        for (name, field, at) in rows {
            if sql_error {
                // The worker wrote its read plus one (0 when that read failed too).
                let read = sql_read
                    .get(&(n, key.to_owned()))
                    .copied()
                    .unwrap_or_default();
                let read = if at == 0 { read.0 } else { read.1 };
                let value = read.map_or(0, |v| v + 1);
                let action = Action::Write {
                    fence,
                    value,
                    accepted: None,
                };
                add(name, at == 1, action, false);
            } else if let Some(accepted) = flag(&format!("{field}_accepted")) {
                let value = int(field).unwrap_or(0);
                let accepted = Some(accepted);
                let action = Action::Write {
                    fence,
                    value,
                    accepted,
                };
                add(name, at == 1, action, true);
            }
        }
    }
    regs
}

/// Checks every register of the history `events`.
pub(crate) fn check_history(events: &[Value], fenced_engine: bool) -> Verdict {
    check_with_limit(events, fenced_engine, LIMIT)
}

fn check_with_limit(events: &[Value], fenced_engine: bool, limit: u64) -> Verdict {
    let started = Instant::now();
    let mut registers_checked = Vec::new();
    for (name, r) in registers(events, fenced_engine) {
        let search = wgl::check(r.model, State::default(), &r.ops, limit);
        let offender = match &search.outcome {
            Outcome::NotLinearizable { op, state, .. } => {
                r.origins.get(*op).map(|o| (o.clone(), *state))
            }
            _ => None,
        };
        registers_checked.push(RegisterVerdict {
            name,
            ops: r.ops.len(),
            steps: search.steps,
            outcome: search.outcome,
            offender,
        });
    }
    Verdict {
        registers: registers_checked,
        ms: started.elapsed().as_secs_f64() * 1e3,
    }
}

impl RegisterVerdict {
    fn word(&self) -> &'static str {
        match self.outcome {
            Outcome::Linearizable => "linearizable",
            Outcome::NotLinearizable { .. } => "not linearizable",
            Outcome::Unknown => "unknown (search limit)",
        }
    }

    /// The offending operation in words.
    pub(crate) fn explain(&self) -> Option<String> {
        let (o, s) = self.offender.as_ref()?;
        let placed = match self.outcome {
            Outcome::NotLinearizable { placed, .. } => placed,
            _ => 0,
        };
        Some(format!(
            "register {}: op {} (worker {}), a {}, fits no order: after the longest order that \
             fits ({placed} operations), the register held {} with fence floor {}",
            self.name,
            o.n,
            o.w.map_or("?".to_owned(), |w| w.to_string()),
            o.what,
            s.value,
            s.floor
        ))
    }
}

impl Verdict {
    /// Registers that are not linearizable (each one is a violation).
    pub(crate) fn violations(&self) -> u64 {
        self.registers
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::NotLinearizable { .. }))
            .count() as u64
    }

    /// Registers the search gave up on.
    pub(crate) fn unknown(&self) -> usize {
        self.registers
            .iter()
            .filter(|r| r.outcome == Outcome::Unknown)
            .count()
    }

    /// The first register's offending operation.
    pub(crate) fn offender(&self) -> Option<&RegisterVerdict> {
        self.registers.iter().find(|r| r.offender.is_some())
    }

    /// For the scenario's line.
    pub(crate) fn summary(&self) -> String {
        let ops: usize = self.registers.iter().map(|r| r.ops).sum();
        let n = self.registers.len();
        let head = if n == 0 {
            return "linearizability n/a (no fenced register: no fencing tokens)".to_owned();
        } else if self.violations() > 0 {
            let bad: Vec<&str> = self
                .registers
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::NotLinearizable { .. }))
                .map(|r| r.name.as_str())
                .collect();
            format!("NOT linearizable ({})", bad.join(", "))
        } else if self.unknown() > 0 {
            format!(
                "linearizability unknown (search limit) on {}",
                self.unknown()
            )
        } else {
            "linearizable".to_owned()
        };
        format!(
            "{head}: {n} register{} ({ops} operations) in {:.0} ms",
            if n == 1 { "" } else { "s" },
            self.ms
        )
    }

    /// An example line for a history that is not linearizable.
    pub(crate) fn example(&self) -> Option<String> {
        self.offender()
            .and_then(RegisterVerdict::explain)
            .map(|x| format!("LIN: {x}"))
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "linearizable": self.violations() == 0 && self.unknown() == 0,
            "violations": self.violations(),
            "unknown": self.unknown(),
            "ms": self.ms,
            "registers": self.registers.iter().map(|r| json!({
                "name": r.name, "ops": r.ops, "steps": r.steps, "verdict": r.word(),
                "op": r.offender.as_ref().map(|(o, _)| o.n),
                "worker": r.offender.as_ref().and_then(|(o, _)| o.w),
                "t": r.offender.as_ref().map(|(o, _)| o.t),
                "why": r.explain(),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests;
