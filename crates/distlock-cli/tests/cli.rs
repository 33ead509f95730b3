//! `distlock run` and `distlock status`, as a user runs them: real processes, real engines.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::RedisServer;

mod common;
use common::distlock;

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run distlock")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn spawn_holder(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder")
}

/// Waits until `status KEY` says held.
fn wait_held(mut status: impl FnMut() -> Output) {
    let t0 = Instant::now();
    while !stdout(&status()).contains(": held") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the holder never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_on_the_default_file_engine_passes_key_and_fence() {
    let tmp = tempfile::tempdir().unwrap();
    let script = "echo \"$DISTLOCK_KEY $DISTLOCK_FENCE\"";
    let o = run(distlock(tmp.path()).args(["run", "jobs", "--", "sh", "-c", script]));
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "jobs 1");
    let o = run(distlock(tmp.path()).args(["run", "jobs", "--", "sh", "-c", script]));
    assert_eq!(stdout(&o), "jobs 2");
    assert!(tmp.path().join("distlock").join("jobs.lock").is_file());
}

#[test]
fn exit_status_is_the_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(distlock(tmp.path()).args(["run", "k", "--", "sh", "-c", "exit 3"]));
    assert_eq!(o.status.code(), Some(3));
    let o = run(distlock(tmp.path()).args(["run", "k", "--", "sh", "-c", "kill -TERM $$"]));
    assert_eq!(o.status.code(), Some(128 + 15));
    let o = run(distlock(tmp.path()).args(["run", "k", "--", "/no/such/command"]));
    assert_eq!(o.status.code(), Some(127));
    // The lock was released every time.
    let o = run(distlock(tmp.path()).args(["run", "--no-wait", "k", "--", "true"]));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

#[test]
fn bad_input_has_clear_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&[&str], i32); 5] = [
        (&["run", "--url", "bogus", "k", "--", "true"], 78),
        (
            &["run", "--url", "redis://127.0.0.1:1", "k", "--", "true"],
            69,
        ),
        (&["run", "--ttl", "0s", "k", "--", "true"], 78),
        (&["run", "", "--", "true"], 64),
        (&["run", "--ttl", "soon", "k", "--", "true"], 64),
    ];
    for (args, code) in cases {
        let o = run(distlock(tmp.path()).args(args));
        assert_eq!(o.status.code(), Some(code), "{args:?}: {o:?}");
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("panicked"),
            "{o:?}"
        );
    }
}

/// A refused connection, on every engine: exit 69 ("unreachable", never 75 "busy"), and one
/// readable line that names the cause, with no driver's debug dump in it.
/// With `--wait`, an engine that cannot be reached is tried again until the budget is spent;
/// then distlock exits 69, naming the last cause.
#[test]
fn a_wait_budget_retries_an_unreachable_engine_then_names_the_last_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let o = run(distlock(tmp.path()).args([
        "run",
        "--url",
        "redis://127.0.0.1:1",
        "--wait",
        "1s",
        "k",
        "--",
        "true",
    ]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("tried for 1s") && err.contains("the last one failed"),
        "{err}"
    );
    assert!(err.to_lowercase().contains("refused"), "{err}");
}

/// As a user sees it in a pipe, with the default log: a wait that tries an unreachable engine
/// again writes one plain line about it (no colour codes), then the final error once, which
/// names the cause's kind once and counts its attempts in English.
#[test]
fn retries_in_a_pipe_are_one_plain_line_then_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    for url in ["etcd://127.0.0.1:1", "redis://127.0.0.1:1"] {
        let o = run(distlock(tmp.path())
            .env_remove("DISTLOCK_LOG")
            .env_remove("NO_COLOR")
            .args(["run", "--url", url, "--wait", "1500ms", "k", "--", "true"]));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(69), "{url}: {err}");
        assert!(!err.contains('\x1b'), "{url}: escapes in a pipe: {err:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{url}: {err}");
        assert!(
            lines[0].starts_with("distlock: cannot open the lock engine (")
                && lines[0].contains("trying again within the wait"),
            "{url}: {err}"
        );
        assert!(
            lines[1].starts_with(
                "distlock: cannot open the lock engine: connection error: tried for 1.5s ("
            ) && lines[1].contains(" attempts); the last one failed: "),
            "{url}: {err}"
        );
        assert_eq!(lines[1].matches("connection error").count(), 1, "{err}");
    }
    // One attempt: no retry to announce, and "1 attempt".
    let o = run(distlock(tmp.path()).env_remove("DISTLOCK_LOG").args([
        "run",
        "--url",
        "redis://127.0.0.1:1",
        "--wait",
        "50ms",
        "k",
        "--",
        "true",
    ]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("(1 attempt); it failed: "), "{err}");
}

/// A server that accepts connections and never answers: `--wait` bounds the whole call,
/// connecting included (a connect timeout of 5 s or more must not stretch it), on every engine.
#[test]
fn the_wait_budget_bounds_connecting_to_a_silent_server() {
    let tmp = tempfile::tempdir().unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts and keeps every connection, answering nothing, until the test ends.
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for conn in silent.incoming() {
            kept.push(conn);
        }
    });
    let a = format!("127.0.0.1:{port}");
    let urls = [
        format!("redis://{a}"),
        format!("redis+sentinel://{a}/mymaster"),
        format!("redis+cluster://{a}"),
        format!("etcd://{a}"),
        format!("zk://{a}"),
        format!("postgres://app@{a}/app"),
        format!("mysql://app@{a}/app"),
        format!("memcached://{a}"),
    ];
    for url in &urls {
        let t0 = Instant::now();
        let o = run(
            distlock(tmp.path()).args(["run", "--url", url, "--wait", "1s", "k", "--", "true"])
        );
        let took = t0.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(69), "{url}: {err}");
        assert!(
            (Duration::from_secs(1)..Duration::from_millis(1800)).contains(&took),
            "{url}: took {took:?}: {err}"
        );
        assert!(err.contains("timed out"), "{url}: {err}");
    }
}

#[test]
fn every_unreachable_engine_exits_69_with_one_readable_line() {
    let tmp = tempfile::tempdir().unwrap();
    let urls = [
        "redis://127.0.0.1:1",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "redis+sentinel://127.0.0.1:1/mymaster",
        "redis+cluster://127.0.0.1:1",
        "etcd://127.0.0.1:1",
        "zk://127.0.0.1:1?connect_timeout=300ms&session_timeout=1s",
        "postgres://app@127.0.0.1:1/app",
        "mysql://app@127.0.0.1:1/app",
        "memcached://127.0.0.1:1",
    ];
    for url in urls {
        for sub in [
            &["run", "--url", url, "k", "--", "true"][..],
            &["status", "--url", url, "k"],
        ] {
            let o = run(distlock(tmp.path()).args(sub));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(69), "{sub:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{sub:?}: {err}");
            assert!(
                err.starts_with("distlock: cannot open the lock engine: "),
                "{err}"
            );
            for dump in ["ConnectError(", "Os {", "Status {", "code:", "Some("] {
                assert!(!err.contains(dump), "{url}: a debug dump: {err}");
            }
            if !url.starts_with("zk:") && !url.starts_with("redlock:") {
                assert!(
                    err.contains("refused"),
                    "{url}: the cause is missing: {err}"
                );
            }
        }
    }
}

#[test]
fn run_on_redis_and_exit_70_when_the_lock_is_lost() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let url = server.url();
    let o = run(distlock(tmp.path()).args([
        "run",
        "--url",
        &url,
        "r",
        "--",
        "sh",
        "-c",
        "echo $DISTLOCK_FENCE",
    ]));
    // Redis's fence: at least the server's clock in microseconds.
    let fence: u64 = stdout(&o).parse().unwrap_or_else(|_| panic!("{o:?}"));
    assert!(fence > 1_700_000_000_000_000, "{o:?}");

    // Someone breaks the lock while the command runs: the watchdog notices, the command is
    // stopped, distlock exits 70.
    let t0 = Instant::now();
    let mut holder = distlock(tmp.path())
        .args([
            "run", "--url", &url, "--ttl", "600ms", "lost", "--", "sleep", "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(|| run(distlock(tmp.path()).args(["status", "--url", &url, "lost"])));
    server.cli(&["SET", "distlock:{lost}", "intruder", "PX", "60000"]);
    let status = loop {
        if let Some(s) = holder.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "distlock did not notice the loss"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(70));
    assert_eq!(
        server.cli(&["GET", "distlock:{lost}"]),
        "intruder",
        "the intruder's lock survived"
    );
}

#[test]
fn a_killed_redis_holder_frees_the_lock_after_its_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let url = server.url();
    let mut holder = spawn_holder(distlock(tmp.path()).args([
        "run", "--url", &url, "--ttl", "1s", "crash", "--", "sleep", "30",
    ]));
    wait_held(|| run(distlock(tmp.path()).args(["status", "--url", &url, "crash"])));
    holder.kill().unwrap();
    holder.wait().unwrap();
    let t0 = Instant::now();
    let o = run(distlock(tmp.path()).args([
        "run",
        "--url",
        &url,
        "--wait",
        "5s",
        "crash",
        "--",
        "sh",
        "-c",
        "echo $DISTLOCK_FENCE",
    ]));
    let waited = t0.elapsed();
    // Later than the crashed holder's fence 1 (a busy first attempt may use up a number).
    let fence: u64 = stdout(&o).parse().unwrap_or_else(|_| panic!("{o:?}"));
    assert!(fence > 1, "{o:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "freed before the TTL: {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}
