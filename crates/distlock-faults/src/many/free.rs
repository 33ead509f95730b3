//! CK7's time to free in multi-name scenarios: after a holder dies (its worker killed) or
//! abandons its lock, each of its names is held again within the bound, counting only the time
//! in which some client waiting for the name could have taken every name it asked for.
//!
//! A waiter holds nothing while it waits (no hold-and-wait), so a name may rightly stay free
//! while every client that wants it also wants a name that another holder has; the clock of a
//! name stops then. A name that stays locked (its key left without an end, say) while a client
//! waits for it, and for nothing else held, runs the clock out.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use crate::check::{Bounds, Figures};

/// A time span of one operation, on its names.
struct Span<'a> {
    n: u64,
    from: i64,
    to: i64,
    names: Vec<&'a str>,
}

/// The history read for the rule: who held which names when, and who waited for which.
struct Spans<'a> {
    /// Each grant until the earliest of its end (release, abandon, cancel, kill) and the last
    /// end of its lease it knew of (a paused holder's names are free once its lease ran out).
    holds: Vec<Span<'a>>,
    /// Each acquire from its call to its outcome; `names` empty when the history does not say
    /// (the waiter is then taken to want only the name being judged).
    waits: Vec<Span<'a>>,
}

fn t(e: &Value) -> i64 {
    e["t"].as_i64().unwrap_or(0)
}

fn read<'a>(
    events: &'a [Value],
    ops: &'a HashMap<u64, Map<String, Value>>,
    run_end: i64,
) -> Spans<'a> {
    let mut granted: HashMap<u64, (i64, i64)> = HashMap::new();
    let mut ended: HashMap<u64, i64> = HashMap::new();
    let mut asked: HashMap<u64, (i64, Vec<&'a str>)> = HashMap::new();
    let mut answered: HashMap<u64, i64> = HashMap::new();
    let mut end = |n: u64, at: i64| {
        let e = ended.entry(n).or_insert(at);
        *e = (*e).min(at);
    };
    for e in events {
        let n = e["n"].as_u64();
        let vu = e["vu"].as_i64();
        match (
            e["ev"].as_str().unwrap_or(""),
            e["f"].as_str().unwrap_or(""),
        ) {
            ("invoke", "acquire") => {
                let names = e["keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                asked.insert(n.unwrap_or(0), (t(e), names));
            }
            ("ok" | "fail" | "info", "acquire") => {
                answered.entry(n.unwrap_or(0)).or_insert(t(e));
                if e["ev"] == "ok" {
                    granted.insert(n.unwrap_or(0), (t(e), vu.unwrap_or(t(e))));
                }
            }
            ("check" | "renewed", _) => {
                if let (Some(n), Some(vu)) = (n, vu)
                    && let Some(g) = granted.get_mut(&n)
                {
                    g.1 = g.1.max(vu);
                }
            }
            ("invoke", "release") | ("abandon", _) | ("cancel", _) => end(n.unwrap_or(0), t(e)),
            ("fault", _) if e["kind"] == "kill-holder" => {
                let at = e["start"].as_i64().unwrap_or_else(|| t(e));
                for h in e["holds"].as_array().into_iter().flatten() {
                    if let Some(h) = h.as_u64() {
                        end(h, at);
                    }
                }
            }
            _ => {}
        }
    }
    let names_of = |n: u64| -> Vec<&'a str> {
        ops.get(&n)
            .map(|f| f.keys().map(String::as_str).collect())
            .unwrap_or_default()
    };
    let holds = granted
        .iter()
        .map(|(&n, &(from, vu))| Span {
            n,
            from,
            to: ended.get(&n).copied().unwrap_or(run_end).min(vu),
            names: names_of(n),
        })
        .collect();
    let waits = asked
        .into_iter()
        .map(|(n, (from, names))| Span {
            n,
            from,
            to: answered.get(&n).copied().unwrap_or(run_end),
            names,
        })
        .collect();
    Spans { holds, waits }
}

/// Whether at `x` a client waiting for `name` could have taken all it asked for: none of its
/// other names held by anyone but `gone` (the holder whose death is judged).
fn takeable(spans: &Spans, name: &str, gone: u64, x: i64) -> bool {
    let held = |m: &str| {
        spans
            .holds
            .iter()
            .any(|h| h.n != gone && h.from <= x && x < h.to && h.names.contains(&m))
    };
    spans.waits.iter().any(|w| {
        w.from <= x
            && x < w.to
            && (w.names.is_empty() || w.names.contains(&name))
            && w.names.iter().all(|&m| m == name || !held(m))
    })
}

/// How long `name` could have been taken, from `from` until it was (`until`).
fn takeable_for(spans: &Spans, name: &str, gone: u64, from: i64, until: i64) -> i64 {
    let mut cuts: BTreeSet<i64> = BTreeSet::from([from, until]);
    for s in spans.holds.iter().chain(&spans.waits) {
        for c in [s.from, s.to] {
            if from < c && c < until {
                cuts.insert(c);
            }
        }
    }
    let cuts: Vec<i64> = cuts.into_iter().collect();
    cuts.windows(2)
        .filter(|w| takeable(spans, name, gone, w[0] + (w[1] - w[0]) / 2))
        .map(|w| w[1] - w[0])
        .sum()
}

/// Runs the rule on every kill of known holders and every abandoned guard (see the module's
/// doc), adding its probes, its longest counted time and its misses to `all`.
pub(super) fn check(
    events: &[Value],
    ops: &HashMap<u64, Map<String, Value>>,
    bounds: Bounds,
    run_end: i64,
    all: &mut Figures,
) {
    let spans = read(events, ops, run_end);
    // (when, the holder that went, its names, what happened).
    let mut probes: Vec<(i64, u64, Vec<&str>, String)> = Vec::new();
    for e in events {
        if e["ev"] == "fault" && e["kind"] == "kill-holder" {
            let at = e["start"].as_i64().unwrap_or_else(|| t(e));
            for h in e["holds"].as_array().into_iter().flatten() {
                if let Some(fences) = h.as_u64().and_then(|h| ops.get(&h).map(|f| (h, f))) {
                    let names = fences.1.keys().map(String::as_str).collect();
                    probes.push((at, fences.0, names, format!("worker {} was killed", e["w"])));
                }
            }
        } else if e["ev"] == "abandon"
            && let Some(n) = e["n"].as_u64()
            && let Some(fences) = ops.get(&n)
        {
            let names = fences.keys().map(String::as_str).collect();
            probes.push((t(e), n, names, format!("op {n} abandoned its lock")));
        }
    }
    for (from, gone, names, what) in probes {
        for name in names {
            all.ck7_probes += 1;
            let next = spans
                .holds
                .iter()
                .filter(|h| h.from > from && h.names.contains(&name))
                .map(|h| h.from)
                .min()
                .unwrap_or(run_end);
            let counted = takeable_for(&spans, name, gone, from, next);
            all.ck7_max_ms = all.ck7_max_ms.max(counted as f64 / 1e6);
            if counted > bounds.free_within_ns {
                all.ck7 += 1;
                all.examples.push(format!(
                    "{name}: CK7: {what}; nobody held {name} for {:.0} ms after, {:.0} ms of \
                     them while a client waiting for it could have taken all it asked for",
                    (next - from) as f64 / 1e6,
                    counted as f64 / 1e6
                ));
            }
        }
    }
}
