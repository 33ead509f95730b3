//! Redlock: one lock over N independent Redis masters, taken when a majority grants it.
//!
//! Every request goes to all masters at once, each bounded by a short per-node timeout, so one
//! slow or dead master costs at most that timeout and counts as a "no". An acquire succeeds
//! when N/2+1 masters granted it and time is left: validity = ttl − elapsed − drift (drift =
//! 1 % of the TTL + 2 ms). Any other outcome, and an acquire that is cancelled, releases the
//! lock on **all** masters (a master that timed out may have granted it after all).
//!
//! Fencing tokens are not given: the masters share no counter, and the largest of a majority's
//! counters can go backwards (a holder's majority and the next holder's overlap in one master,
//! whose counter need not be the largest of either). See the crate README.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::default_drift;
use distlock_core::engine::{
    AcquireMode, AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, Breaker, Capabilities,
    ErrorKind, Fencing, LeaseCheck, LeaseRef, Linger, LockError, LockStatus, RenewItem, Token,
};
use distlock_core::recipes::HolderValue;
use distlock_core::seeded::{self, SeededBug};
use futures_util::future::join_all;
use redis::Value;

use crate::config::{MultiHostUrl, RedisConfig, positive, strip_scheme};
use crate::connection::ServerConnection;
use crate::error::protocol;
use crate::keys::KeyLayout;
use crate::replies::{MasterAcquireReply, ScriptReply};
use crate::scripts::{LuaScript, MasterScripts, ttl_ms};

mod many;

/// The masters of a Redlock deployment and its settings.
///
/// From a URL: `redlock://[user:password@]host1:port1,host2:port2,…[/db][?params]` (or
/// `redlocks://` for TLS); the credentials, database and parameters apply to every master.
/// Parameters: those of [`RedisConfig`] (`prefix`, `hash_tag`, `connect_timeout`,
/// `response_timeout`) and `node_timeout`, the time each master has to answer one request
/// (default: 2 % of the lock's TTL, between 5 ms and the response timeout).
#[derive(Clone, Debug)]
pub struct RedlockConfig {
    nodes: Vec<RedisConfig>,
    node_timeout: Option<Duration>,
}

impl RedlockConfig {
    /// The masters, each as a [`RedisConfig`]; the first one's key prefix and hash-tag setting
    /// apply to all.
    ///
    /// # Errors
    /// `Config` when there is no master, or the same master is named twice.
    pub fn new(nodes: impl IntoIterator<Item = RedisConfig>) -> Result<Self, LockError> {
        let nodes: Vec<RedisConfig> = nodes.into_iter().collect();
        if nodes.is_empty() {
            return Err(LockError::new(
                ErrorKind::Config,
                "Redlock needs at least one master",
            ));
        }
        for (i, n) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|m| m.url == n.url) {
                return Err(LockError::new(
                    ErrorKind::Config,
                    format!(
                        "{} is named twice: Redlock's masters must be distinct",
                        n.redacted_url()
                    ),
                ));
            }
        }
        Ok(RedlockConfig {
            nodes,
            node_timeout: None,
        })
    }

    /// Parses a `redlock://` URL (see the type's documentation).
    ///
    /// # Errors
    /// `Config` for a malformed URL, a bad parameter or a repeated master.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let (scheme, rest) = strip_scheme(text, "redlock", "redlocks")?;
        let mut parts = MultiHostUrl::parse(rest)?;
        // node_timeout is ours; the rest of the query goes to every master.
        let node_timeout = match parts.take("node_timeout") {
            Some(v) => Some(positive("node_timeout", &v)?),
            None => None,
        };
        let query = parts.rest_query();
        let nodes = parts
            .hosts
            .iter()
            .map(|host| {
                RedisConfig::from_url(&format!(
                    "{scheme}://{}{host}{}{query}",
                    parts.userinfo, parts.path
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut cfg = RedlockConfig::new(nodes)?;
        cfg.node_timeout = node_timeout;
        Ok(cfg)
    }

    /// The time each master has to answer one request (default: 2 % of the lock's TTL, at
    /// least 5 ms, at most the response timeout).
    #[must_use]
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = Some(d);
        self
    }

    /// How many masters.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true (a config has at least one master); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Votes needed out of `n` masters: a strict majority.
pub(crate) fn quorum(n: usize) -> usize {
    if seeded::on(SeededBug::HalfQuorum) {
        n / 2
    } else {
        n / 2 + 1
    }
}

/// The time left of a lease of `ttl` granted after `elapsed`, minus the drift allowance; zero
/// when nothing is left (never underflows).
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Duration {
    ttl.saturating_sub(elapsed)
        .saturating_sub(default_drift(ttl))
}

/// What one master answered to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Granted (or renewed, or released: the lock was ours there).
    Yes,
    /// Held by another owner; its remaining lease, if known.
    Held(Option<Duration>),
    /// No lock there.
    Missing,
    /// No answer in time, or an error.
    Failed,
}

/// How an acquire's votes end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority granted it with time left.
    Acquired,
    /// Not acquired; the holder's lease as a majority reports it (when known).
    Busy(Option<Duration>),
    /// Fewer than a majority of masters answered at all.
    NoQuorum { got: usize, needed: usize },
}

/// Decides an acquire from the masters' votes, `elapsed` after it was sent.
pub(crate) fn decide(votes: &[Vote], ttl: Duration, elapsed: Duration) -> Verdict {
    let needed = quorum(votes.len());
    let yes = votes.iter().filter(|v| **v == Vote::Yes).count();
    if yes >= needed && !validity(ttl, elapsed).is_zero() {
        return Verdict::Acquired;
    }
    let answered = votes.iter().filter(|v| **v != Vote::Failed).count();
    if answered < needed {
        return Verdict::NoQuorum { got: yes, needed };
    }
    // The lock is free again once enough masters' copies have expired that a majority could
    // grant it: the (needed − yes)-th shortest of the others' leases.
    let mut held: Vec<Duration> = votes
        .iter()
        .filter_map(|v| match v {
            Vote::Held(Some(t)) => Some(*t),
            _ => None,
        })
        .collect();
    held.sort();
    let wait = needed
        .checked_sub(yes + 1)
        .and_then(|i| held.get(i).copied());
    Verdict::Busy(wait)
}

/// What a release, renewal or status check found across the masters.
pub(crate) fn lease_of(votes: &[Vote]) -> Result<LeaseCheck, (usize, usize)> {
    let needed = quorum(votes.len());
    let yes = votes.iter().filter(|v| **v == Vote::Yes).count();
    if yes >= needed {
        return Ok(LeaseCheck::Ours);
    }
    let failed = votes.iter().filter(|v| **v == Vote::Failed).count();
    if yes + failed >= needed {
        // The masters that did not answer may still hold it for us: we cannot tell.
        return Err((yes, needed));
    }
    if votes.iter().any(|v| matches!(v, Vote::Held(_))) {
        Ok(LeaseCheck::Foreign)
    } else {
        Ok(LeaseCheck::Missing)
    }
}

/// A lock engine over N independent Redis masters (Redlock).
///
/// - acquire: on every master at once, `SET key value NX PX ttl` (a resent or waiting attempt:
///   a script that also re-arms a lock already ours and reports the holder's lease), each
///   master bounded by the node timeout; a majority with validity left wins; otherwise the
///   lock is released on every master before the attempt reports busy (or `QuorumNotReached`
///   when fewer than a majority answered at all);
/// - extend and release: compare-and-pexpire and compare-and-delete on every master; a
///   renewal holds when a majority renewed it;
/// - the watchdog's renewals go out as one pipeline per master, all masters at once;
/// - several names at once (`lock_many`): one script per master takes every name or none,
///   decided by the same quorum and validity as one name, and released on every master when
///   it is not ours (see `redlock/many.rs`);
/// - waiting: jittered back-off (no events yet);
/// - fencing: none (see the module documentation).
#[derive(Clone)]
pub struct RedlockBackend {
    nodes: Arc<[ServerConnection]>,
    layout: KeyLayout,
    scripts: Arc<MasterScripts>,
    node_timeout: Option<Duration>,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field(
                "masters",
                &self.nodes.iter().map(|n| &*n.target).collect::<Vec<_>>(),
            )
            .field("layout", &self.layout)
            .finish()
    }
}

impl RedlockBackend {
    /// Connects to the masters a `redlock://` URL names.
    ///
    /// # Errors
    /// As [`with_config`](Self::with_config).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(RedlockConfig::from_url(url)?).await
    }

    /// Connects to every master at once. A master that cannot be reached now is not an error
    /// as long as a majority can: its connection keeps trying in the background.
    ///
    /// # Errors
    /// `QuorumNotReached` when fewer than a majority of masters could be reached; `Auth` when
    /// a master refused the credentials; `Config` for a bad key prefix.
    pub async fn with_config(config: RedlockConfig) -> Result<Self, LockError> {
        if config.nodes.iter().any(|n| n.wait.is_some()) {
            return Err(LockError::new(
                ErrorKind::Config,
                "wait_replicas does not apply to Redlock: its masters are independent, with no \
                 replicas to wait for",
            ));
        }
        let layout = config.nodes[0].layout.clone();
        layout.check()?;
        let results = join_all(config.nodes.iter().map(ServerConnection::connect_lazily)).await;
        let needed = quorum(results.len());
        let mut nodes = Vec::with_capacity(results.len());
        let mut reachable = 0;
        for r in results {
            match r {
                Ok((node, up)) => {
                    reachable += usize::from(up);
                    nodes.push(node);
                }
                Err(e) => return Err(e),
            }
        }
        if reachable < needed {
            return Err(LockError::new(
                ErrorKind::QuorumNotReached {
                    got: reachable,
                    needed,
                },
                format!(
                    "only {reachable} of {} Redlock masters could be reached",
                    nodes.len()
                ),
            ));
        }
        Ok(RedlockBackend {
            nodes: nodes.into(),
            layout,
            scripts: Arc::new(MasterScripts::new()),
            node_timeout: config.node_timeout,
        })
    }

    /// The key that holds the lock `name` on each master.
    pub fn lock_key(&self, name: &str) -> String {
        self.layout.lock_key(name)
    }

    /// How many masters.
    pub fn masters(&self) -> usize {
        self.nodes.len()
    }

    /// Commands sent to all masters so far (each command of a pipeline counts).
    pub fn commands_sent(&self) -> u64 {
        self.nodes.iter().map(ServerConnection::commands_sent).sum()
    }

    fn timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout.unwrap_or_else(|| {
            let cap = self.nodes[0].response_timeout;
            (ttl / 50).clamp(Duration::from_millis(5).min(cap), cap)
        })
    }

    /// Runs `script` on every master at once, each within `limit`; one vote each.
    async fn on_all<R: ScriptReply + Into<Vote>>(
        &self,
        script: &LuaScript<R>,
        keys: &[&str],
        args: &[&str],
        limit: Duration,
        doing: &str,
    ) -> Vec<Vote> {
        let replies = self.replies(script, keys, args, limit, doing).await;
        replies
            .into_iter()
            .map(|r| r.map_or(Vote::Failed, Into::into))
            .collect()
    }

    /// Runs `script` on every master at once, each within `limit`: each master's reply, `None`
    /// for one that failed or did not answer in time.
    async fn replies<R: ScriptReply>(
        &self,
        script: &LuaScript<R>,
        keys: &[&str],
        args: &[&str],
        limit: Duration,
        doing: &str,
    ) -> Vec<Option<R>> {
        join_all(self.nodes.iter().map(|node| async move {
            match tokio::time::timeout(limit, node.run(script, keys, args, doing)).await {
                Ok(Ok(reply)) => Some(reply),
                Ok(Err(e)) => {
                    tracing::debug!(target: "distlock", master = &*node.target, error = %e, "{doing}");
                    None
                }
                Err(_) => None,
            }
        }))
        .await
    }

    /// Compare-and-delete on every master (after a failed or cancelled acquire, and release).
    async fn release_on_all(&self, lock_key: &str, token: &Token, limit: Duration) -> Vec<Vote> {
        self.on_all(
            &self.scripts.release,
            &[lock_key],
            &[token.as_str()],
            limit,
            "releasing a Redlock lock",
        )
        .await
    }

    /// Decides an acquire sent at `started` from the masters' votes: ours when a majority
    /// granted it with validity left (see [`decide`]). Any other outcome first runs
    /// `take_back`, the release of our copies on every master, when a master may hold one (it
    /// granted it, or did not answer in time and may have granted it after all); then it is
    /// busy, or `QuorumNotReached` when fewer than a majority answered.
    async fn conclude(
        votes: &[Vote],
        ttl: Duration,
        started: Instant,
        doing: &str,
        take_back: impl Future<Output = Vec<Vote>>,
    ) -> Result<Attempt, LockError> {
        let outcome = decide(votes, ttl, started.elapsed());
        if outcome == Verdict::Acquired {
            return Ok(Attempt::Acquired { fence: None });
        }
        if !seeded::on(SeededBug::KeepPartial)
            && votes.iter().any(|v| matches!(v, Vote::Yes | Vote::Failed))
        {
            take_back.await;
        }
        match outcome {
            Verdict::NoQuorum { got, needed } => Err(no_quorum(doing, got, needed)),
            Verdict::Busy(holder_ttl) => Ok(Attempt::Busy { holder_ttl }),
            Verdict::Acquired => unreachable!("handled above"),
        }
    }

    /// One plain `SET NX PX` on one master: yes or no.
    async fn set_nx(node: &ServerConnection, lock_key: &str, value: &str, ttl: &str) -> Vote {
        let mut pipe = redis::Pipeline::with_capacity(1);
        pipe.cmd("SET")
            .arg(lock_key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl);
        match node.send(&pipe).await.as_deref() {
            Ok([Value::Okay]) => Vote::Yes,
            Ok([Value::Nil]) => Vote::Held(None),
            Ok(other) => {
                tracing::debug!(target: "distlock", master = &*node.target, reply = ?other,
                    "unexpected reply to SET NX");
                Vote::Failed
            }
            Err(e) => {
                tracing::debug!(target: "distlock", master = &*node.target, error = %e,
                    "acquiring a Redlock lock");
                Vote::Failed
            }
        }
    }
}

impl From<LeaseCheck> for Vote {
    fn from(check: LeaseCheck) -> Self {
        match check {
            LeaseCheck::Ours => Vote::Yes,
            LeaseCheck::Missing => Vote::Missing,
            _ => Vote::Held(None),
        }
    }
}

impl From<MasterAcquireReply> for Vote {
    fn from(reply: MasterAcquireReply) -> Self {
        match reply {
            MasterAcquireReply::Ours => Vote::Yes,
            MasterAcquireReply::Held { ttl } => Vote::Held(ttl),
        }
    }
}

fn no_quorum(doing: &str, got: usize, needed: usize) -> LockError {
    LockError::new(
        ErrorKind::QuorumNotReached { got, needed },
        format!("{doing}: {got} Redlock masters agreed, {needed} needed"),
    )
}

#[distlock_core::engine::async_trait]
impl Backend for RedlockBackend {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            Fencing::Unavailable(
                "Redlock's masters share no counter, and the largest of a majority's counters \
                 can go backwards between holders",
            ),
            true,
        )
        .other_kinds_because(
            "Redlock's vote decides who holds one key on each master; a count of readers or \
             permits kept on independent masters has no majority meaning (a master restarted \
             without its data forgets its count). Use a single Redis, Sentinel or Cluster, \
             etcd or ZooKeeper for these kinds",
        )
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redlock lock";
        let started = Instant::now();
        let lock_key = self.layout.lock_key(req.name);
        let value = HolderValue::now(req.token.as_str(), req.owner).encode();
        let mut ttl_buf = itoa::Buffer::new();
        let ttl = ttl_buf.format(ttl_ms(req.ttl));
        let limit = self.timeout_for(req.ttl);
        let votes = if req.mode != AcquireMode::Try {
            // Re-arms a lock already ours (a resent request, or a master that kept our copy
            // from an earlier attempt of this wait) and reports the holder's lease.
            self.on_all(
                &self.scripts.acquire,
                &[&lock_key],
                &[req.token.as_str(), &value, ttl],
                limit,
                DOING,
            )
            .await
        } else {
            join_all(self.nodes.iter().map(|node| async {
                tokio::time::timeout(limit, Self::set_nx(node, &lock_key, &value, ttl))
                    .await
                    .unwrap_or(Vote::Failed)
            }))
            .await
        };
        // Not ours: every copy we may have is taken back, on every master.
        let take_back = self.release_on_all(&lock_key, req.token, limit);
        Self::conclude(&votes, req.ttl, started, DOING, take_back).await
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing a Redlock lock";
        let (key, token) = (lease.name, lease.token);
        let lock_key = self.layout.lock_key(key);
        let mut ttl_buf = itoa::Buffer::new();
        let votes = self
            .on_all(
                &self.scripts.extend,
                &[&lock_key],
                &[token.as_str(), ttl_buf.format(ttl_ms(ttl))],
                self.timeout_for(ttl),
                DOING,
            )
            .await;
        lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redlock lock";
        let (key, token) = (lease.name, lease.token);
        let lock_key = self.layout.lock_key(key);
        let limit = self.nodes[0].response_timeout;
        let votes = self.release_on_all(&lock_key, token, limit).await;
        lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(self.holder(key).await?.0)
    }

    distlock_core::capability_getters!(
        batch_renew: BatchRenew,
        breaker: Breaker,
        lister: Lister,
        linger: Linger,
        multi_lock: MultiLock,
    );
}

/// The lock keys expire by themselves on every master: leaving the lease is renewing it to
/// the time left, on a quorum as every renewal.
#[distlock_core::engine::async_trait]
impl Linger for RedlockBackend {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.renew(lease, ttl).await
    }
}

/// The names in use on any master (`SCAN` on each), when a majority answers: the status read
/// of each name then says whether a quorum holds it.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for RedlockBackend {
    async fn names(
        &self,
        prefix: &str,
        budget: usize,
    ) -> Result<distlock_core::engine::Names, LockError> {
        let mut names = Vec::new();
        let (mut more, mut answered, mut failed) = (false, 0, None);
        for node in self.nodes.iter() {
            match crate::list::names(node, &self.layout, prefix, budget).await {
                Ok(found) => {
                    answered += 1;
                    more |= found.more;
                    names.extend(found.names);
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            Some(e) if answered < self.nodes.len() / 2 + 1 => Err(e),
            _ => Ok(distlock_core::engine::Names::new(names, more)),
        }
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for RedlockBackend {
    /// Reads the holder a majority names, then compare-and-deletes its token on every master.
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        self.break_holder(key).await
    }
}

impl RedlockBackend {
    async fn break_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a Redlock lock";
        let (st, token) = self.holder(key).await?;
        let Some(token) = token.filter(|_| st.held) else {
            return Ok(BreakOutcome::Free);
        };
        let token = Token::stored(&token)?;
        let lock_key = self.layout.lock_key(key);
        let limit = self.nodes[0].response_timeout;
        let votes = self.release_on_all(&lock_key, &token, limit).await;
        match lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))? {
            LeaseCheck::Ours => Ok(BreakOutcome::Broken(st)),
            // Expired, or released, between the read and the delete.
            LeaseCheck::Missing => Ok(BreakOutcome::Free),
            _ => Ok(BreakOutcome::Changed),
        }
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for RedlockBackend {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.renew_batch(items).await
    }
}

impl RedlockBackend {
    /// Every renewal on every master in one pipeline per master, all masters at once.
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        const DOING: &str = "renewing Redlock locks";
        if items.is_empty() {
            return Vec::new();
        }
        let lock_keys: Vec<String> = items
            .iter()
            .map(|i| self.layout.lock_key(i.lease.name))
            .collect();
        let limit = items
            .iter()
            .map(|i| self.timeout_for(i.ttl))
            .min()
            .unwrap_or(Duration::from_millis(5));
        let script = &self.scripts.extend;
        let per_node: Vec<Vec<Vote>> = join_all(self.nodes.iter().map(|node| {
            let lock_keys = &lock_keys;
            async move {
                let batch = node.extend_batch(script, lock_keys, items, "renewing Redlock locks");
                match tokio::time::timeout(limit, batch).await {
                    Ok(replies) => replies
                        .iter()
                        .map(|r| r.as_ref().map_or(Vote::Failed, |c| Vote::from(*c)))
                        .collect(),
                    Err(_) => vec![Vote::Failed; items.len()],
                }
            }
        }))
        .await;
        (0..items.len())
            .map(|i| {
                let votes: Vec<Vote> = per_node.iter().map(|v| v[i]).collect();
                lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))
            })
            .collect()
    }
}

impl RedlockBackend {
    /// The lock's status and the token a majority of masters holds.
    async fn holder(&self, key: &str) -> Result<(LockStatus, Option<String>), LockError> {
        const DOING: &str = "reading a Redlock lock's status";
        let lock_key = self.layout.lock_key(key);
        let limit = self.nodes[0].response_timeout;
        let replies = join_all(self.nodes.iter().map(|node| async {
            let mut pipe = redis::Pipeline::with_capacity(2);
            pipe.cmd("GET").arg(&lock_key).cmd("PTTL").arg(&lock_key);
            match tokio::time::timeout(limit, node.send(&pipe)).await {
                Ok(Ok(v)) => Some(v),
                _ => None,
            }
        }))
        .await;
        let needed = quorum(self.nodes.len());
        let answered = replies.iter().flatten().count();
        if answered < needed {
            return Err(no_quorum(DOING, answered, needed));
        }
        // The holder is whoever a majority of masters names.
        let mut seen: Vec<(Vec<u8>, usize, i64)> = Vec::new();
        for r in replies.iter().flatten() {
            match r.as_slice() {
                [Value::BulkString(v), Value::Int(pttl)] => {
                    match seen.iter_mut().find(|(s, _, _)| s == v) {
                        Some(e) => {
                            e.1 += 1;
                            e.2 = e.2.min(*pttl);
                        }
                        None => seen.push((v.clone(), 1, *pttl)),
                    }
                }
                [Value::Nil, _] => {}
                other => return Err(protocol(DOING, &Value::Array(other.to_vec()))),
            }
        }
        let Some((value, _, pttl)) = seen.into_iter().find(|(_, n, _)| *n >= needed) else {
            return Ok((LockStatus::free(), None));
        };
        let text = String::from_utf8_lossy(&value);
        let owner = text.split_once(' ').map(|(_, rest)| rest.to_owned());
        let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
        let token = text.split(' ').next().unwrap_or_default().to_owned();
        Ok((LockStatus::held(owner, None, ttl), Some(token)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_majority_is_needed() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn validity_saturates_and_keeps_the_drift() {
        assert_eq!(
            validity(TTL, Duration::ZERO),
            TTL - Duration::from_millis(102)
        );
        assert_eq!(validity(TTL, TTL), Duration::ZERO);
        assert_eq!(validity(TTL, TTL * 3), Duration::ZERO);
        assert_eq!(
            validity(Duration::from_millis(1), Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn votes_decide_an_acquire() {
        use Vote::*;
        let short = Duration::from_millis(1);
        assert_eq!(
            decide(&[Yes, Yes, Yes, Failed, Failed], TTL, short),
            Verdict::Acquired
        );
        assert_eq!(
            decide(&[Yes, Yes, Failed, Failed, Failed], TTL, short),
            Verdict::NoQuorum { got: 2, needed: 3 }
        );
        // A majority, but too late to use it.
        assert_eq!(
            decide(&[Yes, Yes, Yes, Yes, Yes], TTL, TTL),
            Verdict::Busy(None)
        );
        let ms = Duration::from_millis;
        // Two of ours, three held: one more master must free up, the shortest lease first.
        assert_eq!(
            decide(
                &[
                    Yes,
                    Yes,
                    Held(Some(ms(900))),
                    Held(Some(ms(300))),
                    Held(Some(ms(600)))
                ],
                TTL,
                short
            ),
            Verdict::Busy(Some(ms(300)))
        );
        // None of ours: the third-shortest lease.
        assert_eq!(
            decide(
                &[
                    Held(Some(ms(5))),
                    Held(Some(ms(9))),
                    Held(Some(ms(7))),
                    Missing,
                    Missing
                ],
                TTL,
                short
            ),
            Verdict::Busy(Some(ms(9)))
        );
    }

    #[test]
    fn renewals_hold_on_a_majority_and_unanswered_masters_are_not_a_verdict() {
        use Vote::*;
        assert_eq!(
            lease_of(&[Yes, Yes, Yes, Missing, Failed]),
            Ok(LeaseCheck::Ours)
        );
        assert_eq!(lease_of(&[Yes, Yes, Failed, Missing, Missing]), Err((2, 3)));
        assert_eq!(
            lease_of(&[Yes, Held(None), Missing, Missing, Failed]),
            Ok(LeaseCheck::Foreign)
        );
        assert_eq!(
            lease_of(&[Yes, Missing, Missing, Missing, Failed]),
            Ok(LeaseCheck::Missing)
        );
    }

    #[test]
    fn redlock_urls_name_every_master() {
        let c = RedlockConfig::from_url(
            "redlock://:pw@127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003/2?prefix=app:&node_timeout=40ms",
        )
        .expect("valid");
        assert_eq!(c.len(), 3);
        assert_eq!(c.node_timeout, Some(Duration::from_millis(40)));
        assert_eq!(c.nodes[1].url, "redis://:pw@127.0.0.1:7002/2");
        assert_eq!(c.nodes[2].layout.prefix, "app:");
        for bad in [
            "redis://127.0.0.1:7001",
            "redlock://",
            "redlock://127.0.0.1:7001,,127.0.0.1:7002",
            "redlock://127.0.0.1:7001,127.0.0.1:7001",
            "redlock://127.0.0.1:7001?node_timeout=0",
            "redlock://127.0.0.1:7001?node_timeout=soon",
        ] {
            let e = RedlockConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }
}
