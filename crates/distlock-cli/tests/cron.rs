//! Scheduled jobs: `--hold-at-least` (one run per period across hosts) and `--hold-at-most` (a
//! hung job cannot keep the lock), as real processes on the file engine and on Redis.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::RedisServer;

mod common;
use common::{distlock, wait_exit};

/// Five "hosts" whose cron fires the job within 0.8 s of each other (their clocks apart),
/// each `distlock run --no-wait --conflict-exit-code 0 [FLAGS…] nightly -- <append a line>`:
/// how many times the job ran.
fn five_hosts(url: &str, flags: &[&str]) -> usize {
    let tmp = tempfile::tempdir().unwrap();
    let ran = tmp.path().join("ran");
    let job = format!("echo $DISTLOCK_FENCE >> {}", ran.display());
    let mut hosts: Vec<Child> = Vec::new();
    for _ in 0..5 {
        hosts.push(
            distlock(tmp.path())
                .args([
                    "run",
                    "--url",
                    url,
                    "--no-wait",
                    "--conflict-exit-code",
                    "0",
                ])
                .args(flags)
                .args(["nightly", "--", "sh", "-c", &job])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for h in &mut hosts {
        assert!(wait_exit(h, Duration::from_secs(20)).success(), "{url}");
    }
    std::fs::read_to_string(&ran)
        .unwrap_or_default()
        .lines()
        .count()
}

fn one_run_per_period(url: &str) {
    // Without it, a quick job is done before the next host's cron fires: each host runs it.
    assert_eq!(five_hosts(url, &[]), 5, "{url}: the control");
    // With it, the first host keeps the lock for the period: the others skip.
    assert_eq!(five_hosts(url, &["--hold-at-least", "3s"]), 1, "{url}");
}

#[test]
fn five_cron_runs_in_one_period_run_the_job_once() {
    let tmp = tempfile::tempdir().unwrap();
    one_run_per_period(&format!("file://{}/locks", tmp.path().display()));
    if let Some(redis) = RedisServer::start() {
        one_run_per_period(&redis.url());
    }
}

/// `--hold-at-least` counts from the acquire, not from the command's end, and the lock is free
/// once it has passed.
#[test]
fn the_hold_counts_from_the_acquire() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let t0 = Instant::now();
    let o = distlock(tmp.path())
        .args(["run", "--url", &url, "--hold-at-least", "1500ms", "job"])
        .args(["--", "sh", "-c", "sleep 0.5; exit 3"])
        .output()
        .unwrap();
    let took = t0.elapsed();
    // The command's status is distlock's.
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(
        (Duration::from_millis(1500)..Duration::from_millis(2500)).contains(&took),
        "{took:?}"
    );
    let free = distlock(tmp.path())
        .args(["run", "--url", &url, "--no-wait", "job", "--", "true"])
        .status()
        .unwrap();
    assert!(free.success());
}

/// A job that hangs past `--hold-at-most` loses the lock there and is stopped (`--on-lost
/// term`), with the lost status; and the two bounds must agree.
#[test]
fn a_hung_job_is_stopped_at_its_hold_at_most() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    hung_job(tmp.path(), &url);
    if let Some(redis) = RedisServer::start() {
        hung_job(tmp.path(), &redis.url());
    }
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            &url,
            "--hold-at-least",
            "10s",
            "--hold-at-most",
            "5s",
        ])
        .args(["job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("longer than --hold-at-most"),
        "{o:?}"
    );
}

fn hung_job(tmp: &Path, url: &str) {
    let t0 = Instant::now();
    let o = distlock(tmp)
        .args(["run", "--url", url, "--ttl", "1s", "--hold-at-most", "2s"])
        .args(["--kill-grace", "1s", "hung", "--", "sleep", "30"])
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(o.status.code(), Some(70), "{url}: {o:?}");
    // The lease ends at 2 s (the last renewal shortened to it); the local deadline comes a
    // little before.
    assert!(
        (Duration::from_millis(1500)..Duration::from_secs(5)).contains(&took),
        "{url}: {took:?}"
    );
}
