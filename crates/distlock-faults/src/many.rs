//! Multi-name scenarios (`lock_many`): each name's history is taken apart from the run's, so
//! that the checkers, written for one lock, check every name on its own, and their figures are
//! added up. An operation belongs to the history of each name it took, with that name's fence
//! as its fence, and with that name's reads and writes only; an operation that took nothing
//! (its acquire failed) and every event of no operation (faults, the end) belong to all, but
//! for a kill of known holders, which belongs to the histories of the names they took.
//!
//! CK7's time to free is judged here, not in the per-name histories (their kills and abandoned
//! guards are marked `"ck7": false`): a name may rightly stay free while every client that
//! wants it also wants a name somebody else holds (see `many/free.rs`).

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use crate::check::{Bounds, Figures, check};
use crate::resource::Register;

mod free;

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
                e["ck7"] = Value::Bool(false);
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
            if e["ev"] == "abandon" {
                e["ck7"] = Value::Bool(false);
            }
            Some(e)
        })
        .collect()
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
    free::check(events, &fences_by_op(events), bounds, run_end, &mut all);
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

    /// Op 1 (`first`, asked for as its keys) is killed at 20. Op 2 takes k1 and k2 at 25 and
    /// holds them until 90; op 3 asks for k0 and k2 at 22 and gets them at 95: k0 is free from
    /// the kill (its lease ends at once here) to 95, but op 3 could have taken its set only
    /// from 22 to 25 and from 90 to 95.
    fn killed(first: Value) -> Vec<Value> {
        let names: Vec<&String> = first.as_object().unwrap().keys().collect();
        vec![
            json!({"ev": "invoke", "f": "acquire", "n": 1, "w": 0, "t": 9, "keys": names}),
            json!({"ev": "ok", "f": "acquire", "n": 1, "w": 0, "t": 10, "vu": 20,
                "fences": first}),
            json!({"ev": "fault", "kind": "kill-holder", "w": 0, "holder": 1, "holds": [1],
                "start": 20, "end": 20, "t": 20}),
            json!({"ev": "invoke", "f": "acquire", "n": 2, "w": 1, "t": 21,
                "keys": ["k1", "k2"]}),
            json!({"ev": "invoke", "f": "acquire", "n": 3, "w": 2, "t": 22,
                "keys": ["k0", "k2"]}),
            json!({"ev": "ok", "f": "acquire", "n": 2, "w": 1, "t": 25, "vu": 1000,
                "fences": {"k1": 2, "k2": 2}}),
            json!({"ev": "invoke", "f": "release", "n": 2, "w": 1, "t": 90}),
            json!({"ev": "ok", "f": "acquire", "n": 3, "w": 2, "t": 95, "vu": 1000,
                "fences": {"k0": 3, "k2": 3}}),
            json!({"ev": "invoke", "f": "release", "n": 3, "w": 2, "t": 101}),
        ]
    }

    /// Op 4 asks for k0 alone at 30 and gives up at 95: it could have taken it all along.
    fn with_a_waiter_for_k0_alone(mut events: Vec<Value>) -> Vec<Value> {
        events.push(
            json!({"ev": "invoke", "f": "acquire", "n": 4, "w": 3, "t": 30,
            "keys": ["k0"]}),
        );
        events.push(json!({"ev": "info", "f": "acquire", "n": 4, "w": 3, "t": 95}));
        events.sort_by_key(|e| e["t"].as_i64());
        events
    }

    #[test]
    fn a_name_free_while_its_waiters_want_a_held_name_is_no_miss() {
        let regs = HashMap::new();
        // Per name, k0 free for 75 would be a miss (bound 30); op 3 could take its set 8.
        let events = killed(json!({"k0": 1, "k1": 1}));
        let fig = check_each(&events, &regs, true, bounds(), 200);
        assert_eq!(fig.ck7, 0, "{:?}", fig.examples);
        assert_eq!(fig.ck7_probes, 2, "one probe a name of the killed hold");
        assert_eq!(fig.faults.get("kill-holder").copied(), Some(1));
        // The kill is in its names' histories only, and not probed there.
        assert!(project(&events, "k2").iter().all(|e| e["ev"] != "fault"));
        let k0 = project(&events, "k0");
        let kill = k0.iter().find(|e| e["ev"] == "fault").expect("the kill");
        assert_eq!(kill["ck7"], false);
        // The same with a single-name holder of k0.
        let fig = check_each(&killed(json!({"k0": 1})), &regs, true, bounds(), 200);
        assert_eq!((fig.ck7, fig.ck7_probes), (0, 1), "{:?}", fig.examples);
    }

    #[test]
    fn a_name_left_locked_while_a_client_could_take_all_it_asked_for_is_a_miss() {
        let regs = HashMap::new();
        for first in [json!({"k0": 1, "k1": 1}), json!({"k0": 1})] {
            let events = with_a_waiter_for_k0_alone(killed(first));
            let fig = check_each(&events, &regs, true, bounds(), 200);
            assert_eq!(fig.ck7, 1, "{:?}", fig.examples);
            // Counted: 22-25 and 90-95 (op 3), 30-90 (op 4).
            assert!(
                fig.examples.iter().any(|x| x.starts_with(
                    "k0: CK7: worker 0 was killed; nobody held k0 for 0 ms after, 0 ms"
                )),
                "{:?}",
                fig.examples
            );
            assert!((fig.ck7_max_ms - 68e-6).abs() < 1e-9, "{}", fig.ck7_max_ms);
        }
    }

    #[test]
    fn an_abandoned_multi_name_guard_is_judged_the_same_way() {
        let regs = HashMap::new();
        let mut events = killed(json!({"k0": 1, "k1": 1}));
        // Op 1 abandons its guard at 20 instead of being killed.
        events[2] = json!({"ev": "abandon", "n": 1, "w": 0, "t": 20});
        let fig = check_each(&events, &regs, true, bounds(), 200);
        assert_eq!((fig.ck7, fig.ck7_probes), (0, 2), "{:?}", fig.examples);
        let fig = check_each(
            &with_a_waiter_for_k0_alone(events),
            &regs,
            true,
            bounds(),
            200,
        );
        assert_eq!(fig.ck7, 1, "{:?}", fig.examples);
    }
}
