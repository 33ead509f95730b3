//! The fault injector: one fault at a time, on a seeded schedule, each healed before the next.
//! Every fault is bounded in time, and the run's end heals whatever is left.

use std::time::Duration;

use distlock_testkit::LinkMode;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::json;

use crate::mono;
use crate::scenario::{Fault, Scenario};
use crate::state::{SharedRef, lock, not_injected};

/// `lo..hi` times `ttl`.
fn times(rng: &mut StdRng, ttl: Duration, lo: f64, hi: f64) -> Duration {
    ttl.mul_f64(rng.random_range(lo..hi))
}

fn record(shared: &SharedRef, kind: &str, start: i64, extra: serde_json::Value) {
    let mut v = json!({"ev": "fault", "kind": kind, "start": start, "end": mono::now_ns(),
        "t": mono::now_ns(), "server_side": false});
    if let (Some(o), Some(x)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in x {
            o.insert(k.clone(), val.clone());
        }
    }
    lock(shared).history.record(v);
}

/// Waits, after a pause of master `m` of a deployment that fails over asynchronously, until
/// it has one master again for a while (a third of its fail-over time), so that the pause's
/// window covers the split brain: the old master comes back a master and stays one until the
/// deployment demotes it (11 s on Sentinel, seen in a run), long after the pause. Bounded by
/// five fail-over times (15 s on Sentinel, 30 s on a Cluster); false when it gave up there
/// (the fault's record says so, and a violation after it is one).
async fn two_masters_end(shared: &SharedRef, m: usize) -> bool {
    let settle = lock(shared).engine.failover_time();
    let give_up = tokio::time::Instant::now() + settle * 5;
    let mut one_since = None;
    while tokio::time::Instant::now() < give_up {
        let now = tokio::time::Instant::now();
        if lock(shared).engine.one_master(m) {
            let since = *one_since.get_or_insert(now);
            if now - since >= settle / 3 {
                return true;
            }
        } else {
            one_since = None;
        }
        // Each look runs redis-cli under the run's lock (a few milliseconds): not too often.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The worker holding the lock now, if any (with its operation).
fn holder(shared: &SharedRef) -> Option<(usize, u64)> {
    let s = lock(shared);
    s.workers
        .iter()
        .enumerate()
        .find_map(|(i, w)| w.holding.filter(|_| !w.paused).map(|n| (i, n)))
}

/// Waits up to `limit` for a holder.
async fn wait_holder(shared: &SharedRef, limit: Duration) -> Option<(usize, u64)> {
    let until = tokio::time::Instant::now() + limit;
    loop {
        if let Some(h) = holder(shared) {
            return Some(h);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits up to `limit` for worker `w` to hold the lock for `hold` in one operation other than
/// `before`; returns that operation.
async fn wait_long_hold(
    shared: &SharedRef,
    w: usize,
    before: Option<u64>,
    hold: Duration,
    limit: Duration,
) -> Option<u64> {
    let until = tokio::time::Instant::now() + limit;
    let mut since: Option<(u64, tokio::time::Instant)> = None;
    loop {
        let now = tokio::time::Instant::now();
        let holding = lock(shared).workers[w].holding;
        match holding {
            Some(n) if Some(n) != before => match since {
                Some((m, t)) if m == n => {
                    if now - t >= hold {
                        return Some(n);
                    }
                }
                _ => since = Some((n, now)),
            },
            _ => since = None,
        }
        if now >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A reply delay: three times in four a slow reply that still comes within the request
/// timeout (the client takes the lock late and must count its lease from the send), else one
/// past it (a timeout, an ambiguous outcome).
fn reply_delay(rng: &mut StdRng, request_timeout: Duration, ttl: Duration) -> Duration {
    if rng.random_bool(0.75) {
        request_timeout.mul_f64(rng.random_range(0.2..0.95))
    } else {
        times(rng, ttl, 0.3, 1.2)
    }
}

/// Some servers: one for a single server, one or two (a minority) of Redlock's masters.
fn some_servers(rng: &mut StdRng, n: usize) -> Vec<usize> {
    if n == 1 {
        return vec![0];
    }
    let k = rng.random_range(1..=(n - 1) / 2);
    let all: Vec<usize> = (0..n).collect();
    all.choose_multiple(rng, k).copied().collect()
}

pub(crate) fn set_links(shared: &SharedRef, w: usize, servers: &[usize], mode: LinkMode) {
    let s = lock(shared);
    for &i in servers {
        if let Some(p) = s.workers[w].proxies.get(i) {
            p.set(mode);
        }
    }
}

fn has_netns(shared: &SharedRef, w: usize) -> bool {
    lock(shared).workers[w].netns.is_some()
}

fn netns_cut(shared: &SharedRef, w: usize, ports: &[u16], reject: bool) {
    let cut = match &mut lock(shared).workers[w].netns {
        Some(n) => n.cut(ports, reject),
        None => Err("the worker has no network namespace".into()),
    };
    if let Err(e) = cut {
        not_injected(shared, format!("a partition of worker {w}"), e);
    }
}

fn netns_heal(shared: &SharedRef, w: usize) {
    let healed = match &mut lock(shared).workers[w].netns {
        Some(n) => n.heal(),
        None => Ok(()),
    };
    if let Err(e) = healed {
        not_injected(shared, format!("the heal of worker {w}'s partition"), e);
    }
}

/// Injects faults until `stop_at` (monotonic ns).
/// Each fault holds `turn` while it lasts (a bite, `bitten.rs`, holds it for its own), so that
/// faults come one at a time.
pub(crate) async fn inject(
    shared: SharedRef,
    scenario: Scenario,
    mut rng: StdRng,
    stop_at: i64,
    turn: crate::bite::Turn,
) {
    if scenario.faults.is_empty() {
        return;
    }
    let ttl = scenario.ttl;
    let servers = lock(&shared).engine.len();
    let direct = lock(&shared).engine.direct_url(ttl);
    let request_timeout = lock(&shared).engine.request_timeout();
    let steal_client = if scenario.faults.contains(&Fault::Steal) {
        match distlock::connect(&direct).await {
            Ok(c) => Some(std::sync::Arc::new(c)),
            Err(e) => {
                not_injected(&shared, "forced releases".into(), e.to_string());
                None
            }
        }
    } else {
        None
    };
    // Let the workers start.
    tokio::time::sleep(ttl).await;
    // The loop's `stopping`: set at the time's end, or earlier when a control's check found
    // a violation that no later event can undo.
    let stopping = || lock(&shared).stopping;
    while mono::now_ns() + (3 * ttl).as_nanos() as i64 <= stop_at && !stopping() {
        let Some(&fault) = scenario.faults.choose(&mut rng) else {
            return;
        };
        let turn_guard = turn.lock().await;
        // A bite may have held the turn until the time was up: no fault starts after it.
        if mono::now_ns() + (3 * ttl).as_nanos() as i64 > stop_at || stopping() {
            break;
        }
        let start = mono::now_ns();
        match fault {
            Fault::PauseHolder => {
                let d = times(&mut rng, ttl, 0.5, 3.0);
                lock(&shared).pause_at_check = Some(d);
                // The loop pauses the next worker that checks its lease; it records the fault.
                tokio::time::sleep(d + ttl / 2).await;
                lock(&shared).pause_at_check = None;
            }
            Fault::KillHolder => {
                if let Some((w, n)) = wait_holder(&shared, 2 * ttl).await {
                    // A group member may hold several partitions: each one's history gets the
                    // kill (`partitions.rs`).
                    let (pid, holds) = {
                        let s = lock(&shared);
                        (s.workers[w].pid, s.workers[w].owning.clone())
                    };
                    match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                        Ok(()) => {}
                        // It ended on its own just now: there was no holder to kill.
                        Err(nix::errno::Errno::ESRCH) => continue,
                        Err(e) => {
                            not_injected(&shared, format!("kill -9 of worker {w}"), e.to_string());
                            continue;
                        }
                    }
                    record(
                        &shared,
                        fault.name(),
                        mono::now_ns(),
                        json!({"w": w, "holder": n, "holds": holds}),
                    );
                }
            }
            Fault::PauseServer => {
                let which = some_servers(&mut rng, servers);
                let d = times(&mut rng, ttl, 0.2, 1.5);
                // No live master known (a fail-over under way): no fault this time.
                if !which.iter().all(|&i| lock(&shared).engine.pause(i)) {
                    tokio::time::sleep(ttl / 2).await;
                    continue;
                }
                let paused = lock(&shared).engine.paused_node();
                tokio::time::sleep(d).await;
                for &i in &which {
                    lock(&shared).engine.resume(i);
                }
                // A master paused past the deployment's failure detection is failed over to a
                // replica that may lack its last writes, and it comes back a master for a
                // while (split brain) before it is made a replica.
                let failover = scenario.engine.fails_over_async();
                let one_master = match paused {
                    Some(m) if failover => two_masters_end(&shared, m).await,
                    _ => true,
                };
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"servers": which, "server_side": failover, "one_master": one_master}),
                );
            }
            Fault::RestartServer if !lock(&shared).engine.restartable() => {}
            Fault::RestartServer => {
                let which = some_servers(&mut rng, servers);
                let delayed = rng.random_bool(0.5);
                let replicated = lock(&shared).engine.replicated();
                let delay = if replicated {
                    // A killed master stays down until its replica has taken over (one that
                    // came back empty before would wipe its replica: not a fault of the lock,
                    // and redis-restart-volatile shows what it does).
                    lock(&shared).engine.failover_time()
                } else if delayed {
                    times(&mut rng, ttl, 0.5, 2.0)
                } else {
                    Duration::ZERO
                };
                if !which.iter().all(|&i| lock(&shared).engine.kill(i)) {
                    tokio::time::sleep(ttl / 2).await;
                    continue;
                }
                tokio::time::sleep(delay).await;
                for &i in &which {
                    lock(&shared).engine.restart(i);
                }
                let volatile = !lock(&shared).engine.persistent();
                let kind = if volatile {
                    "restart-volatile"
                } else {
                    "restart-persistent"
                };
                record(
                    &shared,
                    kind,
                    start,
                    json!({"servers": which, "delay_ms": delay.as_millis() as u64,
                        "server_side": volatile}),
                );
            }
            Fault::DelayReplies if rng.random_bool(0.3) => {
                // Every worker's replies slowed, each by its own delay.
                let d = times(&mut rng, ttl, 3.0, 6.0);
                let all: Vec<usize> = (0..servers).collect();
                let mut delays = Vec::new();
                for w in 0..scenario.workers {
                    let delay = reply_delay(&mut rng, request_timeout, ttl);
                    delays.push(delay.as_millis() as u64);
                    set_links(&shared, w, &all, LinkMode::DelayReplies(delay));
                }
                tokio::time::sleep(d).await;
                for w in 0..scenario.workers {
                    set_links(&shared, w, &all, LinkMode::Pass);
                }
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"w": "all", "delays_ms": delays}),
                );
            }
            Fault::DelayReplies => {
                // One worker's replies slowed. A delay within the request timeout lasts until
                // the worker has taken the lock under it and held it for a TTL (6 TTLs at
                // most): a slow grant to a holder that outlives its lease is where a client
                // that counts its validity from the reply overstates it. A longer delay (the
                // requests time out) lasts 2-4 TTLs.
                let w = rng.random_range(0..scenario.workers);
                let which = some_servers(&mut rng, servers);
                let delay = reply_delay(&mut rng, request_timeout, ttl);
                let before = lock(&shared).workers[w].holding;
                set_links(&shared, w, &which, LinkMode::DelayReplies(delay));
                let held = if delay < request_timeout {
                    wait_long_hold(&shared, w, before, ttl, 6 * ttl).await
                } else {
                    tokio::time::sleep(times(&mut rng, ttl, 2.0, 4.0)).await;
                    None
                };
                set_links(&shared, w, &which, LinkMode::Pass);
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"w": w, "servers": which, "delay_ms": delay.as_millis() as u64,
                        "held_past_ttl": held}),
                );
            }
            Fault::LoseReplies | Fault::Partition => {
                let w = rng.random_range(0..scenario.workers);
                let which: Vec<usize> = if fault == Fault::Partition && rng.random_bool(0.5) {
                    (0..servers).collect()
                } else {
                    some_servers(&mut rng, servers)
                };
                let (mode, d) = match fault {
                    Fault::LoseReplies => (
                        LinkMode::LoseReplies,
                        Duration::from_millis(rng.random_range(100..500)),
                    ),
                    _ => (LinkMode::Blackhole, times(&mut rng, ttl, 0.5, 3.0)),
                };
                let in_netns = fault == Fault::Partition && has_netns(&shared, w);
                let reject = in_netns && rng.random_bool(0.5);
                let mode_name = if in_netns {
                    // nftables in the worker's namespace, on the proxies of those servers.
                    let all = which.len() == servers;
                    let ports: Vec<u16> = {
                        let s = lock(&shared);
                        which
                            .iter()
                            .map(|&i| s.workers[w].proxies[i].port())
                            .collect()
                    };
                    netns_cut(&shared, w, if all { &[] } else { &ports }, reject);
                    tokio::time::sleep(d).await;
                    netns_heal(&shared, w);
                    if reject { "nft reject" } else { "nft drop" }.to_owned()
                } else {
                    set_links(&shared, w, &which, mode);
                    tokio::time::sleep(d).await;
                    set_links(&shared, w, &which, LinkMode::Pass);
                    format!("{mode:?}")
                };
                // A reset link ends a database session, and the server frees its locks at
                // once: a loss on the server's side, which the holder hears at once (its lost
                // signal) but may act across; only fencing covers that.
                let reset = fault == Fault::LoseReplies || reject;
                let server_side = reset && scenario.engine.connection_bound();
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"w": w, "servers": which, "mode": mode_name,
                        "server_side": server_side}),
                );
            }
            Fault::LaggingFailover => {
                // The master's replica paused and its link cut while the master goes on
                // alone, then the master killed: the deployment promotes the replica without
                // the last acquisitions. The old master comes back empty, as a replica.
                // No live master with a replica known (a fail-over under way): not this time.
                let before = holder(&shared).map(|(_, n)| n);
                let Some(pair) = lock(&shared).engine.lag_replica() else {
                    tokio::time::sleep(ttl / 2).await;
                    continue;
                };
                // At least 0.3-0.8 TTL, and until someone took the lock on the master alone (a
                // holder other than the one at the start) and kept it 200 ms (a long holder,
                // whose lease outlives the fail-over; 3 TTLs at most): the fault is about the
                // acquisitions the replica misses.
                tokio::time::sleep(times(&mut rng, ttl, 0.3, 0.8)).await;
                let until = tokio::time::Instant::now() + 3 * ttl;
                let mut since: Option<(u64, tokio::time::Instant)> = None;
                while tokio::time::Instant::now() < until {
                    let now = tokio::time::Instant::now();
                    match (holder(&shared), since) {
                        (Some((_, n)), Some((m, t))) if n == m => {
                            if now - t >= Duration::from_millis(200) {
                                break;
                            }
                        }
                        (Some((_, n)), _) if Some(n) != before => since = Some((n, now)),
                        _ => since = None,
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let lag = Duration::from_nanos((mono::now_ns() - start).max(0) as u64);
                lock(&shared).engine.fail_over_lagging(pair);
                let settle = lock(&shared).engine.failover_time();
                tokio::time::sleep(settle).await;
                lock(&shared).engine.restart(0);
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"lag_ms": lag.as_millis() as u64,
                        "server_side": scenario.engine.fails_over_async()}),
                );
            }
            Fault::Evict => {
                if !lock(&shared).engine.evict() {
                    not_injected(&shared, "an eviction".into(), "not a memcached".into());
                }
                record(&shared, fault.name(), start, json!({"server_side": true}));
            }
            Fault::ServerClockJump => {
                let by = times(&mut rng, ttl, 0.3, 1.0);
                lock(&shared).engine.clock_jump(by);
                record(
                    &shared,
                    fault.name(),
                    start,
                    json!({"by_ms": by.as_millis() as u64, "server_side": true}),
                );
            }
            Fault::ClientClockJump => {
                let back = rng.random_range(2..=4) * ttl.as_secs().max(1);
                let d = times(&mut rng, ttl, 1.5, 2.5);
                lock(&shared).jump_at_acquire = Some((back, d));
                tokio::time::sleep(d + ttl).await;
                lock(&shared).jump_at_acquire = None;
            }
            Fault::Steal => {
                if let Some((w, n)) = wait_holder(&shared, 2 * ttl).await {
                    // What an operator's forced release does: the holder's lock goes on the
                    // server side (Redis: deleted; etcd, ZooKeeper: its key or node deleted;
                    // PostgreSQL: its session terminated).
                    // The window runs from before the call to its end: the loss happens
                    // somewhere in it, and loss detection is measured from its start.
                    let start = mono::now_ns();
                    if let Some(c) = &steal_client
                        && let Err(e) = force_release(c.clone()).await
                    {
                        not_injected(&shared, "a forced release".into(), e);
                    }
                    record(
                        &shared,
                        fault.name(),
                        start,
                        json!({"w": w, "holder": n, "server_side": true}),
                    );
                    tokio::time::sleep(ttl).await;
                }
            }
        }
        drop(turn_guard);
        // A quiet spell, so each fault's effects can be told apart.
        let quiet = times(&mut rng, ttl, 1.0, 2.5);
        tokio::time::sleep(quiet).await;
    }
}

/// Client clock jump, started by the loop when a worker under libfaketime takes the lock: its
/// wall clock goes back `back_s` seconds and it is paused for `d`, past its lease; the clock
/// is set right again after.
pub(crate) fn jump_and_pause(shared: &SharedRef, id: usize, back_s: u64, d: Duration) {
    let (pid, file, holder) = {
        let mut s = lock(shared);
        let w = &mut s.workers[id];
        w.paused = true;
        (w.pid, w.faketime.clone(), w.holding)
    };
    let Some(file) = file else { return };
    let start = mono::now_ns();
    let what = move || format!("a clock jump of worker {id}");
    if let Err(e) = std::fs::write(&file, format!("-{back_s}\n")) {
        not_injected(shared, what(), e.to_string());
    }
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGSTOP) {
        not_injected(shared, what(), e.to_string());
    }
    lock(shared).recording += 1;
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGCONT) {
            not_injected(&shared, what(), e.to_string());
        }
        // The holder runs on with the jumped clock for a while, then it is set right.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Err(e) = std::fs::write(&file, "+0\n") {
            not_injected(&shared, what(), e.to_string());
        }
        {
            let mut s = lock(&shared);
            if s.workers[id].pid == pid {
                s.workers[id].paused = false;
            }
        }
        record(
            &shared,
            "client-clock-jump",
            start,
            json!({"w": id, "holder": holder, "back_s": back_s,
                "paused_ms": d.as_millis() as u64}),
        );
        lock(&shared).recording -= 1;
    });
}

/// A forced release of the harness's lock.
async fn force_release(c: std::sync::Arc<distlock::LockClient>) -> Result<(), String> {
    c.force_release("k")
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
