//! CK3, CK5, CK6 and CK9: the holders judged against each other (their tokens, their claimed
//! deadlines, their renewals and releases) and against their own deadlines.

use std::collections::HashMap;

use super::facts::Facts;
use super::{Bounds, Figures, example};

/// CK9: the checks that passed at or after the deadline their holder reported (the first three
/// are examples).
pub(super) fn late_checks(facts: &Facts, fig: &mut Figures) {
    let late_checks = &facts.late_checks;
    fig.ck9 = late_checks.len() as u64;
    for &(n, late) in late_checks.iter().take(3) {
        fig.examples.push(format!(
            "CK9: op {n} believed it held the lock {:.1} ms past its own deadline",
            late as f64 / 1e6
        ));
    }
}

/// CK3: each new holder's token is above every earlier one (a writer's or a permit's: a
/// reader's is its place among the writers, shared with the readers beside it).
/// Permits are held side by side, and their grants reported in any order: a permit's
/// fence is held above those granted before its acquire was sent, and to be its own.
pub(super) fn tokens(facts: &Facts, fig: &mut Figures) {
    let holds = &facts.holds;
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
                fig,
                format!("CK3: op {} got token {f} after op {an}'s {af}", b.n),
            );
        } else if let Some(a) = twin {
            fig.ck3 += 1;
            example(fig, format!("CK3: ops {a} and {} got token {f}", b.n));
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
                fig,
                format!("CK3: op {} got token {f} after token {max}", h.n),
            );
        }
        if top.is_none_or(|max| f > max) {
            top = Some(f);
        }
    }
}

/// CK5 and CK6: against every earlier holder. A reader beside readers is no overlap; a
/// permit is one when N earlier permits' claims still run.
pub(super) fn claims(facts: &Facts, bounds: Bounds, fig: &mut Figures) {
    let Facts {
        holds,
        faults,
        lost_at,
        ..
    } = facts;
    let caveat = |from: i64, to: i64| {
        faults
            .iter()
            .any(|f| f.server_side && f.start <= to && f.end + bounds.caveat_window_ns >= from)
    };
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
                        fig,
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
                    fig,
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
}
