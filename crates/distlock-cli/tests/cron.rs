//! Scheduled jobs: `--hold-at-least` (one run per period across hosts) and `--hold-at-most` (a
//! hung job cannot keep the lock), as real processes on the file engine and on Redis.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::{Etcd, MariaDb, Memcached, Postgres, RedisServer, ZooKeeper};

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

/// When each "host" fired (its delay from the first), within 1.2 s of each other.
const LATE_MS: [u64; 5] = [0, 900, 300, 1200, 600];

/// What five hosts' runs of one job did, each `distlock run --no-wait --hold-at-least D`.
struct Fired {
    /// The fences of the job's runs.
    runs: Vec<String>,
    /// For the host that ran it: the time from the job's end to distlock's exit.
    exit_after_job: Option<Duration>,
    /// The longest time any host that did not run it took to exit.
    longest_refusal: Duration,
    /// When the first host fired.
    t0: Instant,
}

/// Five hosts fire `job` at [`LATE_MS`], with `--hold-at-least hold`; waits for each to exit.
fn fire_five(tmp: &Path, url: &str, hold: &str) -> Fired {
    let ran = tmp.join(format!("ran-{}", url.len()));
    let _ = std::fs::remove_file(&ran);
    let job = format!(
        "echo \"$PPID $(date +%s%N) $DISTLOCK_FENCE\" >> {}",
        ran.display()
    );
    let t0 = Instant::now();
    // Each host on a thread of its own: it fires at its time, and its exit is seen at once
    // (on the wall clock, on which the job writes its end, and since it fired).
    let hosts: Vec<_> = LATE_MS
        .iter()
        .map(|&late| {
            let (tmp, url, job, hold) =
                (tmp.to_owned(), url.to_owned(), job.clone(), hold.to_owned());
            std::thread::spawn(move || {
                let at = t0 + Duration::from_millis(late);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                let mut child = distlock(&tmp)
                    .args([
                        "run",
                        "--url",
                        &url,
                        "--no-wait",
                        "--conflict-exit-code",
                        "0",
                    ])
                    .args(["--hold-at-least", &hold, "nightly", "--", "sh", "-c", &job])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let fired = Instant::now();
                let st = wait_exit(&mut child, Duration::from_secs(30));
                assert!(st.success(), "{url}: {st:?}");
                (child.id(), std::time::SystemTime::now(), fired.elapsed())
            })
        })
        .collect();
    let exits: Vec<(u32, std::time::SystemTime, Duration)> =
        hosts.into_iter().map(|h| h.join().unwrap()).collect();
    let text = std::fs::read_to_string(&ran).unwrap_or_default();
    let runs: Vec<String> = text.lines().map(str::to_owned).collect();
    // The job's line: its parent (the host's distlock), when it ended, and its fence (none on
    // memcached).
    let job: Option<(u32, u128)> = runs.first().and_then(|l| {
        let mut w = l.split_whitespace();
        Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
    });
    let mut exit_after_job = None;
    let mut longest_refusal = Duration::ZERO;
    for (pid, wall, since_fired) in exits {
        match job {
            Some((ran_by, end)) if ran_by == pid => {
                let wall_ns = wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                exit_after_job = Some(Duration::from_nanos(
                    u64::try_from(wall_ns.saturating_sub(end)).unwrap_or(u64::MAX),
                ));
            }
            _ => longest_refusal = longest_refusal.max(since_fired),
        }
    }
    Fired {
        runs,
        exit_after_job,
        longest_refusal,
        t0,
    }
}

/// `--hold-at-least` as ShedLock's `lockAtLeastFor`, on the engines whose leases outlive their
/// holder: the job runs once; every host exits within a second of its command (none stays for
/// the period); a run 2 s after the first, within the period, is still refused; and after the
/// period the lock is free.
fn the_period_outlives_the_process(tmp: &Path, url: &str) {
    let fired = fire_five(tmp, url, "5s");
    assert_eq!(fired.runs.len(), 1, "{url}: {:?}", fired.runs);
    let after = fired
        .exit_after_job
        .unwrap_or_else(|| panic!("{url}: no runner among the hosts: {:?}", fired.runs));
    assert!(
        after < Duration::from_secs(1),
        "{url}: exited {after:?} after its job"
    );
    assert!(
        fired.longest_refusal < Duration::from_secs(1),
        "{url}: a refused host took {:?}",
        fired.longest_refusal
    );
    // 2 s after the first fired, within the period: refused (75), at once.
    std::thread::sleep(
        (fired.t0 + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
    );
    let o = distlock(tmp)
        .args(["run", "--url", url, "--no-wait", "nightly", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{url}: {o:?}");
    // The status names the holder that left it, with the time left.
    let st = common::status_json(tmp, url, "nightly");
    assert_eq!(st["held"], true, "{url}: {st}");
    // After the period (and the engine's rounding: memcached's and etcd's whole seconds), free.
    std::thread::sleep(
        (fired.t0 + Duration::from_secs(8)).saturating_duration_since(Instant::now()),
    );
    let o = distlock(tmp)
        .args(["run", "--url", url, "--no-wait", "nightly", "--", "true"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{url}: still held after the period: {o:?}"
    );
}

#[test]
fn a_cron_lock_outlives_its_process_on_the_file_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    the_period_outlives_the_process(tmp.path(), &url);
}

#[test]
fn a_cron_lock_outlives_its_process_on_redis() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(r) = RedisServer::start() {
        the_period_outlives_the_process(tmp.path(), &r.url());
    }
}

#[test]
fn a_cron_lock_outlives_its_process_on_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(e) = Etcd::start() {
        the_period_outlives_the_process(tmp.path(), &e.url(""));
    }
}

#[test]
fn a_cron_lock_outlives_its_process_on_memcached() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(m) = Memcached::start() {
        the_period_outlives_the_process(tmp.path(), &m.url(""));
    }
}

/// Where a lease ends with its holder's session (ZooKeeper, PostgreSQL, MariaDB), the host
/// that ran the job keeps the lock, and its process, until the period ends; the job still
/// runs once.
fn the_runner_stays_for_the_period(tmp: &Path, url: &str) {
    let fired = fire_five(tmp, url, "3s");
    assert_eq!(fired.runs.len(), 1, "{url}: {:?}", fired.runs);
    let stayed = fired.exit_after_job.expect("the runner's exit");
    assert!(
        stayed > Duration::from_millis(1500),
        "{url}: exited {stayed:?} after its job"
    );
}

#[test]
fn a_cron_lock_on_zookeeper_keeps_its_process() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(z) = ZooKeeper::start() {
        the_runner_stays_for_the_period(tmp.path(), &z.url(""));
    }
}

#[test]
fn a_cron_lock_on_postgres_keeps_its_process() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(p) = Postgres::start() {
        the_runner_stays_for_the_period(tmp.path(), &p.url(""));
    }
}

#[test]
fn a_cron_lock_on_mariadb_keeps_its_process() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(d) = MariaDb::start() {
        the_runner_stays_for_the_period(tmp.path(), &d.url(""));
    }
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
/// once it has passed: on the file engine, distlock exits with its command (the deadline is in
/// the lock file), and the lock stays until then; on ZooKeeper (a session engine), distlock
/// stays until then.
#[test]
fn the_hold_counts_from_the_acquire() {
    let tmp = tempfile::tempdir().unwrap();
    let file = format!("file://{}/locks", tmp.path().display());
    let zk = ZooKeeper::start();
    let mut urls = vec![(file, false)];
    if let Some(z) = &zk {
        urls.push((z.url(""), true));
    }
    for (url, stays) in urls {
        let t0 = Instant::now();
        let o = distlock(tmp.path())
            .args(["run", "--url", &url, "--hold-at-least", "2s", "job"])
            .args(["--", "sh", "-c", "sleep 0.5; exit 3"])
            .output()
            .unwrap();
        let took = t0.elapsed();
        // The command's status is distlock's.
        assert_eq!(o.status.code(), Some(3), "{url}: {o:?}");
        let expected = if stays {
            Duration::from_millis(2000)..Duration::from_millis(3500)
        } else {
            Duration::from_millis(500)..Duration::from_millis(1400)
        };
        assert!(expected.contains(&took), "{url}: {took:?}");
        if !stays {
            let busy = distlock(tmp.path())
                .args(["run", "--url", &url, "--no-wait", "job", "--", "true"])
                .status()
                .unwrap();
            assert_eq!(busy.code(), Some(75), "{url}: free before the hold ran out");
            std::thread::sleep(
                (t0 + Duration::from_millis(2300)).saturating_duration_since(Instant::now()),
            );
        }
        let free = distlock(tmp.path())
            .args(["run", "--url", &url, "--no-wait", "job", "--", "true"])
            .status()
            .unwrap();
        assert!(free.success(), "{url}");
    }
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
