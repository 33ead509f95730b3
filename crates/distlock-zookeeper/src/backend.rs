//! The ZooKeeper engine.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, HolderValue, LeaseCheck, LeaseRef, LockError, LockStatus, LostReason, MutexExt,
    PredecessorWatches, Sessions, Subscription, WakeHub, WakeSource,
};
use tokio::runtime::Handle;
use tokio::sync::watch;
use zookeeper_client::{Acls, Client, CreateMode, Error, SessionState};

use crate::config::ZkConfig;

/// One node of ours in a lock's queue.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    path: String,
    /// Its sequence number (its place in the queue).
    seq: i64,
    /// Its creation zxid: the fencing token.
    czxid: i64,
    /// The loss count when the node was created (see `Inner::losses`).
    since: u64,
    held: bool,
}

/// The ZooKeeper session in use.
struct Session {
    client: Client,
    id: i64,
}

struct Inner {
    config: ZkConfig,
    session: RwLock<Arc<Session>>,
    /// How many times the session was suspended (disconnected) or expired, and why the last
    /// time: a lock taken before that can no longer be trusted.
    losses: watch::Sender<(u64, LostReason)>,
    entries: Mutex<HashMap<String, Entry>>,
    watches: PredecessorWatches,
    hub: WakeHub,
    runtime: Handle,
}

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
/// - **release** deletes the node.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn map_err(e: Error, doing: &str) -> LockError {
    let kind = match &e {
        Error::ConnectionLoss | Error::SessionExpired | Error::ClientClosed | Error::NoHosts => {
            ErrorKind::Connection
        }
        Error::Timeout => ErrorKind::Timeout,
        Error::NoAuth | Error::AuthFailed => ErrorKind::Auth,
        Error::BadArguments(_) => ErrorKind::InvalidKey,
        _ => ErrorKind::Protocol,
    };
    LockError::new(kind, format!("{doing}: {e}")).with_source(e)
}

/// The sequence number at the end of a lock node's name.
fn seq_of(child: &str) -> Option<i64> {
    child.rsplit_once("-lock-")?.1.parse().ok()
}

async fn connect(config: &ZkConfig) -> Result<Client, LockError> {
    let doing = format!("connecting to ZooKeeper at {}", config.cluster);
    let connect = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(config.connect_timeout)
        .connect(&config.cluster);
    let limit = config.connect_timeout + config.session_timeout;
    // No server that answers within the limit is an unreachable engine, not a busy lock: the
    // client tries each server again until then, so a refused connection also ends here.
    let unreachable = || {
        LockError::new(
            ErrorKind::Connection,
            format!("{doing}: no server answered within {limit:?}"),
        )
    };
    match tokio::time::timeout(limit, connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(Error::Timeout)) | Err(_) => Err(unreachable()),
        Ok(Err(e)) => Err(map_err(e, &doing)),
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
        let client = connect(&config).await?;
        let session = Arc::new(Session {
            id: client.session_id().0,
            client,
        });
        let (losses, _) = watch::channel((0, LostReason::Unreachable));
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let leaving = weak.clone();
            Inner {
                config,
                session: RwLock::new(session.clone()),
                losses,
                entries: Mutex::new(HashMap::new()),
                watches: PredecessorWatches::default(),
                hub: WakeHub::new(
                    |_| {},
                    move |name| {
                        if let Some(inner) = leaving.upgrade() {
                            inner.leave(name);
                        }
                    },
                ),
                runtime: Handle::current(),
            }
        });
        Inner::monitor(&inner, &session);
        Ok(ZkBackend { inner })
    }

    /// The current session's id (for operators and tests: ZooKeeper's `cons` lists it).
    pub fn session_id(&self) -> i64 {
        self.inner.session().id
    }

    /// The parent node under which the lock `name` queues its holders.
    pub fn lock_path(&self, name: &str) -> String {
        format!("{}/{name}", self.inner.config.prefix)
    }

    async fn call<T>(
        &self,
        doing: &str,
        fut: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<Result<T, Error>, LockError> {
        match tokio::time::timeout(self.inner.config.response_timeout, fut).await {
            Ok(r) => Ok(r),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("{doing}: no answer from ZooKeeper"),
            )),
        }
    }

    /// Our node for `token` if a create whose reply was lost made one (protection mode).
    async fn find_own(
        &self,
        client: &Client,
        parent: &str,
        token: &str,
    ) -> Result<Option<(String, i64, i64)>, LockError> {
        const DOING: &str = "looking for a ZooKeeper lock node";
        let children = match self.call(DOING, client.list_children(parent)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let mark = format!("_c_{token}-");
        let Some(child) = children.into_iter().find(|c| c.starts_with(&mark)) else {
            return Ok(None);
        };
        let path = format!("{parent}/{child}");
        match self.call(DOING, client.check_stat(&path)).await? {
            Ok(Some(stat)) => Ok(seq_of(&child).map(|seq| (path, seq, stat.czxid))),
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
        token: &str,
        owner: &str,
    ) -> Result<(String, i64, i64), LockError> {
        const DOING: &str = "creating a ZooKeeper lock node";
        let prefix = format!("{parent}/_c_{token}-lock-");
        let data = HolderValue::now(token, owner).encode();
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for _ in 0..2 {
            match self
                .call(DOING, client.create(&prefix, data.as_bytes(), &options))
                .await
            {
                Ok(Ok((stat, seq))) => {
                    return Ok((format!("{prefix}{seq}"), seq.into_i64(), stat.czxid));
                }
                Ok(Err(Error::NoNode)) => {
                    let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    match self.call(DOING, client.mkdir(parent, &parents)).await? {
                        Ok(()) | Err(Error::NodeExists) => {}
                        Err(e) => return Err(map_err(e, DOING)),
                    }
                }
                Ok(Err(e @ Error::ConnectionLoss)) => {
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
        token: &str,
        owner: &str,
    ) -> Result<(Option<(String, i64, i64)>, Option<Vec<String>>), LockError> {
        const DOING: &str = "creating a ZooKeeper lock node";
        let prefix = format!("{parent}/_c_{token}-lock-");
        let data = HolderValue::now(token, owner).encode();
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let create = client.create(&prefix, data.as_bytes(), &options);
        let list = client.list_children(parent);
        let both = tokio::time::timeout(self.inner.config.response_timeout, async {
            tokio::join!(create, list)
        })
        .await;
        match both {
            Ok((Ok((stat, seq)), listed)) => Ok((
                Some((format!("{prefix}{seq}"), seq.into_i64(), stat.czxid)),
                listed.ok(),
            )),
            Ok((Err(Error::NoNode), _)) => Ok((None, None)),
            Ok((Err(e @ Error::ConnectionLoss), _)) => {
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

    fn discard(&self, token: &str) {
        if let Some(e) = self.inner.entries.locked().remove(token) {
            self.inner.delete_later(e.path);
        }
    }

    /// Watches `pred` for its deletion, waking `name`'s waiters then.
    fn watch_predecessor(&self, name: &str, pred: String) {
        let inner = self.inner.clone();
        let (n, path) = (name.to_owned(), pred.clone());
        self.inner.watches.point(name, &pred, move || {
            let task = inner.runtime.clone().spawn(async move {
                let client = inner.session().client.clone();
                if let Ok((Some(_), watcher)) = client.check_and_watch_stat(&path).await {
                    watcher.changed().await;
                }
                inner.hub.notify(&n);
            });
            task.abort_handle()
        });
    }
}

impl Inner {
    fn session(&self) -> Arc<Session> {
        self.session
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Follows the session's state: a suspension or an expiry counts as a loss; after an
    /// expiry a new session is opened.
    fn monitor(inner: &Arc<Inner>, session: &Arc<Session>) {
        let weak = Arc::downgrade(inner);
        let mut states = session.client.state_watcher();
        inner.runtime.spawn(async move {
            loop {
                let state = states.changed().await;
                let Some(inner) = weak.upgrade() else { return };
                match state {
                    SessionState::Disconnected => {
                        tracing::warn!(target: "distlock",
                            "ZooKeeper connection lost: locks held are no longer trusted");
                        inner
                            .losses
                            .send_modify(|(n, why)| (*n, *why) = (*n + 1, LostReason::Unreachable));
                    }
                    SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                        tracing::warn!(target: "distlock", ?state,
                            "ZooKeeper session ended: its locks are gone");
                        inner
                            .losses
                            .send_modify(|(n, why)| (*n, *why) = (*n + 1, LostReason::Expired));
                        if state == SessionState::Closed {
                            return;
                        }
                        Inner::reconnect(&inner).await;
                        return;
                    }
                    _ => {}
                }
            }
        });
    }

    /// Opens a new session (retrying until it works or the engine is dropped) and follows it.
    async fn reconnect(inner: &Arc<Inner>) {
        let mut delay = Duration::from_millis(50);
        loop {
            match connect(&inner.config).await {
                Ok(client) => {
                    let session = Arc::new(Session {
                        id: client.session_id().0,
                        client,
                    });
                    *inner
                        .session
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = session.clone();
                    Inner::monitor(inner, &session);
                    return;
                }
                Err(e) => {
                    tracing::debug!(target: "distlock", error = %e, "ZooKeeper reconnect failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    fn delete_later(&self, path: String) {
        let client = self.session().client.clone();
        self.runtime.spawn(async move {
            let _ = client.delete(&path, None).await;
        });
    }

    /// Nobody here waits for `name` any more: stop watching and leave its queue.
    fn leave(&self, name: &str) {
        self.watches.stop(name);
        let gone: Vec<String> = {
            let mut entries = self.entries.locked();
            let tokens: Vec<String> = entries
                .iter()
                .filter(|(_, e)| e.name == name && !e.held)
                .map(|(t, _)| t.clone())
                .collect();
            tokens
                .into_iter()
                .filter_map(|t| entries.remove(&t).map(|e| e.path))
                .collect()
        };
        for path in gone {
            self.delete_later(path);
        }
    }
}

impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, false)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a ZooKeeper lock";
        let token = req.token.as_str();
        let parent = self.lock_path(req.name);
        let client = self.inner.session().client.clone();
        let known = self.inner.entries.locked().get(token).cloned();
        let (entry, listed) = match known {
            Some(e) => (e, None),
            None => {
                let since = self.inner.losses.borrow().0;
                let (found, listed) = if req.retry {
                    (self.find_own(&client, &parent, token).await?, None)
                } else {
                    self.create_and_list(&client, &parent, token, req.owner)
                        .await?
                };
                let (path, seq, czxid) = match found {
                    Some(f) => f,
                    None => self.create(&client, &parent, token, req.owner).await?,
                };
                let e = Entry {
                    name: req.name.to_owned(),
                    path,
                    seq,
                    czxid,
                    since,
                    held: false,
                };
                self.inner
                    .entries
                    .locked()
                    .insert(token.to_owned(), e.clone());
                (e, listed)
            }
        };
        let children = match listed {
            Some(c) => c,
            None => match self.call(DOING, client.list_children(&parent)).await? {
                Ok(c) => c,
                Err(Error::NoNode) => Vec::new(),
                Err(e) => return Err(map_err(e, DOING)),
            },
        };
        let mut queue: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|c| seq_of(&c).map(|s| (s, c)))
            .collect();
        queue.sort();
        let Some(place) = queue.iter().position(|(s, _)| *s == entry.seq) else {
            // Our node is gone: its session ended while it waited (or it was deleted).
            self.inner.entries.locked().remove(token);
            return Err(LockError::new(
                ErrorKind::Lost,
                format!(
                    "our place in the queue of {:?} is gone (the session ended or the node was deleted)",
                    req.name
                ),
            ));
        };
        if place == 0 {
            if let Some(e) = self.inner.entries.locked().get_mut(token) {
                e.held = true;
            }
            return Ok(Attempt::Acquired {
                fence: u64::try_from(entry.czxid).ok(),
            });
        }
        if !req.queue {
            self.discard(token);
            return Ok(Attempt::Busy { holder_ttl: None });
        }
        let pred = format!("{parent}/{}", queue[place - 1].1);
        self.watch_predecessor(req.name, pred);
        Ok(Attempt::Busy { holder_ttl: None })
    }

    async fn renew(&self, lease: &LeaseRef<'_>, _ttl: Duration) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        const DOING: &str = "checking a ZooKeeper lock";
        let Some(entry) = self
            .inner
            .entries
            .locked()
            .get(token.as_str())
            .filter(|e| e.name == key && e.held)
            .cloned()
        else {
            return Ok(LeaseCheck::Missing);
        };
        if self.inner.losses.borrow().0 != entry.since {
            return Ok(LeaseCheck::Missing);
        }
        let session = self.inner.session();
        match self
            .call(DOING, session.client.check_stat(&entry.path))
            .await?
        {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id && stat.czxid == entry.czxid => {
                Ok(LeaseCheck::Ours)
            }
            Ok(Some(_)) => Ok(LeaseCheck::Foreign),
            Ok(None) => Ok(LeaseCheck::Missing),
            Err(e) => Err(map_err(e, DOING)),
        }
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        const DOING: &str = "releasing a ZooKeeper lock";
        let Some(entry) = self
            .inner
            .entries
            .locked()
            .get(token.as_str())
            .filter(|e| e.name == key)
            .cloned()
        else {
            // An acquire cancelled while its create was in flight: the node may exist without
            // our knowing its name. Its token finds it (the create was sent first, and ZooKeeper
            // answers one session's requests in order).
            let client = self.inner.session().client.clone();
            if let Some((path, _, _)) = self
                .find_own(&client, &self.lock_path(key), token.as_str())
                .await?
            {
                match self.call(DOING, client.delete(&path, None)).await? {
                    Ok(()) | Err(Error::NoNode) => {}
                    Err(e) => return Err(map_err(e, DOING)),
                }
            }
            return Ok(LeaseCheck::Missing);
        };
        let trusted = self.inner.losses.borrow().0 == entry.since;
        let client = self.inner.session().client.clone();
        let deleted = self.call(DOING, client.delete(&entry.path, None)).await?;
        self.inner.entries.locked().remove(token.as_str());
        match deleted {
            Ok(()) if trusted => Ok(LeaseCheck::Ours),
            Ok(()) | Err(Error::NoNode) => Ok(LeaseCheck::Missing),
            Err(e) => Err(map_err(e, DOING)),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(self
            .holder(key)
            .await?
            .map_or_else(LockStatus::free, |h| h.0))
    }

    fn wake_source(&self) -> Option<&dyn WakeSource> {
        Some(self)
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }
}

impl WakeSource for ZkBackend {
    fn subscribe<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        Box::pin(std::future::ready(Ok(Some(self.inner.hub.subscribe(key)))))
    }
}

impl Breaker for ZkBackend {
    /// Deletes the holder's node (the lowest sequence under the lock), at the version read:
    /// the next waiter's watch fires, as after a release. The holder learns at its next check.
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(async move {
            const DOING: &str = "breaking a ZooKeeper lock";
            let Some((st, path, version)) = self.holder(key).await? else {
                return Ok(BreakOutcome::Free);
            };
            let client = self.inner.session().client.clone();
            match self
                .call(DOING, client.delete(&path, Some(version)))
                .await?
            {
                Ok(()) => Ok(BreakOutcome::Broken(st)),
                // Released (or changed) in between: not what we read.
                Err(Error::NoNode | Error::BadVersion) => Ok(BreakOutcome::Changed),
                Err(e) => Err(map_err(e, DOING)),
            }
        })
    }
}

impl Sessions for ZkBackend {
    /// The session suspended (disconnected) or expired since the lease was taken.
    fn session_end(&self, lease: &LeaseRef<'_>) -> BoxFuture<'static, LostReason> {
        let since = self
            .inner
            .entries
            .locked()
            .get(lease.token.as_str())
            .map(|e| e.since);
        let mut losses = self.inner.losses.subscribe();
        Box::pin(async move {
            let Some(since) = since else {
                return std::future::pending().await;
            };
            loop {
                let (n, why) = *losses.borrow_and_update();
                if n != since {
                    return why;
                }
                if losses.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
    }
}

impl ZkBackend {
    /// The holder: its status, node path and the node's data version; `None` when free.
    async fn holder(&self, key: &str) -> Result<Option<(LockStatus, String, i32)>, LockError> {
        const DOING: &str = "reading a ZooKeeper lock's status";

        let parent = self.lock_path(key);
        let client = self.inner.session().client.clone();
        let children = match self.call(DOING, client.list_children(&parent)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let Some((_, first)) = children
            .into_iter()
            .filter_map(|c| seq_of(&c).map(|s| (s, c)))
            .min()
        else {
            return Ok(None);
        };
        let (data, stat) = match self
            .call(DOING, client.get_data(&format!("{parent}/{first}")))
            .await?
        {
            Ok(d) => d,
            // Released in between.
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(e, DOING)),
        };
        let value = String::from_utf8_lossy(&data).into_owned();
        let owner = HolderValue::parse(&value).label();
        let fence = u64::try_from(stat.czxid).ok();
        Ok(Some((
            LockStatus::held(Some(owner), fence, None).with_last_fence(fence),
            format!("{parent}/{first}"),
            stat.version,
        )))
    }
}
