//! The bite carried out (see `bite.rs`): armed once the run is a sixth of the way in (a TTL at
//! least), it waits for the faults' turn (one fault at a time), takes the next eligible holder
//! that checks its lease, breaks its lease with the scenario's own kind of fault, and keeps it
//! there until another holder has taken over and written (a semaphore: until as many others
//! hold permits as there are), 6 TTLs at most (and no later than the run's end); then it lets
//! go, records the fault window (`"bite": true`, `"landed"`) and counts it. A bite that did not
//! land is tried again while the run has room; one that landed is enough.

use std::sync::Arc;
use std::time::Duration;

use distlock_testkit::LinkMode;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::bite::{Active, Kind, Plan, Tally, Turn, plan};
use crate::faults::set_links;
use crate::mono;
use crate::scenario::{Kinds, Scenario};
use crate::state::{SharedRef, lock, not_injected};

/// Serves a held write (the orchestrator's `serve`).
pub(crate) type Release = Arc<dyn Fn(usize, Value) + Send + Sync>;

fn ns(d: Duration) -> i64 {
    d.as_nanos() as i64
}

async fn sleep_until_ns(t: i64) {
    let now = mono::now_ns();
    if t > now {
        tokio::time::sleep(Duration::from_nanos((t - now) as u64)).await;
    }
}

/// Runs the scenario's bites from `started` to `stop_at` (monotonic ns); the tally is kept in
/// `tally`.
pub(crate) async fn run(
    shared: SharedRef,
    scenario: Scenario,
    turn: Turn,
    (started, stop_at): (i64, i64),
    release: Release,
    tally: Arc<std::sync::Mutex<Tally>>,
) {
    let Plan::Bite(kind) = plan(&scenario) else {
        return;
    };
    let ttl = scenario.ttl;
    {
        let mut s = lock(&shared);
        s.bite.kind = Some(kind);
        s.bite.permits = match scenario.kinds {
            Kinds::Semaphore { permits } => permits as usize,
            _ => 0,
        };
    }
    tally.lock().unwrap_or_else(|e| e.into_inner()).kind = Some(kind);
    let steal = if kind == Kind::Steal {
        let url = lock(&shared).engine.direct_url(ttl);
        match distlock::connect(&url).await {
            Ok(c) => Some(c),
            Err(e) => {
                not_injected(&shared, "a bite's forced release".into(), e.to_string());
                return;
            }
        }
    } else {
        None
    };
    // Half a TTL in: before the injector's first fault (a TTL in), so that it does not wait
    // behind a long one; it waits for the workers' first checks.
    sleep_until_ns(started + ns(ttl / 2)).await;
    // The loop's `stopping`: set at the time's end, or earlier when a control stops early.
    let stopping = || lock(&shared).stopping;
    while mono::now_ns() + ns(2 * ttl) < stop_at && !stopping() {
        let landed = {
            let _turn = turn.lock().await;
            // A fault may have held the turn until the time was up: no bite starts after it.
            if mono::now_ns() + ns(2 * ttl) >= stop_at || stopping() {
                return;
            }
            one(&shared, &scenario, kind, stop_at, steal.as_ref(), &release).await
        };
        {
            let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
            match landed {
                Some(true) => {
                    t.landed += 1;
                    return;
                }
                _ => t.missed += 1,
            }
        }
        tokio::time::sleep(ttl).await;
    }
}

/// One bite; `None` when no holder came to be bitten (nothing was done).
async fn one(
    shared: &SharedRef,
    scenario: &Scenario,
    kind: Kind,
    stop_at: i64,
    steal: Option<&distlock::LockClient>,
    release: &Release,
) -> Option<bool> {
    let ttl = scenario.ttl;
    // A lagging fail-over needs a holder the replica never saw: one that takes the lock after
    // the replica was cut off.
    let lag = if kind == Kind::LaggingFailover {
        Some(lock(shared).engine.lag_replica()?)
    } else {
        None
    };
    lock(shared).bite.armed = Some(if lag.is_some() {
        mono::now_ns()
    } else {
        i64::MIN
    });
    let until = mono::now_ns() + ns(4 * ttl);
    let active = loop {
        if let Some(a) = lock(shared).bite.active.clone() {
            break Some(a);
        }
        if mono::now_ns() >= until.min(stop_at) || lock(shared).stopping {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let Some(a) = active else {
        let mut s = lock(shared);
        s.bite.armed = None;
        if lag.is_some() {
            // The replica thawed: it catches up with the master.
            s.engine.resume(0);
        }
        s.history
            .record(json!({"ev": "bite-missed", "t": mono::now_ns(),
            "why": "no holder checked its lease in time", "kind": kind.name()}));
        return None;
    };
    let servers: Vec<usize> = (0..lock(shared).engine.len()).collect();
    let mut extra = json!({});
    lock(shared).workers[a.w].paused = true;
    match kind {
        // Stopped by the loop at the check.
        Kind::Pause | Kind::ClockJump => {}
        Kind::Cut => set_links(shared, a.w, &servers, LinkMode::Blackhole),
        Kind::Delay => set_links(shared, a.w, &servers, LinkMode::DelayReplies(2 * ttl)),
        Kind::Steal => {
            if let Some(c) = steal
                && let Err(e) = c.force_release("k").await
            {
                not_injected(shared, "a bite's forced release".into(), e.to_string());
            }
        }
        Kind::Evict => {
            lock(shared).engine.evict();
        }
        Kind::ServerClock => {
            lock(shared).engine.clock_jump(2 * ttl);
            extra = json!({"by_ms": (2 * ttl).as_millis() as u64});
        }
        Kind::RestartVolatile => {
            let mut s = lock(shared);
            if s.engine.kill(0) {
                s.engine.restart(0);
            }
            extra = json!({"servers": [0], "delay_ms": 0});
        }
        Kind::LaggingFailover => {
            if let Some(pair) = lag {
                lock(shared).engine.fail_over_lagging(pair);
            }
        }
        Kind::Reset => {
            set_links(shared, a.w, &servers, LinkMode::LoseReplies);
            tokio::time::sleep(Duration::from_millis(200)).await;
            set_links(shared, a.w, &servers, LinkMode::Pass);
        }
    }
    // Until another holder took over: it wrote, or (a semaphore) every permit is someone
    // else's.
    let permits = match scenario.kinds {
        Kinds::Semaphore { permits } => Some(permits as usize),
        _ => None,
    };
    let settle = lock(shared).engine.failover_time();
    let failed_over_at = mono::now_ns();
    let mut restarted = lag.is_none();
    let until = (a.start + ns(6 * ttl) + if lag.is_some() { ns(settle) } else { 0 }).min(stop_at);
    let landed = loop {
        let now = mono::now_ns();
        if !restarted && now >= failed_over_at + ns(settle) {
            // The old master comes back empty, a replica of the promoted one.
            lock(shared).engine.restart(0);
            restarted = true;
        }
        // (The loop sees each grant: `Bite::held_by`.)
        let done = lock(shared)
            .bite
            .active
            .as_ref()
            .is_some_and(|x| x.other_wrote);
        if done || now >= until || lock(shared).stopping {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Let go: the stale write goes on.
    let taken: Option<Active> = {
        let mut s = lock(shared);
        s.bite.stale = Some((a.n, false));
        s.bite.active.take()
    };
    match kind {
        Kind::Pause | Kind::ClockJump => thaw(shared, &a, kind).await,
        Kind::Cut | Kind::Delay => set_links(shared, a.w, &servers, LinkMode::Pass),
        _ => {}
    }
    if !restarted {
        sleep_until_ns(failed_over_at + ns(settle)).await;
        lock(shared).engine.restart(0);
    }
    let alive = {
        let mut s = lock(shared);
        let w = &mut s.workers[a.w];
        let alive = w.pid == a.pid;
        if alive {
            w.paused = false;
        }
        alive
    };
    if alive {
        for v in taken.map(|t| t.held).unwrap_or_default() {
            release(a.w, v);
        }
    }
    // The stale write arrives within a TTL (its gap is a few ms); the turn is kept till then,
    // so that no other fault (a kill) comes between.
    let end = mono::now_ns();
    let stale_arrived = permits.is_none()
        && landed
        && alive
        && loop {
            if lock(shared).bite.stale.is_some_and(|(_, arrived)| arrived) {
                break true;
            }
            if mono::now_ns() >= end + ns(ttl) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
    lock(shared).bite.stale = None;
    let took_over = landed;
    // A semaphore's holders write nothing: a take-over of every permit is the bite.
    let landed = took_over && alive && (permits.is_some() || stale_arrived);
    let mut v = json!({"ev": "fault", "kind": kind.name(), "bite": true, "landed": landed,
        "took_over": took_over, "stale_write": stale_arrived,
        "w": a.w, "holder": a.n, "keys": a.keys, "start": a.start, "end": end,
        "t": mono::now_ns(), "server_side": kind.server_side()});
    if let (Some(o), Some(x)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in x {
            o.insert(k.clone(), val.clone());
        }
    }
    lock(shared).history.record(v);
    Some(landed)
}

/// Stops worker `w` (the loop calls this at the check that started a bite that stops it): a
/// client clock jump sets its wall clock back first.
pub(crate) fn stop(shared: &SharedRef, w: usize, kind: Kind, ttl: Duration) {
    let (pid, file) = {
        let s = lock(shared);
        (s.workers[w].pid, s.workers[w].faketime.clone())
    };
    if kind == Kind::ClockJump
        && let Some(f) = &file
        && let Err(e) = std::fs::write(f, format!("-{}\n", 2 * ttl.as_secs().max(1)))
    {
        not_injected(
            shared,
            format!("a bite's clock jump of worker {w}"),
            e.to_string(),
        );
    }
    lock(shared).workers[w].paused = true;
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGSTOP) {
        not_injected(
            shared,
            format!("a bite's pause of worker {w}"),
            e.to_string(),
        );
    }
}

async fn thaw(shared: &SharedRef, a: &Active, kind: Kind) {
    if let Err(e) = kill(Pid::from_raw(a.pid), Signal::SIGCONT)
        && e != nix::errno::Errno::ESRCH
    {
        not_injected(
            shared,
            format!("a bite's thaw of worker {}", a.w),
            e.to_string(),
        );
    }
    if kind == Kind::ClockJump {
        // It runs on with the jumped clock for a while, then the clock is set right.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let file = lock(shared).workers[a.w].faketime.clone();
        if let Some(f) = file {
            let _ = std::fs::write(f, "+0\n");
        }
    }
}
