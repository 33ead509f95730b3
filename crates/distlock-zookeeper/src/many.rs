//! Several names at once (`MultiLock`): one `multi` creates every name's node, then one
//! multi-read reads every name's queue.
//!
//! A first multi-read of the queues answers busy, writing nothing, when a name has a node in
//! its queue already. The nodes are those of an exclusive lock, in the layout the client writes
//! (`_c_<token>-lock-<seq>`, ephemeral and sequential, in each name's queue), so each name is
//! the same lock as a single-name lease of it: a single-name waiter queues behind our node and
//! watches it, and our node waits for nobody. The attempt holds every name when its node is
//! first in every queue; its fence there is the node's creation zxid, as a single holder's
//! (one zxid for the whole `multi`, above every earlier holder's node of each name).
//! Otherwise one `multi` deletes every node of ours, and the attempt answers busy with the
//! first name where ours was not first. `multi`s are totally ordered, so two multi-name
//! attempts meet every name they share in the same order: the later one never keeps the
//! earlier one out.
//!
//! A lease of several names is the session's, as any lock here: a renewal checks that every
//! node is still there, of this session, with no loss of the session since it was taken. The
//! core gives such a lease no session watch, so a suspended or expired session shows at the
//! next renewal, as `Missing`.

use distlock_core::engine::{
    AcquireMany, ErrorKind, LeaseCheck, LeaseKind, LockError, ManyAttempt, MultiLock, Token,
    combine_checks,
};
use distlock_core::recipes::{HolderValue, kind_conflict};
use zookeeper_client::{
    Client, CreateMode, Error, MultiReadResult, MultiWriteError, MultiWriteResult,
};

use crate::backend::ZkBackend;
use crate::layout::{foreign, is_own, kind_of, push_node_prefix, refuse, seq_of};
use crate::session::{connection_lost, map_err};
use crate::store::{Hold, ahead_of, delete_retrying};

/// The most bytes one multi-name attempt writes in one request: ZooKeeper drops the connection
/// of a packet over its `jute.maxbuffer` (1 MB by default), and the answer has as much again.
const MAX_REQUEST: usize = 512 * 1024;

/// What the queues read after the create say.
enum Queues {
    /// Our node is first in every queue: each one's creation zxid.
    Held(Vec<i64>),
    /// Not first in the queue of the name at this place (the first such).
    Busy(usize),
}

/// A reply of an unexpected shape.
fn unexpected(doing: &str, what: impl std::fmt::Debug) -> LockError {
    LockError::new(
        ErrorKind::Protocol,
        format!("{doing}: unexpected answer {what:?}"),
    )
}

impl ZkBackend {
    fn parents(&self, names: &[&str]) -> Vec<String> {
        names.iter().map(|n| self.lock_path(n)).collect()
    }

    /// Our node of `token` under each parent, when there (one multi-read of the children).
    async fn find_all_own(
        &self,
        client: &Client,
        parents: &[String],
        token: &str,
    ) -> Result<Vec<Option<String>>, LockError> {
        const DOING: &str = "looking for ZooKeeper lock nodes";
        let mut reader = client.new_multi_reader();
        for p in parents {
            reader.add_get_children(p).map_err(|e| map_err(e, DOING))?;
        }
        let results = match self.store().call(DOING, reader.commit()).await? {
            Ok(r) if r.len() == parents.len() => r,
            Ok(r) => return Err(unexpected(DOING, r)),
            Err(e) => return Err(map_err(e, DOING)),
        };
        Ok(parents
            .iter()
            .zip(results)
            .map(|(p, r)| match r {
                MultiReadResult::Children { children } => children
                    .iter()
                    .find(|c| is_own(c, token))
                    .map(|c| format!("{p}/{c}")),
                _ => None,
            })
            .collect())
    }

    /// Deletes our nodes at `paths` in one `multi`; a node already gone is left out and the
    /// rest sent again. When ZooKeeper does not answer, a task a node tries again (the session's
    /// end frees them anyway). Whether every one was still there.
    async fn delete_all(&self, client: &Client, paths: &[String]) -> Result<bool, LockError> {
        const DOING: &str = "deleting ZooKeeper lock nodes";
        let config = &self.sessions().config;
        let mut left: Vec<&String> = paths.iter().collect();
        let mut all = true;
        while !left.is_empty() {
            let mut writer = client.new_multi_writer();
            for p in &left {
                writer.add_delete(p, None).map_err(|e| map_err(e, DOING))?;
            }
            match tokio::time::timeout(config.response_timeout, writer.commit()).await {
                Ok(Ok(_)) => return Ok(all),
                Ok(Err(MultiWriteError::OperationFailed {
                    index,
                    source: Error::NoNode,
                })) if index < left.len() => {
                    left.remove(index);
                    all = false;
                }
                failed => {
                    for p in left {
                        tokio::spawn(delete_retrying(
                            client.clone(),
                            p.clone(),
                            2 * config.session_timeout,
                        ));
                    }
                    return Err(match failed {
                        Ok(Err(e)) => map_err(e.into(), DOING),
                        _ => LockError::new(
                            ErrorKind::Timeout,
                            format!("{DOING}: no answer from ZooKeeper"),
                        ),
                    });
                }
            }
        }
        Ok(all)
    }

    /// One `multi` that creates every name's node (each lock's parent made when missing, and
    /// the `multi` sent again). An answer lost: the nodes it made, found by our token, or the
    /// error.
    async fn create_all(
        &self,
        client: &Client,
        parents: &[String],
        req: &AcquireMany<'_>,
    ) -> Result<Vec<String>, LockError> {
        const DOING: &str = "creating ZooKeeper lock nodes";
        let config = &self.sessions().config;
        let token = req.token.as_str();
        let data = HolderValue::now(token, req.owner).encode();
        let options = CreateMode::EphemeralSequential.with_acls(self.store().acls());
        let prefixes: Vec<String> = parents
            .iter()
            .map(|p| {
                let mut out = String::new();
                push_node_prefix(&mut out, p, token, LeaseKind::Exclusive, config.layout);
                out
            })
            .collect();
        let size: usize = prefixes.iter().map(|p| p.len() + data.len() + 64).sum();
        if size > MAX_REQUEST {
            return Err(LockError::new(
                ErrorKind::InvalidKey,
                format!(
                    "{} names are more than one ZooKeeper multi takes (about {size} bytes, over \
                     {MAX_REQUEST}): take fewer names at once",
                    parents.len()
                ),
            ));
        }
        // Each pass makes at most one missing parent.
        for _ in 0..=parents.len() {
            let mut writer = client.new_multi_writer();
            for p in &prefixes {
                writer
                    .add_create(p, data.as_bytes(), &options)
                    .map_err(|e| map_err(e, DOING))?;
            }
            match tokio::time::timeout(config.response_timeout, writer.commit()).await {
                Ok(Ok(results)) => {
                    return results
                        .into_iter()
                        .map(|r| match r {
                            MultiWriteResult::Create { path, .. } => Ok(path),
                            other => Err(unexpected(DOING, other)),
                        })
                        .collect();
                }
                Ok(Err(MultiWriteError::OperationFailed {
                    index,
                    source: Error::NoNode,
                })) if index < parents.len() => {
                    let made =
                        zookeeper_client::CreateMode::Persistent.with_acls(self.store().acls());
                    match self
                        .store()
                        .call(DOING, client.mkdir(&parents[index], &made))
                        .await?
                    {
                        Ok(()) | Err(Error::NodeExists) => {}
                        Err(e) => return Err(map_err(e, DOING)),
                    }
                }
                Ok(Err(e)) => {
                    let e = Error::from(e);
                    if connection_lost(&e) {
                        return self.adopt(client, parents, token, map_err(e, DOING)).await;
                    }
                    return Err(map_err(e, DOING));
                }
                Err(_) => {
                    let timeout = LockError::new(
                        ErrorKind::Timeout,
                        format!("{DOING}: no answer from ZooKeeper"),
                    );
                    return self.adopt(client, parents, token, timeout).await;
                }
            }
        }
        Err(LockError::new(
            ErrorKind::Protocol,
            format!("{DOING}: a lock's parent vanished right after it was created"),
        ))
    }

    /// After a `multi` whose answer was lost: the nodes it made, found by our token (it made
    /// all or none), or `cause`. ZooKeeper answers a session's requests in order, so the
    /// lookup sees what the `multi` did.
    async fn adopt(
        &self,
        client: &Client,
        parents: &[String],
        token: &str,
        cause: LockError,
    ) -> Result<Vec<String>, LockError> {
        let Ok(found) = self.find_all_own(client, parents, token).await else {
            return Err(cause);
        };
        if found.iter().all(Option::is_some) {
            return Ok(found.into_iter().flatten().collect());
        }
        // Some of them gone since: none is kept.
        let some: Vec<String> = found.into_iter().flatten().collect();
        if !some.is_empty() {
            let _ = self.delete_all(client, &some).await;
        }
        Err(cause)
    }

    /// Every name's queue before anything is written (one multi-read): the place of the first
    /// name that has a node in it, if any. An attempt that would only find a name busy so
    /// writes nothing, and a waiter's attempts while a name stays held put no node in the
    /// other names' queues, where a single-name attempt would find it ahead of its own.
    async fn first_queued(
        &self,
        client: &Client,
        names: &[&str],
        parents: &[String],
    ) -> Result<Option<usize>, LockError> {
        const DOING: &str = "reading ZooKeeper lock queues";
        let layout = self.sessions().config.layout;
        let mut reader = client.new_multi_reader();
        for parent in parents {
            reader
                .add_get_children(parent)
                .map_err(|e| map_err(e, DOING))?;
        }
        let results = match self.store().call(DOING, reader.commit()).await? {
            Ok(r) if r.len() == parents.len() => r,
            Ok(r) => return Err(unexpected(DOING, r)),
            Err(e) => return Err(map_err(e, DOING)),
        };
        for (i, (parent, result)) in parents.iter().zip(results).enumerate() {
            let children = match result {
                MultiReadResult::Children { children } => children,
                MultiReadResult::Error { err: Error::NoNode } => continue,
                MultiReadResult::Error { err } => return Err(map_err(err, DOING)),
                other => return Err(unexpected(DOING, other)),
            };
            if let Some(child) = foreign(&children, layout) {
                return Err(refuse(parent, child, layout));
            }
            let mut queued = children.iter().filter(|c| seq_of(c).is_some()).peekable();
            if let Some(permit) = queued
                .clone()
                .map(|c| kind_of(c))
                .find(|k| matches!(k, LeaseKind::Permit { .. }))
            {
                return Err(kind_conflict(names[i], LeaseKind::Exclusive, permit));
            }
            if queued.peek().is_some() {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Every name's queue and our node in it, in one multi-read.
    async fn read_queues(
        &self,
        client: &Client,
        names: &[&str],
        parents: &[String],
        paths: &[String],
    ) -> Result<Queues, LockError> {
        const DOING: &str = "reading ZooKeeper lock queues";
        let layout = self.sessions().config.layout;
        let mut reader = client.new_multi_reader();
        for (parent, path) in parents.iter().zip(paths) {
            reader
                .add_get_children(parent)
                .map_err(|e| map_err(e, DOING))?;
            reader.add_get_data(path).map_err(|e| map_err(e, DOING))?;
        }
        let results = match self.store().call(DOING, reader.commit()).await? {
            Ok(r) if r.len() == 2 * parents.len() => r,
            Ok(r) => return Err(unexpected(DOING, r)),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let gone = |name: &str| {
            LockError::new(
                ErrorKind::Lost,
                format!("our ZooKeeper lock node of {name:?} vanished as it was taken"),
            )
        };
        let mut results = results.into_iter();
        let mut czxids = Vec::with_capacity(parents.len());
        let mut busy = None;
        for (i, (parent, path)) in parents.iter().zip(paths).enumerate() {
            let (Some(children), Some(data)) = (results.next(), results.next()) else {
                return Err(unexpected(DOING, "too few answers"));
            };
            let children = match children {
                MultiReadResult::Children { children } => children,
                MultiReadResult::Error { err: Error::NoNode } => Vec::new(),
                MultiReadResult::Error { err } => return Err(map_err(err, DOING)),
                other => return Err(unexpected(DOING, other)),
            };
            // Every reading of a queue looks for the other layout, as a single lock's does.
            if let Some(child) = foreign(&children, layout) {
                return Err(refuse(parent, child, layout));
            }
            let czxid = match data {
                MultiReadResult::Data { stat, .. } => stat.czxid,
                MultiReadResult::Error { err: Error::NoNode } => return Err(gone(names[i])),
                MultiReadResult::Error { err } => return Err(map_err(err, DOING)),
                other => return Err(unexpected(DOING, other)),
            };
            let Some(seq) = path.rsplit_once('/').and_then(|(_, c)| seq_of(c)) else {
                return Err(unexpected(DOING, path));
            };
            let Some(ahead) = ahead_of(&children, seq) else {
                return Err(gone(names[i]));
            };
            if let Some(permit) = ahead
                .iter()
                .map(|(_, c)| kind_of(c))
                .find(|k| matches!(k, LeaseKind::Permit { .. }))
            {
                return Err(kind_conflict(names[i], LeaseKind::Exclusive, permit));
            }
            if !ahead.is_empty() && busy.is_none() {
                busy = Some(i);
            }
            czxids.push(czxid);
        }
        Ok(match busy {
            Some(i) => Queues::Busy(i),
            None => Queues::Held(czxids),
        })
    }

    async fn acquire_all_inner(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        let token = req.token.as_str();
        let fences = |nodes: &[(String, i64)]| {
            nodes
                .iter()
                .map(|(_, czxid)| u64::try_from(*czxid).ok())
                .collect()
        };
        if let Some(held) = self.store().many.get(token) {
            // A resend of an attempt that took them all.
            return Ok(ManyAttempt::Acquired {
                fences: fences(&held.nodes),
            });
        }
        let parents = self.parents(req.names);
        let client = self.sessions().current().client.clone();
        let since = self.sessions().losses();
        let mut found = None;
        if req.mode.is_resend() {
            // The nodes a send whose answer was lost made, if it did.
            let own = self.find_all_own(&client, &parents, token).await?;
            if own.iter().all(Option::is_some) {
                found = Some(own.into_iter().flatten().collect());
            } else {
                let some: Vec<String> = own.into_iter().flatten().collect();
                if !some.is_empty() {
                    self.delete_all(&client, &some).await?;
                }
            }
        }
        let paths = match found {
            Some(paths) => paths,
            None => {
                if let Some(name) = self.first_queued(&client, req.names, &parents).await? {
                    return Ok(ManyAttempt::Busy {
                        name,
                        holder_ttl: None,
                    });
                }
                self.create_all(&client, &parents, req).await?
            }
        };
        let read = self.read_queues(&client, req.names, &parents, &paths).await;
        match read {
            Ok(Queues::Held(czxids)) if self.sessions().losses() == since => {
                let nodes: Vec<(String, i64)> = paths.into_iter().zip(czxids).collect();
                let fences = fences(&nodes);
                self.store().many.put(token, Hold { since, nodes });
                Ok(ManyAttempt::Acquired { fences })
            }
            Ok(Queues::Held(_)) => {
                let _ = self.delete_all(&client, &paths).await;
                Err(LockError::new(
                    ErrorKind::Connection,
                    "the ZooKeeper connection was lost while the locks were taken",
                ))
            }
            Ok(Queues::Busy(name)) => {
                // Nothing kept: a waiter holds no name while it waits.
                let _ = self.delete_all(&client, &paths).await;
                Ok(ManyAttempt::Busy {
                    name,
                    holder_ttl: None,
                })
            }
            Err(e) => {
                let _ = self.delete_all(&client, &paths).await;
                Err(e)
            }
        }
    }

    async fn renew_all_inner(
        &self,
        names: &[&str],
        token: &Token,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "checking ZooKeeper locks";
        let Some(held) = self.store().many.get(token.as_str()) else {
            return Ok(LeaseCheck::Missing);
        };
        if held.since != self.sessions().losses() || held.nodes.len() != names.len() {
            return Ok(LeaseCheck::Missing);
        }
        let session = self.sessions().current();
        let mut reader = session.client.new_multi_reader();
        for (path, _) in &held.nodes {
            reader.add_get_data(path).map_err(|e| map_err(e, DOING))?;
        }
        let results = match self.store().call(DOING, reader.commit()).await? {
            Ok(r) if r.len() == held.nodes.len() => r,
            Ok(r) => return Err(unexpected(DOING, r)),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let mut checks = Vec::with_capacity(results.len());
        for ((_, czxid), result) in held.nodes.iter().zip(results) {
            checks.push(match result {
                MultiReadResult::Data { stat, .. }
                    if stat.ephemeral_owner == session.id && stat.czxid == *czxid =>
                {
                    LeaseCheck::Ours
                }
                MultiReadResult::Data { .. } => LeaseCheck::Foreign,
                MultiReadResult::Error { err: Error::NoNode } => LeaseCheck::Missing,
                MultiReadResult::Error { err } => return Err(map_err(err, DOING)),
                other => return Err(unexpected(DOING, other)),
            });
        }
        Ok(combine_checks(checks))
    }

    async fn release_all_inner(
        &self,
        names: &[&str],
        token: &Token,
    ) -> Result<LeaseCheck, LockError> {
        let client = self.sessions().current().client.clone();
        let Some(held) = self.store().many.take(token.as_str()) else {
            // An attempt given up while its `multi` was in flight: its nodes, if it made them,
            // are found by our token.
            let parents = self.parents(names);
            let own = self.find_all_own(&client, &parents, token.as_str()).await?;
            let some: Vec<String> = own.into_iter().flatten().collect();
            if !some.is_empty() {
                self.delete_all(&client, &some).await?;
            }
            return Ok(LeaseCheck::Missing);
        };
        let trusted = held.since == self.sessions().losses();
        let paths: Vec<String> = held.nodes.into_iter().map(|(path, _)| path).collect();
        let all = self.delete_all(&client, &paths).await?;
        Ok(if trusted && all {
            LeaseCheck::Ours
        } else {
            LeaseCheck::Missing
        })
    }
}

#[distlock_core::engine::async_trait]
impl MultiLock for ZkBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        self.acquire_all_inner(req).await
    }

    /// A check of every node (one multi-read): the session is the lease, and has no TTL.
    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        _ttl: std::time::Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.renew_all_inner(names, token).await
    }

    /// One `multi` that deletes every node.
    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        self.release_all_inner(names, token).await
    }
}
