//! Sessions: one etcd lease per client and TTL, kept alive by one keep-alive stream, with
//! every renewed lock of that TTL on it (etcd's own `concurrency.Session`). A lock's key is
//! attached to its session's lease; when the session ends (the lease expired, or could not be
//! kept alive until its deadline), every lock on it is lost at once.
//!
//! A shared session is kept alive on a schedule (a third of its TTL after the last refresh)
//! only while keys are on it: a client that holds and waits for nothing sends nothing, and its
//! idle session runs out by itself. A lock whose holder does not renew it lives on a private
//! lease of its own, kept alive only when its holder extends it, so that it ends after its TTL
//! whatever else the client holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_core::engine::{Clock, ErrorKind, LockError, LostReason, SessionEnd};
use distlock_core::recipes::MutexExt;
use tokio::sync::{Notify, mpsc, oneshot};
use tonic::Status;

use crate::error::map_err;
use crate::members::{Members, Resend};

/// The lease TTL in whole seconds for a lock TTL (rounded up: the server must not forget the
/// lock before the holder stops trusting it).
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}

type RefreshRequest = oneshot::Sender<Result<Instant, LockError>>;

/// One session: a lease, and the task that keeps it alive.
pub(crate) struct Session {
    /// The lease id.
    pub(crate) lease: i64,
    /// Its TTL in whole seconds, as granted (the server may raise a short one).
    pub(crate) ttl_s: i64,
    /// The TTL in whole seconds it was asked for: the TTL of the locks it holds.
    pub(crate) asked_s: i64,
    /// Shared by the renewed locks of one TTL (kept alive on a schedule while keys are on it),
    /// or private to one lock that is not renewed (kept alive only when asked).
    pub(crate) shared: bool,
    /// When the last grant or keep-alive that the server answered was sent: it keeps the lease
    /// at least `ttl_s` from then.
    refreshed: Mutex<Instant>,
    /// How many of our keys are attached to it.
    keys: AtomicUsize,
    /// Told when the first key is attached, so the keeper resumes its schedule.
    joined: Arc<Notify>,
    /// Set when the session ended, with why: every key on it hears it there.
    pub(crate) ended: SessionEnd,
    /// Asks the keeper for a keep-alive sent from now on; the reply is when it was sent.
    refresh: mpsc::UnboundedSender<RefreshRequest>,
}

impl Session {
    /// When the last keep-alive the server answered was sent.
    pub(crate) fn refreshed(&self) -> Instant {
        *self.refreshed.locked()
    }

    /// When the server forgets the lease unless it is kept alive before.
    pub(crate) fn deadline(&self) -> Instant {
        self.refreshed() + Duration::from_secs(self.ttl_s.unsigned_abs())
    }

    /// Whether the session has ended.
    pub(crate) fn is_over(&self) -> bool {
        self.ended.is_over()
    }

    /// How many of our keys are attached to it.
    pub(crate) fn keys(&self) -> usize {
        self.keys.load(Ordering::Acquire)
    }

    /// A key of ours is attached to it.
    pub(crate) fn add_key(&self) {
        if self.keys.fetch_add(1, Ordering::AcqRel) == 0 {
            self.joined.notify_one();
        }
    }

    /// How many keys of ours are on it.
    pub(crate) fn key_count(&self) -> usize {
        self.keys.load(Ordering::Acquire)
    }

    /// A key of ours left it (deleted, or moved to another lease).
    pub(crate) fn remove_key(&self) {
        let _ = self
            .keys
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Whether the keeper keeps it alive on its own schedule now.
    fn scheduled(&self) -> bool {
        self.shared && self.keys() > 0
    }

    /// The server said, in a request sent at `sent`, that the lease is gone: the session is
    /// over. Well before the session's deadline (a tenth of the TTL, for clocks that run at
    /// slightly different rates) the lease cannot have run out, so somebody revoked it
    /// (`Stolen`, as for any lock removed under its holder); nearer, it expired.
    pub(crate) fn lapsed(&self, sent: Instant) {
        let margin = Duration::from_secs(self.ttl_s.unsigned_abs()) / 10;
        self.end(if sent + margin < self.deadline() {
            LostReason::Stolen
        } else {
            LostReason::Expired
        });
    }

    /// Marks the session ended (once).
    fn end(&self, why: LostReason) {
        self.ended.end(why);
    }

    /// A keep-alive of the lease sent after this call (several callers share one): when it was
    /// sent.
    ///
    /// # Errors
    /// `Lost` when the lease is gone; the connection's errors when no member answered.
    pub(crate) async fn keep_alive(&self) -> Result<Instant, LockError> {
        let (tx, rx) = oneshot::channel();
        if self.refresh.send(tx).is_err() {
            return Err(self.over_error());
        }
        rx.await.unwrap_or_else(|_| Err(self.over_error()))
    }

    fn over_error(&self) -> LockError {
        let why = self.ended.reason().unwrap_or(LostReason::Expired);
        LockError::new(
            ErrorKind::Lost,
            format!("the etcd session (lease {:016x}) ended: {why}", self.lease),
        )
    }

    /// Resolves with the reason when the session ends.
    pub(crate) fn ended(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.ended.wait()
    }
}

/// This client's sessions, one per TTL (in whole seconds) asked for.
pub(crate) struct Sessions {
    members: Arc<Members>,
    response_timeout: Duration,
    by_ttl: tokio::sync::Mutex<HashMap<i64, Arc<Session>>>,
    /// The clock of the client's first request: sessions keep time on it.
    clock: Mutex<Option<Arc<dyn Clock>>>,
}

impl Sessions {
    pub(crate) fn new(members: Arc<Members>, response_timeout: Duration) -> Self {
        Sessions {
            members,
            response_timeout,
            by_ttl: tokio::sync::Mutex::new(HashMap::new()),
            clock: Mutex::new(None),
        }
    }

    /// The clock sessions keep time on (the system's until a request brought one).
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        self.clock
            .locked()
            .clone()
            .unwrap_or_else(|| Arc::new(distlock_core::SystemClock))
    }

    /// The shared session for renewed locks of `ttl`: the current one, or a new lease granted
    /// now.
    ///
    /// An idle session (no key on it, so not kept alive) is used only while most of its lease
    /// is left; otherwise it is left to run out and a new one is granted.
    ///
    /// # Errors
    /// The grant's.
    pub(crate) async fn get(
        &self,
        ttl: Duration,
        clock: &Arc<dyn Clock>,
    ) -> Result<Arc<Session>, LockError> {
        let asked = ttl_secs(ttl);
        self.clock.locked().get_or_insert_with(|| clock.clone());
        // One grant at a time per client: concurrent first acquires share the session.
        let mut by_ttl = self.by_ttl.lock().await;
        if let Some(s) = by_ttl.get(&asked).filter(|s| {
            let half = Duration::from_secs(s.ttl_s.unsigned_abs()) / 2;
            !s.is_over() && (s.keys() > 0 || clock.now() + half < s.deadline())
        }) {
            return Ok(s.clone());
        }
        let session = self.grant(asked, true, clock).await?;
        by_ttl.insert(asked, session.clone());
        Ok(session)
    }

    /// A private lease of `ttl` for one lock whose holder does not renew it: kept alive only
    /// when asked, it ends by itself after its TTL.
    ///
    /// # Errors
    /// The grant's.
    pub(crate) async fn private(
        &self,
        ttl: Duration,
        clock: &Arc<dyn Clock>,
    ) -> Result<Arc<Session>, LockError> {
        self.clock.locked().get_or_insert_with(|| clock.clone());
        self.grant(ttl_secs(ttl), false, clock).await
    }

    async fn grant(
        &self,
        asked: i64,
        shared: bool,
        clock: &Arc<dyn Clock>,
    ) -> Result<Arc<Session>, LockError> {
        // When the request that was answered was sent: the lease runs from after that. A try
        // given up before it (a member killed under it) may have granted a lease too, another
        // one, which nobody uses; counting from that try instead made a session granted after
        // a 2 s response timeout look expired at once.
        let tried = Mutex::new(clock.now());
        let granted = self
            .members
            .retry(|c| {
                *tried.locked() = clock.now();
                async move { c.lease_grant(asked).await }
            })
            .await
            .map_err(|e| map_err(e, "granting an etcd session lease"))?;
        let sent = *tried.locked();
        if !granted.error.is_empty() {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!("granting an etcd session lease: {}", granted.error),
            ));
        }
        let (refresh, requests) = mpsc::unbounded_channel();
        let joined = Arc::new(Notify::new());
        let session = Arc::new(Session {
            lease: granted.id,
            ttl_s: granted.ttl.max(asked),
            asked_s: asked,
            shared,
            refreshed: Mutex::new(sent),
            keys: AtomicUsize::new(0),
            joined: joined.clone(),
            ended: SessionEnd::new(),
            refresh,
        });
        tokio::spawn(keep(
            Arc::downgrade(&session),
            joined,
            self.members.clone(),
            requests,
            clock.clone(),
            self.response_timeout,
        ));
        Ok(session)
    }

    /// Revokes every shared session's lease (its keys go with it), in the background: the
    /// client is going away. (Private leases run out by themselves.)
    pub(crate) fn close(&self) {
        let Ok(by_ttl) = self.by_ttl.try_lock() else {
            return;
        };
        for s in by_ttl.values().filter(|s| !s.is_over()) {
            let (members, lease) = (self.members.clone(), s.lease);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = members
                        .retry(|c| async move { c.lease_revoke(lease).await })
                        .await;
                });
            }
        }
    }
}

/// The keeper of one session. A shared session with keys on it gets a keep-alive a third of
/// its TTL, and a quarter of that, after the last one the server answered; any session gets one
/// at once when asked (a renewal batch, an extension). The quarter lets the watchdog's
/// renewals (each batch asks for a keep-alive, a third of the TTL apart by default) keep the
/// session alive by themselves: the schedule fills in only for keys nobody renews (waiters'
/// places in a queue) or renewals further apart. One stream, opened again on another member
/// when its member fails. A session left unrefreshed until its deadline (idle, or private and not extended)
/// ends there; the keeper ends with its session, or when the session is dropped.
async fn keep(
    session: Weak<Session>,
    joined: Arc<Notify>,
    members: Arc<Members>,
    mut requests: mpsc::UnboundedReceiver<RefreshRequest>,
    clock: Arc<dyn Clock>,
    response_timeout: Duration,
) {
    let Some((lease, ttl_s)) = session.upgrade().map(|s| (s.lease, s.ttl_s)) else {
        return;
    };
    let ttl = Duration::from_secs(ttl_s.unsigned_abs());
    let every = ttl / 3;
    let mut stream = None;
    let mut waiting: Vec<RefreshRequest> = Vec::new();
    loop {
        if waiting.is_empty() {
            let (scheduled, wake) = match session.upgrade() {
                Some(s) if s.scheduled() => (true, s.refreshed() + every + every / 4),
                Some(s) => (false, s.deadline()),
                None => return,
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {
                    if !scheduled {
                        let Some(s) = session.upgrade() else { return };
                        if !s.scheduled() {
                            // Nobody kept it alive: the server has let it go.
                            s.end(LostReason::Expired);
                            return;
                        }
                    }
                }
                req = requests.recv() => match req {
                    Some(r) => waiting.push(r),
                    None => return,
                },
                () = joined.notified() => continue,
            }
        }
        // Every request queued by now is served by the keep-alive sent next.
        while let Ok(r) = requests.try_recv() {
            waiting.push(r);
        }
        let mut sent = clock.now();
        let mut answer = keep_alive_once(&members, &mut stream, lease, response_timeout).await;
        // "Gone" is asked again a few times, backing off, while the lease could still be alive:
        // a leader just elected answers from its lease table before it has applied every
        // committed grant (etcd#13675), so a session granted through another member may look
        // gone for a moment. A lease that is really gone stays gone (ids are never reused):
        // this only delays the loss by these pauses.
        let mut pause = GONE_RECHECK;
        for _ in 0..GONE_RECHECKS {
            let Some(deadline) = session.upgrade().map(|s| s.deadline()) else {
                return;
            };
            if !matches!(answer, Ok(ttl) if ttl <= 0) || clock.now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            sent = clock.now();
            answer = keep_alive_once(&members, &mut stream, lease, response_timeout).await;
        }
        let Some(s) = session.upgrade() else { return };
        let reply = match answer {
            Ok(ttl) if ttl > 0 => {
                let mut r = s.refreshed.locked();
                if sent > *r {
                    *r = sent;
                }
                Ok(sent)
            }
            Ok(_) => {
                // The lease is gone: every lock on the session with it.
                s.lapsed(sent);
                if s.keys() > 0 {
                    tracing::warn!(target: "distlock", lease = format!("{lease:016x}"),
                        "etcd session lease expired: its locks are lost");
                }
                Err(s.over_error())
            }
            Err(e) => {
                // No member answered: the session lives until its deadline, unknown after it.
                if clock.now() >= s.deadline() {
                    s.end(LostReason::Unreachable);
                }
                Err(e)
            }
        };
        for w in waiting.drain(..) {
            let r = match &reply {
                Ok(t) => Ok(*t),
                Err(e) => Err(LockError::new(e.kind(), e.message().to_owned())),
            };
            let _ = w.send(r);
        }
        if s.is_over() {
            return;
        }
        if reply.is_err() {
            // Not a tight loop while no member answers.
            tokio::time::sleep(every / 8).await;
        }
    }
}

/// How many times a keep-alive that found the lease gone is sent again before the session is
/// called over, and the first pause (doubling: 50, 100, 200 ms).
const GONE_RECHECKS: u32 = 3;
const GONE_RECHECK: Duration = Duration::from_millis(50);

/// One keep-alive on the session's stream (opened, or opened again, on the current member):
/// the TTL the member answered.
async fn keep_alive_once(
    members: &Members,
    stream: &mut Option<(usize, crate::wire::KeepAlive)>,
    lease: i64,
    response_timeout: Duration,
) -> Result<i64, LockError> {
    const DOING: &str = "keeping an etcd session alive";
    if let Some((member, ka)) = stream.as_mut() {
        let sent = tokio::time::timeout(response_timeout, async {
            ka.send().await?;
            ka.message().await
        })
        .await;
        match sent {
            Ok(Ok(Some(r))) => return Ok(r.ttl),
            // Broken, or silent: open it again (on the next member if this one is silent).
            Ok(_) => {}
            Err(_) => members.move_on(*member),
        }
        *stream = None;
    }
    // Opening the stream sends the keep-alive.
    let (member, opened) = members
        .send_on(Resend::Always, |c| async move {
            let mut ka = c.lease_keep_alive(lease).await?;
            let first = ka.message().await?;
            Ok::<_, Status>((ka, first))
        })
        .await;
    let (ka, first) = opened.map_err(|e| map_err(e, DOING))?;
    let ttl = first.map_or(0, |r| r.ttl);
    *stream = Some((member, ka));
    Ok(ttl)
}
