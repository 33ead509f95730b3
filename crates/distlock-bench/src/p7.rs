//! P7: read-write locks and semaphores on Redis.
//!
//! - The uncontended cycle (acquire + release, one client) of a reader, a writer and a permit
//!   (N = 4), each beside its raw floor on redis-rs async: the least that kind needs to be
//!   correct, written directly, one round trip to acquire and one to release, with a lease per
//!   holder on the server's clock (`TIME` inside the script):
//!   - reader: a script that checks no writer holds the key, drops expired shares, adds ours
//!     (a sorted set scored with deadlines) and keeps the key's marker (what makes a writer's
//!     `SET NX` fail) as long as the longest share; a script that removes it and deletes the
//!     marker when it was the last;
//!   - writer: `SET NX PX` (a reader's marker makes it fail) and the compare-and-delete script;
//!   - permit: a script that drops expired permits, checks `ZCARD < N` and adds ours scored
//!     with its deadline; `ZREM`.
//!
//!   Rounds interleaved, medians; also the commands each sends per cycle, the calls the server
//!   runs per cycle (INFO commandstats: a script's inner calls included) and the server's CPU
//!   per cycle (INFO cpu), which say where a gap comes from.
//! - A hot name: a semaphore of 4 permits, 8, 16 and 64 waiters in 4 processes, zero hold:
//!   throughput, fairness (min/max acquisitions per process), commands per acquisition; the
//!   same for one hot exclusive key at 64 waiters (the peers' mutexes).
//! - A 90% read / 10% write mix on one read-write lock, 4 processes × 16 tasks, zero hold.
//!
//! The peers (bench/peers: `rw-cycles`, `sem-cycles`, `sem-contend`, `rw-mix`, and `contend`
//! for their mutexes) run in the same rounds; a peer that says n/a to every P7 mode is left
//! out of these tables.

use std::time::{Duration, Instant};

use clap::ValueEnum;
use distlock_core::{LockClient, LockGuard, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

use crate::common::{Mode, RELEASE_LUA, first_line, median, mono_ns, spawn_workers};
use crate::p2::{self, Contention, PeerContention, total_calls};
use crate::peers::{self, Figure};

/// The semaphore's permits, in every P7 figure.
pub(crate) const PERMITS: u32 = 4;
/// The share of writers in the mix, in %.
pub(crate) const WRITE_PCT: u32 = 10;
/// The contending processes of every P7 load.
const PROCESSES: usize = 4;
const TTL_MS: u64 = 30_000;
/// How long past the end of a run a P7 worker's task still waits for its lease; a longer wait
/// fails and counts as an error.
const GRACE: Duration = Duration::from_secs(5);

/// The reader floor's acquire. `KEYS[1]` the lock key, `KEYS[2]` the readers' sorted set;
/// `ARGV[1]` token, `ARGV[2]` ttl ms. 1: ours; 0: a writer holds the key.
const FLOOR_READ_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= '~readers' then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local left = tonumber(last[2]) - now
redis.call('SET', KEYS[1], '~readers', 'PX', left)
redis.call('PEXPIRE', KEYS[2], left)
return 1
";

/// The reader floor's release: our share out, the expired ones too; the marker lives as long
/// as the longest share left, or goes with the last. Returns 1 when the share was there.
const FLOOR_READ_RELEASE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] then
  local left = tonumber(last[2]) - now
  redis.call('PEXPIRE', KEYS[1], left)
  redis.call('PEXPIRE', KEYS[2], left)
elseif redis.call('GET', KEYS[1]) == '~readers' then
  redis.call('DEL', KEYS[1])
end
return held
";

/// The permit floor's acquire. `KEYS[1]` the holders' sorted set; `ARGV[1]` token, `ARGV[2]` N,
/// `ARGV[3]` ttl ms. 1: ours; 0: N held.
const FLOOR_PERMIT_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
return 1
";

/// The three kinds of lease whose cycle P7 measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
    Permit,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Read, Kind::Write, Kind::Permit];

    fn name(self) -> &'static str {
        match self {
            Kind::Read => "reader",
            Kind::Write => "writer",
            Kind::Permit => "permit (N = 4)",
        }
    }

    fn floor_name(self) -> &'static str {
        match self {
            Kind::Read => {
                "one script (no writer? expired shares out, ZADD ours, marker PX) + one script (ZREM, marker)"
            }
            Kind::Write => "SET NX PX + compare-and-delete script",
            Kind::Permit => "one script (ZREMRANGEBYSCORE, ZCARD < N, ZADD, PEXPIRE) + ZREM",
        }
    }

    /// The arguments of a peer's cycles mode for this kind.
    fn peer_args(self, n: usize, url: &str) -> Vec<String> {
        match self {
            Kind::Read => vec!["rw-cycles".into(), "read".into(), n.to_string(), url.into()],
            Kind::Write => vec![
                "rw-cycles".into(),
                "write".into(),
                n.to_string(),
                url.into(),
            ],
            Kind::Permit => vec![
                "sem-cycles".into(),
                n.to_string(),
                PERMITS.to_string(),
                url.into(),
            ],
        }
    }
}

struct Floors {
    read_acquire: redis::Script,
    read_release: redis::Script,
    permit_acquire: redis::Script,
    release: redis::Script,
}

/// `cycles` floor cycles of `kind`: cycles per second.
async fn floor_cycles(
    conn: &mut redis::aio::MultiplexedConnection,
    f: &Floors,
    kind: Kind,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        match kind {
            Kind::Read => {
                let ok: i64 = f
                    .read_acquire
                    .key("raw:rw")
                    .key("raw:rw:readers")
                    .arg(&token)
                    .arg(TTL_MS)
                    .invoke_async(conn)
                    .await
                    .expect("reader floor acquire");
                assert_eq!(ok, 1, "raw reader busy");
                let held: i64 = f
                    .read_release
                    .key("raw:rw")
                    .key("raw:rw:readers")
                    .arg(&token)
                    .invoke_async(conn)
                    .await
                    .expect("reader floor release");
                assert_eq!(held, 1, "raw reader lost");
            }
            Kind::Write => {
                let ok: Option<String> = redis::cmd("SET")
                    .arg("raw:rw")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL_MS)
                    .query_async(conn)
                    .await
                    .expect("SET");
                assert!(ok.is_some(), "raw writer busy");
                let held: i64 = f
                    .release
                    .key("raw:rw")
                    .arg(&token)
                    .invoke_async(conn)
                    .await
                    .expect("writer floor release");
                assert_eq!(held, 1, "raw writer lost");
            }
            Kind::Permit => {
                let ok: i64 = f
                    .permit_acquire
                    .key("raw:sem")
                    .arg(&token)
                    .arg(PERMITS)
                    .arg(TTL_MS)
                    .invoke_async(conn)
                    .await
                    .expect("permit floor acquire");
                assert_eq!(ok, 1, "raw permits all taken");
                let held: i64 = redis::cmd("ZREM")
                    .arg("raw:sem")
                    .arg(&token)
                    .query_async(conn)
                    .await
                    .expect("ZREM");
                assert_eq!(held, 1, "raw permit lost");
            }
        }
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// One uncontended attempt of `kind` with distlock.
async fn try_once(client: &LockClient, kind: Kind) -> LockGuard {
    let req = match kind {
        // Untyped requests: one guard type for the three kinds.
        Kind::Read => client.lock("p7:rw").shared(),
        Kind::Write => client.lock("p7:rw"),
        Kind::Permit => client.lock("p7:sem").permits(PERMITS),
    };
    req.try_acquire()
        .await
        .expect("acquire")
        .expect("uncontended")
}

/// `cycles` distlock cycles of `kind` (`try_acquire` + `release`): cycles per second.
async fn ours_cycles(client: &LockClient, kind: Kind, cycles: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..cycles {
        let g = try_once(client, kind).await;
        assert_eq!(g.release().await.expect("release"), Released::Held);
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// The server's CPU so far (user + system), in µs.
async fn server_cpu_us(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == "used_cpu_sys" || k == "used_cpu_user")
                .then(|| v.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum::<f64>()
        * 1e6
}

/// One kind's uncontended cycle: medians over the rounds.
pub(crate) struct CycleRow {
    pub(crate) kind: Kind,
    pub(crate) floor: f64,
    pub(crate) ours: f64,
    /// The median of the rounds' ratios ours / floor.
    pub(crate) ratio: f64,
    /// Commands sent per cycle: the floor's, distlock's (its own count).
    pub(crate) floor_cmds: f64,
    pub(crate) ours_cmds: f64,
    /// Calls the server ran per cycle, a script's inner calls included (INFO commandstats).
    pub(crate) floor_calls: f64,
    pub(crate) ours_calls: f64,
    /// The server's CPU per cycle, µs (median over the rounds).
    pub(crate) floor_cpu_us: f64,
    pub(crate) ours_cpu_us: f64,
    /// Every peer's figure (cycles/s) for this kind.
    pub(crate) peers: Vec<Figure>,
}

/// A semaphore or mutex on one hot name: ours, at some number of waiters.
pub(crate) struct Hot {
    pub(crate) waiters: usize,
    pub(crate) processes: usize,
    pub(crate) per_sec: f64,
    pub(crate) fairness: f64,
    pub(crate) cmds_per_acq: f64,
    pub(crate) calls_per_acq: f64,
    pub(crate) longest_wait_ms: f64,
    pub(crate) errors: u64,
}

/// The read/write mix: ours, or a peer's.
pub(crate) struct Mix {
    pub(crate) per_sec: f64,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) fairness: f64,
    pub(crate) cmds_per_acq: Option<f64>,
    pub(crate) calls_per_acq: f64,
    pub(crate) errors: u64,
    /// The longest one acquire waited, in ms (ours only: the peers do not say).
    pub(crate) longest_wait_ms: Option<f64>,
}

/// Every P7 figure of a run.
pub(crate) struct P7 {
    pub(crate) rounds: usize,
    pub(crate) cycles: usize,
    pub(crate) millis: u64,
    /// The peers with at least one P7 figure (the others said n/a to all).
    pub(crate) peer_names: Vec<String>,
    /// The peers that said n/a to every P7 mode.
    pub(crate) left_out: Vec<String>,
    /// For every peer of the run: whether it is kept (it has a P7 figure).
    keep: Vec<bool>,
    pub(crate) cycle_rows: Vec<CycleRow>,
    /// The semaphore on one hot name, by waiters.
    pub(crate) hot: Vec<Hot>,
    pub(crate) hot_peers: Vec<PeerContention>,
    /// One hot exclusive key (a writer), 4 × 16, beside the peers' mutexes.
    pub(crate) hot_mutex: Contention,
    pub(crate) hot_mutex_peers: Vec<PeerContention>,
    pub(crate) mix: Mix,
    pub(crate) mix_peers: Vec<(String, Result<Mix, Figure>)>,
    pub(crate) mix_shape: (usize, usize),
}

/// Runs P7 on `server` with the peers of `peer_list`.
pub(crate) fn run(
    server: &RedisServer,
    rt: &tokio::runtime::Runtime,
    rt2: &tokio::runtime::Runtime,
    (rounds, cycles, millis): (usize, usize, u64),
    waiters: &[usize],
    threads: usize,
    peer_list: &[peers::Peer],
) -> P7 {
    let url = server.url();
    let (cycle_rows, keep) = rt.block_on(measure_cycles(server, &url, rounds, cycles, peer_list));
    let p7_peers: Vec<&peers::Peer> = peer_list
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(p, _)| p)
        .collect();
    let left_out = peer_list
        .iter()
        .zip(&keep)
        .filter(|(_, k)| !**k)
        .map(|(p, _)| p.name.clone())
        .collect();
    let mut hot = Vec::new();
    for &w in waiters {
        let tasks = (w / PROCESSES).max(1);
        let (values, calls) =
            rt2.block_on(ours_load(server, Load::Permits, tasks, millis, threads));
        let c = counted(&values, calls, millis);
        hot.push(Hot {
            waiters: PROCESSES * tasks,
            processes: PROCESSES,
            per_sec: c.per_sec,
            fairness: c.fairness,
            cmds_per_acq: c.cmds_per_acq.unwrap_or(0.0),
            calls_per_acq: c.calls_per_acq,
            longest_wait_ms: c.longest_wait_ms.unwrap_or(0.0),
            errors: c.errors,
        });
    }
    let top = *waiters.last().unwrap_or(&64);
    let shape = (PROCESSES, (top / PROCESSES).max(1));
    let hot_peers = p7_peers
        .iter()
        .map(|p| {
            let args = |start_ns: u64| {
                vec![
                    url.clone(),
                    PERMITS.to_string(),
                    shape.1.to_string(),
                    start_ns.to_string(),
                    millis.to_string(),
                    "0".to_owned(),
                ]
            };
            let result = p2::peer_processes(server, p, "sem-contend", args, shape.0, millis).map(
                |(v, calls)| {
                    let c = counted(&v, calls, millis);
                    p2::PeerP2 {
                        per_sec: c.per_sec,
                        fairness: c.fairness,
                        calls_per_acq: c.calls_per_acq,
                        errors: c.errors,
                    }
                },
            );
            PeerContention {
                name: p.name.clone(),
                hold_us: 0,
                result,
            }
        })
        .collect();
    let hot_mutex = rt2.block_on(p2::contention(
        server,
        Mode::Events,
        shape.0 * shape.1,
        millis,
        threads,
        (0, 0),
    ));
    let hot_mutex_peers = p7_peers
        .iter()
        .map(|p| p2::peer_contention(server, p, shape, millis, 0))
        .collect();
    let (values, calls) = rt2.block_on(ours_load(server, Load::Mix, shape.1, millis, threads));
    let mix = counted(&values, calls, millis);
    let mix_peers = p7_peers
        .iter()
        .map(|p| {
            let args = |start_ns: u64| {
                vec![
                    url.clone(),
                    shape.1.to_string(),
                    start_ns.to_string(),
                    millis.to_string(),
                    WRITE_PCT.to_string(),
                ]
            };
            let r = p2::peer_processes(server, p, "rw-mix", args, shape.0, millis)
                .map(|(v, calls)| counted(&v, calls, millis));
            (p.name.clone(), r)
        })
        .collect();
    P7 {
        rounds,
        cycles,
        millis,
        peer_names: p7_peers.iter().map(|p| p.name.clone()).collect(),
        left_out,
        keep,
        cycle_rows,
        hot,
        hot_peers,
        hot_mutex,
        hot_mutex_peers,
        mix,
        mix_peers,
        mix_shape: shape,
    }
}

/// The uncontended cycles, floors, distlock and peers in interleaved rounds; and which peers
/// have any P7 figure.
async fn measure_cycles(
    server: &RedisServer,
    url: &str,
    rounds: usize,
    cycles: usize,
    peer_list: &[peers::Peer],
) -> (Vec<CycleRow>, Vec<bool>) {
    let raw = redis::Client::open(url).expect("client");
    let mut conn = raw
        .get_multiplexed_async_connection()
        .await
        .expect("async connection");
    let mut info = raw
        .get_multiplexed_async_connection()
        .await
        .expect("async connection");
    let f = Floors {
        read_acquire: redis::Script::new(FLOOR_READ_ACQUIRE),
        read_release: redis::Script::new(FLOOR_READ_RELEASE),
        permit_acquire: redis::Script::new(FLOOR_PERMIT_ACQUIRE),
        release: redis::Script::new(RELEASE_LUA),
    };
    let ours = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
    // Warm-up (scripts loaded), and the commands and server calls of one cycle, untimed.
    const COUNTED: usize = 200;
    let mut counts = Vec::new();
    for kind in Kind::ALL {
        floor_cycles(&mut conn, &f, kind, 50).await;
        ours_cycles(&ours, kind, 50).await;
        let before = total_calls(server);
        floor_cycles(&mut conn, &f, kind, COUNTED).await;
        let floor_calls = total_calls(server).saturating_sub(before + 1) as f64 / COUNTED as f64;
        let sent = ours
            .engine::<RedisBackend>()
            .expect("a Redis client")
            .commands_sent();
        let before = total_calls(server);
        ours_cycles(&ours, kind, COUNTED).await;
        let ours_calls = total_calls(server).saturating_sub(before + 1) as f64 / COUNTED as f64;
        let ours_cmds = (ours
            .engine::<RedisBackend>()
            .expect("a Redis client")
            .commands_sent()
            - sent) as f64
            / COUNTED as f64;
        counts.push((floor_calls, ours_calls, ours_cmds));
    }
    // [kind] -> (floor/s, ours/s, ratio, floor cpu, ours cpu) per round
    let mut per: Vec<[Vec<f64>; 5]> = (0..3).map(|_| Default::default()).collect();
    let mut peer_rounds: Vec<Vec<Vec<Figure>>> = vec![vec![Vec::new(); peer_list.len()]; 3];
    for _ in 0..rounds {
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            let c0 = server_cpu_us(&mut info).await;
            let fl = floor_cycles(&mut conn, &f, kind, cycles).await;
            let c1 = server_cpu_us(&mut info).await;
            let us = ours_cycles(&ours, kind, cycles).await;
            let c2 = server_cpu_us(&mut info).await;
            // The INFO between the two runs is one call; its CPU is noise at this scale.
            per[k][0].push(fl);
            per[k][1].push(us);
            per[k][2].push(us / fl);
            per[k][3].push((c1 - c0) / cycles as f64);
            per[k][4].push((c2 - c1) / cycles as f64);
            for (i, peer) in peer_list.iter().enumerate() {
                // A mode a peer lacks is asked once.
                let said = &mut peer_rounds[k][i];
                if matches!(said.last(), Some(Figure::NotApplicable(_))) {
                    continue;
                }
                said.push(peer.figure(&kind.peer_args(cycles, url)));
            }
        }
    }
    let keep = (0..peer_list.len())
        .map(|i| {
            (0..3).any(|k| {
                !matches!(
                    peer_rounds[k][i].last(),
                    Some(Figure::NotApplicable(_)) | None
                )
            })
        })
        .collect();
    let rows = Kind::ALL
        .into_iter()
        .enumerate()
        .map(|(k, kind)| {
            let [fl, us, ratio, fc, uc] = std::mem::take(&mut per[k]);
            CycleRow {
                kind,
                floor: median(fl),
                ours: median(us),
                ratio: median(ratio),
                floor_cmds: 2.0,
                ours_cmds: counts[k].2,
                floor_calls: counts[k].0,
                ours_calls: counts[k].1,
                floor_cpu_us: median(fc),
                ours_cpu_us: median(uc),
                peers: peer_rounds[k]
                    .iter()
                    .map(|v| peers::median_figure(v))
                    .collect(),
            }
        })
        .collect();
    (rows, keep)
}

/// What the P7 worker processes do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Load {
    /// Every task takes one of the 4 permits of one name.
    Permits,
    /// Every task reads (90%) or writes (10%) under one read-write lock.
    Mix,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Permits => "permits",
            Load::Mix => "mix",
        }
    }
}

/// One P7 worker process: `tasks` tasks acquire and release (zero hold) in a loop from
/// `start_ns` for `millis`; prints `{"acquisitions", "reads", "writes", "commands"}` as one
/// JSON line (acquisitions counted before the stop time only, as the peers count).
pub(crate) async fn worker(url: String, tasks: usize, start_ns: u64, millis: u64, load: Load) {
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let client = LockClient::builder(backend)
        .options(p2::options(Mode::Events))
        .local_queue(true)
        .build();
    let now = mono_ns();
    if start_ns > now {
        tokio::time::sleep(Duration::from_nanos(start_ns - now)).await;
    }
    let stop = start_ns + millis * 1_000_000;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let c = client.clone();
        // A xorshift generator per task, seeded apart: which acquisitions write.
        let mut x: u64 = (u64::from(std::process::id()) << 20) ^ ((t as u64 + 1) * 0x9E37_79B9);
        handles.push(tokio::spawn(async move {
            let (mut reads, mut writes, mut errors, mut longest) = (0u64, 0u64, 0u64, 0u64);
            while mono_ns() < stop {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let write = load == Load::Mix && x % 100 < u64::from(WRITE_PCT);
                let req = match load {
                    Load::Permits => c.lock("p7:hot").permits(PERMITS),
                    Load::Mix if write => c.lock("p7:mix"),
                    Load::Mix => c.lock("p7:mix").shared(),
                };
                // Waits until the end of the run and GRACE beyond; longer is an error (counted).
                let asked = mono_ns();
                let budget = Duration::from_nanos(stop.saturating_sub(asked)) + GRACE;
                let g = match req.wait_timeout(budget).acquire().await {
                    Ok(g) => g,
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("distlock-bench p7-worker: {e}");
                        }
                        errors += 1;
                        longest = longest.max(mono_ns() - asked);
                        continue;
                    }
                };
                let now = mono_ns();
                longest = longest.max(now - asked);
                if now < stop {
                    if write {
                        writes += 1;
                    } else {
                        reads += 1;
                    }
                }
                if g.release().await.is_err() {
                    errors += 1;
                }
            }
            (reads, writes, errors, longest)
        }));
    }
    let (mut reads, mut writes, mut errors, mut longest) = (0, 0, 0, 0);
    for h in handles {
        let (r, w, e, l) = h.await.expect("task");
        reads += r;
        writes += w;
        errors += e;
        longest = longest.max(l);
    }
    let commands = client
        .engine::<RedisBackend>()
        .expect("a Redis client")
        .commands_sent();
    println!(
        "{}",
        serde_json::json!({
            "acquisitions": reads + writes, "reads": reads, "writes": writes,
            "commands": commands, "errors": errors, "longest_wait_ns": longest,
        })
    );
}

/// Runs `load` in 4 worker processes of `tasks` tasks each: what each printed, and the calls
/// the server ran meanwhile.
async fn ours_load(
    server: &RedisServer,
    load: Load,
    tasks: usize,
    millis: u64,
    threads: usize,
) -> (Vec<serde_json::Value>, u64) {
    let before = total_calls(server);
    let start_ns = mono_ns() + 400_000_000;
    let children = spawn_workers(
        server,
        "p7-worker",
        PROCESSES,
        (tasks, start_ns, millis, threads),
        &["--load", load.name()],
    );
    let mut values = Vec::new();
    for child in children {
        let line = first_line(child).await;
        values.push(serde_json::from_str(&line).expect("worker JSON"));
    }
    let calls = total_calls(server).saturating_sub(before + 1);
    (values, calls)
}

/// The figures of a load from what its processes printed.
fn counted(values: &[serde_json::Value], calls: u64, millis: u64) -> Mix {
    let get = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    let per: Vec<u64> = values.iter().map(|v| get(v, "acquisitions")).collect();
    let total: u64 = per.iter().sum();
    let max = per.iter().copied().max().unwrap_or(0).max(1);
    let min = per.iter().copied().min().unwrap_or(0);
    let cmds = values
        .iter()
        .map(|v| v["commands"].as_u64())
        .sum::<Option<u64>>();
    Mix {
        per_sec: total as f64 / (millis as f64 / 1000.0),
        reads: values.iter().map(|v| get(v, "reads")).sum(),
        writes: values.iter().map(|v| get(v, "writes")).sum(),
        fairness: min as f64 / max as f64,
        cmds_per_acq: cmds.map(|c| c as f64 / total.max(1) as f64),
        calls_per_acq: calls as f64 / total.max(1) as f64,
        errors: values.iter().map(|v| get(v, "errors")).sum(),
        longest_wait_ms: values
            .iter()
            .map(|v| v["longest_wait_ns"].as_u64())
            .max()
            .flatten()
            .map(|ns| ns as f64 / 1e6),
    }
}

mod render;

pub(crate) use render::spaced;
