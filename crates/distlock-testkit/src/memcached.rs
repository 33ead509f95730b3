//! A real memcached server for tests, on a free loopback port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Daemon, free_port, require_binary};

/// One memcached server (`-u root` where the tests run as root, which it otherwise refuses).
/// Killed when dropped.
#[derive(Debug)]
pub struct Memcached {
    child: Daemon,
    port: u16,
    memory_mb: u32,
    /// A server from `start_tls`: its files, and the clear-text port the kit's own commands
    /// use.
    tls: Option<(crate::CertFiles, std::path::PathBuf, u16)>,
}

impl Memcached {
    /// Starts a server with 64 MB. `None` (after printing `SKIP`) when memcached is missing
    /// outside CI.
    pub fn start() -> Option<Self> {
        Self::start_with_memory(64)
    }

    /// Starts a server with `memory_mb` of item memory (small, to force evictions).
    pub fn start_with_memory(memory_mb: u32) -> Option<Self> {
        Self::start_with(memory_mb, None)
    }

    /// Starts a server that speaks TLS only on its port (`-Z`), with `pki`'s server
    /// certificate, and demands a client certificate from `pki`'s CA (`ssl_verify_mode=2`).
    /// The kit's own commands go to a second, clear-text listener.
    pub fn start_tls(pki: &crate::Pki) -> Option<Self> {
        Self::start_with(64, Some((pki.server.clone(), pki.ca.clone())))
    }

    fn start_with(
        memory_mb: u32,
        tls: Option<(crate::CertFiles, std::path::PathBuf)>,
    ) -> Option<Self> {
        if !require_binary("memcached", "the memcached engine (package memcached)") {
            return None;
        }
        for _ in 0..3 {
            let mut m = Memcached {
                child: Daemon::default(),
                port: free_port(),
                memory_mb,
                tls: tls.clone().map(|(files, ca)| (files, ca, free_port())),
            };
            m.spawn();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if m.command("version").starts_with("VERSION") {
                    return Some(m);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("memcached did not start after 3 tries");
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("memcached");
        cmd.args(["-p", &self.port.to_string(), "-U", "0"])
            .args(["-m", &self.memory_mb.to_string()]);
        match &self.tls {
            None => {
                cmd.args(["-l", "127.0.0.1"]);
            }
            Some((files, ca, plain)) => {
                cmd.arg("-l")
                    .arg(format!("127.0.0.1:{},notls:127.0.0.1:{plain}", self.port))
                    .arg("-Z")
                    .arg("-o")
                    .arg(format!(
                        "ssl_chain_cert={},ssl_key={},ssl_ca_cert={},ssl_verify_mode=2",
                        files.cert.display(),
                        files.key.display(),
                        ca.display()
                    ));
            }
        }
        if nix::unistd::geteuid().is_root() {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run memcached");
        self.child = Daemon::new(child);
    }

    /// `memcached://127.0.0.1:<port>` (`memcacheds://` for a TLS server) followed by `rest`
    /// (parameters).
    pub fn url(&self, rest: &str) -> String {
        let scheme = if self.tls.is_some() {
            "memcacheds"
        } else {
            "memcached"
        };
        format!("{scheme}://127.0.0.1:{}{rest}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where the kit's own commands go: the clear-text listener of a TLS server.
    fn control_port(&self) -> u16 {
        self.tls.as_ref().map_or(self.port, |(_, _, plain)| *plain)
    }

    /// Sends one text-protocol command line and returns the first line of the answer (empty
    /// when the server does not answer).
    pub fn command(&self, line: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.control_port())) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(format!("{line}\r\n").as_bytes()).is_err() {
            return String::new();
        }
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// One statistic of `stats` (`evictions`, `curr_items`…).
    pub fn stat(&self, name: &str) -> Option<u64> {
        let mut s = TcpStream::connect(("127.0.0.1", self.control_port())).ok()?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        s.write_all(b"stats\r\n").ok()?;
        let mut text = String::new();
        let mut buf = [0u8; 8192];
        while !text.contains("END\r\n") {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        text.lines().find_map(|l| {
            let rest = l
                .strip_prefix("STAT ")?
                .strip_prefix(name)?
                .strip_prefix(' ')?;
            rest.trim().parse().ok()
        })
    }

    /// Fills the cache with `count` junk items of `size` bytes each (pipelined, no replies),
    /// to push older items out.
    pub fn fill(&self, count: usize, size: usize) {
        let mut s =
            TcpStream::connect(("127.0.0.1", self.control_port())).expect("connect to memcached");
        let value = "x".repeat(size);
        let mut batch = String::new();
        for i in 0..count {
            batch.push_str(&format!(
                "set junk:{size}:{i} 0 0 {size} noreply\r\n{value}\r\n"
            ));
            if batch.len() > 64 * 1024 {
                s.write_all(batch.as_bytes()).expect("fill");
                batch.clear();
            }
        }
        batch.push_str("version\r\n");
        s.write_all(batch.as_bytes()).expect("fill");
        // Wait for the answer to the last command: everything before it was stored.
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.child.kill();
        self.spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.command("version").starts_with("VERSION") {
            assert!(Instant::now() < deadline, "memcached did not restart");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

crate::process::process_controls!(
    Memcached,
    child,
    kill = "Kills it (SIGKILL): every lock is gone, as memcached keeps nothing."
);
