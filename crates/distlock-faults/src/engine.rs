//! The lock engines a scenario runs on: real servers from the test kit, and what the fault
//! injector can do to them.

use std::net::SocketAddr;
use std::time::Duration;

use distlock_testkit::{Etcd, MariaDb, Postgres, RedisServer, ZooKeeper};

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
}

impl EngineKind {
    /// Whether a lock lives in a connection (a database session): a reset connection frees it
    /// on the server at once.
    pub(crate) fn connection_bound(&self) -> bool {
        matches!(self, EngineKind::Postgres | EngineKind::Mysql)
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
}

/// Running servers.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) kind: EngineKind,
    servers: Servers,
}

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
        };
        Ok(Engine { kind, servers })
    }

    fn ports(&self) -> Vec<u16> {
        match &self.servers {
            Servers::Redis(v) => v.iter().map(RedisServer::port).collect(),
            Servers::Etcd(e) => e.members().iter().map(|m| m.port()).collect(),
            Servers::Zk(z) => z.servers().iter().map(|s| s.port()).collect(),
            Servers::Pg(p) => vec![p.port()],
            Servers::My(m) => vec![m.port()],
        }
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
        !matches!(self.kind, EngineKind::Redlock { .. })
    }

    /// Whether a restart keeps the locks.
    pub(crate) fn persistent(&self) -> bool {
        !matches!(
            self.kind,
            EngineKind::Redis { persist: false } | EngineKind::Redlock { .. }
        )
    }

    /// How long a request waits for its reply.
    pub(crate) fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }

    /// How many servers.
    pub(crate) fn len(&self) -> usize {
        self.ports().len()
    }

    /// Freezes server `i` (SIGSTOP; PostgreSQL: the postmaster, sessions go on; MariaDB: the
    /// whole server, one process).
    pub(crate) fn pause(&self, i: usize) {
        match &self.servers {
            Servers::Redis(v) => v[i].pause(),
            Servers::Etcd(e) => e.members()[i].pause(),
            Servers::Zk(z) => z.servers()[i].pause(),
            Servers::Pg(p) => p.pause(),
            Servers::My(m) => m.pause(),
        }
    }

    /// Thaws server `i`.
    pub(crate) fn resume(&self, i: usize) {
        match &self.servers {
            Servers::Redis(v) => v[i].resume(),
            Servers::Etcd(e) => e.members()[i].resume(),
            Servers::Zk(z) => z.servers()[i].resume(),
            Servers::Pg(p) => p.resume(),
            Servers::My(m) => m.resume(),
        }
    }

    /// Whether [`kill`](Self::kill) and [`restart`](Self::restart) are supported.
    pub(crate) fn restartable(&self) -> bool {
        matches!(self.servers, Servers::Redis(_) | Servers::Etcd(_))
    }

    /// SIGKILL of server `i`.
    pub(crate) fn kill(&mut self, i: usize) {
        match &mut self.servers {
            Servers::Redis(v) => v[i].kill(),
            Servers::Etcd(e) => e.members_mut()[i].kill(),
            Servers::Zk(_) | Servers::Pg(_) | Servers::My(_) => {}
        }
    }

    /// Starts server `i` again, on the same port and data directory.
    pub(crate) fn restart(&mut self, i: usize) {
        match &mut self.servers {
            Servers::Redis(v) => v[i].restart(),
            Servers::Etcd(e) => e.members_mut()[i].restart(),
            Servers::Zk(_) | Servers::Pg(_) | Servers::My(_) => {}
        }
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
