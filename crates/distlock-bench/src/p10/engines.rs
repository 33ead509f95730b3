//! The servers of P10, started one after another, each pinned with its clients.

use std::time::Duration;

use distlock_testkit::{Etcd, MariaDb, Memcached, Postgres, RedisServer, ZooKeeper};

use super::{Row, Server, cpu_of, measure, rss_of};

/// PostgreSQL's shared lock table holds `max_locks_per_transaction × (max_connections +
/// max_prepared_transactions)` locks for every session together (6,400 as it comes, see
/// bench/pg_lock_table.sh): room for 200,000 here.
const PG_LOCKS_PER_TRANSACTION: u32 = 2048;

/// Runs every size on every engine named in `only` (all when empty): redis, etcd, zookeeper,
/// postgres, mariadb, memcached.
pub(crate) fn run(sizes: &[usize], pin: bool, only: &[String], ttl: Duration) -> Vec<Row> {
    let mut rows = Vec::new();
    each(pin, only, |server| {
        for &n in sizes {
            let row = measure(&server, n, pin, ttl);
            eprintln!("p10: {} N={n}: {}", row.engine, row.client);
            rows.push(row);
        }
    });
    rows
}

/// Starts each server named in `only` (all when empty), one after another, and hands it to
/// `each` (pinned to CPU 0 first when `pin`); each stops when `each` returns.
pub(crate) fn each(pin: bool, only: &[String], mut each: impl FnMut(Server<'_>)) {
    let on = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    if on("redis")
        && let Some(s) = RedisServer::start()
    {
        if pin {
            s.pin_to_cpu(0);
        }
        let pid = s.process_id();
        each(Server {
            engine: "Redis",
            url: s.url(),
            memory: Box::new(move || rss_of(pid)),
            cpu: Box::new(move || cpu_of(pid)),
        });
    }
    if on("etcd")
        && let Some(e) = Etcd::start()
    {
        if pin {
            e.members()[0].pin_to_cpu(0);
        }
        each(Server {
            engine: "etcd",
            url: e.url(""),
            memory: Box::new(|| e.members()[0].memory_bytes()),
            cpu: Box::new(|| e.members()[0].cpu_seconds()),
        });
    }
    if on("zookeeper")
        && let Some(z) = ZooKeeper::start()
    {
        if pin {
            z.servers()[0].pin_to_cpu(0);
        }
        each(Server {
            engine: "ZooKeeper",
            url: z.url(""),
            memory: Box::new(|| z.servers()[0].memory_bytes()),
            cpu: Box::new(|| z.servers()[0].cpu_seconds()),
        });
    }
    if on("postgres")
        && let Some(mut p) = Postgres::start()
    {
        p.psql(&format!(
            "ALTER SYSTEM SET max_locks_per_transaction = {PG_LOCKS_PER_TRANSACTION}"
        ));
        p.restart();
        if pin {
            p.pin_to_cpu(0);
        }
        each(Server {
            engine: "PostgreSQL",
            url: p.url(""),
            memory: Box::new(|| p.memory_bytes()),
            cpu: Box::new(|| p.cpu_seconds()),
        });
    }
    if on("mariadb")
        && let Some(m) = MariaDb::start()
    {
        if pin {
            m.pin_to_cpu(0);
        }
        each(Server {
            engine: "MariaDB",
            url: m.url(""),
            memory: Box::new(|| m.memory_bytes()),
            cpu: Box::new(|| m.cpu_seconds()),
        });
    }
    if on("memcached")
        && let Some(m) = Memcached::start()
    {
        if pin {
            m.pin_to_cpu(0);
        }
        each(Server {
            engine: "memcached",
            url: m.url(""),
            memory: Box::new(|| m.memory_bytes()),
            cpu: Box::new(|| m.cpu_seconds()),
        });
    }
}
