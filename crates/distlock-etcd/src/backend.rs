//! The etcd engine: the core's queue recipe over etcd, on this client's sessions.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, Breaker, Capabilities, Downgrade,
    ErrorKind, Fencing, HolderStatus, LeaseCheck, LeaseKind, LeaseRef, Linger, Listener, LockError,
    LockStatus, LostReason, Relabel, RenewItem, SessionWatch, Sessions, Subscription, WakeSource,
};
use distlock_core::recipes::queue::QueueRecipe;
use distlock_core::recipes::{HolderValue, tag_value, untag_value};

use crate::config::EtcdConfig;
use crate::error::map_err;
use crate::members::Members;
use crate::session::{self, Session};
use crate::store::{EtcdStore, Key};
use crate::wire::{
    Compare, CompareResult, DeleteRangeRequest, KeyValue, RangeRequest, RangeResponse, RequestOp,
    SortOrder, SortTarget, TxnRequest,
};

/// Keys whose lease one renewal transaction checks: etcd takes at most 128 compares in one
/// transaction (its `--max-txn-ops` default).
const KEYS_PER_CHECK: usize = 128;

/// A renewal lists the session's keys when the keys due are at least a quarter of them (a
/// listing then costs at most four times the keys due); fewer are checked by transactions.
const LISTED_WHEN_DUE: usize = 4;

/// The items of one batch on one session: the session, each item's place in the batch and its
/// key (two vectors: 20 bytes an item, where pairs take 24 and the slices of keys 16 more).
type SessionItems = (Arc<Session>, Vec<u32>, Vec<Key>);

struct EtcdShared {
    recipe: QueueRecipe<EtcdStore>,
    config: EtcdConfig,
}

impl Drop for EtcdShared {
    fn drop(&mut self) {
        // The client is going away: its sessions' leases, and their keys, with it.
        self.recipe.store().sessions.close();
    }
}

/// A lock engine on etcd: the queue of etcd's own `concurrency.Mutex`, on one session per
/// client and TTL, with the checks Jepsen found it needs.
///
/// - **sessions**: one lease per client and TTL (whole seconds, rounded up), kept alive by one
///   keep-alive stream while keys are on it; every renewed lock of that TTL is a key attached
///   to it, so holding 10,000 locks costs one keep-alive per renewal tick, not 10,000. When a
///   session ends (its lease expired, or could not be kept alive until its deadline), every
///   lock on it is lost at once. A lock nobody renews (`auto_renew(false)`, a leaked guard, a
///   hold limit reached) lives on a lease of its own, which ends after its TTL;
/// - **acquire** writes `<prefix><name>/<client>-<n>` on the session's lease (the same key
///   each time a client takes the lock again, as in etcd's `concurrency.Mutex`). A first
///   attempt is one transaction that writes it only if the lock has no key at all (a compare
///   over the whole prefix) and writes nothing when the lock is busy;
/// - **waiting** keeps the key: keys queue by create revision (FIFO) and each waiter watches
///   only the key just before its own, for its deletion (no herd), from the revision it was
///   read at (no event missed). Every attempt of a wait checks, in the same transaction, that
///   its key is still there with its create revision: a waiter whose session ended while it was
///   queued fails with `Lost` instead of reporting the lock taken (etcd issue 11456, found by
///   Jepsen);
/// - **fencing token** = the key's create revision: holders take the lock in create-revision
///   order, so each holder's is larger than every earlier holder's;
/// - **renew** is one keep-alive of each session's lease, and one read of the keys still
///   attached to it (a lock key deleted by an operator is found missing); a TTL other than the
///   session's moves the key to the session of that TTL, keeping its create revision;
/// - **release** deletes the key (the session lives on, for the next lock);
/// - **several names at once** (`lock_many`) is one transaction that writes a holder's key under
///   every name only if no key is under any of them (see `many.rs`): each name is the same lock
///   as a single-name lease of it, and its fence is the transaction's revision.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<EtcdShared>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
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
        #[cfg(feature = "tls")]
        let shown = if config.tls.is_some() {
            config.endpoints.join(",").replace("http://", "https://")
        } else {
            config.endpoints.join(",")
        };
        #[cfg(not(feature = "tls"))]
        let shown = config.endpoints.join(",");
        let doing = format!("connecting to etcd at {shown}");
        let members = Arc::new(Members::new(&config)?);
        let sessions = session::Sessions::new(members.clone(), config.response_timeout);
        let store = EtcdStore::new(members, sessions, config.prefix.clone());
        let backend = EtcdBackend {
            inner: Arc::new(EtcdShared {
                recipe: QueueRecipe::new(Arc::new(store)),
                config,
            }),
        };
        // A request, so an unreachable cluster or refused credentials show now.
        backend
            .read(RangeRequest::key("distlock-probe"), &doing)
            .await?;
        Ok(backend)
    }

    pub(crate) fn store(&self) -> &EtcdStore {
        self.inner.recipe.store()
    }

    /// The key prefix under which the lock `name` queues its holders.
    pub fn lock_prefix(&self, name: &str) -> String {
        self.store().lock_prefix(name)
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
    /// let etcd = locks.engine::<EtcdBackend>().expect("built on etcd");
    /// let written = etcd.fenced_put("config", fence, "app/config", "v2").await?;
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
        let refused = || {
            distlock_core::metrics::fence_refused("etcd");
            Ok(false)
        };
        let Ok(rev) = i64::try_from(fence) else {
            return refused();
        };
        let held = self
            .inner
            .recipe
            .held_of(name)
            .into_iter()
            .find(|(_, e)| e.entry.seq == rev);
        let Some((_, e)) = held else {
            return refused();
        };
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                &*e.entry.id,
                CompareResult::Equal,
                rev,
            )],
            vec![RequestOp::put(data_key, value, 0)],
            vec![],
        );
        let reply = self
            .store()
            .txn(txn)
            .await
            .map_err(|e| map_err(e, "a fenced write to etcd"))?;
        if !reply.succeeded {
            return refused();
        }
        Ok(true)
    }

    /// A read, sent again on another member when its member fails.
    async fn read(&self, read: RangeRequest, doing: &str) -> Result<RangeResponse, LockError> {
        self.store()
            .members
            .retry(|c| {
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

    /// A holder's key: its kind, label and token, its lease's remaining time, its fence.
    async fn holder_status(&self, kv: &KeyValue) -> HolderStatus {
        let value = String::from_utf8_lossy(&kv.value).into_owned();
        let (kind, holder) = untag_value(&value);
        let holder = HolderValue::parse(holder);
        let lease = kv.lease;
        let ttl = match self
            .store()
            .members
            .retry(|c| async move { c.lease_time_to_live(lease, false).await })
            .await
        {
            Ok(r) if r.ttl >= 0 => Some(Duration::from_secs(r.ttl.unsigned_abs())),
            _ => None,
        };
        HolderStatus::new(kind)
            .owner(Some(holder.label()))
            .token(Some(holder.token.to_owned()).filter(|t| !t.is_empty()))
            .fence(u64::try_from(kv.create_revision).ok())
            .ttl(ttl)
    }

    /// Moves our held key for `lease` to `target`, keeping its create revision (its place and
    /// its fence). `false`: the key is gone (expired, or deleted by an operator).
    async fn move_key(
        &self,
        lease: &LeaseRef<'_>,
        target: Arc<Session>,
        doing: &str,
    ) -> Result<bool, LockError> {
        let Some(entry) = self.inner.recipe.held(lease.name, lease.token.as_str()) else {
            return Ok(false);
        };
        let (key, seq) = (entry.entry.id, entry.entry.seq);
        let txn = TxnRequest::new(
            vec![Compare::create_revision(&*key, CompareResult::Equal, seq)],
            vec![RequestOp::move_to_lease(&*key, target.lease)],
            vec![],
        );
        let moved = self
            .store()
            .txn(txn)
            .await
            .map_err(|e| map_err(e, doing))?
            .succeeded;
        if moved {
            self.store().set_session(&key, target);
        } else {
            self.inner.recipe.forget(lease.name, lease.token.as_str());
            self.store().forget(&key);
        }
        Ok(moved)
    }

    /// Moves our held key for `lease` to a private lease of `ttl`. `false`: the key is gone.
    async fn to_private(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        let sessions = &self.store().sessions;
        let private = sessions.private(ttl, &sessions.clock()).await?;
        self.move_key(lease, private, "moving an etcd lock to a lease of its own")
            .await
    }

    /// Renews a held key to a TTL its session's lease is too short for: moves it to a lease of
    /// that TTL (the shared session of that TTL for a renewed lock, a private lease otherwise).
    async fn renew_longer(
        &self,
        lease: &LeaseRef<'_>,
        shared: bool,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing an etcd lock with a longer TTL";
        let sessions = &self.store().sessions;
        let clock = sessions.clock();
        let target = if shared {
            sessions.get(ttl, &clock).await?
        } else {
            sessions.private(ttl, &clock).await?
        };
        if !self.move_key(lease, target.clone(), DOING).await? {
            return Ok(LeaseCheck::Missing);
        }
        // Renewed from now: a keep-alive of the target, sent after this call.
        target.keep_alive().await?;
        Ok(LeaseCheck::Ours)
    }

    /// Renews the given held keys, all on one session: one keep-alive of its lease, and a check
    /// that each key is still attached to it. When the keys due are a good part of the
    /// session's, one listing of the session's keys answers for all; otherwise read-only
    /// transactions check the keys due, 128 each. Either way the work follows the keys due,
    /// not every key on the session. The listing also finds keys on the session that we do not
    /// know, and deletes them (see [`EtcdStore::orphans`]); without a listing, the session is
    /// listed for them now and then, and after a request was given up.
    async fn renew_session(
        &self,
        session: &Session,
        keys: &[Key],
    ) -> Vec<Result<LeaseCheck, LockError>> {
        let lease = session.lease;
        let listing = keys.len().saturating_mul(LISTED_WHEN_DUE) >= session.key_count();
        let present = async {
            if listing {
                self.attached_by_listing(keys, lease).await
            } else {
                if self.store().sweep_due(lease) {
                    self.sweep_orphans(lease);
                }
                self.attached_by_txn(keys, lease).await
            }
        };
        let (alive, present) = tokio::join!(session.keep_alive(), present);
        let result = match (alive, present) {
            (Err(e), _) if e.kind() == ErrorKind::Lost => {
                return keys.iter().map(|_| Ok(LeaseCheck::Missing)).collect();
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(_), Ok(present)) => Ok(present),
        };
        match result {
            Ok(present) => present
                .into_iter()
                .map(|p| {
                    Ok(if p {
                        LeaseCheck::Ours
                    } else {
                        LeaseCheck::Missing
                    })
                })
                .collect(),
            Err(e) => keys
                .iter()
                .map(|_| Err(LockError::new(e.kind(), e.message().to_owned())))
                .collect(),
        }
    }

    /// Whether each of `keys` is attached to `lease`, from one listing of the lease's keys.
    /// Keys we do not know found on it are deleted when a sweep is due.
    async fn attached_by_listing(&self, keys: &[Key], lease: i64) -> Result<Vec<bool>, LockError> {
        const DOING: &str = "renewing etcd locks";
        let r = self
            .store()
            .members
            .retry(|c| async move { c.lease_time_to_live(lease, true).await })
            .await
            .map_err(|e| map_err(e, DOING))?;
        // The TTL left is in whole seconds (0 in the last one); -1 for a lease gone. The
        // keep-alive sent alongside tells whether it is; "gone" with a live lease is a leader
        // that has not applied its grant yet (etcd#13675): every key is checked as below.
        // The listing and its set are read in this block, and let go before any transaction
        // below.
        let mut present: Vec<bool> = {
            let listed = if r.ttl < 0 {
                crate::wire::KeyList::default()
            } else {
                r.keys
            };
            if !listed.is_empty() && self.store().sweep_due(lease) {
                for orphan in self.store().orphans(&listed) {
                    self.store().delete_if_on(orphan, lease);
                }
            }
            let set: HashSet<&[u8], foldhash::fast::RandomState> = listed.iter().collect();
            keys.iter().map(|k| set.contains(k.as_bytes())).collect()
        };
        // A leader just elected answers from its lease table before it has applied every
        // committed write: a key put just before the election may not be listed yet. A key
        // not listed is checked by a linearizable read before it is called gone.
        let unlisted: Vec<(usize, &str)> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| !present[*i])
            .map(|(i, k)| (i, &**k))
            .collect();
        if !unlisted.is_empty() {
            let names: Vec<&str> = unlisted.iter().map(|(_, k)| *k).collect();
            let checked = self.attached_by_txn(&names, lease).await?;
            for ((i, _), p) in unlisted.into_iter().zip(checked) {
                present[i] = p;
            }
        }
        Ok(present)
    }

    /// Whether each of `keys` is attached to `lease`, by read-only transactions of 128 keys.
    async fn attached_by_txn<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        lease: i64,
    ) -> Result<Vec<bool>, LockError> {
        let checks = futures_util::future::try_join_all(
            keys.chunks(KEYS_PER_CHECK)
                .map(|chunk| self.still_attached(chunk, lease)),
        )
        .await?;
        Ok(checks.into_iter().flatten().collect())
    }

    /// Whether each of `keys` is still attached to `lease`: one read-only transaction that
    /// compares every key's lease, and reads them only when one differs. Linearizable, so a
    /// leader just elected answers after applying every committed write.
    async fn still_attached<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        lease: i64,
    ) -> Result<Vec<bool>, LockError> {
        const DOING: &str = "renewing etcd locks";
        let txn = TxnRequest::new(
            keys.iter()
                .map(|k| Compare::lease(k.as_ref(), CompareResult::Equal, lease))
                .collect(),
            vec![],
            keys.iter()
                .map(|k| RequestOp::range(RangeRequest::key(k.as_ref())))
                .collect(),
        );
        let r = self
            .store()
            .members
            .retry(|c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| map_err(e, DOING))?;
        if r.succeeded {
            return Ok(vec![true; keys.len()]);
        }
        Ok((0..keys.len())
            .map(|i| {
                r.responses
                    .get(i)
                    .and_then(|resp| resp.range())
                    .is_some_and(|read| read.kvs.iter().any(|kv| kv.lease == lease))
            })
            .collect())
    }

    /// Lists the keys attached to `lease`, in the background, and deletes those we do not
    /// know (see [`EtcdStore::orphans`]).
    fn sweep_orphans(&self, lease: i64) {
        let store = self.inner.recipe.store().clone();
        tokio::spawn(async move {
            let listed = store
                .members
                .retry(|c| async move { c.lease_time_to_live(lease, true).await })
                .await;
            // The TTL left is -1 for a lease gone, or for a leader that has not applied its
            // grant yet (etcd#13675): nothing to go by then.
            if let Ok(r) = listed
                && r.ttl >= 0
            {
                for orphan in store.orphans(&r.keys) {
                    store.delete_if_on(orphan, lease);
                }
            }
        });
    }

    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        // Each item's answer, written in place (a lease with no key of ours is missing).
        let mut out: Vec<Result<LeaseCheck, LockError>> =
            (0..items.len()).map(|_| Ok(LeaseCheck::Missing)).collect();
        // The items of each session, by lease id.
        let mut groups: HashMap<i64, SessionItems> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let lease = &item.lease;
            let Some(key) = self.inner.recipe.held_id(lease.name, lease.token.as_str()) else {
                continue;
            };
            let Some(session) = self.store().session_of(&key) else {
                continue;
            };
            // A lease at least as long as asked is renewed by a keep-alive: the server keeps
            // the key at least the TTL asked (a shorter one, near a hold limit, only delays
            // the next holder of a crashed one; the core takes the lease off the session when
            // it stops renewing it).
            if session::ttl_secs(item.ttl) > session.asked_s {
                out[i] = self.renew_longer(lease, session.shared, item.ttl).await;
                continue;
            }
            // The first session's vectors have room for every item left: a batch is most often
            // all on one session, and growing them by doubling would hold two copies at once.
            let left = items.len() - i;
            let first = groups.is_empty();
            let (_, places, keys) = groups.entry(session.lease).or_insert_with(|| {
                let room = if first { left } else { 0 };
                (
                    session.clone(),
                    Vec::with_capacity(room),
                    Vec::with_capacity(room),
                )
            });
            places.push(u32::try_from(i).unwrap_or(u32::MAX));
            keys.push(key);
        }
        let renewals = groups
            .into_values()
            .map(|(session, places, keys)| async move {
                let checks = self.renew_session(&session, &keys).await;
                (places, checks)
            });
        for (places, checks) in futures_util::future::join_all(renewals).await {
            for (i, r) in places.into_iter().zip(checks) {
                if let Some(slot) = out.get_mut(i as usize) {
                    *slot = r;
                }
            }
        }
        out
    }
}

impl EtcdBackend {
    /// Resolves once our key `key` is gone from the store: a watch on it, and, whenever the
    /// watch ends (a delete, or a member that failed), a read to tell which.
    async fn key_gone(&self, key: Key, entry: distlock_core::recipes::queue::QueuedEntry<Key>) {
        const DOING: &str = "reading a leader's own etcd key";
        loop {
            distlock_core::recipes::queue::QueueStore::watch_gone(self.store(), &entry).await;
            match self.read(RangeRequest::key(&*key), DOING).await {
                Ok(r) if r.kvs.iter().all(|kv| kv.create_revision != entry.seq) => return,
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

#[distlock_core::engine::async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
            .with_shared()
            .with_permits()
            .with_order()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        let attempt = self.inner.recipe.acquire(req).await?;
        let fence = match attempt {
            Attempt::Acquired { fence } | Attempt::AcquiredEarlier { fence, .. } => fence,
            other => return Ok(other),
        };
        if req.renewed {
            return Ok(attempt);
        }
        // Nobody renews this lock: it goes to a lease of its own, which ends after its TTL
        // whatever else this client holds. Counted from when the request was sent (the lease
        // was granted after).
        match self.to_private(&req.lease(), req.ttl).await {
            Ok(true) => Ok(Attempt::Acquired { fence }),
            Ok(false) => Err(LockError::new(
                ErrorKind::Lost,
                "the etcd lock key vanished as it was taken",
            )),
            Err(e) => {
                // Not left half taken.
                self.inner.recipe.discard(req.name, req.token.as_str());
                Err(e)
            }
        }
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing an etcd lock";
        let entry = self.inner.recipe.forget(lease.name, lease.token.as_str());
        // The key's name is ours alone (no other acquisition takes it while it may exist), so
        // deleting it can never take another holder's lock; and it can be deleted even when an
        // acquire's reply was lost and we never learned its place.
        let Some(key) = self.store().key_of(lease.name, lease.token) else {
            // Nothing was written for this acquisition, or its key is known to be gone.
            return Ok(LeaseCheck::Missing);
        };
        self.store().forget(&key);
        let given_up = !entry.as_ref().is_some_and(|e| e.held);
        if given_up {
            // A given-up acquire's clean-up: the key is nobody's lock.
            self.store().abandon(&key);
        }
        let delete = DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            prev_kv: true,
            ..Default::default()
        };
        let reply = self
            .store()
            .members
            .write(|c| {
                let delete = delete.clone();
                async move { c.delete_range(delete).await }
            })
            .await;
        // The name before the abandoned mark (see `remove_later`): a first attempt that read
        // the key before the delete must find it stale at every instant.
        if reply.is_ok() {
            if given_up {
                // One of its writes may still land: a name for nobody from now.
                self.store().burn_name(lease.name, lease.token);
            } else {
                self.store().free_name(lease.name, lease.token);
            }
        }
        self.store()
            .released(&String::from_utf8_lossy(&delete.key), reply.is_ok());
        let reply = reply.map_err(|e| map_err(e, DOING))?;
        let ours = match (&entry, reply.prev_kvs.first()) {
            (Some(e), Some(kv)) => e.held && kv.create_revision == e.entry.seq,
            _ => false,
        };
        Ok(if ours {
            LeaseCheck::Ours
        } else {
            LeaseCheck::Missing
        })
    }

    /// Every holder (the leading keys of the queue that hold: one writer, the readers up to
    /// the first writer, or N permits), each with its label, token, fence and its lease's
    /// remaining time; the other keys are the waiters.
    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        let read = RangeRequest::prefix(self.lock_prefix(key))
            .sorted(SortTarget::Create, SortOrder::Ascend);
        let kvs = self.read(read, "reading an etcd lock's status").await?.kvs;
        let kinds = kvs
            .iter()
            .map(|kv| untag_value(&String::from_utf8_lossy(&kv.value)).0);
        let n = distlock_core::recipes::queue::holding(kinds);
        let mut holders = Vec::with_capacity(n);
        for kv in &kvs[..n] {
            holders.push(self.holder_status(kv).await);
        }
        let last = holders.iter().filter_map(|h| h.fence).max();
        Ok(LockStatus::held_by(holders)
            .with_last_fence(last)
            .with_waiters(Some((kvs.len() - n) as u64)))
    }

    distlock_core::capability_getters!(
        batch_renew: BatchRenew,
        wake_source: WakeSource,
        sessions: Sessions,
        breaker: Breaker,
        lister: Lister,
        downgrade: Downgrade,
        relabel: Relabel,
        linger: Linger,
        multi_lock: MultiLock,
    );
}

/// A key lives as long as the etcd lease it is attached to: leaving it is moving it (if it is
/// still ours) to a lease of its own, granted for the time left (whole seconds, rounded up, and
/// at least etcd's least TTL), that nobody keeps alive; then forgetting it here. Its name stays
/// out of use for this client until that lease has run out.
#[distlock_core::engine::async_trait]
impl Linger for EtcdBackend {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let started = self.store().sessions.clock().now();
        if !self.to_private(lease, ttl).await? {
            return Ok(LeaseCheck::Missing);
        }
        let Some(key) = self.store().key_of(lease.name, lease.token) else {
            return Ok(LeaseCheck::Missing);
        };
        let granted = self.store().session_of(&key).map_or(ttl, |s| {
            Duration::from_secs(u64::try_from(s.ttl_s).unwrap_or(0))
        });
        self.inner.recipe.forget(lease.name, lease.token.as_str());
        self.store().forget(&key);
        // A little past the lease's end: the server counts from its own grant.
        self.store().linger_name(
            lease.name,
            lease.token,
            started + granted + Duration::from_secs(1),
        );
        Ok(LeaseCheck::Ours)
    }
}

#[distlock_core::engine::async_trait]
impl Downgrade for EtcdBackend {
    /// Our key keeps its name, its create revision (its place in the queue, and its fence) and
    /// its session; only the kind in its value changes. The readers right behind it see the
    /// change on their watches and come in; a writer behind it still waits for it.
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        _ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.downgrade_inner(lease).await
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for EtcdBackend {
    /// Our key keeps its name, its create revision (its fence), its session and its kind; its
    /// value names the new label.
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "writing a new label for an etcd lock's holder";
        let token = lease.token.as_str();
        self.rewrite(lease, DOING, |kind, holder| {
            let value = HolderValue::parse(holder);
            if value.token != token {
                return Edit::Refuse(LeaseCheck::Foreign);
            }
            Edit::Write(tag_value(kind, value.relabelled(owner).encode()))
        })
        .await
    }
}

/// What [`EtcdBackend::rewrite`] does with the value it read.
enum Edit {
    /// Writes this value instead.
    Write(String),
    /// Nothing to write: done already (a resent request).
    Done,
    /// Not ours to change.
    Refuse(LeaseCheck),
}

impl EtcdBackend {
    async fn downgrade_inner(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "downgrading an etcd write lock to a read lock";
        let check = self
            .rewrite(lease, DOING, |kind, holder| match kind {
                LeaseKind::Shared => Edit::Done,
                LeaseKind::Exclusive => {
                    Edit::Write(tag_value(LeaseKind::Shared, holder.to_owned()))
                }
                _ => Edit::Refuse(LeaseCheck::Foreign),
            })
            .await?;
        if check == LeaseCheck::Ours {
            self.inner
                .recipe
                .update(lease.name, lease.token.as_str(), |e| {
                    e.entry.kind = LeaseKind::Shared;
                });
        }
        Ok(check)
    }

    /// Reads our key's value and writes back what `edit` makes of it (its kind and holder),
    /// if nothing changed the key in between: the key keeps its name, its create revision (its
    /// place in the queue, and its fence) and its session. Tried a few times: a move of the
    /// key to another session changes it.
    async fn rewrite(
        &self,
        lease: &LeaseRef<'_>,
        doing: &str,
        edit: impl Fn(LeaseKind, &str) -> Edit,
    ) -> Result<LeaseCheck, LockError> {
        let Some(entry) = self.inner.recipe.held(lease.name, lease.token.as_str()) else {
            return Ok(LeaseCheck::Missing);
        };
        let (key, seq) = (entry.entry.id, entry.entry.seq);
        for _ in 0..3 {
            let read = TxnRequest::new(
                vec![Compare::create_revision(&*key, CompareResult::Equal, seq)],
                vec![RequestOp::range(RangeRequest::key(&*key))],
                vec![],
            );
            let reply = self
                .store()
                .txn(read)
                .await
                .map_err(|e| map_err(e, doing))?;
            let kv = reply
                .responses
                .first()
                .and_then(|r| r.range())
                .and_then(|r| r.kvs.first());
            let Some(kv) = kv.filter(|_| reply.succeeded) else {
                return Ok(LeaseCheck::Missing);
            };
            let value = String::from_utf8_lossy(&kv.value);
            let (kind, holder) = untag_value(&value);
            let value = match edit(kind, holder) {
                Edit::Write(value) => value,
                Edit::Done => return Ok(LeaseCheck::Ours),
                Edit::Refuse(check) => return Ok(check),
            };
            let write = TxnRequest::new(
                vec![Compare::mod_revision(
                    &*key,
                    CompareResult::Equal,
                    kv.mod_revision,
                )],
                vec![RequestOp::put(&*key, value, kv.lease)],
                vec![],
            );
            if self
                .store()
                .txn(write)
                .await
                .map_err(|e| map_err(e, doing))?
                .succeeded
            {
                return Ok(LeaseCheck::Ours);
            }
        }
        Err(LockError::new(
            ErrorKind::Connection,
            format!("{doing}: the key kept changing under us; try again"),
        ))
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for EtcdBackend {
    /// One keep-alive per session, however many locks are on it, and a check of the keys.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.renew_batch(items).await
    }

    /// The whole batch: a session's keys due together are checked by one listing of the
    /// session (cheaper for the server than reading each key), which chunks would split into
    /// transactions.
    fn max_batch(&self) -> usize {
        usize::MAX
    }
}

#[distlock_core::engine::async_trait]
impl WakeSource for EtcdBackend {
    async fn subscribe(
        &self,
        key: &str,
        _who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        Ok(Some(self.inner.recipe.subscribe(key)))
    }
}

#[distlock_core::engine::async_trait]
impl Sessions for EtcdBackend {
    /// The session the lock's key lives on ending while the key is on it (its lease expired,
    /// or no member kept it alive until its deadline); the key may move between sessions.
    ///
    /// A recorded holder (an election's leader) also watches its own key: a revoked lease, or
    /// an operator's delete, ends it at once rather than at the next keep-alive.
    ///
    /// Any other lease shares its session's one watch. A held key moves to another session
    /// when a renewal asks a TTL longer than its session's, which follows an `extend` (the core
    /// then asks again), and when the core stops renewing it (`detach`: it runs out on a lease
    /// of its own, and its loss shows at its deadline); at the old session's end,
    /// [`still_on`](Sessions::still_on) says it left.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        let Some(key) = self.store().key_of(lease.name, lease.token) else {
            return SessionWatch::Never;
        };
        if !lease.recorded {
            return match self.store().session_of(&key) {
                Some(s) => SessionWatch::Shared {
                    session: s.lease as u64,
                    end: s.ended.clone(),
                },
                None => SessionWatch::Never,
            };
        }
        let session = self.inner.recipe.store().session_end(key.clone());
        let Some(held) = self.inner.recipe.held(lease.name, lease.token.as_str()) else {
            return SessionWatch::Own(Box::pin(session));
        };
        let me = self.clone();
        SessionWatch::Own(Box::pin(async move {
            tokio::select! {
                why = session => why,
                () = me.key_gone(key, held.entry) => LostReason::Stolen,
            }
        }))
    }

    /// Whether the lock's key was on the session of that lease when it ended.
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        self.store()
            .key_of(lease.name, lease.token)
            .and_then(|key| self.store().session_of(&key))
            .is_some_and(|s| s.lease as u64 == session)
    }

    /// Moves the key to a private lease of `ttl` (deletes it when `ttl` is zero), unless it is
    /// on one already.
    async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<(), LockError> {
        let Some(entry) = self.inner.recipe.held(lease.name, lease.token.as_str()) else {
            return Ok(());
        };
        if !self
            .store()
            .session_of(&entry.entry.id)
            .is_some_and(|s| s.shared)
        {
            return Ok(());
        }
        if ttl.is_zero() {
            self.release(lease).await?;
        } else {
            self.to_private(lease, ttl).await?;
        }
        Ok(())
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for EtcdBackend {
    /// Deletes the holder's key (the oldest under the lock's prefix), if it is still the one
    /// read: the next waiter's watch sees it go, as after a release. The holder's session lives
    /// on (it may hold the holder's other locks); its next renewal finds the key gone.
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking an etcd lock";
        let Some(kv) = self.holder_kv(key, DOING).await? else {
            return Ok(BreakOutcome::Free);
        };
        let fence = u64::try_from(kv.create_revision).ok();
        let st = LockStatus::held_by(vec![self.holder_status(&kv).await]).with_last_fence(fence);
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                kv.key.as_slice(),
                CompareResult::Equal,
                kv.create_revision,
            )],
            vec![RequestOp::delete(kv.key.as_slice())],
            vec![],
        );
        let done = self.store().txn(txn).await.map_err(|e| map_err(e, DOING))?;
        Ok(if done.succeeded {
            BreakOutcome::Broken(st)
        } else {
            BreakOutcome::Changed
        })
    }
}
