//! P2: one hot key, many waiters over several processes: throughput, fairness, commands per
//! acquisition and hand-off latency; distlock's modes, and the peers beside them.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

use crate::common::{Mode, first_line, mono_ns, spawn_workers};
use crate::peers;

pub(crate) fn options(mode: Mode) -> LockOptions {
    let b = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30));
    match mode {
        Mode::Events => b,
        Mode::Polling => b.events(false),
        Mode::Handoff => b.handoff(true),
    }
    .build()
    .expect("options")
}

/// One contending process: `tasks` tasks take the hot key in a loop until the stop time, and
/// print `[fence, acquired_ns, release_sent_ns]` for every acquisition as one JSON line.
pub(crate) async fn worker(
    url: String,
    tasks: usize,
    start_ns: u64,
    millis: u64,
    mode: Mode,
    (hold_us, gap_us): (u64, u64),
) {
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let client = LockClient::builder(backend)
        .options(options(mode))
        .local_queue(mode != Mode::Polling)
        .build();
    let now = mono_ns();
    if start_ns > now {
        tokio::time::sleep(Duration::from_nanos(start_ns - now)).await;
    }
    let stop = start_ns + millis * 1_000_000;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let c = client.clone();
        handles.push(tokio::spawn(async move {
            let mut events = Vec::new();
            while mono_ns() < stop {
                let called = mono_ns();
                let g = c.acquire("hot").await.expect("acquire");
                let acquired = mono_ns();
                if hold_us > 0 && gap_us > 0 {
                    // P3: tokio's whole-millisecond timer, on purpose (see its comment).
                    tokio::time::sleep(Duration::from_micros(hold_us)).await;
                } else if hold_us > 0 {
                    // P2's hold, as precise as the peers' (a thread's sleep): tokio's timer
                    // would round 1 ms up to nearly 2.
                    let hold = Duration::from_micros(hold_us);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(hold)).await;
                }
                let fence = g.fence().unwrap_or(0);
                let sent = mono_ns();
                let _ = g.release().await.expect("release");
                events.push([fence, acquired, sent, called]);
                if gap_us > 0 {
                    tokio::time::sleep(Duration::from_micros(gap_us)).await;
                }
            }
            events
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    let commands = client
        .engine::<RedisBackend>()
        .expect("a Redis client")
        .commands_sent();
    println!(
        "{}",
        serde_json::json!({ "events": all, "commands": commands })
    );
}

pub(crate) struct Contention {
    pub(crate) mode: Mode,
    pub(crate) waiters: usize,
    pub(crate) hold_us: u64,
    pub(crate) processes: usize,
    pub(crate) per_sec: f64,
    pub(crate) fairness: f64,
    pub(crate) cmds_per_acq: f64,
    pub(crate) calls_per_acq: f64,
    pub(crate) handoff_p50_us: f64,
    pub(crate) handoff_p99_us: f64,
    pub(crate) cross_p50_us: f64,
    pub(crate) cross_p99_us: f64,
    /// Hand-offs counted (none with a single waiter: it never waits for anybody).
    pub(crate) handoffs: u64,
    /// Hand-offs between processes counted.
    pub(crate) cross_count: u64,
}

/// `waiters` on the hot key, spread over at most 4 processes.
pub(crate) async fn contention(
    server: &RedisServer,
    mode: Mode,
    waiters: usize,
    millis: u64,
    threads: usize,
    hold_gap: (u64, u64),
) -> Contention {
    let processes = waiters.clamp(1, 4);
    let shape = (processes, waiters / processes);
    contention_shaped(server, mode, shape, millis, threads, hold_gap).await
}

/// `processes` × `tasks` waiters on the hot key.
pub(crate) async fn contention_shaped(
    server: &RedisServer,
    mode: Mode,
    (processes, tasks): (usize, usize),
    millis: u64,
    threads: usize,
    (hold_us, gap_us): (u64, u64),
) -> Contention {
    let waiters = processes * tasks;
    let calls_before = total_calls(server);
    let start_ns = mono_ns() + 400_000_000;
    let (hold, gap) = (hold_us.to_string(), gap_us.to_string());
    let children = spawn_workers(
        server,
        "worker",
        processes,
        (tasks, start_ns, millis, threads),
        &["--mode", mode.name(), "--hold-us", &hold, "--gap-us", &gap],
    );
    let mut per_process = Vec::new();
    let mut cmds = 0u64;
    // (fence, acquired, release sent, acquire called, process)
    let mut events: Vec<(u64, u64, u64, u64, usize)> = Vec::new();
    for (p, child) in children.into_iter().enumerate() {
        let line = first_line(child).await;
        let v: serde_json::Value = serde_json::from_str(&line).expect("worker JSON");
        cmds += v["commands"].as_u64().unwrap_or(0);
        let evs = v["events"].as_array().expect("events").clone();
        per_process.push(evs.len());
        for e in evs {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            events.push((f(0), f(1), f(2), f(3), p));
        }
    }
    let total = events.len().max(1);
    // Commands per acquisition: as the clients sent them, and as the server counted its calls
    // (INFO commandstats, less our own INFO: the calls a script makes count there too).
    let served = total_calls(server).saturating_sub(calls_before + 1);
    // Hand-off: acquisitions in fence order (acquired time breaks ties of handed-off leases),
    // counted only where the next holder was already waiting when the release began (else it
    // is an uncontended acquire that happened to come next, not a hand-off).
    events.sort_by_key(|e| (e.0, e.1));
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut cross = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for w in events.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if next.1 >= prev.2 && next.3 <= prev.2 {
            let ns = next.1 - prev.2;
            let _ = all.record(ns);
            if next.4 != prev.4 {
                let _ = cross.record(ns);
            }
        }
    }
    let max = per_process.iter().copied().max().unwrap_or(0).max(1);
    let min = per_process.iter().copied().min().unwrap_or(0);
    Contention {
        mode,
        waiters,
        hold_us,
        processes,
        per_sec: total as f64 / (millis as f64 / 1000.0),
        fairness: min as f64 / max as f64,
        cmds_per_acq: cmds as f64 / total as f64,
        calls_per_acq: served as f64 / total as f64,
        handoff_p50_us: all.value_at_quantile(0.5) as f64 / 1000.0,
        handoff_p99_us: all.value_at_quantile(0.99) as f64 / 1000.0,
        cross_p50_us: cross.value_at_quantile(0.5) as f64 / 1000.0,
        cross_p99_us: cross.value_at_quantile(0.99) as f64 / 1000.0,
        handoffs: all.len(),
        cross_count: cross.len(),
    }
}

/// P2 of a peer: its own contending processes on one hot key.
pub(crate) struct PeerContention {
    pub(crate) name: String,
    pub(crate) hold_us: u64,
    pub(crate) result: Result<PeerP2, peers::Figure>,
}

pub(crate) struct PeerP2 {
    pub(crate) per_sec: f64,
    pub(crate) fairness: f64,
    pub(crate) calls_per_acq: f64,
    pub(crate) errors: u64,
}

/// Every command the server has run so far (`INFO commandstats`).
pub(crate) fn total_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

pub(crate) fn peer_contention(
    server: &RedisServer,
    peer: &peers::Peer,
    (processes, tasks): (usize, usize),
    millis: u64,
    hold_us: u64,
) -> PeerContention {
    let url = server.url();
    let args = |start_ns: u64| {
        vec![
            url.clone(),
            tasks.to_string(),
            start_ns.to_string(),
            millis.to_string(),
            hold_us.to_string(),
        ]
    };
    let result = peer_processes(server, peer, "contend", args, processes, millis).map(
        |(per_process, calls)| {
            let acquisitions: Vec<u64> = per_process
                .iter()
                .map(|v| v["acquisitions"].as_u64().unwrap_or(0))
                .collect();
            let errors = per_process
                .iter()
                .map(|v| v["errors"].as_u64().unwrap_or(0))
                .sum();
            let total: u64 = acquisitions.iter().sum();
            let max = acquisitions.iter().copied().max().unwrap_or(0).max(1);
            let min = acquisitions.iter().copied().min().unwrap_or(0);
            PeerP2 {
                per_sec: total as f64 / (millis as f64 / 1000.0),
                fairness: min as f64 / max as f64,
                calls_per_acq: calls as f64 / total.max(1) as f64,
                errors,
            }
        },
    );
    PeerContention {
        name: peer.name.clone(),
        hold_us,
        result,
    }
}

/// `processes` processes of a peer's `mode`, with the arguments `args(start_ns)`, all starting
/// together: the JSON object each printed, and the calls the server ran meanwhile (INFO
/// commandstats, less our own INFO).
pub(crate) fn peer_processes(
    server: &RedisServer,
    peer: &peers::Peer,
    mode: &str,
    args: impl Fn(u64) -> Vec<String>,
    processes: usize,
    millis: u64,
) -> Result<(Vec<serde_json::Value>, u64), peers::Figure> {
    let before = total_calls(server);
    // Interpreters take a while to start: everybody begins together, 2 s from now.
    let start_ns = mono_ns() + 2_000_000_000;
    let deadline = Instant::now() + Duration::from_millis(2000 + millis) + Duration::from_secs(30);
    let args = args(start_ns);
    let mut children = Vec::new();
    for _ in 0..processes {
        match peer.start(mode, &args) {
            Ok(c) => children.push(c),
            Err(e) => return Err(peers::Figure::Failed(e.to_string())),
        }
    }
    let mut per_process = Vec::new();
    let mut failed = None;
    for c in children {
        match peer.finish(c, deadline) {
            Ok(v) => per_process.push(v),
            Err(f) => failed = failed.or(Some(f)),
        }
    }
    if let Some(f) = failed {
        return Err(f);
    }
    let calls = total_calls(server).saturating_sub(before + 1);
    Ok((per_process, calls))
}
