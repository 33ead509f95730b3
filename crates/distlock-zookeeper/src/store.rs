//! The queue on ZooKeeper: what the core's queue recipe asks of a store, in ZooKeeper's terms.
//!
//! Each acquisition is an ephemeral sequential node `<prefix>/<name>/_c_<token>-lock-<seq>` of
//! the client's session; a shared lease's is `_c_<token>-r-lock-<seq>`, and one of N permits'
//! `_c_<token>-p<N>-lock-<seq>` (the kind is in the name, so one listing of the children
//! tells each entry's kind). The token in the name is Curator's "protection mode": a create whose
//! reply was lost (connection loss) is found again by its token, so no orphan node is left to
//! block the lock for the rest of the session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{AcquireRequest, BoxFuture, ErrorKind, LeaseKind, LockError};
use distlock_core::recipes::queue::{Ahead, JoinOutcome, Joined, QueueStore, QueuedEntry};
use distlock_core::recipes::{HolderValue, MutexExt, untag_value};
use zookeeper_client::{Acls, Client, CreateMode, Error};

use crate::layout::Layout;
use crate::session::{ZkSessions, connection_lost, map_err};

/// A lock node: where it is, and the session loss count when it was created (a loss since
/// means it can no longer be trusted). Its creation zxid is its entry's fence (kept once, by
/// the recipe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) at: NodeAt,
    pub(crate) since: u64,
}

/// Where a lock node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeAt {
    /// One of ours: `<prefix>/<name>/_c_<token>-[<tag>-]lock-<seq>`, made again from the lock's
    /// name and token when a request needs it ([`ZkStore::path_of`]). Its path (about 75
    /// characters, 80 bytes with the allocator's) was kept for each lock a client holds. The
    /// kind is the one the node was created with, which its name keeps (a writer downgraded to
    /// a reader is still named a writer).
    Ours { seq: i64, kind: LeaseKind },
    /// A node known by its path: another's, ahead of ours in a queue (its name need not be of
    /// our making), or one of ours whose path its parts would not make again.
    Other(Box<str>),
}

impl Node {
    /// The path of a node kept by its path (the nodes ahead of ours in a queue are).
    pub(crate) fn other_path(&self) -> Option<&str> {
        match &self.at {
            NodeAt::Other(path) => Some(path),
            NodeAt::Ours { .. } => None,
        }
    }
}

/// A node found or made: its path, sequence number, creation zxid and kind.
pub(crate) type Found = (String, i64, i64, LeaseKind);

/// ZooKeeper as a store of lock queues.
pub(crate) struct ZkStore {
    pub(crate) sessions: Arc<ZkSessions>,
    /// This client's multi-name holds, by token.
    pub(crate) many: ManyHolds,
}

use crate::layout::{foreign, is_own, push_node_prefix, refuse};
pub(crate) use crate::layout::{kind_of, seq_of};

/// The name of a lock node before ZooKeeper appends its sequence number.
fn node_prefix(parent: &str, token: &str, kind: LeaseKind, layout: Layout) -> String {
    let mut out = String::new();
    push_node_prefix(&mut out, parent, token, kind, layout);
    out
}

impl ZkStore {
    /// The ACL of the nodes we create: the creator's only when the sessions authenticate (a
    /// digest user), else open to all.
    pub(crate) fn acls(&self) -> Acls<'static> {
        if self.sessions.config.digest.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// The parent node under which the lock `name` queues its holders.
    pub(crate) fn lock_path(&self, name: &str) -> String {
        format!("{}/{name}", self.sessions.config.prefix)
    }

    /// The path of `node`, a node of the lock `name` (ours: taken with `token`).
    pub(crate) fn path_of(&self, name: &str, token: &str, node: &Node) -> String {
        let mut path = String::new();
        self.write_path(&mut path, name, token, node);
        path
    }

    /// Writes the path of `node` (see [`path_of`](Self::path_of)) into `out`, which it clears
    /// first: a renewal reuses one buffer for its thousand nodes.
    pub(crate) fn write_path(&self, out: &mut String, name: &str, token: &str, node: &Node) {
        let config = &self.sessions.config;
        write_path(out, &config.prefix, config.layout, name, token, node);
    }

    pub(crate) async fn call<T>(
        &self,
        doing: &str,
        fut: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<Result<T, Error>, LockError> {
        match tokio::time::timeout(self.sessions.config.response_timeout, fut).await {
            Ok(r) => Ok(r),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("{doing}: no answer from ZooKeeper"),
            )),
        }
    }

    /// Our node for `token` if a create whose reply was lost made one (protection mode).
    pub(crate) async fn find_own(
        &self,
        client: &Client,
        parent: &str,
        token: &str,
    ) -> Result<Option<Found>, LockError> {
        const DOING: &str = "looking for a ZooKeeper lock node";
        let children = match self.call(DOING, client.list_children(parent)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let Some(child) = children.into_iter().find(|c| is_own(c, token)) else {
            return Ok(None);
        };
        let kind = kind_of(&child);
        let path = format!("{parent}/{child}");
        match self.call(DOING, client.check_stat(&path)).await? {
            Ok(Some(stat)) => Ok(seq_of(&child).map(|seq| (path, seq, stat.czxid, kind))),
            Ok(None) => Ok(None),
            Err(e) => Err(map_err(e, DOING)),
        }
    }

    /// Creates our node (and the lock's parent when missing), or finds the one a lost reply
    /// created.
    async fn create(
        &self,
        client: &Client,
        parent: &str,
        req: &AcquireRequest<'_>,
    ) -> Result<Found, LockError> {
        const DOING: &str = "creating a ZooKeeper lock node";
        let (token, owner) = (req.token.as_str(), req.owner);
        let prefix = node_prefix(parent, token, req.kind, self.sessions.config.layout);
        let data = HolderValue::now(token, owner).encode();
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        for _ in 0..2 {
            match self
                .call(DOING, client.create(&prefix, data.as_bytes(), &options))
                .await
            {
                Ok(Ok((stat, seq))) => {
                    return Ok((
                        format!("{prefix}{seq}"),
                        seq.into_i64(),
                        stat.czxid,
                        req.kind,
                    ));
                }
                Ok(Err(Error::NoNode)) => {
                    let parents = CreateMode::Persistent.with_acls(self.acls());
                    match self.call(DOING, client.mkdir(parent, &parents)).await? {
                        Ok(()) | Err(Error::NodeExists) => {}
                        Err(e) => return Err(map_err(e, DOING)),
                    }
                }
                Ok(Err(e)) if connection_lost(&e) => {
                    // The create may have happened: look for it by our token.
                    if let Some(found) = self.find_own(client, parent, token).await? {
                        return Ok(found);
                    }
                    return Err(map_err(e, DOING));
                }
                Ok(Err(e)) => return Err(map_err(e, DOING)),
                Err(timeout) => {
                    if let Ok(Some(found)) = self.find_own(client, parent, token).await {
                        return Ok(found);
                    }
                    return Err(timeout);
                }
            }
        }
        Err(LockError::new(
            ErrorKind::Protocol,
            format!("{DOING}: {parent} vanished right after it was created"),
        ))
    }

    /// The first attempt's single round trip: the create and, right behind it on the same
    /// session (ZooKeeper answers a session's requests in order), the listing of the lock's
    /// children, which so includes our new node. `(None, None)` when the lock's parent does not
    /// exist yet (nothing was created: the caller takes the slow path).
    async fn create_and_list(
        &self,
        client: &Client,
        parent: &str,
        req: &AcquireRequest<'_>,
    ) -> Result<(Option<Found>, Option<Vec<String>>), LockError> {
        const DOING: &str = "creating a ZooKeeper lock node";
        let (token, owner) = (req.token.as_str(), req.owner);
        let prefix = node_prefix(parent, token, req.kind, self.sessions.config.layout);
        let data = HolderValue::now(token, owner).encode();
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let create = client.create(&prefix, data.as_bytes(), &options);
        let list = client.list_children(parent);
        let both = tokio::time::timeout(self.sessions.config.response_timeout, async {
            tokio::join!(create, list)
        })
        .await;
        match both {
            Ok((Ok((stat, seq)), listed)) => Ok((
                Some((
                    format!("{prefix}{seq}"),
                    seq.into_i64(),
                    stat.czxid,
                    req.kind,
                )),
                listed.ok(),
            )),
            Ok((Err(Error::NoNode), _)) => Ok((None, None)),
            Ok((Err(e), _)) if connection_lost(&e) => {
                // The create may have happened: look for it by our token.
                match self.find_own(client, parent, token).await? {
                    Some(found) => Ok((Some(found), None)),
                    None => Err(map_err(e, DOING)),
                }
            }
            Ok((Err(e), _)) => Err(map_err(e, DOING)),
            Err(_) => match self.find_own(client, parent, token).await {
                Ok(Some(found)) => Ok((Some(found), None)),
                _ => Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("{DOING}: no answer from ZooKeeper"),
                )),
            },
        }
    }

    /// Our entry for a node just found or made (`name`'s, with `token`). Its path is kept
    /// only when the one made again from its parts would differ (ZooKeeper writes sequence
    /// numbers as ten digits, which the parts repeat).
    fn entry(&self, name: &str, token: &str, found: Found, since: u64) -> QueuedEntry<Node> {
        let (path, seq, _, kind) = found;
        let mut node = Node {
            at: NodeAt::Ours { seq, kind },
            since,
        };
        if self.path_of(name, token, &node) != path {
            node.at = NodeAt::Other(path.into_boxed_str());
        }
        QueuedEntry {
            id: node,
            seq,
            kind,
            seen_at: 0,
        }
    }

    async fn join_inner(&self, req: &AcquireRequest<'_>) -> Result<JoinOutcome<Node>, LockError> {
        let token = req.token.as_str();
        let parent = self.lock_path(req.name);
        let client = self.sessions.current().client.clone();
        let since = self.sessions.losses();
        let (found, listed) = if req.mode.is_resend() {
            (self.find_own(&client, &parent, token).await?, None)
        } else {
            self.create_and_list(&client, &parent, req).await?
        };
        let found = match found {
            Some(f) => f,
            None => self.create(&client, &parent, req).await?,
        };
        // A node of the layout we do not write: its holder cannot see ours. Ours goes again.
        if let Some(child) = listed
            .as_deref()
            .and_then(|c| foreign(c, self.sessions.config.layout))
        {
            let refused = refuse(&parent, child, self.sessions.config.layout);
            self.delete_or_later(&client, found.0).await;
            return Err(refused);
        }
        let fence = u64::try_from(found.2).ok();
        let entry = self.entry(req.name, token, found, since);
        // The listing sent right behind the create includes our node, unless the create was
        // answered otherwise (found again after a lost reply): then it is read again.
        let mut ahead = listed
            .and_then(|children| ahead_of(&children, entry.seq))
            .map(|names| queued(&parent, names));
        if let Some(ahead) = ahead.as_mut().filter(|_| req.kind == LeaseKind::Shared) {
            self.read_downgrades(&client, ahead).await?;
        }
        Ok(JoinOutcome::Joined(Joined {
            fence,
            entry,
            ahead,
            age: None,
        }))
    }

    /// Deletes a node of ours at `path`; when ZooKeeper does not answer, a task tries again,
    /// backing off, for as long as the session may keep the node (its timeout, twice).
    async fn delete_or_later(&self, client: &Client, path: String) {
        const DOING: &str = "deleting a ZooKeeper lock node";
        if let Ok(Ok(()) | Err(Error::NoNode)) = self.call(DOING, client.delete(&path, None)).await
        {
            return;
        }
        tokio::spawn(delete_retrying(
            client.clone(),
            path,
            2 * self.sessions.config.session_timeout,
        ));
    }

    async fn ahead_inner(
        &self,
        name: &str,
        mine: &QueuedEntry<Node>,
        kind: LeaseKind,
    ) -> Result<Ahead<Node>, LockError> {
        const DOING: &str = "reading a ZooKeeper lock's queue";
        let client = self.sessions.current().client.clone();
        let parent = self.lock_path(name);
        let children = match self.call(DOING, client.list_children(&parent)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => Vec::new(),
            Err(e) => return Err(map_err(e, DOING)),
        };
        // Every reading of the queue looks for the other layout (the recipe then discards our
        // entry, its node with it).
        if let Some(child) = foreign(&children, self.sessions.config.layout) {
            return Err(refuse(&parent, child, self.sessions.config.layout));
        }
        let Some(mut ahead) = ahead_of(&children, mine.seq).map(|names| queued(&parent, names))
        else {
            return Ok(None);
        };
        if kind == LeaseKind::Shared {
            self.read_downgrades(&client, &mut ahead).await?;
        }
        Ok(Some(ahead))
    }

    /// A writer's node whose data carries the readers' tag is a writer downgraded to a reader
    /// (its name keeps the kind it was created with). For a reader, which waits only for the
    /// nearest writer ahead, the writers' nodes are read from the nearest back until one is a
    /// writer still; a node gone in between is left out (it left the queue).
    async fn read_downgrades(
        &self,
        client: &Client,
        ahead: &mut Vec<QueuedEntry<Node>>,
    ) -> Result<(), LockError> {
        const DOING: &str = "reading a ZooKeeper lock node's kind";
        let mut i = ahead.len();
        while i > 0 {
            i -= 1;
            if ahead[i].kind != LeaseKind::Exclusive {
                continue;
            }
            let Some(path) = ahead[i].id.other_path() else {
                continue;
            };
            match self.call(DOING, client.get_data(path)).await? {
                Ok((data, _))
                    if untag_value(&String::from_utf8_lossy(&data)).0 == LeaseKind::Shared =>
                {
                    ahead[i].kind = LeaseKind::Shared;
                }
                Ok(_) => return Ok(()),
                Err(Error::NoNode) => {
                    ahead.remove(i);
                }
                Err(e) => return Err(map_err(e, DOING)),
            }
        }
        Ok(())
    }
}

/// One multi-name hold: when it was taken (the session's loss count), and each name's node
/// (its path and creation zxid), in the names' order.
#[derive(Clone)]
pub(crate) struct Hold {
    pub(crate) since: u64,
    pub(crate) nodes: Vec<(String, i64)>,
}

/// This client's multi-name holds, by token.
#[derive(Default)]
pub(crate) struct ManyHolds {
    by_token: Mutex<HashMap<String, Hold>>,
}

impl ManyHolds {
    pub(crate) fn get(&self, token: &str) -> Option<Hold> {
        self.by_token.locked().get(token).cloned()
    }

    pub(crate) fn put(&self, token: &str, hold: Hold) {
        self.by_token.locked().insert(token.to_owned(), hold);
    }

    pub(crate) fn take(&self, token: &str) -> Option<Hold> {
        self.by_token.locked().remove(token)
    }
}

/// Deletes `path`, trying again with back-off for `during` (a node left behind would hold the
/// lock's queue for the rest of its session).
pub(crate) async fn delete_retrying(client: Client, path: String, during: Duration) {
    let until = tokio::time::Instant::now() + during;
    let mut pause = Duration::from_millis(50);
    loop {
        match client.delete(&path, None).await {
            Ok(()) | Err(Error::NoNode | Error::SessionExpired) => return,
            Err(_) if tokio::time::Instant::now() + pause < until => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(_) => return,
        }
    }
}

/// The path of `node` under `prefix` (see [`ZkStore::path_of`]), written into `out`.
fn write_path(
    out: &mut String,
    prefix: &str,
    layout: Layout,
    name: &str,
    token: &str,
    node: &Node,
) {
    use std::fmt::Write;
    out.clear();
    match &node.at {
        NodeAt::Other(path) => out.push_str(path),
        NodeAt::Ours { seq, kind } => {
            // As `node_prefix` names it, then the sequence number as ZooKeeper writes it: ten
            // digits, the sign among them; nineteen past 2^31 − 1 (a 64-bit sequence,
            // ZOOKEEPER-4706). Formatting into a `String` cannot fail.
            push_node_prefix(out, format_args!("{prefix}/{name}"), token, *kind, layout);
            let _ = if *seq <= i64::from(i32::MAX) {
                write!(out, "{seq:010}")
            } else {
                write!(out, "{seq:019}")
            };
        }
    }
}

/// Children of `parent` as queue entries (only their paths and places are known).
fn queued(parent: &str, names: Vec<(i64, String)>) -> Vec<QueuedEntry<Node>> {
    names
        .into_iter()
        .map(|(seq, child)| QueuedEntry {
            kind: kind_of(&child),
            id: Node {
                at: NodeAt::Other(format!("{parent}/{child}").into_boxed_str()),
                since: 0,
            },
            seq,
            seen_at: 0,
        })
        .collect()
}

/// The children ahead of sequence `mine`, oldest first; `None` if `mine` is not among them.
pub(crate) fn ahead_of(children: &[String], mine: i64) -> Option<Vec<(i64, String)>> {
    let mut queue: Vec<(i64, String)> = children
        .iter()
        .filter_map(|c| seq_of(c).map(|s| (s, c.clone())))
        .collect();
    queue.sort();
    let place = queue.iter().position(|(s, _)| *s == mine)?;
    queue.truncate(place);
    Some(queue)
}

#[distlock_core::engine::async_trait]
impl QueueStore for ZkStore {
    type Id = Node;

    async fn join(&self, req: &AcquireRequest<'_>) -> Result<JoinOutcome<Node>, LockError> {
        self.join_inner(req).await
    }

    async fn ahead(
        &self,
        name: &str,
        mine: &QueuedEntry<Node>,
        kind: LeaseKind,
    ) -> Result<Ahead<Node>, LockError> {
        self.ahead_inner(name, mine, kind).await
    }

    /// An existence watch on the node: it fires when the node goes, or when its data changes
    /// (a writer downgraded to a reader).
    fn watch_gone(&self, entry: &QueuedEntry<Node>) -> BoxFuture<'static, ()> {
        let client = self.sessions.current().client.clone();
        // The entries watched are ahead of ours in a queue, kept by their paths (were one not,
        // the waiter would look again at once).
        let path = entry.id.other_path().map(str::to_owned);
        Box::pin(async move {
            let Some(path) = path else { return };
            if let Ok((Some(_), watcher)) = client.check_and_watch_stat(&path).await {
                watcher.changed().await;
            }
        })
    }

    fn remove_later(&self, name: &str, token: &str, id: &Node) {
        let client = self.sessions.current().client.clone();
        let path = self.path_of(name, token, id);
        tokio::spawn(delete_retrying(
            client,
            path,
            2 * self.sessions.config.session_timeout,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_ahead_is_read_from_sequence_numbers() {
        let children: Vec<String> = ["_c_b-lock-0000000003", "_c_a-lock-0000000001", "x"]
            .map(String::from)
            .into();
        assert_eq!(
            ahead_of(&children, 3),
            Some(vec![(1, "_c_a-lock-0000000001".to_owned())])
        );
        assert_eq!(ahead_of(&children, 1), Some(vec![]));
        assert_eq!(ahead_of(&children, 2), None);
    }

    /// Our node's path, made again from its parts, is the one its create made: the prefix
    /// `node_prefix` gave it and the sequence number as ZooKeeper appends it.
    #[test]
    fn our_node_path_is_made_again_exactly() {
        let t = "0123456789abcdef0123456789abcdef";
        let mut out = String::from("left over");
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 7 },
        ] {
            // ZooKeeper's `%010d` of the parent's counter: past 2^31 it is negative.
            for (seq, text) in [
                (12, "0000000012"),
                (2_147_483_647, "2147483647"),
                (2_147_483_648, "0000000002147483648"),
                (-5, "-000000005"),
            ] {
                let node = Node {
                    at: NodeAt::Ours { seq, kind },
                    since: 0,
                };
                write_path(&mut out, "/distlock", Layout::Curator, "orders", t, &node);
                let made = format!(
                    "{}{text}",
                    node_prefix("/distlock/orders", t, kind, Layout::Curator)
                );
                assert_eq!(out, made);
                let child = made.rsplit_once('/').map(|(_, c)| c).unwrap_or_default();
                assert_eq!((seq_of(child), kind_of(child)), (Some(seq), kind));
            }
        }
        let other = Node {
            at: NodeAt::Other("/distlock/orders/_c_x-lock-0000000001".into()),
            since: 0,
        };
        write_path(&mut out, "/distlock", Layout::Curator, "orders", t, &other);
        assert_eq!(out, "/distlock/orders/_c_x-lock-0000000001");
        assert_eq!(other.other_path(), Some(out.as_str()));
        // 32 bytes a node, and no path of its own for one of ours.
        assert_eq!(std::mem::size_of::<Node>(), 32);
    }

    #[test]
    fn a_node_name_tells_its_kind() {
        let t = "0123456789abcdef0123456789abcdef";
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 7 },
        ] {
            let name = format!(
                "{}0000000012",
                node_prefix("/p/n", t, kind, Layout::Curator)
            );
            let child = name.rsplit_once('/').map(|(_, c)| c).unwrap_or_default();
            assert_eq!(kind_of(child), kind, "{child}");
            assert_eq!(seq_of(child), Some(12));
        }
        // Curator's nodes (a UUID in the name) exclude.
        assert_eq!(
            kind_of("_c_9f1e0c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6-lock-0000000001"),
            LeaseKind::Exclusive
        );
    }
}
