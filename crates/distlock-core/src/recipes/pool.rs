//! Sessions shared by many leases: the half of a database engine (PostgreSQL, MySQL/MariaDB)
//! that is not SQL.
//!
//! A database lock (an advisory lock, a `GET_LOCK` named lock) belongs to the server session
//! that took it and ends with it, and a session ends by itself when it stays silent longer than
//! its idle timeout (`idle_session_timeout`, `wait_timeout`). So a session can carry many
//! leases at once, as DistributedLock (.NET) multiplexes them: one statement keeps all of them
//! alive, and when the session ends, every lease on it is lost with it.
//!
//! The pool owns the bookkeeping that is the same for every such engine, so that it is written
//! once:
//!
//! - **placement**: a lease goes on a session that neither holds nor is taking the same server
//!   name (a session's advisory locks stack, and its shared and exclusive holds would not
//!   exclude each other), preferring sessions of the same TTL, opening a new one only while
//!   every such session is busy placing another lease, and never more than `sessions` in all;
//!   at that cap a request waits (up to `pool_wait`) for room and then fails with
//!   [`ErrorKind::Exhausted`];
//! - **the server's timeout**: every statement sets the session's idle timeout to at least what
//!   the leases on it still need ([`SessionPool::keep_for`]), so no lease can end on the server
//!   before its holder stops trusting it;
//! - **renewals**: one keep-alive statement per session, however many of its leases are due;
//! - **leases nobody renews** (the watchdog off, a leaked guard, a hold limit reached) are
//!   released by the client at their deadline, since a shared session outlives them; if the
//!   client hangs or dies, the session's idle timeout or its end frees them;
//! - **endings**: a session's end is every lease's lost signal, with the reason the engine read;
//!   a session that failed a statement in a way that leaves a lock's state unknown is closed,
//!   which frees everything on it, rather than kept with a lock nobody tracks.
//!
//! The engine supplies the SQL ([`SessionOps`]) and its acquire statement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use crate::engine::SessionEnd;
use crate::engine::{BoxFuture, LeaseCheck, LostReason, RenewItem, SessionWatch};
use crate::error::{ErrorKind, LockError};
use crate::sync::MutexExt;
use crate::token::{CompactToken, Token};
use std::hash::BuildHasher;

/// How often the pool looks for sessions that have stayed empty, to close them before the
/// server's idle timeout does (a clean close, not a server-side error in its log).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The leases of one renewal call ([`BatchRenew::max_batch`](crate::engine::BatchRenew::max_batch))
/// for an engine on this pool. A call costs one statement per session it touches, however many
/// leases it carries: at the default 1,024, a client holding 100,000 locks on 8 sessions sent a
/// hundred keep-alives a tick where eight do, and each costs the server a walk of that
/// session's locks (PostgreSQL). What a call builds is about 100 bytes a lease.
pub const RENEW_CHUNK: usize = 16_384;

/// How many leases a renewal call looks up under one hold of the pool's lock.
const LOOKUPS_PER_LOCK: usize = 1024;

/// How long a failed unlock waits for the session's reader to report that the session ended,
/// before the pool closes it itself.
const ENDING_GRACE: Duration = Duration::from_millis(100);

/// How long a session with no timeout set may stay empty before the pool closes it.
const EMPTY_UNTIMED: Duration = Duration::from_secs(60);

impl<C> std::fmt::Debug for Session<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("number", &self.id)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<C> std::fmt::Debug for PoolLease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolLease")
            .field("key", &self.key)
            .field("session", &self.session.id)
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl<C> Clone for PoolLease<C> {
    fn clone(&self) -> Self {
        PoolLease {
            token: self.token.clone(),
            key: self.key.clone(),
            session: self.session.clone(),
            serial: self.serial,
        }
    }
}

impl<C> std::fmt::Debug for Placement<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::On(l) => f.debug_tuple("On").field(l).finish(),
            Placement::HeldHere => f.write_str("HeldHere"),
        }
    }
}

impl<O: SessionOps> std::fmt::Debug for SessionPool<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.locked();
        f.debug_struct("SessionPool")
            .field("limits", &self.limits)
            .field("sessions", &st.sessions.len())
            .field("leases", &st.leases.len())
            .finish_non_exhaustive()
    }
}

/// The SQL half of a session engine: opening and closing a session, and the two statements the
/// pool runs on its own.
pub trait SessionOps: Send + Sync + 'static {
    /// One open session.
    type Conn: Send + Sync + 'static;

    /// Opens a session. The engine tells `end` when the session ends by itself (the server
    /// closed it, timed it out, or terminated it), with the reason, as soon as it learns it.
    fn open(&self, end: SessionEnd) -> BoxFuture<'_, Result<Self::Conn, LockError>>;

    /// Ends the session now: the server frees every lock on it.
    fn close(&self, conn: &Self::Conn);

    /// Releases the server lock `key` that this session holds: whether it held it.
    fn unlock<'a>(
        &'a self,
        conn: &'a Self::Conn,
        key: &'a str,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// A statement that sets the session's idle timeout to `keep()` and so keeps it (and every
    /// lock on it) alive at least that long from when it is sent. The engine calls `keep` at
    /// the last moment, in the order its statements reach the session (see
    /// [`SessionPool::keep_for`]).
    fn ping<'a>(
        &'a self,
        conn: &'a Self::Conn,
        keep: &'a (dyn Fn() -> Duration + Send + Sync),
    ) -> BoxFuture<'a, Result<(), LockError>>;
}

/// The pool's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// The most sessions open at once.
    pub sessions: usize,
    /// How long a request waits for room when every session is in use for it.
    pub wait: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            sessions: 8,
            wait: Duration::from_secs(5),
        }
    }
}

/// One session of the pool.
pub struct Session<C> {
    id: u64,
    conn: C,
    end: SessionEnd,
}

impl<C> Session<C> {
    /// The engine's connection.
    pub fn conn(&self) -> &C {
        &self.conn
    }

    /// The session's end signal.
    pub fn end(&self) -> &SessionEnd {
        &self.end
    }

    /// Whether the session has ended.
    pub fn is_over(&self) -> bool {
        self.end.is_over()
    }

    /// A number for logs and labels, unique within the pool.
    pub fn number(&self) -> u64 {
        self.id
    }
}

/// A lease on a pooled session, as the pool hands it to the engine: being taken (between
/// [`SessionPool::place`] and [`SessionPool::confirm`]) or held. A copy of the pool's record,
/// made for a request: the pool keeps no `PoolLease` itself.
pub struct PoolLease<C> {
    token: Token,
    key: Key,
    session: Arc<Session<C>>,
    /// The placement's number, unique within the pool: the pool's record of the token stands
    /// for this lease while it carries the same number (a downgrade's
    /// [`rekey`](SessionPool::rekey) keeps it).
    serial: u64,
}

impl<C> PoolLease<C> {
    /// The session it is on.
    pub fn session(&self) -> &Arc<Session<C>> {
        &self.session
    }

    /// The server-side name of its lock.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// How many sessions in a row one acquire tries when each ends under it
/// ([`SessionPool::place_try`]).
pub const PLACE_TRIES: u32 = 3;

/// Where a new lease goes.
pub enum Placement<C> {
    /// On this session, reserved for the request until it is confirmed or withdrawn.
    On(PoolLease<C>),
    /// One of our own sessions holds this server name already: the lock is busy.
    HeldHere,
}

/// What the pool knows of one session.
struct SessionState<C> {
    session: Arc<Session<C>>,
    /// The TTL of the leases it was opened for: later leases of that TTL prefer it.
    ttl: Duration,
    /// The server names on it, held or being taken.
    keys: Names,
    /// Requests placing a lease on it right now.
    placing: usize,
    /// The server must keep the session at least until then (the latest deadline any lease on
    /// it was given).
    keep_until: Option<Instant>,
    /// The idle timeout last set.
    timeout: Option<Duration>,
    /// When it last had no key.
    empty_since: Option<Instant>,
}

/// foldhash rather than SipHash: these maps are touched on every acquire and release.
type Hasher = foldhash::fast::RandomState;

struct State<C> {
    sessions: HashMap<u64, SessionState<C>, Hasher>,
    /// Sessions being opened (they count towards the cap).
    opening: usize,
    leases: HashMap<CompactToken, Tracked<C>, Hasher>,
    /// The last placement's number.
    serial: u64,
}

impl<C> State<C> {
    /// The record of `token` if it is on the lock `name`.
    fn tracked(&self, name: &str, token: &str) -> Option<&Tracked<C>> {
        let name = self.name_hash(name);
        self.lease(token).filter(|t| t.on(name))
    }

    /// The hash of a lock's name that its records keep (the lowest bit clear, see
    /// [`Tracked::name_held`]).
    fn name_hash(&self, name: &str) -> u64 {
        self.leases.hasher().hash_one(name) & !1
    }

    /// The record of `token`.
    fn lease(&self, token: &str) -> Option<&Tracked<C>> {
        self.leases.get(&CompactToken::of(token))
    }

    fn lease_mut(&mut self, token: &str) -> Option<&mut Tracked<C>> {
        self.leases.get_mut(&CompactToken::of(token))
    }

    /// Drops the record of `token`.
    fn forget(&mut self, token: &str) -> Option<Tracked<C>> {
        self.leases.remove(&CompactToken::of(token))
    }
}

/// The items of one renewal batch on one session, and the longest TTL they ask.
type Group<C> = (Arc<Session<C>>, Vec<usize>, Duration);

/// The sessions of one client, and the leases on them.
pub struct SessionPool<O: SessionOps> {
    ops: O,
    limits: PoolLimits,
    state: Mutex<State<O::Conn>>,
    /// Told when a session or a name on one frees up.
    room: Notify,
    next_id: AtomicU64,
    /// Keep-alive statements sent.
    keepalives: AtomicU64,
    me: Weak<SessionPool<O>>,
}

/// Decrements the count of sessions being opened if the open is dropped half-way.
struct Opening<'a, O: SessionOps> {
    pool: &'a SessionPool<O>,
    done: bool,
}

impl<O: SessionOps> Drop for Opening<'_, O> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.state.locked().opening -= 1;
            self.pool.room.notify_waiters();
        }
    }
}

impl<O: SessionOps> SessionPool<O> {
    /// A pool over `ops`, within `limits`. Call it inside a Tokio runtime: a task closes
    /// sessions that have stayed empty.
    pub fn new(ops: O, limits: PoolLimits) -> Arc<Self> {
        let pool = Arc::new_cyclic(|me| SessionPool {
            ops,
            limits: PoolLimits {
                sessions: limits.sessions.max(1),
                wait: limits.wait,
            },
            state: Mutex::new(State {
                sessions: HashMap::default(),
                opening: 0,
                leases: HashMap::default(),
                serial: 0,
            }),
            room: Notify::new(),
            next_id: AtomicU64::new(1),
            keepalives: AtomicU64::new(0),
            me: me.clone(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&pool)));
        }
        pool
    }

    /// The engine's half.
    pub fn ops(&self) -> &O {
        &self.ops
    }

    /// The pool's limits.
    pub fn limits(&self) -> PoolLimits {
        self.limits
    }

    /// How many keep-alive statements the pool has sent (one per session per renewal batch).
    pub fn keepalives(&self) -> u64 {
        self.keepalives.load(Ordering::Relaxed)
    }

    /// How many sessions are open.
    pub fn open_sessions(&self) -> usize {
        let st = self.state.locked();
        st.sessions
            .values()
            .filter(|s| !s.session.is_over())
            .count()
    }

    /// The most locks one open session carries (for the tests of how the pool spreads them).
    #[cfg(test)]
    pub(crate) fn most_keys_on_a_session(&self) -> usize {
        let st = self.state.locked();
        st.sessions
            .values()
            .map(|s| s.keys.len())
            .max()
            .unwrap_or(0)
    }

    /// Finds a session for a lease of `ttl` on server name `key` (lock `name`, our `token`),
    /// opening one if needed, and reserves the name on it.
    ///
    /// # Errors
    /// The engine's when a session cannot be opened; [`ErrorKind::Exhausted`] when the pool is
    /// at its cap and no session can take the name within the pool's wait.
    pub async fn place(
        &self,
        name: &str,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Placement<O::Conn>, LockError> {
        let give_up = Instant::now() + self.limits.wait;
        // Registered for room before looking (so a change after the look is not missed), but
        // only once a look found none: the common path allocates nothing for it.
        let mut waited = false;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            if waited {
                room.as_mut().enable();
            }
            let open = {
                let mut st = self.state.locked();
                match choose(&mut st, key, ttl, self.limits.sessions) {
                    Choice::HeldHere => return Ok(Placement::HeldHere),
                    Choice::Use(id) => {
                        return Ok(Placement::On(reserve(&mut st, id, name, key, token)));
                    }
                    Choice::Open => {
                        st.opening += 1;
                        true
                    }
                    Choice::Wait if !waited => {
                        waited = true;
                        continue;
                    }
                    Choice::Wait => false,
                }
            };
            if open {
                let mut guard = Opening {
                    pool: self,
                    done: false,
                };
                let end = SessionEnd::new();
                let opened = self.ops.open(end.clone()).await;
                guard.done = true;
                let mut st = self.state.locked();
                st.opening -= 1;
                let conn = match opened {
                    Ok(c) => c,
                    Err(e) => {
                        drop(st);
                        self.room.notify_waiters();
                        return Err(e);
                    }
                };
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let session = Arc::new(Session { id, conn, end });
                st.sessions.insert(
                    id,
                    SessionState {
                        session,
                        ttl,
                        keys: Names::default(),
                        placing: 0,
                        keep_until: None,
                        timeout: None,
                        empty_since: None,
                    },
                );
                let lease = reserve(&mut st, id, name, key, token);
                drop(st);
                // Requests waiting for room may fit on it.
                self.room.notify_waiters();
                return Ok(Placement::On(lease));
            }
            if tokio::time::timeout_at(give_up, room).await.is_err() {
                return Err(LockError::new(
                    ErrorKind::Exhausted,
                    format!(
                        "no session of the pool could take {name:?} within {:?}: all {} are in \
                         use for it (raise sessions= in the URL)",
                        self.limits.wait, self.limits.sessions
                    ),
                ));
            }
        }
    }

    /// The idle timeout a statement sent now on `session` must set so that it keeps every lease
    /// on it, and a lease of `ttl` from now: at least `ttl`, and more while an earlier lease
    /// was given a later deadline.
    ///
    /// The engine must call it in the order its statements run on the session (under the lock
    /// that orders them): a statement whose timeout was computed earlier must not run after
    /// one computed later, or it could cut the later one's deadline short.
    pub fn keep_for(&self, session: &Session<O::Conn>, ttl: Duration) -> Duration {
        let now = Instant::now();
        let mut st = self.state.locked();
        let Some(s) = st.sessions.get_mut(&session.id) else {
            return ttl;
        };
        let until = s.keep_until.map_or(now + ttl, |k| k.max(now + ttl));
        s.keep_until = Some(until);
        let keep = until.saturating_duration_since(now);
        s.timeout = Some(keep);
        keep
    }

    /// The lease was taken: its holder renews it (`renewed`), or the client releases it
    /// `ttl` after `sent`.
    ///
    /// Returns `false` when the request was given up meanwhile and its clean-up released the
    /// name already (the acquire's caller is gone then).
    pub fn confirm(
        &self,
        lease: &PoolLease<O::Conn>,
        sent: Instant,
        ttl: Duration,
        renewed: bool,
    ) -> bool {
        let mut st = self.state.locked();
        let release_at = (!renewed).then_some(sent + ttl);
        let tracked = match st.lease_mut(lease.token.as_str()) {
            Some(t) if t.serial == lease.serial => {
                t.set_held();
                t.set_release_at(release_at);
                true
            }
            _ => false,
        };
        if let Some(s) = st.sessions.get_mut(&lease.session.id) {
            s.placing = s.placing.saturating_sub(1);
            if tracked {
                s.keys.taken(&lease.key);
            }
        }
        drop(st);
        if tracked && let Some(at) = release_at {
            self.release_at(CompactToken::from(&lease.token), lease.serial, at);
        }
        tracked
    }

    /// The next session for one try of an acquire: `Ok(None)` when one of our own sessions
    /// holds `key` already (the lock is busy). A session that ends before the try's statement
    /// ran held nothing, so the acquire may go once more, on another ([`failed`](Self::failed)
    /// says so); `tries` counts them, and after [`PLACE_TRIES`] sessions in a row the acquire
    /// fails (`Connection`, with `doing`).
    ///
    /// # Errors
    /// [`place`](Self::place)'s, and the one above.
    pub async fn place_try(
        &self,
        tries: &mut u32,
        (name, key, token): (&str, &str, &str),
        ttl: Duration,
        doing: &str,
    ) -> Result<Option<PoolLease<O::Conn>>, LockError> {
        if *tries >= PLACE_TRIES {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{doing}: {PLACE_TRIES} sessions in a row ended under the request"),
            ));
        }
        *tries += 1;
        Ok(match self.place(name, key, token, ttl).await? {
            Placement::On(lease) => Some(lease),
            Placement::HeldHere => None,
        })
    }

    /// A try's statement on `lease` failed with `e`. `Ok(())`: its session had ended, so it
    /// took nothing there; try again on another ([`place_try`](Self::place_try)). Otherwise
    /// `e`, once whatever the statement may have taken is given back
    /// ([`withdraw_unknown`](Self::withdraw_unknown)).
    ///
    /// # Errors
    /// `e`, as said.
    pub async fn failed(&self, lease: &PoolLease<O::Conn>, e: LockError) -> Result<(), LockError> {
        if lease.session.is_over() {
            self.withdraw(lease);
            Ok(())
        } else {
            self.withdraw_unknown(lease).await;
            Err(e)
        }
    }

    /// The request did not take the lock (busy, or the session ended under it): its name is
    /// free on the session again.
    pub fn withdraw(&self, lease: &PoolLease<O::Conn>) {
        {
            let mut st = self.state.locked();
            if let Some(s) = st.sessions.get_mut(&lease.session.id) {
                s.placing = s.placing.saturating_sub(1);
            }
            forget(&mut st, lease);
        }
        self.room.notify_waiters();
    }

    /// The request's statement failed, and may have taken the lock: unlock it on the session,
    /// or, if that fails too, close the session (which frees it, with everything else on it).
    pub async fn withdraw_unknown(&self, lease: &PoolLease<O::Conn>) {
        self.unlock_or_close(&lease.session, &lease.key).await;
        self.withdraw(lease);
    }

    /// The lease of `token` on `name`, if the pool holds it.
    pub fn held(&self, name: &str, token: &str) -> Option<PoolLease<O::Conn>> {
        let st = self.state.locked();
        let name = st.name_hash(name);
        st.leases
            .get_key_value(&CompactToken::of(token))
            .filter(|(_, t)| t.held() && t.on(name))
            .map(|(token, t)| t.lease(token))
    }

    /// Records that the held lease of `token` on `name` now holds the server name `key` on the
    /// same session (a writer downgraded to a reader: the engine took the shared hold and gave
    /// the exclusive one back on that session). `false` when the pool has no such lease.
    pub fn rekey(&self, name: &str, token: &str, key: &str) -> bool {
        let mut st = self.state.locked();
        let name = st.name_hash(name);
        let Some(t) = st.lease_mut(token).filter(|t| t.held() && t.on(name)) else {
            return false;
        };
        let key = Key::new(key);
        let old = std::mem::replace(&mut t.key, key.clone());
        let session = t.session.id;
        if let Some(s) = st.sessions.get_mut(&session) {
            s.keys.rename(&old, key);
        }
        true
    }

    /// Releases the lease of `token` on `name` (held, or left behind by an acquire whose outcome
    /// was never learned).
    ///
    /// # Errors
    /// None so far: a session that cannot unlock is closed, which frees the lock.
    pub async fn release(&self, name: &str, token: &str) -> Result<LeaseCheck, LockError> {
        let tracked = {
            let mut st = self.state.locked();
            match st.tracked(name, token) {
                Some(_) => st.forget(token),
                None => None,
            }
        };
        let Some(tracked) = tracked else {
            return Ok(LeaseCheck::Missing);
        };
        Ok(self.release_tracked(tracked).await)
    }

    /// Unlocks a record the pool has let go of: what [`release`](Self::release) answers.
    async fn release_tracked(&self, t: Tracked<O::Conn>) -> LeaseCheck {
        let was = self.unlock_or_close(&t.session, &t.key).await;
        self.unreserve(&t.session, &t.key);
        match was {
            Some(true) => LeaseCheck::Ours,
            // Closed because the unlock failed: the lock went with the session, which held it
            // while it lived.
            None if t.held() => LeaseCheck::Ours,
            _ => LeaseCheck::Missing,
        }
    }

    /// Unlocks the server name `key` on `session`: whether it was held there, `None` when the
    /// session had to be closed instead (or had ended).
    async fn unlock_or_close(&self, session: &Session<O::Conn>, key: &str) -> Option<bool> {
        if session.is_over() {
            return Some(false);
        }
        match self.ops.unlock(&session.conn, key).await {
            Ok(was) => Some(was),
            Err(_) if session.is_over() => Some(false),
            // The session may be ending right now (the server timed it out, or terminated it),
            // its reader about to say why: that reason, not ours, for the locks on it.
            Err(_)
                if tokio::time::timeout(ENDING_GRACE, session.end.wait())
                    .await
                    .is_ok() =>
            {
                Some(false)
            }
            Err(e) => {
                tracing::warn!(target: "distlock", key, error = %e,
                    "could not unlock on a shared session: closing it, and every lock on it");
                self.close(session, LostReason::Unreachable);
                None
            }
        }
    }

    /// Ends a session now, for `why`: every lease on it is lost.
    pub fn close(&self, session: &Session<O::Conn>, why: LostReason) {
        session.end.end(why);
        self.ops.close(&session.conn);
        self.state.locked().sessions.remove(&session.id);
        self.room.notify_waiters();
    }

    fn unreserve(&self, session: &Session<O::Conn>, key: &str) {
        {
            let mut st = self.state.locked();
            if let Some(s) = st.sessions.get_mut(&session.id) {
                s.keys.remove(key);
                if s.keys.is_empty() {
                    s.empty_since = Some(Instant::now());
                }
            }
        }
        self.room.notify_waiters();
    }

    /// Renews every item: one keep-alive statement per session, all at once. (A chunk of the
    /// watchdog's batch at a time: engines on this pool take [`RENEW_CHUNK`] leases a chunk.)
    pub async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        // Per session: the items on it and the longest TTL asked.
        let mut groups: HashMap<u64, Group<O::Conn>> = HashMap::new();
        // The pool's lock is taken per step, not for the whole call (16,384 lookups, a
        // millisecond or two): an acquire or a release in between waits for one step at most.
        for (step, chunk) in items.chunks(LOOKUPS_PER_LOCK).enumerate() {
            let st = self.state.locked();
            for (j, item) in chunk.iter().enumerate() {
                let i = step * LOOKUPS_PER_LOCK + j;
                let lease = &item.lease;
                match st.tracked(lease.name, lease.token.as_str()) {
                    Some(t) if t.held() && !t.session.is_over() => {
                        let g = groups
                            .entry(t.session.id)
                            .or_insert_with(|| (t.session.clone(), Vec::new(), Duration::ZERO));
                        g.1.push(i);
                        g.2 = g.2.max(item.ttl);
                    }
                    _ => out[i] = Some(Ok(LeaseCheck::Missing)),
                }
            }
        }
        let pings = groups.into_values().map(|(session, idx, ttl)| async move {
            let sent = Instant::now();
            self.keepalives.fetch_add(1, Ordering::Relaxed);
            let keep = || self.keep_for(&session, ttl);
            let r = self.ops.ping(&session.conn, &keep).await;
            (session, idx, sent, r)
        });
        for (session, idx, sent, r) in futures_util::future::join_all(pings).await {
            for i in idx {
                out[i] = Some(match &r {
                    Ok(()) => {
                        self.renewed(&items[i], sent);
                        Ok(LeaseCheck::Ours)
                    }
                    // The session is gone, and its locks with it.
                    Err(_) if session.is_over() => Ok(LeaseCheck::Missing),
                    Err(e) => Err(LockError::new(e.kind(), e.message().to_owned())),
                });
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Ok(LeaseCheck::Missing)))
            .collect()
    }

    /// [`renew_many`](Self::renew_many), or, when the seeded bug `bug` (one of the
    /// `*-session-held` bugs, test-only) is on, the same with every lock whose session ended
    /// taken as still held.
    pub async fn renew_many_seeded(
        &self,
        items: &[RenewItem<'_>],
        bug: crate::seeded::SeededBug,
    ) -> Vec<Result<LeaseCheck, LockError>> {
        let mut out = self.renew_many(items).await;
        if crate::seeded::on(bug) {
            for (r, item) in out.iter_mut().zip(items) {
                if matches!(r, Ok(LeaseCheck::Missing))
                    && self
                        .held(item.lease.name, item.lease.token.as_str())
                        .is_some()
                {
                    *r = Ok(LeaseCheck::Ours);
                }
            }
        }
        out
    }

    /// [`session_end`](Self::session_end), or nothing when the seeded bug `bug` is on.
    pub fn session_end_seeded(&self, token: &str, bug: crate::seeded::SeededBug) -> SessionWatch {
        if crate::seeded::on(bug) {
            return SessionWatch::Never;
        }
        self.session_end(token)
    }

    /// A lease the client releases by itself was renewed (extended): its release moves.
    fn renewed(&self, item: &RenewItem<'_>, sent: Instant) {
        let moved = {
            let mut st = self.state.locked();
            match st.lease_mut(item.lease.token.as_str()) {
                Some(t) if t.release_at.is_some() => {
                    t.set_release_at(Some(sent + item.ttl));
                    Some(t.serial)
                }
                _ => None,
            }
        };
        if let Some(serial) = moved {
            self.release_at(
                CompactToken::of(item.lease.token.as_str()),
                serial,
                sent + item.ttl,
            );
        }
    }

    /// The session holding the lease of `token`, shared with the other leases on it; nothing
    /// if there is none.
    pub fn session_end(&self, token: &str) -> SessionWatch {
        match self.state.locked().lease(token) {
            Some(t) => SessionWatch::Shared {
                session: t.session.id,
                end: t.session.end.clone(),
            },
            None => SessionWatch::Never,
        }
    }

    /// Whether the lease of `token` is on `session` (see
    /// [`Sessions::still_on`](crate::engine::Sessions::still_on)). Only while the pool still tracks
    /// it: one the client released by itself at its deadline (nobody renewed it) ended then, as
    /// expired, whatever its session does after.
    pub fn still_on(&self, token: &str, session: u64) -> bool {
        self.state
            .locked()
            .lease(token)
            .is_some_and(|t| t.session.id == session)
    }

    /// Its holder no longer renews the lease of `token` on `name`: the client releases it
    /// `ttl` from now (at once for zero).
    pub fn detach(&self, name: &str, token: &str, ttl: Duration) {
        let at = Instant::now() + ttl;
        let lease = {
            let mut st = self.state.locked();
            let name = st.name_hash(name);
            match st.lease_mut(token) {
                Some(t) if t.held() && t.on(name) => {
                    let at = t.release_at().map_or(at, |r| r.min(at));
                    t.set_release_at(Some(at));
                    Some((t.serial, at))
                }
                _ => None,
            }
        };
        if let Some((serial, at)) = lease {
            self.release_at(CompactToken::of(token), serial, at);
        }
    }

    /// Releases the lease of `token` (placement `serial`) at `at`, unless it is released or
    /// its release moves before.
    fn release_at(&self, token: CompactToken, serial: u64, at: Instant) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.me.clone();
        rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(pool) = pool.upgrade() else { return };
            let due = {
                let mut st = pool.state.locked();
                let due = st
                    .leases
                    .get(&token)
                    .is_some_and(|t| t.serial == serial && t.release_due(at));
                if due { st.leases.remove(&token) } else { None }
            };
            if let Some(t) = due {
                pool.release_tracked(t).await;
            }
        });
    }

    /// Any open session, for a read (a status): the least busy one, or a new one.
    ///
    /// # Errors
    /// The engine's when a session cannot be opened; `Exhausted` at the cap with none open.
    pub async fn any_session(&self) -> Result<Arc<Session<O::Conn>>, LockError> {
        {
            let st = self.state.locked();
            if let Some(s) = st
                .sessions
                .values()
                .filter(|s| !s.session.is_over())
                .min_by_key(|s| s.placing)
            {
                return Ok(s.session.clone());
            }
        }
        // Opened as a session of its own; it joins the pool.
        match self.place("", "", "", Duration::ZERO).await? {
            Placement::On(lease) => {
                let session = lease.session.clone();
                self.withdraw(&lease);
                Ok(session)
            }
            Placement::HeldHere => unreachable!("no lease is placed under the empty key"),
        }
    }

    /// Closes sessions that have stayed empty for half their idle timeout.
    fn sweep_once(&self) {
        let now = Instant::now();
        let stale: Vec<Arc<Session<O::Conn>>> = {
            let st = self.state.locked();
            st.sessions
                .values()
                .filter(|s| s.keys.is_empty() && s.placing == 0)
                .filter(|s| {
                    let limit = s.timeout.map_or(EMPTY_UNTIMED, |t| t / 2);
                    s.empty_since.is_some_and(|e| now >= e + limit) || s.session.is_over()
                })
                .map(|s| s.session.clone())
                .collect()
        };
        for s in stale {
            self.close(&s, LostReason::Expired);
        }
    }
}

impl<O: SessionOps> Drop for SessionPool<O> {
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for s in st.sessions.values() {
            self.ops.close(&s.session.conn);
        }
    }
}

async fn sweep<O: SessionOps>(pool: Weak<SessionPool<O>>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(pool) = pool.upgrade() else { return };
        pool.sweep_once();
    }
}

mod key;
mod names;
mod place;
mod record;
use names::Names;
use record::Tracked;

use key::Key;

pub use place::SHARED_PREFIX;
use place::{Choice, choose, forget, reserve};

#[cfg(test)]
mod tests;
