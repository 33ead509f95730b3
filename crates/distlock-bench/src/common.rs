//! What the scenarios share: the contention modes, clocks and CPU pinning, medians, one
//! uncontended cycle, a round trip, and how figures are shown.

use std::time::{Duration, Instant};

use clap::ValueEnum;
use distlock_core::{LockClient, Released};
use distlock_testkit::RedisServer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// distlock's defaults: release events and the local queue.
    Events,
    /// No events, no local queue: every task polls with jittered back-off.
    Polling,
    /// Defaults plus local hand-off.
    Handoff,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Events => "events",
            Mode::Polling => "polling",
            Mode::Handoff => "handoff",
        }
    }
}

pub(crate) fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

pub(crate) fn pin_self(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu index");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("pin to a CPU");
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

pub(crate) const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// Uncontended `try_acquire` + `release` cycles per second of `key`, on any engine.
pub(crate) async fn distlock_cycles(client: &LockClient, key: &str, cycles: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..cycles {
        let g = client
            .try_acquire(key)
            .await
            .expect("acquire")
            .expect("uncontended");
        assert_eq!(g.release().await.expect("release"), Released::Held);
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

pub(crate) async fn rtt_us(
    conn: &mut redis::aio::MultiplexedConnection,
    n: usize,
    pause: Option<Duration>,
) -> f64 {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
        let t0 = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await.expect("PING");
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    median(v)
}

/// A duration as `1.5 s` or `300 ms`.
pub(crate) fn show(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// A figure with `decimals`, or `-` when it rests on no sample.
pub(crate) fn shown(samples: u64, value: f64, decimals: usize) -> String {
    if samples == 0 {
        "-".to_owned()
    } else {
        format!("{value:.decimals$}")
    }
}

pub(crate) fn redis_version(server: &RedisServer) -> String {
    server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

/// Starts `processes` copies of this harness as the worker `sub` against `server`, each with
/// `tasks` tasks from `start_ns` for `millis` ms on `threads` runtime threads, plus `extra`
/// arguments; their stdout is piped (see [`first_line`]).
pub(crate) fn spawn_workers(
    server: &RedisServer,
    sub: &str,
    processes: usize,
    (tasks, start_ns, millis, threads): (usize, u64, u64, usize),
    extra: &[&str],
) -> Vec<tokio::process::Child> {
    let exe = std::env::current_exe().expect("own path");
    (0..processes)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args([
                    sub,
                    "--url",
                    &server.url(),
                    "--tasks",
                    &tasks.to_string(),
                    "--start-ns",
                    &start_ns.to_string(),
                    "--millis",
                    &millis.to_string(),
                    "--threads",
                    &threads.to_string(),
                ])
                .args(extra)
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn a worker")
        })
        .collect()
}

/// The one line a worker prints (its figures), once it has ended.
pub(crate) async fn first_line(mut child: tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = lines
        .next_line()
        .await
        .expect("read a worker")
        .expect("a worker printed nothing");
    let _ = child.wait().await;
    line
}
