//! Multi-name scenarios (`lock_many`): each name's history is taken apart from the run's, so
//! that the checkers, written for one lock, check every name on its own, and their figures are
//! added up. An operation belongs to the history of each name it took, with that name's fence
//! as its fence, and with that name's reads and writes only; an operation that took nothing
//! (its acquire failed) and every event of no operation (faults, the end) belong to all.

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

/// The history of `name`.
pub(crate) fn project(events: &[Value], name: &str) -> Vec<Value> {
    let ops = fences_by_op(events);
    events
        .iter()
        .filter_map(|e| {
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
}
