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
//!   [`ErrorKind::Exhausted`](crate::ErrorKind::Exhausted);
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
use crate::error::LockError;
use crate::sync::MutexExt;
use crate::token::{CompactToken, Token};
use std::hash::BuildHasher;

/// The leases of one renewal call ([`BatchRenew::max_batch`](crate::engine::BatchRenew::max_batch))
/// for an engine on this pool. A call costs one statement per session it touches, however many
/// leases it carries: at the default 1,024, a client holding 100,000 locks on 8 sessions sent a
/// hundred keep-alives a tick where eight do, and each costs the server a walk of that
/// session's locks (PostgreSQL). What a call builds is about 100 bytes a lease.
pub const RENEW_CHUNK: usize = 16_384;

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
#[async_trait::async_trait]
pub trait SessionOps: Send + Sync + 'static {
    /// One open session.
    type Conn: Send + Sync + 'static;

    /// Opens a session. The engine tells `end` when the session ends by itself (the server
    /// closed it, timed it out, or terminated it), with the reason, as soon as it learns it.
    async fn open(&self, end: SessionEnd) -> Result<Self::Conn, LockError>;

    /// Ends the session now: the server frees every lock on it.
    fn close(&self, conn: &Self::Conn);

    /// Releases the server lock `key` that this session holds: whether it held it.
    async fn unlock(&self, conn: &Self::Conn, key: &str) -> Result<bool, LockError>;

    /// A statement that sets the session's idle timeout to `keep()` and so keeps it (and every
    /// lock on it) alive at least that long from when it is sent. The engine calls `keep` at
    /// the last moment, in the order its statements reach the session (see
    /// [`SessionPool::keep_for`]).
    async fn ping(
        &self,
        conn: &Self::Conn,
        keep: &(dyn Fn() -> Duration + Send + Sync),
    ) -> Result<(), LockError>;
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

    /// The lease of `token` on `name`, if the pool holds it.
    pub fn held(&self, name: &str, token: &str) -> Option<PoolLease<O::Conn>> {
        let st = self.state.locked();
        let name = st.name_hash(name);
        st.leases
            .get_key_value(&CompactToken::of(token))
            .filter(|(_, t)| t.held() && t.on(name))
            .map(|(token, t)| t.lease(token))
    }

    /// Whether `req` is a resend (see [`AcquireMode::Resend`](crate::engine::AcquireMode)) of
    /// an attempt that took its lock after all: the lease is held on a session that lives.
    /// The engine then answers `Acquired` without sending anything (a session's lock counts
    /// its acquisitions, and must not be taken twice).
    pub fn resent_and_held(&self, req: &crate::engine::AcquireRequest<'_>) -> bool {
        req.mode.is_resend()
            && self
                .held(req.name, req.token.as_str())
                .is_some_and(|lease| !lease.session().is_over())
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
}

mod acquire;
mod capability;
mod close;
mod key;
mod names;
mod place;
mod record;
mod release;
mod renew;
use close::sweep;
use names::Names;
use record::Tracked;

use key::Key;

pub use place::SHARED_PREFIX;

#[cfg(test)]
mod tests;
