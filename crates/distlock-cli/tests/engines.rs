//! `run`, `status` and `release --force` on every engine, through its URL: a holder shows in
//! `status --json` with its label, a forced release frees the lock for the next `run` (with a
//! higher fence where the engine has fences), and the broken holder exits 70.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_testkit::{
    Etcd, MariaDb, Memcached, Postgres, RedisCluster, RedisServer, Sentinels, ZooKeeper,
};

mod common;
use common::{distlock, status_json as status, wait_exit, wait_until};

fn run_status_and_break(url: &str, fenced: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            url,
            "k",
            "--",
            "sh",
            "-c",
            "echo \"[$DISTLOCK_KEY] [$DISTLOCK_FENCE]\"",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{url}: {o:?}");
    let out = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let fence: Option<u64> = out
        .strip_prefix("[k] [")
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{url}: {out:?}"))
        .parse()
        .ok();
    assert_eq!(fence.is_some(), fenced, "{url}: {out:?}");

    let mut holder = distlock(tmp.path())
        .args([
            "run",
            "--url",
            url,
            "--label",
            "engine-test",
            "--ttl",
            "2s",
            "k",
            "--",
            "sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the holder's lock", Duration::from_secs(15), || {
        status(tmp.path(), url, "k")["held"] == true
    });
    let st = status(tmp.path(), url, "k");
    assert!(
        st["owner"]
            .as_str()
            .unwrap_or_default()
            .contains("engine-test"),
        "{url}: {st}"
    );
    let o = distlock(tmp.path())
        .args(["release", "--force", "--url", url, "k"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{url}: {o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("removed k: held"),
        "{url}: {o:?}"
    );
    let o = distlock(tmp.path())
        .args([
            "run",
            "--url",
            url,
            "--wait",
            "10s",
            "k",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCE",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{url}: {o:?}");
    if let Some(first) = fence {
        let next: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        assert!(next > first, "{url}: {next} after {first}");
    }
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(15)).code(),
        Some(70),
        "{url}: the broken holder"
    );
    assert_eq!(status(tmp.path(), url, "k")["held"], false, "{url}");
}

#[test]
fn etcd() {
    let Some(etcd) = Etcd::start() else { return };
    run_status_and_break(&etcd.url(""), true);
}

#[test]
fn zookeeper() {
    let Some(zk) = ZooKeeper::start() else { return };
    run_status_and_break(&zk.url(""), true);
}

#[test]
fn postgres() {
    let Some(pg) = Postgres::start() else { return };
    run_status_and_break(&pg.url(""), true);
}

#[test]
fn mariadb() {
    let Some(db) = MariaDb::start() else { return };
    run_status_and_break(&db.url(""), true);
}

#[test]
fn memcached() {
    let Some(mc) = Memcached::start() else { return };
    run_status_and_break(&mc.url(""), false);
}

#[test]
fn redlock() {
    let masters: Vec<RedisServer> = (0..3).filter_map(|_| RedisServer::start()).collect();
    if masters.len() < 3 {
        return;
    }
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    run_status_and_break(&format!("redlock://{}", hosts.join(",")), false);
}

#[test]
fn sentinel() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let Some(sentinels) = Sentinels::start(3, &master) else {
        return;
    };
    run_status_and_break(&sentinels.url(""), true);
}

#[test]
fn cluster() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    run_status_and_break(&cluster.url(""), true);
}

/// `run --wait` started during a Sentinel fail-over (the master just killed, the sentinels
/// still naming it) rides through it: opening the engine and taking the lock are tried again
/// within the budget. `--no-wait` at that moment exits 69 at once.
#[test]
fn run_with_a_wait_rides_through_a_sentinel_fail_over() {
    let Some(mut master) = RedisServer::start() else {
        return;
    };
    let _replica = RedisServer::replica_of(&master).expect("replica");
    let Some(sentinels) = Sentinels::start(3, &master) else {
        return;
    };
    let url = sentinels.url("?connect_timeout=300ms&response_timeout=300ms");
    let tmp = tempfile::tempdir().unwrap();
    master.kill();
    let t0 = Instant::now();
    let o = distlock(tmp.path())
        .args(["run", "--url", &url, "--no-wait", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{o:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let o = distlock(tmp.path())
        .args(["run", "--url", &url, "--wait", "30s", "k", "--"])
        .args(["sh", "-c", "test -n \"$DISTLOCK_FENCE\""])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("ran {:?} after the kill", t0.elapsed());
}
