//! Several names at once (`MultiLock`): one transaction takes them all or none.
//!
//! The transaction compares every name's lock prefix (`<prefix><name>/`, a compare with a
//! range end: etcd checks each key in the range, and an empty range compares as a key that
//! does not exist) for a create revision of 0, so it succeeds only when no key at all, holder
//! or waiter, is under any of the names. It then puts one key per name,
//! `<prefix><name>/<client>~<token>`, on this client's session for the TTL, with the value of
//! an exclusive holder: to the queue recipe of single-name waiters it is a holder like any
//! other, which they queue behind by create revision and whose deletion their watches see.
//! Otherwise it writes nothing, and reads each name's oldest key (its holder) to say which name
//! was busy, or to find the keys of a resend. Every key gets the transaction's revision as its
//! create revision, the fence of each name: above every earlier holder's key of the name.
//!
//! Before the transaction, the session gets a keep-alive unless its deadline is a TTL away
//! already: the core counts the lease from when it sent the request, and the server must not
//! let the keys go before that. The hold is known by its token (`names::ManyHolds`) from before
//! the write is sent until its release is answered; a stale key of ours found holding a name
//! (a given-up attempt's) is deleted and the transaction sent again.
//!
//! A multi-name lease is renewed by its renewals alone: they keep the session alive, and its
//! keys are not counted among the session's keys that its keeper keeps alive on a schedule. A
//! renewal reads the keys (one transaction) beside the session's keep-alive; a session that
//! ended shows as `Missing` there, as the core has no session watch for such a lease.

use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, ErrorKind, LeaseCheck, LeaseKind, LockError, ManyAttempt, MultiLock, Token,
    combine_checks,
};
use distlock_core::recipes::{HolderValue, kind_conflict, tag_value, untag_value};

use crate::backend::EtcdBackend;
use crate::error::{lease_missing, map_err};
use crate::names::Hold;
use crate::session::{self, Session};
use crate::store::EtcdStore;
use crate::wire::{
    Compare, CompareResult, DeleteRangeRequest, KeyValue, RangeRequest, Request, RequestOp,
    Response, SortOrder, SortTarget, TxnRequest, TxnResponse, revision,
};

/// etcd's default `--max-txn-ops`: the most names one transaction takes.
const TXN_OPS: usize = 128;

/// What a transaction that wrote nothing read of each name's oldest key.
enum Found {
    /// Every name's oldest key is ours (a resend): each one's create revision and lease.
    Ours(Vec<(i64, i64)>),
    /// The name at this place is held by another key.
    Busy(usize, KeyValue),
}

/// A key's value as an exclusive holder's, with our token.
fn holder_value(token: &str, owner: &str) -> String {
    tag_value(
        LeaseKind::Exclusive,
        HolderValue::now(token, owner).encode(),
    )
}

/// Whether the value of a key names `token` as its holder.
fn holds_token(kv: &KeyValue, token: &str) -> bool {
    let value = String::from_utf8_lossy(&kv.value);
    HolderValue::parse(untag_value(&value).1).token == token
}

/// The etcd error of a transaction, with the limit named when there were many names.
fn txn_error(e: tonic::Status, doing: &str, names: usize) -> LockError {
    let e = map_err(e, doing);
    if names > TXN_OPS && e.kind() == ErrorKind::InvalidKey {
        return LockError::new(
            e.kind(),
            format!(
                "{e}: {names} names are more than one etcd transaction takes (its \
                 --max-txn-ops, {TXN_OPS} by default)"
            ),
        );
    }
    e
}

impl EtcdBackend {
    fn many_keys(&self, names: &[&str], token: &str) -> Result<Vec<String>, LockError> {
        if token.contains('/') {
            return Err(LockError::new(
                ErrorKind::InvalidKey,
                "an etcd multi-name lock's token cannot contain '/' (it names its keys)",
            ));
        }
        Ok(names
            .iter()
            .map(|n| self.store().many_key(n, token))
            .collect())
    }

    /// The one transaction: every key written if no key is under any name's prefix, otherwise
    /// each name's oldest key read.
    fn take_txn(
        store: &EtcdStore,
        names: &[&str],
        keys: &[String],
        value: &str,
        lease: i64,
    ) -> TxnRequest {
        TxnRequest::new(
            names
                .iter()
                .map(|n| {
                    Compare::create_revision(store.lock_prefix(n), CompareResult::Equal, 0)
                        .over_prefix()
                })
                .collect(),
            keys.iter()
                .map(|k| RequestOp::put(k.as_str(), value, lease))
                .collect(),
            names
                .iter()
                .map(|n| {
                    RequestOp::range(
                        RangeRequest::prefix(store.lock_prefix(n))
                            .sorted(SortTarget::Create, SortOrder::Ascend)
                            .limit(1),
                    )
                })
                .collect(),
        )
    }

    /// What the failed transaction read: our keys everywhere, or the first name held by
    /// another key.
    fn found(reply: &TxnResponse, keys: &[String]) -> Result<Found, LockError> {
        let mut ours = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let Some(read) = reply.responses.get(i).and_then(|r| r.range()) else {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    "taking several etcd locks: a read is missing from the reply",
                ));
            };
            match read.kvs.first() {
                Some(kv) if kv.key == key.as_bytes() => ours.push((kv.create_revision, kv.lease)),
                Some(kv) => return Ok(Found::Busy(i, kv.clone())),
                // Gone since the compare: not ours either way.
                None => return Ok(Found::Busy(i, KeyValue::default())),
            }
        }
        Ok(Found::Ours(ours))
    }

    /// Moves our keys (found by a resend on an older session) to `session`, keeping their
    /// create revisions. `false`: one is gone.
    async fn move_keys(
        &self,
        keys: &[String],
        revs: &[i64],
        session: &Session,
        doing: &str,
    ) -> Result<bool, LockError> {
        let txn = TxnRequest::new(
            keys.iter()
                .zip(revs)
                .map(|(k, rev)| Compare::create_revision(k.as_str(), CompareResult::Equal, *rev))
                .collect(),
            keys.iter()
                .map(|k| RequestOp::move_to_lease(k.as_str(), session.lease))
                .collect(),
            vec![],
        );
        let reply = self
            .store()
            .txn(txn)
            .await
            .map_err(|e| txn_error(e, doing, keys.len()))?;
        Ok(reply.succeeded)
    }

    async fn acquire_all_inner(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        const DOING: &str = "taking several etcd locks";
        let store = self.store();
        let token = req.token.as_str();
        let keys = self.many_keys(req.names, token)?;
        let value = holder_value(token, req.owner);
        // A session can run out just as it is used: one more try, on a session granted for it.
        for _ in 0..2 {
            let session = store.sessions.get(req.ttl, req.clock).await?;
            // The core counts the lease from when it sent the request; the server keeps the
            // keys until the session's deadline. A keep-alive first, unless that deadline is a
            // TTL away already, so the server never lets them go before the core does.
            if session.deadline() < req.clock.now() + req.ttl {
                match session.keep_alive().await {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Lost => continue,
                    Err(e) => return Err(e),
                }
            }
            // Known before the write is sent: the renewals' sweep leaves the keys alone.
            store.many.put(token, session.clone(), None);
            let sent = req.clock.now();
            let mut cleared = 0;
            loop {
                let txn = Self::take_txn(store, req.names, &keys, &value, session.lease);
                let reply = match store.txn(txn).await {
                    Ok(r) => r,
                    Err(e) if lease_missing(&e) => {
                        store.many.take(token);
                        session.lapsed(sent);
                        break;
                    }
                    Err(e) => {
                        let e = txn_error(e, DOING, keys.len());
                        // A refused first send wrote nothing; an unanswered one may have, and
                        // the core's clean-up releases it.
                        if !e.is_ambiguous() && !req.mode.is_resend() {
                            store.many.take(token);
                        }
                        return Err(e);
                    }
                };
                if reply.succeeded {
                    // The puts were the transaction's only writes: its revision is every
                    // key's create revision.
                    let rev = revision(reply.header.as_ref());
                    let n = keys.len();
                    store.many.put(token, session, Some(vec![rev; n]));
                    return Ok(ManyAttempt::Acquired {
                        fences: vec![u64::try_from(rev).ok(); n],
                    });
                }
                match Self::found(&reply, &keys)? {
                    Found::Ours(found) => {
                        // A resend whose first send took them all.
                        let revs: Vec<i64> = found.iter().map(|(rev, _)| *rev).collect();
                        if found.iter().any(|(_, lease)| *lease != session.lease)
                            && !self.move_keys(&keys, &revs, &session, DOING).await?
                        {
                            return Err(LockError::new(
                                ErrorKind::Lost,
                                "our etcd lock keys vanished while they were moved to the \
                                 current session",
                            ));
                        }
                        let fences = revs.iter().map(|r| u64::try_from(*r).ok()).collect();
                        store.many.put(token, session, Some(revs));
                        return Ok(ManyAttempt::Acquired { fences });
                    }
                    Found::Busy(i, kv) => {
                        let theirs = untag_value(&String::from_utf8_lossy(&kv.value)).0;
                        let key = String::from_utf8_lossy(&kv.key).into_owned();
                        // A stale key of ours in the way (a given-up attempt's, its clean-up
                        // not done yet) is deleted, and the transaction sent again.
                        if !key.is_empty()
                            && cleared < 4
                            && store.clear_stale(&key, kv.create_revision).await?
                        {
                            cleared += 1;
                            continue;
                        }
                        // Nothing was written; a resend's first send may have, and the core's
                        // clean-up releases it.
                        if !req.mode.is_resend() {
                            store.many.take(token);
                        }
                        if matches!(theirs, LeaseKind::Permit { .. }) {
                            return Err(kind_conflict(req.names[i], LeaseKind::Exclusive, theirs));
                        }
                        return Ok(ManyAttempt::Busy {
                            name: i,
                            holder_ttl: None,
                        });
                    }
                }
            }
        }
        Err(LockError::new(
            ErrorKind::Lost,
            "the etcd session's lease expired before the locks were written, twice",
        ))
    }

    async fn renew_all_inner(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing several etcd locks";
        let store = self.store();
        let token = token.as_str();
        let Some(Hold {
            mut session,
            fences: Some(fences),
        }) = store.many.get(token)
        else {
            return Ok(LeaseCheck::Missing);
        };
        let keys = self.many_keys(names, token)?;
        if fences.len() != keys.len() {
            return Ok(LeaseCheck::Missing);
        }
        if session::ttl_secs(ttl) > session.asked_s {
            // A longer TTL than the session's (an extension): the keys move to the session of
            // that TTL, keeping their create revisions, as a single lock's key does.
            let target = store.sessions.get(ttl, &store.sessions.clock()).await?;
            if !self.move_keys(&keys, &fences, &target, DOING).await? {
                return Ok(LeaseCheck::Missing);
            }
            store.many.put(token, target.clone(), Some(fences.clone()));
            session = target;
        }
        let read = TxnRequest::new(
            vec![],
            keys.iter()
                .map(|k| RequestOp::range(RangeRequest::key(k.as_str())))
                .collect(),
            vec![],
        );
        let reading = store.members.retry(|c| {
            let read = read.clone();
            async move { c.txn(read).await }
        });
        let (alive, read) = tokio::join!(session.keep_alive(), reading);
        match alive {
            // The session ended: its keys with it.
            Err(e) if e.kind() == ErrorKind::Lost => return Ok(LeaseCheck::Missing),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let read = read.map_err(|e| txn_error(e, DOING, keys.len()))?;
        let checks = fences.iter().enumerate().map(|(i, fence)| {
            let kv = read
                .responses
                .get(i)
                .and_then(|r| r.range())
                .and_then(|r| r.kvs.first());
            match kv {
                None => LeaseCheck::Missing,
                Some(kv) if !holds_token(kv, token) => LeaseCheck::Foreign,
                Some(kv) if kv.create_revision != *fence || kv.lease != session.lease => {
                    LeaseCheck::Missing
                }
                Some(_) => LeaseCheck::Ours,
            }
        });
        Ok(combine_checks(checks))
    }

    async fn release_all_inner(
        &self,
        names: &[&str],
        token: &Token,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing several etcd locks";
        let store = self.store();
        let token = token.as_str();
        // Still known while the delete is in flight (a concurrent attempt of this client must
        // not take the keys for stale and delete them first, which would make this release
        // look lost); forgotten once it is answered or has failed, after which a key left
        // behind (a delete not answered, or a late write of a given-up attempt) is stale,
        // deleted by the renewals' sweep or by this client's next attempt that meets it.
        let keys = self.many_keys(names, token)?;
        let fences = store.many.get(token).and_then(|h| h.fences);
        if fences.is_none() {
            // A given-up attempt's clean-up: a write of it may still land.
            store.note_given_up();
        }
        let txn = TxnRequest::new(
            vec![],
            keys.iter()
                .map(|k| RequestOp {
                    request: Some(Request::DeleteRange(DeleteRangeRequest {
                        key: k.as_bytes().to_vec(),
                        prev_kv: true,
                        ..Default::default()
                    })),
                })
                .collect(),
            vec![],
        );
        let reply = store.txn(txn).await;
        store.many.take(token);
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                store.note_given_up();
                return Err(txn_error(e, DOING, keys.len()));
            }
        };
        let Some(fences) = fences.filter(|f| f.len() == keys.len()) else {
            return Ok(LeaseCheck::Missing);
        };
        let checks = fences.iter().enumerate().map(|(i, fence)| {
            let prev = match reply.responses.get(i).and_then(|r| r.response.as_ref()) {
                Some(Response::DeleteRange(d)) => d.prev_kvs.first(),
                _ => None,
            };
            match prev {
                Some(kv) if !holds_token(kv, token) => LeaseCheck::Foreign,
                Some(kv) if kv.create_revision == *fence => LeaseCheck::Ours,
                _ => LeaseCheck::Missing,
            }
        });
        Ok(combine_checks(checks))
    }
}

#[distlock_core::engine::async_trait]
impl MultiLock for EtcdBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        self.acquire_all_inner(req).await
    }

    /// One keep-alive of the keys' session and one read of the keys: each must still be there
    /// with our token and create revision, on that session.
    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.renew_all_inner(names, token, ttl).await
    }

    /// One transaction that deletes every key (their names carry our token: ours alone).
    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        self.release_all_inner(names, token).await
    }
}
