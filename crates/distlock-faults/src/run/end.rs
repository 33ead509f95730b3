//! The end of a run: heal every fault, record what is left (the SQL rows, the lock's copies
//! on the servers, the open connections), stop the workers, and check the history.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use distlock_testkit::{FaultProxy, LinkMode};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use super::audit::lock_copies;
use crate::check::{self, Bounds, Figures};
use crate::mono;
use crate::scenario::Scenario;
use crate::sql::SqlResource;
use crate::state::{SharedRef, lock, not_injected};

/// Heal, look for leftover locks, stop the workers, and check: the figures of the run, once its
/// loop and its background tasks have stopped (an error if a fault could not be injected).
pub(super) async fn heal_and_check(
    shared: &SharedRef,
    scenario: &Scenario,
    sql: Option<&Arc<SqlResource>>,
    ports: &[u16],
    fenced_engine: bool,
    bounds: Bounds,
) -> Result<Figures, String> {
    let run_end = mono::now_ns();
    let mut failed = Vec::new();
    {
        let mut s = lock(shared);
        for i in 0..s.engine.len() {
            s.engine.resume(i);
        }
        s.engine.restart_killed();
        for w in &mut s.workers {
            let _ = kill(Pid::from_raw(w.pid), Signal::SIGCONT);
            for p in &w.proxies {
                p.set(LinkMode::Pass);
            }
            if let Some(n) = &mut w.netns
                && let Err(e) = n.heal()
            {
                failed.push(format!("healing a partition: {e}"));
            }
        }
    }
    for f in failed {
        not_injected(shared, "the final heal".into(), f);
    }
    // Background releases (cancelled operations) finish within a round trip or two.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(sql) = &sql {
        let v = sql.values().await?;
        lock(shared)
            .history
            .record(json!({"ev": "sql-final", "t": mono::now_ns(),
            "w": v.w, "rw": v.rw}));
    }
    // The copies of the lock left on the Redis servers (every server runs again by now).
    let leftover = if ports.is_empty() {
        None
    } else {
        let copies = lock_copies(ports, Duration::from_secs(1)).await;
        Some(
            copies
                .into_iter()
                .map(|(_, token, _)| token)
                .collect::<Vec<_>>(),
        )
    };
    let mut s = lock(shared);
    let s = &mut *s;
    let open: Vec<Vec<usize>> = s
        .workers
        .iter()
        .map(|w| w.proxies.iter().map(FaultProxy::connections).collect())
        .collect();
    s.history
        .record(json!({"ev": "connections", "t": mono::now_ns(), "open": open}));
    if let Some(tokens) = leftover {
        s.history
            .record(json!({"ev": "leftover", "t": mono::now_ns(), "tokens": tokens}));
    }
    for w in &mut s.workers {
        let _ = kill(Pid::from_raw(w.pid), Signal::SIGCONT);
        let _ = kill(Pid::from_raw(w.pid), Signal::SIGKILL);
        for p in &w.proxies {
            p.set(LinkMode::Pass);
        }
    }
    s.history.record(json!({"ev": "end", "t": run_end}));
    let _ = s.history.out.flush();
    let mut figures = if scenario.partitions() {
        crate::partitions::check_each(&s.history.events, &s.keyed, fenced_engine, bounds, run_end)
    } else if scenario.many() {
        crate::many::check_each(&s.history.events, &s.keyed, fenced_engine, bounds, run_end)
    } else {
        check::check(
            &s.history.events,
            fenced_engine.then_some(&s.fenced),
            &s.unfenced,
            bounds,
            run_end,
        )
    };
    // The independent check, beside the checkers: are the fenced registers linearizable?
    figures.set_linear(crate::linear::check_history(
        &s.history.events,
        fenced_engine,
    ));
    for w in &mut s.workers {
        let _ = w.child.start_kill();
    }
    if !s.not_injected.is_empty() {
        return Err(format!(
            "{}: {} fault(s) could not be injected, so the run proves nothing: {}",
            scenario.name,
            s.not_injected.len(),
            s.not_injected.join("; ")
        ));
    }
    Ok(figures)
}
