//! The orchestrator: starts the engine, the proxies and the worker processes, hands out
//! operations, serves the protected resource, injects the scenario's faults on a seeded
//! schedule, records the history and runs the checkers.

mod audit;
mod end;
mod serve;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use self::audit::audit;
use self::end::heal_and_check;
use self::serve::serve;
use self::workers::{LIBFAKETIME, SpawnCfg, next_op, pause_worker, spawn_worker};
use crate::check::{self, Bounds, Figures};
use crate::engine::Engine;
use crate::mono;
use crate::resource::Register;
use crate::scenario::{Fault, Scenario};
use crate::sql::SqlResource;
use crate::state::{History, RunState, SharedRef, lock, not_injected};

/// What one run produced.
#[derive(Debug)]
pub(crate) struct RunReport {
    pub(crate) figures: Figures,
    pub(crate) history: PathBuf,
    /// The bites (`bite.rs`): leases broken on purpose.
    pub(crate) bites: crate::bite::Tally,
}

/// Messages to the orchestrator's loop.
enum Msg {
    Line(usize, u64, Value),
    Exited(usize, u64),
}

/// How often a control looks at its history so far.
const LOOK_EVERY_NS: i64 = 1_000_000_000;

/// Runs `scenario` with `seed`, writing the history under `out_dir`.
pub(crate) async fn run(
    scenario: &Scenario,
    seed: u64,
    duration: Duration,
    out_dir: &Path,
    seeded_bug: Option<&str>,
) -> Result<RunReport, String> {
    let ttl = scenario.ttl;
    let engine = Engine::start(scenario.engine)?;
    let upstreams = engine.upstreams();
    let fenced_engine = engine.fenced();
    let tag = match seeded_bug {
        Some(b) => format!("{}-bug-{b}-{seed}", scenario.name),
        None => format!("{}-{seed}", scenario.name),
    };
    let history_path = out_dir.join(format!("{tag}.jsonl"));
    let history = History::create(&history_path).map_err(|e| e.to_string())?;
    let shared: SharedRef = Arc::new(Mutex::new(RunState {
        workers: Vec::new(),
        history,
        fenced: Register::default(),
        unfenced: Register::default(),
        keyed: std::collections::HashMap::new(),
        engine,
        pause_at_check: None,
        jump_at_acquire: None,
        not_injected: Vec::new(),
        stopping: false,
        recording: 0,
        next_op: 1,
        bite: crate::bite::Bite::default(),
    }));
    let sql = if scenario.sql {
        Some(Arc::new(SqlResource::start().await?))
    } else {
        None
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let uses_faketime = scenario.faults.contains(&Fault::ClientClockJump);
    if uses_faketime && !Path::new(LIBFAKETIME).exists() {
        return Err(format!(
            "{} needs libfaketime ({LIBFAKETIME}; Debian package faketime)",
            scenario.name
        ));
    }
    if scenario.netns {
        for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            if !crate::netns::installed(tool) {
                return Err(format!(
                    "{} cuts workers off with `{tool}`, which is not installed (Debian package \
                     {package})",
                    scenario.name
                ));
            }
        }
    }
    let spawn = SpawnCfg {
        kind: scenario.engine,
        netns: scenario.netns,
        ttl,
        seeded_bug: seeded_bug.map(str::to_owned),
        faketime: uses_faketime,
        dir: out_dir.to_path_buf(),
        tag: tag.clone(),
        upstreams,
    };
    for id in 0..scenario.workers {
        let w = spawn_worker(&spawn, id, 0, &tx).await?;
        lock(&shared).workers.push(w);
    }
    // Each worker draws its operations from its own generator, so the seed fixes every
    // worker's sequence whatever the order their events arrive in.
    let mut rngs: Vec<StdRng> = (0..scenario.workers as u64)
        .map(|w| StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ w))
        .collect();
    let injector_rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let started = mono::now_ns();
    let mut stop_at = started + duration.as_nanos() as i64;
    lock(&shared)
        .history
        .record(json!({"ev": "start", "t": started,
        "scenario": scenario.name, "seed": seed, "ttl_ms": ttl.as_millis() as u64,
        "seeded_bug": seeded_bug}));
    let turn = crate::bite::Turn::default();
    // The loop's own view of the turn: a fault or a bite under way at the stop holds it.
    let faulting = turn.clone();
    let injector = tokio::spawn(crate::faults::inject(
        shared.clone(),
        scenario.clone(),
        injector_rng,
        stop_at,
        turn.clone(),
    ));
    // The bite: a held write, once let go, is served as any write is.
    let bites = Arc::new(Mutex::new(crate::bite::Tally::default()));
    let release: crate::bitten::Release = {
        let shared = shared.clone();
        let sql = sql.clone();
        Arc::new(move |id, v| serve(&shared, id, "write", v, fenced_engine, sql.as_ref()))
    };
    let mut biter = tokio::spawn(crate::bitten::run(
        shared.clone(),
        scenario.clone(),
        turn,
        (started, stop_at),
        release,
        bites.clone(),
    ));
    // The leak audit reads the mutex's key: a read-write lock's readers or a semaphore keep
    // theirs elsewhere.
    let ports = if scenario.kinds == crate::scenario::Kinds::Mutex {
        lock(&shared).engine.redis_ports()
    } else {
        Vec::new()
    };
    let auditor = tokio::spawn(audit(shared.clone(), ports.clone(), ttl / 5));
    let mut incs = vec![0u64; scenario.workers];
    let renew = ttl / 3;
    let bounds = Bounds {
        free_within_ns: (ttl + Duration::from_millis(2500)).as_nanos() as i64,
        detect_within_ns: (renew
            + lock(&shared).engine.request_timeout()
            + Duration::from_millis(100))
        .as_nanos() as i64,
        caveat_window_ns: (2 * ttl).as_nanos() as i64,
        split_brain: scenario.engine.fails_over_async(),
    };
    // A control (a seeded bug switched on) looks at its history so far once a second, and ends
    // early once a check that no later event can undo has fired (see
    // `Figures::settled_violations`): the verdict is still the whole history's, checked below.
    let mut next_look = started + LOOK_EVERY_NS;
    // The loop ends when the time is up and every worker finished its operation, or at the
    // hard deadline.
    let hard_stop = stop_at + (scenario.max_op_time().as_nanos() as i64) + 15_000_000_000;
    loop {
        let now = mono::now_ns();
        if seeded_bug.is_some() && now >= next_look && now < stop_at {
            next_look = now + LOOK_EVERY_NS;
            // The events of a second ago and before: every worker's have arrived by now (the
            // pipes carry them in microseconds; a paused worker writes before it acts).
            let cut = now - LOOK_EVERY_NS;
            let s = lock(&shared);
            let before: Vec<Value> = s
                .history
                .events
                .iter()
                .filter(|e| e.get("t").and_then(Value::as_i64).is_some_and(|t| t <= cut))
                .cloned()
                .collect();
            let so_far = if scenario.partitions() {
                crate::partitions::check_each(&before, &s.keyed, fenced_engine, bounds, cut)
            } else if scenario.many() {
                crate::many::check_each(&before, &s.keyed, fenced_engine, bounds, cut)
            } else {
                check::check(
                    &before,
                    fenced_engine.then_some(&s.fenced),
                    &s.unfenced,
                    bounds,
                    cut,
                )
            };
            if so_far.settled_violations() > 0 {
                stop_at = now;
            }
        }
        if now >= stop_at {
            let mut s = lock(&shared);
            s.stopping = true;
            // A bite under way (its holder paused, or its stale write awaited) ends first: it
            // lets go at the stop, and its record and tally come once the stale write came.
            // So does a fault under way (a lagging fail-over's settle, a pause's window kept
            // open until one master is left): its window is recorded when it ends, and what it
            // caused is judged against that window.
            // A worker's pause or clock jump is recorded by a task of its own when it ends.
            let biting = s.bite.active.is_some() || s.bite.stale.is_some();
            let in_fault = faulting.try_lock().is_err() || s.recording > 0;
            let idle = s.workers.iter().all(|w| w.op.is_none() || w.paused);
            if idle && !biting && !in_fault {
                break;
            }
            if now >= hard_stop {
                if in_fault {
                    // Its window would go unrecorded, and what it caused be judged without it.
                    drop(s);
                    crate::state::not_injected(
                        &shared,
                        "the whole of a fault under way at the run's end".into(),
                        "it outlasted the hard stop, and its window was not recorded".into(),
                    );
                }
                break;
            }
        }
        let msg = match tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(_) => continue,
        };
        match msg {
            Msg::Line(id, inc, mut v) => {
                if incs[id] != inc {
                    continue;
                }
                if let Some(o) = v.as_object_mut() {
                    o.insert("w".into(), json!(id));
                    o.insert("inc".into(), json!(inc));
                }
                let ev = v.get("ev").and_then(Value::as_str).unwrap_or("").to_owned();
                let req = v
                    .get("req")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                if ev == "ready" {
                    lock(&shared).history.record(v);
                    next_op(&shared, id, scenario, &mut rngs[id]);
                    continue;
                }
                if !req.is_empty() {
                    serve(&shared, id, &req, v, fenced_engine, sql.as_ref());
                    continue;
                }
                let mut pause = None;
                let mut jump = None;
                let bitten;
                {
                    let mut s = lock(&shared);
                    let pid = s.workers[id].pid;
                    bitten = s.bite.observe(id, pid, &v).filter(|k| k.stops());
                    let n = v.get("n").and_then(Value::as_u64);
                    let w = &mut s.workers[id];
                    match (ev.as_str(), v.get("f").and_then(Value::as_str)) {
                        ("ok", Some("acquire")) => {
                            w.holding = n;
                            w.owning.extend(n);
                            if w.faketime.is_some() {
                                jump = s.jump_at_acquire.take();
                            }
                        }
                        ("invoke", Some("release")) | ("abandon", _) | ("cancel", _) => {
                            // A lock's one operation; a group member's one partition.
                            w.owning.retain(|&h| Some(h) != n);
                            if ev != "invoke" {
                                w.owning.clear();
                            }
                            w.holding = w.owning.last().copied();
                        }
                        ("fail" | "info", Some("acquire" | "join")) => w.backoff = true,
                        // A check that a bite took is not the random pause's.
                        ("check", _) if bitten.is_none() => {
                            if let Some(d) = s.pause_at_check.take() {
                                pause = Some(d);
                            }
                        }
                        _ => {}
                    }
                    if ev == "ok" && s.bite.permits > 0 {
                        // A semaphore's bite takes over once others hold every permit.
                        let bitten_w = s.bite.active.as_ref().map(|a| a.w);
                        let others = s
                            .workers
                            .iter()
                            .enumerate()
                            .filter(|&(i, w)| Some(i) != bitten_w && w.holding.is_some())
                            .count();
                        s.bite.held_by(others);
                    }
                    s.history.record(v);
                }
                if let Some(k) = bitten {
                    crate::bitten::stop(&shared, id, k, ttl);
                }
                if let Some(d) = pause {
                    pause_worker(&shared, id, d);
                }
                if let Some((back, d)) = jump {
                    crate::faults::jump_and_pause(&shared, id, back, d);
                }
                if ev == "done" {
                    lock(&shared).workers[id].op = None;
                    next_op(&shared, id, scenario, &mut rngs[id]);
                }
            }
            Msg::Exited(id, inc) => {
                if incs[id] != inc {
                    continue;
                }
                // Killed by the injector: a new process takes its place.
                if lock(&shared).stopping {
                    lock(&shared).workers[id].op = None;
                    continue;
                }
                incs[id] += 1;
                let w = spawn_worker(&spawn, id, incs[id], &tx).await?;
                let mut s = lock(&shared);
                s.history
                    .record(json!({"ev": "respawn", "w": id, "inc": incs[id],
                    "t": mono::now_ns()}));
                s.workers[id] = w;
            }
        }
    }
    injector.abort();
    // The bite has recorded its last one by now (the loop waited for it), or is between tries.
    if tokio::time::timeout(Duration::from_secs(1), &mut biter)
        .await
        .is_err()
    {
        biter.abort();
        let _ = biter.await;
    }
    if let Err(e) = injector.await
        && e.is_panic()
    {
        not_injected(&shared, "the injector".into(), "it panicked".into());
    }
    auditor.abort();
    let _ = auditor.await;
    let figures = heal_and_check(
        &shared,
        scenario,
        sql.as_ref(),
        &ports,
        fenced_engine,
        bounds,
    )
    .await?;
    let bites = bites.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Ok(RunReport {
        figures,
        history: history_path,
        bites,
    })
}
