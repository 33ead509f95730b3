//! The scenarios: an engine, a mix of operations and a list of faults to draw from.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::engine::EngineKind;

/// A fault the injector can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// SIGSTOP of the next holder that checks its lease before writing, for 0.5–3 × TTL.
    PauseHolder,
    /// SIGKILL of a holder; a new worker process takes its place.
    KillHolder,
    /// SIGSTOP of a server for 0.2–1.5 × TTL.
    PauseServer,
    /// SIGKILL of a server, restarted at once or after 0.5–2 × TTL (with the engine's
    /// persistence setting).
    RestartServer,
    /// Replies held back by the proxy: mostly by less than the request timeout (slow grants),
    /// sometimes by 0.3–1.2 × TTL (timeouts); one worker's until it has held the lock a TTL,
    /// or every worker's for 3–6 × TTL.
    DelayReplies,
    /// One worker's requests reach the server but replies are lost and the connection reset
    /// (the proxy), for a short while.
    LoseReplies,
    /// One worker cut off from the servers (the proxy drops everything), for 0.5–3 × TTL.
    Partition,
    /// The servers' clock jumps forward by 0.3–1 × TTL (lock keys' PTTL shrinks).
    ServerClockJump,
    /// A worker's wall clock jumps back by 2–4 × TTL while it holds the lock, and it is paused
    /// past its lease (libfaketime).
    ClientClockJump,
    /// The holder's lock is deleted on the server (an operator, a flush): loss detection.
    Steal,
    /// Replicated deployments: the master's replica paused and its link cut while the master
    /// goes on alone (0.3–0.8 × TTL, and until a new holder took the lock there, 3 × TTL at
    /// most, kept 200 ms), then the master killed, so the replica is promoted without the last
    /// acquisitions; the old master restarts empty after the fail-over.
    LaggingFailover,
    /// memcached: the cache filled with junk until the lock's item is evicted.
    Evict,
}

impl Fault {
    /// The name in histories and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::PauseHolder => "pause-holder",
            Fault::KillHolder => "kill-holder",
            Fault::PauseServer => "pause-server",
            Fault::RestartServer => "restart-server",
            Fault::DelayReplies => "delay-replies",
            Fault::LoseReplies => "lose-replies",
            Fault::Partition => "partition",
            Fault::ServerClockJump => "server-clock-jump",
            Fault::ClientClockJump => "client-clock-jump",
            Fault::Steal => "steal",
            Fault::LaggingFailover => "lagging-failover",
            Fault::Evict => "evict",
        }
    }
}

/// The kind of lock a scenario's operations take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kinds {
    /// A mutex: every operation reads and writes the resource.
    Mutex,
    /// A read-write lock: writers read and write the resource, readers (this share of the
    /// operations) read it.
    ReadWrite { read_share: f64 },
    /// A semaphore of this many permits: holders read the resource.
    Semaphore { permits: u32 },
    /// An election: each operation campaigns, and the leader reads and writes the resource
    /// with its epoch, then resigns.
    Election,
    /// Several names at once (`lock_many`): each operation takes 1 or more of `names` names
    /// (`k0`, `k1`, …), chosen at random (one with `lock`, more with `lock_many`), and reads and
    /// writes each one's resource with its fence.
    Many { names: usize },
    /// Group partitions: each operation is a worker's membership of the group `g` of this many
    /// partitions (a stint of 2–6 TTLs, left gracefully or dropped); while the member owns a
    /// partition it reads and writes that partition's resource (`p0`, `p1`, …) with the
    /// partition's fence. Each partition's history is checked on its own (`partitions.rs`).
    Partitions { partitions: u32 },
}

/// One scenario.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) engine: EngineKind,
    pub(crate) workers: usize,
    pub(crate) ttl: Duration,
    pub(crate) faults: Vec<Fault>,
    /// Share of operations that do not renew and hold past the TTL (release after expiry).
    pub(crate) expire_share: f64,
    /// Share of operations that abandon (leak) their guard.
    pub(crate) abandon_share: f64,
    /// Share of operations whose future is dropped part way.
    pub(crate) cancel_share: f64,
    /// Share of operations that hold 1–3 × TTL, renewing (losses happen while they hold).
    pub(crate) long_share: f64,
    /// Whether the other (short) operations renew their lease.
    pub(crate) renew: bool,
    /// Workers run in their own network namespaces; partitions are nftables rules there
    /// (otherwise the proxy drops the traffic).
    pub(crate) netns: bool,
    /// The protected resource also runs in its SQL form, on a PostgreSQL of its own.
    pub(crate) sql: bool,
    /// The kind of lock.
    pub(crate) kinds: Kinds,
}

impl Scenario {
    fn new(name: &'static str, about: &'static str, engine: EngineKind) -> Scenario {
        Scenario {
            name,
            about,
            engine,
            workers: 4,
            ttl: Duration::from_millis(1000),
            faults: Vec::new(),
            expire_share: 0.0,
            abandon_share: 0.0,
            cancel_share: 0.0,
            long_share: 0.0,
            renew: true,
            netns: false,
            sql: false,
            kinds: Kinds::Mutex,
        }
    }

    fn faults(mut self, faults: &[Fault]) -> Scenario {
        self.faults = faults.to_vec();
        self
    }

    /// Whether operations take several names at once (see [`Kinds::Many`]).
    pub(crate) fn many(&self) -> bool {
        matches!(self.kinds, Kinds::Many { .. })
    }

    /// Whether operations are memberships of a group (see [`Kinds::Partitions`]).
    pub(crate) fn partitions(&self) -> bool {
        matches!(self.kinds, Kinds::Partitions { .. })
    }

    /// The longest an operation can take, waits included.
    pub(crate) fn max_op_time(&self) -> Duration {
        if self.partitions() {
            // A stint, its join and its leave (the grace, then the releases).
            return self.wait() + 8 * self.ttl;
        }
        self.wait() + 3 * self.ttl
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(8)
    }

    /// The `n`th operation, drawn from the scenario's mix.
    pub(crate) fn op(&self, n: u64, rng: &mut StdRng) -> Value {
        let ttl = self.ttl.as_millis() as u64;
        if let Kinds::Partitions { partitions } = self.kinds {
            // A membership: joined for 2-6 TTLs, then left gracefully (or, one time in five,
            // dropped: every partition let go at once), after a pause of up to half a TTL.
            return json!({
                "op": "member", "n": n, "key": "g", "kind": "member",
                "partitions": partitions,
                "hold_ms": rng.random_range(ttl * 2..=ttl * 6),
                "delay_ms": rng.random_range(0..=ttl / 2),
                "end": if rng.random_bool(0.8) { "leave" } else { "drop" },
                "wait_ms": self.wait().as_millis() as u64,
                "seed": rng.random::<u64>(),
            });
        }
        let roll: f64 = rng.random();
        let (hold, renew, end) = if roll < self.expire_share {
            // Holds past its lease without renewing, then releases: release after expiry.
            (rng.random_range(ttl * 11 / 10..=ttl * 2), false, "release")
        } else if roll < self.expire_share + self.abandon_share {
            (rng.random_range(5..=30), true, "abandon")
        } else if roll < self.expire_share + self.abandon_share + self.cancel_share {
            (rng.random_range(5..=60), true, "cancel")
        } else if roll
            < self.expire_share + self.abandon_share + self.cancel_share + self.long_share
        {
            (rng.random_range(ttl..=ttl * 3), true, "release")
        } else {
            (rng.random_range(5..=40), self.renew, "release")
        };
        let (kind, permits) = match self.kinds {
            Kinds::Mutex => ("exclusive", 0),
            Kinds::ReadWrite { read_share } if rng.random::<f64>() < read_share => ("shared", 0),
            Kinds::ReadWrite { .. } => ("exclusive", 0),
            Kinds::Semaphore { permits } => ("permit", permits),
            Kinds::Election => ("leader", 0),
            Kinds::Many { .. } | Kinds::Partitions { .. } => ("exclusive", 0),
        };
        let mut op = json!({
            "op": "acquire", "n": n, "key": "k",
            "hold_ms": hold, "gap_ms": rng.random_range(5..=20),
            "renew": renew, "end": end,
            "cancel_ms": rng.random_range(1..=80),
            "wait_ms": self.wait().as_millis() as u64,
            "kind": kind, "permits": permits,
        });
        if let Kinds::Many { names } = self.kinds {
            // 1 to all of the names, in a random order (lock_many sorts them); one name is a
            // single-name lock of it, which multi-name locks of the name must exclude.
            let size = rng.random_range(1..=names.max(2));
            let mut keys: Vec<String> = (0..names).map(|i| format!("k{i}")).collect();
            for i in (1..keys.len()).rev() {
                keys.swap(i, rng.random_range(0..=i));
            }
            keys.truncate(size);
            op["key"] = json!(keys[0]);
            op["keys"] = json!(keys);
        }
        op
    }
}

/// Every scenario, in the order of the report. `quick`: the short set CI runs.
pub(crate) fn all() -> Vec<Scenario> {
    use Fault::*;
    let redis = EngineKind::Redis { persist: false };
    let redis_aof = EngineKind::Redis { persist: true };
    let redlock = EngineKind::Redlock { n: 5 };
    vec![
        Scenario {
            sql: true,
            ..Scenario::new(
                "redis-holder-pause",
                "single Redis; holders paused right after checking their lease (resource in memory and in PostgreSQL)",
                redis,
            )
            .faults(&[PauseHolder])
        },
        Scenario {
            expire_share: 0.3,
            ..Scenario::new(
                "redis-release-after-expiry",
                "single Redis; holders that do not renew outlive their lease, then release",
                redis,
            )
        },
        Scenario {
            abandon_share: 0.1,
            ..Scenario::new(
                "redis-kill-holder",
                "single Redis; holders killed with SIGKILL, guards abandoned",
                redis,
            )
            .faults(&[KillHolder])
        },
        Scenario::new(
            "redis-lost-replies",
            "single Redis; replies lost (the request took effect) and connections reset",
            redis,
        )
        .faults(&[LoseReplies]),
        Scenario {
            kinds: Kinds::Many { names: 3 },
            long_share: 0.1,
            ..Scenario::new(
                "redis-multi",
                "single Redis; lock of 1 or lock_many of 2 or 3 of 3 names, each checked on its own; holders \
                 paused after their check and killed, replies lost and delayed",
                redis,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, DelayReplies])
        },
        Scenario {
            expire_share: 0.5,
            ..Scenario::new(
                "redis-slow-replies-expiry",
                "single Redis; replies delayed while holders outlive their lease",
                redis,
            )
            .faults(&[DelayReplies])
        },
        Scenario {
            netns: true,
            long_share: 0.1,
            ..Scenario::new(
                "redis-partition",
                "single Redis; workers in their own network namespaces cut off by nftables (drop or reset)",
                redis,
            )
            .faults(&[Partition])
        },
        Scenario {
            cancel_share: 0.25,
            ..Scenario::new(
                "redis-slow-links",
                "single Redis; replies delayed, workers cut off, futures cancelled",
                redis,
            )
            .faults(&[DelayReplies, Partition])
        },
        Scenario::new(
            "redis-server-faults",
            "single Redis with fsync'd AOF; server paused, killed and restarted",
            redis_aof,
        )
        .faults(&[PauseServer, RestartServer]),
        Scenario {
            long_share: 0.8,
            ..Scenario::new(
                "redis-loss",
                "single Redis; locks deleted on the server while held: loss detection",
                redis,
            )
            .faults(&[Steal])
        },
        Scenario {
            renew: false,
            ..Scenario::new(
                "redis-client-clock",
                "single Redis; holders' wall clocks jump back while they are paused past their lease",
                redis,
            )
            .faults(&[ClientClockJump])
        },
        Scenario {
            expire_share: 0.1,
            abandon_share: 0.05,
            cancel_share: 0.1,
            long_share: 0.1,
            sql: true,
            ..Scenario::new(
                "redis-mixed",
                "single Redis; every client-side fault at random",
                redis,
            )
            .faults(&[
                PauseHolder,
                KillHolder,
                LoseReplies,
                DelayReplies,
                Partition,
                PauseServer,
                ClientClockJump,
            ])
        },
        Scenario {
            long_share: 0.3,
            ..Scenario::new(
                "redis-restart-volatile",
                "caveat: single Redis without persistence, killed and restarted (locks lost; the fence keeps rising)",
                redis,
            )
            .faults(&[RestartServer])
        },
        Scenario {
            long_share: 0.5,
            ..Scenario::new(
                "redis-server-clock",
                "caveat: single Redis whose clock jumps forward (lock keys expire early)",
                redis,
            )
            .faults(&[ServerClockJump])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.3,
            ..Scenario::new(
                "sentinel-failover",
                "caveat: Sentinel (master, replica, 3 sentinels) without wait_replicas; the master paused, killed, failed over to a replica that lagged (locks lost; the fence keeps rising)",
                EngineKind::Sentinel { wait: false },
            )
            .faults(&REPLICATED_FAULTS)
        },
        Scenario {
            // A lease that outlives a fail-over (about 2 s here), so that a lock the promoted
            // replica never had is still claimed when the next holder comes.
            ttl: Duration::from_secs(4),
            long_share: 0.3,
            ..Scenario::new(
                "sentinel-wait",
                "Sentinel with wait_replicas=1; the master paused, killed, failed over to a replica that lagged",
                EngineKind::Sentinel { wait: true },
            )
            .faults(&REPLICATED_FAULTS)
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.3,
            ..Scenario::new(
                "cluster-failover",
                "caveat: Redis Cluster (3 masters, a replica each); the lock's master paused, killed, failed over to a replica that lagged (locks lost; the fence keeps rising)",
                EngineKind::Cluster,
            )
            .faults(&REPLICATED_FAULTS)
        },
        Scenario::new(
            "redlock-holder-pause",
            "Redlock over 5 masters; holders paused, killed, replies lost",
            redlock,
        )
        .faults(&[PauseHolder, KillHolder, LoseReplies]),
        Scenario {
            long_share: 0.2,
            netns: true,
            ..Scenario::new(
                "redlock-minority",
                "Redlock over 5 masters; up to two masters paused or restarted, workers cut off",
                redlock,
            )
            .faults(&[PauseServer, RestartServer, Partition])
        },
        Scenario {
            long_share: 0.5,
            ..Scenario::new(
                "redlock-restarts",
                "caveat: Redlock over 5 masters without persistence; a minority restarted while locks are held",
                redlock,
            )
            .faults(&[RestartServer])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.1,
            ..Scenario::new(
                "etcd",
                "etcd; holders paused and killed, links cut and replies lost, the member paused and restarted, locks deleted",
                EngineKind::Etcd,
            )
            .faults(&session_faults(true))
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.1,
            ..Scenario::new(
                "zookeeper",
                "ZooKeeper; holders paused and killed, links cut and replies lost, the server paused, nodes deleted",
                EngineKind::ZooKeeper,
            )
            .faults(&session_faults(false))
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.1,
            sql: true,
            ..Scenario::new(
                "postgres",
                "PostgreSQL; holders paused and killed, links cut and replies lost, the postmaster paused, sessions terminated",
                EngineKind::Postgres,
            )
            .faults(&session_faults(false))
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.1,
            ..Scenario::new(
                "mysql",
                "MariaDB; holders paused and killed, links cut and replies lost, the server paused, killed and restarted, connections killed",
                EngineKind::Mysql,
            )
            .faults(&session_faults(true))
        },
        Scenario {
            ttl: Duration::from_secs(2),
            expire_share: 0.2,
            long_share: 0.3,
            ..Scenario::new(
                "memcached",
                "unsafe by design: memcached (no fence); the lock evicted, the server killed and restarted, holders paused and killed",
                EngineKind::Memcached,
            )
            .faults(&[Evict, RestartServer, PauseHolder, KillHolder])
        },
        Scenario {
            kinds: Kinds::Election,
            long_share: 0.2,
            expire_share: 0.1,
            ..Scenario::new(
                "redis-election",
                "single Redis, leader election: leaders paused and killed, replies lost, workers partitioned; some leaders stop renewing and must step down at their deadline",
                redis,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Election,
            long_share: 0.2,
            expire_share: 0.1,
            ..Scenario::new(
                "etcd-election",
                "etcd, leader election: leaders paused and killed, replies lost, workers partitioned",
                EngineKind::Etcd,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            kinds: Kinds::Partitions { partitions: 8 },
            ..Scenario::new(
                "redis-partitions",
                "single Redis, group of 8 partitions: members join and leave, owners write with the \
                 partition's fence, each partition checked on its own; members paused and killed, \
                 replies lost, workers partitioned",
                redis,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Partitions { partitions: 8 },
            ..Scenario::new(
                "etcd-partitions",
                "etcd, group of 8 partitions: members join and leave, owners write with the \
                 partition's fence, each partition checked on its own; members paused and killed, \
                 replies lost, workers partitioned",
                EngineKind::Etcd,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Election,
            long_share: 0.2,
            ..Scenario::new(
                "postgres-election",
                "PostgreSQL, leader election (leaders recorded in distlock_holders): leaders paused and killed, replies lost, workers partitioned, the postmaster paused, sessions terminated",
                EngineKind::Postgres,
            )
            .faults(&session_faults(false))
        },
        Scenario {
            kinds: Kinds::ReadWrite { read_share: 0.7 },
            long_share: 0.1,
            expire_share: 0.05,
            ..Scenario::new(
                "redis-rw",
                "single Redis, read-write lock (70% readers): holders paused and killed, replies lost, workers partitioned",
                redis,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            kinds: Kinds::Semaphore { permits: 2 },
            long_share: 0.1,
            expire_share: 0.05,
            ..Scenario::new(
                "redis-semaphore",
                "single Redis, semaphore of 2 permits: holders paused and killed, replies lost, workers partitioned",
                redis,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Many { names: 3 },
            long_share: 0.1,
            ..Scenario::new(
                "etcd-multi",
                "etcd; lock of 1 or lock_many of 2 or 3 of 3 names, each checked on its own; holders paused \
                 and killed, replies lost, workers partitioned",
                EngineKind::Etcd,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::ReadWrite { read_share: 0.7 },
            ..Scenario::new(
                "etcd-rw",
                "etcd, read-write lock (70% readers): holders paused and killed, replies lost, workers partitioned",
                EngineKind::Etcd,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::ReadWrite { read_share: 0.7 },
            ..Scenario::new(
                "postgres-rw",
                "PostgreSQL, read-write lock (70% readers, waiters queued by ticket): holders paused and killed, replies lost, workers partitioned, the postmaster paused, sessions terminated",
                EngineKind::Postgres,
            )
            .faults(&session_faults(false))
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Semaphore { permits: 2 },
            ..Scenario::new(
                "zookeeper-semaphore",
                "ZooKeeper, semaphore of 2 permits: holders paused and killed, replies lost, workers partitioned",
                EngineKind::ZooKeeper,
            )
            .faults(&[PauseHolder, KillHolder, LoseReplies, Partition])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            kinds: Kinds::Semaphore { permits: 2 },
            ..Scenario::new(
                "mysql-semaphore",
                "MariaDB, semaphore of 2 permits: holders paused and killed, replies lost, workers partitioned, the server paused, killed and restarted",
                EngineKind::Mysql,
            )
            .faults(&[
                PauseHolder,
                KillHolder,
                LoseReplies,
                Partition,
                PauseServer,
                RestartServer,
            ])
        },
        Scenario {
            ttl: Duration::from_secs(2),
            long_share: 0.6,
            ..Scenario::new(
                "postgres-loss",
                "PostgreSQL; holders' sessions terminated while they hold: loss detection",
                EngineKind::Postgres,
            )
            .faults(&[Fault::Steal])
        },
    ]
}

/// The faults of the replicated Redis deployments: the master paused (failed over when the
/// pause outlasts failure detection), killed (restarted after its fail-over), and failed over
/// to a replica that lagged, drawn twice as often (the fault these deployments exist for).
const REPLICATED_FAULTS: [Fault; 4] = [
    Fault::PauseServer,
    Fault::RestartServer,
    Fault::LaggingFailover,
    Fault::LaggingFailover,
];

/// The faults of the etcd, ZooKeeper, PostgreSQL and MySQL scenarios (`restart`: the server
/// killed and restarted too).
fn session_faults(restart: bool) -> Vec<Fault> {
    use Fault::*;
    let mut v = vec![
        PauseHolder,
        KillHolder,
        LoseReplies,
        Partition,
        PauseServer,
        Steal,
    ];
    if restart {
        v.push(RestartServer);
    }
    v
}

/// The scenario called `name`.
pub(crate) fn by_name(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

/// The short seeded set inside `.ci/run`: holder pause, release after expiry, kill -9 of a
/// holder, a lost reply, multi-name locks and a group's partition owners.
pub(crate) const QUICK: [&str; 6] = [
    "redis-holder-pause",
    "redis-release-after-expiry",
    "redis-kill-holder",
    "redis-lost-replies",
    "redis-multi",
    "redis-partitions",
];

/// A negative control: a seeded bug, the scenario that must catch it, and which checker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Control {
    pub(crate) bug: &'static str,
    pub(crate) scenario: &'static str,
    pub(crate) expect: &'static str,
    /// False while the harness has no scenario that catches it (it is reported, not counted).
    pub(crate) harness_catches: bool,
    /// The shortest run that gives its fault room (seconds; the `--duration` asked for when
    /// longer): a scenario with a long TTL draws few faults in 20 s.
    pub(crate) min_secs: u64,
}

/// Every negative control.
pub(crate) const CONTROLS: [Control; 17] = [
    Control {
        bug: "plain-del",
        scenario: "redis-release-after-expiry",
        expect: "CK5/CK6",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "unconditional-pexpire",
        scenario: "redis-server-clock",
        expect: "CK6",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "reply-time-validity",
        scenario: "redis-slow-replies-expiry",
        expect: "CK5",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "wall-clock",
        scenario: "redis-client-clock",
        expect: "CK5",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "half-quorum",
        scenario: "redlock-minority",
        expect: "CK5",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "keep-partial",
        scenario: "redlock-restarts",
        expect: "CK7 (leaked copies)",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "renew-after-loss",
        scenario: "redis-kill-holder",
        expect: "CK7",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "pg-session-held",
        scenario: "postgres-loss",
        expect: "CK5/CK6 (renewals on a terminated session)",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "counter-fence",
        scenario: "redis-restart-volatile",
        expect: "CK3 (fences start over after a restart)",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "counter-fence",
        scenario: "sentinel-failover",
        expect: "CK3 (the promoted replica's counter is behind)",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "ignore-wait",
        scenario: "sentinel-wait",
        expect: "CK5 (locks the promoted replica never had)",
        harness_catches: true,
        min_secs: 40,
    },
    Control {
        bug: "counter-fence",
        scenario: "cluster-failover",
        expect: "CK3 (the promoted replica's counter is behind)",
        harness_catches: true,
        // A fail-over or two a run: 12 s caught it on the second run.
        min_secs: 20,
    },
    Control {
        bug: "mysql-session-held",
        scenario: "mysql",
        expect: "CK6 (renewals on a killed connection)",
        harness_catches: true,
        // Few acquisitions a second (its kills and pauses): 12 s caught nothing in 3 runs.
        min_secs: 20,
    },
    Control {
        bug: "blind-delete",
        scenario: "memcached",
        expect: "CK6 (a release deletes the next holder's lock)",
        harness_catches: true,
        // Long holds at a 2 s TTL: 15 to 20 acquisitions in 20 s, and a clean-clone CI run
        // (2026-11-29, both shards side by side) caught nothing in 3 such runs. A run stops
        // once it has caught the bug, so the longer bound costs only the runs that miss.
        min_secs: 40,
    },
    Control {
        bug: "reader-ignores-writer",
        scenario: "redis-rw",
        expect: "CK5",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "permit-over-count",
        scenario: "redis-semaphore",
        expect: "CK5",
        harness_catches: true,
        min_secs: 0,
    },
    Control {
        bug: "leader-keeps-leading",
        scenario: "redis-election",
        expect: "CK9 (a leader acting past its deadline)",
        harness_catches: true,
        min_secs: 0,
    },
];
