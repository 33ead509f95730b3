//! `distlock-bench`: distlock on Redis against the raw redis-rs floor, in the same run.
//!
//! It starts its own redis-server on a free loopback port and, unless `--no-pin`, pins the
//! server and every client process to CPU 0 (`taskset`/`sched_setaffinity`): on a small VM
//! whose idle CPU halts, unpinned single-client latency is bimodal.
//!
//! - P1: uncontended acquire+release cycles/s of one client, next to raw redis-rs
//!   (`SET NX PX` + `EVALSHA` compare-and-delete, sync and async), rounds interleaved, medians.
//! - P2/P3: one hot key, 1, 8 and 64 waiters spread over processes, zero hold time:
//!   acquisitions/s, fairness (min/max acquisitions per process), Redis commands per acquisition
//!   (counted by the clients, `RedisBackend::commands_sent`: each command of a pipeline counts;
//!   `INFO commandstats` cannot tell a top-level `SET` from one inside a script), and hand-off
//!   latency (release sent -> next holder acquired, where that holder was already waiting), in
//!   microseconds and in round trips (PING median of the same run). Once with distlock's
//!   defaults (events + local queue), once polling-only (no events, no local queue), and once
//!   with local hand-off.
//! - P3 unloaded: two processes, one task each, taking turns with 3 ms holds and 0.3 ms pauses:
//!   release sent -> the other process acquired, when nothing else wants the CPU, in round
//!   trips of a PING sent after a 2 ms pause (and of a back-to-back one); next to the raw floor
//!   of the same run: two blocking redis-rs clients, one sending what a distlock release sends
//!   (a `PING`, then the release script by SHA) 3 ms after queueing the other, which only
//!   subscribes and reads (release sent -> message read). Five rounds, each with its own idle
//!   round trip, both modes and the raw floor, interleaved; ratios to the round's own unit,
//!   medians over rounds, and the worst round.
//!
//! This is a benchmark, not a test: it prints a table (and `--json`), it asserts nothing.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::{RedisBackend, RedlockBackend};
use distlock_testkit::RedisServer;
use tokio::io::AsyncBufReadExt;

mod p6;
mod peers;

#[derive(Parser, Debug)]
#[command(about = "distlock benchmarks against the raw redis-rs floor (prints a table)")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// A smoke run: tiny numbers, one round (what CI runs so the harness cannot rot).
    #[arg(long)]
    quick: bool,
    /// Interleaved rounds of P1; the table shows medians.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Acquire+release cycles per P1 round.
    #[arg(long, default_value_t = 2000)]
    cycles: usize,
    /// Length of each contention run, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    millis: u64,
    /// Do not pin the server and the clients to CPU 0.
    #[arg(long)]
    no_pin: bool,
    /// Runtime threads of each contending process (1: tokio's current-thread runtime; more: the
    /// multi-thread runtime). With every process pinned to one CPU, extra threads only add
    /// thread hand-overs.
    #[arg(long, default_value_t = 1)]
    worker_threads: usize,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The folder of installed peers (bench/peers/README.md; bench/run.sh installs them): adds
    /// their rows to P1, P2 and P4, run in the same rounds.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// Also write the report (the tables, with the machine, pinning mode and date) as Markdown
    /// to this file, for example docs/benchmarks.md.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Masters of the P4 Redlock runs.
    #[arg(long, default_value_t = 5)]
    masters: usize,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Internal: one contending process.
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        url: String,
        #[arg(long)]
        tasks: usize,
        #[arg(long)]
        start_ns: u64,
        #[arg(long)]
        millis: u64,
        #[arg(long)]
        mode: Mode,
        #[arg(long)]
        threads: usize,
        /// How long each holder keeps the lock, in microseconds.
        #[arg(long, default_value_t = 0)]
        hold_us: u64,
        /// How long each task pauses after a release before it asks again, in microseconds.
        #[arg(long, default_value_t = 0)]
        gap_us: u64,
    },
    /// Internal: uncontended Redlock cycles over the masters given (for profiling P4 alone);
    /// prints cycles per second.
    #[command(hide = true)]
    RedlockCycles {
        #[arg(long)]
        cycles: usize,
        urls: Vec<String>,
    },
    /// Internal: the raw floor's waiting client (a bare subscriber).
    #[command(hide = true)]
    RawWaiter {
        #[arg(long)]
        url: String,
        #[arg(long)]
        count: usize,
    },
    /// Internal: the raw floor's releasing client.
    #[command(hide = true)]
    RawHolder {
        #[arg(long)]
        url: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        start_ns: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// distlock's defaults: release events and the local queue.
    Events,
    /// No events, no local queue: every task polls with jittered back-off.
    Polling,
    /// Defaults plus local hand-off.
    Handoff,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Events => "events",
            Mode::Polling => "polling",
            Mode::Handoff => "handoff",
        }
    }
}

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn pin_self(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu index");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("pin to a CPU");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

fn floor_sync(conn: &mut redis::Connection, script: &redis::Script, cycles: usize) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let ok: Option<String> = redis::cmd("SET")
            .arg("raw:sync")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(conn)
            .expect("SET");
        assert!(ok.is_some(), "raw lock busy");
        let _: i64 = script
            .key("raw:sync")
            .arg(&token)
            .invoke(conn)
            .expect("EVALSHA");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

async fn floor_async(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let ok: Option<String> = redis::cmd("SET")
            .arg("raw:async")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(conn)
            .await
            .expect("SET");
        assert!(ok.is_some(), "raw lock busy");
        let _: i64 = script
            .key("raw:async")
            .arg(&token)
            .invoke_async(conn)
            .await
            .expect("EVALSHA");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// Uncontended `try_acquire` + `release` cycles per second of `key`, on any engine.
async fn distlock_cycles<B: distlock_core::Backend>(
    client: &LockClient<B>,
    key: &str,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for _ in 0..cycles {
        let g = client
            .try_acquire(key)
            .await
            .expect("acquire")
            .expect("uncontended");
        assert_eq!(g.release().await.expect("release"), Released::Held);
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

async fn rtt_us(
    conn: &mut redis::aio::MultiplexedConnection,
    n: usize,
    pause: Option<Duration>,
) -> f64 {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
        let t0 = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await.expect("PING");
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    median(v)
}

/// The raw Redlock floor: `SET NX PX` on every master at once, then the release script on every
/// master at once, with redis-rs's multiplexed connections (no quorum logic, no timeouts).
async fn redlock_floor(
    conns: &mut [redis::aio::MultiplexedConnection],
    script: &redis::Script,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let sets = conns.iter_mut().map(|c| {
            let token = &token;
            async move {
                redis::cmd("SET")
                    .arg("raw:redlock")
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(c)
                    .await
                    .expect("SET")
            }
        });
        let granted = futures_util::future::join_all(sets).await;
        assert!(granted.iter().all(Option::is_some), "raw lock busy");
        let releases = conns.iter_mut().map(|c| {
            let token = &token;
            async move {
                script
                    .key("raw:redlock")
                    .arg(token)
                    .invoke_async::<i64>(c)
                    .await
                    .expect("EVALSHA")
            }
        });
        futures_util::future::join_all(releases).await;
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// The median time of one `PING` to every master at once, in µs.
async fn parallel_rtt_us(conns: &mut [redis::aio::MultiplexedConnection], n: usize) -> f64 {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        futures_util::future::join_all(conns.iter_mut().map(|c| async move {
            redis::cmd("PING")
                .query_async::<String>(c)
                .await
                .expect("PING")
        }))
        .await;
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    median(v)
}

/// One P5 row: an engine's uncontended cycle beside its raw client floor.
struct P5Row {
    engine: &'static str,
    floor_name: &'static str,
    floor: f64,
    ours: f64,
}

/// A raw floor and our cycle in interleaved rounds (after a warm-up of each): their medians.
async fn interleaved<B: distlock_core::Backend>(
    ours: &LockClient<B>,
    rounds: usize,
    cycles: usize,
    mut floor: impl AsyncFnMut(usize) -> f64,
) -> (f64, f64) {
    floor(50).await;
    distlock_cycles(ours, "p5", 50).await;
    let (mut f, mut o) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        f.push(floor(cycles).await);
        o.push(distlock_cycles(ours, "p5", cycles).await);
    }
    (median(f), median(o))
}

/// etcd's floor: a create-if-absent transaction and a delete, as bare gRPC calls on one
/// connection (no member fail-over, no leader check, no lease).
async fn etcd_floor(conn: &distlock_etcd::wire::Conn, cycles: usize) -> f64 {
    use distlock_etcd::wire::{Compare, CompareResult, DeleteRangeRequest, RequestOp, TxnRequest};
    let t0 = Instant::now();
    for i in 0..cycles {
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                "raw/lock",
                CompareResult::Equal,
                0,
            )],
            vec![RequestOp::put("raw/lock", format!("t{i}"), 0)],
            vec![],
        );
        let r = conn.txn(txn).await.expect("txn");
        assert!(r.succeeded, "raw lock busy");
        conn.delete_range(DeleteRangeRequest {
            key: b"raw/lock".to_vec(),
            ..Default::default()
        })
        .await
        .expect("delete");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// ZooKeeper's floor: an ephemeral create and a delete, with zookeeper-client.
async fn zk_floor(client: &zookeeper_client::Client, cycles: usize) -> f64 {
    let options =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let t0 = Instant::now();
    for _ in 0..cycles {
        client
            .create("/rawlock", b"x", &options)
            .await
            .expect("create");
        client.delete("/rawlock", None).await.expect("delete");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// P5: etcd and ZooKeeper (started here, pinned like the rest), each beside its raw floor, in
/// interleaved rounds.
fn p5(rt: &tokio::runtime::Runtime, rounds: usize, cycles: usize, pin: bool) -> Vec<P5Row> {
    let mut rows = Vec::new();
    if let Some(etcd) = distlock_testkit::Etcd::start() {
        if pin {
            etcd.members()[0].pin_to_cpu(0);
        }
        let url = etcd.url("");
        rows.push(rt.block_on(async {
            let endpoint = format!("http://127.0.0.1:{}", etcd.members()[0].port());
            let raw = distlock_etcd::wire::Conn::lazy(
                endpoint.parse().expect("an endpoint"),
                Duration::from_secs(3),
                false,
                None,
            );
            let ours = LockClient::new(
                distlock_etcd::EtcdBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| etcd_floor(&raw, n).await).await;
            P5Row {
                engine: "etcd 3.4 (data on tmpfs)",
                floor_name: "raw gRPC txn create-if-absent + delete",
                floor,
                ours,
            }
        }));
    }
    if let Some(zk) = distlock_testkit::ZooKeeper::start() {
        if pin {
            zk.servers()[0].pin_to_cpu(0);
        }
        let url = zk.url("");
        rows.push(rt.block_on(async {
            let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
                .await
                .expect("connect");
            let ours = LockClient::new(
                distlock_zookeeper::ZkBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| zk_floor(&raw, n).await).await;
            P5Row {
                engine: "ZooKeeper 3.8",
                floor_name: "zookeeper-client ephemeral create + delete",
                floor,
                ours,
            }
        }));
    }
    if let Some(pg) = distlock_testkit::Postgres::start() {
        if pin {
            pg.pin_to_cpu(0);
        }
        let url = pg.url("");
        rows.push(rt.block_on(async {
            let (raw, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let lock = raw
                .prepare("SELECT pg_try_advisory_lock($1)")
                .await
                .expect("prepare");
            let unlock = raw
                .prepare("SELECT pg_advisory_unlock($1)")
                .await
                .expect("prepare");
            let floor = |n: usize| {
                let (raw, lock, unlock) = (&raw, &lock, &unlock);
                async move {
                    let t0 = Instant::now();
                    for _ in 0..n {
                        let got: bool = raw.query_one(lock, &[&42i64]).await.expect("lock").get(0);
                        assert!(got, "raw lock busy");
                        raw.query_one(unlock, &[&42i64]).await.expect("unlock");
                    }
                    n as f64 / t0.elapsed().as_secs_f64()
                }
            };
            let ours = LockClient::new(
                distlock_postgres::PgBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) = interleaved(&ours, rounds, cycles, async |n| floor(n).await).await;
            P5Row {
                engine: "PostgreSQL 15 (data on tmpfs)",
                floor_name: "tokio-postgres pg_try_advisory_lock + pg_advisory_unlock",
                floor,
                ours,
            }
        }));
    }
    if let Some(db) = distlock_testkit::MariaDb::start() {
        if pin {
            db.pin_to_cpu(0);
        }
        let url = db.url("");
        rows.push(rt.block_on(async {
            use mysql_async::prelude::Queryable;
            let mut raw = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).expect("url"))
                .await
                .expect("connect");
            async fn floor(raw: &mut mysql_async::Conn, n: usize) -> f64 {
                use mysql_async::prelude::Queryable;
                let t0 = Instant::now();
                for _ in 0..n {
                    let got: Option<i64> = raw
                        .query_first("SELECT GET_LOCK('raw', 0)")
                        .await
                        .expect("GET_LOCK");
                    assert_eq!(got, Some(1), "raw lock busy");
                    raw.query_drop("SELECT RELEASE_LOCK('raw')")
                        .await
                        .expect("RELEASE_LOCK");
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
            raw.query_drop("DO 1").await.expect("ping");
            let ours = LockClient::new(
                distlock_mysql::MysqlBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| floor(&mut raw, n).await).await;
            P5Row {
                engine: "MariaDB 10.11 (data on tmpfs)",
                floor_name: "mysql_async GET_LOCK + RELEASE_LOCK",
                floor,
                ours,
            }
        }));
    }
    if let Some(mc) = distlock_testkit::Memcached::start() {
        if pin {
            mc.pin_to_cpu(0);
        }
        let url = mc.url("");
        rows.push(rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", mc.port()))
                .await
                .expect("connect");
            raw.set_nodelay(true).expect("nodelay");
            async fn floor(raw: &mut tokio::net::TcpStream, n: usize) -> f64 {
                let mut buf = [0u8; 64];
                let t0 = Instant::now();
                for _ in 0..n {
                    raw.write_all(b"add raw 0 30 1\r\nx\r\n")
                        .await
                        .expect("add");
                    let k = raw.read(&mut buf).await.expect("add reply");
                    assert!(buf[..k].starts_with(b"STORED"), "raw lock busy");
                    raw.write_all(b"delete raw\r\n").await.expect("delete");
                    let k = raw.read(&mut buf).await.expect("delete reply");
                    assert!(buf[..k].starts_with(b"DELETED"), "raw delete failed");
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
            let ours = LockClient::new(
                distlock_memcached::MemcachedBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| floor(&mut raw, n).await).await;
            P5Row {
                engine: "memcached 1.6",
                floor_name: "raw TCP add + delete",
                floor,
                ours,
            }
        }));
    }
    rows
}

/// P4's figures: medians over interleaved rounds.
struct P4 {
    masters: usize,
    floor: f64,
    ours: f64,
    peers: Vec<peers::Figure>,
    parallel_rtt_us: f64,
}

/// P4: uncontended Redlock cycles over `n` masters (started here, pinned like the rest), the
/// raw parallel floor, and the peers, in interleaved rounds.
fn p4(
    rt: &tokio::runtime::Runtime,
    n: usize,
    rounds: usize,
    cycles: usize,
    pin: bool,
    peer_list: &[peers::Peer],
) -> P4 {
    let masters: Vec<RedisServer> = (0..n)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    if pin {
        for m in &masters {
            m.pin_to_cpu(0);
        }
    }
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let redlock_url = format!(
        "redlock://{}",
        masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    rt.block_on(async {
        let mut conns = Vec::new();
        for u in &urls {
            let c = redis::Client::open(u.as_str()).expect("client");
            conns.push(c.get_multiplexed_async_connection().await.expect("connect"));
        }
        let script = redis::Script::new(RELEASE_LUA);
        let ours = LockClient::new(
            RedlockBackend::connect(&redlock_url)
                .await
                .expect("connect to the masters"),
        );
        redlock_floor(&mut conns, &script, 50).await;
        distlock_cycles(&ours, "p4", 50).await;
        let (mut f, mut o) = (Vec::new(), Vec::new());
        let mut r: Vec<Vec<peers::Figure>> = vec![Vec::new(); peer_list.len()];
        for _ in 0..rounds {
            f.push(redlock_floor(&mut conns, &script, cycles).await);
            o.push(distlock_cycles(&ours, "p4", cycles).await);
            for (i, peer) in peer_list.iter().enumerate() {
                r[i].push(peer.cycles(cycles, &urls));
            }
        }
        P4 {
            masters: n,
            floor: median(f),
            ours: median(o),
            peers: r.iter().map(|v| peers::median_figure(v)).collect(),
            parallel_rtt_us: parallel_rtt_us(&mut conns, 1000).await,
        }
    })
}

fn options(mode: Mode) -> LockOptions {
    let b = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30));
    match mode {
        Mode::Events => b,
        Mode::Polling => b.events(false),
        Mode::Handoff => b.handoff(true),
    }
    .build()
    .expect("options")
}

/// One contending process: `tasks` tasks take the hot key in a loop until the stop time, and
/// print `[fence, acquired_ns, release_sent_ns]` for every acquisition as one JSON line.
async fn worker(
    url: String,
    tasks: usize,
    start_ns: u64,
    millis: u64,
    mode: Mode,
    (hold_us, gap_us): (u64, u64),
) {
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let client = LockClient::builder(backend)
        .options(options(mode))
        .local_queue(mode != Mode::Polling)
        .build();
    let now = mono_ns();
    if start_ns > now {
        tokio::time::sleep(Duration::from_nanos(start_ns - now)).await;
    }
    let stop = start_ns + millis * 1_000_000;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let c = client.clone();
        handles.push(tokio::spawn(async move {
            let mut events = Vec::new();
            while mono_ns() < stop {
                let called = mono_ns();
                let g = c.acquire("hot").await.expect("acquire");
                let acquired = mono_ns();
                if hold_us > 0 && gap_us > 0 {
                    // P3: tokio's whole-millisecond timer, on purpose (see its comment).
                    tokio::time::sleep(Duration::from_micros(hold_us)).await;
                } else if hold_us > 0 {
                    // P2's hold, as precise as the peers' (a thread's sleep): tokio's timer
                    // would round 1 ms up to nearly 2.
                    let hold = Duration::from_micros(hold_us);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(hold)).await;
                }
                let fence = g.fence().unwrap_or(0);
                let sent = mono_ns();
                let _ = g.release().await.expect("release");
                events.push([fence, acquired, sent, called]);
                if gap_us > 0 {
                    tokio::time::sleep(Duration::from_micros(gap_us)).await;
                }
            }
            events
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    let commands = client.backend().commands_sent();
    println!(
        "{}",
        serde_json::json!({ "events": all, "commands": commands })
    );
}

struct Contention {
    mode: Mode,
    waiters: usize,
    hold_us: u64,
    processes: usize,
    per_sec: f64,
    fairness: f64,
    cmds_per_acq: f64,
    calls_per_acq: f64,
    handoff_p50_us: f64,
    handoff_p99_us: f64,
    cross_p50_us: f64,
    cross_p99_us: f64,
    /// Hand-offs counted (none with a single waiter: it never waits for anybody).
    handoffs: u64,
    /// Hand-offs between processes counted.
    cross_count: u64,
}

async fn contention(
    server: &RedisServer,
    mode: Mode,
    waiters: usize,
    millis: u64,
    threads: usize,
    (hold_us, gap_us): (u64, u64),
) -> Contention {
    let processes = waiters.clamp(1, 4);
    let tasks = waiters / processes;
    let exe = std::env::current_exe().expect("own path");
    let calls_before = total_calls(server);
    let start_ns = mono_ns() + 400_000_000;
    let mut children = Vec::new();
    for _ in 0..processes {
        let child = tokio::process::Command::new(&exe)
            .args([
                "worker",
                "--url",
                &server.url(),
                "--tasks",
                &tasks.to_string(),
                "--start-ns",
                &start_ns.to_string(),
                "--millis",
                &millis.to_string(),
                "--mode",
                mode.name(),
                "--threads",
                &threads.to_string(),
                "--hold-us",
                &hold_us.to_string(),
                "--gap-us",
                &gap_us.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a worker");
        children.push(child);
    }
    let mut per_process = Vec::new();
    let mut cmds = 0u64;
    // (fence, acquired, release sent, acquire called, process)
    let mut events: Vec<(u64, u64, u64, u64, usize)> = Vec::new();
    for (p, mut child) in children.into_iter().enumerate() {
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = lines
            .next_line()
            .await
            .expect("read a worker")
            .expect("a worker printed nothing");
        let _ = child.wait().await;
        let v: serde_json::Value = serde_json::from_str(&line).expect("worker JSON");
        cmds += v["commands"].as_u64().unwrap_or(0);
        let evs = v["events"].as_array().expect("events").clone();
        per_process.push(evs.len());
        for e in evs {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            events.push((f(0), f(1), f(2), f(3), p));
        }
    }
    let total = events.len().max(1);
    // Commands per acquisition: as the clients sent them, and as the server counted its calls
    // (INFO commandstats, less our own INFO: the calls a script makes count there too).
    let served = total_calls(server).saturating_sub(calls_before + 1);
    // Hand-off: acquisitions in fence order (acquired time breaks ties of handed-off leases),
    // counted only where the next holder was already waiting when the release began (else it
    // is an uncontended acquire that happened to come next, not a hand-off).
    events.sort_by_key(|e| (e.0, e.1));
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut cross = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for w in events.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if next.1 >= prev.2 && next.3 <= prev.2 {
            let ns = next.1 - prev.2;
            let _ = all.record(ns);
            if next.4 != prev.4 {
                let _ = cross.record(ns);
            }
        }
    }
    let max = per_process.iter().copied().max().unwrap_or(0).max(1);
    let min = per_process.iter().copied().min().unwrap_or(0);
    Contention {
        mode,
        waiters,
        hold_us,
        processes,
        per_sec: total as f64 / (millis as f64 / 1000.0),
        fairness: min as f64 / max as f64,
        cmds_per_acq: cmds as f64 / total as f64,
        calls_per_acq: served as f64 / total as f64,
        handoff_p50_us: all.value_at_quantile(0.5) as f64 / 1000.0,
        handoff_p99_us: all.value_at_quantile(0.99) as f64 / 1000.0,
        cross_p50_us: cross.value_at_quantile(0.5) as f64 / 1000.0,
        cross_p99_us: cross.value_at_quantile(0.99) as f64 / 1000.0,
        handoffs: all.len(),
        cross_count: cross.len(),
    }
}

/// P2 of a peer: its own contending processes on one hot key.
struct PeerContention {
    name: String,
    hold_us: u64,
    result: Result<PeerP2, peers::Figure>,
}

struct PeerP2 {
    per_sec: f64,
    fairness: f64,
    calls_per_acq: f64,
    errors: u64,
}

/// Every command the server has run so far (`INFO commandstats`).
fn total_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn peer_contention(
    server: &RedisServer,
    peer: &peers::Peer,
    (processes, tasks): (usize, usize),
    millis: u64,
    hold_us: u64,
) -> PeerContention {
    let name = peer.name.clone();
    let before = total_calls(server);
    // Interpreters take a while to start: everybody begins together, 2 s from now.
    let start_ns = mono_ns() + 2_000_000_000;
    let deadline = Instant::now() + Duration::from_millis(2000 + millis) + Duration::from_secs(30);
    let mut children = Vec::new();
    let args = [
        server.url(),
        tasks.to_string(),
        start_ns.to_string(),
        millis.to_string(),
        hold_us.to_string(),
    ];
    for _ in 0..processes {
        match peer.start("contend", &args) {
            Ok(c) => children.push(c),
            Err(e) => {
                return PeerContention {
                    name,
                    hold_us,
                    result: Err(peers::Figure::Failed(e.to_string())),
                };
            }
        }
    }
    let mut per_process = Vec::new();
    let mut errors = 0;
    let mut failed = None;
    for c in children {
        match peer.finish(c, deadline) {
            Ok(v) => {
                per_process.push(v["acquisitions"].as_u64().unwrap_or(0));
                errors += v["errors"].as_u64().unwrap_or(0);
            }
            Err(f) => failed = failed.or(Some(f)),
        }
    }
    if let Some(f) = failed {
        return PeerContention {
            name,
            hold_us,
            result: Err(f),
        };
    }
    let calls = total_calls(server).saturating_sub(before + 1);
    let total: u64 = per_process.iter().sum();
    let max = per_process.iter().copied().max().unwrap_or(0).max(1);
    let min = per_process.iter().copied().min().unwrap_or(0);
    PeerContention {
        name,
        hold_us,
        result: Ok(PeerP2 {
            per_sec: total as f64 / (millis as f64 / 1000.0),
            fairness: min as f64 / max as f64,
            calls_per_acq: calls as f64 / total.max(1) as f64,
            errors,
        }),
    }
}

/// A peer's P3: hand-offs counted, p50 and p99 in µs; or why there are none.
type HandoffFigures = Result<(u64, f64, f64), peers::Figure>;

/// P3 of a peer: two of its processes take turns (hold 3 ms, pause 0.3 ms), each waiting its
/// own way; the release → other process acquired times, in µs (count, p50, p99).
fn peer_handoff(server: &RedisServer, peer: &peers::Peer, millis: u64) -> HandoffFigures {
    let start_ns = mono_ns() + 2_000_000_000;
    let deadline = Instant::now() + Duration::from_millis(2000 + millis) + Duration::from_secs(30);
    let args = [
        server.url(),
        "3000".into(),
        "300".into(),
        start_ns.to_string(),
        millis.to_string(),
    ];
    let children: Vec<_> = (0..2)
        .map(|_| peer.start("handoff", &args))
        .collect::<Result<_, _>>()
        .map_err(|e| peers::Figure::Failed(e.to_string()))?;
    // (acquired, release sent, asked, process)
    let mut events: Vec<(u64, u64, u64, usize)> = Vec::new();
    for (p, c) in children.into_iter().enumerate() {
        let v = peer.finish(c, deadline)?;
        for e in v["events"].as_array().into_iter().flatten() {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            events.push((f(0), f(1), f(2), p));
        }
    }
    events.sort_by_key(|e| e.0);
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for w in events.windows(2) {
        let (prev, next) = (w[0], w[1]);
        // A hand-off: the other process was already waiting when this release began.
        if next.3 != prev.3 && next.2 <= prev.1 && next.0 >= prev.1 {
            let _ = h.record(next.0 - prev.1);
        }
    }
    if h.is_empty() {
        return Err(peers::Figure::Failed(
            "no hand-off between the two processes".into(),
        ));
    }
    Ok((
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
    ))
}

/// Interleaved rounds of the unloaded hand-off (P3).
const P3_ROUNDS: usize = 5;

/// One round of P3: its unit, both modes, and the raw floor's p50 (µs).
struct P3Round {
    idle_rtt: f64,
    modes: [Contention; 2],
    raw: f64,
}

/// A P3 line: medians over the rounds, each ratio to its own round's idle round trip.
struct P3Row {
    name: &'static str,
    count: u64,
    p50_us: f64,
    p99_us: f64,
    idle_rtts: f64,
    worst_idle_rtts: f64,
}

impl P3Row {
    /// `pick`: a round's hand-off count, p50 and p99 (µs).
    fn of(
        rounds: &[P3Round],
        name: &'static str,
        pick: impl Fn(&P3Round) -> (u64, f64, f64),
    ) -> P3Row {
        let picked: Vec<(u64, f64, f64, f64)> = rounds
            .iter()
            .map(|r| {
                let (n, p50, p99) = pick(r);
                (n, p50, p99, p50 / r.idle_rtt.max(f64::MIN_POSITIVE))
            })
            .collect();
        P3Row {
            name,
            count: picked.iter().map(|p| p.0).sum(),
            p50_us: median(picked.iter().map(|p| p.1).collect()),
            p99_us: median(picked.iter().map(|p| p.2).collect()),
            idle_rtts: median(picked.iter().map(|p| p.3).collect()),
            worst_idle_rtts: picked.iter().map(|p| p.3).fold(0.0, f64::max),
        }
    }
}

/// The raw floor's lock, its keys and its waiter's channel.
const RAW_KEYS: [&str; 3] = [
    "distlock:{rawbench}",
    "distlock:{rawbench}:meta",
    "distlock:{rawbench}:waiters",
];
const RAW_CHANNEL: &str = "distlock:wake:rawbench";

/// The raw floor's waiter: redis-rs's blocking pub/sub, stamping each message as it is read.
fn raw_waiter(url: &str, count: usize) {
    let client = redis::Client::open(url).expect("client");
    let mut con = client.get_connection().expect("connection");
    let mut ps = con.as_pubsub();
    ps.subscribe(RAW_CHANNEL).expect("subscribe");
    ps.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        if ps.get_message().is_err() {
            break;
        }
        got.push(mono_ns());
    }
    println!("{}", serde_json::json!(got));
}

/// The raw floor's holder: writes the lock and queues the waiter's registration, pauses 3 ms,
/// then sends what a distlock release sends (a `PING`, then the release script by SHA) with
/// redis-rs's blocking connection, stamping the moment before.
fn raw_holder(url: &str, count: usize, start_ns: u64) {
    let client = redis::Client::open(url).expect("client");
    let mut con = client.get_connection().expect("connection");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(distlock_redis::RELEASE_SCRIPT)
        .query(&mut con)
        .expect("load the release script");
    let now = mono_ns();
    if start_ns > now {
        std::thread::sleep(Duration::from_nanos(start_ns - now));
    }
    let mut sent = Vec::with_capacity(count);
    for i in 0..count {
        let _: () = redis::pipe()
            .cmd("SET")
            .arg(RAW_KEYS[0])
            .arg(format!("raw{i} 0 raw"))
            .arg("PX")
            .arg(30_000)
            .ignore()
            .cmd("RPUSH")
            .arg(RAW_KEYS[2])
            .arg(format!("{RAW_CHANNEL} 30000 {i} raw{} raw", i + 1))
            .ignore()
            .query(&mut con)
            .expect("set up a hand-over");
        std::thread::sleep(Duration::from_millis(3));
        let at = mono_ns();
        let (_, handed): (String, i64) = redis::pipe()
            .cmd("PING")
            .cmd("EVALSHA")
            .arg(&sha)
            .arg(3)
            .arg(&RAW_KEYS[..])
            .arg(format!("raw{i}"))
            .arg(wall_ms())
            .query(&mut con)
            .expect("release");
        assert_eq!(handed, 2, "the release handed the lock over");
        sent.push(at);
    }
    println!("{}", serde_json::json!(sent));
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The raw-client floor of the unloaded hand-off: release sent -> the waiter read the message,
/// p50 in µs, over `count` hand-overs between two processes.
async fn raw_handoff(server: &RedisServer, count: usize) -> f64 {
    let exe = std::env::current_exe().expect("own path");
    let url = server.url();
    let waiter = tokio::process::Command::new(&exe)
        .args(["raw-waiter", "--url", &url, "--count", &count.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the raw waiter");
    let start_ns = (mono_ns() + 300_000_000).to_string();
    let holder = tokio::process::Command::new(&exe)
        .args(["raw-holder", "--url", &url, "--count", &count.to_string()])
        .args(["--start-ns", &start_ns])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the raw holder");
    let stamps = |out: std::process::Output| -> Vec<u64> {
        serde_json::from_slice(&out.stdout).expect("raw client JSON")
    };
    let sent = stamps(holder.wait_with_output().await.expect("raw holder"));
    let got = stamps(waiter.wait_with_output().await.expect("raw waiter"));
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for (s, g) in sent.iter().zip(&got) {
        let _ = h.record(g.saturating_sub(*s));
    }
    server.cli(&["DEL", RAW_KEYS[0], RAW_KEYS[1], RAW_KEYS[2]]);
    h.value_at_quantile(0.5) as f64 / 1000.0
}

fn main() {
    let cli = Cli::parse();
    match &cli.cmd {
        Some(Cmd::RawWaiter { url, count }) => return raw_waiter(url, *count),
        Some(Cmd::RedlockCycles { cycles, urls }) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let hosts: Vec<&str> = urls
                .iter()
                .map(|u| u.trim_start_matches("redis://"))
                .collect();
            let url = format!("redlock://{}", hosts.join(","));
            let per_sec = rt.block_on(async {
                let c = LockClient::new(RedlockBackend::connect(&url).await.expect("connect"));
                distlock_cycles(&c, "p4", 50).await;
                distlock_cycles(&c, "p4", *cycles).await
            });
            println!("{per_sec:.1}");
            return;
        }
        Some(Cmd::RawHolder {
            url,
            count,
            start_ns,
        }) => return raw_holder(url, *count, *start_ns),
        _ => {}
    }
    if let Some(Cmd::Worker {
        url,
        tasks,
        start_ns,
        millis,
        mode,
        threads,
        hold_us,
        gap_us,
    }) = cli.cmd
    {
        let rt = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
        }
        .expect("runtime");
        rt.block_on(worker(
            url,
            tasks,
            start_ns,
            millis,
            mode,
            (hold_us, gap_us),
        ));
        return;
    }
    if !cli.no_pin {
        pin_self(0);
    }
    let Some(server) = RedisServer::start() else {
        eprintln!("distlock-bench needs redis-server (apt-get install redis-server redis-tools)");
        std::process::exit(1);
    };
    if !cli.no_pin {
        server.pin_to_cpu(0);
    }
    let (rounds, cycles, millis, waiters): (usize, usize, u64, &[usize]) = if cli.quick {
        (1, 200, 300, &[1, 8])
    } else {
        (
            cli.rounds.max(1),
            cli.cycles.max(1),
            cli.millis.max(100),
            &[1, 8, 64],
        )
    };
    let pinning = if cli.no_pin {
        "unpinned"
    } else {
        "pinned: server and every client process on CPU 0"
    };

    // P1 on a single-threaded runtime: one client, one task.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = server.url();
    let raw = redis::Client::open(url.as_str()).expect("client");
    let mut async_conn = rt
        .block_on(raw.get_multiplexed_async_connection())
        .expect("async connection");
    let peer_list = cli
        .peers
        .as_deref()
        .map(peers::discover)
        .unwrap_or_default();
    let (p1_sync, p1_async, p1_ours, rtt, p1_peers, p1_lat) = rt.block_on(async {
        let mut sync_conn = raw.get_connection().expect("sync connection");
        let script = redis::Script::new(RELEASE_LUA);
        let ours = LockClient::new(RedisBackend::connect(&url).await.expect("connect"));
        // Warm-up: load scripts, fill connection pools.
        floor_sync(&mut sync_conn, &script, 50);
        floor_async(&mut async_conn, &script, 50).await;
        distlock_cycles(&ours, "p1", 50).await;
        let (mut s, mut a, mut d) = (Vec::new(), Vec::new(), Vec::new());
        let mut r: Vec<Vec<peers::Figure>> = vec![Vec::new(); peer_list.len()];
        for _ in 0..rounds {
            s.push(floor_sync(&mut sync_conn, &script, cycles));
            a.push(floor_async(&mut async_conn, &script, cycles).await);
            d.push(distlock_cycles(&ours, "p1", cycles).await);
            for (i, peer) in peer_list.iter().enumerate() {
                r[i].push(peer.cycles(cycles, std::slice::from_ref(&url)));
            }
        }
        let rtt = rtt_us(&mut async_conn, 1000, None).await;
        // The distribution of one cycle's time, the floor's and ours alternating.
        let mut lat_floor = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        let mut lat_ours = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        for _ in 0..cycles {
            let t = Instant::now();
            floor_async(&mut async_conn, &script, 1).await;
            let _ = lat_floor.record(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            distlock_cycles(&ours, "p1", 1).await;
            let _ = lat_ours.record(t.elapsed().as_nanos() as u64);
        }
        (
            median(s),
            median(a),
            median(d),
            rtt,
            r.iter()
                .map(|v| peers::median_figure(v))
                .collect::<Vec<_>>(),
            [lat_floor, lat_ours],
        )
    });
    let p5 = p5(
        &rt,
        rounds,
        if cli.quick { cycles } else { cycles / 2 },
        !cli.no_pin,
    );
    let p4 = p4(
        &rt,
        if cli.quick { 3 } else { cli.masters.max(1) },
        rounds,
        cycles,
        !cli.no_pin,
        &peer_list,
    );

    let mut runs = Vec::new();
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for mode in [Mode::Events, Mode::Polling, Mode::Handoff] {
        for &w in waiters {
            runs.push(rt2.block_on(contention(
                &server,
                mode,
                w,
                millis,
                cli.worker_threads,
                (0, 0),
            )));
        }
    }
    // P2 beside the peers: the most waiters, in 4 processes, with no hold and a 1 ms hold.
    let p2_waiters = *waiters.last().unwrap_or(&8);
    let p2_shape = (4, p2_waiters / 4);
    runs.push(rt2.block_on(contention(
        &server,
        Mode::Events,
        p2_waiters,
        millis,
        cli.worker_threads,
        (1000, 0),
    )));
    let mut p2_peers = Vec::new();
    for peer in &peer_list {
        for hold_us in [0, 1000] {
            p2_peers.push(peer_contention(&server, peer, p2_shape, millis, hold_us));
        }
    }
    // P6: many held locks kept alive by automatic renewal.
    let (p6_locks, p6_ttl, p6_window) = if cli.quick {
        (
            200,
            Duration::from_millis(1500),
            Duration::from_millis(1500),
        )
    } else {
        (10_000, Duration::from_secs(3), Duration::from_secs(9))
    };
    let mut p6_rows = vec![p6::ours(&rt, &server, p6_locks, p6_ttl, p6_window)];
    for peer in &peer_list {
        p6_rows.push(p6::peer(&server, peer, p6_locks, p6_ttl, p6_window));
    }
    // P3 unloaded: two processes, one task each; a holder keeps the lock 3 ms and, after its
    // release, pauses 0.3 ms before it asks again (tokio's timers tick in whole ms, so the pause
    // lasts 1 or 2 ms: over before the other holder's 3 ms are). So every release finds the
    // other process asleep in its wait, and nothing else wants the CPU while the lock changes
    // hands. (In the zero-hold runs above, the one CPU is never idle: the next holder's
    // hand-off time is mostly the queue of work ahead of it, so it measures throughput rather
    // than latency.)
    // The unit is the round trip of a quiet client (a PING after a 2 ms pause), and it drifts
    // by several µs over minutes on a VM: so the rounds interleave the unit, both modes and the
    // raw floor, and every ratio divides by the unit of its own round.
    let p3_rounds = if cli.quick { 1 } else { P3_ROUNDS };
    let raw_count = if cli.quick { 20 } else { 150 };
    let p3_millis = if cli.quick { millis } else { 800 };
    let mut p3: Vec<P3Round> = Vec::new();
    for _ in 0..p3_rounds {
        // The same, each PING after a 2 ms pause: the round trip of a quiet client and server,
        // the fair unit for the unloaded hand-off.
        let idle_rtt = rt.block_on(rtt_us(&mut async_conn, 150, Some(Duration::from_millis(2))));
        let modes = [Mode::Events, Mode::Polling].map(|mode| {
            rt2.block_on(contention(
                &server,
                mode,
                2,
                p3_millis,
                cli.worker_threads,
                (3000, 300),
            ))
        });
        let raw = rt2.block_on(raw_handoff(&server, raw_count));
        p3.push(P3Round {
            idle_rtt,
            modes,
            raw,
        });
    }
    let idle_rtt = median(p3.iter().map(|r| r.idle_rtt).collect());
    let p3_peer_millis = if cli.quick { p3_millis } else { 3000 };
    let p3_peers: Vec<(String, HandoffFigures)> = peer_list
        .iter()
        .map(|p| (p.name.clone(), peer_handoff(&server, p, p3_peer_millis)))
        .collect();

    // The report: printed, and written as Markdown with --report.
    let mut report = String::new();
    macro_rules! outln {
        () => {
            report.push('\n')
        };
        ($($t:tt)*) => {{
            report.push_str(&format!($($t)*));
            report.push('\n');
        }};
    }
    macro_rules! out {
        ($($t:tt)*) => {
            report.push_str(&format!($($t)*))
        };
    }
    outln!(
        "distlock-bench — Redis {} — {pinning}",
        redis_version(&server)
    );
    outln!();
    outln!(
        "P1 uncontended acquire+release, one client, {rounds} round(s) × {cycles} cycles, medians"
    );
    outln!("| client | cycles/s | vs async floor |");
    outln!("|---|---:|---:|");
    outln!(
        "| redis-rs sync SET NX PX + EVALSHA (floor) | {p1_sync:.0} | {:.2} |",
        p1_sync / p1_async
    );
    outln!("| redis-rs async SET NX PX + EVALSHA (floor) | {p1_async:.0} | 1.00 |");
    outln!(
        "| distlock try_acquire + release | {p1_ours:.0} | {:.2} |",
        p1_ours / p1_async
    );
    for (peer, fig) in peer_list.iter().zip(&p1_peers) {
        outln!(
            "| {} lock + unlock | {} | {} |",
            peer.name,
            fig.cell(0),
            fig.value()
                .map_or(String::new(), |r| format!("{:.2}", r / p1_async))
        );
    }
    if peer_list.is_empty() {
        outln!("| peers | n/a (not installed: run bench/run.sh) | |");
    }
    for (peer, fig) in peer_list.iter().zip(&p1_peers) {
        if let Some(r) = fig.value() {
            outln!();
            out!("distlock vs {}: {:.2}×", peer.name, p1_ours / r);
        }
    }
    outln!();
    outln!();
    outln!("P1 one cycle's time (µs), {cycles} cycles of each, alternating");
    outln!("| client | p50 | p90 | p99 | p99.9 | max |");
    outln!("|---|---:|---:|---:|---:|---:|");
    for (name, h) in ["redis-rs async floor", "distlock"].iter().zip(&p1_lat) {
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
        outln!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            h.max() as f64 / 1000.0
        );
    }
    outln!();
    outln!(
        "P4 Redlock over {} masters, uncontended acquire+release, one client, {rounds} round(s) × {cycles} cycles, medians",
        p4.masters
    );
    outln!("| client | cycles/s | vs raw parallel floor | cycle µs | in parallel PING rounds |");
    outln!("|---|---:|---:|---:|---:|");
    let p4_row = |name: &str, per_sec: f64| {
        format!(
            "| {name} | {per_sec:.0} | {:.2} | {:.1} | {:.2} |",
            per_sec / p4.floor,
            1e6 / per_sec,
            1e6 / per_sec / p4.parallel_rtt_us.max(f64::MIN_POSITIVE)
        )
    };
    outln!(
        "{}",
        p4_row(
            "raw floor: SET NX PX, then the release script, on all masters at once",
            p4.floor,
        )
    );
    outln!(
        "{}",
        p4_row("distlock RedlockBackend try_acquire + release", p4.ours)
    );
    for (peer, fig) in peer_list.iter().zip(&p4.peers) {
        match fig.value() {
            Some(r) => outln!("{}", p4_row(&format!("{} lock + unlock", peer.name), r)),
            None => outln!("| {} | {} | | | |", peer.name, fig.cell(0)),
        }
    }
    if peer_list.is_empty() {
        outln!("| peers | n/a (not installed: run bench/run.sh) | | | |");
    }
    for (peer, fig) in peer_list.iter().zip(&p4.peers) {
        if let Some(r) = fig.value() {
            outln!(
                "distlock vs {} over {} masters: {:.2}×",
                peer.name,
                p4.masters,
                p4.ours / r
            );
        }
    }
    outln!(
        "parallel PING round to all masters: {:.1} µs (median of 1000); a cycle is two rounds",
        p4.parallel_rtt_us
    );
    outln!();
    outln!("P5 other engines, uncontended acquire+release, one client, {rounds} round(s), medians");
    outln!("| engine | raw floor | floor cycles/s | distlock cycles/s | vs floor |");
    outln!("|---|---|---:|---:|---:|");
    for r in &p5 {
        outln!(
            "| {} | {} | {:.0} | {:.0} | {:.2} |",
            r.engine,
            r.floor_name,
            r.floor,
            r.ours,
            r.ours / r.floor
        );
    }
    outln!();
    outln!(
        "PING round trip: {rtt:.1} µs (median of 1000 back to back); {idle_rtt:.1} µs (each after a 2 ms pause: median of the P3 rounds' medians of 150)"
    );
    outln!();
    let runtime = if cli.worker_threads <= 1 {
        "current-thread runtime".to_owned()
    } else {
        format!("multi-thread runtime, {} threads", cli.worker_threads)
    };
    outln!("P2/P3 one hot key, zero hold, {millis} ms per run, each process on a tokio {runtime}");
    outln!(
        "| mode | waiters | processes | acq/s | vs P1 | fairness | cmds/acq (sent) | server calls/acq | hand-off p50 µs | p99 µs | cross-process p50 | in RTTs |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs.iter().filter(|r| r.hold_us == 0) {
        outln!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.mode.name(),
            r.waiters,
            r.processes,
            r.per_sec,
            r.per_sec / p1_ours,
            r.fairness,
            r.cmds_per_acq,
            r.calls_per_acq,
            shown(r.handoffs, r.handoff_p50_us, 0),
            shown(r.handoffs, r.handoff_p99_us, 0),
            shown(r.cross_count, r.cross_p50_us, 0),
            shown(
                r.cross_count,
                r.cross_p50_us / rtt.max(f64::MIN_POSITIVE),
                1
            ),
        );
    }
    outln!();
    outln!(
        "P2 beside the peers: one hot key, {} processes × {} tasks, {millis} ms per run; each library waits its own way",
        p2_shape.0,
        p2_shape.1
    );
    outln!(
        "| client | hold | acq/s | vs distlock's P1 | fairness (min/max per process) | commands sent per acq | server calls per acq (INFO commandstats, script calls included) | errors |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs
        .iter()
        .filter(|r| r.mode == Mode::Events && r.waiters == p2_waiters)
    {
        outln!(
            "| distlock (events) | {} ms | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | 0 |",
            r.hold_us / 1000,
            r.per_sec,
            r.per_sec / p1_ours,
            r.fairness,
            r.cmds_per_acq,
            r.calls_per_acq
        );
    }
    for c in &p2_peers {
        match &c.result {
            Ok(r) => outln!(
                "| {} | {} ms | {:.0} | {:.2} | {:.2} | - | {:.2} | {} |",
                c.name,
                c.hold_us / 1000,
                r.per_sec,
                r.per_sec / p1_ours,
                r.fairness,
                r.calls_per_acq,
                r.errors
            ),
            Err(f) => outln!(
                "| {} | {} ms | {} | | | | | |",
                c.name,
                c.hold_us / 1000,
                f.cell(0)
            ),
        }
    }
    outln!();
    outln!(
        "P3 hand-off latency, unloaded: 2 processes, 1 task each; a holder keeps the lock 3 ms, then pauses 0.3 ms; {} interleaved round(s), medians over rounds",
        p3.len()
    );
    outln!(
        "| mode | hand-offs | release → other process acquired p50 µs | p99 µs | in idle RTTs | worst round | in back-to-back RTTs |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|");
    let p3_rows: Vec<P3Row> = (0..2)
        .map(|m| {
            P3Row::of(&p3, p3[0].modes[m].mode.name(), |r| {
                let c = &r.modes[m];
                (c.cross_count, c.cross_p50_us, c.cross_p99_us)
            })
        })
        .chain(std::iter::once(P3Row::of(
            &p3,
            "raw redis-rs floor: the same PING + release script, blocking clients, 3 ms pauses",
            |r| (raw_count as u64, r.raw, 0.0),
        )))
        .collect();
    for row in &p3_rows {
        outln!(
            "| {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.1} |",
            row.name,
            row.count,
            row.p50_us,
            if row.p99_us > 0.0 {
                format!("{:.0}", row.p99_us)
            } else {
                String::new()
            },
            row.idle_rtts,
            row.worst_idle_rtts,
            row.p50_us / rtt.max(f64::MIN_POSITIVE),
        );
    }
    for (name, r) in &p3_peers {
        match r {
            Ok((count, p50, p99)) => outln!(
                "| {name} (its own waiting, one run of {} ms) | {count} | {p50:.1} | {p99:.0} | {:.1} | | {:.1} |",
                p3_peer_millis,
                p50 / idle_rtt.max(f64::MIN_POSITIVE),
                p50 / rtt.max(f64::MIN_POSITIVE)
            ),
            Err(f) => outln!("| {name} | {} | | | | | |", f.cell(0)),
        }
    }
    outln!(
        "per round, idle RTT / events p50 / raw floor p50 (µs): {}",
        p3.iter()
            .map(|r| format!(
                "{:.1} / {:.1} / {:.1}",
                r.idle_rtt, r.modes[0].cross_p50_us, r.raw
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    outln!(
        "distlock events vs the raw floor: {:.2}× its hand-off time (median of the rounds' ratios)",
        median(
            p3.iter()
                .map(|r| r.modes[0].cross_p50_us / r.raw.max(f64::MIN_POSITIVE))
                .collect()
        )
    );
    outln!();
    outln!(
        "P6 {p6_locks} held locks kept alive by automatic renewal, TTL {} (renewed every TTL/3), measured over {}",
        show(p6_ttl),
        show(p6_window)
    );
    outln!(
        "| client | still held | renewal round trips per tick | server commands per renewal | client CPU % of a core | Redis CPU % |"
    );
    outln!("|---|---:|---:|---:|---:|---:|");
    for r in &p6_rows {
        match &r.result {
            Ok(f) => outln!(
                "| {} | {} | {} | {:.2} | {:.1} | {:.1} |",
                r.client,
                f.held_after,
                f.trips_per_tick
                    .map_or("-".to_owned(), |t| format!("{t:.1}")),
                f.cmds_per_renewal,
                f.client_cpu_pct,
                f.server_cpu_pct
            ),
            Err(fig) => outln!("| {} | {} | | | | |", r.client, fig.cell(0)),
        }
    }
    // The bars of the brief (§4), each with its figure.
    outln!();
    outln!("Bars");
    outln!("| bar | figure | met |");
    outln!("|---|---:|---|");
    let mut bar = |name: &str, figure: Option<f64>, ok: &dyn Fn(f64) -> bool| {
        let (fig, met) = match figure {
            Some(f) => (format!("{f:.3}"), if ok(f) { "yes" } else { "**no**" }),
            None => ("n/a".to_owned(), "not measured"),
        };
        outln!("| {name} | {fig} | {met} |");
    };
    let rslock_of = |figs: &[peers::Figure]| {
        peer_list
            .iter()
            .zip(figs)
            .find(|(p, _)| p.name.starts_with("rslock"))
            .and_then(|(_, f)| f.value())
    };
    bar(
        "P1 ≥ 0.95× the async floor",
        Some(p1_ours / p1_async),
        &|f| f >= 0.95,
    );
    bar(
        "P1 ≥ rslock (ratio)",
        rslock_of(&p1_peers).map(|r| p1_ours / r),
        &|f| f >= 1.0,
    );
    let p2_run = runs
        .iter()
        .find(|r| r.mode == Mode::Events && r.waiters == p2_waiters && r.hold_us == 0);
    bar(
        "P2 throughput ≥ 0.5× P1",
        p2_run.map(|r| r.per_sec / p1_ours),
        &|f| f >= 0.5,
    );
    bar("P2 fairness ≥ 0.5", p2_run.map(|r| r.fairness), &|f| {
        f >= 0.5
    });
    bar(
        "P2 commands per acquisition ≤ 4 (sent by the clients)",
        p2_run.map(|r| r.cmds_per_acq),
        &|f| f <= 4.0,
    );
    bar(
        "P3 hand-off p50 ≤ 3 round trips",
        p3_rows.first().map(|r| r.idle_rtts),
        &|f| f <= 3.0,
    );
    bar(
        "P4 ≥ 1.5× rslock (ratio)",
        rslock_of(&p4.peers).map(|r| p4.ours / r),
        &|f| f >= 1.5,
    );
    for r in &p5 {
        bar(
            &format!("P5 {} ≥ 0.9× its floor", r.engine),
            Some(r.ours / r.floor),
            &|f| f >= 0.9,
        );
    }
    print!("{report}");
    if let Some(path) = &cli.report {
        std::fs::write(path, markdown_report(&report, pinning, &cli)).expect("write the report");
    }
    if let Some(path) = cli.json {
        let p1_latency: serde_json::Map<String, serde_json::Value> = ["floor", "distlock"]
            .iter()
            .zip(&p1_lat)
            .map(|(name, h)| {
                let pts: Vec<serde_json::Value> =
                    [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0]
                        .iter()
                        .map(|p| {
                            serde_json::json!([p, h.value_at_quantile(p / 100.0) as f64 / 1000.0])
                        })
                        .collect();
                ((*name).to_owned(), serde_json::Value::Array(pts))
            })
            .collect();
        let json = serde_json::json!({
            "pinning": pinning,
            "worker_threads": cli.worker_threads,
            "redis": redis_version(&server),
            "p1": { "rounds": rounds, "cycles": cycles, "sync_floor": p1_sync,
                    "async_floor": p1_async, "distlock": p1_ours,
                    "peers": peer_list.iter().zip(&p1_peers)
                        .map(|(p, f)| (p.name.clone(), f.json()))
                        .collect::<serde_json::Map<_, _>>() },
            "p5": p5.iter().map(|r| serde_json::json!({
                "engine": r.engine, "floor": r.floor_name, "floor_per_sec": r.floor,
                "distlock_per_sec": r.ours,
            })).collect::<Vec<_>>(),
            "p4": { "masters": p4.masters, "raw_parallel_floor": p4.floor, "distlock": p4.ours,
                    "parallel_ping_us": p4.parallel_rtt_us,
                    "peers": peer_list.iter().zip(&p4.peers)
                        .map(|(p, f)| (p.name.clone(), f.json()))
                        .collect::<serde_json::Map<_, _>>() },
            "p2_peers": p2_peers.iter().map(|c| match &c.result {
                Ok(r) => serde_json::json!({
                    "client": c.name, "hold_us": c.hold_us, "per_sec": r.per_sec,
                    "fairness": r.fairness, "server_calls_per_acq": r.calls_per_acq,
                    "errors": r.errors,
                }),
                Err(f) => serde_json::json!({ "client": c.name, "hold_us": c.hold_us, "result": f.json() }),
            }).collect::<Vec<_>>(),
            "p1_latency_us": p1_latency,
            "p6": {
                "locks": p6_locks, "ttl_ms": p6_ttl.as_millis() as u64,
                "window_ms": p6_window.as_millis() as u64,
                "rows": p6_rows.iter().map(|r| match &r.result {
                    Ok(f) => serde_json::json!({
                        "client": r.client, "held_after": f.held_after,
                        "round_trips_per_tick": f.trips_per_tick,
                        "cmds_per_renewal": f.cmds_per_renewal,
                        "client_cpu_pct": f.client_cpu_pct, "server_cpu_pct": f.server_cpu_pct,
                    }),
                    Err(fig) => serde_json::json!({ "client": r.client, "result": fig.json() }),
                }).collect::<Vec<_>>(),
            },
            "rtt_us": rtt,
            "idle_rtt_us": idle_rtt,
            "contention": runs.iter().map(|r| serde_json::json!({
                "mode": r.mode.name(), "waiters": r.waiters, "processes": r.processes,
                "hold_us": r.hold_us,
                "per_sec": r.per_sec, "fairness": r.fairness, "cmds_per_acq": r.cmds_per_acq,
                "server_calls_per_acq": r.calls_per_acq,
                "handoff_p50_us": r.handoff_p50_us, "handoff_p99_us": r.handoff_p99_us,
                "cross_process_p50_us": r.cross_p50_us,
            })).collect::<Vec<_>>(),
            "p3_unloaded": p3_rows.iter().map(|r| serde_json::json!({
                "mode": r.name, "hold_us": 3000, "gap_us": 300, "handoffs": r.count,
                "cross_process_p50_us": r.p50_us, "cross_process_p99_us": r.p99_us,
                "idle_rtts": r.idle_rtts, "worst_round_idle_rtts": r.worst_idle_rtts,
            })).collect::<Vec<_>>(),
            "p3_peers": p3_peers.iter().map(|(name, r)| match r {
                Ok((count, p50, p99)) => serde_json::json!({
                    "client": name, "handoffs": count, "cross_process_p50_us": p50,
                    "cross_process_p99_us": p99,
                }),
                Err(f) => serde_json::json!({ "client": name, "result": f.json() }),
            }).collect::<Vec<_>>(),
            "p3_idle_rtt_us_per_round": p3.iter().map(|r| r.idle_rtt).collect::<Vec<_>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .expect("write the JSON");
    }
}

/// The report as a Markdown page: where and how it was measured, then the tables (each with
/// the blank line Markdown wants before it).
fn markdown_report(report: &str, pinning: &str, cli: &Cli) -> String {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Every CPU of the machine (our own affinity is CPU 0 alone when pinned).
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let mut page = format!(
        "# Benchmarks\n\n\
         Written by `bench/run.sh` (distlock-bench{} with the peers) on {}.\n\n\
         - Machine: {cores} vCPU ({cpu}), Linux {}.\n\
         - CPU pinning: {pinning}.\n\
         - Rounds are interleaved (floor, distlock and every peer in each round); the tables show \
         medians over rounds. Raw figures: the JSON written with `--json`.\n\
         - Peers: installed by `bench/run.sh` outside the repository \
         ([bench/peers/README.md](../bench/peers/README.md)); a cell that says n/a names the \
         feature the library lacks.\n\n",
        if cli.quick { " --quick" } else { "" },
        run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        run("uname", &["-r"]),
    );
    page.push_str(
        "![Throughput against waiters](img/throughput-vs-waiters.png)\n\n\
         ![One uncontended cycle's time](img/p1-latency.png)\n\n",
    );
    let mut prev_table = false;
    for line in report.lines() {
        let table = line.starts_with('|');
        if table && !prev_table {
            page.push('\n');
        }
        if !table && prev_table && !line.is_empty() {
            page.push('\n');
        }
        page.push_str(line);
        page.push('\n');
        prev_table = table;
    }
    // The hand-written notes on the misses, when run from the repository's root.
    if let Ok(notes) = std::fs::read_to_string("bench/notes.md") {
        page.push('\n');
        page.push_str(&notes.replacen("# Notes", "## Notes", 1));
    }
    page
}

/// A duration as `1.5 s` or `300 ms`.
fn show(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// A figure with `decimals`, or `-` when it rests on no sample.
fn shown(samples: u64, value: f64, decimals: usize) -> String {
    if samples == 0 {
        "-".to_owned()
    } else {
        format!("{value:.decimals$}")
    }
}

fn redis_version(server: &RedisServer) -> String {
    server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}
