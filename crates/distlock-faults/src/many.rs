//! Multi-name scenarios (`lock_many`): each name's history is taken apart from the run's, so
//! that the checkers, written for one lock, check every name on its own, and their figures are
//! added up. An operation belongs to the history of each name it took, with that name's fence
//! as its fence, and with that name's reads and writes only; an operation that took nothing
//! (its acquire failed) and every event of no operation (faults, the end) belong to all, but
//! for a kill of known holders, which belongs to the histories of the names they took.
//!
//! CK7 (the lock is held again soon after its holder died or abandoned it) is judged on the
//! whole set of a multi-name hold: its names are one lease, freed together, and a name of it
//! may rightly stay free while every client that wants it also wants a name somebody else
//! holds (a waiter holds nothing while it waits). So the death of such a hold asks that one of
//! its names be taken again within the bound, and the per-name histories do not probe it
//! (their events are marked `"ck7": false`).

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use crate::check::{Bounds, Figures, check};
use crate::resource::Register;

/// Each acquired operation's fences by name, from its `ok acquire` event.
fn fences_by_op(events: &[Value]) -> HashMap<u64, Map<String, Value>> {
    events
        .iter()
        .filter(|e| e["ev"] == "ok" && e["f"] == "acquire")
        .filter_map(|e| Some((e["n"].as_u64()?, e.get("fences")?.as_object()?.clone())))
        .collect()
}

/// The names that some operation took.
pub(crate) fn names(events: &[Value]) -> BTreeSet<String> {
    fences_by_op(events)
        .into_values()
        .flat_map(|m| m.into_iter().map(|(k, _)| k))
        .collect()
}

/// The names the holds a kill names (`holds`) took; empty when it names none that took any.
fn killed_names<'a>(e: &Value, ops: &'a HashMap<u64, Map<String, Value>>) -> BTreeSet<&'a str> {
    if e["ev"] != "fault" || e["kind"] != "kill-holder" {
        return BTreeSet::new();
    }
    e["holds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| ops.get(&n.as_u64()?))
        .flat_map(|fences| fences.keys().map(String::as_str))
        .collect()
}

/// The history of `name`.
pub(crate) fn project(events: &[Value], name: &str) -> Vec<Value> {
    let ops = fences_by_op(events);
    events
        .iter()
        .filter_map(|e| {
            let killed = killed_names(e, &ops);
            if !killed.is_empty() {
                if !killed.contains(name) {
                    return None;
                }
                let mut e = e.clone();
                if killed.len() > 1 {
                    e["ck7"] = Value::Bool(false);
                }
                return Some(e);
            }
            let Some(fences) = e["n"].as_u64().and_then(|n| ops.get(&n)) else {
                return Some(e.clone());
            };
            let fence = fences.get(name)?;
            if matches!(e["ev"].as_str(), Some("read" | "write")) && e["key"] != name {
                return None;
            }
            let mut e = e.clone();
            if e["ev"] == "ok" && e["f"] == "acquire" {
                e["fence"] = fence.clone();
            }
            if e["ev"] == "abandon" && fences.len() > 1 {
                e["ck7"] = Value::Bool(false);
            }
            Some(e)
        })
        .collect()
}

/// CK7 on multi-name holds: after one dies (its worker killed) or is abandoned, one of its
/// names is taken again within the bound (see the module's doc).
fn free_sets(events: &[Value], bounds: Bounds, run_end: i64, all: &mut Figures) {
    let ops = fences_by_op(events);
    let t = |e: &Value| e["t"].as_i64().unwrap_or(0);
    let mut probes: Vec<(i64, BTreeSet<&str>, String)> = Vec::new();
    for e in events {
        let killed = killed_names(e, &ops);
        if killed.len() > 1 {
            let start = e["start"].as_i64().unwrap_or_else(|| t(e));
            probes.push((start, killed, format!("worker {} was killed", e["w"])));
        } else if e["ev"] == "abandon"
            && let Some(fences) = e["n"].as_u64().and_then(|n| ops.get(&n))
            && fences.len() > 1
        {
            let names = fences.keys().map(String::as_str).collect();
            probes.push((t(e), names, format!("op {} abandoned its lock", e["n"])));
        }
    }
    for (from, names, what) in probes {
        all.ck7_probes += 1;
        let next = events
            .iter()
            .filter(|e| e["ev"] == "ok" && e["f"] == "acquire" && t(e) > from)
            .filter(|e| {
                e["n"]
                    .as_u64()
                    .and_then(|n| ops.get(&n))
                    .is_some_and(|f| f.keys().any(|k| names.contains(k.as_str())))
            })
            .map(t)
            .min();
        let gap = next.unwrap_or(run_end) - from;
        all.ck7_max_ms = all.ck7_max_ms.max(gap as f64 / 1e6);
        if gap > bounds.free_within_ns {
            all.ck7 += 1;
            let names: Vec<&str> = names.into_iter().collect();
            all.examples.push(format!(
                "CK7: {what} holding {}; none of them was held again for {:.0} ms after",
                names.join(", "),
                gap as f64 / 1e6
            ));
        }
    }
}

/// Every name's checks, added up: violations, counts and examples (each example names its
/// name), the most of the bounds-based figures.
pub(crate) fn check_each(
    events: &[Value],
    registers: &HashMap<String, (Register, Register)>,
    fenced_engine: bool,
    bounds: Bounds,
    run_end: i64,
) -> Figures {
    let mut all = Figures::default();
    let blank = (Register::default(), Register::default());
    for (i, name) in names(events).iter().enumerate() {
        let (fenced, unfenced) = registers.get(name).unwrap_or(&blank);
        let one = check(
            &project(events, name),
            fenced_engine.then_some(fenced),
            unfenced,
            bounds,
            run_end,
        );
        all.absorb(one, name, i == 0);
    }
    free_sets(events, bounds, run_end, &mut all);
    // Every fault once (a kill is in the histories of its names only).
    all.faults.clear();
    for e in events.iter().filter(|e| e["ev"] == "fault") {
        let kind = e["kind"].as_str().unwrap_or("").to_owned();
        *all.faults.entry(kind).or_default() += 1;
    }
    // Operations, not operation × name.
    all.acquisitions = events
        .iter()
        .filter(|e| e["ev"] == "ok" && e["f"] == "acquire")
        .count() as u64;
    all
}

impl Figures {
    /// Adds `one` name's figures; `first` takes what every name's history shares (faults,
    /// failed acquires).
    pub(crate) fn absorb(&mut self, one: Figures, name: &str, first: bool) {
        if first {
            self.faults = one.faults.clone();
            self.acquire_failed = one.acquire_failed;
            self.ck7_tasks_grown = one.ck7_tasks_grown;
            self.ck7_max_connections = one.ck7_max_connections;
        }
        let add = |a: &mut Register, b: &Register| {
            a.value += b.value;
            a.accepted += b.accepted;
            a.rejected += b.rejected;
            a.interleaved += b.interleaved;
            a.token_down += b.token_down;
            a.shared_token += b.shared_token;
        };
        if let Some(f) = &one.fenced {
            add(self.fenced.get_or_insert_with(Register::default), f);
        }
        add(&mut self.unfenced, &one.unfenced);
        self.ck1 += one.ck1;
        self.ck1_caveat += one.ck1_caveat;
        self.ck2 += one.ck2;
        self.ck3 += one.ck3;
        self.ck5 += one.ck5;
        self.ck5_caveat += one.ck5_caveat;
        self.ck6 += one.ck6;
        self.ck6_caveat += one.ck6_caveat;
        self.ck7_probes += one.ck7_probes;
        self.ck7_max_ms = self.ck7_max_ms.max(one.ck7_max_ms);
        self.ck7 += one.ck7;
        self.ck7_leaks += one.ck7_leaks;
        self.ck8_ms.extend(one.ck8_ms);
        self.ck8 += one.ck8;
        self.ck9 += one.ck9;
        self.examples
            .extend(one.examples.into_iter().map(|x| format!("{name}: {x}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_name_gets_its_operations_fences_and_writes() {
        let events = vec![
            json!({"ev": "fault", "t": 1}),
            json!({"ev": "invoke", "f": "acquire", "n": 1, "t": 2}),
            json!({"ev": "ok", "f": "acquire", "n": 1, "t": 3, "fence": 5,
                "fences": {"k0": 5, "k1": 9}}),
            json!({"ev": "write", "n": 1, "key": "k0", "fence": 5, "t": 4}),
            json!({"ev": "write", "n": 1, "key": "k1", "fence": 9, "t": 5}),
            json!({"ev": "ok", "f": "acquire", "n": 2, "t": 6, "fence": 7,
                "fences": {"k0": 7}}),
            json!({"ev": "fail", "f": "acquire", "n": 3, "t": 7}),
        ];
        assert_eq!(names(&events), BTreeSet::from(["k0".into(), "k1".into()]));
        let k1 = project(&events, "k1");
        // The fault, op 1's invoke, grant (with k1's fence) and k1 write, op 3's failure.
        assert_eq!(k1.len(), 5, "{k1:?}");
        assert_eq!(k1[2]["fence"], 9);
        assert!(k1.iter().all(|e| e["n"] != 2));
        assert!(k1.iter().all(|e| e["ev"] != "write" || e["key"] == "k1"));
        let k0 = project(&events, "k0");
        assert_eq!(k0.iter().filter(|e| e["ev"] == "ok").count(), 2);
    }

    fn bounds() -> Bounds {
        Bounds {
            free_within_ns: 30,
            detect_within_ns: 10,
            caveat_window_ns: 0,
            split_brain: false,
        }
    }

    /// Op 1 holds k0 and k1 and is killed at 20; op 2 takes `second` at 25; op 3 takes k0
    /// alone at 100 (past the bound of 30).
    fn killed_pair(second: Value) -> Vec<Value> {
        vec![
            json!({"ev": "invoke", "f": "acquire", "n": 1, "w": 0, "t": 9}),
            json!({"ev": "ok", "f": "acquire", "n": 1, "w": 0, "t": 10, "fence": 1,
                "fences": {"k0": 1, "k1": 1}}),
            json!({"ev": "fault", "kind": "kill-holder", "w": 0, "holder": 1, "holds": [1],
                "start": 20, "end": 20, "t": 20}),
            json!({"ev": "invoke", "f": "acquire", "n": 2, "w": 1, "t": 21}),
            json!({"ev": "ok", "f": "acquire", "n": 2, "w": 1, "t": 25, "fence": 2,
                "fences": second}),
            json!({"ev": "invoke", "f": "release", "n": 2, "w": 1, "t": 26}),
            json!({"ev": "invoke", "f": "acquire", "n": 3, "w": 2, "t": 22}),
            json!({"ev": "ok", "f": "acquire", "n": 3, "w": 2, "t": 100, "fence": 3,
                "fences": {"k0": 3}}),
            json!({"ev": "invoke", "f": "release", "n": 3, "w": 2, "t": 101}),
        ]
    }

    #[test]
    fn a_killed_multi_name_hold_is_freed_when_one_of_its_names_is_taken_again() {
        let regs = HashMap::new();
        // k1 taken again at 25 (its lease is k0's): k0 free until 100 is no miss, as op 2's
        // set held k2 (in the run this came from, every waiter for k0 also wanted k2).
        let events = killed_pair(json!({"k1": 2, "k2": 2}));
        let fig = check_each(&events, &regs, true, bounds(), 200);
        assert_eq!(fig.ck7, 0, "{:?}", fig.examples);
        assert!(fig.ck7_probes >= 1);
        assert_eq!(fig.faults.get("kill-holder").copied(), Some(1));
        // The kill is in its names' histories only, and not probed there.
        assert!(project(&events, "k2").iter().all(|e| e["ev"] != "fault"));
        let k0 = project(&events, "k0");
        let kill = k0.iter().find(|e| e["ev"] == "fault").expect("the kill");
        assert_eq!(kill["ck7"], false);
        // Neither name taken again within the bound: a miss, named by the set.
        let events = killed_pair(json!({"k2": 2}));
        let fig = check_each(&events, &regs, true, bounds(), 200);
        assert_eq!(fig.ck7, 1, "{:?}", fig.examples);
        assert!(
            fig.examples
                .iter()
                .any(|x| x.starts_with("CK7: worker 0 was killed holding k0, k1; none")),
            "{:?}",
            fig.examples
        );
    }

    #[test]
    fn a_killed_single_name_hold_is_still_probed_on_its_name() {
        let regs = HashMap::new();
        let mut events = killed_pair(json!({"k2": 2}));
        // Op 1 took k0 alone.
        events[1]["fences"] = json!({"k0": 1});
        let fig = check_each(&events, &regs, true, bounds(), 200);
        assert_eq!(fig.ck7, 1, "{:?}", fig.examples);
        assert!(
            fig.examples.iter().any(|x| x.starts_with("k0: CK7")),
            "{:?}",
            fig.examples
        );
    }
}
