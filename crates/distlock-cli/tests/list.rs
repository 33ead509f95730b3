//! `distlock list`: every lock held on an engine, from real processes holding them, as a table,
//! as JSON, and redrawn in place (`--watch`) in a real terminal under tmux.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use distlock_testkit::{Etcd, MariaDb, Postgres, RedisServer, ZooKeeper, require_binary};

mod common;
use common::{distlock, signal, wait_exit, wait_until};
use nix::sys::signal::Signal;

/// `distlock run --url URL [FLAGS…] KEY -- sleep SECS` in the background.
fn hold(tmp: &Path, url: &str, flags: &[&str], key: &str, secs: u32) -> Child {
    distlock(tmp)
        .args(["run", "--url", url])
        .args(flags)
        .args([key, "--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn distlock")
}

/// `distlock list --json --url URL PREFIX`.
fn list_json(tmp: &Path, url: &str, prefix: &str) -> serde_json::Value {
    let o = distlock(tmp)
        .args(["list", "--json", "--url", url, prefix])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// The names listed, in order.
fn names(v: &serde_json::Value) -> Vec<String> {
    v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A writer, two readers, a permit and a queued waiter under `jobs-`, held by processes; the
/// listing shows each with its kind and holders, and the table names them; nothing after.
fn mixed_kinds(url: &str) {
    listed_kinds(url, true);
}

/// As [`mixed_kinds`], with readers or without (an engine without shared locks).
fn listed_kinds(url: &str, readers: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let mut held = vec![
        hold(tmp.path(), url, &[], "jobs-deploy", 30),
        hold(tmp.path(), url, &["--permits", "2"], "jobs-pool", 30),
        hold(tmp.path(), url, &[], "other", 30),
    ];
    let mut expected = vec!["jobs-deploy", "jobs-pool"];
    if readers {
        held.push(hold(tmp.path(), url, &["--shared"], "jobs-report", 30));
        held.push(hold(tmp.path(), url, &["--shared"], "jobs-report", 30));
        expected.push("jobs-report");
    }
    wait_until("every lock held", Duration::from_secs(20), || {
        names(&list_json(tmp.path(), url, "jobs-")) == expected
    });
    // A waiter for the writer's lock.
    held.push(hold(tmp.path(), url, &["--wait", "60s"], "jobs-deploy", 1));
    std::thread::sleep(Duration::from_millis(500));
    let v = list_json(tmp.path(), url, "jobs-");
    assert_eq!(names(&v), expected, "{v}");
    let lock = |n: usize| &v["locks"][n];
    assert_eq!(lock(0)["holders"][0]["kind"], "exclusive", "{v}");
    // Since when, wherever the engine keeps the holder's label with its time (not PostgreSQL,
    // whose session label has no room for it).
    if !url.starts_with("postgres") {
        assert!(lock(0)["holders"][0]["since"].is_string(), "{v}");
    }
    if !lock(0)["waiters"].is_null() {
        assert_eq!(lock(0)["waiters"], 1, "{v}");
    }
    assert_eq!(lock(1)["holders"][0]["kind"], "permit", "{v}");
    assert_eq!(lock(1)["holders"][0]["permits"], 2, "{v}");
    if readers {
        assert_eq!(lock(2)["holders"][0]["kind"], "shared", "{v}");
        if !url.starts_with("file:") {
            assert_eq!(lock(2)["holders"].as_array().unwrap().len(), 2, "{v}");
        }
    }
    let table = distlock(tmp.path())
        .args(["list", "--url", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(text.starts_with("NAME "), "{text}");
    for name in expected.iter().chain(&["other"]) {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    let count = format!("{} locks held or waited for", expected.len() + 1);
    assert!(text.contains(&count), "{text}");
    // SIGTERM: each run stops its command and releases.
    for mut c in held {
        if c.try_wait().unwrap().is_none() {
            signal(&c, Signal::SIGTERM);
        }
        wait_exit(&mut c, Duration::from_secs(10));
    }
    wait_until("nothing listed", Duration::from_secs(10), || {
        names(&list_json(tmp.path(), url, "")).is_empty()
    });
}

#[test]
fn list_on_the_file_engine() {
    let tmp = tempfile::tempdir().unwrap();
    mixed_kinds(&format!("file://{}/locks", tmp.path().display()));
}

#[test]
fn list_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    mixed_kinds(&redis.url());
}

#[test]
fn list_on_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    mixed_kinds(&etcd.url(""));
}

#[test]
fn list_on_zookeeper() {
    let Some(zk) = ZooKeeper::start() else { return };
    mixed_kinds(&zk.url(""));
}

#[test]
fn list_on_postgres() {
    let Some(pg) = Postgres::start() else { return };
    mixed_kinds(&pg.url(""));
}

#[test]
fn list_on_mariadb() {
    let Some(db) = MariaDb::start() else { return };
    listed_kinds(&db.url(""), false);
}

#[test]
fn an_engine_that_cannot_list_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let o = distlock(tmp.path())
        .args(["list", "--url", "memcached://127.0.0.1:1"])
        .output()
        .unwrap();
    // The engine is unreachable or cannot list: either way a clear error, no panic.
    assert!(!o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    let zero = distlock(tmp.path())
        .args(["list", "--limit", "0"])
        .output()
        .unwrap();
    assert_eq!(zero.status.code(), Some(64));
}

/// tmux, with a session of its own on a socket in `dir`.
fn tmux(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("tmux")
        .arg("-S")
        .arg(dir.join("tmux.sock"))
        .args(args)
        .output()
        .expect("tmux");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn watch_redraws_as_locks_come_and_go() {
    if !require_binary("tmux", "list --watch in a terminal") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}/locks", tmp.path().display());
    let bin = env!("CARGO_BIN_EXE_distlock");
    let cmd = format!("{bin} list --watch --interval 200ms --url {url}");
    tmux(
        tmp.path(),
        &[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "30",
            "-s",
            "w",
            &cmd,
        ],
    );
    let screen = || tmux(tmp.path(), &["capture-pane", "-p", "-t", "w"]);
    wait_until("the first table", Duration::from_secs(10), || {
        screen().contains("0 locks held")
    });
    let mut holder = hold(tmp.path(), &url, &[], "nightly", 30);
    wait_until(
        "the lock shown, marked new",
        Duration::from_secs(10),
        || {
            let s = screen();
            s.lines()
                .any(|l| l.starts_with("+  nightly") && l.contains("exclusive"))
        },
    );
    wait_until(
        "the mark gone at the next read",
        Duration::from_secs(10),
        || {
            let s = screen();
            s.lines().any(|l| l.starts_with("   nightly")) && s.contains("1 lock held")
        },
    );
    signal(&holder, Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    wait_until("the lock gone", Duration::from_secs(10), || {
        let s = screen();
        s.contains("- nightly (no longer held)") && s.contains("0 locks held")
    });
    // The screen is redrawn in place: one header, not one per read.
    assert_eq!(screen().matches("NAME").count(), 1, "{}", screen());
    tmux(tmp.path(), &["send-keys", "-t", "w", "C-c", ""]);
    wait_until(
        "distlock list ends on Ctrl-C",
        Duration::from_secs(10),
        || {
            !tmux(
                tmp.path(),
                &["list-panes", "-a", "-F", "#{pane_current_command}"],
            )
            .contains("distlock")
        },
    );
    tmux(tmp.path(), &["kill-server"]);
}
