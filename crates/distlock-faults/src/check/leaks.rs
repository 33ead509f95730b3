//! CK7's leak checks: lock copies that no holder explains, on the servers at the end of the
//! run or during it, and a worker's tasks, memory and connections growing with its operations.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::facts::Facts;
use super::{Figures, example, i, s, u};

/// More live tasks than this over a worker's run is a leak.
const LEAK_TASKS: u64 = 32;
/// More resident memory than this (KiB) over a worker's run is a leak.
const LEAK_RSS_KB: u64 = 64 * 1024;
/// More open connections than this from one worker to one server is a leak.
const LEAK_CONNECTIONS: u64 = 8;

/// CK7, leaks: when the run ends, every operation is over. A lock copy still on a server
/// must belong to an operation that did not let go cleanly (abandoned, cancelled, killed,
/// lost, or whose release failed); any other is a leak (a failed attempt that kept its
/// copies, a release that left one behind).
pub(super) fn leftover(events: &[Value], facts: &Facts, fig: &mut Figures) {
    let faults = &facts.faults;
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
                    fig,
                    format!("CK7: a lock copy with token {tok} outlived every operation"),
                );
            }
        }
    }
}

/// CK7, leaks during the run: a copy whose token no acquisition reported, seen on the same
/// server in consecutive audits for a third of a TTL or more, and not explained by a fault
/// of its owner's (a cut link, a pause, a kill: its clean-up could not get through). A
/// waiting client's attempts reuse one token, so the same token seen now and then in
/// separate audits is a string of short attempts, not a leak.
pub(super) fn audits(events: &[Value], facts: &Facts, fig: &mut Figures) {
    let faults = &facts.faults;
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
                fig,
                format!(
                    "CK7: {owner}'s lock copy {tok} belonged to no holder for {:.0} ms",
                    (last - first) as f64 / 1e6
                ),
            );
        }
    }
}

/// CK7, resources: a worker's live tasks and memory must not grow with the operations it
/// ran, and its open connections must stay few.
pub(super) fn resources(events: &[Value], fig: &mut Figures) {
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
                fig,
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
                        fig,
                        format!("CK7: worker {w} kept {n} connections to one server"),
                    );
                }
            }
        }
    }
}
