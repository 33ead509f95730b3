//! The single-instance Redis engine.

use std::fmt;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BoxFuture, BreakOutcome, Breaker, Capabilities,
    Fencing, Handover, HolderValue, LeaseCheck, LeaseRef, LockError, LockStatus, NextWaiter,
    RenewItem, Subscription, Token, WakeSource,
};
use redis::Value;

use crate::config::{ClusterConfig, RedisConfig, WaitReplicas};
use crate::error::{map_err, protocol};
use crate::keys::{KeyLayout, LockKeys, WakeChannel};
use crate::node::{Acks, Node, push_wait};
use crate::scripts::{Scripts, text, ttl_ms, unix_ms};
use crate::subscriber::{Grant, MAX_REGS, Reg, Shared, Subscriber, WaitState};

/// A lock engine on one Redis server (or a primary whose failover you accept; see the docs on
/// replication).
///
/// - acquire, first attempt: one round trip of two plain commands, `SET key value NX PX ttl`
///   then `HINCRBY meta fence 1`, pipelined (the fence is taken while the lock is ours, so it
///   orders holders; a busy attempt burns a number, which is harmless);
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
/// - fencing: a per-key counter that never expires, strictly increasing with every new holder
///   as long as the server keeps its data (persistence on, no failover to a lagging replica).
#[derive(Clone)]
pub struct RedisBackend {
    node: Node,
    layout: KeyLayout,
    scripts: std::sync::Arc<Scripts>,
    subscriber: std::sync::Arc<Subscriber>,
    /// Where releases tell this client (see [`WakeChannel`]).
    wake: WakeChannel,
    /// Grants, registrations and hints, shared with the subscriber.
    shared: Shared,
    /// Numbers registrations (see `WaitState::regs`).
    seq: std::sync::Arc<AtomicU64>,
}

/// How long a release of ours that handed the lock to another client answers our own waiting
/// tasks' attempts with "busy" without asking (they are queued behind; a wake-up ends it).
const ELSEWHERE_HINT: Duration = Duration::from_millis(100);

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.node.target)
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
        let (node, client) = Node::connect(&config).await?;
        Ok(Self::assemble(node, client, config, None))
    }

    /// Connects to a Redis Cluster through its seed nodes (see [`ClusterConfig`]).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_cluster_config(config: ClusterConfig) -> Result<Self, LockError> {
        let settings = config.settings().clone();
        settings.layout.check()?;
        let node = Node::connect_cluster(config.seeds(), &settings).await?;
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| map_err(e, "opening the Redis client"))?;
        let seeds = config.seeds().iter().map(|s| s.url.clone()).collect();
        Ok(Self::assemble(node, client, settings, Some(seeds)))
    }

    /// The engine over a connected node. `cluster_seeds`: the Cluster's seed URLs, where
    /// waiters subscribe to sharded channels.
    fn assemble(
        node: Node,
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
        let shared = Shared::default();
        let subscriber = Subscriber::new(
            client,
            node.clone(),
            &config,
            wake.clone(),
            cluster_seeds,
            shared.clone(),
        );
        RedisBackend {
            node,
            wake,
            layout: config.layout,
            scripts: std::sync::Arc::new(Scripts::new()),
            subscriber: std::sync::Arc::new(subscriber),
            shared,
            seq: std::sync::Arc::new(AtomicU64::new(1)),
        }
    }

    /// The Redis key that holds the lock `name` (a plain string whose value is the token).
    /// Another client (redis-py, node-redlock, redsync, `redis-cli SET … NX PX`) that locks this
    /// key excludes ours, and ours excludes it.
    pub fn lock_key(&self, name: &str) -> String {
        self.layout.lock_key(name)
    }

    /// The hash that keeps the fence counter (never expires) and the holder's label.
    pub fn meta_key(&self, name: &str) -> String {
        KeyLayout::meta_key(&self.layout.lock_key(name))
    }

    /// How many commands this backend has sent to the server on its main connection (each
    /// command of a pipeline counts, and so does a script reload); the pub/sub connection's
    /// SUBSCRIBE/UNSUBSCRIBE are not counted. For measuring commands per acquisition: Redis's
    /// own `INFO commandstats` cannot tell a top-level `SET` from one inside a script.
    pub fn commands_sent(&self) -> u64 {
        self.node.commands_sent()
    }

    /// The channel this client's waiters are woken on (on a Cluster, the per-lock channels
    /// start with it, up to the client id).
    pub fn wake_channel(&self) -> String {
        self.wake.base().to_owned()
    }

    /// The first attempt: `SET NX PX` then `HINCRBY` of the fence (and `WAIT` for replicas
    /// when configured), pipelined.
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
            .arg(ttl)
            .cmd("HINCRBY")
            .arg(keys.meta())
            .arg("fence")
            .arg(1);
        if let Some(wait) = self.node.wait {
            push_wait(&mut pipe, wait);
        }
        let replies = self.node.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
        match replies.as_slice() {
            [Value::Okay, Value::Int(f), acks @ ..] if *f > 0 => {
                if let Some(wait) = self.node.wait {
                    let acks = wait.acks(acks.first(), DOING);
                    self.undo_unreplicated(name, token, wait, acks).await?;
                }
                Ok(Attempt::Acquired {
                    fence: Some(*f as u64),
                })
            }
            [Value::Nil, ..] => Ok(Attempt::Busy { holder_ttl: None }),
            // Refused (NOPERM, a read-only replica…): nothing was written.
            [Value::ServerError(e), ..] => Err(map_err(e.clone().into(), DOING)),
            [Value::Okay, bad, ..] => {
                // The lock is set but the fence failed (junk under the meta key): undo the
                // lock before reporting, so nothing stays half taken.
                self.undo(name, token).await;
                Err(match bad {
                    Value::ServerError(e) => map_err(e.clone().into(), DOING),
                    other => protocol(DOING, other),
                })
            }
            _ => Err(protocol(DOING, &Value::Array(replies))),
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
        let mut mine = String::new();
        let mut wakes = 0;
        let mut seq = 0;
        // Whether a hand-over is likely: our own tasks wait, or we waited for this lock.
        let mut lead = next.is_some();
        let believed = {
            let mut st = self.lock_shared();
            if !st.contended.is_empty() && st.contended.remove(token.as_str()) {
                lead = true;
            }
            if let Some(n) = next {
                // Only a queued release can leave a hint: read the wake count only then.
                wakes = st.wakes;
                seq = self.register(&mut st, key, n.ttl);
                mine = self.registration(keys.lock(), n.ttl, seq, n.token.as_str(), n.owner);
            }
            if st.queued.is_empty() {
                String::new()
            } else {
                st.queued.get(key).cloned().unwrap_or_default()
            }
        };
        // Nothing but the token and the clock in the common case: the script needs no more.
        let mut now = itoa::Buffer::new();
        let wake = self.wake.for_lock(keys.lock());
        let full = [
            token.as_str(),
            now.format(unix_ms()),
            mine.as_str(),
            believed.as_str(),
            &wake,
        ];
        let args = if mine.is_empty() && believed.is_empty() {
            &full[..2]
        } else {
            &full[..]
        };
        let reply = self
            .node
            .run_led(
                &self.scripts.release,
                &[keys.lock(), keys.meta(), keys.waiters()],
                args,
                DOING,
                lead,
            )
            .await?;
        if next.is_none() && believed.is_empty() {
            // A plain release: nothing of ours to keep track of.
            return lease_check(&reply)
                .or(matches!(reply, Value::Int(2)).then_some(LeaseCheck::Ours))
                .ok_or_else(|| protocol(DOING, &reply));
        }
        let mut st = self.lock_shared();
        match (reply, next) {
            (Value::Int(n @ (2 | 3)), Some(_)) => {
                handed_elsewhere(&mut st, key, n == 3, seq, mine, wakes);
                Ok(LeaseCheck::Ours)
            }
            (Value::Int(1 | 2), _) => {
                st.queued.remove(key);
                Ok(LeaseCheck::Ours)
            }
            (Value::Array(ref items), Some(n)) => {
                match (items.first().and_then(int), items.get(1).and_then(int)) {
                    // Handed to our own next task.
                    (Some(4), Some(fence)) if fence > 0 => {
                        st.queued.remove(key);
                        st.grants.insert(
                            key.to_owned(),
                            Grant::Handed {
                                token: n.token.as_str().to_owned(),
                                fence: fence as u64,
                                seq,
                            },
                        );
                        Ok(LeaseCheck::Ours)
                    }
                    _ => Err(protocol(DOING, &Value::Array(items.clone()))),
                }
            }
            (other, _) => lease_check(&other).ok_or_else(|| protocol(DOING, &other)),
        }
    }

    /// A registration in a lock's queue: where to tell us, and what a release writes when it
    /// hands the lock to us.
    fn registration(
        &self,
        lock_key: &str,
        ttl: Duration,
        seq: u64,
        token: &str,
        owner: &str,
    ) -> String {
        format!(
            "{} {} {seq} {token} {owner}",
            self.wake.for_lock(lock_key),
            ttl_ms(ttl)
        )
    }

    /// Numbers a registration for `key` about to be sent, and remembers when.
    fn register(&self, st: &mut WaitState, key: &str, ttl: Duration) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let reg = Reg {
            seq,
            at: Instant::now(),
            ttl,
        };
        match st.regs.get_mut(key) {
            Some(q) => {
                if q.len() >= MAX_REGS {
                    q.pop_front();
                }
                q.push_back(reg);
            }
            None => {
                st.regs
                    .insert(key.to_owned(), std::iter::once(reg).collect());
            }
        }
        seq
    }

    /// A lock a release handed to `token`, if one did: its fence, how long ago at most it was
    /// written, and its TTL. A grant for another token of ours is returned as `Err`: no
    /// task of ours uses it any more (the local queue shares one token between its heads), so
    /// this attempt takes the lock over.
    fn take_grant(&self, key: &str, token: &str) -> Option<Result<Attempt, Grant>> {
        let mut st = self.lock_shared();
        if st.grants.is_empty() {
            return None;
        }
        let (fence, seq) = match st.grants.get(key)? {
            Grant::Handed {
                token: t,
                fence,
                seq,
            } if t == token => (*fence, *seq),
            Grant::Handed { .. } => return st.grants.remove(key).map(Err),
            Grant::Taken { .. } => return None,
        };
        st.grants.remove(key);
        let (elapsed, ttl) = match st.regs.get_mut(key) {
            Some(q) => {
                let found = q.iter().find(|r| r.seq == seq).copied();
                q.retain(|r| r.seq > seq);
                found.map_or((None, Duration::ZERO), |r| (Some(r.at.elapsed()), r.ttl))
            }
            None => (None, Duration::ZERO),
        };
        st.mark_contended(token);
        Some(Ok(Attempt::AcquiredEarlier {
            fence: Some(fence),
            age: elapsed,
            ttl,
        }))
    }

    /// How long the lock stays handed to another client, if a release of ours just gave it
    /// away while our tasks wait.
    fn handed_elsewhere(&self, key: &str) -> Option<Duration> {
        let mut st = self.lock_shared();
        let until = *st.elsewhere.get(key)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            st.elsewhere.remove(key);
            return None;
        }
        Some(left)
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
        let (Some(wait), Attempt::AcquiredEarlier { fence, .. }) = (self.node.wait, &granted)
        else {
            return Ok(granted);
        };
        const DOING: &str = "acquiring a Redis lock";
        let mut ms = itoa::Buffer::new();
        let (reply, acks) = self
            .node
            .run_waited(
                &self.scripts.extend,
                &[&self.layout.lock_key(req.name)],
                &[req.token.as_str(), ms.format(ttl_ms(req.ttl))],
                DOING,
            )
            .await?;
        match lease_check(&reply) {
            Some(LeaseCheck::Ours) => {
                let acks = acks.unwrap_or(Ok(0));
                self.undo_unreplicated(req.name, req.token, wait, acks)
                    .await?;
                Ok(Attempt::Acquired { fence: *fence })
            }
            // It ran out before we could use it.
            Some(_) => Ok(Attempt::Busy { holder_ttl: None }),
            None => Err(protocol(DOING, &reply)),
        }
    }

    fn lock_shared(&self) -> std::sync::MutexGuard<'_, WaitState> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A release of ours handed the lock to another client while tasks of ours still wait; `queued`
/// says the script queued `mine` (registration number `seq`) for them, otherwise it kept the
/// registration we believed queued. `wakes` is the wake-up count when the release was sent.
///
/// What the wake-ups that came meanwhile did to the belief is already in the state (a grant or
/// a "try again" took it away); what the script queued is believed unless the grant for that
/// very registration came first. Forgetting it for any other wake-up (a grant of a turn our
/// task had already taken by an attempt, say) left it in the queue unknown to us: the next
/// attempt queued us a second time, and this client took two turns in every round from then
/// on. The hint that the lock is elsewhere is only left if no wake-up came: that one may have
/// been our turn already.
fn handed_elsewhere(
    st: &mut WaitState,
    key: &str,
    queued: bool,
    seq: u64,
    mine: String,
    wakes: u64,
) {
    if queued {
        st.believe_queued(key, seq, mine);
    }
    if st.wakes == wakes {
        st.elsewhere
            .insert(key.to_owned(), Instant::now() + ELSEWHERE_HINT);
    }
}

fn lease_check(v: &Value) -> Option<LeaseCheck> {
    match v {
        Value::Int(1) => Some(LeaseCheck::Ours),
        Value::Int(0) => Some(LeaseCheck::Missing),
        Value::Int(-1) => Some(LeaseCheck::Foreign),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis lock";
        // A lock handed to this wait needs no request at all: look first.
        let other = match self.take_grant(req.name, req.token.as_str()) {
            Some(Ok(granted)) => return self.replicate_grant(req, granted).await,
            Some(Err(other)) => Some(other),
            None => None,
        };
        let keys = self.layout.keys(req.name);
        let mut ttl = itoa::Buffer::new();
        let ttl = ttl.format(ttl_ms(req.ttl));
        let token = req.token.as_str();
        let value = HolderValue::now(token, req.owner).encode();
        let convert = match &other {
            Some(Grant::Handed { token, .. }) => token.as_str(),
            _ => "",
        };
        if !req.queue && !req.retry && convert.is_empty() {
            return self
                .acquire_fast(req.name, &keys, req.token, &value, ttl)
                .await;
        }
        if !req.retry
            && convert.is_empty()
            && let Some(left) = self.handed_elsewhere(req.name)
        {
            return Ok(Attempt::Busy {
                holder_ttl: Some(left),
            });
        }
        // Queue up for a grant only while subscribed to wake-ups (they bring it).
        let watching = self.subscriber.is_watching(req.name);
        let (seq, elem, believed) = if watching {
            let mut st = self.lock_shared();
            let seq = self.register(&mut st, req.name, req.ttl);
            let believed = st.queued.get(req.name).cloned().unwrap_or_default();
            drop(st);
            (
                seq,
                self.registration(keys.lock(), req.ttl, seq, token, req.owner),
                believed,
            )
        } else {
            (0, String::new(), String::new())
        };
        let reply = self
            .node
            .run_waited(
                &self.scripts.acquire,
                &[keys.lock(), keys.meta(), keys.waiters()],
                &[token, &value, ttl, &elem, convert, &believed],
                DOING,
            )
            .await;
        let (reply, acks) = match reply {
            Ok(r) => r,
            Err(e) => {
                if let Some(g) = other {
                    // Not taken over (or not known to be): leave it for the next attempt or
                    // for `leave`.
                    self.lock_shared()
                        .grants
                        .entry(req.name.to_owned())
                        .or_insert(g);
                }
                return Err(e);
            }
        };
        let Value::Array(items) = &reply else {
            return Err(protocol(DOING, &reply));
        };
        match (
            items.first().and_then(int),
            items.get(1).and_then(int),
            items.get(2).and_then(int),
        ) {
            (Some(1), Some(fence), _) if fence > 0 => {
                if req.queue || watching {
                    let mut st = self.lock_shared();
                    if req.queue {
                        // Taken after a wait: others may wait too, and its release may hand over.
                        st.mark_contended(token);
                    }
                    if watching {
                        st.queued.remove(req.name);
                        // A grant to this token may still be on its way: it is taken.
                        match st.grants.get(req.name) {
                            Some(Grant::Handed { token: t, .. }) if t == token => {
                                st.grants.remove(req.name);
                            }
                            Some(Grant::Handed { .. }) => {}
                            _ => {
                                st.grants.insert(
                                    req.name.to_owned(),
                                    Grant::Taken {
                                        token: token.to_owned(),
                                        fence: fence as u64,
                                    },
                                );
                            }
                        }
                    }
                }
                if let (Some(wait), Some(acks)) = (self.node.wait, acks) {
                    self.undo_unreplicated(req.name, req.token, wait, acks)
                        .await?;
                }
                Ok(Attempt::Acquired {
                    fence: Some(fence as u64),
                })
            }
            (Some(0), Some(pttl), queued) => {
                if watching {
                    let mut st = self.lock_shared();
                    if queued == Some(1) {
                        st.believe_queued(req.name, seq, elem);
                    } else if let Some(q) = st.regs.get_mut(req.name) {
                        // Our earlier registration stays: this one was not used.
                        q.retain(|r| r.seq != seq);
                    }
                }
                Ok(Attempt::Busy {
                    // -1: a foreign lock without TTL; -2: it vanished in between.
                    holder_ttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
                })
            }
            _ => Err(protocol(DOING, &reply)),
        }
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "extending a Redis lock";
        let (key, token) = (lease.name, lease.token);
        let lock_key = self.layout.lock_key(key);
        let ms = ttl_ms(ttl).to_string();
        let (reply, acks) = self
            .node
            .run_waited(
                &self.scripts.extend,
                &[&lock_key],
                &[token.as_str(), &ms],
                DOING,
            )
            .await?;
        let check = lease_check(&reply).ok_or_else(|| protocol(DOING, &reply))?;
        if let (Some(wait), Some(acks), LeaseCheck::Ours) = (self.node.wait, acks, check) {
            // Renewed here, not known to be on the replicas: not a renewal to count on.
            wait.check(acks)?;
        }
        Ok(check)
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        self.release_inner(lease.name, lease.token, None).await
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(self.holder(key).await?.0)
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

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }
}

impl BatchRenew for RedisBackend {
    /// All renewals in one pipeline: one round trip however many locks are held.
    fn renew_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>> {
        Box::pin(async move {
            const DOING: &str = "renewing Redis locks";
            if items.is_empty() {
                return Vec::new();
            }
            let lock_keys: Vec<String> = items
                .iter()
                .map(|i| self.layout.lock_key(i.lease.name))
                .collect();
            self.node
                .extend_batch(&self.scripts.extend, &lock_keys, items, DOING)
                .await
                .into_iter()
                .map(|r| r.and_then(|v| lease_check(&v).ok_or_else(|| protocol(DOING, &v))))
                .collect()
        })
    }
}

impl WakeSource for RedisBackend {
    fn subscribe<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        Box::pin(async move {
            Ok(Some(
                self.subscriber
                    .subscribe(key, self.node.response_timeout)
                    .await,
            ))
        })
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
        let reply = self
            .node
            .run(
                &self.scripts.status,
                &[keys.lock(), keys.meta()],
                &[],
                DOING,
            )
            .await?;
        let Value::Array(items) = &reply else {
            return Err(protocol(DOING, &reply));
        };
        let last = |i: usize| {
            items
                .get(i)
                .and_then(int)
                .filter(|f| *f > 0)
                .map(|f| f as u64)
        };
        match items.first().and_then(int) {
            Some(0) => Ok((LockStatus::free().with_last_fence(last(1)), None)),
            Some(1) => {
                let ttl = items
                    .get(1)
                    .and_then(int)
                    .and_then(|p| (p >= 0).then(|| Duration::from_millis(p as u64)));
                let value = items.get(2).and_then(text).unwrap_or_default();
                let meta_token = items.get(3).and_then(text).unwrap_or_default();
                let (owner, fence) = describe_holder(&value, &meta_token, last(4));
                let token = HolderValue::parse(&value).token.to_owned();
                Ok((
                    LockStatus::held(Some(owner), fence, ttl).with_last_fence(last(5)),
                    Some(token).filter(|t| !t.is_empty()),
                ))
            }
            _ => Err(protocol(DOING, &reply)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_the_release_queued_is_believed_unless_its_own_grant_came_first() {
        // A wake-up came while the release was in flight: the late message of a grant (number
        // 4) whose lock a task of ours had already taken by an attempt.
        let mut st = WaitState::default();
        st.served.insert("k".into(), 4);
        st.wakes = 1;
        handed_elsewhere(&mut st, "k", true, 7, "reg7".into(), 0);
        assert_eq!(st.queued.get("k").map(String::as_str), Some("reg7"));
        assert!(st.elsewhere.is_empty(), "a wake-up came: no hint");

        // The grant for the registration just queued came before the reply: it has gone.
        let mut st = WaitState::default();
        st.served.insert("k".into(), 7);
        handed_elsewhere(&mut st, "k", true, 7, "reg7".into(), 0);
        assert!(st.queued.is_empty());
        assert!(st.elsewhere.contains_key("k"), "no wake-up: the hint stays");

        // The script kept the registration we believed in: the belief is left as it is.
        let mut st = WaitState::default();
        st.queued.insert("k".into(), "reg3".into());
        st.wakes = 2;
        handed_elsewhere(&mut st, "k", false, 7, "reg7".into(), 1);
        assert_eq!(st.queued.get("k").map(String::as_str), Some("reg3"));
    }
}
