//! `distlock lead` and `distlock leader` as real processes, on Redis, etcd, ZooKeeper,
//! PostgreSQL and the file engine: a paused leader has stopped its command before a follower's
//! starts, a killed one is replaced within its TTL and a wake-up, a SIGTERMed one within a few
//! round trips, and `leader` names each leader with its epoch and value.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock_testkit::{Etcd, Postgres, RedisServer, ZooKeeper};
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

const TTL: &str = "2s";
const GRACE: &str = "500ms";

/// A "host" running `distlock lead` on `url`: its command appends `<epoch> <unix µs>` to the
/// shared log every 20 ms while it runs (the writes of a leader to a protected resource).
fn leader(tmp: &Path, url: &str, value: &str, log: &Path) -> Child {
    let job = format!(
        "while true; do echo \"$DISTLOCK_FENCE $(date +%s%6N)\" >> {}; sleep 0.02; done",
        log.display()
    );
    distlock(tmp)
        .args(["lead", "--url", url, "--ttl", TTL, "--kill-grace", GRACE])
        .args(["--value", value, "jobs", "--", "sh", "-c", &job])
        .env("DISTLOCK_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.join(format!("{value}.log"))).unwrap())
        .spawn()
        .unwrap()
}

/// The folder of a test's hosts: their resource and their logs (`DISTLOCK_LOG=debug`), shown
/// when the test fails.
struct Hosts(tempfile::TempDir);

impl Hosts {
    fn new() -> Self {
        Hosts(tempfile::tempdir().unwrap())
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for host in ["host-a", "host-b"] {
            let log = std::fs::read_to_string(self.path().join(format!("{host}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- {host}, its last lines:\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}

/// The log's writes: (epoch, unix µs), in the order they landed.
fn writes(log: &Path) -> Vec<(u64, u128)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (e, t) = l.split_once(' ')?;
            Some((e.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}

/// What a fenced resource would refuse: a write whose epoch is below one it has seen already;
/// and any two epochs whose writes interleave in time (two commands running at once).
fn check_fenced(log: &Path) -> Vec<u64> {
    let w = writes(log);
    let mut highest = 0;
    for (i, &(e, _)) in w.iter().enumerate() {
        assert!(
            e >= highest,
            "write {i} at epoch {e} after epoch {highest}: a deposed leader's command still ran"
        );
        highest = e;
    }
    let mut epochs: Vec<u64> = w.iter().map(|(e, _)| *e).collect();
    epochs.dedup();
    epochs
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// `distlock leader --json` on `url`.
fn leader_json(tmp: &Path, url: &str) -> serde_json::Value {
    let o = distlock(tmp)
        .args(["leader", "--json", "--url", url, "jobs"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Waits until the log has a write of an epoch other than `not`, and returns that epoch and
/// the time of its first write.
fn next_epoch(log: &Path, not: Option<u64>, limit: Duration) -> (u64, u128) {
    let mut found = None;
    wait_until("a new leader's first write", limit, || {
        found = writes(log)
            .into_iter()
            .find(|(e, _)| not.is_none_or(|n| *e > n));
        found.is_some()
    });
    found.unwrap()
}

/// A leader paused (SIGSTOP of `distlock` itself, as a stalled VM would be) stops being leader
/// at its local deadline: its command has stopped (SIGTERM at the deadline less the grace
/// period, SIGKILL at it) before the follower's first write. Resumed, it finds its leadership
/// lost and campaigns again; a SIGTERM to the new leader hands over within a few round trips.
fn paused_then_sigtermed(url: &str, expiring: bool) {
    let tmp = Hosts::new();
    let log = tmp.path().join("resource");
    let mut a = leader(tmp.path(), url, "host-a", &log);
    let (first, _) = next_epoch(&log, None, Duration::from_secs(20));
    let mut b = leader(tmp.path(), url, "host-b", &log);
    std::thread::sleep(Duration::from_millis(500));
    let seen = leader_json(tmp.path(), url);
    assert_eq!(seen["epoch"], first, "{url}: {seen}");
    assert_eq!(seen["value"], "host-a", "{url}: {seen}");
    signal(&a, Signal::SIGSTOP);
    let paused = now_us();
    if expiring {
        let (second, took) = next_epoch(&log, Some(first), Duration::from_secs(10));
        // Time for a command still running to show itself.
        std::thread::sleep(Duration::from_millis(300));
        let last_a = writes(&log)
            .iter()
            .filter(|(e, _)| *e == first)
            .map(|(_, t)| *t)
            .max()
            .unwrap();
        assert!(
            last_a < took,
            "{url}: the paused leader's command wrote at {last_a} µs, after the follower's \
             first write at {took} µs"
        );
        // Within the TTL and a wake-up of the pause (the lease had up to a TTL left).
        assert!(
            took.saturating_sub(paused) < 4_000_000,
            "{url}: the follower took over {} ms after the pause",
            took.saturating_sub(paused) / 1000
        );
        signal(&a, Signal::SIGCONT);
        // The old leader resumed: it stopped, and campaigns again behind b.
        std::thread::sleep(Duration::from_millis(700));
        let sigtermed = now_us();
        signal(&b, Signal::SIGTERM);
        assert_eq!(wait_exit(&mut b, Duration::from_secs(10)).code(), Some(143));
        let (third, took) = next_epoch(&log, Some(second), Duration::from_secs(10));
        assert!(third > second);
        // A loaded machine can make b miss its renewals before the SIGTERM, and a lead then
        // legitimately (check_fenced below says so) before it: at once, as far as this is
        // concerned.
        assert!(
            took.saturating_sub(sigtermed) < 1_500_000,
            "{url}: after a SIGTERM the follower took over in {} ms",
            took.saturating_sub(sigtermed) / 1000
        );
        signal(&a, Signal::SIGTERM);
        assert_eq!(wait_exit(&mut a, Duration::from_secs(10)).code(), Some(143));
    } else {
        // A session engine frees the lease when the holder's session ends; a paused holder's
        // lasts. Its command stops at the deadline all the same, and nobody else leads.
        let stopped_by = Instant::now() + Duration::from_secs(3);
        std::thread::sleep(stopped_by - Instant::now());
        let before = writes(&log).len();
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            writes(&log).len(),
            before,
            "{url}: the paused leader's command runs on"
        );
        signal(&a, Signal::SIGCONT);
        let (second, _) = next_epoch(&log, Some(first), Duration::from_secs(10));
        assert!(second > first);
        for c in [&mut a, &mut b] {
            signal(c, Signal::SIGTERM);
            wait_exit(c, Duration::from_secs(10));
        }
    }
    check_fenced(&log);
}

/// A leader killed with SIGKILL (its command goes on, under its keeper) is replaced within its
/// TTL and a wake-up, and its command has stopped before.
fn killed(url: &str) {
    let tmp = Hosts::new();
    let log = tmp.path().join("resource");
    let mut a = leader(tmp.path(), url, "host-a", &log);
    let (first, _) = next_epoch(&log, None, Duration::from_secs(20));
    let mut b = leader(tmp.path(), url, "host-b", &log);
    std::thread::sleep(Duration::from_millis(500));
    signal(&a, Signal::SIGKILL);
    let t0 = now_us();
    let _ = a.wait();
    let (second, took) = next_epoch(&log, Some(first), Duration::from_secs(10));
    assert!(second > first);
    assert!(
        took.saturating_sub(t0) < 2_000_000 + 1_500_000,
        "{url}: the follower took over {} ms after the kill",
        took.saturating_sub(t0) / 1000
    );
    signal(&b, Signal::SIGTERM);
    wait_exit(&mut b, Duration::from_secs(10));
    check_fenced(&log);
}

#[test]
fn leaders_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    paused_then_sigtermed(&redis.url(), true);
    killed(&redis.url());
}

#[test]
fn leaders_on_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    paused_then_sigtermed(&etcd.url(""), true);
    killed(&etcd.url(""));
}

#[test]
fn leaders_on_zookeeper() {
    let Some(zk) = ZooKeeper::start() else { return };
    // A ZooKeeper session outlives a paused or killed client for its timeout: here the TTL.
    let url = zk.url("?session_timeout=2s");
    paused_then_sigtermed(&url, true);
    killed(&url);
}

#[test]
fn leaders_on_postgres() {
    let Some(pg) = Postgres::start() else { return };
    // The server ends a session that says nothing for the TTL: a paused leader's too.
    paused_then_sigtermed(&pg.url(""), true);
    killed(&pg.url(""));
}

#[test]
fn leaders_on_the_file_engine() {
    let tmp = tempfile::tempdir().unwrap();
    paused_then_sigtermed(&format!("file://{}/locks", tmp.path().display()), false);
}

/// `leader` says nobody leads, then names a leader and its value; `--watch` prints each
/// change, one JSON line each, and a command that ends ends the leadership.
#[test]
fn leader_watch_prints_each_change() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let none = leader_json(tmp.path(), &url);
    assert!(none["leader"].is_null(), "{none}");
    let mut watch = distlock(tmp.path())
        .args([
            "leader",
            "--json",
            "--watch",
            "--interval",
            "50ms",
            "--url",
            &url,
            "jobs",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for value in ["one", "two"] {
        let o = distlock(tmp.path())
            .args([
                "lead", "--url", &url, "--value", value, "jobs", "--", "sleep", "0.5",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    signal(&watch, Signal::SIGTERM);
    wait_exit(&mut watch, Duration::from_secs(5));
    let mut out = String::new();
    std::io::Read::read_to_string(watch.stdout.as_mut().unwrap(), &mut out).unwrap();
    let seen: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let values: Vec<String> = seen
        .iter()
        .map(|v| v["value"].as_str().unwrap_or("-").to_owned())
        .collect();
    assert_eq!(values, ["-", "one", "-", "two", "-"], "{out}");
    assert!(
        seen[1]["epoch"].as_u64() < seen[3]["epoch"].as_u64(),
        "{out}"
    );
}

/// A grace period that does not fit the lease is refused before anything is taken.
#[test]
fn a_grace_period_longer_than_the_lease_allows_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let o = distlock(tmp.path())
        .args([
            "lead",
            "--url",
            &url,
            "--ttl",
            "3s",
            "--kill-grace",
            "2s",
            "jobs",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--kill-grace"));
    assert!(leader_json(tmp.path(), &url)["leader"].is_null());
}
