//! The etcd engine.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, HolderValue, LeaseCheck, LeaseRef, LockError, LockStatus, MutexExt,
    PredecessorWatches, Subscription, WakeHub, WakeSource,
};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::config::EtcdConfig;
use crate::error::{lease_missing, map_err};
use crate::members::{Members, Resend};
use crate::wire::{
    Compare, CompareResult, Conn, DeleteRangeRequest, EventType, FilterType, KeyValue,
    RangeRequest, RangeResponse, RequestOp, ResponseOp, SortOrder, SortTarget, TxnRequest,
    TxnResponse, WatchCreateRequest, revision,
};
use tonic::Status;

/// One entry of ours in a lock's queue: the key `<prefix><name>/<lease id>`, attached to its
/// own lease.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    key: String,
    lease: i64,
    /// The key's create revision (its place in the queue, and the fence); 0 until known.
    rev: i64,
    /// The lease's TTL in whole seconds, as granted (the server may raise a short one).
    ttl_s: i64,
    /// The TTL in whole seconds it was asked for (a renewal with another one moves the key).
    asked_s: i64,
    /// Holds the lock (the watchdog renews it); otherwise queued (kept alive here).
    held: bool,
    /// When the last grant or keep-alive of the lease that succeeded was sent: the server
    /// keeps the lease at least `ttl_s` from then.
    refreshed: Arc<Mutex<Instant>>,
    /// Whether the lease was granted by the attempt in flight (then the attempt's own start
    /// bounds it) or earlier (a spare, or a queued entry: its age must be reported).
    fresh: bool,
}

/// A lease kept after a release, for the next acquire with the same TTL (it saves the grant's
/// round trip).
struct Spare {
    lease: i64,
    ttl_s: i64,
    refreshed: Instant,
}

struct Inner {
    /// The members, each on its own connection, and which one requests go to.
    members: Members,
    config: EtcdConfig,
    /// Our entries, by token.
    entries: Mutex<HashMap<String, Entry>>,
    /// Keep-alive tasks of queued entries, by token.
    keepers: Mutex<HashMap<String, AbortHandle>>,
    /// The watch on each waited-for lock's predecessor: the key watched, and its task.
    watches: PredecessorWatches,
    /// One spare lease per asked TTL (whole seconds).
    spares: Mutex<HashMap<i64, Spare>>,
    hub: WakeHub,
    runtime: Handle,
}

/// A lock engine on etcd, with the queue of etcd's own `concurrency.Mutex` and the checks
/// Jepsen found it needs.
///
/// - **acquire** grants a lease with the lock's TTL (whole seconds, rounded up) and, in one
///   transaction, creates `<prefix><name>/<lease id>` under it if absent and reads the first key
///   of the lock's prefix by create revision. The lock is ours when that first key is ours. A
///   first attempt that finds it busy revokes its lease (its key goes with it);
/// - **waiting** keeps the key: waiters queue by create revision (FIFO) and each one watches
///   only the key just before its own, for its deletion (no herd), from the revision its own
///   request saw (no event missed). A queued key's lease is kept alive here. Every attempt of a
///   wait first checks, in the same transaction, that our key still exists with its create
///   revision: a waiter whose lease expired while it was queued fails with `Lost` instead of
///   reporting the lock taken (etcd issue 11456, found by Jepsen);
/// - **fencing token** = the key's create revision: holders take the lock in create-revision
///   order, so each holder's is larger than every earlier holder's;
/// - **extend** is one keep-alive of the lease and a read that the key is still ours (a TTL other
///   than the lease's moves the key to a new lease, keeping its create revision);
/// - **release** deletes the key if it still has our create revision, then revokes the lease.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// The lease TTL in whole seconds for a lock TTL (rounded up: the server must not forget the
/// lock before the holder stops trusting it).
fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}

impl EtcdBackend {
    /// Connects to the members a URL names (see [`EtcdConfig`]).
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when no member answers; `Auth` when the
    /// credentials are refused.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(EtcdConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration (and checks the cluster answers).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: EtcdConfig) -> Result<Self, LockError> {
        let doing = format!("connecting to etcd at {}", config.endpoints.join(","));
        let members = Members::new(&config)?;
        let runtime = Handle::current();
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let leaving = weak.clone();
            Inner {
                members,
                config,
                entries: Mutex::new(HashMap::new()),
                keepers: Mutex::new(HashMap::new()),
                watches: PredecessorWatches::default(),
                spares: Mutex::new(HashMap::new()),
                hub: WakeHub::new(
                    |_| {},
                    move |name| {
                        if let Some(inner) = leaving.upgrade() {
                            inner.leave(name);
                        }
                    },
                ),
                runtime,
            }
        });
        // A request, so an unreachable cluster or refused credentials show now.
        let backend = EtcdBackend { inner };
        backend
            .retry(|c| async move { c.range(RangeRequest::key("distlock-probe")).await })
            .await
            .map_err(|e| map_err(e, &doing))?;
        Ok(backend)
    }

    /// The key prefix under which the lock `name` queues its holders.
    pub fn lock_prefix(&self, name: &str) -> String {
        format!("{}{name}/", self.inner.config.prefix)
    }

    /// Writes `value` under `data_key` only while this client still holds the lock `name` with
    /// fencing token `fence`: one transaction that compares the lock key's create revision
    /// (Jepsen's safe "lock-etcd-set"). `Ok(false)`: the lock is no longer ours (expired, or
    /// taken over), and nothing was written.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::LockClient;
    /// use distlock_etcd::EtcdBackend;
    ///
    /// let locks = LockClient::new(EtcdBackend::connect("etcd://127.0.0.1:2379").await?);
    /// let guard = locks.acquire("config").await?;
    /// let fence = guard.fence().expect("etcd gives fences");
    /// let written = locks
    ///     .backend()
    ///     .fenced_put("config", fence, "app/config", "v2")
    ///     .await?;
    /// assert!(written, "the lock was lost before the write");
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The client's errors.
    pub async fn fenced_put(
        &self,
        name: &str,
        fence: u64,
        data_key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<bool, LockError> {
        let Ok(rev) = i64::try_from(fence) else {
            return Ok(false);
        };
        let key = self
            .inner
            .entries
            .locked()
            .values()
            .find(|e| e.name == name && e.rev == rev && e.held)
            .map(|e| e.key.clone());
        let Some(key) = key else { return Ok(false) };
        let txn = TxnRequest::new(
            vec![Compare::create_revision(key, CompareResult::Equal, rev)],
            vec![RequestOp::put(data_key, value, 0)],
            vec![],
        );
        let reply = self
            .txn(txn)
            .await
            .map_err(|e| map_err(e, "a fenced write to etcd"))?;
        Ok(reply.succeeded)
    }

    /// A request that may be sent twice (a read, a keep-alive, a watch), sent again on another
    /// member when its member fails.
    async fn retry<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.inner.members.retry(f).await
    }

    /// A write, sent again only when it never reached a member.
    async fn write<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.inner.members.write(f).await
    }

    /// A first attempt: one transaction that writes our key only if the lock has no key at all
    /// (a compare over the whole prefix), and otherwise only reads the holder's. No key is left
    /// behind when busy, and the lease is kept for the next attempt.
    async fn acquire_fast(
        &self,
        req: &AcquireRequest<'_>,
        token: &str,
        entry: &Entry,
        fresh: bool,
        first: RequestOp,
    ) -> Result<Attempt, LockError> {
        let prefix = self.lock_prefix(req.name);
        let value = HolderValue::now(token, req.owner).encode();
        let txn = TxnRequest::new(
            vec![Compare::create_revision(prefix, CompareResult::Equal, 0).over_prefix()],
            vec![RequestOp::put(entry.key.as_str(), value, entry.lease)],
            vec![first],
        );
        let reply = self.acquire_txn(token, txn).await?;
        if !reply.succeeded {
            // Busy, and nothing written: the lease goes back to the spares.
            if let Some(e) = self.inner.entries.locked().remove(token) {
                self.keep_spare(&e);
            }
            return Ok(Attempt::Busy { holder_ttl: None });
        }
        // The put was the transaction's only write: its revision is our key's create revision.
        let rev = revision(reply.header.as_ref());
        Ok(self.acquired(token, entry, rev, fresh))
    }

    /// Grants a lease. Also returns when the try that succeeded was sent (the server keeps the
    /// lease at least its TTL from then) and how many tries it took.
    async fn grant(&self, ttl_s: i64) -> Result<(Granted, Instant, u32), Status> {
        let last = Mutex::new((Instant::now(), 0u32));
        let granted = self
            .retry(|c| {
                let mut l = last.locked();
                *l = (Instant::now(), l.1 + 1);
                async move { c.lease_grant(ttl_s).await }
            })
            .await?;
        if !granted.error.is_empty() {
            return Err(Status::unknown(format!(
                "granting a lease: {}",
                granted.error
            )));
        }
        let granted = Granted {
            id: granted.id,
            ttl: granted.ttl,
        };
        let (sent, tries) = *last.locked();
        Ok((granted, sent, tries))
    }

    /// Keeps an entry's lease, with no key on it any more, for the next acquire with its TTL.
    fn keep_spare(&self, entry: &Entry) {
        let spare = Spare {
            lease: entry.lease,
            ttl_s: entry.ttl_s,
            refreshed: *entry.refreshed.locked(),
        };
        if let Some(old) = self.inner.spares.locked().insert(entry.asked_s, spare) {
            self.inner.revoke_later(old.lease);
        }
    }

    /// Our key heads the queue: the lock is ours.
    fn acquired(&self, token: &str, entry: &Entry, rev: i64, fresh: bool) -> Attempt {
        self.mark_held(token, rev);
        let fence = u64::try_from(rev).ok();
        if fresh {
            // Granted by this very attempt: the server keeps it at least a TTL from the
            // attempt's start, which is what the core counts from.
            return Attempt::Acquired { fence };
        }
        // A spare, or a lease kept alive while queued: it lasts a TTL from its last refresh,
        // perhaps less than from now. Say how old it is.
        let refreshed = *entry.refreshed.locked();
        Attempt::AcquiredEarlier {
            fence,
            age: Some(refreshed.elapsed()),
            ttl: Duration::from_secs(entry.ttl_s as u64),
        }
    }

    /// Sends a transaction (again on another member while it never reached one).
    async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        self.write(|c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// An acquire's transaction: a lease found gone (expired before the key could be written)
    /// drops the attempt's entry and is reported as `Lost`.
    async fn acquire_txn(&self, token: &str, txn: TxnRequest) -> Result<TxnResponse, LockError> {
        match self.txn(txn).await {
            Ok(r) => Ok(r),
            Err(e) if lease_missing(&e) => {
                self.discard(token);
                Err(LockError::new(
                    ErrorKind::Lost,
                    "the etcd lease of this attempt expired before the lock was written",
                ))
            }
            Err(e) => Err(map_err(e, "acquiring an etcd lock")),
        }
    }

    fn entry(&self, token: &str) -> Option<Entry> {
        self.inner.entries.locked().get(token).cloned()
    }

    /// Takes a spare lease (one with two thirds of its TTL left) or grants one, and records a new
    /// entry for `token` (before any key exists: a cancelled attempt's cleanup finds it by the
    /// token).
    async fn new_entry(&self, name: &str, token: &str, ttl: Duration) -> Result<Entry, LockError> {
        let ttl_s = ttl_secs(ttl);
        let spare = self.inner.spares.locked().remove(&ttl_s);
        let (lease, granted_s, refreshed, fresh) = match spare {
            // A third of its TTL at most: the core renews a lease handed over with less than
            // half its validity left before using it, and a spare must never need that.
            Some(s) if s.refreshed.elapsed() < Duration::from_secs(s.ttl_s as u64) / 3 => {
                (s.lease, s.ttl_s, s.refreshed, false)
            }
            other => {
                if let Some(old) = other {
                    self.inner.revoke_later(old.lease);
                }
                let (granted, sent, tries) = self
                    .grant(ttl_s)
                    .await
                    .map_err(|e| map_err(e, "granting an etcd lease"))?;
                // Granted at the first try: the attempt's own start bounds it. Sent again (the
                // first member hung, say), it is reported with its age, counted from the send
                // that succeeded: a lock is not given up for the time lost on a dead member.
                (granted.id, granted.ttl.max(ttl_s), sent, tries == 1)
            }
        };
        let entry = Entry {
            name: name.to_owned(),
            key: format!("{}{:016x}", self.lock_prefix(name), lease),
            lease,
            rev: 0,
            ttl_s: granted_s,
            asked_s: ttl_s,
            held: false,
            refreshed: Arc::new(Mutex::new(refreshed)),
            fresh,
        };
        self.inner
            .entries
            .locked()
            .insert(token.to_owned(), entry.clone());
        Ok(entry)
    }

    /// Drops `token`'s entry and revokes its lease (its key goes with it), in the background.
    fn discard(&self, token: &str) {
        let entry = self.inner.entries.locked().remove(token);
        if let Some(k) = self.inner.keepers.locked().remove(token) {
            k.abort();
        }
        if let Some(e) = entry {
            self.inner.revoke_later(e.lease);
        }
    }

    /// Keeps a queued entry's lease alive (a third of its TTL apart) until it is held or left.
    fn keep_queued(&self, token: &str, entry: &Entry) {
        let mut keepers = self.inner.keepers.locked();
        if keepers.contains_key(token) {
            return;
        }
        let inner = self.inner.clone();
        let refreshed = entry.refreshed.clone();
        let (lease, every) = (entry.lease, Duration::from_secs(entry.ttl_s as u64) / 3);
        let task = self.inner.runtime.spawn(async move {
            // Until aborted (held, left, released) or the lease is gone; a broken stream (a
            // member died) is opened again on another one.
            loop {
                // A third of the TTL after the last refresh that succeeded: at once on a
                // stream opened again after a failure. Opening the stream sends a keep-alive.
                let due = *refreshed.locked() + every;
                tokio::time::sleep_until(due.into()).await;
                let mut sent = Instant::now();
                let (member, opened) = inner
                    .members
                    .send_on(Resend::Always, |c| async move {
                        c.lease_keep_alive(lease).await
                    })
                    .await;
                let Ok(mut keeper) = opened else {
                    tokio::time::sleep(every / 4).await;
                    continue;
                };
                loop {
                    // A member that stopped answering (paused, partitioned) must not hold the
                    // keep-alive up: after the response timeout, open it again elsewhere.
                    match tokio::time::timeout(inner.config.response_timeout, keeper.message())
                        .await
                    {
                        Ok(Ok(Some(r))) if r.ttl > 0 => *refreshed.locked() = sent,
                        Ok(Ok(Some(_))) => return,
                        Ok(_) => break,
                        Err(_) => {
                            inner.members.move_on(member);
                            break;
                        }
                    }
                    let due = *refreshed.locked() + every;
                    tokio::time::sleep_until(due.into()).await;
                    sent = Instant::now();
                    if keeper.send().await.is_err() {
                        break;
                    }
                }
            }
        });
        keepers.insert(token.to_owned(), task.abort_handle());
    }

    fn mark_held(&self, token: &str, rev: i64) {
        if let Some(e) = self.inner.entries.locked().get_mut(token) {
            e.held = true;
            e.rev = rev;
        }
        if let Some(k) = self.inner.keepers.locked().remove(token) {
            k.abort();
        }
    }

    /// Watches `pred` for its deletion from `from_rev` on, waking `name`'s waiters then (or
    /// when the watch fails: they try again and look).
    fn watch_predecessor(&self, name: &str, pred: String, from_rev: i64) {
        let inner = self.inner.clone();
        let (n, key) = (name.to_owned(), pred.clone());
        self.inner.watches.point(name, &pred, move || {
            let task = inner.runtime.clone().spawn(async move {
                let create = WatchCreateRequest {
                    key: key.into_bytes(),
                    start_revision: from_rev,
                    filters: vec![FilterType::NoPut as i32],
                    ..Default::default()
                };
                let opened = inner
                    .members
                    .retry(|c| {
                        let create = create.clone();
                        async move { c.watch(create).await }
                    })
                    .await;
                if let Ok(mut stream) = opened {
                    loop {
                        match stream.message().await {
                            Ok(Some(r)) if r.canceled => break,
                            Ok(Some(r)) => {
                                if r.events
                                    .iter()
                                    .any(|e| e.r#type == EventType::Delete as i32)
                                {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                inner.hub.notify(&n);
            });
            task.abort_handle()
        });
    }

    /// The key just before ours in the queue (created before it), if any.
    async fn predecessor(&self, name: &str, rev: i64) -> Result<Option<(String, i64)>, LockError> {
        let read = RangeRequest::prefix(self.lock_prefix(name))
            .sorted(SortTarget::Create, SortOrder::Descend)
            .max_create_revision(rev - 1)
            .limit(1)
            .keys_only();
        let reply = self.read(read, "reading an etcd lock's queue").await?;
        let at = revision(reply.header.as_ref());
        Ok(reply
            .kvs
            .first()
            .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), at)))
    }

    /// A read (resent as reads are).
    async fn read(&self, read: RangeRequest, doing: &str) -> Result<RangeResponse, LockError> {
        self.retry(|c| {
            let read = read.clone();
            async move { c.range(read).await }
        })
        .await
        .map_err(|e| map_err(e, doing))
    }

    /// The holder's key (the oldest under the lock's prefix), if anybody holds `name`.
    async fn holder_kv(&self, name: &str, doing: &str) -> Result<Option<KeyValue>, LockError> {
        let read = RangeRequest::prefix(self.lock_prefix(name))
            .sorted(SortTarget::Create, SortOrder::Ascend)
            .limit(1);
        Ok(self.read(read, doing).await?.kvs.into_iter().next())
    }

    /// `status` of a holder's key: its label, its lease's remaining time, its fence.
    async fn holder_status(&self, kv: &KeyValue) -> LockStatus {
        let value = String::from_utf8_lossy(&kv.value).into_owned();
        let owner = HolderValue::parse(&value).label();
        let lease = kv.lease;
        let ttl = match self
            .retry(|c| async move { c.lease_time_to_live(lease).await })
            .await
        {
            Ok(r) if r.ttl >= 0 => Some(Duration::from_secs(r.ttl as u64)),
            _ => None,
        };
        let fence = u64::try_from(kv.create_revision).ok();
        LockStatus::held(Some(owner), fence, ttl).with_last_fence(fence)
    }
}

impl Inner {
    fn revoke_later(self: &Arc<Self>, lease: i64) {
        let inner = self.clone();
        self.runtime.spawn(async move {
            let _ = inner
                .members
                .retry(|c| async move { c.lease_revoke(lease).await })
                .await;
        });
    }

    /// Nobody here waits for `name` any more: stop watching, and leave its queue (queued
    /// entries only; a held one belongs to its guard).
    fn leave(self: &Arc<Self>, name: &str) {
        self.watches.stop(name);
        let gone: Vec<(String, i64)> = {
            let mut entries = self.entries.locked();
            let tokens: Vec<String> = entries
                .iter()
                // Queued ones only: a key not yet known to be queued (rev 0) belongs to an
                // attempt in flight, which cleans up after itself.
                .filter(|(_, e)| e.name == name && !e.held && e.rev != 0)
                .map(|(t, _)| t.clone())
                .collect();
            tokens
                .into_iter()
                .filter_map(|t| entries.remove(&t).map(|e| (t, e.lease)))
                .collect()
        };
        let mut keepers = self.keepers.locked();
        for (token, lease) in gone {
            if let Some(k) = keepers.remove(&token) {
                k.abort();
            }
            self.revoke_later(lease);
        }
    }
}

/// The first key of a lock's queue in a transaction's reply (`at`: which response).
fn first_of(responses: &[ResponseOp], at: usize) -> Option<(String, i64, i64)> {
    let kv = responses.get(at)?.range()?.kvs.first()?;
    Some((
        String::from_utf8_lossy(&kv.key).into_owned(),
        kv.create_revision,
        kv.lease,
    ))
}

/// A lease as granted.
struct Granted {
    id: i64,
    /// Seconds (the server may raise a short TTL to its minimum).
    ttl: i64,
}

impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring an etcd lock";
        let token = req.token.as_str();
        // `fresh`: the lease was granted by this very call (not by an earlier attempt of the
        // same token, whose reply was lost, nor kept from a release).
        let (entry, fresh, fresh_attempt) = match self.entry(token) {
            Some(e) => (e, false, false),
            None => {
                let e = self.new_entry(req.name, token, req.ttl).await?;
                let fresh = e.fresh;
                (e, fresh, true)
            }
        };
        let prefix = self.lock_prefix(req.name);
        let first = RequestOp::range(
            RangeRequest::prefix(prefix)
                .sorted(SortTarget::Create, SortOrder::Ascend)
                .limit(1)
                .keys_only(),
        );
        if fresh_attempt && !req.queue && !req.retry {
            return self.acquire_fast(req, token, &entry, fresh, first).await;
        }
        let mine = RequestOp::range(RangeRequest::key(entry.key.as_str()).keys_only());
        let txn = if entry.rev == 0 {
            // New (or resent before its reply came): create the key unless it exists.
            let value = HolderValue::now(token, req.owner).encode();
            TxnRequest::new(
                vec![Compare::create_revision(
                    entry.key.as_str(),
                    CompareResult::Equal,
                    0,
                )],
                vec![
                    RequestOp::put(entry.key.as_str(), value, entry.lease),
                    mine.clone(),
                    first.clone(),
                ],
                vec![mine, first],
            )
        } else {
            // Queued: our key must still be there, with its place.
            TxnRequest::new(
                vec![Compare::create_revision(
                    entry.key.as_str(),
                    CompareResult::Equal,
                    entry.rev,
                )],
                vec![mine, first],
                vec![],
            )
        };
        let reply = self.acquire_txn(token, txn).await?;
        let at = revision(reply.header.as_ref());
        if entry.rev != 0 && !reply.succeeded {
            // Our key is gone (its lease expired while queued, or it was deleted): never
            // report this lock taken.
            self.discard(token);
            return Err(LockError::new(
                ErrorKind::Lost,
                format!(
                    "our place in the queue of {:?} is gone (its lease expired or the key was deleted)",
                    req.name
                ),
            ));
        }
        let responses = reply.responses;
        // The two reads end both branches.
        let (Some((my_key, my_rev, _)), Some((head, _, _))) = (
            first_of(&responses, responses.len() - 2),
            first_of(&responses, responses.len() - 1),
        ) else {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!("{DOING}: the transaction's reads came back empty"),
            ));
        };
        if my_key != entry.key {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!("{DOING}: read {my_key:?} for {:?}", entry.key),
            ));
        }
        if head == entry.key {
            return Ok(self.acquired(token, &entry, my_rev, fresh));
        }
        if !req.queue {
            // Not waiting: leave no key behind.
            self.discard(token);
            return Ok(Attempt::Busy { holder_ttl: None });
        }
        // Queued: keep our place alive and watch the key just before ours.
        if let Some(e) = self.inner.entries.locked().get_mut(token) {
            e.rev = my_rev;
        }
        self.keep_queued(token, &entry);
        match self.predecessor(req.name, my_rev).await? {
            Some((pred, _)) => self.watch_predecessor(req.name, pred, at + 1),
            // Everything before us left in between: look again at once.
            None => self.inner.hub.notify(req.name),
        }
        Ok(Attempt::Busy { holder_ttl: None })
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "extending an etcd lock";
        let (key, token) = (lease.name, lease.token);
        let Some(entry) = self
            .entry(token.as_str())
            .filter(|e| e.name == key && e.rev > 0)
        else {
            return Ok(LeaseCheck::Missing);
        };
        let ttl_s = ttl_secs(ttl);
        if ttl_s != entry.asked_s {
            // Another TTL: a new lease for the same key (its create revision stays).
            let (granted, sent, _) = self.grant(ttl_s).await.map_err(|e| map_err(e, DOING))?;
            let txn = TxnRequest::new(
                vec![Compare::create_revision(
                    entry.key.as_str(),
                    CompareResult::Equal,
                    entry.rev,
                )],
                vec![RequestOp::move_to_lease(entry.key.as_str(), granted.id)],
                vec![],
            );
            let reply = self.txn(txn).await.map_err(|e| map_err(e, DOING));
            let moved = matches!(reply, Ok(ref r) if r.succeeded);
            if moved {
                if let Some(e) = self.inner.entries.locked().get_mut(token.as_str()) {
                    e.lease = granted.id;
                    e.ttl_s = granted.ttl.max(ttl_s);
                    e.asked_s = ttl_s;
                    *e.refreshed.locked() = sent;
                }
                self.inner.revoke_later(entry.lease);
            } else {
                self.inner.revoke_later(granted.id);
            }
            return reply.map(|_| {
                if moved {
                    LeaseCheck::Ours
                } else {
                    LeaseCheck::Missing
                }
            });
        }
        let lease = entry.lease;
        let sent = Instant::now();
        let alive = self.retry(|c| async move {
            // Opening the stream sends the keep-alive.
            c.lease_keep_alive(lease).await?.message().await
        });
        let key = entry.key.clone();
        let still = self.retry(|c| {
            let read = RangeRequest::key(key.as_str()).keys_only();
            async move { c.range(read).await }
        });
        let (alive, still) = tokio::join!(alive, still);
        let alive = alive.map_err(|e| map_err(e, DOING))?;
        let still = still.map_err(|e| map_err(e, DOING))?;
        let ours = still
            .kvs
            .first()
            .is_some_and(|kv| kv.create_revision == entry.rev && kv.lease == entry.lease);
        if ours && alive.is_some_and(|r| r.ttl > 0) {
            *entry.refreshed.locked() = sent;
            Ok(LeaseCheck::Ours)
        } else if still.kvs.is_empty() {
            Ok(LeaseCheck::Missing)
        } else {
            Ok(LeaseCheck::Foreign)
        }
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing an etcd lock";
        let (key, token) = (lease.name, lease.token);
        let Some(entry) = self.entry(token.as_str()).filter(|e| e.name == key) else {
            return Ok(LeaseCheck::Missing);
        };
        if entry.rev == 0 {
            // Never queued as far as we know (a cancelled first attempt): revoke its lease,
            // which deletes a key it may have written.
            self.discard(token.as_str());
            return Ok(LeaseCheck::Missing);
        }
        // A plain delete is safe here, unlike on a shared key: the key's name carries our
        // lease's id, so it is ours alone (another holder's lock is another key). The deleted
        // key's create revision tells whether it was this acquisition's.
        let lock_key = entry.key.clone();
        let reply = self
            .write(|c| {
                let delete = DeleteRangeRequest {
                    key: lock_key.clone().into_bytes(),
                    prev_kv: true,
                    ..Default::default()
                };
                async move { c.delete_range(delete).await }
            })
            .await
            .map_err(|e| map_err(e, DOING))?;
        let ours = reply
            .prev_kvs
            .first()
            .is_some_and(|kv| kv.create_revision == entry.rev);
        if !ours {
            self.discard(token.as_str());
            return Ok(LeaseCheck::Missing);
        }
        // The key is gone; its lease, still alive, is kept for the next acquire.
        self.inner.entries.locked().remove(token.as_str());
        if let Some(k) = self.inner.keepers.locked().remove(token.as_str()) {
            k.abort();
        }
        self.keep_spare(&entry);
        Ok(LeaseCheck::Ours)
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(
            match self.holder_kv(key, "reading an etcd lock's status").await? {
                Some(kv) => self.holder_status(&kv).await,
                None => LockStatus::free(),
            },
        )
    }

    fn wake_source(&self) -> Option<&dyn WakeSource> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }
}

impl WakeSource for EtcdBackend {
    fn subscribe<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        // The watch itself is set up by each waiting attempt, from the revision it saw, so
        // nothing is missed between this call and the next attempt.
        Box::pin(std::future::ready(Ok(Some(self.inner.hub.subscribe(key)))))
    }
}

impl Breaker for EtcdBackend {
    /// Deletes the holder's key (the oldest under the lock's prefix), if it is still the one
    /// read: the next waiter's watch sees it go, as after a release. The holder's lease lives
    /// on (it may hold the holder's other locks); its next renewal finds the key gone.
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(async move {
            const DOING: &str = "breaking an etcd lock";
            let Some(kv) = self.holder_kv(key, DOING).await? else {
                return Ok(BreakOutcome::Free);
            };
            let st = self.holder_status(&kv).await;
            let txn = TxnRequest::new(
                vec![Compare::create_revision(
                    kv.key.as_slice(),
                    CompareResult::Equal,
                    kv.create_revision,
                )],
                vec![RequestOp::delete(kv.key.as_slice())],
                vec![],
            );
            let done = self.txn(txn).await.map_err(|e| map_err(e, DOING))?;
            Ok(if done.succeeded {
                BreakOutcome::Broken(st)
            } else {
                BreakOutcome::Changed
            })
        })
    }
}
