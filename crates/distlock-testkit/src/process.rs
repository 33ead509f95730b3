//! Helpers to run real server processes in tests.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

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

/// Lets every user read `path` (and enter it, for a directory): the servers the kit starts as
/// other users read the test certificates.
pub(crate) fn open_to_all(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .expect("open the file to all users");
}

/// A temporary directory for a server's data, on tmpfs (`/dev/shm`) when there is one: a
/// disk's fsync per write would be most of every request's time.
pub(crate) fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let builder = tempfile::Builder::new().prefix(prefix).clone();
    if Path::new("/dev/shm").is_dir() {
        builder.tempdir_in("/dev/shm")
    } else {
        builder.tempdir()
    }
    .expect("temp dir")
}

/// `<scheme>://127.0.0.1:<p1>,127.0.0.1:<p2>,…` followed by `rest`.
pub(crate) fn loopback_url(scheme: &str, ports: impl Iterator<Item = u16>, rest: &str) -> String {
    let hosts: Vec<String> = ports.map(|p| format!("127.0.0.1:{p}")).collect();
    format!("{scheme}://{}{rest}", hosts.join(","))
}

/// The last `n` lines of a log file, for failure messages.
/// The trimmed stdout of a client tool the kit ran (`what` names it in the failure).
///
/// # Panics
/// When the tool could not run or failed.
pub(crate) fn checked_stdout(what: &str, out: std::io::Result<std::process::Output>) -> String {
    let out = out.unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("<no log: {e}>"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The process controls of a server type, passed on to its [`Daemon`] field: `pause`, `resume`,
/// `pin_to_cpu`, `cpu_seconds`, and `kill` when the type's `kill` is a plain SIGKILL (the text
/// given is its doc: what a kill leaves behind differs between servers).
macro_rules! process_controls {
    ($ty:ty, $field:ident) => {
        impl $ty {
            /// Pins the process (every thread, and children forked later) to one CPU, for
            /// latency figures on a small machine.
            pub fn pin_to_cpu(&self, cpu: usize) {
                self.$field.pin_to_cpu(cpu);
            }

            /// Freezes it (SIGSTOP): connections stay open and nothing answers.
            pub fn pause(&self) {
                self.$field.pause();
            }

            /// Thaws it (SIGCONT); nothing when it is not running (killed).
            pub fn resume(&self) {
                self.$field.resume();
            }

            /// Whether the process runs (false after a kill, until a restart).
            pub fn is_running(&self) -> bool {
                self.$field.is_running()
            }

            /// The CPU time the server process (and its children) has used so far, in seconds.
            pub fn cpu_seconds(&self) -> f64 {
                self.$field.cpu_seconds()
            }

            /// The memory the server holds, in bytes (its resident set, and its children's
            /// anonymous memory).
            pub fn memory_bytes(&self) -> u64 {
                self.$field.memory_bytes()
            }
        }
    };
    ($ty:ty, $field:ident, kill = $doc:literal) => {
        $crate::process::process_controls!($ty, $field);

        impl $ty {
            #[doc = $doc]
            pub fn kill(&mut self) {
                self.$field.kill();
            }
        }
    };
}
pub(crate) use process_controls;

/// A server process the test kit started: freeze, thaw, pin or kill it. Killed when dropped.
#[derive(Debug, Default)]
pub(crate) struct Daemon(Option<std::process::Child>);

impl Daemon {
    pub(crate) fn new(child: std::process::Child) -> Self {
        Daemon(Some(child))
    }

    pub(crate) fn is_running(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn pid(&self) -> nix::unistd::Pid {
        let child = self.0.as_ref().expect("the server is running");
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits"))
    }

    /// SIGSTOP: connections stay open and nothing answers. Returns once every thread is
    /// stopped (the signal is only queued when `kill` returns, and a thread running on the other
    /// CPU could still answer a request sent right after), or after a second at most.
    pub(crate) fn pause(&self) {
        let pid = self.pid();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while !all_stopped(pid) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// SIGCONT; nothing when the process was killed (there is nothing to thaw).
    pub(crate) fn resume(&self) {
        if self.is_running() {
            nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        }
    }

    /// The process and its live children (PostgreSQL serves each session in a process of its
    /// own): their pids, the root first.
    fn tree(&self) -> Vec<i32> {
        let root = self.pid().as_raw();
        // Every process's parent, from /proc/<pid>/stat: the fields after the command (in
        // parentheses, and it may hold spaces) start with the state (field 3); ppid is field 4.
        let mut parents: Vec<(i32, i32)> = Vec::new();
        for (pid, fields) in proc_stats() {
            let ppid = fields.get(1).and_then(|f| f.parse().ok()).unwrap_or(0);
            parents.push((pid, ppid));
        }
        let mut tree = vec![root];
        let mut i = 0;
        while i < tree.len() {
            let parent = tree[i];
            tree.extend(parents.iter().filter(|p| p.1 == parent).map(|p| p.0));
            i += 1;
        }
        tree
    }

    /// The CPU time the process and its children have used so far (user and system), in
    /// seconds: the live ones', and the time of those that ended, which their parent counts
    /// once it has reaped them (a PostgreSQL backend that exits during a measurement would
    /// otherwise take its time out of it, and the figure could go down).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let tree = self.tree();
        // utime, stime, cutime and cstime are fields 14 to 17 of /proc/<pid>/stat.
        let ticks: f64 = proc_stats()
            .filter(|(pid, _)| tree.contains(pid))
            .flat_map(|(_, f)| {
                [11, 12, 13, 14]
                    .into_iter()
                    .filter_map(move |i| f.get(i)?.parse::<f64>().ok())
            })
            .sum();
        // In USER_HZ, which Linux fixes at 100 for what it shows user space.
        ticks / 100.0
    }

    /// The memory the server holds, in bytes: the process's resident set, and its children's
    /// anonymous resident memory (their shared memory and mapped files are the parent's too,
    /// and are counted once).
    pub(crate) fn memory_bytes(&self) -> u64 {
        let field = |pid: i32, name: &str| -> u64 {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        let tree = self.tree();
        field(tree[0], "VmRSS:") + tree[1..].iter().map(|&p| field(p, "RssAnon:")).sum::<u64>()
    }

    /// Pins every thread of the process to one CPU (`taskset -acp`).
    pub(crate) fn pin_to_cpu(&self, cpu: usize) {
        let out = std::process::Command::new("taskset")
            .args(["-acp", &cpu.to_string(), &self.pid().to_string()])
            .output()
            .expect("run taskset");
        assert!(out.status.success(), "taskset failed: {out:?}");
    }

    /// Sends `signal` (to a paused process too) and waits up to `grace` for it to exit; then
    /// SIGKILL. For servers whose children must be told to go (PostgreSQL's backends outlive a
    /// SIGKILLed postmaster).
    pub(crate) fn stop_with(&mut self, signal: nix::sys::signal::Signal, grace: Duration) {
        let Some(c) = self.0.as_mut() else { return };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = nix::sys::signal::kill(pid, signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                self.0 = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    /// SIGKILL (a paused process too) and reap.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether every thread of `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn all_stopped(pid: nix::unistd::Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}

/// Every process's pid and the fields of its /proc/<pid>/stat after the command.
fn proc_stats() -> impl Iterator<Item = (i32, Vec<String>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            Some((pid, after.split_whitespace().map(str::to_owned).collect()))
        })
}
