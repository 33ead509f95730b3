//! A real redis-server for tests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::process::{free_port, require_binary, tail};

/// A redis-server on a free loopback port, in its own temporary directory, without persistence
/// (`--save '' --appendonly no`) unless asked. Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    password: Option<String>,
    tls_port: Option<u16>,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after printing `SKIP`) when redis-server is missing
    /// outside CI.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra arguments (for example `["--requirepass", "s3cret"]`).
    pub fn start_with(extra: &[&str]) -> Option<Self> {
        if !require_binary("redis-server", "the Redis engine") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("distlock-redis-")
            .tempdir()
            .expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra,
            password,
            tls_port: None,
        };
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return Some(server),
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start after 5 tries:\n{last}");
    }

    /// Starts a server that also serves TLS on a second port ([`tls_port`](Self::tls_port))
    /// with the kit's server certificate. With `auth_clients`, a TLS client must show a
    /// certificate from the kit's CA (`--tls-auth-clients yes`). `extra` as for
    /// [`start_with`](Self::start_with).
    pub fn start_tls(pki: &crate::Pki, auth_clients: bool, extra: &[&str]) -> Option<Self> {
        let tls_port = free_port();
        let port = tls_port.to_string();
        let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
        let (cert, key, ca) = (path(&pki.server.cert), path(&pki.server.key), path(&pki.ca));
        let mut args = vec![
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ];
        args.extend_from_slice(extra);
        let mut server = Self::start_with(&args)?;
        server.tls_port = Some(tls_port);
        Some(server)
    }

    /// The TLS port of a server started with [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    /// When the server has none.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("a server started with start_tls")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!(
                    "redis-server exited with {status}; log tail:\n{}",
                    tail(&self.log_path(), 20)
                ));
            }
            if self.ping() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(format!(
            "redis-server never answered PING; log tail:\n{}",
            tail(&self.log_path(), 20)
        ))
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(n) if n > 0 => {
                let reply = &buf[..n];
                reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")
            }
            _ => false,
        }
    }

    /// Starts a replica of `master` and waits until its link to the master is up (the first
    /// sync done).
    pub fn replica_of(master: &RedisServer) -> Option<Self> {
        let port = master.port().to_string();
        let mut extra = vec!["--replicaof", "127.0.0.1", &port];
        if let Some(p) = &master.password {
            extra.extend(["--masterauth", p]);
        }
        let replica = Self::start_with(&extra)?;
        replica.wait_for("master_link_status", "up");
        Some(replica)
    }

    /// A field of `INFO` (for example `role`), or an empty string.
    pub fn info(&self, field: &str) -> String {
        let prefix = format!("{field}:");
        self.cli(&["INFO"])
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_owned()))
            .unwrap_or_default()
    }

    /// Waits (10 s at most, then panics) until `INFO` shows `field:value`.
    pub fn wait_for(&self, field: &str, value: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.info(field);
            if now == value {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "INFO {field} on port {} stayed {now:?}, not {value:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` (with the password when the server has one).
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The server's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn cli_command(&self, args: &[&str], limit: Option<u64>) -> Command {
        let mut cmd = match limit {
            // redis-cli 7.0 has no timeout of its own.
            Some(secs) => {
                let mut c = Command::new("timeout");
                c.args([&secs.to_string(), "redis-cli"]);
                c
            }
            None => Command::new("redis-cli"),
        };
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(p) = &self.password {
            cmd.args(["--no-auth-warning", "-a", p]);
        }
        cmd.args(args);
        cmd
    }

    /// Runs `redis-cli` against this server and returns its trimmed output.
    ///
    /// # Panics
    /// When `redis-cli` fails (the server is down, for example).
    pub fn cli(&self, args: &[&str]) -> String {
        crate::process::checked_stdout(
            &format!("redis-cli {args:?}"),
            self.cli_command(args, None).output(),
        )
    }

    /// The same, with an empty string when `redis-cli` fails or gets no answer within 2 s.
    pub fn try_cli(&self, args: &[&str]) -> String {
        match self.cli_command(args, Some(2)).output() {
            Ok(out) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            }
            _ => String::new(),
        }
    }

    /// Whether the process runs (it was not killed, or was restarted since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Calls per command since the server started (or `CONFIG RESETSTAT`), from
    /// `INFO commandstats`. Commands that scripts run are counted too, under their own names.
    pub fn commandstats(&self) -> std::collections::HashMap<String, u64> {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Calls of one command (lower case, e.g. `evalsha`) so far.
    pub fn calls(&self, command: &str) -> u64 {
        self.commandstats().get(command).copied().unwrap_or(0)
    }

    /// The server's process id.
    pub fn process_id(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// Pins the server to one CPU (`taskset -cp`), for latency figures on a small machine.
    pub fn pin_to_cpu(&self, cpu: usize) {
        let out = Command::new("taskset")
            .args(["-cp", &cpu.to_string(), &self.process_id().to_string()])
            .output()
            .expect("run taskset");
        assert!(out.status.success(), "taskset failed: {out:?}");
    }

    fn pid(&self) -> Pid {
        let child = self.child.as_ref().expect("server is running");
        Pid::from_raw(i32::try_from(child.id()).expect("pid fits"))
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers.
    pub fn pause(&self) {
        kill(self.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    }

    /// Thaws a paused server (SIGCONT); nothing when it was killed (nothing to thaw).
    pub fn resume(&self) {
        if self.is_running() {
            kill(self.pid(), Signal::SIGCONT).expect("SIGCONT");
        }
    }

    /// Kills the server with SIGKILL and reaps it. Without persistence its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory (after [`kill`](Self::kill)),
    /// as a replica of the master at `master_port` (what an orchestrator does that asks the
    /// sentinels for the master before it starts a node).
    pub fn restart_as_replica_of(&mut self, master_port: u16) {
        if let Some(i) = self.extra.iter().position(|a| a == "--replicaof") {
            self.extra.drain(i..(i + 3).min(self.extra.len()));
        }
        self.extra.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.to_string(),
        ]);
        self.restart();
    }

    /// Starts the server again on the same port and directory (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            // A paused server would ignore nothing: SIGKILL works on stopped processes too.
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
        }
        self.kill();
    }
}
