//! The optional capabilities of an engine, one trait each. An engine that has one implements
//! its trait and returns itself from the matching getter of [`Backend`](super::Backend).
//!
//! Their `async fn`s are boxed by [`#[async_trait]`](macro@super::async_trait), so that the traits are
//! object-safe: the getters return `Option<&dyn Trait>`, and the core asks for a capability
//! without knowing the engine's type.

use std::time::Duration;

use super::{LeaseCheck, LeaseKind, LeaseRef, LockStatus, RenewItem, SessionWatch, Subscription};
use crate::error::LockError;
use crate::token::Token;

/// Renewal of many leases in one round trip (a Redis pipeline; one keep-alive for every lease
/// of an etcd session). The watchdog sends every renewal that is due in one call. Without this
/// capability, it renews them one by one, concurrently.
#[async_trait::async_trait]
pub trait BatchRenew: Send + Sync {
    /// Renews every item: one result per item, in order.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>>;

    /// Leases one call should carry at most: the watchdog sends a larger batch in chunks of
    /// this size, one after another, so that what the engine builds for each lease (requests,
    /// replies) stays bounded however many locks the client holds. An engine whose call costs
    /// mostly per session, not per lease (etcd: one keep-alive, one listing), takes more.
    fn max_batch(&self) -> usize {
        1024
    }
}

/// Release events, so that a waiter sleeps until the lock is free instead of polling.
#[async_trait::async_trait]
pub trait WakeSource: Send + Sync {
    /// A subscription to `name`'s release events for `who`; `Ok(None)` when there are none
    /// for it right now (waiters then back off). A subscription may miss events (a foreign
    /// client's release, a reconnect): waiters always bound their sleep by the holder's
    /// remaining lease and a capped fallback interval.
    ///
    /// It should resolve only once the subscription is active at the server (or give up on
    /// confirmation after a short time), so that a release between this call and the waiter's
    /// next attempt is not missed.
    ///
    /// A waiter says its kind and token: an engine that must know when the last waiter of a
    /// kind stops waiting (its queued entries of that kind then leave) ties that to the
    /// subscription ([`Subscription::with_guard`]), and one that tells the next waiter in line
    /// by its token wakes only that waiter ([`WakeHub::subscribe_token`]). An engine that
    /// needs neither looks at the name alone.
    ///
    /// [`WakeHub::subscribe_token`]: super::wake::WakeHub::subscribe_token
    async fn subscribe(
        &self,
        name: &str,
        who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError>;

    /// Whether this client listens for `name`'s events already (another of its waiters
    /// subscribed, and the server confirmed): a new waiter's subscription then costs no round
    /// trip, so a reader or permit waiter subscribes before its first attempt, and that
    /// attempt can take its place in the engine's queue at once. The default says no.
    fn watching(&self, name: &str) -> bool {
        let _ = name;
        false
    }

    /// Whether an event comes however a lease ends: released, expired, or its holder's session
    /// gone. The default says yes, and a subscribed waiter then sleeps until an event, the
    /// holder's remaining lease or the fallback interval. An engine whose events come only from
    /// releases (PostgreSQL's `NOTIFY`, sent by the release statement: a session that dies
    /// sends none) says no, and its waiters keep backing off between attempts as without
    /// events; an event cuts a pause short.
    fn hears_every_release(&self) -> bool {
        true
    }
}

/// Who subscribes to a name's release events ([`WakeSource::subscribe`]).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener<'a> {
    /// One that follows the name without waiting for a lease of its own (an election's
    /// observer).
    Follower,
    /// A waiter for a lease of `kind`, whose attempts carry `token`.
    Waiter {
        /// The kind of lease it waits for.
        kind: LeaseKind,
        /// The token of its attempts.
        token: &'a str,
    },
}

/// Sessions whose end ends their leases: an etcd lease that the engine keeps alive for all of
/// a client's locks, a ZooKeeper session, a database connection. When the engine learns that a
/// session ended (or can no longer be trusted), every lease on it is lost at once, not at its
/// next renewal.
#[async_trait::async_trait]
pub trait Sessions: Send + Sync {
    /// How to hear that the session holding `lease` (just acquired) ends: the session it
    /// shares with other leases, watched once for all of them, or a watch of its own. Called
    /// when the lease is taken, and again after an `extend` to another TTL (which may move a
    /// lease to another session): a lease the engine moves at other times is heard on its old
    /// session only, so its loss shows at its next renewal.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch;

    /// Whether `lease` was still on the shared `session` when that session ended (see
    /// [`SessionWatch::Shared`]): only then is it lost. One the client released by itself
    /// meanwhile, or moved to another session, is not. The default says yes.
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        let _ = (lease, session);
        true
    }

    /// Takes a held lease off the session it shares with other leases: its holder stopped
    /// renewing it (a leaked guard, a hold limit reached, a lease the core gave up as lost)
    /// while the session lives on for the others. The lease must now end by itself within
    /// `ttl` (at once when `ttl` is zero). Engines whose sessions hold one lease each, or whose
    /// leases cannot outlive their session, need nothing here: the default does nothing.
    async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<(), LockError> {
        let _ = (lease, ttl);
        Ok(())
    }
}

/// The next waiter of this client for a name, as a release passes it to an engine with a
/// [`Handover`] queue.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct NextWaiter<'a> {
    /// The token the waiter's attempts use.
    pub token: &'a Token,
    /// The lease it asks for.
    pub ttl: Duration,
    /// The holder label to write.
    pub owner: &'a str,
}

impl<'a> NextWaiter<'a> {
    /// A waiter with `token`, asking for `ttl`, labelled `owner`.
    pub fn new(token: &'a Token, ttl: Duration, owner: &'a str) -> Self {
        NextWaiter { token, ttl, owner }
    }
}

/// A server-side queue of waiting clients (Redis). Waiting attempts (those with
/// [`AcquireMode::Wait`](super::AcquireMode::Wait)) register their token; a release
/// that finds clients queued writes the lock for the first of them, whose next attempt then
/// returns [`Attempt::AcquiredEarlier`](super::Attempt::AcquiredEarlier) without another write.
#[async_trait::async_trait]
pub trait Handover: Send + Sync {
    /// Releases `lease` while tasks of this client still wait for the same name: in the same
    /// round trip, the client goes back to the end of the engine's queue, registered with
    /// `next`'s token, so its next task neither jumps ahead of other clients nor spends a round
    /// trip queueing.
    async fn release_requeue(
        &self,
        lease: &LeaseRef<'_>,
        next: &NextWaiter<'_>,
    ) -> Result<LeaseCheck, LockError>;
}

/// Turning a writer into a reader of the same read-write lock in one step, so that no other
/// writer can take the lock in between (a release followed by a read acquire would let one in).
#[async_trait::async_trait]
pub trait Downgrade: Send + Sync {
    /// Turns `lease`, an exclusive lease, into a shared one: the same name and token, a reader
    /// from now on, valid for `ttl` from the moment this is sent. Readers waiting right behind
    /// it may come in at once; a waiting writer still waits, and keeps its place.
    ///
    /// `Ours` when done, `Missing` or `Foreign` when the writer was no longer ours (nothing is
    /// changed then). It must be idempotent: sent again after an unknown outcome, a lease that
    /// is already a reader of ours answers `Ours`.
    async fn downgrade(&self, lease: &LeaseRef<'_>, ttl: Duration)
    -> Result<LeaseCheck, LockError>;
}

/// Writing a new label for the holder of a lease, keeping the lease: its token, its fence,
/// its start and its deadline stay. An election's leader publishes a new value this way
/// (etcd's `Proclaim`), without a new election.
#[async_trait::async_trait]
pub trait Relabel: Send + Sync {
    /// Writes `owner` as the label of our lease's holder, if the lease is still ours: `Ours`
    /// when written, `Missing` or `Foreign` (nothing written) when it is not.
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError>;
}

/// Leaving a lease in the store to run out by itself at a chosen time, with nothing of this
/// client keeping it: no renewal, no session, no connection. The process may then exit and the
/// lock stays taken until then (ShedLock's `lockAtLeastFor`: a scheduled job's lock outlives a
/// quick job, and its `distlock run --hold-at-least` exits at once). Engines whose leases end
/// with their holder's session (ZooKeeper's ephemeral nodes, PostgreSQL and MySQL session
/// locks) cannot: their holder must stay until then.
#[async_trait::async_trait]
pub trait Linger: Send + Sync {
    /// Sets `lease`, if it is still ours, to run out by itself `ttl` from now (a little later
    /// where the engine counts in coarser units: never sooner), and forgets it here: no
    /// renewal or session of this client keeps it any longer. `Ours` when done, `Missing` or
    /// `Foreign` when the lease was no longer ours (nothing is changed then). `Unsupported`
    /// for a kind the engine cannot leave (the core then waits and releases instead).
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError>;

    /// Whether leases of `kind` can be left (the default: every kind).
    fn lingers(&self, kind: LeaseKind) -> bool {
        let _ = kind;
        true
    }
}

/// What one attempt to break a lock did.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakOutcome {
    /// Nobody held the lock.
    Free,
    /// The holder read was removed, as its own release would have: waiters are served, and
    /// the next fence is higher.
    Broken(LockStatus),
    /// The lock changed hands between the read and the removal: nothing was removed (the
    /// core tries again, a few times).
    Changed,
}

/// An operator's break-glass: removing whoever holds a lock. The holder is not asked: it learns
/// at its next renewal (or at once, on engines with [`Sessions`]), and until then may still
/// believe it holds the lock. Only fencing keeps its late writes out.
#[async_trait::async_trait]
pub trait Breaker: Send + Sync {
    /// Reads `name`'s holder and removes it, if it is still the one read.
    async fn break_once(&self, name: &str) -> Result<BreakOutcome, LockError>;
}

/// Names of the locks an engine has state for, for `distlock list` and
/// [`LockClient::list`](crate::LockClient::list): the core reads each one's status, as
/// `status` does, and keeps those held or waited for.
#[async_trait::async_trait]
pub trait Lister: Send + Sync {
    /// Names that start with `prefix` and have state on the engine now (held, waited for, or
    /// left behind by a lock that just ended), at most about `budget` of them, in any order
    /// and possibly repeated. The scan must never block the server (Redis: `SCAN` with a
    /// `COUNT`, never `KEYS`); [`Names::more`] says it stopped before the end.
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError>;
}

/// What a [`Lister`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Names {
    /// The names found.
    pub names: Vec<String>,
    /// Whether the scan stopped at its budget before the end.
    pub more: bool,
}

impl Names {
    /// `names`, and whether more may exist.
    pub fn new(names: Vec<String>, more: bool) -> Self {
        Names { names, more }
    }
}
