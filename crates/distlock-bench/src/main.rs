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
//! - P7: read-write locks and semaphores (`p7.rs`): a reader's, a writer's and a permit's
//!   uncontended cycle beside its raw single-script floor; a semaphore's hot name (4 permits,
//!   8 to 64 waiters); a 90% read / 10% write mix; the peers with a read-write lock or a
//!   semaphore beside them.
//!
//! This is a benchmark, not a test: it prints a table (and `--json`), it asserts nothing.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock_core::LockClient;
use distlock_redis::RedlockBackend;
use distlock_testkit::RedisServer;

mod common;
mod p1;
mod p10;
mod p11;
mod p12;
mod p2;
mod p3;
mod p4;
mod p5;
mod p6;
mod p7;
mod p8;
mod p9;
mod peers;
mod report;

use common::{Mode, distlock_cycles, median, pin_self, rtt_us};
use p2::{contention, peer_contention, worker};
use p3::{HandoffFigures, P3_ROUNDS, P3Round, peer_handoff, raw_handoff, raw_holder, raw_waiter};
use p4::p4;
use p5::p5;
use p6::P6Server;

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
    /// Only P1 (without its peers' rows unless --peers, and without TLS): for an A/B of the
    /// fast path. Prints one line.
    #[arg(long)]
    p1_only: bool,
    /// Only P7 (read-write locks and semaphores, with the peers when --peers): prints its
    /// tables and bars, and writes its figures with --json.
    #[arg(long, conflicts_with = "p1_only")]
    p7_only: bool,
    /// Masters of the P4 Redlock runs.
    #[arg(long, default_value_t = 5)]
    masters: usize,
    /// Only P8 (leader election: fail-over on every engine, the cost of observing): prints
    /// its tables, and writes its figures with --json.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only"])]
    p8_only: bool,
    /// Only P9 (what the metrics and spans cost the uncontended cycle): prints its table.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only"])]
    p9_only: bool,
    /// Only P5 (each other engine beside its raw client floor), for a quick before/after:
    /// prints its table. `--engine` narrows it.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only", "p9_only"])]
    p5_only: bool,
    /// With --p5-only or --p10-only: only these engines (redis (P10), etcd, zookeeper,
    /// postgres, mariadb, memcached; repeat the flag for more).
    #[arg(long, value_name = "NAME")]
    engine: Vec<String>,
    /// Only P1 over TLS beside TCP (each beside its raw redis-rs floor), for a quick
    /// before/after: prints its table.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only", "p9_only", "p5_only"])]
    tls_only: bool,
    /// Only P10 (many locks held by one client, on every engine): prints its table and bars,
    /// and writes its figures with --json. `--engine` narrows it, `--names` sets the sizes.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only", "p9_only", "p5_only", "tls_only"])]
    p10_only: bool,
    /// Only P11 (a multi-name lock's uncontended cycle, 2, 8 and 64 names, beside one name's):
    /// prints its table and bar.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only", "p9_only", "p5_only", "tls_only", "p10_only"])]
    p11_only: bool,
    /// Only P12 (a group of 8 `distlock join` members × 256 partitions: the time until every
    /// partition is owned again after a join, a graceful leave and a kill, the partitions
    /// moved, and the requests per member at rest), on Redis and etcd (`--engine` narrows it):
    /// prints its table. Needs the `distlock` binary of the same build beside this one.
    #[arg(long, conflicts_with_all = ["p1_only", "p7_only", "p8_only", "p9_only", "p5_only", "tls_only", "p10_only", "p11_only"])]
    p12_only: bool,
    /// With --p10-only: the numbers of names one client holds, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    names: Vec<usize>,
    /// With --p10-only: which parts to run (held: many locks by one client; stampede: many
    /// `distlock run` processes on one name; waiters: 64 and 1,024 waiters on one hot name;
    /// cluster: a million locks over a Redis Cluster of 3 masters, by 4 client processes).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "held,stampede,waiters,cluster"
    )]
    part: Vec<P10Part>,
    /// With --p10-only: the TTL of the held part, in milliseconds (the is 3 s; a longer
    /// one, for a probe, keeps renewals out of the acquisitions).
    #[arg(long, default_value_t = 3000)]
    p10_ttl_ms: u64,
    /// With --p10-only: the names held across the Redis Cluster, by 4 clients (2,000 by 2
    /// with --quick).
    #[arg(long, default_value_t = 1_000_000)]
    cluster_names: usize,
    /// With --p10-only: the processes of the stampede (16 with --quick).
    #[arg(long, default_value_t = 256)]
    processes: usize,
}

/// The parts of P10.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum P10Part {
    Held,
    Stampede,
    Waiters,
    Cluster,
}

/// What every contending worker process is told (see `common::spawn_workers`).
#[derive(clap::Args, Debug)]
struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    tasks: usize,
    #[arg(long)]
    start_ns: u64,
    #[arg(long)]
    millis: u64,
    #[arg(long)]
    threads: usize,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Internal: one contending process.
    #[command(hide = true)]
    Worker {
        #[command(flatten)]
        w: WorkerArgs,
        #[arg(long)]
        mode: Mode,
        /// How long each holder keeps the lock, in microseconds.
        #[arg(long, default_value_t = 0)]
        hold_us: u64,
        /// How long each task pauses after a release before it asks again, in microseconds.
        #[arg(long, default_value_t = 0)]
        gap_us: u64,
    },
    /// Internal: one campaigning process of P8.
    #[command(hide = true)]
    P8Worker {
        #[arg(long)]
        url: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        ttl_ms: u64,
    },
    /// Internal: one contending process of P7.
    #[command(hide = true)]
    P7Worker {
        #[command(flatten)]
        w: WorkerArgs,
        #[arg(long)]
        load: p7::Load,
    },
    /// Internal: uncontended Redlock cycles over the masters given (for profiling P4 alone);
    /// prints cycles per second.
    #[command(hide = true)]
    RedlockCycles {
        #[arg(long)]
        cycles: usize,
        urls: Vec<String>,
    },
    /// Internal: uncontended cycles on Redis with the metrics recorder and the tracing
    /// subscriber installed (`--observe`) or not (P9); prints cycles per second.
    #[command(hide = true)]
    ObservedCycles {
        #[arg(long)]
        url: String,
        #[arg(long)]
        cycles: usize,
        #[arg(long)]
        observe: bool,
        #[arg(long)]
        pin: bool,
    },
    /// Internal: one client of P10 (takes N names, holds them for three TTLs, reports).
    #[command(hide = true)]
    P10Client {
        #[arg(long)]
        url: String,
        #[arg(long)]
        names: usize,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        pin: bool,
        /// The names' prefix (clients of one run take names of their own).
        #[arg(long, default_value = "p10")]
        prefix: String,
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

fn main() {
    let cli = Cli::parse();
    match &cli.cmd {
        Some(Cmd::RawWaiter { url, count }) => return raw_waiter(url, *count),
        Some(Cmd::P10Client {
            url,
            names,
            ttl_ms,
            pin,
            prefix,
        }) => {
            return p10::client::run(&p10::client::Ask {
                url,
                names: *names,
                ttl: Duration::from_millis(*ttl_ms),
                pin: *pin,
                prefix,
            });
        }
        Some(Cmd::ObservedCycles {
            url,
            cycles,
            observe,
            pin,
        }) => return p9::child(url, *cycles, *observe, *pin),
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
    if let Some(Cmd::P8Worker { url, name, ttl_ms }) = cli.cmd {
        runtime(1).block_on(p8::worker(url, name, Duration::from_millis(ttl_ms)));
        return;
    }
    if let Some(Cmd::P7Worker { w, load }) = cli.cmd {
        runtime(w.threads).block_on(p7::worker(w.url, w.tasks, w.start_ns, w.millis, load));
        return;
    }
    if let Some(Cmd::Worker {
        w,
        mode,
        hold_us,
        gap_us,
    }) = cli.cmd
    {
        runtime(w.threads).block_on(worker(
            w.url,
            w.tasks,
            w.start_ns,
            w.millis,
            mode,
            (hold_us, gap_us),
        ));
        return;
    }
    if cli.p10_only {
        return run_p10(&cli);
    }
    if cli.p12_only {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        print!("{}", p12::render(&p12::run(&rt, &cli.engine, cli.quick)));
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
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let peer_list = cli
        .peers
        .as_deref()
        .map(peers::discover)
        .unwrap_or_default();
    // P7's loads: a semaphore's hot name at these waiters (4 processes), the most of them also
    // the shape of the hot exclusive key and of the read/write mix.
    let p7_waiters: &[usize] = if cli.quick { &[8, 16] } else { &[8, 16, 64] };
    if cli.p8_only {
        let (failovers, observing) = rt.block_on(run_p8(&server, cli.quick, !cli.no_pin));
        // Fail-over times are TTLs and wake-ups: the machine as it is, not pinned.
        let text = p8::render(&failovers, &observing, "not pinned");
        print!("{text}");
        if let Some(path) = &cli.json {
            let json = p8::json(&failovers, &observing);
            std::fs::write(path, serde_json::to_string_pretty(&json).expect("json"))
                .expect("write the JSON");
        }
        return;
    }
    if cli.p7_only {
        let p7 = p7::run(
            &server,
            &rt,
            &rt2,
            (rounds, cycles, millis),
            p7_waiters,
            cli.worker_threads,
            &peer_list,
        );
        let mut text = format!(
            "distlock-bench --p7-only — Redis {} — {pinning}\n\n{}\nBars\n| bar | figure | met |\n|---|---:|---|\n",
            common::redis_version(&server),
            p7.render(pinning)
        );
        for (name, fig, met) in p7.bars() {
            text.push_str(&format!(
                "| {name} | {} | {} |\n",
                fig.map_or("n/a".to_owned(), |f| format!("{f:.3}")),
                if met { "yes" } else { "**no**" }
            ));
        }
        let text = p7::spaced(&text);
        print!("{text}");
        if let Some(path) = &cli.report {
            std::fs::write(path, &text).expect("write the report");
        }
        if let Some(path) = &cli.json {
            let json = serde_json::json!({ "pinning": pinning, "p7": p7.json() });
            std::fs::write(path, serde_json::to_string_pretty(&json).expect("json"))
                .expect("write the JSON");
        }
        return;
    }
    if cli.p11_only {
        let url = server.url();
        let rows = rt.block_on(p11::measure(&url, rounds, cycles));
        print!("{}", p11::render(&rows, rounds, cycles, pinning));
        return;
    }
    if cli.p5_only {
        let p5 = p5::p5_of(
            &rt,
            rounds,
            if cli.quick { cycles } else { cycles / 2 },
            !cli.no_pin,
            &cli.engine,
        );
        println!("P5 ({pinning}; {rounds} round(s), medians)");
        print!("{}", p5::render(&p5));
        return;
    }
    if cli.tls_only {
        match rt.block_on(p1::measure_tls(rounds, cycles, !cli.no_pin)) {
            Some(t) => print!("({pinning})\n{}", p1::render_tls(&t, rounds, cycles)),
            None => {
                eprintln!("distlock-bench --tls-only: no TLS server could be started");
                std::process::exit(1);
            }
        }
        return;
    }
    let url = server.url();
    let p9_rounds = if cli.quick { 1 } else { rounds.max(5) };
    let p9_cycles = if cli.quick { cycles } else { cycles * 2 };
    if cli.p9_only {
        let p9 = p9::run(&url, p9_rounds, p9_cycles, !cli.no_pin);
        print!("{}", p9.render(pinning));
        println!(
            "\nslower by {:.1} % (bar: at most 3 %)",
            p9.slowdown() * 100.0
        );
        return;
    }
    let raw = redis::Client::open(url.as_str()).expect("client");
    let mut async_conn = rt
        .block_on(raw.get_multiplexed_async_connection())
        .expect("async connection");
    let p1::Figures {
        sync_floor: p1_sync,
        async_floor: p1_async,
        ours: p1_ours,
        rtt,
        peers: p1_peers,
        latency: p1_lat,
    } = rt.block_on(p1::measure(
        &raw,
        &url,
        &mut async_conn,
        rounds,
        cycles,
        &peer_list,
    ));
    if cli.p1_only {
        println!(
            "P1 ({pinning}; {rounds} round(s) × {cycles} cycles, medians): distlock {p1_ours:.0} \
             cycles/s, redis-rs async floor {p1_async:.0} ({:.3}×), sync floor {p1_sync:.0}",
            p1_ours / p1_async
        );
        return;
    }
    let p9 = p9::run(&url, p9_rounds, p9_cycles, !cli.no_pin);
    let p1_tls = rt.block_on(p1::measure_tls(rounds, cycles, !cli.no_pin));
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
    // P7: read-write locks and semaphores.
    let p7 = p7::run(
        &server,
        &rt,
        &rt2,
        (rounds, cycles, millis),
        p7_waiters,
        cli.worker_threads,
        &peer_list,
    );
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
    let redis = rt
        .block_on(distlock_redis::RedisBackend::connect(&server.url()))
        .expect("connect");
    let mut p6_rows = vec![p6::ours(
        &rt,
        P6Server::Redis(&server),
        redis,
        p6_locks,
        p6_ttl,
        p6_window,
    )];
    for peer in &peer_list {
        p6_rows.push(p6::peer(&server, peer, p6_locks, p6_ttl, p6_window));
    }
    // The same on etcd and ZooKeeper (one session each), pinned like P5.
    if let Some(etcd) = distlock_testkit::Etcd::start() {
        if !cli.no_pin {
            etcd.members()[0].pin_to_cpu(0);
        }
        let backend = rt
            .block_on(distlock_etcd::EtcdBackend::connect(&etcd.url("")))
            .expect("connect");
        let row = p6::ours(
            &rt,
            P6Server::Etcd(&etcd),
            backend,
            p6_locks,
            p6_ttl,
            p6_window,
        );
        p6_rows.push(row);
    }
    if let Some(zk) = distlock_testkit::ZooKeeper::start() {
        if !cli.no_pin {
            zk.servers()[0].pin_to_cpu(0);
        }
        let backend = rt
            .block_on(distlock_zookeeper::ZkBackend::connect(&zk.url("")))
            .expect("connect");
        let row = p6::ours(
            &rt,
            P6Server::ZooKeeper(&zk),
            backend,
            p6_locks,
            p6_ttl,
            p6_window,
        );
        p6_rows.push(row);
    }
    // The database engines: many locks on a few sessions, each renewed by one statement a
    // tick (a server with default settings: PostgreSQL's lock table holds about 12,000).
    if let Some(pg) = distlock_testkit::Postgres::start() {
        if !cli.no_pin {
            pg.pin_to_cpu(0);
        }
        let backend = rt
            .block_on(distlock_postgres::PgBackend::connect(&pg.url("")))
            .expect("connect");
        p6_rows.push(p6::ours(
            &rt,
            P6Server::Postgres(&pg, backend.clone()),
            backend,
            p6_locks,
            p6_ttl,
            p6_window,
        ));
    }
    if let Some(db) = distlock_testkit::MariaDb::start() {
        if !cli.no_pin {
            db.pin_to_cpu(0);
        }
        let backend = rt
            .block_on(distlock_mysql::MysqlBackend::connect(&db.url("")))
            .expect("connect");
        p6_rows.push(p6::ours(
            &rt,
            P6Server::Mysql(&db),
            backend,
            p6_locks,
            p6_ttl,
            p6_window,
        ));
    }
    // P8: leader election.
    let (p8_failovers, p8_observing) = rt.block_on(run_p8(&server, cli.quick, !cli.no_pin));
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

    report::write(report::Results {
        cli: &cli,
        server: &server,
        pinning,
        rounds,
        cycles,
        millis,
        peer_list: &peer_list,
        p1_sync,
        p1_async,
        p1_ours,
        rtt,
        p1_peers,
        p1_lat,
        p1_tls,
        p4,
        p5,
        runs,
        p2_waiters,
        p2_shape,
        p2_peers,
        p3,
        idle_rtt,
        raw_count,
        p3_peer_millis,
        p3_peers,
        p6_locks,
        p6_ttl,
        p6_window,
        p6_rows,
        p7,
        p8_failovers,
        p8_observing,
        p9,
    });
}

/// P8 on every engine that holds elections: fail-over rounds, and the cost of 100 observers
/// (fewer rounds and observers with `quick`). The servers other than Redis are started here,
/// their CPU pinned as P5's are when `pin`.
async fn run_p8(
    redis: &RedisServer,
    quick: bool,
    pin: bool,
) -> (Vec<p8::Failover>, Vec<p8::Observing>) {
    // A smoke run (CI): Redis, etcd and the file engine, a 1 s lease, 10 observers.
    let (rounds, observers, window, ttl) = if quick {
        (1, 10, Duration::from_secs(1), Duration::from_secs(1))
    } else {
        (3, 100, Duration::from_secs(10), p8::TTL)
    };
    let each = (rounds, ttl);
    let observe = (observers, window, ttl);
    let mut failovers = Vec::new();
    let mut observing = Vec::new();
    let expiry = "the lease's TTL on the server, then the follower's wake-up";
    failovers.push(p8::failover("redis", &redis.url(), each, expiry).await);
    observing.push(p8::observing("redis", &P6Server::Redis(redis), &redis.url(), observe).await);
    if let Some(etcd) = distlock_testkit::Etcd::start() {
        if pin {
            etcd.members()[0].pin_to_cpu(0);
        }
        let url = etcd.url("");
        failovers.push(p8::failover("etcd", &url, each, expiry).await);
        observing.push(p8::observing("etcd", &P6Server::Etcd(&etcd), &url, observe).await);
    }
    let zk = if quick {
        None
    } else {
        distlock_testkit::ZooKeeper::start()
    };
    if let Some(zk) = zk {
        // The session outlives a dead client for its timeout: the TTL.
        let url = zk.url(&format!("?session_timeout={}ms", ttl.as_millis()));
        let note = "the session timeout (= the TTL)";
        failovers.push(p8::failover("zookeeper", &url, each, note).await);
        observing.push(p8::observing("zookeeper", &P6Server::ZooKeeper(&zk), &url, observe).await);
    }
    let pg = if quick {
        None
    } else {
        distlock_testkit::Postgres::start()
    };
    if let Some(pg) = pg {
        let url = pg.url("");
        let backend = distlock_postgres::PgBackend::connect(&url)
            .await
            .expect("connect");
        failovers.push(
            p8::failover(
                "postgres",
                &url,
                each,
                "a killed leader's connection closes: its session and lock end at once",
            )
            .await,
        );
        observing.push(
            p8::observing("postgres", &P6Server::Postgres(&pg, backend), &url, observe).await,
        );
    }
    let db = if quick {
        None
    } else {
        distlock_testkit::MariaDb::start()
    };
    if let Some(db) = db {
        let url = db.url("");
        failovers.push(
            p8::failover(
                "mariadb",
                &url,
                each,
                "a killed leader's connection closes: its locks end at once",
            )
            .await,
        );
        observing.push(p8::observing("mariadb", &P6Server::Mysql(&db), &url, observe).await);
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let url = format!("file://{}/locks", dir.path().display());
    failovers.push(
        p8::failover(
            "file",
            &url,
            each,
            "a dead leader's flock ends with its process",
        )
        .await,
    );
    (failovers, observing)
}

/// The runtime of a contending process: tokio's current-thread runtime for one thread, else the
/// multi-thread one.
fn runtime(threads: usize) -> tokio::runtime::Runtime {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("runtime")
}

/// `--p10-only`: P10 on every engine (or those of `--engine`), its table and bars.
fn run_p10(cli: &Cli) {
    let pin = !cli.no_pin;
    let sizes: Vec<usize> = if cli.quick {
        vec![100, 1000]
    } else {
        cli.names.clone()
    };
    let pinning = if pin {
        "pinned: each server and its client process on CPU 0"
    } else {
        "unpinned"
    };
    let mut json = serde_json::json!({ "pinning": pinning });
    let mut ok = true;
    if cli.part.contains(&P10Part::Held) {
        let ttl = Duration::from_millis(cli.p10_ttl_ms);
        let rows = p10::engines::run(&sizes, pin, &cli.engine, ttl);
        print!("{}", p10::render(&rows, pinning));
        json["p10"] = rows.iter().map(p10::Row::json).collect();
    }
    if cli.part.contains(&P10Part::Stampede) {
        let processes = if cli.quick { 16 } else { cli.processes };
        let rows = p10::stampede::run(processes, &cli.engine);
        print!("\n{}", p10::stampede::render(&rows));
        json["stampede"] = rows.iter().map(p10::stampede::Stampede::json).collect();
        ok &= rows.iter().all(p10::stampede::Stampede::ok);
    }
    if cli.part.contains(&P10Part::Waiters) {
        let (rounds, millis) = if cli.quick {
            (1, 300)
        } else {
            (cli.rounds.max(1), cli.millis.max(100))
        };
        let crowds = p10::waiters::run(rounds, millis, pin);
        print!(
            "\n{}",
            p10::waiters::render(&crowds, rounds, millis, pinning)
        );
        json["waiters"] = crowds.iter().map(p10::waiters::Crowd::json).collect();
    }
    if cli.part.contains(&P10Part::Cluster) {
        let (clients, each) = if cli.quick {
            (2, 1000)
        } else {
            (4, cli.cluster_names / 4)
        };
        if let Some(d) = p10::cluster::run(clients, each) {
            print!("\n{}", p10::cluster::render(&d));
            json["cluster"] = d.json();
        }
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_string_pretty(&json).expect("json"))
            .expect("write the JSON");
    }
    if !ok {
        // A broken rule of exclusion is a failure, not a figure.
        std::process::exit(1);
    }
}
