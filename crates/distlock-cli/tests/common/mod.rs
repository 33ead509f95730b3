//! What the CLI's test files share: the binary with a clean environment, signals, waits.

#![allow(dead_code)] // Each test file uses a part.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// The `distlock` binary with its own `TMPDIR`, no `DISTLOCK_URL` and no logging.
pub(crate) fn distlock(tmp: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env("TMPDIR", tmp)
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_PASSWORD")
        .env_remove("DISTLOCK_PASSWORD_FILE")
        .env_remove("DISTLOCK_SENTINEL_PASSWORD")
        .env("DISTLOCK_LOG", "off");
    c
}

pub(crate) fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).expect("signal");
}

/// Polls `ok` every 20 ms; fails the test after `limit`.
pub(crate) fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's exit status; kills it and fails the test after `limit`.
pub(crate) fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `distlock status --json --url URL KEY`, parsed.
pub(crate) fn status_json(tmp: &Path, url: &str, key: &str) -> serde_json::Value {
    let o = distlock(tmp)
        .args(["status", "--json", "--url", url, key])
        .output()
        .unwrap();
    assert!(o.status.success(), "{url}: {o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"))
}
