//! Group partitions (`Kinds::Partitions`): every worker is a member of one group, and each
//! ownership of a partition (a partition with one fence, from the moment the member's
//! `owned()` lists it to the moment it stops acting on it) is one *hold* of the history, with
//! a number of its own (`worker::hold_number`). Each partition's history is taken apart from
//! the run's, so that the checkers, written for one lock, check every partition's owners on
//! their own (CK1 and CK2 on the partition's fenced resource, CK3 on its fences, CK5 on the
//! owners' claims, CK7 after a kill of an owner), and their figures are added up, as
//! `many.rs` does for names.
//!
//! A partition's history holds its holds' events (grant, reads, checks, writes, the end), the
//! kills of a worker that held it then, the other faults, and the run's start and end. The
//! rest (joins, leaves, each stint's `done`, the connections at the end) is checked once, on
//! its own.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use crate::check::{Bounds, Figures, Handovers, check};
use crate::resource::Register;

fn ev(e: &Value) -> &str {
    e["ev"].as_str().unwrap_or("")
}

/// Each hold's partition, from its `ok acquire`.
fn partition_by_hold(events: &[Value]) -> HashMap<u64, u64> {
    events
        .iter()
        .filter(|e| ev(e) == "ok" && e["f"] == "acquire")
        .filter_map(|e| Some((e["n"].as_u64()?, e["partition"].as_u64()?)))
        .collect()
}

/// The partitions that some member owned.
pub(crate) fn partitions(events: &[Value]) -> BTreeSet<u64> {
    partition_by_hold(events).into_values().collect()
}

/// A kill of a worker, as `partition`'s history has it: with the hold of that partition the
/// worker had as its holder, or none when it had none.
fn kill_for(e: &Value, partition: u64, holds: &HashMap<u64, u64>) -> Option<Value> {
    let held = e["holds"]
        .as_array()?
        .iter()
        .filter_map(Value::as_u64)
        .find(|h| holds.get(h) == Some(&partition))?;
    let mut e = e.clone();
    e["holder"] = json!(held);
    Some(e)
}

fn is_kill(e: &Value) -> bool {
    ev(e) == "fault" && e["kind"] == "kill-holder"
}

/// The history of `partition`. A kill is its owner's only if the killed worker's hold of it
/// was the partition's latest grant: a worker that had not yet seen the partition move on
/// (granted to another member just before) was no longer its owner.
pub(crate) fn project(events: &[Value], partition: u64) -> Vec<Value> {
    let holds = partition_by_hold(events);
    let mut latest: Option<u64> = None;
    events
        .iter()
        .filter_map(|e| {
            if let Some(p) = e["n"].as_u64().and_then(|n| holds.get(&n)) {
                if *p == partition && ev(e) == "ok" && e["f"] == "acquire" {
                    latest = e["n"].as_u64();
                }
                return (*p == partition).then(|| e.clone());
            }
            if is_kill(e) {
                return kill_for(e, partition, &holds)
                    .filter(|k| k["holder"].as_u64().is_some() && k["holder"].as_u64() == latest);
            }
            matches!(ev(e), "fault" | "start" | "end").then(|| e.clone())
        })
        .collect()
}

/// What is no partition's: the stints (joins, leaves, `done`), the connections at the end,
/// and the faults other than kills (which each partition's history has).
fn rest(events: &[Value]) -> Vec<Value> {
    let holds = partition_by_hold(events);
    events
        .iter()
        .filter(|e| !e["n"].as_u64().is_some_and(|n| holds.contains_key(&n)) && !is_kill(e))
        .cloned()
        .collect()
}

/// Every partition's checks, added up (each example names its partition), with the run's
/// own checks (a worker's tasks and memory, its connections), the faults, the ownerships as
/// acquisitions, the joins that failed as acquires that gave up, and the handovers.
pub(crate) fn check_each(
    events: &[Value],
    registers: &HashMap<String, (Register, Register)>,
    fenced_engine: bool,
    bounds: Bounds,
    run_end: i64,
) -> Figures {
    let mut all = Figures::default();
    all.absorb(
        check(&rest(events), None, &Register::default(), bounds, run_end),
        "run",
        true,
    );
    let blank = (Register::default(), Register::default());
    for p in partitions(events) {
        let name = format!("p{p}");
        let (fenced, unfenced) = registers.get(&name).unwrap_or(&blank);
        let one = check(
            &project(events, p),
            fenced_engine.then_some(fenced),
            unfenced,
            bounds,
            run_end,
        );
        all.absorb(one, &name, false);
    }
    all.faults.clear();
    for e in events.iter().filter(|e| ev(e) == "fault") {
        *all.faults
            .entry(e["kind"].as_str().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    all.acquisitions = partition_by_hold(events).len() as u64;
    all.acquire_failed = events
        .iter()
        .filter(|e| matches!(ev(e), "fail" | "info") && e["f"] == "join")
        .count() as u64;
    all.handovers = Some(handovers(events));
    all
}

/// One ownership, for the handovers.
#[derive(Debug, Clone, Copy)]
struct Stint {
    partition: u64,
    from: i64,
    /// The last instant it claimed (its grant, its checks).
    claimed: i64,
    /// When it stopped acting on it, as its worker reported (or when it was killed).
    end: Option<i64>,
    failed: bool,
}

/// How long each partition stayed without an owner between two ownerships. An ownership ends
/// when its worker stopped acting on it, or was killed; when that was reported after the next
/// owner's grant, it ends at its last claim instead. It was lost when its worker was killed,
/// its lease was lost, or its membership was (`why` `lost`: a pause, a cut link); otherwise
/// it was let go.
pub(crate) fn handovers(events: &[Value]) -> Handovers {
    let mut stints: HashMap<u64, Stint> = HashMap::new();
    for e in events {
        let t = e["t"].as_i64().unwrap_or(0);
        let n = e["n"].as_u64();
        match (ev(e), e["f"].as_str().unwrap_or("")) {
            ("ok", "acquire") => {
                if let (Some(n), Some(partition)) = (n, e["partition"].as_u64()) {
                    stints.insert(
                        n,
                        Stint {
                            partition,
                            from: t,
                            claimed: t,
                            end: None,
                            failed: false,
                        },
                    );
                }
            }
            ("check", _) => {
                if let Some(s) = n.and_then(|n| stints.get_mut(&n)) {
                    s.claimed = s.claimed.max(e["checked"].as_i64().unwrap_or(t));
                }
            }
            ("lost", _) => {
                if let Some(s) = n.and_then(|n| stints.get_mut(&n)) {
                    s.failed = true;
                }
            }
            ("invoke", "release") => {
                if let Some(s) = n.and_then(|n| stints.get_mut(&n)) {
                    s.end = Some(s.end.map_or(t, |x| x.min(t)));
                    s.failed |= e["why"] == "lost";
                }
            }
            ("fault", _) if is_kill(e) => {
                let at = e["start"].as_i64().unwrap_or(t);
                for h in e["holds"].as_array().into_iter().flatten() {
                    if let Some(s) = h.as_u64().and_then(|h| stints.get_mut(&h)) {
                        s.failed = true;
                        s.end = Some(s.end.map_or(at, |x| x.min(at)));
                    }
                }
            }
            _ => {}
        }
    }
    let mut by_partition: HashMap<u64, Vec<Stint>> = HashMap::new();
    for s in stints.into_values() {
        by_partition.entry(s.partition).or_default().push(s);
    }
    let mut out = Handovers::default();
    for list in by_partition.values_mut() {
        list.sort_by_key(|s| s.from);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let Some(end) = a.end else { continue };
            // An owner notices that it let a partition go, or lost it, at its next look (or
            // when it wakes up, paused): after the next owner's grant, it ended at its last
            // claim.
            let end = if end > b.from { a.claimed } else { end };
            let ms = (b.from - end).max(0) as f64 / 1e6;
            if a.failed {
                out.failed_ms.push(ms);
            } else {
                out.released_ms.push(ms);
            }
        }
    }
    out.released_ms.sort_by(f64::total_cmp);
    out.failed_ms.sort_by(f64::total_cmp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::hold_number;

    const MS: i64 = 1_000_000;

    fn history() -> Vec<Value> {
        let (a, b, c) = (
            hold_number(0, 0, 1),
            hold_number(0, 0, 2),
            hold_number(1, 0, 1),
        );
        vec![
            json!({"ev": "start", "t": 0, "ttl_ms": 1000}),
            json!({"ev": "ok", "f": "join", "n": 1, "t": 1}),
            json!({"ev": "ok", "f": "acquire", "n": a, "t": 10 * MS, "partition": 3, "fence": 5}),
            json!({"ev": "ok", "f": "acquire", "n": b, "t": 11 * MS, "partition": 4, "fence": 2}),
            json!({"ev": "read", "n": a, "t": 12 * MS, "key": "p3", "fence": 5}),
            json!({"ev": "check", "n": a, "t": 13 * MS, "checked": 13 * MS, "vu": 13 * MS + 1}),
            json!({"ev": "write", "n": a, "t": 14 * MS, "key": "p3", "fence": 5}),
            json!({"ev": "fault", "kind": "pause-holder", "w": 0, "t": 15 * MS}),
            json!({"ev": "invoke", "f": "release", "n": b, "t": 20 * MS}),
            json!({"ev": "fault", "kind": "kill-holder", "w": 0, "holder": b,
                "holds": [a], "start": 30 * MS, "t": 30 * MS}),
            json!({"ev": "ok", "f": "acquire", "n": c, "t": 50 * MS, "partition": 4, "fence": 3}),
            json!({"ev": "ok", "f": "acquire", "n": c + 1, "t": 900 * MS, "partition": 3,
                "fence": 6}),
            json!({"ev": "done", "n": 1, "t": 60 * MS, "tasks": 3, "rss_kb": 10}),
            json!({"ev": "end", "t": 1000 * MS}),
        ]
    }

    #[test]
    fn each_partition_gets_its_owners_and_the_kills_of_its_owners() {
        let events = history();
        assert_eq!(partitions(&events), BTreeSet::from([3, 4]));
        let p3 = project(&events, 3);
        // start, a's grant, read, check and write, the pause, the kill (a's), c+1's grant, end.
        assert_eq!(p3.len(), 9, "{p3:?}");
        let kill = p3.iter().find(|e| is_kill(e)).unwrap();
        assert_eq!(kill["holder"], hold_number(0, 0, 1));
        let p4 = project(&events, 4);
        // The kill came after b let p4 go: not p4's.
        assert!(p4.iter().all(|e| !is_kill(e)), "{p4:?}");
        assert!(p4.iter().all(|e| ev(e) != "done" && e["f"] != "join"));
        let r = rest(&events);
        assert!(r.iter().any(|e| ev(e) == "done"));
        assert!(r.iter().all(|e| !is_kill(e) && e["f"] != "acquire"));
    }

    #[test]
    fn a_kill_of_a_worker_whose_partition_had_moved_on_is_not_its_owners() {
        let (a, b) = (hold_number(0, 0, 1), hold_number(1, 0, 1));
        let events = vec![
            json!({"ev": "ok", "f": "acquire", "n": a, "t": 0, "partition": 7}),
            // b is granted p7 just before a's worker, which still lists it, is killed.
            json!({"ev": "ok", "f": "acquire", "n": b, "t": 10 * MS, "partition": 7}),
            json!({"ev": "fault", "kind": "kill-holder", "w": 0, "holder": a,
                "holds": [a], "start": 12 * MS, "t": 12 * MS}),
        ];
        assert!(project(&events, 7).iter().all(|e| !is_kill(e)));
    }

    #[test]
    fn handovers_are_split_between_let_go_and_loss() {
        let h = handovers(&history());
        // p4: released at 20 ms, taken at 50 ms; p3: a killed at 30 ms, taken at 900 ms.
        assert_eq!(h.released_ms, vec![30.0]);
        assert_eq!(h.failed_ms, vec![870.0]);
    }

    #[test]
    fn a_late_end_counts_from_the_last_claim() {
        let (a, b) = (hold_number(2, 1, 7), hold_number(3, 0, 1));
        let events = vec![
            json!({"ev": "ok", "f": "acquire", "n": a, "t": 0, "partition": 0}),
            json!({"ev": "check", "n": a, "t": 100 * MS, "checked": 100 * MS}),
            json!({"ev": "ok", "f": "acquire", "n": b, "t": 1500 * MS, "partition": 0}),
            // a was paused, and reported the end when it woke up.
            json!({"ev": "invoke", "f": "release", "n": a, "t": 2500 * MS, "why": "lost"}),
        ];
        let h = handovers(&events);
        assert!(h.released_ms.is_empty());
        assert_eq!(h.failed_ms, vec![1400.0]);
    }

    /// Two owners of partition 0: `a` checks (claims it) at `a_check` ms, `b` is granted it at
    /// 100 ms; an owner of partition 1 meanwhile.
    fn two_owners(a_check: i64) -> Vec<Value> {
        let (a, b, c) = (
            hold_number(0, 0, 1),
            hold_number(1, 0, 1),
            hold_number(2, 0, 1),
        );
        let mut events = vec![
            json!({"ev": "start", "t": 0, "ttl_ms": 1000}),
            json!({"ev": "ok", "f": "acquire", "n": a, "t": 0, "vu": 0, "partition": 0,
                "fence": 5}),
            json!({"ev": "ok", "f": "acquire", "n": c, "t": 0, "vu": 0, "partition": 1,
                "fence": 9}),
            json!({"ev": "check", "n": a, "t": a_check * MS, "checked": a_check * MS,
                "vu": a_check * MS + 1}),
            json!({"ev": "check", "n": c, "t": 150 * MS, "checked": 150 * MS,
                "vu": 150 * MS + 1}),
            json!({"ev": "ok", "f": "acquire", "n": b, "t": 100 * MS, "vu": 100 * MS,
                "partition": 0, "fence": 6}),
            json!({"ev": "invoke", "f": "release", "n": a, "t": 200 * MS, "why": "let-go"}),
            json!({"ev": "end", "t": 300 * MS}),
        ];
        events.sort_by_key(|e| e["t"].as_i64());
        events
    }

    fn figures(events: &[Value]) -> Figures {
        let bounds = Bounds {
            free_within_ns: 3_500 * MS,
            detect_within_ns: 500 * MS,
            caveat_window_ns: 2_000 * MS,
            split_brain: false,
        };
        check_each(events, &HashMap::new(), true, bounds, 300 * MS)
    }

    #[test]
    fn an_owner_that_claims_a_partition_after_the_next_owner_took_it_is_a_violation() {
        let bad = figures(&two_owners(150));
        assert_eq!(bad.ck5, 1, "{:?}", bad.examples);
        assert!(bad.examples[0].starts_with("p0: CK5"), "{:?}", bad.examples);
        let good = figures(&two_owners(50));
        assert_eq!(good.violations(), 0, "{:?}", good.examples);
        assert_eq!(good.acquisitions, 3);
    }

    #[test]
    fn hold_numbers_stay_apart() {
        let a = hold_number(0, 0, 1);
        assert!(a > 1 << 40, "above the orchestrator's operation numbers");
        assert_ne!(hold_number(0, 1, 1), a);
        assert_ne!(hold_number(1, 0, 1), a);
        assert!(
            hold_number(7, 0xffff, 0xffff_ffff) < 1 << 53,
            "exact as a JSON double"
        );
    }
}
