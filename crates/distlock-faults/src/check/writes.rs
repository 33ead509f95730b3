//! CK1 and CK2: the writes the protected resource accepted, replayed in their order (no
//! interleaving, no token below an earlier one), and the acknowledged updates it lost.

use serde_json::Value;

use super::facts::Facts;
use super::{Figures, SqlFigures, example, i, s, u};
use crate::resource::Register;

/// CK1 and CK2 on the fenced resource. CK1 is replayed from the accepted writes, so that
/// those after a server-side fault (a fence counter lost with the data stays low for
/// long) count as its caveats.
pub(super) fn fenced(
    events: &[Value],
    fenced: Option<&Register>,
    facts: &Facts,
    fig: &mut Figures,
) {
    let faults = &facts.faults;
    if let Some(r) = fenced {
        fig.ck2 = r.lost_updates();
        let mut value = 0i64;
        let mut last: Option<(u64, u64)> = None;
        for e in events.iter().filter(|e| {
            s(e, "ev") == "write" && e.get("accepted").and_then(Value::as_bool) == Some(true)
        }) {
            let (t, n, v) = (
                i(e, "t").unwrap_or(0),
                u(e, "n").unwrap_or(0),
                i(e, "value"),
            );
            let v = v.unwrap_or(0);
            let mut bad = value != v - 1;
            if let (Some(f), Some((ln, lf))) = (u(e, "fence"), last) {
                bad |= f < lf || (f == lf && n != ln);
            }
            if bad {
                if faults.iter().any(|f| f.server_side && f.start <= t) {
                    fig.ck1_caveat += 1;
                } else {
                    fig.ck1 += 1;
                    example(
                        fig,
                        format!("CK1: op {n}'s fenced write was accepted out of order"),
                    );
                }
            }
            if let Some(f) = u(e, "fence") {
                last = Some((n, f));
            }
            value = v;
        }
    }
}

/// The SQL form: row `rw` is held to CK1 and CK2 like the fenced register; row `w` (only
/// the write fenced) is reported.
pub(super) fn sql(events: &[Value], facts: &Facts, fig: &mut Figures) {
    let faults = &facts.faults;
    if let Some(fin) = events.iter().find(|e| s(e, "ev") == "sql-final") {
        let mut f = SqlFigures::default();
        let mut value = 0i64;
        let mut last: Option<u64> = None;
        for e in events.iter().filter(|e| s(e, "ev") == "write") {
            if e.get("sw_accepted").and_then(Value::as_bool) == Some(true) {
                f.w_accepted += 1;
            }
            if e.get("srw_accepted").and_then(Value::as_bool) != Some(true) {
                continue;
            }
            f.rw_accepted += 1;
            let v = i(e, "srw").unwrap_or(0);
            let fence = u(e, "fence");
            let bad = value != v - 1 || matches!((fence, last), (Some(a), Some(b)) if a < b);
            if bad {
                let t = i(e, "t").unwrap_or(0);
                if faults.iter().any(|f| f.server_side && f.start <= t) {
                    fig.ck1_caveat += 1;
                } else {
                    f.rw_out_of_order += 1;
                    fig.ck1 += 1;
                    example(
                        fig,
                        format!(
                            "CK1: op {}'s SQL write was accepted out of order",
                            u(e, "n").unwrap_or(0)
                        ),
                    );
                }
            }
            value = v;
            last = fence.or(last);
        }
        let final_w = i(fin, "w").unwrap_or(0).max(0) as u64;
        let final_rw = i(fin, "rw").unwrap_or(0).max(0) as u64;
        f.w_lost = f.w_accepted.saturating_sub(final_w);
        f.rw_lost = f.rw_accepted.saturating_sub(final_rw);
        fig.ck2 += f.rw_lost;
        fig.sql = Some(f);
    }
}
