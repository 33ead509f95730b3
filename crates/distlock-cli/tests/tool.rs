//! The command-line tool end to end, on the built binary: each behaviour on the file engine
//! and on a real Redis server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::RedisServer;
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

/// An engine under test: its URL, and how an outsider removes a lock behind the holder's back.
struct Target {
    tmp: tempfile::TempDir,
    url: String,
    redis: Option<RedisServer>,
}

impl Target {
    fn file() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("file://{}", tmp.path().join("locks").display());
        Target {
            tmp,
            url,
            redis: None,
        }
    }

    fn redis() -> Option<Self> {
        let server = RedisServer::start()?;
        Some(Target {
            tmp: tempfile::tempdir().unwrap(),
            url: server.url(),
            redis: Some(server),
        })
    }

    fn all() -> Vec<Self> {
        let mut v = vec![Target::file()];
        v.extend(Target::redis());
        v
    }

    fn name(&self) -> &'static str {
        if self.redis.is_some() {
            "redis"
        } else {
            "file"
        }
    }

    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// `distlock ARGS…` with `--url` after the subcommand.
    fn cmd(&self, sub: &str, args: &[&str]) -> Command {
        let mut c = distlock(self.dir());
        c.arg(sub).args(["--url", &self.url]).args(args);
        c
    }

    fn output(&self, sub: &str, args: &[&str]) -> Output {
        self.cmd(sub, args).output().unwrap()
    }

    fn status(&self, key: &str) -> serde_json::Value {
        let o = self.output("status", &["--json", key]);
        assert!(o.status.success(), "{o:?}");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"))
    }

    fn wait_held(&self, key: &str) {
        wait_until("the holder's lock", Duration::from_secs(10), || {
            self.status(key)["held"] == true
        });
    }

    /// Removes the lock behind its holder's back: a DEL on Redis; on the file engine (where an
    /// outsider cannot take a flock away) the operator's `release --force`.
    fn remove_behind_holder(&self, key: &str) {
        match &self.redis {
            Some(server) => {
                server.cli(&["DEL", &format!("distlock:{{{key}}}")]);
            }
            None => {
                let o = self.output("release", &["--force", key]);
                assert!(o.status.success(), "{o:?}");
            }
        }
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd("run", args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn marker(t: &Target, name: &str) -> PathBuf {
    t.dir().join(name)
}

#[test]
fn two_runs_on_one_key_never_overlap() {
    for t in Target::all() {
        let log = marker(&t, "windows.log");
        let script = format!(
            "echo \"S $(date +%s%N)\" >> {l}; sleep 0.3; echo \"E $(date +%s%N)\" >> {l}",
            l = log.display()
        );
        let runs: Vec<Child> = (0..3)
            .map(|_| {
                t.cmd(
                    "run",
                    &["--wait", "30s", "serial", "--", "sh", "-c", &script],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
            })
            .collect();
        for mut r in runs {
            assert!(wait_exit(&mut r, Duration::from_secs(30)).success());
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let mut events: Vec<(u128, char)> = text
            .lines()
            .map(|l| {
                let (kind, at) = l.split_once(' ').unwrap();
                (at.parse().unwrap(), kind.chars().next().unwrap())
            })
            .collect();
        events.sort();
        let kinds: String = events.iter().map(|e| e.1).collect();
        assert_eq!(kinds, "SESESE", "{}: windows overlapped: {text}", t.name());
    }
}

#[test]
fn no_wait_on_a_held_key_exits_75_at_once_or_as_configured() {
    for t in Target::all() {
        let mut holder = t.spawn(&["--label", "holder-A", "busy", "--", "sleep", "30"]);
        t.wait_held("busy");
        let t0 = Instant::now();
        let o = t.output("run", &["--no-wait", "busy", "--", "true"]);
        assert_eq!(o.status.code(), Some(75), "{}: {o:?}", t.name());
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(stderr(&o).contains("holder-A"), "{o:?}");
        let o = t.output(
            "run",
            &[
                "--no-wait",
                "--conflict-exit-code",
                "3",
                "busy",
                "--",
                "true",
            ],
        );
        assert_eq!(o.status.code(), Some(3), "{o:?}");
        let t0 = Instant::now();
        let o = t.output("run", &["--wait", "300ms", "busy", "--", "true"]);
        assert_eq!(o.status.code(), Some(75), "{o:?}");
        assert!(t0.elapsed() >= Duration::from_millis(290));
        holder.kill().unwrap();
        holder.wait().unwrap();
    }
}

#[test]
fn a_killed_holder_frees_the_lock_within_its_ttl() {
    for t in Target::all() {
        let mut holder = t.spawn(&["--ttl", "1s", "crash", "--", "sleep", "30"]);
        t.wait_held("crash");
        signal(&holder, Signal::SIGKILL);
        holder.wait().unwrap();
        let t0 = Instant::now();
        let o = t.output(
            "run",
            &[
                "--ttl",
                "1s",
                "--wait",
                "5s",
                "crash",
                "--",
                "sh",
                "-c",
                "echo $DISTLOCK_FENCE",
            ],
        );
        assert!(o.status.success(), "{}: {o:?}", t.name());
        let fence: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        assert!(fence >= 2, "{fence}");
        assert!(
            t0.elapsed() < Duration::from_millis(2500),
            "{}: {:?}",
            t.name(),
            t0.elapsed()
        );
    }
}

#[test]
fn a_lock_removed_under_the_command_stops_it_and_exits_70() {
    for t in Target::all() {
        // --on-lost term (the default): SIGTERM, the command's trap runs.
        let trapped = marker(&t, "trapped");
        let script = format!(
            "trap 'touch {}; exit 0' TERM; sleep 30 & wait",
            trapped.display()
        );
        let mut holder = t.spawn(&["--ttl", "900ms", "lost", "--", "sh", "-c", &script]);
        t.wait_held("lost");
        t.remove_behind_holder("lost");
        let st = wait_exit(&mut holder, Duration::from_secs(10));
        assert_eq!(st.code(), Some(70), "{}", t.name());
        assert!(
            trapped.exists(),
            "{}: the command did not get SIGTERM",
            t.name()
        );

        // --on-lost kill: SIGKILL at once, whatever the command traps; a custom status.
        let script = "trap '' TERM; sleep 30";
        let mut holder = t.spawn(&[
            "--ttl",
            "900ms",
            "--on-lost",
            "kill",
            "--lost-exit-code",
            "71",
            "lost2",
            "--",
            "sh",
            "-c",
            script,
        ]);
        t.wait_held("lost2");
        t.remove_behind_holder("lost2");
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(10)).code(),
            Some(71)
        );

        // --on-lost ignore: the command runs to its end, then 70.
        let done = marker(&t, "done");
        let script = format!("sleep 1.5; touch {}", done.display());
        let mut holder = t.spawn(&[
            "--ttl",
            "600ms",
            "--on-lost",
            "ignore",
            "lost3",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        t.wait_held("lost3");
        t.remove_behind_holder("lost3");
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(10)).code(),
            Some(70)
        );
        assert!(done.exists(), "{}: the command was stopped", t.name());
    }
}

/// A server that stops answering (SIGSTOP): the lease ends at its local deadline, the command
/// is stopped, and distlock exits as soon as the command has ended. It does not wait on the
/// silent server for a renewal in flight or for a release of a lease it knows is lost (with a
/// 5 s response timeout, that wait would be seconds).
#[test]
fn a_paused_server_stops_the_command_and_distlock_exits_promptly() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{}?response_timeout=5s", server.url());
    let stopped = tmp.path().join("stopped");
    let script = format!(
        "trap 'touch {}; exit 0' TERM; sleep 30 & wait",
        stopped.display()
    );
    let mut holder = distlock(tmp.path())
        .args(["run", "--url", &url, "--ttl", "1s", "paused", "--"])
        .args(["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the holder's lock", Duration::from_secs(10), || {
        common::status_json(tmp.path(), &url, "paused")["held"] == true
    });
    server.pause();
    let paused = Instant::now();
    wait_until("the command's SIGTERM", Duration::from_secs(5), || {
        stopped.exists()
    });
    let stopped_after = paused.elapsed();
    let st = wait_exit(&mut holder, Duration::from_secs(15));
    let exited_after = paused.elapsed();
    server.resume();
    assert_eq!(st.code(), Some(70));
    assert!(
        stopped_after < Duration::from_millis(1500),
        "the lease outlived its 1 s TTL: the command was stopped {stopped_after:?} after the pause"
    );
    assert!(
        exited_after - stopped_after < Duration::from_millis(1500),
        "distlock waited on the paused server: stopped at {stopped_after:?}, exited at \
         {exited_after:?}"
    );
}

#[test]
fn sigterm_reaches_the_command_and_the_lock_is_released() {
    for t in Target::all() {
        let ready = marker(&t, "ready");
        let script = format!(
            "trap 'exit 9' TERM; touch {}; sleep 30 & wait",
            ready.display()
        );
        let mut holder = t.spawn(&["sig", "--", "sh", "-c", &script]);
        wait_until("the command", Duration::from_secs(10), || ready.exists());
        signal(&holder, Signal::SIGTERM);
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(10)).code(),
            Some(9)
        );
        assert_eq!(t.status("sig")["held"], false, "{}", t.name());
    }
}

#[test]
fn status_json_names_the_holder_and_its_fence() {
    for t in Target::all() {
        let st = t.status("st");
        assert_eq!(st["key"], "st");
        assert_eq!(st["held"], false);
        let fence_file = marker(&t, "fence");
        let script = format!("echo $DISTLOCK_FENCE > {}; sleep 30", fence_file.display());
        let mut holder = t.spawn(&[
            "--label", "web-7", "--ttl", "5s", "st", "--", "sh", "-c", &script,
        ]);
        t.wait_held("st");
        wait_until("the fence file", Duration::from_secs(5), || {
            std::fs::read_to_string(&fence_file).is_ok_and(|f| !f.trim().is_empty())
        });
        let fence: u64 = std::fs::read_to_string(&fence_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let st = t.status("st");
        assert_eq!(st["held"], true);
        assert!(st["owner"].as_str().unwrap().contains("web-7"), "{st}");
        // The holder's fence; or, where the engine's fast path did not record it (Redis's
        // first attempt), the highest fence issued, which bounds it.
        match st["fence"].as_u64() {
            Some(f) => assert_eq!(f, fence, "{st}"),
            None => assert!(st["last_fence"].as_u64().unwrap() >= fence, "{st}"),
        }
        match t.name() {
            "redis" => {
                let ttl = st["ttl_ms"].as_u64().unwrap();
                assert!(ttl > 0 && ttl <= 5000, "{st}");
            }
            _ => assert!(st["ttl_ms"].is_null(), "{st}"),
        }
        for field in ["key", "held", "owner", "fence", "ttl_ms"] {
            assert!(st.get(field).is_some(), "{field} missing: {st}");
        }
        holder.kill().unwrap();
        holder.wait().unwrap();
    }
}

#[test]
fn release_force_breaks_a_held_lock_loudly() {
    for t in Target::all() {
        let o = t.output("release", &["brk"]);
        assert_eq!(o.status.code(), Some(64), "without --force: {o:?}");
        let o = t.output("release", &["--force", "brk"]);
        assert!(o.status.success(), "{o:?}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("nothing removed"));

        let mut holder = t.spawn(&[
            "--label",
            "stuck-job",
            "--ttl",
            "900ms",
            "brk",
            "--",
            "sleep",
            "30",
        ]);
        t.wait_held("brk");
        let o = t.output("release", &["--force", "--json", "brk"]);
        assert!(o.status.success(), "{o:?}");
        assert!(stderr(&o).contains("WARNING"), "{o:?}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["removed"], true);
        assert!(v["owner"].as_str().unwrap().contains("stuck-job"), "{v}");
        // The next run gets the lock, with a higher fence; the broken holder stops.
        let o = t.output(
            "run",
            &[
                "--wait",
                "5s",
                "brk",
                "--",
                "sh",
                "-c",
                "echo $DISTLOCK_FENCE",
            ],
        );
        assert!(o.status.success(), "{o:?}");
        let next: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        assert!(next > v["fence"].as_u64().unwrap_or(0), "{next} after {v}");
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(10)).code(),
            Some(70)
        );
    }
}

#[test]
fn bench_and_check_report_json() {
    for t in Target::all() {
        let o = t.output(
            "bench",
            &[
                "--tasks",
                "4",
                "--keys",
                "2",
                "--hold",
                "1ms",
                "--duration",
                "700ms",
                "--json",
            ],
        );
        assert!(o.status.success(), "{}: {o:?}", t.name());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["engine"], t.name());
        assert!(v["acquisitions"].as_u64().unwrap() > 10, "{v}");
        assert!(v["throughput"].as_f64().unwrap() > 0.0, "{v}");
        assert!(
            v["acquire_us"]["p99"].as_u64().unwrap() >= v["acquire_us"]["p50"].as_u64().unwrap()
        );
        assert_eq!(v["errors"], 0, "{v}");
        let fair = &v["fairness"];
        assert!(fair["min"].as_u64().unwrap() <= fair["max"].as_u64().unwrap());

        let o = t.output(
            "check",
            &["--workers", "4", "--duration", "700ms", "--json"],
        );
        assert!(o.status.success(), "{}: {o:?}", t.name());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(v["overlaps"], 0);
        assert_eq!(v["lost_updates"], 0);
        assert_eq!(v["fence_regressions"], 0);
        assert_eq!(v["left_held"], false);
        assert_eq!(v["writes"], v["final_value"]);
        assert!(v["acquisitions"].as_u64().unwrap() > 10, "{v}");
    }
}

#[test]
fn the_spinner_shows_on_a_terminal_only() {
    if Command::new("script").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "util-linux's script is missing"
        );
        return;
    }
    let t = Target::file();
    let mut holder = t.spawn(&["--label", "slow-holder", "spin", "--", "sleep", "2"]);
    t.wait_held("spin");
    // Not a terminal: nothing drawn.
    let o = t.output("run", &["--wait", "10s", "spin", "--", "true"]);
    assert!(o.status.success(), "{o:?}");
    assert!(!stderr(&o).contains("waiting for"), "{o:?}");
    holder.wait().unwrap();
    // A terminal (script's pty): the spinner names the holder.
    let mut holder = t.spawn(&["--label", "slow-holder", "spin", "--", "sleep", "2"]);
    t.wait_held("spin");
    let inner = format!(
        "{} run --url {} --wait 10s spin -- true",
        common::BIN,
        t.url
    );
    let o = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("TMPDIR", t.dir())
        .env("DISTLOCK_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("waiting for spin: held by slow-holder"),
        "{shown:?}"
    );
    holder.wait().unwrap();
    // On a terminal, an engine tried again within the wait: the spinner says so, and why; no
    // log line is written, and NO_COLOR leaves no colour code.
    let inner = format!(
        "{} run --url redis://127.0.0.1:1 --wait 1500ms spin -- true",
        common::BIN
    );
    let o = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("TMPDIR", t.dir())
        .env_remove("DISTLOCK_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{o:?}");
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("retrying the lock engine (attempt ") && shown.contains("refused"),
        "{shown:?}"
    );
    assert!(!shown.contains("WARN"), "{shown:?}");
    // Colour codes are `ESC [ … m`; the spinner's cursor moves are other sequences.
    assert!(
        !shown.contains("\x1b[0m") && !shown.contains("\x1b[2m"),
        "{shown:?}"
    );
}

#[test]
fn bad_input_is_one_clear_line() {
    let t = Target::file();
    let cases: [(&[&str], i32, &str); 7] = [
        (
            &["status", "--url", "gopher://x", "k"],
            78,
            "unsupported lock URL scheme",
        ),
        (
            &["run", "--ttl", "soon", "k", "--", "true"],
            64,
            "not a duration",
        ),
        (&["run", "k", "true"], 64, "--"),
        (&["run", "", "--", "true"], 64, "empty"),
        (&["status", ""], 64, "empty"),
        (
            &["run", "--url", "redis://127.0.0.1:1", "k", "--", "true"],
            69,
            "127.0.0.1:1",
        ),
        (&["bench", "--tasks", "0"], 64, "tasks"),
    ];
    for (args, code, says) in cases {
        let o = distlock(t.dir()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {o:?}");
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("distlock: "), "{err:?}");
        assert!(err.contains(says), "{args:?}: {err:?}");
        assert!(!err.contains("panicked"), "{err:?}");
    }
}

#[test]
fn help_version_and_completions() {
    let t = Target::file();
    let o = distlock(t.dir()).arg("--help").output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("Examples:") && help.contains("release --force"),
        "{help}"
    );
    let o = distlock(t.dir()).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&o.stdout);
    assert!(version.starts_with("distlock "), "{version}");
    // Every engine is compiled into the command.
    assert!(
        version.contains("engines: file, redis, tls, etcd, zookeeper, postgres, mysql, memcached"),
        "{version}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let o = distlock(t.dir())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(o.status.success(), "{shell}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("distlock"),
            "{shell}"
        );
    }
}
