//! The single-instance Redis engine.
//!
//! This file is `RedisBackend`, its construction, its keys and counters for callers, and its
//! `Backend` wiring; each job is a module of its own.

mod acquire;
mod breaker;
mod fast;
mod many;
mod permits;
mod readers;
mod relabel;
mod release;
mod renew;
mod status;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, Capabilities, Fencing, LeaseCheck, LeaseKind, LeaseRef,
    LockError, LockStatus, Token,
};

use crate::config::{ClusterConfig, RedisConfig};
use crate::connection::ServerConnection;
use crate::error::map_err;
use crate::handover::Handovers;
use crate::keys::{KeyLayout, WakeChannel};
use crate::scripts::Scripts;
use crate::seen::SeenFences;
use crate::subscriber::Subscriber;

/// A lock engine on one Redis server (or a primary whose failover you accept; see the docs on
/// replication).
///
/// - acquire, first attempt: one round trip of two plain commands, `SET key value NX PX ttl`
///   then `ZADD fence GT CH proposed f`, pipelined, where the proposed fence is this client's
///   clock in µs (a second round trip, `ZINCRBY`, when it is not above the counter). The fence
///   is taken while the lock is ours, so it orders holders;
/// - acquire, waiting or resent: one script that also returns the holder's remaining lease and
///   queues the client for a wake-up; a resend with our own token re-arms the TTL and keeps
///   (or takes) a fence;
/// - release: compare-and-delete in a script that, when clients wait, hands the lock to the first
///   of them (written with the token and TTL it registered, and a new fence) and tells only
///   that one, on its own channel (no thundering herd, and the waiter takes the lock without
///   another round trip);
/// - extend: compare-and-pexpire; the watchdog's renewals of many locks go out as one pipeline;
/// - waiting: one shared pub/sub connection (opened at the first wait) listens on this client's
///   wake channel and the keys' keyspace notifications;
/// - connections: requests take a direct connection when it is free (no task hand-offs; see
///   the crate README) and the shared multiplexed one otherwise; the watchdog's renewals always
///   take the shared one;
/// - fencing: a per-key counter that never expires, strictly increasing with every new holder,
///   raised first to a floor: a clock in microseconds (this client's on the first attempt, the
///   server's `TIME` in scripts) and the highest fence this client saw for the lock. A server
///   that lost the counter (restarted without persistence, a replica that lagged and was
///   promoted) starts above every fence given before, unless that clock is behind the one that
///   set the last fence by more than the outage lasted.
#[derive(Clone)]
pub struct RedisBackend {
    conn: ServerConnection,
    layout: KeyLayout,
    scripts: Arc<Scripts>,
    subscriber: Arc<Subscriber>,
    /// Where releases tell this client (see [`WakeChannel`]).
    wake: WakeChannel,
    /// Grants, registrations and hints, shared with the subscriber.
    handovers: Handovers,
    /// The highest fence seen per lock (a floor for the next one).
    seen: Arc<SeenFences>,
    /// The queue registrations of this client's waiting readers, by token (their release
    /// takes them out of the queue).
    reader_regs: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
    /// The members of this client's permits in their semaphores' holder sets, by token (see
    /// `scripts/permits.lua`): renewals and releases name a permit by it.
    permit_members: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.conn.target)
            .field("layout", &self.layout)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to the server a URL names (see [`RedisConfig`] for the accepted forms).
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when the server cannot be reached;
    /// `Auth` when it refuses the credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        if ClusterConfig::is_cluster_url(url) {
            return Self::with_cluster_config(ClusterConfig::from_url(url)?).await;
        }
        Self::with_config(RedisConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: RedisConfig) -> Result<Self, LockError> {
        config.layout.check()?;
        let (conn, client) = ServerConnection::connect(&config).await?;
        Ok(Self::assemble(conn, client, config, None))
    }

    /// Connects to a Redis Cluster through its seed nodes (see [`ClusterConfig`]).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_cluster_config(config: ClusterConfig) -> Result<Self, LockError> {
        let settings = config.settings().clone();
        settings.layout.check()?;
        let conn = ServerConnection::connect_cluster(config.seeds(), &settings).await?;
        let client = settings
            .open_client(&settings.url)
            .map_err(|e| map_err(e, "opening the Redis client"))?;
        let seeds = config.seeds().iter().map(|s| s.url.clone()).collect();
        Ok(Self::assemble(conn, client, settings, Some(seeds)))
    }

    /// The engine over a connection. `cluster_seeds`: the Cluster's seed URLs, where waiters
    /// subscribe to sharded channels.
    fn assemble(
        conn: ServerConnection,
        client: redis::Client,
        config: RedisConfig,
        cluster_seeds: Option<Vec<String>>,
    ) -> Self {
        // This client's place in waiters' queues: its wake channel (one per backend, shared by
        // its tasks), under a random id.
        let wake = WakeChannel::new(
            &config.layout,
            Token::generate().as_str(),
            cluster_seeds.is_some(),
        );
        let handovers = Handovers::default();
        let scripts = Arc::new(Scripts::new());
        let subscriber = Subscriber::new(
            client,
            conn.clone(),
            scripts.clone(),
            &config,
            wake.clone(),
            cluster_seeds,
            handovers.clone(),
        );
        RedisBackend {
            conn,
            wake,
            layout: config.layout,
            scripts,
            subscriber: Arc::new(subscriber),
            handovers,
            seen: Arc::default(),
            reader_regs: Arc::default(),
            permit_members: Arc::default(),
        }
    }

    /// This engine with `other`'s memory of the fences seen: Sentinel's engine on a new master
    /// keeps the floors it sends, so a promoted replica that lagged still gives it rising
    /// fences.
    pub(crate) fn keeping_fences_of(self, other: &RedisBackend) -> Self {
        RedisBackend {
            seen: other.seen.clone(),
            ..self
        }
    }

    /// The Redis key that holds the lock `name` (a plain string whose value is the token).
    /// Another client (redis-py, node-redlock, redsync, `redis-cli SET … NX PX`) that locks this
    /// key excludes ours, and ours excludes it.
    pub fn lock_key(&self, name: &str) -> String {
        self.layout.lock_key(name)
    }

    /// The hash that keeps the token and fence of the holder that came through a script.
    pub fn meta_key(&self, name: &str) -> String {
        KeyLayout::meta_key(&self.layout.lock_key(name))
    }

    /// The fence counter (never expires): a sorted set whose one member, `f`, scores the last
    /// fence given.
    pub fn fence_key(&self, name: &str) -> String {
        KeyLayout::fence_key(&self.layout.lock_key(name))
    }

    /// How many commands this backend has sent to the server on its main connection (each
    /// command of a pipeline counts, and so does a script reload); the pub/sub connection's
    /// SUBSCRIBE/UNSUBSCRIBE are not counted. For measuring commands per acquisition: Redis's
    /// own `INFO commandstats` cannot tell a top-level `SET` from one inside a script.
    pub fn commands_sent(&self) -> u64 {
        self.conn.commands_sent()
    }

    /// The channel this client's waiters are woken on (on a Cluster, the per-lock channels
    /// start with it, up to the client id).
    pub fn wake_channel(&self) -> String {
        self.wake.base().to_owned()
    }
}

#[distlock_core::engine::async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
            .with_shared()
            .with_permits()
            .with_order()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.acquire_inner(req).await
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.renew_inner(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        match lease.kind {
            // Behind boxes of their own: the exclusive release's future stays small (see
            // `acquire_inner`).
            LeaseKind::Permit { .. } => {
                return Box::pin(self.release_permit(lease.name, lease.token)).await;
            }
            LeaseKind::Shared => {
                return Box::pin(self.release_shared(lease.name, lease.token)).await;
            }
            _ => {}
        }
        self.release_inner(lease.name, lease.token, None).await
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(self.holder(key).await?.0)
    }

    distlock_core::capability_getters!(
        batch_renew: BatchRenew,
        wake_source: WakeSource,
        handover: Handover,
        downgrade: Downgrade,
        relabel: Relabel,
        breaker: Breaker,
        lister: Lister,
        linger: Linger,
        multi_lock: MultiLock,
    );
}
