//! `distlock run` on etcd, with real processes paused past their leases (SIGSTOP).

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_testkit::Etcd;
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

fn keys(etcd: &Etcd, key: &str) -> Vec<String> {
    let prefix = format!("distlock/{key}/");
    etcd.ctl(&["get", &prefix, "--prefix", "--keys-only"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn queued(etcd: &Etcd, key: &str) -> usize {
    keys(etcd, key).len()
}

#[test]
fn a_holder_paused_past_its_lease_loses_the_lock_and_exits_70() {
    let Some(etcd) = Etcd::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = etcd.url("");
    let mut holder = distlock(tmp.path())
        .args([
            "run", "--url", &url, "--ttl", "1s", "paused", "--", "sleep", "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the holder's key", Duration::from_secs(10), || {
        queued(&etcd, "paused") == 1
    });
    signal(&holder, Signal::SIGSTOP);
    // The next one gets the lock once the paused holder's lease has expired.
    let t0 = Instant::now();
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            &url,
            "--wait",
            "10s",
            "paused",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCE",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "taken before the lease ran out: {:?}",
        t0.elapsed()
    );
    // Thawed, the old holder finds its lease gone, stops its command and exits 70.
    signal(&holder, Signal::SIGCONT);
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(70));
}

#[test]
fn a_waiter_whose_lease_expired_in_the_queue_never_reports_the_lock_taken() {
    let Some(etcd) = Etcd::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = etcd.url("");
    let mut holder = distlock(tmp.path())
        .args([
            "run", "--url", &url, "--ttl", "10s", "queue", "--", "sleep", "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the holder's key", Duration::from_secs(10), || {
        queued(&etcd, "queue") == 1
    });
    let mut waiter = distlock(tmp.path())
        .args([
            "run", "--url", &url, "--ttl", "1s", "--wait", "30s", "queue", "--", "echo", "ACQUIRED",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Queued for good: its waiting attempt's key, seen twice 300 ms apart (a first attempt's
    // key, which it deletes at once on finding the lock busy, does not count).
    wait_until("the waiter's key", Duration::from_secs(10), || {
        let before = keys(&etcd, "queue");
        std::thread::sleep(Duration::from_millis(300));
        before.len() == 2 && keys(&etcd, "queue") == before
    });
    // Frozen in the queue past its lease: etcd deletes its key.
    signal(&waiter, Signal::SIGSTOP);
    wait_until(
        "the waiter's key to expire",
        Duration::from_secs(10),
        || queued(&etcd, "queue") == 1,
    );
    // The holder leaves; the thawed waiter must find its place gone, not take the lock.
    signal(&holder, Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    signal(&waiter, Signal::SIGCONT);
    let status = wait_exit(&mut waiter, Duration::from_secs(10));
    let out = waiter.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ACQUIRED"),
        "the command ran on a lock whose queue place had expired"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("place in the queue"), "{err}");
    assert_eq!(status.code(), Some(70), "reported as a lost lock: {err}");
    assert_eq!(queued(&etcd, "queue"), 0);
}
