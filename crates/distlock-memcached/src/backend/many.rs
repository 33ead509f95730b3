//! Several names at once (`MultiLock`). memcached changes one key at a time, so this is ordered,
//! not atomic: the names are added one by one in their sorted order (each as a single name's
//! acquire adds it: "add" mode, our holder value, its expiry), and on the first busy name every
//! item added so far is deleted by its CAS before the attempt answers busy. Between two adds
//! another client can see the first name held, and find it busy; but a waiter holds nothing
//! when it answers, and every client takes the names in the same order, so no set of clients
//! deadlocks on each other's names.
//!
//! No record is kept of a multi-name lease: a renewal and a release read the items (one
//! pipeline) and go by the CAS read, and only for the items that carry our token. A renewal
//! touches the items only when every one is ours (`ms … C<cas>`, one pipeline); one that
//! expires between the read and its touch is not stored (its CAS is gone), and the renewal says
//! so, the others renewed all the same: the lease is lost then, and its release deletes them. A
//! release deletes each one still ours (`md … C<cas>`). No fences, as for one name.

use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, LeaseCheck, LockError, ManyAttempt, MultiLock, Token, combine_checks,
};
use distlock_core::recipes::HolderValue;

use super::batch::PIPELINE;
use super::{MemcachedBackend, item_ttl, unexpected};
use crate::meta::{Arg, Reply, Request};

/// What the add of one name found.
enum Added {
    /// The item is ours: added now (with the CAS memcached gave it, when it gave one), or by an
    /// earlier send of this request (with the CAS read).
    Ours(Option<u64>),
    /// Another holder's, with its remaining expiry when it was read.
    Busy(Option<Duration>),
}

/// What an item was found to be by a read.
enum Found {
    /// Gone (expired, released, evicted).
    Missing,
    /// Another holder's.
    Foreign,
    /// Ours: the value we wrote, and the item's CAS now.
    Ours { value: String, cas: u64 },
}

impl Found {
    fn check(&self) -> LeaseCheck {
        match self {
            Found::Missing => LeaseCheck::Missing,
            Found::Foreign => LeaseCheck::Foreign,
            Found::Ours { .. } => LeaseCheck::Ours,
        }
    }
}

/// The first error of `results`, the others' values.
fn first_error<T>(results: Vec<Result<T, LockError>>) -> Result<Vec<T>, LockError> {
    results.into_iter().collect()
}

impl MemcachedBackend {
    /// Adds the item of one name, as a single name's acquire does; a busy one is read when this
    /// is a resend (an earlier send may have added it: then it is ours) or a waiter's attempt
    /// (the holder's expiry).
    async fn add_one(
        &self,
        item: &str,
        value: &str,
        req: &AcquireMany<'_>,
    ) -> Result<Added, LockError> {
        const DOING: &str = "taking several memcached locks";
        let token = req.token.as_str();
        let line = [
            Arg::Word("ms"),
            Arg::Word(item),
            Arg::Num(value.len() as u64),
            Arg::Flag('T', item_ttl(req.ttl)),
            Arg::Word("ME"),
            Arg::Word("c"),
        ];
        let r = self
            .inner
            .pool
            .call_tagged(&line, Some(value.as_bytes()), Some(token))
            .await?;
        match r.code {
            "HD" => Ok(Added::Ours(r.cas)),
            "NS" if req.mode.is_resend() || req.mode.waits() => {
                Ok(match self.read(item).await? {
                    Some((v, cas, _)) if HolderValue::parse(&v).token == token => {
                        Added::Ours(Some(cas))
                    }
                    Some((_, _, ttl)) => Added::Busy(
                        ttl.and_then(|t| u64::try_from(t).ok())
                            .map(Duration::from_secs),
                    ),
                    // Gone since the add: busy all the same, the next attempt finds it free.
                    None => Added::Busy(None),
                })
            }
            "NS" => Ok(Added::Busy(None)),
            _ => Err(unexpected(DOING, &r)),
        }
    }

    /// Reads every item in one pipeline (in chunks of [`PIPELINE`]): what each is to `token`.
    async fn find_all(&self, items: &[String], token: &str) -> Result<Vec<Found>, LockError> {
        const DOING: &str = "reading memcached locks";
        let mut found = Vec::with_capacity(items.len());
        for chunk in items.chunks(PIPELINE) {
            let requests: Vec<Request<'_>> = chunk
                .iter()
                .map(|item| Request {
                    args: vec![
                        Arg::Word("mg"),
                        Arg::Word(item),
                        Arg::Word("v"),
                        Arg::Word("c"),
                    ],
                    data: None,
                    tag: token,
                })
                .collect();
            for r in first_error(self.inner.pool.call_many(&requests).await)? {
                found.push(match (r.code, r.cas) {
                    ("EN", _) => Found::Missing,
                    ("VA", Some(cas)) => {
                        let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default())
                            .into_owned();
                        if HolderValue::parse(&value).token == token {
                            Found::Ours { value, cas }
                        } else {
                            Found::Foreign
                        }
                    }
                    _ => return Err(unexpected(DOING, &r)),
                });
            }
        }
        Ok(found)
    }

    /// Deletes each item by its CAS (`md … C<cas>`, one pipeline in chunks of [`PIPELINE`]):
    /// each one's reply, in order.
    async fn delete_by_cas(
        &self,
        items: &[(&str, u64)],
        token: &str,
    ) -> Vec<Result<Reply, LockError>> {
        let mut replies = Vec::with_capacity(items.len());
        for chunk in items.chunks(PIPELINE) {
            let requests: Vec<Request<'_>> = chunk
                .iter()
                .map(|&(item, cas)| Request {
                    args: vec![Arg::Word("md"), Arg::Word(item), Arg::Flag('C', cas)],
                    data: None,
                    tag: token,
                })
                .collect();
            replies.extend(self.inner.pool.call_many(&requests).await);
        }
        replies
    }

    /// Deletes every item that still carries `token`, by the CAS read now: what they were,
    /// combined. Every item read is tried; the first error, if any, comes back after.
    async fn delete_ours(&self, items: &[String], token: &str) -> Result<LeaseCheck, LockError> {
        let found = self.find_all(items, token).await?;
        let ours: Vec<(&str, u64)> = items
            .iter()
            .zip(&found)
            .filter_map(|(item, f)| match f {
                Found::Ours { cas, .. } => Some((item.as_str(), *cas)),
                _ => None,
            })
            .collect();
        let deleted = self.delete_by_cas(&ours, token).await;
        let mut checks: Vec<LeaseCheck> = found
            .iter()
            .filter(|f| !matches!(f, Found::Ours { .. }))
            .map(Found::check)
            .collect();
        for r in first_error(deleted)? {
            checks.push(super::released(&r)?);
        }
        Ok(combine_checks(checks))
    }

    /// Gives back the items this attempt added (`taken`, with the CAS each was given): deleted
    /// by that CAS, or by the CAS read now when none is known or the delete was refused for it
    /// (an earlier send of ours changed it), and only while they carry our token.
    async fn give_back(
        &self,
        taken: &[(String, Option<u64>)],
        token: &str,
    ) -> Result<(), LockError> {
        let known: Vec<(&str, u64)> = taken
            .iter()
            .filter_map(|(item, cas)| cas.map(|c| (item.as_str(), c)))
            .collect();
        let deleted = self.delete_by_cas(&known, token).await;
        let mut again: Vec<String> = taken
            .iter()
            .filter(|(_, cas)| cas.is_none())
            .map(|(item, _)| item.clone())
            .collect();
        let mut failed = None;
        for ((item, _), r) in known.iter().zip(deleted) {
            match r {
                Ok(r) if r.code == "EX" => again.push((*item).to_owned()),
                // Deleted, or gone by itself.
                Ok(r) if matches!(r.code, "HD" | "NF") => {}
                Ok(r) => failed = failed.or(Some(unexpected("giving back memcached locks", &r))),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if !again.is_empty() {
            self.delete_ours(&again, token).await?;
        }
        failed.map_or(Ok(()), Err)
    }
}

#[distlock_core::engine::async_trait]
impl MultiLock for MemcachedBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        let token = req.token.as_str();
        // A resend: an earlier send's adds, given up with their replies unread, are settled
        // first, so that the adds and reads below see their effect.
        if req.mode.is_resend() {
            self.settle(token).await?;
        }
        let value = HolderValue::now(token, req.owner).encode();
        let mut taken: Vec<(String, Option<u64>)> = Vec::with_capacity(req.names.len());
        for (i, name) in req.names.iter().enumerate() {
            let item = self.item(name);
            match self.add_one(&item, &value, req).await {
                Ok(Added::Ours(cas)) => taken.push((item, cas)),
                Ok(Added::Busy(holder_ttl)) => {
                    // Nothing is kept: a give-back that fails is an error, which the core
                    // answers by releasing the names again (a connection's or a timeout's).
                    self.give_back(&taken, token).await?;
                    return Ok(ManyAttempt::Busy {
                        name: i,
                        holder_ttl,
                    });
                }
                Err(e) => {
                    // The add's own error stands; when the give-back fails too and the add's
                    // error does not make the core release the names, the give-back's does.
                    return Err(match self.give_back(&taken, token).await {
                        Err(undo) if !e.is_ambiguous() => undo,
                        _ => e,
                    });
                }
            }
        }
        Ok(ManyAttempt::Acquired {
            fences: vec![None; req.names.len()],
        })
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        let token = token.as_str();
        self.settle(token).await?;
        let items: Vec<String> = names.iter().map(|n| self.item(n)).collect();
        let found = self.find_all(&items, token).await?;
        let check = combine_checks(found.iter().map(Found::check));
        if check != LeaseCheck::Ours {
            // Not every name is ours: none is touched.
            return Ok(check);
        }
        let expiry = item_ttl(ttl);
        let mut checks = Vec::with_capacity(items.len());
        let ours: Vec<(&str, &str, u64)> = items
            .iter()
            .zip(&found)
            .filter_map(|(item, f)| match f {
                Found::Ours { value, cas } => Some((item.as_str(), value.as_str(), *cas)),
                _ => None,
            })
            .collect();
        for chunk in ours.chunks(PIPELINE) {
            // The compare-and-touch of each item, as a single renewal's: our value written
            // again with the new expiry, only while the item has the CAS just read.
            let requests: Vec<Request<'_>> = chunk
                .iter()
                .map(|&(item, value, cas)| Request {
                    args: vec![
                        Arg::Word("ms"),
                        Arg::Word(item),
                        Arg::Num(value.len() as u64),
                        Arg::Flag('T', expiry),
                        Arg::Flag('C', cas),
                    ],
                    data: Some(value.as_bytes()),
                    tag: token,
                })
                .collect();
            for r in first_error(self.inner.pool.call_many(&requests).await)? {
                checks.push(match r.code {
                    "HD" => LeaseCheck::Ours,
                    // Gone, or not stored: gone between the compare and the store.
                    "NF" | "NS" => LeaseCheck::Missing,
                    // Changed since it was read: somebody else's now.
                    "EX" => LeaseCheck::Foreign,
                    _ => return Err(unexpected("renewing memcached locks", &r)),
                });
            }
        }
        Ok(combine_checks(checks))
    }

    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        let token = token.as_str();
        // Adds of ours given up with their replies unread are carried out first: the reads
        // below must see them (a cancelled attempt's undo).
        self.settle(token).await?;
        let items: Vec<String> = names.iter().map(|n| self.item(n)).collect();
        self.delete_ours(&items, token).await
    }
}
