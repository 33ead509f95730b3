//! The ZooKeeper engine: the core's queue recipe over ZooKeeper, on the client's session.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, Breaker, Capabilities, Downgrade,
    ErrorKind, Fencing, HolderStatus, LeaseCheck, LeaseKind, LeaseRef, Listener, LockError,
    LockStatus, Relabel, RenewItem, SessionWatch, Sessions, Subscription, WakeSource,
};
use distlock_core::recipes::queue::QueueRecipe;
use distlock_core::recipes::{HolderValue, tag_value, untag_value};
use zookeeper_client::{Error, MultiReadResult};

use crate::config::ZkConfig;
use crate::session::{ZkSessions, map_err};
use crate::store::{self, ZkStore, seq_of};

/// A lock engine on ZooKeeper: the lock recipe of its documentation and Apache Curator.
///
/// - **acquire** creates an ephemeral sequential node `<prefix>/<name>/_c_<token>-lock-<seq>`
///   and lists the lock's children: the lock is ours when our node has the lowest sequence
///   number. The token in the name is Curator's "protection mode": a create whose reply was
///   lost (connection loss) is found again by its token, so no orphan node is left to block
///   the lock for the rest of the session. A first attempt that finds the lock busy deletes
///   its node;
/// - **waiting** keeps the node: waiters queue by sequence number (FIFO) and each one watches
///   only the node just before its own (no herd). A waiting attempt checks our node is still
///   there before anything else;
/// - **fencing token** = the node's creation zxid (`czxid`): zxids order every change the
///   ensemble commits, across leader elections (the epoch is their high half), and holders
///   create their nodes in queue order, so each holder's is larger than every earlier one's.
///   (The sequence number is not used: it restarts when the lock's parent node is deleted and
///   created again.);
/// - **the session is the lease**: nodes live while the session does. A session that is
///   suspended (the client lost its server) or expired ends every lock taken before, at once
///   (`is_held()` turns false, `lost()` fires): Curator's standard policy, since the server
///   may expire the session meanwhile. Renewal is a check that the node is still ours;
/// - **release** deletes the node;
/// - **several names at once** (`lock_many`): one `multi` creates an exclusive node in every
///   name's queue, and the names are ours when each node is first in its queue (see `many.rs`);
///   otherwise one `multi` deletes them all.
#[derive(Clone)]
pub struct ZkBackend {
    recipe: Arc<QueueRecipe<ZkStore>>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.sessions().config)
            .finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Connects to the servers a URL names (see [`ZkConfig`]).
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when no server answers.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(ZkConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: ZkConfig) -> Result<Self, LockError> {
        let sessions = ZkSessions::open(config).await?;
        Ok(ZkBackend {
            recipe: Arc::new(QueueRecipe::new(Arc::new(ZkStore {
                sessions,
                many: crate::store::ManyHolds::default(),
            }))),
        })
    }

    pub(crate) fn store(&self) -> &ZkStore {
        self.recipe.store()
    }

    pub(crate) fn sessions(&self) -> &ZkSessions {
        &self.store().sessions
    }

    /// The current session's id (for operators and tests: ZooKeeper's `cons` lists it).
    pub fn session_id(&self) -> i64 {
        self.sessions().current().id
    }

    /// The parent node under which the lock `name` queues its holders.
    pub fn lock_path(&self, name: &str) -> String {
        self.store().lock_path(name)
    }
}

#[distlock_core::engine::async_trait]
impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, false)
            .with_shared()
            .with_permits()
            .with_order()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.recipe.acquire(req).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a ZooKeeper lock";
        let client = self.sessions().current().client.clone();
        let Some(entry) = self.recipe.forget(lease.name, lease.token.as_str()) else {
            // An acquire cancelled while its create was in flight: the node may exist without
            // our knowing its name. Its token finds it (the create was sent first, and ZooKeeper
            // answers one session's requests in order).
            if let Some((path, _, _, _)) = self
                .store()
                .find_own(&client, &self.lock_path(lease.name), lease.token.as_str())
                .await?
            {
                match self.store().call(DOING, client.delete(&path, None)).await? {
                    Ok(()) | Err(Error::NoNode) => {}
                    Err(e) => return Err(map_err(e, DOING)),
                }
            }
            return Ok(LeaseCheck::Missing);
        };
        let node = &entry.entry.id;
        let trusted = entry.held && self.sessions().losses() == node.since;
        let path = self.store().path_of(lease.name, lease.token.as_str(), node);
        let deleted = self.store().call(DOING, client.delete(&path, None)).await?;
        match deleted {
            Ok(()) if trusted => Ok(LeaseCheck::Ours),
            Ok(()) | Err(Error::NoNode) => Ok(LeaseCheck::Missing),
            Err(e) => Err(map_err(e, DOING)),
        }
    }

    /// Every holder (the leading nodes that hold: one writer, the readers up to the first
    /// writer, or N permits) with its label, token and `czxid`; the other nodes are waiters.
    /// A node's kind is its name's, or the readers' tag in its data (a downgraded writer).
    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a ZooKeeper lock's status";
        let parent = self.lock_path(key);
        let client = self.sessions().current().client.clone();
        let queue = self.queue_of(&client, &parent, DOING).await?;
        let mut holders: Vec<HolderStatus> = Vec::new();
        let mut gone = 0;
        for (_, child) in &queue {
            let (data, stat) = match self
                .store()
                .call(DOING, client.get_data(&format!("{parent}/{child}")))
                .await?
            {
                Ok(d) => d,
                // Released in between.
                Err(Error::NoNode) => {
                    gone += 1;
                    continue;
                }
                Err(e) => return Err(map_err(e, DOING)),
            };
            let value = String::from_utf8_lossy(&data).into_owned();
            let (tagged, holder) = untag_value(&value);
            let kind = if tagged == LeaseKind::Shared {
                tagged
            } else {
                store::kind_of(child)
            };
            let holder = HolderValue::parse(holder);
            let next = HolderStatus::new(kind)
                .owner(Some(holder.label()))
                .token(Some(holder.token.to_owned()).filter(|t| !t.is_empty()))
                .fence(u64::try_from(stat.czxid).ok());
            let kinds = holders.iter().map(|h| h.kind).chain([kind]);
            if distlock_core::recipes::queue::holding(kinds) <= holders.len() {
                break;
            }
            holders.push(next);
        }
        let last = holders.iter().filter_map(|h| h.fence).max();
        let waiters = (queue.len() - gone).saturating_sub(holders.len());
        Ok(LockStatus::held_by(holders)
            .with_last_fence(last)
            .with_waiters(Some(waiters as u64)))
    }

    distlock_core::capability_getters!(
        batch_renew: BatchRenew,
        wake_source: WakeSource,
        sessions: Sessions,
        breaker: Breaker,
        lister: Lister,
        downgrade: Downgrade,
        relabel: Relabel,
        multi_lock: MultiLock,
    );
}

#[distlock_core::engine::async_trait]
impl Downgrade for ZkBackend {
    /// Our node keeps its name and place (a node cannot be renamed, and a new one would queue
    /// behind the writers that came after us): its data takes the readers' tag, which the
    /// readers waiting on it see (their watches fire on a change of data) and read.
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        _ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.downgrade_inner(lease).await
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for ZkBackend {
    /// Our node keeps its name, its place, its session and its kind; its data names the new
    /// label. Observers read it at their next look (a change of data fires only the watches
    /// set on the node itself).
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "writing a new label for a ZooKeeper lock's holder";
        self.rewrite(lease, DOING, |kind, holder| {
            let value = HolderValue::parse(holder);
            Some(tag_value(kind, value.relabelled(owner).encode()))
        })
        .await
    }
}

impl ZkBackend {
    async fn downgrade_inner(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "downgrading a ZooKeeper write lock to a read lock";
        let check = self
            .rewrite(lease, DOING, |kind, holder| {
                (kind != LeaseKind::Shared).then(|| tag_value(LeaseKind::Shared, holder.to_owned()))
            })
            .await?;
        if check == LeaseCheck::Ours {
            self.recipe.update(lease.name, lease.token.as_str(), |e| {
                e.entry.kind = LeaseKind::Shared;
            });
        }
        Ok(check)
    }

    /// Reads our node's data and writes back what `edit` makes of it (its kind and holder;
    /// `None`: nothing to write, done already), if nothing changed the node in between: the
    /// node keeps its name and place (a node cannot be renamed, and a new one would queue
    /// behind the clients that came after us).
    async fn rewrite(
        &self,
        lease: &LeaseRef<'_>,
        doing: &str,
        edit: impl Fn(LeaseKind, &str) -> Option<String>,
    ) -> Result<LeaseCheck, LockError> {
        let token = lease.token.as_str();
        let session = self.sessions().current();
        let (node, fence) = match self.recipe.held(lease.name, token) {
            Some(e) if e.entry.id.since == self.sessions().losses() => (e.entry.id, e.fence),
            _ => return Ok(LeaseCheck::Missing),
        };
        let path = self.store().path_of(lease.name, token, &node);
        for _ in 0..3 {
            let (data, stat) = match self
                .store()
                .call(doing, session.client.get_data(&path))
                .await?
            {
                Ok(d) => d,
                Err(Error::NoNode) => return Ok(LeaseCheck::Missing),
                Err(e) => return Err(map_err(e, doing)),
            };
            if stat.ephemeral_owner != session.id || u64::try_from(stat.czxid).ok() != fence {
                return Ok(LeaseCheck::Foreign);
            }
            let value = String::from_utf8_lossy(&data).into_owned();
            let (kind, holder) = untag_value(&value);
            let Some(data) = edit(kind, holder) else {
                return Ok(LeaseCheck::Ours);
            };
            match self
                .store()
                .call(
                    doing,
                    session
                        .client
                        .set_data(&path, data.as_bytes(), Some(stat.version)),
                )
                .await?
            {
                Ok(_) => return Ok(LeaseCheck::Ours),
                Err(Error::BadVersion) => continue,
                Err(Error::NoNode) => return Ok(LeaseCheck::Missing),
                Err(e) => return Err(map_err(e, doing)),
            }
        }
        Err(LockError::new(
            ErrorKind::Connection,
            format!("{doing}: the node kept changing under us; try again"),
        ))
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for ZkBackend {
    /// One multi-read per thousand locks, however many are held.
    /// A check that each node is still there, of our session, with its creation zxid (the
    /// session is the lease: it lives while the client is connected). A single `renew` is a
    /// batch of one (the `Backend` default).
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.check_nodes(items).await
    }
}

/// How many nodes one multi-read checks: each answer carries a node's data and stat (about 150
/// bytes), well under ZooKeeper's 1 MB packet limit.
const CHECKS_PER_READ: usize = 1000;

impl ZkBackend {
    /// Checks that each item's node is still ours: there, of the current session (with no loss
    /// since it was taken), with its creation zxid. The nodes are read with multi-reads
    /// (ZooKeeper 3.6 and later), a thousand at a time, sent together.
    async fn check_nodes(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        const DOING: &str = "checking ZooKeeper locks";
        let losses = self.sessions().losses();
        let session = self.sessions().current();
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut nodes = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match self.recipe.held(item.lease.name, item.lease.token.as_str()) {
                Some(entry) if entry.entry.id.since == losses => {
                    nodes.push((i, entry.entry.id, entry.fence));
                }
                _ => out[i] = Some(Ok(LeaseCheck::Missing)),
            }
        }
        let reads = nodes.chunks(CHECKS_PER_READ).map(|chunk| {
            let session = session.clone();
            async move {
                let mut reader = session.client.new_multi_reader();
                let mut path = String::new();
                for (i, node, _) in chunk {
                    let lease = &items[*i].lease;
                    self.store()
                        .write_path(&mut path, lease.name, lease.token.as_str(), node);
                    if let Err(e) = reader.add_get_data(&path) {
                        return Err(map_err(e, DOING));
                    }
                }
                match self.store().call(DOING, reader.commit()).await? {
                    Ok(results) if results.len() == chunk.len() => Ok(results),
                    Ok(results) => Err(LockError::new(
                        ErrorKind::Protocol,
                        format!(
                            "{DOING}: {} answers to {} reads",
                            results.len(),
                            chunk.len()
                        ),
                    )),
                    Err(e) => Err(map_err(e, DOING)),
                }
            }
        });
        let answers = futures_util::future::join_all(reads).await;
        for (chunk, answer) in nodes.chunks(CHECKS_PER_READ).zip(answers) {
            match answer {
                Ok(results) => {
                    for ((i, _, fence), result) in chunk.iter().zip(results) {
                        out[*i] = Some(match result {
                            MultiReadResult::Data { stat, .. }
                                if stat.ephemeral_owner == session.id
                                    && u64::try_from(stat.czxid).ok() == *fence =>
                            {
                                Ok(LeaseCheck::Ours)
                            }
                            MultiReadResult::Data { .. } => Ok(LeaseCheck::Foreign),
                            MultiReadResult::Error { err: Error::NoNode } => {
                                Ok(LeaseCheck::Missing)
                            }
                            MultiReadResult::Error { err } => Err(map_err(err, DOING)),
                            other => Err(LockError::new(
                                ErrorKind::Protocol,
                                format!("{DOING}: unexpected answer {other:?}"),
                            )),
                        });
                    }
                }
                Err(e) => {
                    for (i, _, _) in chunk {
                        out[*i] = Some(Err(LockError::new(e.kind(), e.message().to_owned())));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Ok(LeaseCheck::Missing)))
            .collect()
    }
}

#[distlock_core::engine::async_trait]
impl WakeSource for ZkBackend {
    async fn subscribe(
        &self,
        key: &str,
        _who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        Ok(Some(self.recipe.subscribe(key)))
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for ZkBackend {
    /// Deletes the holder's node (the lowest sequence under the lock), at the version read:
    /// the next waiter's watch fires, as after a release. The holder learns at its next check.
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a ZooKeeper lock";
        let Some((st, path, version)) = self.holder(key).await? else {
            return Ok(BreakOutcome::Free);
        };
        let client = self.sessions().current().client.clone();
        match self
            .store()
            .call(DOING, client.delete(&path, Some(version)))
            .await?
        {
            Ok(()) => Ok(BreakOutcome::Broken(st)),
            // Released (or changed) in between: not what we read.
            Err(Error::NoNode | Error::BadVersion) => Ok(BreakOutcome::Changed),
            Err(e) => Err(map_err(e, DOING)),
        }
    }
}

impl Sessions for ZkBackend {
    /// The session suspended (disconnected) or expired since the lease was taken.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        match self.recipe.entry(lease.name, lease.token.as_str()) {
            Some(e) => self.sessions().session_watch(e.entry.id.since),
            None => SessionWatch::Never,
        }
    }
}

impl ZkBackend {
    /// The lock nodes under `parent`, by sequence number (none when it does not exist).
    async fn queue_of(
        &self,
        client: &zookeeper_client::Client,
        parent: &str,
        doing: &str,
    ) -> Result<Vec<(i64, String)>, LockError> {
        let children = match self
            .store()
            .call(doing, client.list_children(parent))
            .await?
        {
            Ok(c) => c,
            Err(Error::NoNode) => Vec::new(),
            Err(e) => return Err(map_err(e, doing)),
        };
        let mut queue: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|c| seq_of(&c).map(|s| (s, c)))
            .collect();
        queue.sort();
        Ok(queue)
    }

    /// The holder: its status, node path and the node's data version; `None` when free.
    async fn holder(&self, key: &str) -> Result<Option<(LockStatus, String, i32)>, LockError> {
        const DOING: &str = "reading a ZooKeeper lock's status";

        let parent = self.lock_path(key);
        let client = self.sessions().current().client.clone();
        let queue = self.queue_of(&client, &parent, DOING).await?;
        let Some((_, first)) = queue.into_iter().next() else {
            return Ok(None);
        };
        let (data, stat) = match self
            .store()
            .call(DOING, client.get_data(&format!("{parent}/{first}")))
            .await?
        {
            Ok(d) => d,
            // Released in between.
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let value = String::from_utf8_lossy(&data).into_owned();
        let owner = HolderValue::parse(untag_value(&value).1).label();
        let fence = u64::try_from(stat.czxid).ok();
        Ok(Some((
            LockStatus::held(Some(owner), fence, None).with_last_fence(fence),
            format!("{parent}/{first}"),
            stat.version,
        )))
    }
}
