//! `distlock run` on PostgreSQL, MariaDB and memcached, with real processes.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_testkit::{MariaDb, Memcached, Postgres};
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

fn held(tmp: &Path, url: &str, key: &str) -> bool {
    common::status_json(tmp, url, key)["held"] == true
}

/// The holder is frozen past its TTL: the server ends its silent session (and the lock with
/// it), the next one runs with a higher fence, and the thawed holder stops its command and
/// exits 70.
fn a_silent_holder_loses_the_lock(url: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut holder = distlock(tmp.path())
        .args([
            "run", "--url", url, "--ttl", "1s", "silent", "--", "sleep", "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the holder's lock", Duration::from_secs(10), || {
        held(tmp.path(), url, "silent")
    });
    signal(&holder, Signal::SIGSTOP);
    let t0 = Instant::now();
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            url,
            "--wait",
            "10s",
            "silent",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCE",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "taken before the holder's TTL of silence: {:?}",
        t0.elapsed()
    );
    let fence: u64 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("a fence");
    assert!(fence >= 2, "the second holder's fence is {fence}");
    signal(&holder, Signal::SIGCONT);
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)).code(),
        Some(70)
    );
}

#[test]
fn postgres_a_silent_holder_loses_the_lock_and_exits_70() {
    let Some(pg) = Postgres::start() else { return };
    a_silent_holder_loses_the_lock(&pg.url(""));
}

#[test]
fn mariadb_a_silent_holder_loses_the_lock_and_exits_70() {
    let Some(db) = MariaDb::start() else { return };
    a_silent_holder_loses_the_lock(&db.url(""));
}

#[test]
fn memcached_runs_commands_without_a_fence() {
    let Some(mc) = Memcached::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            &mc.url(""),
            "cache-fill",
            "--",
            "sh",
            "-c",
            "echo ${DISTLOCK_FENCE-none}",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "none");
    assert!(!held(tmp.path(), &mc.url(""), "cache-fill"), "released");
}
