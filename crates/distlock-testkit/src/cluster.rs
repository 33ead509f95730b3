//! A Redis Cluster for tests: slots spread over the masters by `redis-cli --cluster create`,
//! with replicas when asked (for fail-overs).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// `n` (at least 3) cluster-enabled redis-servers on free loopback ports, one master each,
/// the 16384 slots spread over them. Killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's `CLUSTER MYID`, read once when the cluster was ready.
    ids: Vec<String>,
    /// The nodes' TLS ports, for a Cluster from `start_tls`.
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts and joins the masters, and waits until every node reports `cluster_state:ok`.
    /// `None` (after printing `SKIP`) when redis-server is missing outside CI.
    pub fn start(n: usize) -> Option<Self> {
        Self::start_with(n, 0, None)
    }

    /// `masters` masters, each with `replicas` replicas (`--cluster-replicas`), for fail-overs:
    /// a master unanswered for the node timeout (2 s) is replaced by one of its replicas. Waits
    /// until every replica's link to its master is up.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Option<Self> {
        Self::start_with(masters, replicas, None)
    }

    /// The same, each node also taking TLS clients (with `pki`'s server certificate, client
    /// certificates from `pki`'s CA demanded) and its cluster bus over TLS
    /// (`tls-cluster yes`), so that a TLS client is told the TLS ports. [`url`](Self::url)
    /// names those, as `rediss+cluster://`.
    pub fn start_tls(n: usize, pki: &crate::Pki) -> Option<Self> {
        Self::start_with(n, 0, Some(pki))
    }

    fn start_with(masters: usize, replicas: usize, pki: Option<&crate::Pki>) -> Option<Self> {
        assert!(masters >= 3, "redis-cli --cluster create needs 3 masters");
        let n = masters * (1 + replicas);
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
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            while node.cli(&["CLUSTER", "INFO"]).lines().next() != Some("cluster_state:ok") {
                assert!(Instant::now() < deadline, "the Cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for node in &nodes {
            while node.info("role") == "slave" && node.info("master_link_status") != "up" {
                assert!(
                    Instant::now() < deadline,
                    "a replica of the Cluster never synced"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let ids = nodes.iter().map(|n| n.cli(&["CLUSTER", "MYID"])).collect();
        Some(RedisCluster {
            nodes,
            ids,
            tls_ports,
        })
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

    /// Node `i`, to kill, pause or restart it.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// `CLUSTER NODES` as a running node reports it (the first that answers).
    fn nodes_view(&self) -> Option<String> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.try_cli(&["CLUSTER", "NODES"]))
            .find(|v| !v.is_empty())
    }

    /// The node that serves `key`'s slot now (`CLUSTER KEYSLOT`, then `CLUSTER NODES` as a
    /// running node sees it).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        &self.nodes[self.index_for(key)]
    }

    /// The index in [`nodes`](Self::nodes) of the node that serves `key`'s slot now.
    ///
    /// # Panics
    /// While no live master serves it (during a fail-over).
    pub fn index_for(&self, key: &str) -> usize {
        self.try_index_for(key)
            .unwrap_or_else(|| panic!("no live master serves {key:?}"))
    }

    /// The same, or `None` while no live master serves it (during a fail-over).
    pub fn try_index_for(&self, key: &str) -> Option<usize> {
        let running = self.nodes.iter().find(|n| n.is_running())?;
        let slot: u16 = running.try_cli(&["CLUSTER", "KEYSLOT", key]).parse().ok()?;
        let view = self.nodes_view()?;
        let id = view
            .lines()
            .find(|l| l.contains("master") && !l.contains("fail") && owns(l, slot))
            .and_then(|l| l.split_whitespace().next())?;
        self.ids.iter().position(|i| i == id)
    }

    /// The indexes of the replicas of node `master`.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let id = &self.ids[master];
        self.nodes_view()
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 3 && f[2].contains("slave") && f[3] == id).then(|| self.index_of(f[0]))
            })
            .collect()
    }

    fn index_of(&self, id: &str) -> usize {
        self.ids
            .iter()
            .position(|i| i == id)
            .expect("a node of this Cluster")
    }

    /// Waits until node `i` is a master and the Cluster is whole again (a fail-over to it
    /// finished); panics after `limit`.
    pub fn wait_for_promotion(&self, i: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let node = &self.nodes[i];
        while !(node.info("role") == "master"
            && node.try_cli(&["CLUSTER", "INFO"]).lines().next() == Some("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "node {i} was not promoted within {limit:?}: {}",
                self.nodes_view().unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
    })
}
