//! Redis Sentinel for tests: a group of sentinels watching one master, with fast failover.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, require_binary, tail};
use crate::redis_server::RedisServer;

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "distlock-test";

/// Sentinels (`redis-server conf --sentinel`) watching one master, each on a free loopback port
/// in its own temporary directory. A master unanswered for 500 ms is down; the quorum is a
/// majority of the sentinels. Killed when dropped.
#[derive(Debug)]
pub struct Sentinels {
    nodes: Vec<SentinelNode>,
}

#[derive(Debug)]
struct SentinelNode {
    child: Child,
    port: u16,
    /// The TLS port of a sentinel from `start_tls`.
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
}

impl Sentinels {
    /// Starts `n` sentinels that monitor `master` (its replicas they find through it).
    /// `None` (after printing `SKIP`) when redis-server is missing outside CI.
    pub fn start(n: usize, master: &RedisServer) -> Option<Self> {
        if !require_binary("redis-server", "Redis Sentinel") {
            return None;
        }
        Self::start_with(n, master.port(), None)
    }

    /// Starts `n` sentinels that take clients over TLS (`pki`'s server certificate, client
    /// certificates from `pki`'s CA demanded) and watch the master at its TLS port
    /// `master_tls_port` (`tls-replication yes`, with `pki`'s client certificate). The kit's
    /// own commands use their clear-text ports; [`url`](Self::url) names the TLS ones.
    pub fn start_tls(n: usize, master_tls_port: u16, pki: &crate::Pki) -> Option<Self> {
        if !require_binary("redis-server", "Redis Sentinel") {
            return None;
        }
        Self::start_with(n, master_tls_port, Some(pki))
    }

    fn start_with(n: usize, master_port: u16, pki: Option<&crate::Pki>) -> Option<Self> {
        let quorum = n / 2 + 1;
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(SentinelNode::spawn(master_port, quorum, pki));
        }
        let group = Sentinels { nodes };
        // Every sentinel has found the replicas and the other sentinels before a test kills
        // anything (otherwise a failover may find no replica, or no majority to elect a leader).
        group.wait_until(
            Duration::from_secs(20),
            "the sentinels to know each other",
            |s| {
                s.iter().all(|node| {
                    let info = node.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
                    field(&info, "num-other-sentinels") == Some((n - 1).to_string())
                })
            },
        );
        Some(group)
    }

    /// `redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,…/<master name>` followed by `params`
    /// (for example `?wait_replicas=1`).
    pub fn url(&self, params: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.tls_port.unwrap_or(s.port)))
            .collect();
        let scheme = if self.nodes.iter().any(|s| s.tls_port.is_some()) {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{}/{MASTER_NAME}{params}", hosts.join(","))
    }

    /// The sentinels' clear-text ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The master's port as the first sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        let out = self.nodes[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until every sentinel reports a master other than `old_port` (a failover
    /// happened), and returns its port; panics after `limit`.
    pub fn wait_for_failover(&self, old_port: u16, limit: Duration) -> u16 {
        let mut new = 0;
        self.wait_until(limit, "a failover", |s| {
            let ports: Vec<Option<u16>> = s
                .iter()
                .map(|n| {
                    let out = n.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
                    out.lines().nth(1)?.trim().parse().ok()
                })
                .collect();
            match ports.first() {
                Some(Some(p)) if *p != old_port && ports.iter().all(|q| *q == Some(*p)) => {
                    new = *p;
                    true
                }
                _ => false,
            }
        });
        new
    }

    fn wait_until(&self, limit: Duration, what: &str, mut ok: impl FnMut(&[SentinelNode]) -> bool) {
        let deadline = Instant::now() + limit;
        while !ok(&self.nodes) {
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| tail(&n.dir.path().join("sentinel.log"), 15))
                    .collect();
                panic!(
                    "waited {limit:?} for {what}; sentinel logs:\n{}",
                    logs.join("\n---\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl SentinelNode {
    fn spawn(master_port: u16, quorum: usize, pki: Option<&crate::Pki>) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("distlock-sentinel-")
                .tempdir()
                .expect("temp dir");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let log = dir.path().join("sentinel.log");
            let tls_port = pki.map(|_| free_port());
            let tls = match (pki, tls_port) {
                (Some(pki), Some(tls_port)) => format!(
                    "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-client-cert-file {}\ntls-client-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients yes\ntls-replication yes\n",
                    pki.server.cert.display(),
                    pki.server.key.display(),
                    pki.client.cert.display(),
                    pki.client.key.display(),
                    pki.ca.display()
                ),
                _ => String::new(),
            };
            let text = tls
                + &format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
                 dir {dir}\nlogfile {log}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display(),
                    log = log.display(),
                );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run redis-server --sentinel");
            let mut node = SentinelNode {
                child,
                port,
                tls_port,
                dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(status)) = node.child.try_wait() {
                    last = format!("sentinel exited with {status}: {}", tail(&log, 20));
                    break;
                }
                if node.try_cli(&["PING"]).is_some_and(|o| o == "PONG") {
                    return node;
                }
                if Instant::now() >= deadline {
                    last = format!("sentinel never answered: {}", tail(&log, 20));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(node);
        }
        panic!("a sentinel did not start after 5 tries:\n{last}");
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args).unwrap_or_default()
    }
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of `redis-cli`'s rendering of a flat name/value reply (names and values on
/// alternate lines).
fn field(reply: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = reply.lines().map(str::trim).collect();
    lines
        .iter()
        .position(|l| *l == name)
        .and_then(|i| lines.get(i + 1))
        .map(|v| (*v).to_owned())
}
