//! Real etcd members for tests: one alone, or three in a cluster, each on free loopback ports
//! with its data on tmpfs (`/dev/shm` when it exists).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Daemon, free_port, loopback_url, require_binary, scratch_dir, tail};

/// One etcd member. Killed when dropped.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    child: Daemon,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    /// `--initial-cluster`, for restarts.
    cluster: String,
    /// The TLS files of a member from `start_tls`.
    tls: Option<EtcdTls>,
}

/// The files a TLS member serves with, and that `etcdctl` shows it.
#[derive(Debug, Clone)]
struct EtcdTls {
    server: crate::CertFiles,
    client: crate::CertFiles,
    ca: std::path::PathBuf,
}

impl EtcdTls {
    fn ctl_args(&self) -> Vec<String> {
        vec![
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.client.cert.display()),
            format!("--key={}", self.client.key.display()),
        ]
    }
}

/// A group of etcd members (one, or three in a cluster).
#[derive(Debug)]
pub struct Etcd {
    members: Vec<EtcdMember>,
}

impl Etcd {
    /// Starts one member. `None` (after printing `SKIP`) when etcd is missing outside CI.
    pub fn start() -> Option<Self> {
        Self::start_cluster(1)
    }

    /// Starts `n` members that form one cluster, and waits until it answers through each.
    pub fn start_cluster(n: usize) -> Option<Self> {
        Self::start_with(n, None)
    }

    /// Starts one member that serves clients over TLS only, with `pki`'s server certificate,
    /// and demands a client certificate from `pki`'s CA (`--client-cert-auth`). Its URL is
    /// `etcds://`.
    pub fn start_tls(pki: &crate::Pki) -> Option<Self> {
        Self::start_with(
            1,
            Some(EtcdTls {
                server: pki.server.clone(),
                client: pki.client.clone(),
                ca: pki.ca.clone(),
            }),
        )
    }

    fn start_with(n: usize, tls: Option<EtcdTls>) -> Option<Self> {
        if !require_binary("etcd", "the etcd engine") {
            return None;
        }
        let mut last = String::new();
        for _ in 0..5 {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let cluster = ports
                .iter()
                .enumerate()
                .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut members = Vec::new();
            for (i, (client_port, peer_port)) in ports.iter().enumerate() {
                let base = scratch_dir("distlock-etcd-");
                let mut m = EtcdMember {
                    name: format!("m{i}"),
                    child: Daemon::default(),
                    client_port: *client_port,
                    peer_port: *peer_port,
                    dir: base,
                    cluster: cluster.clone(),
                    tls: tls.clone(),
                };
                m.spawn();
                members.push(m);
            }
            let group = Etcd { members };
            match group.wait_healthy(Duration::from_secs(20)) {
                Ok(()) => return Some(group),
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start after 5 tries:\n{last}");
    }

    /// `etcd://127.0.0.1:p1,…` (`etcds://` for a TLS member) followed by `params`.
    pub fn url(&self, params: &str) -> String {
        let scheme = if self.members.iter().any(|m| m.tls.is_some()) {
            "etcds"
        } else {
            "etcd"
        };
        loopback_url(scheme, self.members.iter().map(|m| m.client_port), params)
    }

    /// The members.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// The members, to kill or pause one.
    pub fn members_mut(&mut self) -> &mut [EtcdMember] {
        &mut self.members
    }

    /// Runs `etcdctl` against every member and returns its trimmed output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_running())
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        let tls = self
            .members
            .first()
            .and_then(|m| m.tls.as_ref())
            .map(EtcdTls::ctl_args)
            .unwrap_or_default();
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(tls)
            .args(args)
            .output();
        crate::process::checked_stdout(&format!("etcdctl {args:?}"), out)
    }

    /// The members' ids (hex) and which one leads, from `etcdctl endpoint status` (members
    /// that are stopped are left out).
    fn status(&self) -> Vec<(usize, String, bool)> {
        let out = self.ctl(&["endpoint", "status", "-w", "simple"]);
        out.lines()
            .filter_map(|line| {
                // "127.0.0.1:<port>, <id>, <version>, <db size>, <is leader>, …"
                let f: Vec<&str> = line.split(", ").collect();
                let port: u16 = f.first()?.rsplit(':').next()?.parse().ok()?;
                let i = self.members.iter().position(|m| m.client_port == port)?;
                Some((i, (*f.get(1)?).to_owned(), *f.get(4)? == "true"))
            })
            .collect()
    }

    /// The index of the member that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.status().into_iter().find(|m| m.2).map(|m| m.0)
    }

    /// Hands the leadership to member `to` (`etcdctl move-leader`) and waits until it leads.
    ///
    /// # Panics
    /// When it does not lead within 5 s.
    pub fn move_leader(&self, to: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.leader() != Some(to) {
            assert!(
                Instant::now() < deadline,
                "member {to} never became the leader"
            );
            let status = self.status();
            if let Some((_, id, _)) = status.iter().find(|m| m.0 == to) {
                let _ = self.ctl(&["move-leader", id]);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_healthy(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for m in &self.members {
            loop {
                if m.healthy() {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "member {} never became healthy; log tail:\n{}",
                        m.name,
                        m.log_tail()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

impl EtcdMember {
    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("log file");
        let (scheme, tls) = match &self.tls {
            Some(t) => (
                "https",
                vec![
                    format!("--cert-file={}", t.server.cert.display()),
                    format!("--key-file={}", t.server.key.display()),
                    format!("--trusted-ca-file={}", t.ca.display()),
                    "--client-cert-auth".to_owned(),
                ],
            ),
            None => ("http", Vec::new()),
        };
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .args(&tls)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg(format!(
                "--listen-client-urls={scheme}://127.0.0.1:{}",
                self.client_port
            ))
            .arg(format!(
                "--advertise-client-urls={scheme}://127.0.0.1:{}",
                self.client_port
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                self.peer_port
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                self.peer_port
            ))
            .arg(format!("--initial-cluster={}", self.cluster))
            .args(["--initial-cluster-state", "new"])
            // Fast elections, and so a short minimum lease TTL (1.5 × the election timeout).
            .args(["--heartbeat-interval", "20", "--election-timeout", "200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run etcd");
        self.child = Daemon::new(child);
    }

    fn healthy(&self) -> bool {
        let tls = self.tls.as_ref().map(EtcdTls::ctl_args).unwrap_or_default();
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=127.0.0.1:{}", self.client_port))
            .args(tls)
            .args(["--command-timeout=1s", "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn log_tail(&self) -> String {
        tail(&self.dir.path().join("etcd.log"), 20)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// Starts a killed member again, on its data directory and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

crate::process::process_controls!(
    EtcdMember,
    child,
    kill = "Kills it with SIGKILL and reaps it (its data stays)."
);
