//! The engine interface: what a lock engine supplies, and nothing more.
//!
//! An engine implements four primitives on named leases ([`Backend`]): **acquire** a lease of a
//! given [`LeaseKind`], **renew** it, **release** it, and **inspect** who holds a name. Anything
//! beyond them is an optional capability with a trait of its own, which the engine exposes
//! through a getter on [`Backend`] when it has it:
//!
//! | capability | trait | engines that have it |
//! |---|---|---|
//! | renew many leases in one round trip | [`BatchRenew`] | Redis (a pipeline), etcd and the databases (one session keep-alive) |
//! | wake waiters when a lock is released | [`WakeSource`] | Redis (pub/sub), etcd and ZooKeeper (watches), PostgreSQL (`LISTEN`/`NOTIFY`, releases only), the file engine on Linux (inotify) |
//! | a session whose end ends its leases | [`Sessions`] | etcd (a lease per session), ZooKeeper, PostgreSQL and MySQL (a connection, many locks on each: the session pool of `recipes::pool`) |
//! | hand a released lock to the next waiting client on the server | [`Handover`] | Redis |
//! | break a lock whoever holds it (an operator's break-glass) | [`Breaker`] | all but memcached's weakest cases |
//! | write a new label for a holder, the lease kept (an election's new value) | [`Relabel`] | Redis (single, Sentinel, Cluster), etcd, ZooKeeper, PostgreSQL, MySQL, the file engine |
//! | take several names at once, all or none (`lock_many`) | [`MultiLock`] | the file engine, Redis (single, Sentinel, Cluster within one slot, Redlock), etcd, ZooKeeper, PostgreSQL and MySQL (a session of their own), memcached (ordered, with rollback) |
//! | list the locks it holds (`distlock list`) | [`Lister`] | Redis (single, Sentinel, Cluster, Redlock), etcd, ZooKeeper, PostgreSQL and MySQL (the names their clients record), the file engine |
//!
//! Waiting, the watchdog, in-process queues, hand-off between tasks, guards and the lost signal
//! are written once in the core, on top of these. `docs/architecture.md` shows the layers and
//! how to add an engine.

mod capability;
mod many;
mod session;
pub(crate) mod wake;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use capability::{
    BatchRenew, BreakOutcome, Breaker, Downgrade, Handover, Linger, Listener, Lister, Names,
    NextWaiter, Relabel, Sessions, WakeSource,
};
pub use many::{AcquireMany, ManyAttempt, MultiLock, combine_checks};
pub(crate) use many::{MANY_MARK, many_key, many_names, shown_names};
pub use session::{SessionEnd, SessionWatch};

pub use crate::clock::Clock;
pub use crate::error::{ErrorKind, LockError};
pub use crate::token::Token;
pub use wake::Subscription;

/// Why a lease was lost: it ended while its holder still counted on it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The lease ran out: the engine had no lock for us, or the local deadline passed with no
    /// renewal (watchdog off, or renewal too late).
    Expired,
    /// Someone else removed or replaced our lock: another owner's token was found under the
    /// key, or the key was gone while our lease should still have been running (an external
    /// `DEL`, a flush, a server restart without persistence).
    Stolen,
    /// Renewals kept failing (engine unreachable) until the local deadline passed.
    Unreachable,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::Stolen => "another owner holds the lock",
            LostReason::Unreachable => "the lock engine was unreachable until the lease ran out",
        })
    }
}

/// The kind of lease a request asks for.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// Excludes every other holder (a mutex, or a read-write lock's writer).
    Exclusive,
    /// Shares the name with other shared leases and excludes exclusive ones (a reader).
    Shared,
    /// One of `permits` leases that may be held at once (a counting semaphore).
    Permit {
        /// How many may be held at once.
        permits: u32,
    },
}

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

impl LeaseKind {
    /// A short name for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            LeaseKind::Exclusive => "exclusive",
            LeaseKind::Shared => "shared",
            LeaseKind::Permit { .. } => "permit",
        }
    }

    /// The kind as stores write it beside a lease (a key's value, a node's name): empty for an
    /// exclusive lease (so a mutex's stored form is unchanged), `r` for a shared one, `p<N>` for
    /// one of N permits.
    pub fn tag(self) -> String {
        match self {
            LeaseKind::Exclusive => String::new(),
            LeaseKind::Shared => "r".to_owned(),
            LeaseKind::Permit { permits } => format!("p{permits}"),
        }
    }

    /// Reads a [`tag`](Self::tag); `None` for a tag no version of distlock writes.
    pub fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "" => Some(LeaseKind::Exclusive),
            "r" => Some(LeaseKind::Shared),
            _ => {
                let n = tag.strip_prefix('p')?;
                if !n.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let permits = n.parse().ok().filter(|p| (1..=MAX_PERMITS).contains(p))?;
                Some(LeaseKind::Permit { permits })
            }
        }
    }

    /// Checks a kind asked for by a user: a semaphore has 1 to [`MAX_PERMITS`] permits.
    ///
    /// # Errors
    /// `Config` for 0 permits or more than [`MAX_PERMITS`].
    pub fn validate(self) -> Result<Self, LockError> {
        match self {
            LeaseKind::Permit { permits } if !(1..=MAX_PERMITS).contains(&permits) => {
                Err(LockError::new(
                    crate::error::ErrorKind::Config,
                    format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
                ))
            }
            k => Ok(k),
        }
    }

    /// Whether two leases of these kinds may be held at once on one name (before counting
    /// permits): shared with shared, permit with permit of the same capacity.
    pub fn compatible(self, other: LeaseKind) -> bool {
        match (self, other) {
            (LeaseKind::Shared, LeaseKind::Shared) => true,
            (LeaseKind::Permit { permits: a }, LeaseKind::Permit { permits: b }) => a == b,
            _ => false,
        }
    }
}

/// How an acquire attempt is sent: what the engine may do when the lock is busy, and whether
/// an earlier send of the same request may have taken it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcquireMode {
    /// A try by a caller that does not wait (or has not yet begun to): the engine takes its
    /// cheapest path and leaves nothing behind when the lock is busy.
    Try,
    /// A waiter's attempt: the engine may queue this token for the lock (and hand it over, or
    /// wake it, when its turn comes), and should report the holder's remaining lease.
    Wait,
    /// A resend of a request whose reply was lost, with the same token: the lease may already
    /// be ours, so a path that cannot tell (a plain create-if-absent) must not be taken.
    /// `wait`: the request resent was a waiter's ([`Wait`](Self::Wait)).
    Resend {
        /// The request resent was a waiter's.
        wait: bool,
    },
}

impl AcquireMode {
    /// Whether the caller waits if the lock is busy ([`Wait`](Self::Wait), or its resend).
    pub fn waits(self) -> bool {
        matches!(self, AcquireMode::Wait | AcquireMode::Resend { wait: true })
    }

    /// Whether this is a resend ([`Resend`](Self::Resend)).
    pub fn is_resend(self) -> bool {
        matches!(self, AcquireMode::Resend { .. })
    }

    /// The same request, resent.
    #[must_use]
    pub fn resent(self) -> Self {
        AcquireMode::Resend { wait: self.waits() }
    }
}

/// One acquire request, as handed to an engine.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The lock's name (validated by the core).
    pub name: &'a str,
    /// The kind of lease asked for.
    pub kind: LeaseKind,
    /// Our token. A resend of a request whose reply was lost carries the same token.
    pub token: &'a Token,
    /// The lease to ask for.
    pub ttl: Duration,
    /// A label naming the holder (host/pid by default), shown by `status`.
    pub owner: &'a str,
    /// How this attempt is sent: a first try, a waiter's, or a resend (see [`AcquireMode`]).
    pub mode: AcquireMode,
    /// The holder renews this lease while it holds it (the watchdog is on). An engine with
    /// sessions may put such a lease on a session it keeps alive for many leases at once; a
    /// lease that is not renewed must end by itself `ttl` after it was taken, whatever else
    /// the client holds.
    pub renewed: bool,
    /// The clock the core measures lease deadlines on: an engine that keeps time of its own
    /// (a lease's age, a keep-alive's) reads it here, so an injected clock governs it too.
    pub clock: &'a Arc<dyn Clock>,
    /// [`inspect`](Backend::inspect) must give this holder's own fence while it holds the
    /// lease (an election's epoch): an engine that records it only on some paths takes one
    /// that does.
    pub recorded: bool,
    /// `name` as the core keeps it for the lease (see [`name_arc`](Self::name_arc)).
    shared_name: Option<&'a Arc<str>>,
}

impl<'a> AcquireRequest<'a> {
    /// An exclusive lease on `name` for `token`, of `ttl`, labelled `owner`.
    pub fn new(
        name: &'a str,
        token: &'a Token,
        ttl: Duration,
        owner: &'a str,
        clock: &'a Arc<dyn Clock>,
    ) -> Self {
        AcquireRequest {
            name,
            kind: LeaseKind::Exclusive,
            token,
            ttl,
            owner,
            mode: AcquireMode::Try,
            renewed: false,
            clock,
            recorded: false,
            shared_name: None,
        }
    }

    /// Gives the name as the core keeps it, for [`name_arc`](Self::name_arc) to share; `name`
    /// must be that string.
    #[must_use]
    pub fn shared_name(mut self, name: &'a Arc<str>) -> Self {
        debug_assert_eq!(**name, *self.name);
        self.shared_name = Some(name);
        self
    }

    /// The lock's name for an engine to keep: the core's own copy, which its lease and local
    /// queue share, when the core gave it (one allocation a held lock rather than two), else a
    /// new one. A name kept so is also the one [`LeaseRef::name`] points to for that lease (a
    /// map keyed by it shares the lease's allocation).
    pub fn name_arc(&self) -> Arc<str> {
        match self.shared_name {
            Some(name) if **name == *self.name => name.clone(),
            _ => Arc::from(self.name),
        }
    }

    /// Says whether `inspect` must give this holder's fence (see
    /// [`AcquireRequest::recorded`]).
    #[must_use]
    pub fn recorded(mut self, recorded: bool) -> Self {
        self.recorded = recorded;
        self
    }

    /// Labels the holder `owner` (instead of the client's label).
    #[must_use]
    pub fn owner(mut self, owner: &'a str) -> Self {
        self.owner = owner;
        self
    }

    /// Asks for a lease of another kind.
    #[must_use]
    pub fn kind(mut self, kind: LeaseKind) -> Self {
        self.kind = kind;
        self
    }

    /// Sends it in `mode` (see [`AcquireMode`]).
    #[must_use]
    pub fn mode(mut self, mode: AcquireMode) -> Self {
        self.mode = mode;
        self
    }

    /// Says whether the holder renews the lease (see [`AcquireRequest::renewed`]).
    #[must_use]
    pub fn renewed(mut self, renewed: bool) -> Self {
        self.renewed = renewed;
        self
    }

    /// The lease this request asks for, as renewals and releases name it.
    pub fn lease(&self) -> LeaseRef<'a> {
        LeaseRef::new(self.name, self.token, self.kind).recorded(self.recorded)
    }
}

/// A lease as renewals and releases name it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeaseRef<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// Our token.
    pub token: &'a Token,
    /// The lease's kind.
    pub kind: LeaseKind,
    /// It was taken as a recorded holder (an election's leader, see
    /// [`AcquireRequest::recorded`]): an engine that can watch its own key tells
    /// [`Sessions::session_end`] of the key's removal at once.
    pub recorded: bool,
}

impl<'a> LeaseRef<'a> {
    /// The lease of `token` on `name`, of `kind`.
    pub fn new(name: &'a str, token: &'a Token, kind: LeaseKind) -> Self {
        LeaseRef {
            name,
            token,
            kind,
            recorded: false,
        }
    }

    /// Marks it as a recorded holder's (see [`LeaseRef::recorded`]).
    #[must_use]
    pub fn recorded(mut self, recorded: bool) -> Self {
        self.recorded = recorded;
        self
    }
}

/// One lease to renew in a batch ([`BatchRenew::renew_many`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RenewItem<'a> {
    /// The lease.
    pub lease: LeaseRef<'a>,
    /// The new lease, from the moment the batch is sent.
    pub ttl: Duration,
}

impl<'a> RenewItem<'a> {
    /// A renewal of `lease` to `ttl`.
    pub fn new(lease: LeaseRef<'a>, ttl: Duration) -> Self {
        RenewItem { lease, ttl }
    }
}

/// What one acquire attempt found.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The lease is ours, counted from when this request was sent: newly taken, or already
    /// ours with this token (a resent request).
    Acquired {
        /// The fencing token, if the engine gives a correct one.
        fence: Option<u64>,
    },
    /// The lease is ours, but it is counted from `age` ago rather than from when this request
    /// was sent: it was written for this token by another client's release (a server-side
    /// hand-over, [`Handover`]), or it lives on a session lease the engine granted or last
    /// refreshed at that time. The core counts the lease from `age` ago, or renews it before
    /// use when `age` is unknown, too old, or `ttl` is not the one asked.
    AcquiredEarlier {
        /// The fencing token, if the engine gives a correct one.
        fence: Option<u64>,
        /// The lease was written (or last refreshed) at most this long ago; `None` when the
        /// engine cannot bound it.
        age: Option<Duration>,
        /// The TTL it was written with.
        ttl: Duration,
    },
    /// Someone else holds it.
    Busy {
        /// The holder's remaining lease, when the engine knows it.
        holder_ttl: Option<Duration>,
    },
}

/// What the engine found under the name when we renewed or released a lease.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCheck {
    /// It held our token (and the operation was applied).
    Ours,
    /// There was no lease of ours: it had expired, or was removed.
    Missing,
    /// Another owner's token was there: our lease expired and someone else took the lock.
    Foreign,
}

/// What `status` reports about a name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockStatus {
    /// Whether anybody holds the lock.
    pub held: bool,
    /// The holder's label (host/pid and since when), if known.
    pub owner: Option<String>,
    /// The holder's fencing token, when the engine recorded it.
    pub fence: Option<u64>,
    /// No fence above this has been issued for this name so far, when the engine keeps a
    /// counter: the holder's fence is at most this. It is the last fence issued where the
    /// engine counts one by one (Redis, PostgreSQL), and the end of the block handed out so far
    /// where a sequence hands fences out from a cache (MariaDB). Engines that do not record the
    /// holder's own fence report only this.
    pub last_fence: Option<u64>,
    /// The holder's remaining lease, if the lease expires.
    pub ttl: Option<Duration>,
    /// Every holder, oldest first where the engine knows the order: one for a mutex or a
    /// writer, one per reader or permit. (`owner`, `fence` and `ttl` above are the first's.)
    pub holders: Vec<HolderStatus>,
    /// How many clients wait for the name, where the engine can tell (a queue it keeps).
    pub waiters: Option<u64>,
}

/// One holder of a name, as [`LockStatus::holders`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderStatus {
    /// The kind of its lease: exclusive (a mutex or a writer), shared (a reader), or a permit.
    pub kind: LeaseKind,
    /// The token stored for it, where the engine stores one.
    pub token: Option<String>,
    /// Its label (host/pid and since when), if known.
    pub owner: Option<String>,
    /// Its fencing token, when the engine recorded it.
    pub fence: Option<u64>,
    /// Its remaining lease, if the lease expires.
    pub ttl: Option<Duration>,
}

impl HolderStatus {
    /// A holder of `kind`.
    pub fn new(kind: LeaseKind) -> Self {
        HolderStatus {
            kind,
            token: None,
            owner: None,
            fence: None,
            ttl: None,
        }
    }

    /// With its token.
    #[must_use]
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// With its label.
    #[must_use]
    pub fn owner(mut self, owner: Option<String>) -> Self {
        self.owner = owner;
        self
    }

    /// With its fence.
    #[must_use]
    pub fn fence(mut self, fence: Option<u64>) -> Self {
        self.fence = fence;
        self
    }

    /// With its remaining lease.
    #[must_use]
    pub fn ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }
}

impl LockStatus {
    /// Nobody holds the lock.
    pub fn free() -> Self {
        LockStatus::default()
    }

    /// The lock is held, by one exclusive holder.
    pub fn held(owner: Option<String>, fence: Option<u64>, ttl: Option<Duration>) -> Self {
        let holder = HolderStatus::new(LeaseKind::Exclusive)
            .owner(owner.clone())
            .fence(fence)
            .ttl(ttl);
        LockStatus {
            held: true,
            owner,
            fence,
            last_fence: None,
            ttl,
            holders: vec![holder],
            waiters: None,
        }
    }

    /// Held by `holders` (free when there are none); the first is the one `owner`, `fence` and
    /// `ttl` describe.
    pub fn held_by(holders: Vec<HolderStatus>) -> Self {
        let first = holders.first();
        LockStatus {
            held: first.is_some(),
            owner: first.and_then(|h| h.owner.clone()),
            fence: first.and_then(|h| h.fence),
            last_fence: None,
            ttl: first.and_then(|h| h.ttl),
            holders,
            waiters: None,
        }
    }

    /// The same status, with the one holder's token and kind (an engine that reads them
    /// besides the label).
    #[must_use]
    pub fn with_holder(mut self, kind: LeaseKind, token: Option<String>) -> Self {
        if let Some(h) = self.holders.first_mut() {
            h.kind = kind;
            h.token = token;
        }
        self
    }

    /// The same status, with the number of waiting clients.
    #[must_use]
    pub fn with_waiters(mut self, waiters: Option<u64>) -> Self {
        self.waiters = waiters;
        self
    }

    /// The same status, with the highest fence issued so far.
    #[must_use]
    pub fn with_last_fence(mut self, last_fence: Option<u64>) -> Self {
        self.last_fence = last_fence;
        self
    }
}

/// Whether an engine gives fencing tokens, and why not when it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Every new holder gets a strictly greater number than every earlier holder.
    Monotonic,
    /// No correct token can be given; the reason is shown to users.
    Unavailable(&'static str),
}

/// Whether an engine can do one thing, and why not when it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// It can.
    Yes,
    /// It cannot; the reason is shown to users (in the `Unsupported` error).
    No(&'static str),
}

impl Support {
    /// Whether it can.
    pub fn is_yes(self) -> bool {
        self == Support::Yes
    }
}

/// What an engine cannot do unless it says so.
const NOT_IMPLEMENTED: &str = "not implemented for this engine in this release";

/// What an engine's primitives can do, and why not where they cannot (its optional
/// capabilities are the getters of [`Backend`]; the reasons their absence is shown with are
/// here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Fencing tokens.
    pub fencing: Fencing,
    /// Whether the engine expires a lease by itself after its TTL (Redis: yes). Session engines
    /// (the file lock) free the lock when the holder's process or session ends instead.
    pub expiring: bool,
    /// Whether [`LeaseKind::Shared`] leases can be acquired.
    pub shared: Support,
    /// Whether [`LeaseKind::Permit`] leases can be acquired.
    pub permits: Support,
    /// Whether the engine serves waiting clients in arrival order, across kinds: a waiting
    /// writer holds back the readers that come after it, and permits go first come, first
    /// served (etcd, ZooKeeper: a queue in the store). Without it, whoever tries first when a
    /// lease is freed gets it.
    pub ordered: bool,
    /// Why the engine cannot turn a writer into a reader, when [`Backend::downgrade`] gives
    /// nothing.
    pub why_no_downgrade: &'static str,
    /// Why the engine cannot list its locks, when [`Backend::lister`] gives nothing.
    pub why_no_list: &'static str,
    /// Why the engine cannot write a new label for a holder, when [`Backend::relabel`] gives
    /// nothing.
    pub why_no_relabel: &'static str,
    /// Why the engine cannot take several names at once, when [`Backend::multi_lock`] gives
    /// nothing.
    pub why_no_many: &'static str,
}

impl Capabilities {
    /// Exclusive leases only, with `fencing`; `expiring` as [`Capabilities::expiring`].
    pub fn new(fencing: Fencing, expiring: bool) -> Self {
        Capabilities {
            fencing,
            expiring,
            shared: Support::No(NOT_IMPLEMENTED),
            permits: Support::No(NOT_IMPLEMENTED),
            ordered: false,
            why_no_downgrade: "this engine cannot turn a writer into a reader in one step",
            why_no_list: "this engine cannot list its locks",
            why_no_relabel: "this engine cannot write a new label for a holder in place",
            why_no_many: NOT_IMPLEMENTED,
        }
    }

    /// Says the engine serves waiters in arrival order (see [`Capabilities::ordered`]).
    #[must_use]
    pub fn with_order(mut self) -> Self {
        self.ordered = true;
        self
    }

    /// Says the engine acquires shared leases too.
    #[must_use]
    pub fn with_shared(mut self) -> Self {
        self.shared = Support::Yes;
        self
    }

    /// Says the engine acquires permits too.
    #[must_use]
    pub fn with_permits(mut self) -> Self {
        self.permits = Support::Yes;
        self
    }

    /// Says why the engine acquires no lease of the kinds besides exclusive that it does not
    /// support (shown in the `Unsupported` error).
    #[must_use]
    pub fn other_kinds_because(mut self, why: &'static str) -> Self {
        for s in [&mut self.shared, &mut self.permits] {
            if !s.is_yes() {
                *s = Support::No(why);
            }
        }
        self
    }

    /// Says why the engine acquires no permits (shown in the `Unsupported` error).
    #[must_use]
    pub fn no_permits_because(mut self, why: &'static str) -> Self {
        self.permits = Support::No(why);
        self
    }

    /// Says why the engine cannot downgrade a writer (see [`Capabilities::why_no_downgrade`]).
    #[must_use]
    pub fn no_downgrade_because(mut self, why: &'static str) -> Self {
        self.why_no_downgrade = why;
        self
    }

    /// Says why the engine cannot list its locks (see [`Capabilities::why_no_list`]).
    #[must_use]
    pub fn no_list_because(mut self, why: &'static str) -> Self {
        self.why_no_list = why;
        self
    }

    /// Says why the engine cannot take several names at once (see
    /// [`Capabilities::why_no_many`]).
    #[must_use]
    pub fn no_many_because(mut self, why: &'static str) -> Self {
        self.why_no_many = why;
        self
    }

    /// Whether a lease of `kind` can be acquired, and why not when it cannot.
    pub fn support(&self, kind: LeaseKind) -> Support {
        match kind {
            LeaseKind::Shared => self.shared,
            LeaseKind::Permit { .. } => self.permits,
            LeaseKind::Exclusive => Support::Yes,
        }
    }

    /// Whether a lease of `kind` can be acquired.
    pub fn supports(&self, kind: LeaseKind) -> bool {
        self.support(kind).is_yes()
    }
}

/// What a [`LockClient`](crate::LockClient) can be built on: an engine, or one chosen at run time
/// (`Arc<dyn Backend>`, as `distlock::connect` opens from a URL; an `Arc` of an engine also
/// lets a program keep its own handle on it).
pub trait IntoBackend {
    /// The engine, shared.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

impl fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Backend").field(&self.name()).finish()
    }
}

/// Writes, inside an engine's `impl Backend`, the getters of the capabilities it has, each
/// giving the engine itself as that capability's trait: one line that says what the engine
/// can do, where each getter took three.
///
/// ```ignore
/// impl Backend for MyEngine {
///     // name, capabilities and the four primitives ...
///     distlock_core::capability_getters!(batch_renew: BatchRenew, breaker: Breaker);
/// }
/// ```
#[macro_export]
macro_rules! capability_getters {
    ($($getter:ident: $capability:ident),+ $(,)?) => {
        $(
            fn $getter(&self) -> ::core::option::Option<&dyn $crate::engine::$capability> {
                ::core::option::Option::Some(self)
            }
        )+
    };
}

/// A boxed, `Send` future (a session's end, a queue entry's removal: futures kept for later).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The attribute that the engine traits and their implementations carry: it writes each
/// `async fn` as a method returning a boxed `Send` future, so that the traits stay
/// object-safe (a client holds its engine as `dyn Backend`). An engine outside this workspace
/// uses it from here, with no dependency of its own:
///
/// ```text
/// #[distlock_core::engine::async_trait]
/// impl Backend for MyEngine {
///     async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> { … }
///     …
/// }
/// ```
pub use async_trait::async_trait;

/// The primitives a lock engine supplies, and the getters of its optional capabilities.
///
/// Every method takes `&self` and may be called concurrently. `acquire` must be idempotent for
/// a repeated token (a resend after a lost reply), and `renew` and `release` must compare the
/// token before changing anything.
///
/// The trait is object-safe: a [`LockClient`](crate::LockClient) holds its engine as
/// `dyn Backend`, so that one client type serves every engine. The trait and its
/// implementations carry [`#[async_trait]`](macro@async_trait), which boxes each `async fn`'s future,
/// as it does the capability traits'.
#[async_trait::async_trait]
pub trait Backend: std::any::Any + Send + Sync {
    /// A short engine name for logs and errors ("redis", "file").
    fn name(&self) -> &'static str;

    /// What this engine's primitives can do.
    fn capabilities(&self) -> Capabilities;

    /// One attempt to take a lease. A kind the engine does not support is `Unsupported`.
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError>;

    /// Renews our lease to `ttl` from now, if it is still ours.
    ///
    /// An engine with [`BatchRenew`] need not write it: by default it is a batch of one lease.
    /// An engine without it must.
    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let Some(batch) = self.batch_renew() else {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine renews no lease: it implements neither `renew` nor \
                     `BatchRenew`",
                    self.name()
                ),
            ));
        };
        let item = [RenewItem::new(*lease, ttl)];
        batch
            .renew_many(&item)
            .await
            .pop()
            .unwrap_or(Ok(LeaseCheck::Missing))
    }

    /// Ends our lease, if it is still ours.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError>;

    /// Who holds `name`, if anybody.
    async fn inspect(&self, name: &str) -> Result<LockStatus, LockError>;

    /// Renewal of many leases in one round trip, if the engine can.
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        None
    }

    /// Release events for waiters, if the engine has them.
    fn wake_source(&self) -> Option<&dyn WakeSource> {
        None
    }

    /// Sessions whose end ends their leases, if the engine has them.
    fn sessions(&self) -> Option<&dyn Sessions> {
        None
    }

    /// A server-side queue of waiting clients that releases hand the lock to, if the engine
    /// has one.
    fn handover(&self) -> Option<&dyn Handover> {
        None
    }

    /// Breaking a lock whoever holds it, if the engine can.
    fn breaker(&self) -> Option<&dyn Breaker> {
        None
    }

    /// Turning a writer into a reader without a gap, if the engine can.
    fn downgrade(&self) -> Option<&dyn Downgrade> {
        None
    }

    /// Leaving a lease to run out by itself at a chosen time after its holder has gone, if
    /// the engine's leases can outlive their holder's process.
    fn linger(&self) -> Option<&dyn Linger> {
        None
    }

    /// Listing the locks held on the engine, if it can.
    fn lister(&self) -> Option<&dyn Lister> {
        None
    }

    /// Writing a new label for a lease's holder in place (an election's new value), if the
    /// engine can.
    fn relabel(&self) -> Option<&dyn Relabel> {
        None
    }

    /// Taking several names at once, all or none, if the engine can.
    fn multi_lock(&self) -> Option<&dyn MultiLock> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_keeps_the_cores_copy_of_the_name_when_given() {
        let token = Token::generate();
        let clock: Arc<dyn Clock> = Arc::new(crate::SystemClock);
        let name: Arc<str> = Arc::from("orders");
        let req = AcquireRequest::new("orders", &token, Duration::from_secs(1), "me", &clock);
        let own = req.name_arc();
        assert!(
            !Arc::ptr_eq(&own, &name),
            "a copy of its own without the core's"
        );
        let kept = req.shared_name(&name).name_arc();
        assert!(Arc::ptr_eq(&kept, &name));
    }
}
