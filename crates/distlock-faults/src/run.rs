//! The orchestrator: starts the engine, the proxies and the worker processes, hands out
//! operations, serves the protected resource, injects the scenario's faults on a seeded
//! schedule, records the history and runs the checkers.

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_testkit::{FaultProxy, LinkMode};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::check::{self, Bounds, Figures};
use crate::engine::{Engine, EngineKind};
use crate::mono;
use crate::netns::NetNs;
use crate::resource::Register;
use crate::scenario::{Fault, Scenario};
use crate::sql::SqlResource;
use crate::state::{History, RunState, SharedRef, Worker, lock, not_injected};

/// How long a worker waits before its next operation after an acquire that failed.
const BACKOFF_MS: u64 = 50;

/// libfaketime, for client clock jumps.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

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

/// Runs `scenario` with `seed`, writing the history under `out_dir`.
/// How often a control looks at its history so far.
const LOOK_EVERY_NS: i64 = 1_000_000_000;

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
            let biting = s.bite.active.is_some() || s.bite.stale.is_some();
            let in_fault = faulting.try_lock().is_err();
            let idle = s.workers.iter().all(|w| w.op.is_none() || w.paused);
            if (idle && !biting && !in_fault) || now >= hard_stop {
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
    let run_end = mono::now_ns();
    // Heal, look for leftover locks, stop the workers, and check.
    let mut failed = Vec::new();
    {
        let mut s = lock(&shared);
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
        not_injected(&shared, "the final heal".into(), f);
    }
    // Background releases (cancelled operations) finish within a round trip or two.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(sql) = &sql {
        let v = sql.values().await?;
        lock(&shared)
            .history
            .record(json!({"ev": "sql-final", "t": mono::now_ns(),
            "w": v.w, "rw": v.rw}));
    }
    // The copies of the lock left on the Redis servers (every server runs again by now).
    let leftover = if ports.is_empty() {
        None
    } else {
        let copies = lock_copies(&ports, Duration::from_secs(1)).await;
        Some(
            copies
                .into_iter()
                .map(|(_, token, _)| token)
                .collect::<Vec<_>>(),
        )
    };
    let mut s = lock(&shared);
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
    let bites = bites.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Ok(RunReport {
        figures,
        history: history_path,
        bites,
    })
}

struct SpawnCfg {
    kind: EngineKind,
    netns: bool,
    ttl: Duration,
    seeded_bug: Option<String>,
    faketime: bool,
    dir: PathBuf,
    tag: String,
    upstreams: Vec<std::net::SocketAddr>,
}

async fn spawn_worker(
    cfg: &SpawnCfg,
    id: usize,
    inc: u64,
    tx: &mpsc::UnboundedSender<Msg>,
) -> Result<Worker, String> {
    let netns = if cfg.netns {
        Some(NetNs::create(id, inc)?)
    } else {
        None
    };
    let ip: IpAddr = netns
        .as_ref()
        .map_or(Ipv4Addr::LOCALHOST, |n| n.host_ip)
        .into();
    let mut proxies = Vec::new();
    for up in &cfg.upstreams {
        proxies.push(
            FaultProxy::start_on(ip, *up)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let ports: Vec<u16> = proxies.iter().map(FaultProxy::port).collect();
    let url = cfg.kind.url(&ip.to_string(), &ports, cfg.ttl);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let stderr = File::create(cfg.dir.join(format!("{}-w{id}-{inc}.log", cfg.tag)))
        .map_err(|e| e.to_string())?;
    let mut cmd = match &netns {
        Some(n) => n.command(&exe),
        None => Command::new(exe),
    };
    cmd.args(["worker", "--url", &url, "--id", &id.to_string()])
        .args(["--inc", &inc.to_string()])
        .args(["--ttl-ms", &cfg.ttl.as_millis().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .env_remove(distlock_core::seeded::ENV);
    if let Some(bug) = &cfg.seeded_bug {
        cmd.env(distlock_core::seeded::ENV, bug);
    }
    let mut faketime = None;
    if cfg.faketime {
        let f = cfg.dir.join(format!("{}-w{id}.faketime", cfg.tag));
        std::fs::write(&f, "+0\n").map_err(|e| e.to_string())?;
        cmd.env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &f)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        faketime = Some(f);
    }
    let mut child = cmd.spawn().map_err(|e| format!("spawn worker: {e}"))?;
    let pid = child.id().ok_or("worker exited at once")? as i32;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let (input, mut lines_in) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(line) = lines_in.recv().await {
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                return;
            }
        }
    });
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let tx = tx.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(Msg::Line(id, inc, v));
            }
        }
        let _ = tx.send(Msg::Exited(id, inc));
    });
    Ok(Worker {
        child,
        input,
        pid,
        proxies,
        netns,
        faketime,
        op: None,
        holding: None,
        owning: Vec::new(),
        paused: false,
        backoff: false,
    })
}

/// Sends a line to a worker (a dead one's closed pipe is ignored: it is being replaced).
fn send(shared: &SharedRef, id: usize, v: &Value) {
    let _ = lock(shared).workers[id].input.send(format!("{v}\n"));
}

fn next_op(shared: &SharedRef, id: usize, scenario: &Scenario, rng: &mut StdRng) {
    let op = {
        let mut s = lock(shared);
        if s.stopping {
            return;
        }
        let n = s.next_op;
        s.next_op += 1;
        s.workers[id].op = Some(n);
        let mut op = scenario.op(n, rng);
        if std::mem::take(&mut s.workers[id].backoff) {
            op["delay_ms"] = json!(BACKOFF_MS);
        }
        s.bite.sent(n, &op);
        op
    };
    send(shared, id, &op);
}

/// Serves a read or a write of the protected resource, and records it. With the SQL form,
/// its statements run first, in a task of their own.
fn serve(
    shared: &SharedRef,
    id: usize,
    req: &str,
    v: Value,
    fenced_engine: bool,
    sql: Option<&Arc<SqlResource>>,
) {
    // The bitten holder's write is held until the bite lets it go.
    if lock(shared).bite.intercept(id, req, &v) {
        return;
    }
    let Some(sql) = sql.cloned() else {
        apply(shared, id, req, &v, fenced_engine, Value::Null);
        return;
    };
    let shared = shared.clone();
    let req = req.to_owned();
    tokio::spawn(async move {
        let fence = v.get("fence").and_then(Value::as_u64);
        let part = if req == "read" {
            match sql.read(fence).await {
                Ok(r) => json!({"sw": r.w, "srw": r.rw}),
                Err(e) => json!({"sql_error": e}),
            }
        } else {
            let w = v.get("sw").and_then(Value::as_i64).unwrap_or(0);
            let rw = v.get("srw").and_then(Value::as_i64).unwrap_or(0);
            match sql.write(fence, w, rw).await {
                Ok((a, b)) => {
                    json!({"sw": w, "srw": rw, "sw_accepted": a, "srw_accepted": b})
                }
                Err(e) => json!({"sql_error": e}),
            }
        };
        apply(&shared, id, &req, &v, fenced_engine, part);
    });
}

/// The in-memory registers' part of a request, the history record and the reply; `sql` is
/// what the SQL form answered (merged into both).
fn apply(shared: &SharedRef, id: usize, req: &str, v: &Value, fenced_engine: bool, sql: Value) {
    let n = v.get("n").and_then(Value::as_u64).unwrap_or(0);
    let fence = v.get("fence").and_then(Value::as_u64);
    let merge = |mut a: Value| {
        if let (Some(o), Some(x)) = (a.as_object_mut(), sql.as_object()) {
            for (k, val) in x {
                o.insert(k.clone(), val.clone());
            }
        }
        a
    };
    let key = v.get("key").and_then(Value::as_str).unwrap_or("k");
    let reply = {
        let mut guard = lock(shared);
        let s = &mut *guard;
        let t = mono::now_ns();
        // The scenario's one key's registers, or another name's (a multi-name scenario).
        let (fenced, unfenced) = if key == "k" {
            (&mut s.fenced, &mut s.unfenced)
        } else {
            let r = s.keyed.entry(key.to_owned()).or_default();
            (&mut r.0, &mut r.1)
        };
        if req == "read" {
            let value = fenced.read(true, fence);
            let uvalue = unfenced.read(false, fence);
            s.history.record(merge(
                json!({"ev": "read", "w": id, "n": n, "t": t, "key": key,
                "fence": fence, "value": value, "uvalue": uvalue, "sent": v.get("t")}),
            ));
            merge(json!({"reply": "read", "n": n, "value": value, "uvalue": uvalue}))
        } else {
            let value = v.get("value").and_then(Value::as_i64).unwrap_or(0);
            let uvalue = v.get("uvalue").and_then(Value::as_i64).unwrap_or(0);
            let accepted = fenced_engine && fenced.write(true, n, fence, value);
            let uaccepted = unfenced.write(false, n, fence, uvalue);
            s.history.record(merge(
                json!({"ev": "write", "w": id, "n": n, "t": t, "key": key,
                "fence": fence, "value": value, "accepted": accepted,
                "uaccepted": uaccepted, "sent": v.get("t")}),
            ));
            s.bite.wrote(n, key);
            json!({"reply": "write", "n": n, "accepted": accepted, "uaccepted": uaccepted})
        }
    };
    send(shared, id, &reply);
}

pub(crate) fn pause_worker(shared: &SharedRef, id: usize, d: Duration) {
    let (pid, holder) = {
        let mut s = lock(shared);
        let w = &mut s.workers[id];
        w.paused = true;
        (w.pid, w.holding)
    };
    let start = mono::now_ns();
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGSTOP) {
        not_injected(shared, format!("pause of worker {id}"), e.to_string());
        lock(shared).workers[id].paused = false;
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGCONT) {
            not_injected(&shared, format!("thaw of worker {id}"), e.to_string());
        }
        let mut s = lock(&shared);
        if s.workers[id].pid == pid {
            s.workers[id].paused = false;
        }
        s.history
            .record(json!({"ev": "fault", "kind": "pause-holder", "w": id,
            "holder": holder, "start": start, "end": mono::now_ns(), "t": mono::now_ns(),
            "server_side": false}));
    });
}

/// Reads the lock's copies on every Redis server every `every`, and records the ones it finds
/// (the leak check: a copy that belongs to no holder must not stay).
async fn audit(shared: SharedRef, ports: Vec<u16>, every: Duration) {
    if ports.is_empty() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        // A paused or restarting server is skipped this time.
        let copies: Vec<Value> = lock_copies(&ports, Duration::from_millis(100))
            .await
            .into_iter()
            .map(|(i, token, owner)| json!([i, token, owner]))
            .collect();
        // Empty audits are recorded too: a leak is a copy seen in consecutive audits.
        lock(&shared)
            .history
            .record(json!({"ev": "audit", "t": mono::now_ns(), "copies": copies}));
    }
}

/// The lock's copies on the Redis servers at `ports`: (server, token, owner) for each server
/// that has one and answers within `timeout`.
async fn lock_copies(ports: &[u16], timeout: Duration) -> Vec<(usize, String, String)> {
    let name = "distlock:{k}";
    let mut copies = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let read = async {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("GET")
                .arg(name)
                .query_async::<Option<String>>(&mut c)
                .await
                .ok()?
        };
        if let Ok(Some(v)) = tokio::time::timeout(timeout, read).await {
            let mut parts = v.split(' ');
            let token = parts.next().unwrap_or("").to_owned();
            let owner = parts.nth(1).unwrap_or("").to_owned();
            copies.push((i, token, owner));
        }
    }
    copies
}
