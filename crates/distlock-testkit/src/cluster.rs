//! A Redis Cluster for tests: masters only, slots spread by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// `n` (at least 3) cluster-enabled redis-servers on free loopback ports, one master each,
/// the 16384 slots spread over them. Killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts and joins the masters, and waits until every node reports `cluster_state:ok`.
    /// `None` (after printing `SKIP`) when redis-server is missing outside CI.
    pub fn start(n: usize) -> Option<Self> {
        assert!(n >= 3, "redis-cli --cluster create needs 3 masters");
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
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
        Some(RedisCluster { nodes })
    }

    /// `redis+cluster://127.0.0.1:p1,…` followed by `params`.
    pub fn url(&self, params: &str) -> String {
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
