//! The queue on etcd: what the core's queue recipe asks of a store, in etcd's terms.
//!
//! Each acquisition is a key `<prefix><name>/<client>-<n>`, attached to the lease of this
//! client's session for its TTL; keys queue by create revision, which is also the fencing token.
//! `<client>` is random per backend, and `n` the lowest number none of this client's live
//! acquisitions of the lock uses: a client that takes a lock again and again writes the same key,
//! as etcd's own `concurrency.Mutex` does (its key is the session's lease id). A new key name per
//! acquisition would leave a deleted key behind each time in etcd's index, which every compare
//! over the lock's prefix walks until the next compaction, so a cluster that is not compacted
//! would slow down with every acquisition (seen as P5's etcd figure falling from run to run).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireMode, AcquireRequest, BoxFuture, ErrorKind, LeaseKind, LockError, LostReason, Token,
};
use distlock_core::recipes::queue::{Ahead, JoinOutcome, Joined, QueueStore, QueuedEntry};
use distlock_core::recipes::{
    CompactToken, HolderValue, MutexExt, kind_conflict, tag_value, untag_value,
};
use tokio::sync::Notify;
use tonic::Status;

use crate::error::{lease_missing, map_err};
use crate::members::Members;
pub(crate) use crate::names::Key;
use crate::names::KeyNames;
use crate::session::{Session, Sessions};
use crate::wire::{
    Compare, CompareResult, DeleteRangeRequest, Event, EventType, RangeRequest, RequestOp,
    SortOrder, SortTarget, TxnRequest, TxnResponse, WatchCreateRequest, revision,
};

/// etcd as a store of lock queues.
pub(crate) struct EtcdStore {
    pub(crate) members: Arc<Members>,
    pub(crate) sessions: Sessions,
    pub(crate) prefix: String,
    /// Keys of ours released while etcd could not be reached (an acquire given up during an
    /// election, say): until their delete is answered, a first attempt that finds one of them
    /// holding its lock deletes it rather than report the lock busy.
    abandoned: Arc<Mutex<HashSet<String>>>,
    /// Our key names: whose each one is, and the session it lives on (a key attached to one of
    /// our sessions that has none there was written by a request given up before its reply
    /// came: see [`EtcdStore::orphans`]).
    names: Arc<Mutex<KeyNames>>,
    /// This backend's part of its key names.
    client: String,
    /// When to list a session's keys for orphans (see [`EtcdStore::sweep_due`]).
    sweeps: Mutex<Sweeps>,
    /// The multi-name holds and attempts of this client, by token.
    pub(crate) many: crate::names::ManyHolds,
}

/// When a request of ours was last given up (a write whose reply never came may still land:
/// an orphan), and when each session's keys were last listed to find orphans.
#[derive(Default)]
struct Sweeps {
    gave_up: Option<Instant>,
    last: HashMap<i64, Instant>,
}

/// For this long after a request was given up, each renewal of a session lists its keys for
/// orphans (a write queued at a follower during an election may land that late).
const ORPHAN_WINDOW: Duration = Duration::from_secs(60);

/// Otherwise a session's keys are listed this often at most: a listing costs in proportion to
/// every key on the session (6 MB for 100,000 locks), and a renewal checks only the keys due.
const SWEEP_BACKSTOP: Duration = Duration::from_secs(60);

/// How many times a discarded key's delete is sent while etcd does not answer (backing off to
/// half a second: about a minute in all).
const REMOVE_TRIES: u32 = 120;

impl EtcdStore {
    pub(crate) fn new(members: Arc<Members>, sessions: Sessions, prefix: String) -> Self {
        EtcdStore {
            members,
            sessions,
            prefix,
            abandoned: Arc::default(),
            names: Arc::default(),
            client: Token::generate().as_str().chars().take(16).collect(),
            sweeps: Mutex::default(),
            many: crate::names::ManyHolds::default(),
        }
    }

    /// The key of `token`'s multi-name hold of `name`: `<prefix><name>/<client>~<token>`. The
    /// `~` keeps it apart from this client's single-name keys (`<client>-<n>`), which
    /// [`is_ours`](Self::is_ours) and [`KeyNames`] know; the token makes it this hold's alone,
    /// so that a resend finds it and a release can delete it without any book-keeping.
    pub(crate) fn many_key(&self, name: &str, token: &str) -> String {
        format!("{}{name}/{}~{token}", self.prefix, self.client)
    }

    /// The token of one of this client's multi-name keys, if `key` is one.
    fn many_token_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?
            .rsplit_once('/')?
            .1
            .strip_prefix(self.client.as_str())?
            .strip_prefix('~')
    }

    /// Whether `key` is a multi-name key of this client that no hold or attempt of it has
    /// (released while etcd could not be reached, or written by an attempt given up).
    fn stale_many(&self, key: &str) -> bool {
        self.many_token_of(key)
            .is_some_and(|token| !self.many.knows(token))
    }

    /// The key prefix under which the lock `name` queues its holders.
    pub(crate) fn lock_prefix(&self, name: &str) -> String {
        format!("{}{name}/", self.prefix)
    }

    /// Our key name `n` of the lock `name`, written into `out`.
    fn write_key(&self, out: &mut String, name: &str, n: u32) {
        out.clear();
        out.push_str(&self.prefix);
        out.push_str(name);
        out.push('/');
        out.push_str(&self.client);
        out.push('-');
        out.push_str(itoa::Buffer::new().format(n));
    }

    /// The key `token` has for the lock `name`, from `names` (its first name is written in
    /// their scratch buffer: a release allocates nothing to find its key).
    fn key_in(&self, names: &mut KeyNames, name: &str, token: &CompactToken) -> Option<Key> {
        let mut first = names.scratch();
        self.write_key(&mut first, name, 0);
        let key = names.key_of(&first, token);
        names.put_scratch(first);
        key
    }

    /// The key of `token`'s acquisition of `name`: the one it has, or the lowest free one.
    fn key_for(&self, name: &str, token: &Token) -> Key {
        let mut names = self.names.locked();
        let token = CompactToken::from(token);
        if let Some(key) = self.key_in(&mut names, name, &token) {
            return key;
        }
        if names.lingers() {
            names.expire_lingering(self.sessions.clock().now());
        }
        let mut key = String::new();
        let n = (0u32..)
            .find(|n| {
                self.write_key(&mut key, name, *n);
                names.available(&key)
            })
            .unwrap_or_default();
        let key = Key::from(key);
        names.give(key.clone(), token, n == 0);
        key
    }

    /// The key of `token`'s acquisition of `name`, if it may have one on the server.
    pub(crate) fn key_of(&self, name: &str, token: &Token) -> Option<Key> {
        let token = CompactToken::from(token);
        self.key_in(&mut self.names.locked(), name, &token)
    }

    /// `token`'s acquisition of `name` has no key on the server (nothing was written, or its
    /// delete was answered): its name is free for the next acquisition.
    pub(crate) fn free_name(&self, name: &str, token: &Token) {
        let token = CompactToken::from(token);
        let mut names = self.names.locked();
        if let Some(key) = self.key_in(&mut names, name, &token) {
            names.free_key(&key);
        }
    }

    /// `token`'s key of `name` was left on the server to run out by itself at `until` (on the
    /// client's clock): its name stays out of use until then, and the token is forgotten.
    pub(crate) fn linger_name(&self, name: &str, token: &Token, until: Instant) {
        let token = CompactToken::from(token);
        let mut names = self.names.locked();
        if let Some(key) = self.key_in(&mut names, name, &token) {
            names.linger(key, until);
        }
    }

    /// `token`'s acquisition of `name` was given up and its key deleted: its name is nobody's
    /// from now, and never given out again (see [`crate::names`]).
    pub(crate) fn burn_name(&self, name: &str, token: &Token) {
        let token = CompactToken::from(token);
        let mut names = self.names.locked();
        if let Some(key) = self.key_in(&mut names, name, &token) {
            names.burn(key);
        }
    }

    /// The session `key` lives on.
    pub(crate) fn session_of(&self, key: &str) -> Option<Arc<Session>> {
        self.names.locked().session_of(key)
    }

    /// Records that `key` now lives on `session` (or is about to be written on it).
    pub(crate) fn set_session(&self, key: &Key, session: Arc<Session>) {
        // Ours again (a later attempt with the same token): not to be cleared out of the way.
        self.abandoned.locked().remove(&**key);
        self.names.locked().set_session(key, session);
    }

    /// Forgets `key`'s session (it was deleted, or its request given up). Nobody watching for
    /// the end of its session is woken: a lease released has its watch stopped, and a watch
    /// that sees its session end checks that the key is still on it.
    pub(crate) fn forget(&self, key: &str) {
        self.names.locked().forget(key);
    }

    /// Notes whether releasing `key` was answered (a key not deleted may be in the way of a
    /// later first attempt: see [`EtcdStore::clear_abandoned`]).
    pub(crate) fn released(&self, key: &str, answered: bool) {
        if answered {
            self.abandoned.locked().remove(key);
        } else {
            self.abandoned.locked().insert(key.to_owned());
            self.note_given_up();
        }
    }

    /// A request of ours was given up: its write may still land, an orphan, for a while.
    pub(crate) fn note_given_up(&self) {
        self.sweeps.locked().gave_up = Some(Instant::now());
    }

    /// Whether this renewal of the session on `lease` lists its keys for orphans (see
    /// [`EtcdStore::orphans`]): at each renewal for a while after a request was given up,
    /// otherwise once a minute.
    pub(crate) fn sweep_due(&self, lease: i64) -> bool {
        let now = Instant::now();
        let mut sweeps = self.sweeps.locked();
        let lately = sweeps
            .gave_up
            .is_some_and(|g| now.saturating_duration_since(g) < ORPHAN_WINDOW);
        let due = lately
            || sweeps
                .last
                .get(&lease)
                .is_none_or(|t| now.saturating_duration_since(*t) >= SWEEP_BACKSTOP);
        if due {
            if sweeps.last.len() >= 1024 {
                sweeps
                    .last
                    .retain(|_, t| now.saturating_duration_since(*t) < SWEEP_BACKSTOP);
            }
            sweeps.last.insert(lease, now);
        }
        due
    }

    /// Notes that `key` is being released by an acquisition that never held it (a given-up
    /// acquire's clean-up): from now, a first attempt that finds it holding its lock deletes it
    /// rather than report the lock busy, even while this release is still in flight.
    pub(crate) fn abandon(&self, key: &str) {
        self.abandoned.locked().insert(key.to_owned());
        self.note_given_up();
    }

    /// Whether `key` is one of this client's key names.
    fn is_ours(&self, key: &str) -> bool {
        key.strip_prefix(&self.prefix)
            .and_then(|rest| rest.rsplit_once('/'))
            .and_then(|(_, last)| last.strip_prefix(self.client.as_str()))
            .is_some_and(|n| n.starts_with('-'))
    }

    /// After a busy first attempt for our key `mine`: if the holder's key it read is stale (see
    /// [`EtcdStore::clear_stale`]), or is `mine` itself (an earlier write of that name, given up
    /// and landed late: this attempt wrote nothing), deletes it. Whether it did.
    async fn clear_abandoned(&self, busy: &TxnResponse, mine: &str) -> Result<bool, LockError> {
        let Some(kv) = busy
            .responses
            .first()
            .and_then(|r| r.range())
            .and_then(|r| r.kvs.first())
        else {
            return Ok(false);
        };
        let key = String::from_utf8_lossy(&kv.key);
        if key == mine {
            self.delete_at(mine, kv.create_revision).await?;
            return Ok(true);
        }
        self.clear_stale(&key, kv.create_revision).await
    }

    /// If `key` (read with `create_revision`) is one of ours that no live acquisition of ours
    /// has (released while etcd could not be reached, a given-up acquire's being cleaned up, or
    /// deleted since it was read; or a multi-name key whose token no hold or attempt of ours
    /// has), deletes it if it is still that key, so that it keeps no
    /// acquisition of ours out. Whether it did. Its name stays reserved until the release that
    /// is cleaning it up is answered: that delete may still land.
    ///
    /// # Errors
    /// The delete's: the lock is then not known to be busy.
    pub(crate) async fn clear_stale(
        &self,
        key: &str,
        create_revision: i64,
    ) -> Result<bool, LockError> {
        let stale = (self.is_ours(key)
            && (self.abandoned.locked().contains(key) || !self.names.locked().in_use(key)))
            || self.stale_many(key);
        if stale {
            self.delete_at(key, create_revision).await?;
        }
        Ok(stale)
    }

    /// Deletes `key` if its create revision is still `create_revision`.
    async fn delete_at(&self, key: &str, create_revision: i64) -> Result<(), LockError> {
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                key,
                CompareResult::Equal,
                create_revision,
            )],
            vec![RequestOp::delete(key)],
            vec![],
        );
        self.txn(txn)
            .await
            .map(drop)
            .map_err(|e| map_err(e, "deleting a stale etcd lock key of ours"))
    }

    /// The session `key` lives on, and the signal of its moves to another (made at the first
    /// call).
    fn watch_session(&self, key: &str) -> Option<(Arc<Session>, Arc<Notify>)> {
        self.names.locked().watch_session(key)
    }

    /// Resolves with the reason when the session `key` lives on ends while the key is on it;
    /// never when the key leaves our sessions (deleted) first.
    pub(crate) fn session_end(
        self: &Arc<Self>,
        key: Key,
    ) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let store = Arc::downgrade(self);
        async move {
            loop {
                let Some((session, moved)) = store.upgrade().and_then(|s| s.watch_session(&key))
                else {
                    return std::future::pending().await;
                };
                let on_move = moved.notified();
                tokio::pin!(on_move);
                on_move.as_mut().enable();
                let still_on = |session: &Arc<Session>| {
                    store
                        .upgrade()
                        .and_then(|s| s.session_of(&key))
                        .is_some_and(|now| Arc::ptr_eq(&now, session))
                };
                // Moved between the read and the signal's registration: read again.
                if !still_on(&session) {
                    continue;
                }
                tokio::select! {
                    why = session.ended() => {
                        if still_on(&session) {
                            return why;
                        }
                    }
                    () = on_move => {}
                }
            }
        }
    }

    /// Of the keys attached to one of our sessions' leases, those we do not know: written by a
    /// request given up before its reply came (its future dropped, or a lost reply not resent),
    /// after the clean-up's delete. Nobody waits on them and nobody holds them; they would live as
    /// long as the session.
    pub(crate) fn orphans(&self, attached: &crate::wire::KeyList) -> Vec<Vec<u8>> {
        let names = self.names.locked();
        attached
            .iter()
            .filter(|k| {
                let k = String::from_utf8_lossy(k);
                // A multi-name key is known by its token, not by name.
                k.starts_with(&self.prefix)
                    && !names.is_on_session(k.as_ref())
                    && self.many_token_of(&k).is_none_or(|t| !self.many.knows(t))
            })
            .map(|k| k.to_vec())
            .collect()
    }

    /// Deletes `key` if it is still attached to `lease`, in the background.
    pub(crate) fn delete_if_on(&self, key: Vec<u8>, lease: i64) {
        let members = self.members.clone();
        tokio::spawn(async move {
            let txn = TxnRequest::new(
                vec![Compare::lease(key.as_slice(), CompareResult::Equal, lease)],
                vec![RequestOp::delete(key.as_slice())],
                vec![],
            );
            let _ = members
                .write(|c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await;
        });
    }

    /// Sends a transaction (again on another member while it never reached one).
    pub(crate) async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        self.members
            .write(|c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// An acquire's transaction. `Ok(None)`: the session's lease was found gone (it ran out
    /// before the key could be written).
    async fn acquire_txn(&self, txn: TxnRequest) -> Result<Option<TxnResponse>, LockError> {
        match self.txn(txn).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if lease_missing(&e) => Ok(None),
            Err(e) => Err(map_err(e, "acquiring an etcd lock")),
        }
    }

    async fn join_inner(&self, req: &AcquireRequest<'_>) -> Result<JoinOutcome<Key>, LockError> {
        let key = self.key_for(req.name, req.token);
        // A session can run out just as it is used (idle, near its deadline): one more try, on a
        // session granted for it.
        for _ in 0..2 {
            let session = self.sessions.get(req.ttl, req.clock).await?;
            let sent = req.clock.now();
            // Entered before the write is sent: a write that lands after its request was given
            // up is then cleaned up by the release, or found an orphan at a renewal.
            self.set_session(&key, session.clone());
            let joined = self.join_on(req, &key, &session).await;
            match &joined {
                Ok(Some(JoinOutcome::Joined(_))) => {}
                Ok(Some(_)) => {
                    // Busy: nothing was written.
                    self.forget(&key);
                    self.free_name(req.name, req.token);
                }
                Ok(None) => {
                    self.forget(&key);
                    session.lapsed(sent);
                    continue;
                }
                // A refusal of a first send: nothing was written. A refused resend says
                // nothing of what the lost send did, so its key is kept for the clean-up.
                Err(e) if !e.is_ambiguous() && !req.mode.is_resend() => {
                    self.forget(&key);
                    self.free_name(req.name, req.token);
                }
                Err(_) => {}
            }
            return joined.map(|j| j.unwrap_or(JoinOutcome::Busy));
        }
        Err(LockError::new(
            ErrorKind::Lost,
            "the etcd session's lease expired before the lock was written, twice",
        ))
    }

    /// [`join`](QueueStore::join) on `session`; `Ok(None)` when its lease is gone.
    async fn join_on(
        &self,
        req: &AcquireRequest<'_>,
        id: &Key,
        session: &Arc<Session>,
    ) -> Result<Option<JoinOutcome<Key>>, LockError> {
        let key: &str = id;
        // The lock lasts from the session's last refresh (its grant, for a new one, which may
        // have waited for an election): say how long ago that was.
        let age = Some(
            req.clock
                .now()
                .saturating_duration_since(session.refreshed()),
        );
        let value = tag_value(
            req.kind,
            HolderValue::now(req.token.as_str(), req.owner).encode(),
        );
        if req.mode == AcquireMode::Try && req.kind == LeaseKind::Exclusive {
            // A first attempt: one transaction that writes our key only if the lock has no key
            // at all (a compare over the whole prefix), and writes nothing when it is busy but
            // read the holder's key. A holder that is a stale key of ours (a given-up acquire's,
            // its clean-up not done yet) is deleted, and the attempt made again; a failed delete
            // is an error, not a busy lock.
            // (A few times: each send of a given-up acquisition may land late, once.)
            let mut reply = None;
            for _ in 0..4 {
                let txn = TxnRequest::new(
                    vec![
                        Compare::create_revision(
                            self.lock_prefix(req.name),
                            CompareResult::Equal,
                            0,
                        )
                        .over_prefix(),
                    ],
                    vec![RequestOp::put(key, value.as_str(), session.lease)],
                    vec![RequestOp::range(
                        RangeRequest::prefix(self.lock_prefix(req.name))
                            .sorted(SortTarget::Create, SortOrder::Ascend)
                            .limit(1),
                    )],
                );
                let Some(r) = self.acquire_txn(txn).await? else {
                    return Ok(None);
                };
                if r.succeeded || !self.clear_abandoned(&r, key).await? {
                    reply = Some(r);
                    break;
                }
            }
            if let Some(busy) = reply.as_ref().filter(|r| !r.succeeded) {
                // The holder read in the same transaction: a semaphore's permit is a conflict
                // of kinds, not a busy lock.
                if let Some(kv) = busy
                    .responses
                    .first()
                    .and_then(|r| r.range())
                    .and_then(|r| r.kvs.first())
                {
                    let theirs = untag_value(&String::from_utf8_lossy(&kv.value)).0;
                    if theirs != LeaseKind::Exclusive && theirs != LeaseKind::Shared {
                        return Err(kind_conflict(req.name, req.kind, theirs));
                    }
                }
            }
            let Some(reply) = reply.filter(|r| r.succeeded) else {
                return Ok(Some(JoinOutcome::Busy));
            };
            // The put was the transaction's only write: its revision is the key's create
            // revision.
            let rev = revision(reply.header.as_ref());
            return Ok(Some(JoinOutcome::Joined(Joined {
                entry: QueuedEntry {
                    id: id.clone(),
                    seq: rev,
                    kind: req.kind,
                    seen_at: rev,
                },
                fence: u64::try_from(rev).ok(),
                ahead: Some(Vec::new()),
                age,
            })));
        }
        // Waiting, or resent: create the key unless it exists, and read it back.
        let mine = RequestOp::range(RangeRequest::key(key).keys_only());
        let txn = TxnRequest::new(
            vec![Compare::create_revision(key, CompareResult::Equal, 0)],
            vec![RequestOp::put(key, value, session.lease), mine.clone()],
            vec![mine],
        );
        let Some(reply) = self.acquire_txn(txn).await? else {
            return Ok(None);
        };
        let at = revision(reply.header.as_ref());
        let Some(kv) = reply
            .responses
            .last()
            .and_then(|r| r.range())
            .and_then(|r| r.kvs.first())
        else {
            return Err(LockError::new(
                ErrorKind::Protocol,
                "acquiring an etcd lock: the transaction's read came back empty",
            ));
        };
        let seq = kv.create_revision;
        if kv.lease != session.lease {
            // A resent request whose key lives on an older session: move it to the current
            // one, keeping its place.
            let moved = TxnRequest::new(
                vec![Compare::create_revision(key, CompareResult::Equal, seq)],
                vec![RequestOp::move_to_lease(key, session.lease)],
                vec![],
            );
            if !self.acquire_txn(moved).await?.is_some_and(|r| r.succeeded) {
                return Err(LockError::new(
                    ErrorKind::Lost,
                    "our etcd lock key vanished while it was moved to the current session",
                ));
            }
        }
        Ok(Some(JoinOutcome::Joined(Joined {
            entry: QueuedEntry {
                id: id.clone(),
                seq,
                kind: req.kind,
                seen_at: at,
            },
            fence: u64::try_from(seq).ok(),
            ahead: None,
            age,
        })))
    }

    async fn ahead_inner(
        &self,
        name: &str,
        mine: &QueuedEntry<Key>,
        kind: LeaseKind,
    ) -> Result<Ahead<Key>, LockError> {
        let mut read = RangeRequest::prefix(self.lock_prefix(name))
            .sorted(SortTarget::Create, SortOrder::Descend)
            .max_create_revision(mine.seq - 1);
        match kind {
            // The nearest one decides for an exclusive entry, the n nearest for a permit; a
            // shared entry reads as far as the nearest exclusive one, which may be anywhere.
            LeaseKind::Exclusive => read = read.limit(1),
            LeaseKind::Permit { permits } => read = read.limit(i64::from(permits.max(1))),
            _ => {}
        }
        // Our key must still be there, with its place.
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                &*mine.id,
                CompareResult::Equal,
                mine.seq,
            )],
            vec![RequestOp::range(read)],
            vec![],
        );
        // A stale key of ours ahead (a given-up acquire's) is deleted and the queue read again,
        // a bounded number of times: our own leftovers keep none of our acquisitions waiting.
        let mut cleared = 0;
        loop {
            let reply = self
                .txn(txn.clone())
                .await
                .map_err(|e| map_err(e, "reading an etcd lock's queue"))?;
            if !reply.succeeded {
                return Ok(None);
            }
            let at = revision(reply.header.as_ref());
            let Some(range) = reply.responses.first().and_then(|r| r.range()) else {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    "reading an etcd lock's queue: no read in the reply",
                ));
            };
            let mut ahead: Vec<QueuedEntry<Key>> = range
                .kvs
                .iter()
                .map(|kv| QueuedEntry {
                    id: Key::from(String::from_utf8_lossy(&kv.key)),
                    seq: kv.create_revision,
                    kind: untag_value(&String::from_utf8_lossy(&kv.value)).0,
                    seen_at: at,
                })
                .collect();
            let mut stale = false;
            if cleared < 2 {
                for e in &ahead {
                    stale |= self.clear_stale(&e.id, e.seq).await?;
                }
            }
            if !stale {
                ahead.reverse();
                return Ok(Some(ahead));
            }
            cleared += 1;
        }
    }
}

#[distlock_core::engine::async_trait]
impl QueueStore for EtcdStore {
    type Id = Key;

    async fn join(&self, req: &AcquireRequest<'_>) -> Result<JoinOutcome<Key>, LockError> {
        self.join_inner(req).await
    }

    async fn ahead(
        &self,
        name: &str,
        mine: &QueuedEntry<Key>,
        kind: LeaseKind,
    ) -> Result<Ahead<Key>, LockError> {
        self.ahead_inner(name, mine, kind).await
    }

    /// A watch on the key for its deletion, or a change of its kind (a writer downgraded to a
    /// reader), from the revision after the one it was seen at (an event between the read and
    /// the watch is not missed).
    fn watch_gone(&self, entry: &QueuedEntry<Key>) -> BoxFuture<'static, ()> {
        let members = self.members.clone();
        let create = WatchCreateRequest {
            key: entry.id.as_bytes().to_vec(),
            start_revision: entry.seen_at + 1,
            ..Default::default()
        };
        let kind = entry.kind;
        Box::pin(async move {
            let opened = members
                .retry(|c| {
                    let create = create.clone();
                    async move { c.watch(create).await }
                })
                .await;
            let Ok(mut stream) = opened else { return };
            loop {
                match stream.message().await {
                    Ok(Some(r)) if r.canceled => return,
                    Ok(Some(r)) => {
                        let changed = |e: &Event| {
                            e.r#type == EventType::Delete as i32
                                || e.kv.as_ref().is_some_and(|kv| {
                                    untag_value(&String::from_utf8_lossy(&kv.value)).0 != kind
                                })
                        };
                        if r.events.iter().any(changed) {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        })
    }

    /// The age of the session `id` lives on: since the last keep-alive the server answered
    /// was sent.
    fn lease_age(
        &self,
        id: &Key,
        clock: &Arc<dyn distlock_core::engine::Clock>,
    ) -> Option<Duration> {
        let session = self.session_of(id)?;
        Some(clock.now().saturating_duration_since(session.refreshed()))
    }

    fn remove_later(&self, _name: &str, _token: &str, id: &Key) {
        self.forget(id);
        // The next attempt of the same token (a waiter after a first attempt) writes a key of
        // another name: this one may still be there when it is sent, and be deleted after.
        // Until the delete is answered, the key is abandoned (a first attempt that finds it in
        // its way deletes it, rather than call the lock busy), and its name is not given out.
        self.names.locked().release_token_of(id);
        self.abandoned.locked().insert(id.to_string());
        let (members, names, abandoned) = (
            self.members.clone(),
            self.names.clone(),
            self.abandoned.clone(),
        );
        let key = id.clone();
        tokio::spawn(async move {
            // Tried again while etcd cannot answer (an election), for as long as a session
            // could keep the key alive unattended; past that, a renewal finds it an orphan.
            let mut pause = Duration::from_millis(20);
            for _ in 0..REMOVE_TRIES {
                let deleted = members
                    .write(|c| {
                        let delete = DeleteRangeRequest {
                            key: key.as_bytes().to_vec(),
                            ..Default::default()
                        };
                        async move { c.delete_range(delete).await }
                    })
                    .await;
                if deleted.is_ok() {
                    // The name first: a first attempt that read the key before this delete
                    // landed then finds it stale either way (abandoned, or no longer in use),
                    // where the other order left an instant in which it was neither, and the
                    // attempt called the lock busy with our own gone key.
                    names.locked().free_key(&key);
                    abandoned.locked().remove(&*key);
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        });
    }
}
