//! Helpers to run real server processes in tests.

use std::net::TcpListener;
use std::path::Path;

/// Whether `binary` can be run. Under `CI` a missing binary panics (a failure, never a skip);
/// elsewhere it prints `SKIP` and returns false so the caller can return early.
pub fn require_binary(binary: &str, why: &str) -> bool {
    if find_in_path(binary) {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{binary} is not installed, and CI is set: {why} cannot be tested (install it in .ci/run)"
        );
    }
    eprintln!(
        "SKIP: {binary} is not installed; {why} not tested (set CI=1 to make this a failure)"
    );
    false
}

fn find_in_path(binary: &str) -> bool {
    if binary.contains('/') {
        return Path::new(binary).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
        .unwrap_or(false)
}

/// A TCP port that was free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// The last `n` lines of a log file, for failure messages.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("<no log: {e}>"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
