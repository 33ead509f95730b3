//! P6: many held locks kept alive by the watchdog: renewal round trips per tick, and CPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, Breaker, Capabilities, Handover, LeaseCheck,
    LeaseRef, RenewItem, Sessions, WakeSource,
};
use distlock_core::{LockClient, LockError, LockOptions, LockStatus};
use distlock_testkit::RedisServer;

use crate::peers;

/// An engine, counting the watchdog's renewal calls (each one a round trip: a pipelined batch
/// where the engine batches) and the leases they renew.
#[derive(Clone)]
struct Counting<B> {
    inner: B,
    calls: Arc<AtomicU64>,
    renewals: Arc<AtomicU64>,
}

#[distlock_core::engine::async_trait]
impl<B: Backend> Backend for Counting<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        self.inner.inspect(key).await
    }
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        self.inner.batch_renew().map(|_| self as &dyn BatchRenew)
    }
    fn wake_source(&self) -> Option<&dyn WakeSource> {
        self.inner.wake_source()
    }
    fn sessions(&self) -> Option<&dyn Sessions> {
        self.inner.sessions()
    }
    fn handover(&self) -> Option<&dyn Handover> {
        self.inner.handover()
    }
    fn breaker(&self) -> Option<&dyn Breaker> {
        self.inner.breaker()
    }
}

#[distlock_core::engine::async_trait]
impl<B: Backend> BatchRenew for Counting<B> {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.renewals
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        match self.inner.batch_renew() {
            Some(batch) => batch.renew_many(items).await,
            None => Vec::new(),
        }
    }
}

/// One P6 row.
pub(crate) struct Row {
    pub(crate) engine: &'static str,
    pub(crate) client: String,
    pub(crate) result: Result<Figures, peers::Figure>,
}

pub(crate) struct Figures {
    pub(crate) held_after: usize,
    /// Renewal round trips (calls to the server that renew) per tick of TTL/3.
    pub(crate) trips_per_tick: Option<f64>,
    /// Server requests per tick of TTL/3, for all the locks (Redis: commands; etcd: gRPC
    /// messages; ZooKeeper: packets).
    pub(crate) requests_per_tick: f64,
    /// The same per renewal of one lock.
    pub(crate) requests_per_renewal: f64,
    /// Client CPU, in % of one core, while the locks are held.
    pub(crate) client_cpu_pct: f64,
    /// The server's CPU, in % of one core.
    pub(crate) server_cpu_pct: f64,
    /// What else the server counted, for the note under the table.
    pub(crate) note: Option<String>,
}

fn process_cpu() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(u.user_time()) + tv(u.system_time())
}

fn server_cpu(server: &RedisServer) -> f64 {
    let info = server.cli(&["INFO", "cpu"]);
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|k| info.lines().find_map(|l| l.strip_prefix(k)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// What the server says about itself: its CPU seconds, the requests it has served, and for
/// etcd the keep-alive streams opened and the keep-alive messages received.
struct ServerReading {
    cpu_s: f64,
    requests: f64,
    streams: Option<(f64, f64)>,
}

/// The server of a P6 run.
pub(crate) enum P6Server<'a> {
    Redis(&'a RedisServer),
    Etcd(&'a distlock_testkit::Etcd),
    ZooKeeper(&'a distlock_testkit::ZooKeeper),
    Postgres(&'a distlock_testkit::Postgres, distlock_postgres::PgBackend),
    Mysql(&'a distlock_testkit::MariaDb),
}

impl P6Server<'_> {
    fn read(&self) -> ServerReading {
        match self {
            P6Server::Redis(server) => ServerReading {
                cpu_s: server_cpu(server),
                requests: crate::p2::total_calls(server) as f64,
                streams: None,
            },
            P6Server::Etcd(etcd) => {
                let member = &etcd.members()[0];
                let metrics = http_get(member.port(), "/metrics");
                let sum = |name: &str, filter: &str| -> f64 {
                    metrics
                        .lines()
                        .filter(|l| l.starts_with(name) && l.contains(filter))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum()
                };
                ServerReading {
                    cpu_s: member.cpu_seconds(),
                    // Unary calls handled, plus messages received on streams.
                    requests: sum("grpc_server_handled_total", "grpc_type=\"unary\"")
                        + sum("grpc_server_msg_received_total", "_stream\""),
                    streams: Some((
                        sum("grpc_server_started_total", "LeaseKeepAlive"),
                        sum("grpc_server_msg_received_total", "LeaseKeepAlive"),
                    )),
                }
            }
            // The keep-alive statements the client sent: PostgreSQL's own statistics lag by up
            // to PGSTAT_IDLE_INTERVAL (10 s) for sessions that are mostly idle.
            P6Server::Postgres(pg, backend) => ServerReading {
                cpu_s: pg.cpu_seconds(),
                requests: backend.keepalives() as f64,
                streams: None,
            },
            // Statements the clients sent.
            P6Server::Mysql(db) => ServerReading {
                cpu_s: db.cpu_seconds(),
                requests: db
                    .sql("SHOW GLOBAL STATUS LIKE 'Questions'")
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0),
                streams: None,
            },
            P6Server::ZooKeeper(zk) => {
                let server = &zk.servers()[0];
                let mntr = server.four_letter("mntr");
                let received = mntr
                    .lines()
                    .find_map(|l| l.strip_prefix("zk_packets_received"))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
                ServerReading {
                    cpu_s: server.cpu_seconds(),
                    requests: received,
                    streams: None,
                }
            }
        }
    }
}

impl P6Server<'_> {
    /// The requests the server has served so far, as P8 counts them: as [`read`](Self::read)'s, but for
    /// PostgreSQL the transactions committed in every database (each statement of a client
    /// outside a transaction is one), which its statistics report up to 10 s late (see
    /// [`settle`](Self::settle)).
    pub(crate) fn requests(&self) -> f64 {
        match self {
            P6Server::Postgres(pg, _) => pg
                .psql("SELECT sum(xact_commit) FROM pg_stat_database")
                .trim()
                .parse()
                .unwrap_or(0.0),
            _ => self.read().requests,
        }
    }

    /// How long after the last request [`requests`](Self::requests) counts it.
    pub(crate) fn settle(&self) -> Duration {
        match self {
            P6Server::Postgres(..) => Duration::from_secs(11),
            _ => Duration::ZERO,
        }
    }

    /// What [`requests`](Self::requests) counts.
    pub(crate) fn unit(&self) -> &'static str {
        match self {
            P6Server::Redis(_) => "Redis commands (INFO commandstats)",
            P6Server::Etcd(_) => "etcd gRPC calls and stream messages (/metrics)",
            P6Server::ZooKeeper(_) => "ZooKeeper packets received (mntr)",
            P6Server::Postgres(..) => "PostgreSQL transactions committed (pg_stat_database)",
            P6Server::Mysql(_) => "MariaDB statements received (Questions)",
        }
    }
}

impl P6Server<'_> {
    /// For the database engines: how many of the `n` locks the server holds, and on how many
    /// client connections (not counting the one asking).
    fn held_and_connections(&self, n: usize) -> Option<(u64, u64)> {
        let num = |s: String| s.trim().parse::<u64>().unwrap_or(0);
        match self {
            P6Server::Postgres(pg, _) => Some((
                num(pg
                    .psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")),
                num(pg.psql(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )),
            )),
            P6Server::Mysql(db) => Some((
                num(db.sql(&format!(
                    "SELECT COUNT(IS_USED_LOCK(CONCAT('dl:p6-', seq))) \
                     FROM distlock.seq_0_to_{}",
                    n.saturating_sub(1)
                ))),
                num(db.sql(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' \
                     AND USER <> 'system user'",
                )),
            )),
            _ => None,
        }
    }
}

/// A plain HTTP/1.0 GET on loopback (etcd's metrics): the body.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned())
}

/// distlock: `n` locks on one client of `backend`, held for `window`, renewed by the watchdog
/// every TTL/3.
pub(crate) fn ours<B: Backend + Clone>(
    rt: &tokio::runtime::Runtime,
    server: P6Server<'_>,
    backend: B,
    n: usize,
    ttl: Duration,
    window: Duration,
) -> Row {
    let calls = Arc::new(AtomicU64::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let engine = backend.name();
    let batched = backend.batch_renew().is_some();
    let result = rt.block_on(async {
        let backend = Counting {
            inner: backend,
            calls: calls.clone(),
            renewals: renewals.clone(),
        };
        let options = LockOptions::builder().ttl(ttl).build().expect("options");
        let client = LockClient::builder(backend).options(options).build();
        let keys: Vec<String> = (0..n).map(|i| format!("p6-{i}")).collect();
        let at_start = server.read();
        let mut guards = Vec::with_capacity(n);
        for chunk in keys.chunks(500) {
            let got =
                futures_util::future::join_all(chunk.iter().map(|k| client.try_acquire(k))).await;
            for g in got {
                guards.push(g.expect("acquire").expect("a free key"));
            }
        }
        // Settle one tick, then measure.
        tokio::time::sleep(ttl / 3).await;
        let (c0, r0) = (
            calls.load(Ordering::Relaxed),
            renewals.load(Ordering::Relaxed),
        );
        let (before, cpu0, t0) = (server.read(), process_cpu(), Instant::now());
        tokio::time::sleep(window).await;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = process_cpu() - cpu0;
        let after = server.read();
        let on_server = server.held_and_connections(n);
        let (c, r) = (
            calls.load(Ordering::Relaxed) - c0,
            renewals.load(Ordering::Relaxed) - r0,
        );
        let held_after = guards.iter().filter(|g| g.is_held()).count();
        futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await;
        let ticks = secs / (ttl.as_secs_f64() / 3.0);
        // The readings themselves (Redis: INFO twice and the counter read) are not renewals.
        let probes = match server {
            P6Server::Redis(_) => 3.0,
            // The `Questions` read counts itself.
            P6Server::Mysql(_) => 1.0,
            _ => 0.0,
        };
        let note = match (at_start.streams, before.streams, after.streams) {
            _ if on_server.is_some() => on_server.map(|(held, connections)| {
                format!(
                    "{engine}: at the end of the window the server held {held} of the {n} \
                     locks, on {connections} client connection(s)"
                )
            }),
            (Some((s0, _)), Some((_, m0)), Some((s1, m1))) => Some(format!(
                "{engine}: {} keep-alive stream(s) opened from the first acquire to the end of \
                 the window, and {} keep-alive messages received in the window ({:.1} per \
                 tick), for {n} locks",
                s1 - s0,
                m1 - m0,
                (m1 - m0) / ticks
            )),
            _ => None,
        };
        let requests = (after.requests - before.requests - probes).max(0.0);
        Figures {
            held_after,
            trips_per_tick: Some(c as f64 / ticks),
            requests_per_tick: requests / ticks,
            requests_per_renewal: requests / r.max(1) as f64,
            client_cpu_pct: cpu / secs * 100.0,
            server_cpu_pct: (after.cpu_s - before.cpu_s) / secs * 100.0,
            note,
        }
    });
    Row {
        engine,
        client: if batched {
            "distlock (watchdog, batched renewals)".into()
        } else {
            "distlock (watchdog)".into()
        },
        result: Ok(result),
    }
}

/// A peer's own automatic renewal of `n` locks, where it has one. The server's counters are
/// read when the peer says its locks are all held and when its window ends (before it
/// releases them).
pub(crate) fn peer(
    server: &RedisServer,
    peer: &peers::Peer,
    n: usize,
    ttl: Duration,
    window: Duration,
) -> Row {
    let mut at_ready = None;
    let result = peer
        .renew(&server.url(), n, window, ttl, || {
            at_ready = Some((crate::p2::total_calls(server), server_cpu(server)));
        })
        .map(|(held, cpu_s, secs)| {
            let (cmd0, scpu0) = at_ready.unwrap_or((0, 0.0));
            let scpu = server_cpu(server) - scpu0;
            let cmds = crate::p2::total_calls(server).saturating_sub(cmd0 + 3);
            let ticks = secs / (ttl.as_secs_f64() / 3.0);
            Figures {
                held_after: held,
                trips_per_tick: None,
                requests_per_tick: cmds as f64 / ticks.max(f64::MIN_POSITIVE),
                requests_per_renewal: cmds as f64 / (n as f64 * ticks).max(1.0),
                client_cpu_pct: cpu_s / secs * 100.0,
                server_cpu_pct: scpu / secs * 100.0,
                note: None,
            }
        });
    Row {
        engine: "redis",
        client: peer.name.clone(),
        result,
    }
}
