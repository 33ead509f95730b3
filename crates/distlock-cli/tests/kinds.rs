//! `distlock run --shared` and `--permits N`: readers, writers and permits as real processes,
//! on the file engine, Redis, etcd, ZooKeeper and PostgreSQL.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::{Etcd, MariaDb, Postgres, RedisServer, ZooKeeper};
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

/// `distlock run [FLAGS…] KEY -- sh -c SCRIPT` in the background.
fn spawn(tmp: &Path, flags: &[&str], key: &str, script: &str) -> Child {
    distlock(tmp)
        .arg("run")
        .args(flags)
        .args([key, "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn distlock")
}

/// As [`spawn`], its log (`DISTLOCK_LOG=debug`) written to `log`.
fn spawn_logged(tmp: &Path, flags: &[&str], key: &str, script: &str, log: &Path) -> Child {
    distlock(tmp)
        .arg("run")
        .args(flags)
        .args([key, "--", "sh", "-c", script])
        .env("DISTLOCK_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the log"))
        .spawn()
        .expect("spawn distlock")
}

/// `distlock run --permits 1 --url URL WAIT sem -- true`: its exit status (`WAIT` is
/// `--no-wait` or `--wait D`, split in words).
fn one_permit(tmp: &Path, url: &str, wait: &str) -> std::process::Output {
    distlock(tmp)
        .args(["run", "--url", url, "--permits", "1"])
        .args(wait.split(' '))
        .args(["sem", "--", "true"])
        .output()
        .unwrap()
}

/// Whether the one permit of `sem` is held (a `--no-wait` run finds it busy: exit 75).
fn permit_busy(tmp: &Path, url: &str) -> bool {
    one_permit(tmp, url, "--no-wait").status.code() == Some(75)
}

#[test]
fn readers_run_together_and_a_writer_runs_alone_on_the_file_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().display().to_string();
    // Each reader marks itself in and waits (bounded) until it sees the other in.
    let reader = |me: &str, other: &str| {
        format!(
            "touch {dir}/{me}; for i in $(seq 200); do [ -e {dir}/{other} ] && exit 0; sleep 0.05; done; exit 9"
        )
    };
    let mut a = spawn(tmp.path(), &["--shared"], "catalog", &reader("a", "b"));
    let mut b = spawn(tmp.path(), &["--shared"], "catalog", &reader("b", "a"));
    wait_until("both readers in", Duration::from_secs(10), || {
        tmp.path().join("a").exists() && tmp.path().join("b").exists()
    });
    assert_eq!(wait_exit(&mut a, Duration::from_secs(15)).code(), Some(0));
    assert_eq!(wait_exit(&mut b, Duration::from_secs(15)).code(), Some(0));

    // A writer is refused while a reader runs, and runs once it has ended.
    let mut r = spawn(tmp.path(), &["--shared"], "catalog", "sleep 30");
    wait_until("the reader's share", Duration::from_secs(10), || {
        distlock(tmp.path())
            .args(["run", "--no-wait", "catalog", "--", "true"])
            .output()
            .unwrap()
            .status
            .code()
            == Some(75)
    });
    signal(&r, Signal::SIGTERM);
    wait_exit(&mut r, Duration::from_secs(10));
    let o = distlock(tmp.path())
        .args([
            "run",
            "--no-wait",
            "catalog",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_KIND $DISTLOCK_FENCE",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // (The probes above may have written before the reader came in: a fence of 1 or more.)
    let out = String::from_utf8_lossy(&o.stdout);
    let fence = out.trim().strip_prefix("exclusive ").map(str::parse::<u64>);
    assert!(matches!(fence, Some(Ok(f)) if f >= 1), "{out}");
}

#[test]
fn bad_kind_options_have_clear_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in [
        &["run", "--permits", "0", "k", "--", "true"][..],
        &["run", "--permits", "x", "k", "--", "true"],
        &["run", "--shared", "--permits", "2", "k", "--", "true"],
    ] {
        let o = distlock(tmp.path()).args(bad).output().unwrap();
        assert_eq!(o.status.code(), Some(64), "{bad:?}: {o:?}");
    }
    // Another number of permits while the semaphore is held: a configuration conflict.
    let mut holder = spawn(tmp.path(), &["--permits", "2"], "sem", "sleep 30");
    wait_until("the permit", Duration::from_secs(10), || {
        tmp.path().join("distlock").join("sem.sem").exists()
    });
    std::thread::sleep(Duration::from_millis(200));
    let o = distlock(tmp.path())
        .args(["run", "--permits", "3", "--no-wait", "sem", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("semaphore of 2 permits"),
        "{o:?}"
    );
    signal(&holder, Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
}

/// 100 commands in 4 processes (25 each, one after another) under 3 permits: never more than
/// 3 at once, counted on a resource guarded by a local `flock`, and every permit with its own
/// fence.
fn permits_are_never_exceeded(url: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().display().to_string();
    std::fs::write(tmp.path().join("in"), "0\n").unwrap();
    let body = format!(
        "flock {r}/res sh -c 'n=$(cat {r}/in); n=$((n+1)); echo $n > {r}/in; echo $n >> {r}/peaks; echo $DISTLOCK_FENCE >> {r}/fences'; \
         sleep 0.02; \
         flock {r}/res sh -c 'n=$(cat {r}/in); echo $((n-1)) > {r}/in'"
    );
    std::fs::write(tmp.path().join("body.sh"), body).unwrap();
    let bin = common::BIN;
    let worker = format!(
        "for i in $(seq 25); do DISTLOCK_LOG=off {bin} run --url '{url}' --permits 3 --ttl 10s --wait 120s sem -- sh {r}/body.sh || exit 1; done"
    );
    let t0 = Instant::now();
    let mut workers: Vec<Child> = (0..4)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", &worker])
                .env("TMPDIR", tmp.path())
                .env_remove("DISTLOCK_URL")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for w in &mut workers {
        assert!(wait_exit(w, Duration::from_secs(300)).success(), "{url}");
    }
    let peaks: Vec<u32> = std::fs::read_to_string(tmp.path().join("peaks"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let fences: Vec<String> = std::fs::read_to_string(tmp.path().join("fences"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(peaks.len(), 100, "{url}");
    let most = peaks.iter().copied().max().unwrap();
    assert!(most <= 3, "{url}: {most} commands at once under 3 permits");
    let unique: BTreeSet<&String> = fences.iter().collect();
    assert_eq!(unique.len(), 100, "{url}: permits shared a fence");
    assert!(
        fences.iter().all(|f| f.parse::<u64>().is_ok()),
        "{url}: {fences:?}"
    );
    eprintln!(
        "{url}: 100 commands under 3 permits in {:?}, at most {most} at once",
        t0.elapsed()
    );
}

#[test]
fn a_hundred_commands_in_four_processes_never_exceed_three_permits() {
    let tmp = tempfile::tempdir().unwrap();
    permits_are_never_exceeded(&format!("file://{}/locks", tmp.path().display()));
    if let Some(redis) = RedisServer::start() {
        permits_are_never_exceeded(&redis.url());
    }
    if let Some(etcd) = Etcd::start() {
        permits_are_never_exceeded(&etcd.url(""));
    }
    if let Some(zk) = ZooKeeper::start() {
        permits_are_never_exceeded(&zk.url(""));
    }
    if let Some(pg) = Postgres::start() {
        permits_are_never_exceeded(&pg.url(""));
    }
    if let Some(db) = MariaDb::start() {
        permits_are_never_exceeded(&db.url(""));
        permits_are_never_exceeded(&db.url("?fence=counter"));
    }
}

/// A permit holder killed with SIGKILL (no release, no clean-up) keeps its permit until its
/// TTL runs out on the server's clock, then the next command gets it; the holder's command,
/// left behind, does not matter to the lock.
#[test]
fn a_killed_redis_permit_holder_frees_its_permit_after_its_ttl() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let url = redis.url();
    let flags = ["--url", url.as_str(), "--permits", "1", "--ttl", "2s"];
    let mut holder = spawn(tmp.path(), &flags, "sem", "sleep 60");
    wait_until("the permit", Duration::from_secs(10), || {
        permit_busy(tmp.path(), &url)
    });
    signal(&holder, Signal::SIGKILL);
    let t0 = Instant::now();
    let _ = holder.wait();
    assert!(
        permit_busy(tmp.path(), &url),
        "the killed holder's permit freed at once"
    );
    let o = one_permit(tmp.path(), &url, "--wait 20s");
    assert!(o.status.success(), "{o:?}");
    let took = t0.elapsed();
    // Its last renewal gave it up to a TTL (2 s) from then.
    assert!(
        took < Duration::from_secs(6),
        "the permit came back after {took:?}"
    );
    eprintln!("the permit came back {took:?} after the kill");
}

/// A reader paused past its lease (SIGSTOP) frees its share after its own TTL; the other
/// reader keeps its share, so the waiting writer gets in only when that one ends too.
#[test]
// The paused reader is reaped by `try_wait` (or killed and waited for), which the lint does
// not follow.
#[allow(clippy::zombie_processes)]
fn a_paused_reader_frees_its_share_while_another_keeps_its_own_on_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = etcd.url("");
    let flags = ["--url", url.as_str(), "--shared", "--ttl", "2s"];
    // The paused reader's log (`DISTLOCK_LOG=debug`), shown if it does not end as it should.
    let log = tmp.path().join("paused.log");
    let mut paused = spawn_logged(tmp.path(), &flags, "rw", "sleep 60", &log);
    let mut kept = spawn(tmp.path(), &flags, "rw", "sleep 60");
    wait_until("two readers", Duration::from_secs(10), || {
        etcd.ctl(&["get", "distlock/rw/", "--prefix", "--keys-only"])
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
            == 2
    });
    signal(&paused, Signal::SIGSTOP);
    let t0 = Instant::now();
    let mut writer = distlock(tmp.path())
        .args([
            "run",
            "--url",
            &url,
            "--wait",
            "30s",
            "rw",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCE",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Well past the paused reader's TTL, the live reader still holds its share.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer got in beside a live reader"
    );
    assert!(kept.try_wait().unwrap().is_none(), "the live reader ended");
    signal(&kept, Signal::SIGTERM);
    wait_exit(&mut kept, Duration::from_secs(10));
    let st = wait_exit(&mut writer, Duration::from_secs(15));
    assert!(st.success(), "the writer after the readers");
    eprintln!("writer in after {:?}", t0.elapsed());
    // The paused reader learns it lost its share when it runs again: exit 70.
    signal(&paused, Signal::SIGCONT);
    let resumed = Instant::now();
    let mut status = None;
    while resumed.elapsed() < Duration::from_secs(15) && status.is_none() {
        status = paused.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.is_none() {
        let _ = paused.kill();
        let _ = paused.wait();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        panic!(
            "the paused reader still ran 15 s after SIGCONT; its last lines:\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
    assert_eq!(status.and_then(|s| s.code()), Some(70));
}

/// A permit holder whose ZooKeeper session expires (paused past it) loses its permit at once:
/// the next command gets it, and the paused one exits 70 when it runs again.
#[test]
fn a_lost_zookeeper_session_releases_its_permit() {
    let Some(zk) = ZooKeeper::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = zk.url("?session_timeout=1s&response_timeout=500ms");
    let flags = ["--url", url.as_str(), "--permits", "1", "--ttl", "2s"];
    let mut paused = spawn(tmp.path(), &flags, "sem", "sleep 60");
    wait_until("the permit", Duration::from_secs(10), || {
        permit_busy(tmp.path(), &url)
    });
    signal(&paused, Signal::SIGSTOP);
    let t0 = Instant::now();
    let o = one_permit(tmp.path(), &url, "--wait 20s");
    assert!(o.status.success(), "{o:?}");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the permit came back after {took:?}"
    );
    signal(&paused, Signal::SIGCONT);
    assert_eq!(
        wait_exit(&mut paused, Duration::from_secs(15)).code(),
        Some(70)
    );
}
