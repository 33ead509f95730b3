//! `--metrics-addr`: `run` and `bench` serve the lock metrics in Prometheus' text format while
//! they run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use distlock_testkit::free_port;

mod common;
use common::{distlock, signal, wait_exit, wait_until};
use nix::sys::signal::Signal;

/// `GET /metrics` on `port`: the body, or `None` while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

#[test]
fn run_serves_the_metrics_while_the_command_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = distlock(tmp.path())
        .args([
            "run",
            "--metrics-addr",
            &addr,
            "--url",
            &url,
            "nightly",
            "--",
            "sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The gauge rises when the lease begins, inside the acquisition; the acquisition's
    // histogram is recorded when the call returns. A scrape may fall between the two, so wait
    // for the acquisition to be counted before reading both.
    let acquired = r#"distlock_acquire_duration_seconds_count{engine="file",kind="exclusive",outcome="acquired"} 1"#;
    let mut text = String::new();
    wait_until("the acquisition counted", Duration::from_secs(15), || {
        text = scrape(port).unwrap_or_default();
        text.contains(acquired)
    });
    assert!(
        text.contains(r#"distlock_locks_held{engine="file",kind="exclusive"} 1"#),
        "{text}"
    );
    // No lock name in a label unless asked.
    assert!(!text.contains("nightly"), "{text}");
    signal(&child, Signal::SIGTERM);
    wait_exit(&mut child, Duration::from_secs(10));
    // A port taken: a clear error, exit 78.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().to_string();
    let o = distlock(tmp.path())
        .args([
            "run",
            "--metrics-addr",
            &taken,
            "--url",
            &url,
            "k",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot serve the metrics"));
}

#[test]
fn bench_serves_the_metrics_while_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = distlock(tmp.path())
        .args([
            "bench",
            "--metrics-addr",
            &addr,
            "--url",
            &url,
            "--tasks",
            "4",
        ])
        .args(["--duration", "20s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut text = String::new();
    wait_until(
        "the lockers' metrics served",
        Duration::from_secs(15),
        || {
            text = scrape(port).unwrap_or_default();
            text.contains(r#"distlock_acquire_duration_seconds_count{engine="file",kind="exclusive",outcome="acquired"}"#)
        },
    );
    assert!(text.contains("distlock_locks_held"), "{text}");
    signal(&child, Signal::SIGTERM);
    wait_exit(&mut child, Duration::from_secs(30));
}
