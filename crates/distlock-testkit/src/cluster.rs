//! A Redis Cluster for tests: masters only, slots spread by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// `n` (at least 3) cluster-enabled redis-servers on free loopback ports, one master each,
/// the 16384 slots spread over them. Killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The nodes' TLS ports, for a Cluster from `start_tls`.
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts and joins the masters, and waits until every node reports `cluster_state:ok`.
    /// `None` (after printing `SKIP`) when redis-server is missing outside CI.
    pub fn start(n: usize) -> Option<Self> {
        Self::start_with(n, None)
    }

    /// The same, each node also taking TLS clients (with `pki`'s server certificate, client
    /// certificates from `pki`'s CA demanded) and its cluster bus over TLS
    /// (`tls-cluster yes`), so that a TLS client is told the TLS ports. [`url`](Self::url)
    /// names those, as `rediss+cluster://`.
    pub fn start_tls(n: usize, pki: &crate::Pki) -> Option<Self> {
        Self::start_with(n, Some(pki))
    }

    fn start_with(n: usize, pki: Option<&crate::Pki>) -> Option<Self> {
        assert!(n >= 3, "redis-cli --cluster create needs 3 masters");
        let mut tls_ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ]
                .map(str::to_owned)
                .to_vec();
                if let Some(pki) = pki {
                    let port = crate::free_port();
                    tls_ports.push(port);
                    for (flag, value) in [
                        ("--tls-port", port.to_string()),
                        ("--tls-cert-file", pki.server.cert.display().to_string()),
                        ("--tls-key-file", pki.server.key.display().to_string()),
                        (
                            "--tls-client-cert-file",
                            pki.client.cert.display().to_string(),
                        ),
                        (
                            "--tls-client-key-file",
                            pki.client.key.display().to_string(),
                        ),
                        ("--tls-ca-cert-file", pki.ca.display().to_string()),
                        ("--tls-auth-clients", "yes".to_owned()),
                        ("--tls-cluster", "yes".to_owned()),
                    ] {
                        args.push(flag.to_owned());
                        args.push(value);
                    }
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RedisServer::start_with(&args)
            })
            .collect::<Option<_>>()?;
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            while node.cli(&["CLUSTER", "INFO"]).lines().next() != Some("cluster_state:ok") {
                assert!(Instant::now() < deadline, "the Cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(RedisCluster { nodes, tls_ports })
    }

    /// `redis+cluster://127.0.0.1:p1,…` followed by `params`.
    pub fn url(&self, params: &str) -> String {
        if !self.tls_ports.is_empty() {
            let hosts: Vec<String> = self
                .tls_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect();
            return format!("rediss+cluster://{}{params}", hosts.join(","));
        }
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+cluster://{}{params}", hosts.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node that serves `key`'s slot now (`CLUSTER KEYSLOT`, then its own line of
    /// `CLUSTER NODES`).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot number");
        self.nodes
            .iter()
            .find(|n| {
                let id = n.cli(&["CLUSTER", "MYID"]);
                n.cli(&["CLUSTER", "NODES"])
                    .lines()
                    .any(|l| l.starts_with(&id) && owns(l, slot))
            })
            .expect("a node owns the slot")
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
    })
}
