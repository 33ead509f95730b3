//! The single-instance Redis engine.

mod permits;
mod readers;
mod relabel;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::engine::{
    AcquireMode, AcquireRequest, Attempt, Backend, BatchRenew, BoxFuture, BreakOutcome, Breaker,
    Capabilities, Downgrade, Fencing, Handover, HolderStatus, LeaseCheck, LeaseKind, LeaseRef,
    Linger, Listener, Lister, LockError, LockStatus, Names, NextWaiter, Relabel, RenewItem,
    Subscription, Token, WakeSource,
};
use distlock_core::recipes::{HolderValue, shares_unbreakable};

use crate::config::{ClusterConfig, RedisConfig, WaitReplicas};
use redis::Value;

use crate::connection::RenewCall;
use crate::connection::{Acks, ServerConnection, push_wait};
use crate::error::{map_err, protocol, unexpected};
use crate::handover::{Grant, Handovers, registration};
use crate::keys::{KeyLayout, LockKeys, WakeChannel};
use crate::replies::{AcquireReply, StatusReply};
use crate::scripts::{Scripts, ttl_ms, unix_ms};
use crate::seen::SeenFences;
use crate::subscriber::Subscriber;
use distlock_core::seeded::{self, SeededBug};

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

    /// The first attempt, pipelined in one round trip: `SET NX PX`, then the fence,
    /// `ZADD fence GT CH floor f` (the floor becomes the fence if it is above every fence given
    /// so far; see [`fence_floor`]), and `WAIT` for replicas when configured. Plain commands: no
    /// script runs on the fast path. When the floor is not above the counter (another client's
    /// clock ahead of ours, or two acquisitions in one microsecond), a second round trip takes
    /// the next number instead (`ZINCRBY`), still while the lock is ours.
    async fn acquire_fast(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &Token,
        value: &str,
        ttl: &str,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis lock";
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.ignore_errors();
        pipe.cmd("SET")
            .arg(keys.lock())
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl);
        // Seeded bug `counter-fence`: the bare counter, no floor.
        let floor =
            (!seeded::on(SeededBug::CounterFence)).then(|| fence_floor(self.seen.floor(name)));
        match floor {
            Some(floor) => pipe
                .cmd("ZADD")
                .arg(keys.fence())
                .arg("GT")
                .arg("CH")
                .arg(floor)
                .arg("f"),
            None => pipe.cmd("ZINCRBY").arg(keys.fence()).arg(1).arg("f"),
        };
        if let Some(wait) = self.conn.wait {
            push_wait(&mut pipe, wait);
        }
        let replies = self.conn.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
        let fence = match replies.as_slice() {
            [Value::Okay, Value::Int(1), ..] if floor.is_some() => floor,
            [Value::Okay, Value::Int(0), ..] if floor.is_some() => None,
            [Value::Okay, counted, ..] if floor.is_none() => score(counted),
            [Value::Okay, bad, ..] => {
                // The lock is set but the fence failed (junk under the fence key): undo the
                // lock before reporting, so nothing stays half taken.
                self.undo(name, token).await;
                return Err(match bad {
                    Value::ServerError(e) => map_err(e.clone().into(), DOING),
                    other => protocol(DOING, other),
                });
            }
            [Value::Nil, ..] => return Ok(Attempt::Busy { holder_ttl: None }),
            // Refused (NOPERM, a read-only replica…): nothing was written.
            [Value::ServerError(e), ..] => return Err(map_err(e.clone().into(), DOING)),
            _ => return Err(protocol(DOING, &Value::Array(replies))),
        };
        if let Some(wait) = self.conn.wait {
            let acks = wait.acks(replies.get(2), DOING);
            self.undo_unreplicated(name, token, wait, acks).await?;
        }
        let fence = match fence {
            Some(f) => f,
            None => match self.next_number(keys).await {
                Ok(f) => f,
                Err(e) => {
                    self.undo(name, token).await;
                    return Err(e);
                }
            },
        };
        self.seen.record(name, fence);
        Ok(Attempt::Acquired { fence: Some(fence) })
    }

    /// The fence counter's next number (`ZINCRBY`), for a lock of ours whose floor was not
    /// above the counter; waited for by replicas when configured, as the acquisition was.
    async fn next_number(&self, keys: &LockKeys) -> Result<u64, LockError> {
        const DOING: &str = "taking a Redis lock's fence";
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.ignore_errors();
        pipe.cmd("ZINCRBY").arg(keys.fence()).arg(1).arg("f");
        if let Some(wait) = self.conn.wait {
            push_wait(&mut pipe, wait);
        }
        let replies = self.conn.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
        if let Some(wait) = self.conn.wait {
            wait.check(wait.acks(replies.get(1), DOING))?;
        }
        match replies.first() {
            Some(Value::ServerError(e)) => Err(map_err(e.clone().into(), DOING)),
            Some(v) => score(v).ok_or_else(|| protocol(DOING, v)),
            None => Err(protocol(DOING, &Value::Array(replies))),
        }
    }

    /// Releases a lock this client has just taken and must not keep (if that fails, it expires
    /// with its TTL).
    async fn undo(&self, key: &str, token: &Token) {
        if let Err(e) = self.release_inner(key, token, None).await {
            tracing::warn!(target: "distlock", key, error = %e,
                "could not undo a lock taken in vain; it expires with its TTL");
        }
    }

    /// With `WAIT`: releases a lock just taken or renewed (and errs) unless enough replicas
    /// acknowledged it. A lock whose copy may be missing on the replicas is not reported held.
    async fn undo_unreplicated(
        &self,
        key: &str,
        token: &Token,
        wait: WaitReplicas,
        acks: Acks,
    ) -> Result<(), LockError> {
        let Err(e) = wait.check(acks) else {
            return Ok(());
        };
        self.undo(key, token).await;
        Err(e)
    }

    /// Compare-and-delete, or hand-over to the next queued client; with `next`, this client
    /// stays in the queue (or joins its back) in the same script, registered for `next` (its
    /// tasks still wait).
    async fn release_inner(
        &self,
        key: &str,
        token: &Token,
        next: Option<&NextWaiter<'_>>,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redis lock";
        let keys = self.layout.keys(key);
        let next = next.filter(|_| self.subscriber.is_watching(key));
        let plan = self
            .handovers
            .plan_release(key, token.as_str(), next.map(|n| n.ttl));
        let wake = self.wake.for_lock(keys.lock());
        let mine = next.map_or_else(String::new, |n| {
            registration(&wake, n.ttl, plan.seq, n.token.as_str(), n.owner)
        });
        // Nothing but the token and the clock in the common case: the script needs no more.
        let mut now = itoa::Buffer::new();
        let full = [
            token.as_str(),
            now.format(unix_ms()),
            mine.as_str(),
            plan.believed.as_str(),
            &wake,
        ];
        let args = if mine.is_empty() && plan.believed.is_empty() {
            &full[..2]
        } else {
            &full[..]
        };
        let reply = self
            .conn
            .run_after_ping(
                &self.scripts.release,
                &[keys.lock(), keys.meta(), keys.waiters(), keys.fence()],
                args,
                DOING,
                plan.lead,
            )
            .await?;
        self.handovers
            .released(key, &reply, plan, mine, next.map(|n| n.token.as_str()))
            .ok_or_else(|| unexpected(DOING, reply))
    }

    /// A lock a release handed to us, as the attempt reports it. With `WAIT`, it is renewed
    /// first, by us, and the renewal waited for: the hand-over was written by the releasing
    /// client, whose writes our `WAIT` does not cover, and replication keeps order, so the
    /// renewal's acknowledgement covers the hand-over too.
    async fn replicate_grant(
        &self,
        req: &AcquireRequest<'_>,
        granted: Attempt,
    ) -> Result<Attempt, LockError> {
        let (Some(wait), Attempt::AcquiredEarlier { fence, .. }) = (self.conn.wait, &granted)
        else {
            return Ok(granted);
        };
        const DOING: &str = "acquiring a Redis lock";
        let mut ms = itoa::Buffer::new();
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.extend,
                &[&self.layout.lock_key(req.name)],
                &[req.token.as_str(), ms.format(ttl_ms(req.ttl))],
                DOING,
            )
            .await?;
        match check {
            LeaseCheck::Ours => {
                let acks = acks.unwrap_or(Ok(0));
                self.undo_unreplicated(req.name, req.token, wait, acks)
                    .await?;
                Ok(Attempt::Acquired { fence: *fence })
            }
            // It ran out before we could use it.
            _ => Ok(Attempt::Busy { holder_ttl: None }),
        }
    }
}

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

    fn acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            const DOING: &str = "acquiring a Redis lock";
            match req.kind {
                LeaseKind::Permit { permits } => return self.acquire_permit(req, permits).await,
                LeaseKind::Shared => return self.acquire_shared(req).await,
                _ => {}
            }
            // A lock handed to this wait needs no request at all: look first.
            let other = match self.handovers.take_grant(req.name, req.token.as_str()) {
                Some(Ok(granted)) => {
                    distlock_core::metrics::handoff(self.name(), "server");
                    if let Attempt::AcquiredEarlier {
                        fence: Some(fence), ..
                    } = granted
                    {
                        self.seen.record(req.name, fence);
                    }
                    return self.replicate_grant(req, granted).await;
                }
                Some(Err(other)) => Some(other),
                None => None,
            };
            let keys = self.layout.keys(req.name);
            let mut ttl = itoa::Buffer::new();
            let ttl = ttl.format(ttl_ms(req.ttl));
            let token = req.token.as_str();
            let value = HolderValue::now(token, req.owner).encode();
            let convert = other.as_ref().and_then(Grant::unused_token).unwrap_or("");
            // The first attempt's pipeline records no holder in the meta hash: a request whose
            // fence `status` must give (an election's epoch) takes the script.
            if req.mode == AcquireMode::Try && !req.recorded && convert.is_empty() {
                return self
                    .acquire_fast(req.name, &keys, req.token, &value, ttl)
                    .await;
            }
            if !req.mode.is_resend()
                && convert.is_empty()
                && let Some(left) = self.handovers.elsewhere_left(req.name)
            {
                return Ok(Attempt::Busy {
                    holder_ttl: Some(left),
                });
            }
            // Queue up for a grant only while subscribed to wake-ups (they bring it).
            let watching = self.subscriber.is_watching(req.name);
            let (seq, elem, believed) = if watching {
                let (seq, believed) = self.handovers.queue_for(req.name, req.ttl);
                let wake = self.wake.for_lock(keys.lock());
                let elem = registration(&wake, req.ttl, seq, token, req.owner);
                (seq, elem, believed)
            } else {
                (0, String::new(), String::new())
            };
            let mut floor = itoa::Buffer::new();
            let floor = floor.format(self.seen.floor(req.name));
            let reply = self
                .conn
                .run_waited(
                    &self.scripts.acquire,
                    &[keys.lock(), keys.meta(), keys.waiters(), keys.fence()],
                    &[token, &value, ttl, &elem, convert, &believed, floor],
                    DOING,
                )
                .await;
            let (reply, acks) = match reply {
                Ok(r) => r,
                Err(e) => {
                    if let Some(g) = other {
                        // Not taken over (or not known to be): leave it for the next attempt or
                        // for `leave`.
                        self.handovers.restore_grant(req.name, g);
                    }
                    return Err(e);
                }
            };
            match reply {
                AcquireReply::Acquired { fence } => {
                    self.seen.record(req.name, fence);
                    // Taken after a wait: others may wait too, and its release may hand over.
                    self.handovers
                        .acquired(req.name, token, fence, req.mode.waits(), watching);
                    if let (Some(wait), Some(acks)) = (self.conn.wait, acks) {
                        self.undo_unreplicated(req.name, req.token, wait, acks)
                            .await?;
                    }
                    Ok(Attempt::Acquired { fence: Some(fence) })
                }
                AcquireReply::Busy { holder_ttl, queued } => {
                    if watching {
                        // Unless queued, our earlier registration stays: this one was not used.
                        self.handovers.busy(req.name, seq, queued, elem);
                    }
                    // No TTL: a foreign lock without one, or the key vanished in between.
                    Ok(Attempt::Busy { holder_ttl })
                }
            }
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
            const DOING: &str = "extending a Redis lock";
            match lease.kind {
                LeaseKind::Permit { .. } => {
                    return self.renew_permit(lease.name, lease.token, ttl).await;
                }
                LeaseKind::Shared => return self.renew_shared(lease.name, lease.token, ttl).await,
                _ => {}
            }
            let (key, token) = (lease.name, lease.token);
            let lock_key = self.layout.lock_key(key);
            let ms = ttl_ms(ttl).to_string();
            let (check, acks) = self
                .conn
                .run_waited(
                    &self.scripts.extend,
                    &[&lock_key],
                    &[token.as_str(), &ms],
                    DOING,
                )
                .await?;
            if let (Some(wait), Some(acks), LeaseCheck::Ours) = (self.conn.wait, acks, check) {
                // Renewed here, not known to be on the replicas: not a renewal to count on.
                wait.check(acks)?;
            }
            Ok(check)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
            match lease.kind {
                LeaseKind::Permit { .. } => {
                    return self.release_permit(lease.name, lease.token).await;
                }
                LeaseKind::Shared => return self.release_shared(lease.name, lease.token).await,
                _ => {}
            }
            self.release_inner(lease.name, lease.token, None).await
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(async move { Ok(self.holder(key).await?.0) })
    }

    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        Some(self)
    }

    fn wake_source(&self) -> Option<&dyn WakeSource> {
        Some(self)
    }

    fn handover(&self) -> Option<&dyn Handover> {
        Some(self)
    }

    fn downgrade(&self) -> Option<&dyn Downgrade> {
        Some(self)
    }

    fn relabel(&self) -> Option<&dyn Relabel> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }

    fn lister(&self) -> Option<&dyn Lister> {
        Some(self)
    }

    fn linger(&self) -> Option<&dyn Linger> {
        Some(self)
    }
}

/// A lease of every kind lives in keys whose own expiry (and, for readers and permits, their
/// members' deadlines) ends it: leaving one is renewing it, compare-and-set, to the time left.
impl Linger for RedisBackend {
    fn linger<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.renew(lease, ttl))
    }
}

/// `SCAN` over the server, or over every master of a Cluster (see `list`).
impl Lister for RedisBackend {
    fn names<'a>(
        &'a self,
        prefix: &'a str,
        budget: usize,
    ) -> BoxFuture<'a, Result<Names, LockError>> {
        Box::pin(crate::list::names(&self.conn, &self.layout, prefix, budget))
    }
}

impl BatchRenew for RedisBackend {
    /// All renewals in one pipeline, locks, readers and permits alike: one round trip however
    /// many leases are held (on a Cluster, one per slot, sent together).
    fn renew_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>> {
        Box::pin(async move {
            const DOING: &str = "renewing Redis locks";
            if items.is_empty() {
                return Vec::new();
            }
            let calls: Vec<RenewCall<'_>> = items
                .iter()
                .map(|i| {
                    let lock = self.layout.lock_key(i.lease.name);
                    match i.lease.kind {
                        LeaseKind::Shared => {
                            let readers = readers::readers_key(&lock);
                            RenewCall {
                                script: &self.scripts.read_extend,
                                keys: vec![lock, readers],
                                extra: None,
                            }
                        }
                        LeaseKind::Permit { .. } => RenewCall {
                            script: &self.scripts.permit_extend,
                            keys: permits::PermitKeys::new(lock).four_owned(),
                            extra: Some(self.permit_member(i.lease.token)),
                        },
                        _ => RenewCall {
                            script: &self.scripts.extend,
                            keys: vec![lock],
                            extra: None,
                        },
                    }
                })
                .collect();
            self.conn.renew_batch(&calls, items, DOING).await
        })
    }
}

impl WakeSource for RedisBackend {
    /// An exclusive waiter is counted while it waits: a lock handed to this client while none
    /// waits (only its readers or permits do, which never take a writer's grant) is passed on
    /// at once, and the last one's going takes our writers' registrations out of the queue.
    /// A permit's waiter is told by its token (permit_release.lua), so it subscribes with it.
    fn subscribe<'a>(
        &'a self,
        key: &'a str,
        who: Listener<'a>,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        Box::pin(async move {
            let Listener::Waiter { kind, token } = who else {
                return Ok(Some(
                    self.subscriber
                        .subscribe(key, None, self.conn.response_timeout)
                        .await,
                ));
            };
            let token = matches!(kind, LeaseKind::Permit { .. }).then_some(token);
            self.subscribe_waiter(key, kind, token).await
        })
    }

    fn watching(&self, key: &str) -> bool {
        self.subscriber.is_watching(key)
    }
}

impl RedisBackend {
    /// A waiter's subscription (by `token` where its wake-ups are addressed to it).
    fn subscribe_waiter<'a>(
        &'a self,
        key: &'a str,
        kind: LeaseKind,
        token: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        Box::pin(async move {
            if kind != LeaseKind::Exclusive {
                return Ok(Some(
                    self.subscriber
                        .subscribe(key, token, self.conn.response_timeout)
                        .await,
                ));
            }
            self.handovers.writer_waits(key);
            let guard = WriterWait {
                handovers: self.handovers.clone(),
                subscriber: self.subscriber.clone(),
                key: key.to_owned(),
            };
            let sub = self
                .subscriber
                .subscribe(key, None, self.conn.response_timeout)
                .await;
            Ok(Some(sub.with_guard(guard)))
        })
    }
}

/// An exclusive waiter of this client, counted until its subscription drops.
struct WriterWait {
    handovers: Handovers,
    subscriber: Arc<Subscriber>,
    key: String,
}

impl Drop for WriterWait {
    fn drop(&mut self) {
        if self.handovers.writer_done(&self.key) {
            self.subscriber.writers_left(&self.key);
        }
    }
}

impl Handover for RedisBackend {
    fn release_requeue<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        next: &'a NextWaiter<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.release_inner(lease.name, lease.token, Some(next)))
    }
}

impl Breaker for RedisBackend {
    /// Releases the lock with its holder's token, read first: exactly a release by the holder
    /// (the next waiting client is handed the lock, or woken).
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(async move {
            let (st, token) = self.holder(key).await?;
            if st.holders.iter().any(|h| h.kind != LeaseKind::Exclusive) {
                return Err(shares_unbreakable(key, "readers or a semaphore's permits"));
            }
            let Some(token) = token.filter(|_| st.held) else {
                return Ok(BreakOutcome::Free);
            };
            let token = Token::parse(&token)?;
            Ok(match self.release_inner(key, &token, None).await? {
                LeaseCheck::Ours => BreakOutcome::Broken(st),
                LeaseCheck::Missing => BreakOutcome::Free,
                _ => BreakOutcome::Changed,
            })
        })
    }
}

impl RedisBackend {
    /// The lock's status and its holder's token (the first word of the lock key's value).
    async fn holder(&self, key: &str) -> Result<(LockStatus, Option<String>), LockError> {
        const DOING: &str = "reading a Redis lock's status";
        let keys = self.layout.keys(key);
        let readers = readers::readers_key(keys.lock());
        let permits = permits::PermitKeys::new(keys.lock().to_owned());
        let reply = self
            .conn
            .run(
                &self.scripts.status,
                &[
                    keys.lock(),
                    keys.meta(),
                    keys.fence(),
                    keys.waiters(),
                    &readers,
                    permits.holders(),
                    permits.meta(),
                    permits.queue(),
                ],
                &[],
                DOING,
            )
            .await?;
        Ok(match reply {
            StatusReply::Free {
                last_fence,
                waiters,
            } => (
                LockStatus::free()
                    .with_last_fence(last_fence)
                    .with_waiters(Some(waiters)),
                None,
            ),
            StatusReply::Held {
                ttl,
                value,
                meta_token,
                holder_fence,
                last_fence,
                waiters,
            } => {
                let (owner, fence) = describe_holder(&value, &meta_token, holder_fence);
                let token =
                    Some(HolderValue::parse(&value).token.to_owned()).filter(|t| !t.is_empty());
                (
                    LockStatus::held(Some(owner), fence, ttl)
                        .with_holder(LeaseKind::Exclusive, token.clone())
                        .with_last_fence(last_fence)
                        .with_waiters(Some(waiters)),
                    token,
                )
            }
            StatusReply::Shared {
                permits,
                holders,
                last_fence,
                waiters,
            } => {
                let kind = match permits {
                    Some(permits) => LeaseKind::Permit { permits },
                    None => LeaseKind::Shared,
                };
                let holders = holders
                    .into_iter()
                    .map(|h| {
                        let label =
                            (!h.value.is_empty()).then(|| HolderValue::parse(&h.value).label());
                        HolderStatus::new(kind)
                            .token(Some(h.token))
                            .owner(label)
                            .fence(h.fence)
                            .ttl(h.ttl)
                    })
                    .collect();
                (
                    LockStatus::held_by(holders)
                        .with_last_fence(last_fence)
                        .with_waiters(Some(waiters)),
                    None,
                )
            }
        })
    }
}

/// The holder's label and fence, from the lock key's value and what the meta hash recorded.
fn describe_holder(
    value: &str,
    meta_token: &str,
    meta_fence: Option<u64>,
) -> (String, Option<u64>) {
    let holder = HolderValue::parse(value);
    let fence = meta_fence.filter(|_| !holder.token.is_empty() && holder.token == meta_token);
    (holder.label(), fence)
}

/// The fence a first attempt proposes: this client's wall clock in microseconds, or one above
/// the highest fence of the lock it saw, whichever is larger. It becomes the fence when it is
/// above the counter (`ZADD GT`). A clock past 2^52 µs (the year 2112: a clock set wrong) is
/// left out: the score, a double, must still count in ones.
fn fence_floor(seen: u64) -> u64 {
    const LIMIT: u64 = 1 << 52;
    let now = wall_us();
    let now = if now < LIMIT { now } else { 0 };
    now.max(seen.saturating_add(1))
}

/// The wall clock in microseconds since the epoch (0 before it).
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A sorted set's score as a fence: a whole number from 1 up (RESP2 sends it as text, RESP3 as
/// a double).
fn score(v: &Value) -> Option<u64> {
    let f = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<f64>().ok()?,
        Value::Double(d) => *d,
        _ => return None,
    };
    (f.is_finite() && f >= 1.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0)
        .then_some(f as u64)
}
