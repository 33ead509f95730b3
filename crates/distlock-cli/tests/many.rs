//! `distlock run a b c -- CMD`: several keys taken together, all or none. The command gets the
//! keys in their sorted order (`DISTLOCK_KEYS`, one a line) and their fences in the same order
//! (`DISTLOCK_FENCES`); `DISTLOCK_FENCE` only with one key. `status` and `list` show the holder
//! on each of its names, and a run on any one of them is refused while they are held.

use std::process::Stdio;
use std::time::Duration;

use distlock_testkit::RedisServer;

mod common;
use common::{distlock, status_json as status, wait_exit, wait_until};

/// The environment the command saw, for keys given as `keys`.
fn env_of(url: &str, keys: &[&str]) -> (Vec<String>, Vec<u64>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["run", "--url", url];
    args.extend(keys);
    args.extend([
        "--",
        "sh",
        "-c",
        "printf '%s|%s|%s' \"$DISTLOCK_KEYS\" \"$DISTLOCK_FENCES\" \"${DISTLOCK_FENCE-unset}\"",
    ]);
    let o = distlock(tmp.path()).args(&args).output().unwrap();
    assert!(o.status.success(), "{url}: {o:?}");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut parts = out.split('|');
    let names = parts.next().unwrap().lines().map(str::to_owned).collect();
    let fences = parts
        .next()
        .unwrap()
        .split(' ')
        .map(|f| f.parse().unwrap_or_else(|_| panic!("{out:?}")))
        .collect();
    (names, fences, parts.next().unwrap().to_owned())
}

fn keys_fences_and_exclusion(url: &str) {
    let (names, fences, fence) = env_of(url, &["c", "a", "b", "a"]);
    assert_eq!(names, ["a", "b", "c"], "distinct and sorted");
    assert_eq!(fences.len(), 3);
    assert_eq!(fence, "unset", "DISTLOCK_FENCE is for one key");
    let (again, later, _) = env_of(url, &["b", "c"]);
    assert_eq!(again, ["b", "c"]);
    assert!(
        later[0] > fences[1] && later[1] > fences[2],
        "{fences:?} then {later:?}"
    );
    let (one, f, fence) = env_of(url, &["b"]);
    assert_eq!((one, fence), (vec!["b".to_owned()], f[0].to_string()));
    assert!(f[0] > later[0]);

    let tmp = tempfile::tempdir().unwrap();
    let mut holder = distlock(tmp.path())
        .args([
            "run",
            "--url",
            url,
            "--label",
            "many-test",
            "x",
            "y",
            "--",
            "sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the holder's locks", Duration::from_secs(15), || {
        status(tmp.path(), url, "y")["held"] == true
    });
    for key in ["x", "y"] {
        let s = status(tmp.path(), url, key);
        assert!(
            s["owner"].as_str().is_some_and(|o| o.contains("many-test")),
            "{s}"
        );
    }
    let listed = distlock(tmp.path())
        .args(["list", "--url", url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    for key in ["x", "y"] {
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with(key) && l.contains("many-test")),
            "{listed}"
        );
    }
    for keys in [&["y"][..], &["w", "x"][..]] {
        let mut args = vec!["run", "--url", url, "--no-wait"];
        args.extend(keys);
        args.extend(["--", "true"]);
        let o = distlock(tmp.path()).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(75), "{keys:?} while held: {o:?}");
    }
    // Nothing of the refused `w x` was left taken.
    let (w, _, _) = env_of(url, &["w"]);
    assert_eq!(w, ["w"]);
    common::signal(&holder, nix::sys::signal::Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(15));
    let (free, _, _) = env_of(url, &["x", "y"]);
    assert_eq!(free, ["x", "y"]);
}

#[test]
fn several_keys_on_the_file_engine() {
    let dir = tempfile::tempdir().unwrap();
    keys_fences_and_exclusion(&format!("file://{}", dir.path().display()));
}

#[test]
fn several_keys_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    keys_fences_and_exclusion(&server.url());
}

#[test]
fn several_keys_take_no_other_kind() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    for kind in [&["--shared"][..], &["--permits", "2"][..]] {
        let mut args = vec!["run", "--url", url.as_str()];
        args.extend(kind);
        args.extend(["a", "b", "--", "true"]);
        let o = distlock(dir.path()).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(64), "{kind:?}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("exclusive locks only"));
    }
}
