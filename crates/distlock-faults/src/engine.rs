//! The lock engines a scenario runs on: real servers from the test kit, and what the fault
//! injector can do to them.

use std::net::SocketAddr;
use std::time::Duration;

use distlock_testkit::{
    Etcd, MariaDb, Memcached, Postgres, RedisCluster, RedisServer, Sentinels, ZooKeeper,
};

/// Which engine, and how its servers keep data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EngineKind {
    /// One Redis server; `persist`: append-only file with `appendfsync always`.
    Redis { persist: bool },
    /// Redlock over `n` independent masters, without persistence.
    Redlock { n: usize },
    /// One etcd member (its WAL survives a restart).
    Etcd,
    /// One ZooKeeper server.
    ZooKeeper,
    /// One PostgreSQL server.
    Postgres,
    /// One MariaDB server.
    Mysql,
    /// A master, one replica and three sentinels, without persistence; `wait`: the clients
    /// ask one replica to acknowledge every acquisition and renewal (`wait_replicas=1`).
    Sentinel { wait: bool },
    /// A Redis Cluster of three masters with a replica each, without persistence.
    Cluster,
    /// One memcached server with 2 MB of item memory (evictions come soon).
    Memcached,
}

impl EngineKind {
    /// Whether a lock lives in a connection (a database session): a reset connection frees it
    /// on the server at once.
    pub(crate) fn connection_bound(&self) -> bool {
        matches!(self, EngineKind::Postgres | EngineKind::Mysql)
    }

    /// Whether pausing or killing the master fails it over to a replica that may lack the
    /// last writes (asynchronous replication): the locks on it are lost on the server's side.
    pub(crate) fn fails_over_async(&self) -> bool {
        matches!(
            self,
            EngineKind::Sentinel { wait: false } | EngineKind::Cluster
        )
    }

    /// The URL of the servers at `ports` (the proxies' ports for a worker, the servers' own for
    /// the orchestrator), with short timeouts so faults show within a lease.
    pub(crate) fn url(&self, ip: &str, ports: &[u16], ttl: Duration) -> String {
        let hosts: Vec<String> = ports.iter().map(|p| format!("{ip}:{p}")).collect();
        let t = REQUEST_TIMEOUT.as_millis();
        let timeouts = format!("response_timeout={t}ms&connect_timeout={t}ms");
        match *self {
            EngineKind::Redis { .. } => format!("redis://{}?{timeouts}", hosts[0]),
            EngineKind::Redlock { .. } => format!("redlock://{}?{timeouts}", hosts.join(",")),
            EngineKind::Etcd => format!("etcd://{}?{timeouts}", hosts.join(",")),
            EngineKind::ZooKeeper => format!(
                "zk://{}?{timeouts}&session_timeout={}ms",
                hosts.join(","),
                ttl.as_millis()
            ),
            // libpq's connect_timeout is in whole seconds.
            EngineKind::Postgres => {
                format!(
                    "postgres://postgres@{}/postgres?connect_timeout=1&response_timeout={t}ms",
                    hosts[0]
                )
            }
            EngineKind::Mysql => format!("mysql://root@{}/distlock?{timeouts}", hosts[0]),
            EngineKind::Sentinel { wait } => {
                let wait = if wait {
                    format!("&wait_replicas=1&wait_timeout={}ms", t / 2)
                } else {
                    String::new()
                };
                format!(
                    "redis+sentinel://{}/{}?{timeouts}{wait}",
                    hosts.join(","),
                    distlock_testkit::MASTER_NAME
                )
            }
            EngineKind::Cluster => format!("redis+cluster://{}?{timeouts}", hosts.join(",")),
            EngineKind::Memcached => format!("memcached://{}?{timeouts}", hosts[0]),
        }
    }
}

#[derive(Debug)]
enum Servers {
    Redis(Vec<RedisServer>),
    Etcd(Etcd),
    Zk(ZooKeeper),
    Pg(Postgres),
    My(MariaDb),
    /// The Redis servers (the master first, at the start) and their sentinels.
    Sentinel(Vec<RedisServer>, Sentinels),
    Cluster(RedisCluster),
    Mc(Memcached),
}

/// Running servers.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) kind: EngineKind,
    servers: Servers,
    /// For the replicated deployments, whose faults hit "the master" whichever node it is
    /// now: the node that [`pause`](Engine::pause) froze and the one
    /// [`kill`](Engine::kill) killed.
    paused: Option<usize>,
    killed: Option<usize>,
}

/// The harness's lock key on the Redis deployments (the lock is named `k`).
const LOCK_KEY: &str = "distlock:{k}";

/// How long a request waits for its reply (every engine's `response_timeout`, where it has one).
const REQUEST_TIMEOUT: Duration = Duration::from_millis(250);

fn missing(what: &str) -> String {
    format!("{what} is not installed")
}

impl Engine {
    /// Starts the servers (a missing binary is an error under `CI`, as in the tests).
    pub(crate) fn start(kind: EngineKind) -> Result<Engine, String> {
        let servers = match kind {
            EngineKind::Redis { .. } | EngineKind::Redlock { .. } => {
                let (count, args): (usize, &[&str]) = match kind {
                    EngineKind::Redis { persist: true } => {
                        (1, &["--appendonly", "yes", "--appendfsync", "always"])
                    }
                    EngineKind::Redlock { n } => (n, &[]),
                    _ => (1, &[]),
                };
                let mut v = Vec::with_capacity(count);
                for _ in 0..count {
                    v.push(RedisServer::start_with(args).ok_or_else(|| missing("redis-server"))?);
                }
                Servers::Redis(v)
            }
            EngineKind::Etcd => Servers::Etcd(Etcd::start().ok_or_else(|| missing("etcd"))?),
            EngineKind::ZooKeeper => {
                Servers::Zk(ZooKeeper::start().ok_or_else(|| missing("zookeeper"))?)
            }
            EngineKind::Postgres => {
                Servers::Pg(Postgres::start().ok_or_else(|| missing("postgresql"))?)
            }
            EngineKind::Mysql => Servers::My(MariaDb::start().ok_or_else(|| missing("mariadb"))?),
            EngineKind::Sentinel { .. } => {
                let master = RedisServer::start().ok_or_else(|| missing("redis-server"))?;
                let replica =
                    RedisServer::replica_of(&master).ok_or_else(|| missing("redis-server"))?;
                let sentinels =
                    Sentinels::start(3, &master).ok_or_else(|| missing("redis-server"))?;
                Servers::Sentinel(vec![master, replica], sentinels)
            }
            EngineKind::Cluster => Servers::Cluster(
                RedisCluster::start_with_replicas(3, 1).ok_or_else(|| missing("redis-server"))?,
            ),
            EngineKind::Memcached => {
                Servers::Mc(Memcached::start_with_memory(2).ok_or_else(|| missing("memcached"))?)
            }
        };
        Ok(Engine {
            kind,
            servers,
            paused: None,
            killed: None,
        })
    }

    fn ports(&self) -> Vec<u16> {
        match &self.servers {
            Servers::Redis(v) => v.iter().map(RedisServer::port).collect(),
            Servers::Etcd(e) => e.members().iter().map(|m| m.port()).collect(),
            Servers::Zk(z) => z.servers().iter().map(|s| s.port()).collect(),
            Servers::Pg(p) => vec![p.port()],
            Servers::My(m) => vec![m.port()],
            Servers::Sentinel(_, s) => s.ports(),
            Servers::Cluster(c) => c.nodes().iter().map(RedisServer::port).collect(),
            Servers::Mc(m) => vec![m.port()],
        }
    }

    /// The node faults hit now: the master of the lock's slot, or Sentinel's master.
    fn master(&self) -> Option<usize> {
        match &self.servers {
            Servers::Sentinel(nodes, s) => {
                let port = s.master_port()?;
                nodes.iter().position(|n| n.port() == port)
            }
            Servers::Cluster(c) => c.try_index_for(LOCK_KEY),
            _ => None,
        }
        .filter(|&m| self.node(m).is_running())
    }

    /// The servers' addresses, which the proxies forward to.
    pub(crate) fn upstreams(&self) -> Vec<SocketAddr> {
        self.ports()
            .into_iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect()
    }

    /// The URL of the servers themselves.
    pub(crate) fn direct_url(&self, ttl: Duration) -> String {
        self.kind.url("127.0.0.1", &self.ports(), ttl)
    }

    /// Whether the engine hands out fencing tokens.
    pub(crate) fn fenced(&self) -> bool {
        !matches!(
            self.kind,
            EngineKind::Redlock { .. } | EngineKind::Memcached
        )
    }

    /// Whether a restart (or, for the replicated deployments, a fail-over) keeps the locks:
    /// not without persistence, not where a lock lives in a connection the restart ends, not
    /// where the replica may lack the last writes.
    pub(crate) fn persistent(&self) -> bool {
        !matches!(
            self.kind,
            EngineKind::Redis { persist: false }
                | EngineKind::Redlock { .. }
                | EngineKind::Memcached
                | EngineKind::Mysql
        ) && !self.kind.fails_over_async()
    }

    /// Whether the nodes are replicated, so that a fault on the master fails it over.
    pub(crate) fn replicated(&self) -> bool {
        matches!(self.servers, Servers::Sentinel(..) | Servers::Cluster(_))
    }

    /// How long a fail-over takes here, at most: Sentinel's down-after is 500 ms, the
    /// Cluster's node timeout 2 s, each plus an election.
    pub(crate) fn failover_time(&self) -> Duration {
        match self.servers {
            Servers::Cluster(_) => Duration::from_secs(6),
            _ => Duration::from_secs(3),
        }
    }

    /// How long a request waits for its reply.
    pub(crate) fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }

    /// How many servers the faults choose from (one, the master, for the replicated
    /// deployments).
    pub(crate) fn len(&self) -> usize {
        if self.replicated() {
            1
        } else {
            self.ports().len()
        }
    }

    /// Freezes server `i` (SIGSTOP; PostgreSQL: the postmaster, sessions go on; MariaDB: the
    /// whole server, one process; the replicated deployments: the master now). False when
    /// there was nothing to freeze (no master known).
    pub(crate) fn pause(&mut self, i: usize) -> bool {
        match &self.servers {
            Servers::Redis(v) => v[i].pause(),
            Servers::Etcd(e) => e.members()[i].pause(),
            Servers::Zk(z) => z.servers()[i].pause(),
            Servers::Pg(p) => p.pause(),
            Servers::My(m) => m.pause(),
            Servers::Mc(m) => m.pause(),
            Servers::Sentinel(..) | Servers::Cluster(_) => {
                let Some(m) = self.master() else {
                    return false;
                };
                self.node(m).pause();
                self.paused = Some(m);
            }
        }
        true
    }

    /// The replicated deployments: the node the last [`pause`](Self::pause) froze, while it is
    /// frozen.
    pub(crate) fn paused_node(&self) -> Option<usize> {
        self.paused
    }

    /// The replicated deployments, after a pause of their master `was`: whether one master is
    /// left. Either `was` is the master the deployment names (no fail-over), or it answers as
    /// a replica again (demoted after one). While it answers as a master beside the promoted
    /// one, does not answer, or no master is known (a fail-over under way), there may be two.
    pub(crate) fn one_master(&self, was: usize) -> bool {
        match self.master() {
            Some(m) if m == was => true,
            Some(_) => matches!(
                self.node(was).try_cli(&["ROLE"]).lines().next(),
                Some("slave" | "replica")
            ),
            None => false,
        }
    }

    /// Thaws server `i` (the replicated deployments: every node, paused or not).
    pub(crate) fn resume(&mut self, i: usize) {
        match &self.servers {
            Servers::Redis(v) => v[i].resume(),
            Servers::Etcd(e) => e.members()[i].resume(),
            Servers::Zk(z) => z.servers()[i].resume(),
            Servers::Pg(p) => p.resume(),
            Servers::My(m) => m.resume(),
            Servers::Mc(m) => m.resume(),
            Servers::Sentinel(nodes, _) => nodes
                .iter()
                .filter(|n| n.is_running())
                .for_each(RedisServer::resume),
            Servers::Cluster(c) => c
                .nodes()
                .iter()
                .filter(|n| n.is_running())
                .for_each(RedisServer::resume),
        }
        self.paused = None;
    }

    /// Starts again every server a [`kill`](Self::kill) left down: the end of a run that
    /// stopped between a kill and its restart (a control that has already failed) heals as a
    /// finished schedule would.
    pub(crate) fn restart_killed(&mut self) {
        match &mut self.servers {
            Servers::Redis(v) => v
                .iter_mut()
                .filter(|s| !s.is_running())
                .for_each(RedisServer::restart),
            Servers::Etcd(e) => {
                for m in e.members_mut().iter_mut().filter(|m| !m.is_running()) {
                    m.restart();
                }
            }
            Servers::My(m) if !m.is_running() => m.restart(),
            Servers::Mc(m) if !m.is_running() => m.restart(),
            Servers::Sentinel(..) | Servers::Cluster(_) => self.restart(0),
            _ => {}
        }
    }

    /// Whether [`kill`](Self::kill) and [`restart`](Self::restart) are supported.
    pub(crate) fn restartable(&self) -> bool {
        !matches!(self.servers, Servers::Zk(_) | Servers::Pg(_))
    }

    fn node(&self, i: usize) -> &RedisServer {
        match &self.servers {
            Servers::Sentinel(nodes, _) => &nodes[i],
            Servers::Cluster(c) => &c.nodes()[i],
            _ => unreachable!("only the replicated deployments have nodes"),
        }
    }

    fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        match &mut self.servers {
            Servers::Sentinel(nodes, _) => &mut nodes[i],
            Servers::Cluster(c) => c.node_mut(i),
            _ => unreachable!("only the replicated deployments have nodes"),
        }
    }

    /// SIGKILL of server `i` (the replicated deployments: the master now). False when there
    /// was nothing to kill (no master known).
    pub(crate) fn kill(&mut self, i: usize) -> bool {
        match &mut self.servers {
            Servers::Redis(v) => v[i].kill(),
            Servers::Etcd(e) => e.members_mut()[i].kill(),
            Servers::My(m) => m.kill(),
            Servers::Mc(m) => m.kill(),
            Servers::Zk(_) | Servers::Pg(_) => return false,
            Servers::Sentinel(..) | Servers::Cluster(_) => {
                let Some(m) = self.master() else {
                    return false;
                };
                self.node_mut(m).kill();
                self.killed = Some(m);
            }
        }
        true
    }

    /// Starts server `i` again, on the same port and data directory (the replicated
    /// deployments: the node [`kill`](Self::kill) killed, which comes back empty, a replica of
    /// whichever node is master by then).
    pub(crate) fn restart(&mut self, i: usize) {
        match &mut self.servers {
            Servers::Redis(v) => v[i].restart(),
            Servers::Etcd(e) => e.members_mut()[i].restart(),
            Servers::My(m) => m.restart(),
            Servers::Mc(m) => m.restart(),
            Servers::Zk(_) | Servers::Pg(_) => {}
            Servers::Cluster(_) => {
                if let Some(k) = self.killed.take() {
                    self.node_mut(k).restart();
                }
            }
            Servers::Sentinel(nodes, sentinels) => {
                // As an orchestrator does: the node comes back as a replica of the master the
                // sentinels name (else, as a master, it would wait for them to convert it).
                if let Some(k) = self.killed.take() {
                    match sentinels.master_port() {
                        Some(p) if p != nodes[k].port() => nodes[k].restart_as_replica_of(p),
                        _ => nodes[k].restart(),
                    }
                }
            }
        }
    }

    /// The start of a fail-over to a replica that lags: the master's replica is paused and its
    /// link cut, so the master goes on alone. Returns (master, replica), for
    /// [`fail_over_lagging`](Self::fail_over_lagging).
    pub(crate) fn lag_replica(&mut self) -> Option<(usize, usize)> {
        let m = self.master()?;
        let r = match &self.servers {
            Servers::Sentinel(nodes, _) => (0..nodes.len()).find(|&i| i != m)?,
            Servers::Cluster(c) => *c.replicas_of(m).first()?,
            _ => return None,
        };
        self.node(r).pause();
        self.node(m).try_cli(&["CLIENT", "KILL", "TYPE", "replica"]);
        Some((m, r))
    }

    /// The end of it: the master killed, the lagging replica thawed (the deployment promotes
    /// it, without the master's last writes).
    pub(crate) fn fail_over_lagging(&mut self, (m, r): (usize, usize)) {
        self.node_mut(m).kill();
        self.killed = Some(m);
        self.node(r).resume();
    }

    /// memcached: fills the cache with junk of every size near the lock's item, so that the
    /// lock is evicted. False for the other engines.
    pub(crate) fn evict(&self) -> bool {
        let Servers::Mc(m) = &self.servers else {
            return false;
        };
        for size in (40..=200).step_by(8) {
            m.fill(4000, size);
        }
        true
    }

    /// The Redis servers' ports (empty for the other engines), for the audits.
    pub(crate) fn redis_ports(&self) -> Vec<u16> {
        match &self.servers {
            Servers::Redis(v) => v.iter().map(RedisServer::port).collect(),
            _ => Vec::new(),
        }
    }

    /// A forward jump of the server's clock by `by`, as it affects expiry: every lock key's
    /// remaining time shrinks by `by` (keys it brings to zero expire). Debian's redis-server
    /// hangs under libfaketime, so this Lua script stands in for it. Redis only.
    pub(crate) fn clock_jump(&self, by: Duration) {
        let Servers::Redis(servers) = &self.servers else {
            return;
        };
        let script = "local n = 0 \
            for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
              local t = redis.call('PTTL', k) \
              if t > 0 then \
                local left = t - tonumber(ARGV[2]) \
                if left <= 0 then redis.call('DEL', k) else redis.call('PEXPIRE', k, left) end \
                n = n + 1 \
              end \
            end \
            return n";
        let ms = by.as_millis().to_string();
        for s in servers {
            let _ = s.cli(&["EVAL", script, "0", "distlock:{*}", &ms]);
        }
    }
}
