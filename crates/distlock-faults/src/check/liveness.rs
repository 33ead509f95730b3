//! CK7 and CK8 on the holders: the lock is held again soon after its holder dies or abandons
//! it, and a holder learns soon of a loss on the server.

use super::facts::Facts;
use super::{Bounds, Figures, example};

/// CK7: after a holder dies or abandons its lock, somebody holds it within the bound.
pub(super) fn free(facts: &Facts, bounds: Bounds, run_end: i64, fig: &mut Figures) {
    let Facts {
        holds,
        faults,
        abandons,
        ..
    } = facts;
    let mut probes: Vec<(i64, String)> = abandons
        .iter()
        .map(|&(t, n)| (t, format!("op {n} abandoned its lock")))
        .collect();
    for f in faults {
        if f.kind == "kill-holder" && f.probe {
            probes.push((f.start, format!("worker {:?} was killed", f.worker)));
        }
    }
    for (t, what) in probes {
        fig.ck7_probes += 1;
        let next = holds.iter().map(|h| h.acq_t).filter(|&a| a > t).min();
        let gap = next.unwrap_or(run_end) - t;
        fig.ck7_max_ms = fig.ck7_max_ms.max(gap as f64 / 1e6);
        if gap > bounds.free_within_ns {
            fig.ck7 += 1;
            example(
                fig,
                format!(
                    "CK7: {what}; nobody held the lock for {:.0} ms after",
                    gap as f64 / 1e6
                ),
            );
        }
    }
}

/// CK8: server-side loss → the holder's lost signal.
pub(super) fn detection(facts: &Facts, bounds: Bounds, fig: &mut Figures) {
    let Facts {
        holds,
        faults,
        lost_at,
        ..
    } = facts;
    for f in faults.iter().filter(|f| f.kind == "steal") {
        let Some(n) = f.n else { continue };
        let Some(h) = holds.iter().find(|h| h.n == n) else {
            continue;
        };
        match lost_at.get(&n) {
            Some(&l) if h.end_t.is_none_or(|e| l <= e) => {
                let ms = (l - f.start) as f64 / 1e6;
                fig.ck8_ms.push(ms);
                if l - f.start > bounds.detect_within_ns {
                    fig.ck8 += 1;
                    example(
                        fig,
                        format!("CK8: op {n} learned of its loss after {ms:.0} ms"),
                    );
                }
            }
            // It let go (or checked before writing) before the signal: no sample.
            _ => {}
        }
    }
}
