//! The checkers' verdicts as a table, each linked to its first offending operation on the
//! timeline.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::svg::esc;
use crate::check::{Figures, quantile};

/// A checker's line of the table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) id: &'static str,
    pub(crate) what: &'static str,
    /// Violations; `None`: not applicable to this run.
    pub(crate) count: Option<u64>,
    pub(crate) caveats: u64,
    /// The search gave up (the linearizability check only).
    pub(crate) unknown: bool,
    pub(crate) detail: String,
    /// Its first offending operation.
    pub(crate) first: Option<u64>,
}

/// The operation an example names first (`… op 12 …`), for each checker (`CK5: …`,
/// `p3: CK1: …`, `LIN: …`), from the figures' examples in their order.
pub(crate) fn first_ops(examples: &[String]) -> HashMap<String, u64> {
    let mut first = HashMap::new();
    for e in examples {
        let Some((id, rest)) = e.split(": ").find_map(|part| {
            let ok = part.starts_with("LIN")
                || (part.starts_with("CK") && part[2..].chars().all(|c| c.is_ascii_digit()));
            ok.then(|| {
                (
                    part.to_owned(),
                    &e[e.find(part).unwrap_or(0) + part.len()..],
                )
            })
        }) else {
            continue;
        };
        let op = rest.match_indices("op ").find_map(|(at, _)| {
            let digits: String = rest[at + 3..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u64>().ok()
        });
        if let Some(op) = op {
            first.entry(id).or_insert(op);
        }
    }
    first
}

/// The table's rows.
pub(crate) fn rows(f: &Figures) -> Vec<Row> {
    let first = first_ops(&f.examples);
    let fenced = f.fenced.is_some() || f.sql.is_some();
    let row =
        |id: &'static str, what: &'static str, count: Option<u64>, caveats: u64, detail: String| {
            Row {
                id,
                what,
                count,
                caveats,
                unknown: false,
                detail,
                first: first.get(id).copied(),
            }
        };
    let ck8 = match (quantile(&f.ck8_ms, 0.5), quantile(&f.ck8_ms, 0.99)) {
        (Some(a), Some(b)) => format!(
            "p50 {a:.0} ms, p99 {b:.0} ms over {} losses",
            f.ck8_ms.len()
        ),
        _ => "not exercised (no forced release)".to_owned(),
    };
    let mut rows = vec![
        row(
            "CK1",
            "fenced writes accepted in one sequence, tokens never down, none shared",
            fenced.then_some(f.ck1),
            f.ck1_caveat,
            f.fenced
                .as_ref()
                .map_or("no fencing tokens".to_owned(), |r| {
                    format!("{} accepted, {} refused", r.accepted, r.rejected)
                }),
        ),
        row(
            "CK2",
            "no acknowledged update lost (fenced)",
            fenced.then_some(f.ck2),
            0,
            format!(
                "unfenced control lost {:.1}% ({} of {})",
                f.unfenced_lost_pct(),
                f.unfenced.lost_updates(),
                f.unfenced.accepted
            ),
        ),
        row(
            "CK3",
            "each new holder's token above every earlier one",
            Some(f.ck3),
            0,
            format!("{} acquisitions", f.acquisitions),
        ),
        row(
            "CK5",
            "no acquisition before an earlier holder's claimed deadline",
            Some(f.ck5),
            f.ck5_caveat,
            String::new(),
        ),
        row(
            "CK6",
            "no renewal or release after another holder took the lock",
            Some(f.ck6),
            f.ck6_caveat,
            String::new(),
        ),
        row(
            "CK7",
            "liveness: freed within TTL + 2.5 s; no leaked copies, tasks or connections",
            Some(f.ck7),
            0,
            format!(
                "{} probes, max {:.0} ms to free; {} copies left; tasks grown {}; max {} connections",
                f.ck7_probes, f.ck7_max_ms, f.ck7_leaks, f.ck7_tasks_grown, f.ck7_max_connections
            ),
        ),
        row(
            "CK8",
            "loss detected within renew interval + request timeout",
            Some(f.ck8),
            0,
            ck8,
        ),
        row(
            "CK9",
            "no check that it may act passed past its own deadline",
            Some(f.ck9),
            0,
            String::new(),
        ),
    ];
    let lin = match &f.linear {
        Some(v) if !v.registers.is_empty() => {
            let detail = v
                .registers
                .iter()
                .map(|r| format!("{}: {} ops, {} steps", r.name, r.ops, r.steps))
                .collect::<Vec<_>>()
                .join("; ");
            Row {
                count: Some(v.violations()),
                unknown: v.unknown() > 0,
                detail: format!("{detail}; {:.0} ms", v.ms),
                first: v
                    .offender()
                    .and_then(|r| r.offender.as_ref())
                    .map(|o| o.0.n),
                ..row("LIN", "", None, 0, String::new())
            }
        }
        _ => row(
            "LIN",
            "",
            None,
            0,
            "no fenced register (no fencing tokens)".to_owned(),
        ),
    };
    rows.push(Row {
        what: "independent: the fenced registers are linearizable (Wing–Gong–Lowe search)",
        ..lin
    });
    rows
}

/// The table; a first offending operation is a link when `anchored` has it on the timeline.
pub(crate) fn table(rows: &[Row], anchored: &HashSet<u64>) -> String {
    let mut out = String::from(
        "<table class=\"v\"><tr><th>check</th><th>what it holds the run to</th><th>verdict</th><th>first offending operation</th><th>figures</th></tr>\n",
    );
    for r in rows {
        let (class, verdict) = match r.count {
            None => ("na", "n/a".to_owned()),
            Some(0) if r.unknown => ("unknown", "unknown (search limit)".to_owned()),
            Some(0) => ("pass", "pass".to_owned()),
            Some(n) => ("fail", format!("FAIL: {n}")),
        };
        let verdict = if r.caveats > 0 {
            format!("{verdict} ({} caveats)", r.caveats)
        } else {
            verdict
        };
        let first = match r.first {
            Some(n) if anchored.contains(&n) => format!(r##"<a href="#op-{n}">op {n}</a>"##),
            Some(n) => format!("op {n}"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            r#"<tr><td>{}</td><td>{}</td><td class="{class}">{}</td><td>{first}</td><td class="d">{}</td></tr>"#,
            r.id,
            esc(r.what),
            esc(&verdict),
            esc(&r.detail)
        );
    }
    out.push_str("</table>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_operation_of_each_checker_is_found_in_the_examples() {
        let ex: Vec<String> = [
            "CK9: op 4 believed it held the lock 3.0 ms past its own deadline",
            "p3: CK1: op 12's fenced write was accepted out of order",
            "CK5: op 20 acquired 5.1 ms before op 19's claimed deadline",
            "CK5: op 30 acquired 1.0 ms before op 29's claimed deadline",
            "CK7: worker Some(1) was killed; nobody held the lock for 4000 ms after",
            "LIN: register k: op 7 (worker 1), a write of 3 with fence 9 that was accepted, fits",
        ]
        .map(str::to_owned)
        .to_vec();
        let f = first_ops(&ex);
        assert_eq!(f.get("CK9"), Some(&4));
        assert_eq!(f.get("CK1"), Some(&12));
        assert_eq!(f.get("CK5"), Some(&20));
        assert_eq!(f.get("CK7"), None);
        assert_eq!(f.get("LIN"), Some(&7));
    }

    #[test]
    fn a_violation_links_to_its_operation() {
        let mut f = Figures {
            ck5: 2,
            examples: vec!["CK5: op 20 acquired 5.1 ms before op 19's claimed deadline".into()],
            ..Figures::default()
        };
        f.ck3 = 0;
        let rows = rows(&f);
        let html = table(&rows, &HashSet::from([20]));
        assert!(html.contains(r##"<a href="#op-20">op 20</a>"##));
        assert!(html.contains(r#"<td class="fail">FAIL: 2</td>"#));
        // Without fencing tokens, CK1 and CK2 do not apply.
        assert!(html.contains(r#"<td>CK1</td><td>fenced writes accepted in one sequence, tokens never down, none shared</td><td class="na">"#));
        assert_eq!(
            rows.iter().find(|r| r.id == "LIN").map(|r| r.count),
            Some(None)
        );
    }
}
