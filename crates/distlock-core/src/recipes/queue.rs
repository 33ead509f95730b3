//! The queue recipe of strongly consistent stores (etcd, ZooKeeper), written once.
//!
//! Each acquisition is an entry in its lock's queue; the store orders entries by a sequence it
//! assigns (etcd's create revision, ZooKeeper's sequential node number). Whether an entry holds
//! its lease follows from what is ahead of it:
//!
//! | kind | holds when | a waiter watches |
//! |---|---|---|
//! | exclusive | nothing is ahead | the entry just ahead |
//! | shared | no exclusive entry is ahead | the nearest exclusive entry ahead |
//! | one of N permits | fewer than N entries are ahead | the N entries just ahead |
//!
//! Readers and writers share one queue in arrival order, so a waiting writer holds back the
//! readers that come after it (no writer starves), and the readers ahead of a writer all go in
//! before it (no reader starves). A waiter watches the entries whose going can let it in, for
//! their deletion or change, and looks again when one goes: one entry for a lock (no herd), the
//! N nearest for a permit of N (a holder's release wakes at most the N waiters behind it, never
//! every waiter). A name holds one kind: a permit finds entries of another kind or capacity
//! ahead of it, or a lock finds permits, and the attempt fails with
//! [`ErrorKind::KindConflict`], leaving no entry. A first
//! attempt that finds the lock busy leaves the queue at once; a waiting attempt keeps its entry
//! and its place. Every attempt after the first checks that its entry is still in the queue: a
//! waiter whose session ended while it was queued must never report the lock taken (the check
//! Jepsen found etcd's own recipe needed, etcd issue 11456).
//!
//! An engine implements [`QueueStore`] (join, read what is ahead, watch an entry, remove one)
//! and keeps a [`QueueRecipe`] over it, which does the rest: our entries (by name), the
//! decisions, the watches and the wake-ups.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{PredecessorWatches, WakeHub};
use crate::engine::{AcquireRequest, Attempt, BoxFuture, LeaseKind, LockError, Subscription};
use crate::error::ErrorKind;
use crate::sync::MutexExt;

mod state;
use state::RecipeState;

/// One entry of a lock's queue, as the store lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedEntry<Id> {
    /// The store's name for it (an etcd key, a ZooKeeper path).
    pub id: Id,
    /// Its place: entries are served in increasing order of it.
    pub seq: i64,
    /// The kind of lease it asks for.
    pub kind: LeaseKind,
    /// The store's revision when it was read (where a watch on it starts), if the store has
    /// revisions.
    pub seen_at: i64,
}

/// Our entry, as [`QueueStore::join`] made or found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined<Id> {
    /// The entry.
    pub entry: QueuedEntry<Id>,
    /// Its fencing token, if the store gives one (etcd's create revision, ZooKeeper's czxid).
    pub fence: Option<u64>,
    /// The entries ahead of it, oldest first, when the store read them in the same round trip.
    pub ahead: Option<Vec<QueuedEntry<Id>>>,
    /// The lease the entry lives on was granted or last refreshed at most this long ago (a
    /// session lease); `None` when it is counted from the request.
    pub age: Option<Duration>,
}

/// What [`QueueStore::join`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum JoinOutcome<Id> {
    /// Our entry is in the queue.
    Joined(Joined<Id>),
    /// A first attempt found the lock busy and wrote nothing (a store may take such a
    /// conditional path for first attempts).
    Busy,
}

/// What [`QueueStore::ahead`] read: the entries ahead of ours, oldest first; `None` when ours
/// is no longer in the queue.
pub type Ahead<Id> = Option<Vec<QueuedEntry<Id>>>;

/// The operations a store supplies to the recipe.
#[async_trait::async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// The store's name for an entry.
    type Id: Clone + Eq + Debug + Send + Sync + 'static;

    /// Adds `req.token`'s entry to `req.name`'s queue, or finds the one a request whose reply
    /// was lost created (a resend, `AcquireMode::Resend`).
    async fn join(&self, req: &AcquireRequest<'_>) -> Result<JoinOutcome<Self::Id>, LockError>;

    /// The entries of `name`'s queue ahead of `mine`, oldest first; `None` when `mine` is no
    /// longer in the queue (its session ended, or it was deleted). A `KindConflict` error (a
    /// queue the store refuses to share) makes the recipe discard our entry. A store may leave out the
    /// entries further ahead than the decision for `kind` needs: for an exclusive entry all but
    /// the nearest, for a permit of N all but the N nearest.
    async fn ahead(
        &self,
        name: &str,
        mine: &QueuedEntry<Self::Id>,
        kind: LeaseKind,
    ) -> Result<Ahead<Self::Id>, LockError>;

    /// Resolves when `entry` is gone, or when the watch fails (the waiter then looks again).
    fn watch_gone(&self, entry: &QueuedEntry<Self::Id>) -> BoxFuture<'static, ()>;

    /// Deletes an entry of ours (`token`'s on `name`), in the background (its lease or session
    /// frees it anyway).
    fn remove_later(&self, name: &str, token: &str, id: &Self::Id);

    /// How long ago the lease that `id` lives on was granted or last refreshed, on `clock`,
    /// when it lives on a lease that the store refreshes on a schedule of its own (an etcd
    /// session): an entry that comes to hold its lock after waiting holds it only until that
    /// lease runs out, which may be sooner than a TTL after the attempt that found it holding.
    /// `None` (the default) when the entry lives as long as its holder's session.
    fn lease_age(&self, id: &Self::Id, clock: &Arc<dyn crate::clock::Clock>) -> Option<Duration> {
        let _ = (id, clock);
        None
    }
}

/// Whether an entry holds its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<Id> {
    /// It holds its lease.
    Holds,
    /// It waits, and watches these entries ahead of it (one, or a permit's N nearest): the
    /// going of any of them may let it in.
    WaitsFor(Vec<QueuedEntry<Id>>),
    /// An entry ahead is of a kind ours cannot share the name with (a semaphore of another
    /// size, a lock beside a semaphore): this kind.
    Conflicts(LeaseKind),
}

/// Whether our entry holds its lease, given what is ahead of it (oldest first); if not, which
/// of those entries to watch.
///
/// A store may have left out entries further ahead than the decision needs (see
/// [`QueueStore::ahead`]); an entry that holds has had every entry ahead of it read, so a
/// conflict of kinds is always found before a lease is granted.
pub fn decide<Id: Clone>(kind: LeaseKind, ahead: &[QueuedEntry<Id>]) -> Decision<Id> {
    let permit = |k: LeaseKind| matches!(k, LeaseKind::Permit { .. });
    let clash = |e: &&QueuedEntry<Id>| (permit(kind) || permit(e.kind)) && !kind.compatible(e.kind);
    if let Some(e) = ahead.iter().find(clash) {
        return Decision::Conflicts(e.kind);
    }
    let watch: Vec<QueuedEntry<Id>> = match kind {
        LeaseKind::Shared => ahead
            .iter()
            .rev()
            .find(|e| e.kind != LeaseKind::Shared)
            .into_iter()
            .cloned()
            .collect(),
        LeaseKind::Permit { permits } => {
            let n = permits as usize;
            if ahead.len() < n {
                Vec::new()
            } else {
                ahead[ahead.len() - n..].to_vec()
            }
        }
        _ => ahead.last().into_iter().cloned().collect(),
    };
    if watch.is_empty() {
        Decision::Holds
    } else {
        Decision::WaitsFor(watch)
    }
}

/// How many of a queue's entries, oldest first, hold their leases (the rest wait): the first
/// alone when it is exclusive, every shared entry up to the first that is not when it is shared,
/// and up to N permits when it is one of N.
pub fn holding(kinds: impl IntoIterator<Item = LeaseKind>) -> usize {
    let mut kinds = kinds.into_iter();
    let Some(first) = kinds.next() else { return 0 };
    match first {
        LeaseKind::Shared => 1 + kinds.take_while(|k| *k == LeaseKind::Shared).count(),
        LeaseKind::Permit { permits } => {
            let more = kinds.take_while(|k| *k == first).count();
            (1 + more).min(permits.max(1) as usize)
        }
        _ => 1,
    }
}

/// An entry of ours.
#[derive(Debug, Clone)]
pub struct Entry<Id> {
    /// The lock's name (the core's copy, shared).
    pub name: Arc<str>,
    /// The entry.
    pub entry: QueuedEntry<Id>,
    /// Its fencing token.
    pub fence: Option<u64>,
    /// Whether it holds its lease (otherwise it waits in the queue).
    pub held: bool,
}

/// The recipe over a store: our entries by name, the decisions, the predecessor watches and
/// the wake-ups of this client's waiters.
pub struct QueueRecipe<S: QueueStore> {
    store: Arc<S>,
    state: Arc<Mutex<RecipeState<S::Id>>>,
    watches: Arc<PredecessorWatches>,
    hub: WakeHub,
}

impl<S: QueueStore> Debug for QueueRecipe<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueRecipe")
            .field("entries", &self.state.locked().len())
            .finish_non_exhaustive()
    }
}

impl<S: QueueStore> QueueRecipe<S> {
    /// A recipe over `store`.
    pub fn new(store: Arc<S>) -> Self {
        let state = Arc::new(Mutex::new(RecipeState::new()));
        let watches = Arc::new(PredecessorWatches::default());
        // When the last waiter of this client for a lock goes, its queued entries go too.
        let (weak_state, weak_watches, weak_store): (Weak<_>, Weak<_>, Weak<S>) = (
            Arc::downgrade(&state),
            Arc::downgrade(&watches),
            Arc::downgrade(&store),
        );
        let hub = WakeHub::new(
            |_| {},
            move |name| {
                if let (Some(state), Some(watches), Some(store)) = (
                    weak_state.upgrade(),
                    weak_watches.upgrade(),
                    weak_store.upgrade(),
                ) {
                    leave(&state, &watches, &*store, name);
                }
            },
        );
        QueueRecipe {
            store,
            state,
            watches,
            hub,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// One attempt: join the queue (or find our entry), read what is ahead, and hold the lease
    /// or wait. A try (`AcquireMode::Try`) that finds the lock busy leaves no entry behind.
    ///
    /// # Errors
    /// The store's; `Lost` when a waiting entry left the queue (its session ended).
    pub async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        let token = req.token.as_str();
        let mut known = self.state.locked().get(req.name, token);
        let (entry, fence, ahead, age) = loop {
            let from_state = known.is_some();
            let (entry, fence, listed, age) = match known.take() {
                Some(e) => (e.entry, e.fence, None, None),
                None => match self.store.join(req).await? {
                    JoinOutcome::Busy => return Ok(Attempt::Busy { holder_ttl: None }),
                    JoinOutcome::Joined(j) => {
                        self.state.locked().insert(
                            req.token.clone(),
                            Entry {
                                name: req.name_arc(),
                                entry: j.entry.clone(),
                                fence: j.fence,
                                held: false,
                            },
                        );
                        (j.entry, j.fence, j.ahead, j.age)
                    }
                },
            };
            let ahead = match listed {
                Some(a) => a,
                None => match self.store.ahead(req.name, &entry, req.kind).await {
                    // A store that refuses the name (a queue it cannot share) leaves no entry.
                    Err(e) if e.kind() == ErrorKind::KindConflict => {
                        self.discard(req.name, token);
                        return Err(e);
                    }
                    Err(e) => return Err(e),
                    Ok(Some(a)) => a,
                    Ok(None) => {
                        self.state.locked().remove(req.name, token);
                        // A resend (a reply was lost, or an acquisition from earlier ran out
                        // before it was confirmed) whose entry went with its session joins
                        // again, at the back: `Lost` would end a wait, or report a free lock
                        // as unreachable.
                        if from_state && req.mode.is_resend() {
                            continue;
                        }
                        return Err(LockError::new(
                            ErrorKind::Lost,
                            format!(
                                "our place in the queue of {:?} is gone (its session ended or \
                                 the entry was deleted)",
                                req.name
                            ),
                        ));
                    }
                },
            };
            break (entry, fence, ahead, age);
        };
        let predecessors = match decide(req.kind, &ahead) {
            Decision::WaitsFor(p) => p,
            Decision::Conflicts(theirs) => {
                self.discard(req.name, token);
                return Err(super::kind_conflict(req.name, req.kind, theirs));
            }
            Decision::Holds => {
                self.state.locked().set_held(req.name, token);
                // Measured now, not when the entry was written (the queue may have been read
                // since), and for an entry that waited too: its lease is the store's, refreshed
                // on the store's schedule, not by this attempt.
                let age = self.store.lease_age(&entry.id, req.clock).or(age);
                return Ok(match age {
                    Some(age) => Attempt::AcquiredEarlier {
                        fence,
                        age: Some(age),
                        ttl: req.ttl,
                    },
                    None => Attempt::Acquired { fence },
                });
            }
        };
        if !req.mode.waits() {
            // A first attempt: leave no entry behind.
            self.discard(req.name, token);
            return Ok(Attempt::Busy { holder_ttl: None });
        }
        self.watch(req.name, req.kind, token, &predecessors);
        Ok(Attempt::Busy { holder_ttl: None })
    }

    /// Watches `entries` for `name`'s waiters. An exclusive waiter is the only one of this
    /// client for its name (the local queue lets one task wait on the engine), so it has one
    /// watch per name, and a later target replaces it; the waiters of other kinds each have
    /// their own. Any watched entry going wakes every waiter of the name in this client.
    fn watch(&self, name: &str, kind: LeaseKind, token: &str, entries: &[QueuedEntry<S::Id>]) {
        let target = entries
            .iter()
            .map(|e| format!("{:?}", e.id))
            .collect::<Vec<_>>()
            .join(",");
        let slot = watch_slot(name, kind, token);
        let gone: Vec<_> = entries.iter().map(|e| self.store.watch_gone(e)).collect();
        let hub = self.hub.clone();
        let name_owned = name.to_owned();
        self.watches.point(&slot, &target, move || {
            tokio::spawn(async move {
                futures_util::future::select_all(gone).await;
                hub.notify(&name_owned);
            })
            .abort_handle()
        });
    }

    /// A subscription to `name`'s wake-ups (the watch itself is set by each waiting attempt,
    /// so nothing is missed between this call and the next attempt).
    pub fn subscribe(&self, name: &str) -> Subscription {
        self.hub.subscribe(name)
    }

    /// Our entry for `token` on `name`, if we have one.
    pub fn entry(&self, name: &str, token: &str) -> Option<Entry<S::Id>> {
        self.state.locked().get(name, token)
    }

    /// The id of our held entry for `token` on `name`, if we have one (the renewal's lookup:
    /// no copy of the rest of the entry).
    pub fn held_id(&self, name: &str, token: &str) -> Option<S::Id> {
        self.state.locked().held_id(name, token)
    }

    /// Our held entry for `token` on `name`, if we have one.
    pub fn held(&self, name: &str, token: &str) -> Option<Entry<S::Id>> {
        self.entry(name, token).filter(|e| e.held)
    }

    /// Our entries of `name` that hold their lease (by token), found without going through
    /// the other names' entries.
    pub fn held_of(&self, name: &str) -> Vec<(String, Entry<S::Id>)> {
        self.state.locked().held_of(name)
    }

    /// Forgets `token`'s entry on `name` (released, or moved) and returns it; the caller
    /// deletes it.
    pub fn forget(&self, name: &str, token: &str) -> Option<Entry<S::Id>> {
        let e = self.state.locked().remove(name, token)?;
        if e.entry.kind != LeaseKind::Exclusive {
            self.watches.stop(&watch_slot(&e.name, e.entry.kind, token));
        }
        Some(e)
    }

    /// Forgets `token`'s entry on `name` and deletes it in the background.
    pub fn discard(&self, name: &str, token: &str) {
        if let Some(e) = self.forget(name, token) {
            self.store.remove_later(name, token, &e.entry.id);
        }
    }

    /// Changes our record of `token`'s entry on `name` (its id after a move, say).
    pub fn update(&self, name: &str, token: &str, f: impl FnOnce(&mut Entry<S::Id>)) {
        self.state.locked().update(name, token, f);
    }
}

/// The key of a waiter's watch in [`PredecessorWatches`]: the name for an exclusive waiter (one
/// per client and name), the name and token for the others.
fn watch_slot(name: &str, kind: LeaseKind, token: &str) -> String {
    match kind {
        LeaseKind::Exclusive => name.to_owned(),
        _ => format!("{name}\u{0}{token}"),
    }
}

/// Nobody here waits for `name` any more: stop watching, and leave its queue (queued exclusive
/// entries only: a held one belongs to its guard, and a reader's or permit's to its own wait).
fn leave<S: QueueStore>(
    state: &Mutex<RecipeState<S::Id>>,
    watches: &PredecessorWatches,
    store: &S,
    name: &str,
) {
    watches.stop(name);
    let gone = state.locked().take_waiting(name);
    for (token, e) in gone {
        watches.stop(&watch_slot(name, e.entry.kind, token.as_str()));
        store.remove_later(name, token.as_str(), &e.entry.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(entries: &[(i64, bool)]) -> Vec<QueuedEntry<i64>> {
        entries
            .iter()
            .map(|&(seq, shared)| QueuedEntry {
                id: seq,
                seq,
                kind: if shared {
                    LeaseKind::Shared
                } else {
                    LeaseKind::Exclusive
                },
                seen_at: 0,
            })
            .collect()
    }

    fn permits(n: u32, seqs: &[i64]) -> Vec<QueuedEntry<i64>> {
        seqs.iter()
            .map(|&seq| QueuedEntry {
                id: seq,
                seq,
                kind: LeaseKind::Permit { permits: n },
                seen_at: 0,
            })
            .collect()
    }

    fn waiting_on(seq: i64, shared: bool) -> Decision<i64> {
        Decision::WaitsFor(q(&[(seq, shared)]))
    }

    #[test]
    fn exclusive_holds_first_and_watches_the_entry_just_ahead() {
        assert_eq!(decide(LeaseKind::Exclusive, &q(&[])), Decision::Holds);
        assert_eq!(
            decide(
                LeaseKind::Exclusive,
                &q(&[(1, true), (2, false), (3, true)])
            ),
            waiting_on(3, true)
        );
    }

    #[test]
    fn shared_holds_unless_an_exclusive_is_ahead_and_then_watches_the_nearest() {
        assert_eq!(
            decide(LeaseKind::Shared, &q(&[(1, true), (2, true)])),
            Decision::Holds
        );
        assert_eq!(
            decide(
                LeaseKind::Shared,
                &q(&[(1, false), (2, true), (3, false), (4, true)])
            ),
            waiting_on(3, false)
        );
    }

    #[test]
    fn permits_hold_while_fewer_are_ahead_and_watch_the_n_nearest() {
        let three = LeaseKind::Permit { permits: 3 };
        assert_eq!(decide(three, &permits(3, &[1, 2])), Decision::Holds);
        // Any of the three holders ahead going lets us in: all three are watched.
        assert_eq!(
            decide(three, &permits(3, &[1, 2, 3])),
            Decision::WaitsFor(permits(3, &[1, 2, 3]))
        );
        // Behind another waiter: the three nearest (a holder going first lets the waiter
        // ahead in, and leaves us where we were).
        assert_eq!(
            decide(three, &permits(3, &[1, 2, 3, 4])),
            Decision::WaitsFor(permits(3, &[2, 3, 4]))
        );
    }

    #[test]
    fn a_name_holds_one_kind_with_one_capacity() {
        let three = LeaseKind::Permit { permits: 3 };
        assert_eq!(
            decide(three, &permits(2, &[1])),
            Decision::Conflicts(LeaseKind::Permit { permits: 2 })
        );
        assert_eq!(
            decide(three, &q(&[(1, true)])),
            Decision::Conflicts(LeaseKind::Shared)
        );
        assert_eq!(
            decide(LeaseKind::Exclusive, &permits(3, &[1])),
            Decision::Conflicts(three)
        );
        assert_eq!(
            decide(LeaseKind::Shared, &permits(3, &[1])),
            Decision::Conflicts(three)
        );
        // Readers and writers share a name.
        assert_eq!(
            decide(LeaseKind::Shared, &q(&[(1, false)])),
            waiting_on(1, false)
        );
    }

    #[test]
    fn a_waiting_writer_holds_back_the_readers_behind_it() {
        // Readers 1 and 2 hold; writer 3 waits for reader 2; reader 4 waits for writer 3.
        let queue = q(&[(1, true), (2, true), (3, false)]);
        assert_eq!(
            decide(LeaseKind::Exclusive, &queue[..2]),
            waiting_on(2, true)
        );
        assert_eq!(decide(LeaseKind::Shared, &queue), waiting_on(3, false));
    }

    #[test]
    fn the_holders_are_the_leading_entries_that_can_share() {
        let (x, r, p3) = (
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 3 },
        );
        assert_eq!(holding([]), 0);
        assert_eq!(holding([x, r, r]), 1);
        assert_eq!(holding([r, r, x, r]), 2);
        assert_eq!(holding([r]), 1);
        assert_eq!(holding([p3, p3]), 2);
        assert_eq!(holding([p3, p3, p3, p3, p3]), 3);
    }

    #[test]
    fn kinds_are_stored_as_short_tags() {
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 1 },
            LeaseKind::Permit { permits: 10_000 },
        ] {
            assert_eq!(LeaseKind::from_tag(&kind.tag()), Some(kind));
        }
        for bad in ["x", "p", "p0", "p+3", "p10001", "r2"] {
            assert_eq!(LeaseKind::from_tag(bad), None, "{bad}");
        }
        assert!(LeaseKind::Permit { permits: 0 }.validate().is_err());
        assert!(LeaseKind::Permit { permits: 10_001 }.validate().is_err());
    }
}
