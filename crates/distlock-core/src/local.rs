//! In-process singleflight and hand-off: the tasks of one client that wait for the same key
//! queue here in FIFO order, and only the head of the queue talks to the engine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{Notify, oneshot};

use crate::engine::Subscription;
use crate::lease::LeaseShared;
use crate::options::LockOptions;
use crate::sync::shim::{AtomicU64, Locked, Mutex, MutexGuard};
use crate::token::Token;

struct Waiter<T> {
    turn: Arc<Notify>,
    options: LockOptions,
    /// Its own holder label, when not the client's (an election's).
    label: Option<Arc<str>>,
    handoff: oneshot::Sender<T>,
}

struct KeyQueue<T> {
    /// The key: the copy of the lease or the waiter that made the queue (see
    /// [`LocalQueues::set_holder`]).
    name: Arc<str>,
    /// The lease a task of this client holds on the key, if any.
    holder: Option<Arc<LeaseShared>>,
    /// By id: ids are handed out in order, so the first is the head (FIFO), and a waiter that
    /// leaves from the middle costs O(log n), not a shift of the others.
    waiters: BTreeMap<u64, Waiter<T>>,
    /// Waiters taken out of the queue by a releasing holder that is trying to hand off to them.
    offered: usize,
    /// The release-event subscription, kept here between two heads so that it is not closed and
    /// reopened at every turn. Dropped with the entry, when nobody waits or holds any more.
    kept_sub: Option<Box<Subscription>>,
    /// The token this client's current wait for the key uses, shared by its successive heads:
    /// the engine may hand the lock to it (a grant) after the head that registered it has gone.
    /// Retired (replaced at next use) once an acquisition with it completes or its outcome is
    /// unknown.
    /// Boxed: only a name somebody waits for has one, and a held name's entry stays small.
    wait_token: Option<Box<Token>>,
}

impl<T> KeyQueue<T> {
    fn new(name: Arc<str>) -> Self {
        KeyQueue {
            name,
            holder: None,
            waiters: BTreeMap::new(),
            offered: 0,
            kept_sub: None,
            wait_token: None,
        }
    }
}

impl<T> KeyQueue<T> {
    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty() && self.offered == 0
    }

    fn wake_head(&self) {
        if let Some((_, w)) = self.waiters.first_key_value() {
            w.turn.notify_one();
        }
    }
}

/// A key's entry: its holder alone while no task here waits for the key and nothing is kept
/// for its waiters (a held lock's usual state: 16 bytes, where a queue is 72 more), or its
/// whole queue.
enum Slot<T> {
    Held(Arc<LeaseShared>),
    Queue(Box<KeyQueue<T>>),
}

impl<T> Slot<T> {
    /// The key it is for (its table finds it by this).
    fn name(&self) -> &str {
        match self {
            Slot::Held(h) => h.key(),
            Slot::Queue(q) => &q.name,
        }
    }

    fn holder(&self) -> Option<&Arc<LeaseShared>> {
        match self {
            Slot::Held(h) => Some(h),
            Slot::Queue(q) => q.holder.as_ref(),
        }
    }

    /// The queue, if the key has more than a holder.
    fn queue(&self) -> Option<&KeyQueue<T>> {
        match self {
            Slot::Held(_) => None,
            Slot::Queue(q) => Some(q),
        }
    }

    /// The queue, made from the holder alone if need be.
    fn queue_mut(&mut self) -> &mut KeyQueue<T> {
        if let Slot::Held(h) = self {
            *self = Slot::Queue(Box::new(KeyQueue {
                holder: Some(h.clone()),
                ..KeyQueue::new(h.key_arc().clone())
            }));
        }
        match self {
            Slot::Queue(q) => q,
            Slot::Held(_) => unreachable!("made a queue just above"),
        }
    }

    fn is_idle(&self) -> bool {
        self.queue().is_some_and(KeyQueue::is_idle)
    }

    /// Back to the holder alone once the queue keeps nothing else.
    fn compact(&mut self) {
        if let Slot::Queue(q) = self
            && q.waiters.is_empty()
            && q.offered == 0
            && q.kept_sub.is_none()
            && q.wait_token.is_none()
            && let Some(h) = q.holder.take()
        {
            *self = Slot::Held(h);
        }
    }
}

mod map;
type Map<T> = map::Slots<T>;

/// `key`'s queue, made if it has none (with a copy of the name).
fn entry<'m, T>(map: &'m mut Map<T>, key: &str) -> &'m mut KeyQueue<T> {
    if !map.contains_key(key) {
        map.insert(Slot::Queue(Box::new(KeyQueue::new(Arc::from(key)))));
    }
    map.get_mut(key).expect("just inserted").queue_mut()
}

/// `key`'s queue, if it has more than a holder.
fn queue_of<'m, T>(map: &'m mut Map<T>, key: &str) -> Option<&'m mut KeyQueue<T>> {
    match map.get_mut(key)? {
        Slot::Queue(q) => Some(q),
        Slot::Held(_) => None,
    }
}

/// Drops `key`'s entry once idle, or brings it back to its holder alone.
fn tidy<T>(map: &mut Map<T>, key: &str) {
    if let Some(slot) = map.get_mut(key) {
        if slot.is_idle() {
            map.remove(key);
        } else {
            slot.compact();
        }
    }
}

/// The per-key local queues of one client. `T` is what a hand-off delivers.
pub(crate) struct LocalQueues<T> {
    /// Keyed by lock name. foldhash (seeded per map) rather than SipHash: the map is touched
    /// twice per acquisition, and its keys are the process's own lock names.
    /// The key is the holder's lease's own copy of the name when a lease created the entry.
    map: Mutex<Map<T>>,
    next_id: AtomicU64,
}

/// Where a waiter stands.
pub(crate) enum QueuePosition<T> {
    /// A releasing holder handed us its lease.
    Handed(T),
    /// We are the head and no task of ours holds the key: go and ask the engine.
    Head,
    /// Wait: behind other local waiters, or behind a local holder (given), or for an offered
    /// hand-off to complete.
    Behind(Option<Arc<LeaseShared>>),
}

/// A place in a key's local queue. Dropping it leaves the queue and passes the turn on.
pub(crate) struct QueuePlace<'a, T> {
    queues: &'a LocalQueues<T>,
    key: &'a str,
    id: u64,
    turn: Arc<Notify>,
    rx: Option<oneshot::Receiver<T>>,
}

/// A waiter a releasing holder took out of the queue to offer it the lease.
pub(crate) struct HandoffOffer<T> {
    id: u64,
    turn: Arc<Notify>,
    pub(crate) options: LockOptions,
    label: Option<Arc<str>>,
    handoff: oneshot::Sender<T>,
}

impl<T> LocalQueues<T> {
    pub(crate) fn new() -> Self {
        LocalQueues {
            map: Mutex::new(Map::default()),
            next_id: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Map<T>> {
        self.map.locked()
    }

    /// Joins the back of `key`'s queue; `label` is the waiter's own holder label, if it has
    /// one.
    pub(crate) fn join<'a>(
        &'a self,
        key: &'a str,
        options: LockOptions,
        label: Option<&str>,
    ) -> QueuePlace<'a, T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let turn = Arc::new(Notify::new());
        let (tx, rx) = oneshot::channel();
        entry(&mut self.lock(), key).waiters.insert(
            id,
            Waiter {
                turn: turn.clone(),
                options,
                label: label.map(Arc::from),
                handoff: tx,
            },
        );
        QueuePlace {
            queues: self,
            key,
            id,
            turn,
            rx: Some(rx),
        }
    }

    /// The live lease a task of this client holds on `key`, if any.
    pub(crate) fn live_holder(&self, key: &str) -> Option<Arc<LeaseShared>> {
        self.lock()
            .get(key)
            .and_then(|s| s.holder().cloned())
            .filter(|h| h.is_held())
    }

    /// The wait token of `key`'s queue, the head's TTL and its own label (if it has one), if
    /// tasks of this client wait for it (queued, not yet offered a hand-off).
    pub(crate) fn next_waiter(
        &self,
        key: &str,
    ) -> Option<(Token, std::time::Duration, Option<Arc<str>>)> {
        let mut map = self.lock();
        let q = queue_of(&mut map, key)?;
        let (_, head) = q.waiters.first_key_value()?;
        let (ttl, label) = (head.options.ttl(), head.label.clone());
        let token = Token::clone(
            q.wait_token
                .get_or_insert_with(|| Box::new(Token::generate())),
        );
        Some((token, ttl, label))
    }

    /// Retires `token` as `key`'s wait token (its acquisition completed, or may have): the
    /// next attempt uses a fresh one, so a token never serves two leases.
    pub(crate) fn retire_token(&self, key: &str, token: &Token) {
        let mut map = self.lock();
        if let Some(q) = queue_of(&mut map, key)
            && q.wait_token.as_deref() == Some(token)
        {
            q.wait_token = None;
            tidy(&mut map, key);
        }
    }

    /// Keeps `sub` for the next head of `key`'s queue (dropped at once if the key has no entry).
    pub(crate) fn keep_subscription(&self, key: &str, sub: Subscription) {
        let mut map = self.lock();
        if let Some(slot) = map.get_mut(key) {
            let q = slot.queue_mut();
            if q.kept_sub.is_none() {
                q.kept_sub = Some(Box::new(sub));
            }
        }
    }

    /// The subscription a previous head left for `key`, if any.
    pub(crate) fn take_kept_subscription(&self, key: &str) -> Option<Subscription> {
        let mut map = self.lock();
        let sub = queue_of(&mut map, key).and_then(|q| q.kept_sub.take());
        if sub.is_some() {
            tidy(&mut map, key);
        }
        sub.map(|sub| *sub)
    }

    /// Records that a task of this client now holds `key` with `lease`.
    pub(crate) fn set_holder(&self, key: &str, lease: &Arc<LeaseShared>) {
        let mut map = self.lock();
        // The entry is kept under the lease's own copy of the name: a held lock costs one copy
        // of it (the waiter that made the entry had its own).
        match map.remove(key) {
            Some(Slot::Queue(mut q)) => {
                q.holder = Some(lease.clone());
                q.name = lease.key_arc().clone();
                // A head waiting on the engine now waits locally instead.
                q.wake_head();
                let mut slot = Slot::Queue(q);
                slot.compact();
                map.insert(slot);
            }
            Some(Slot::Held(_)) | None => {
                map.insert(Slot::Held(lease.clone()));
            }
        }
    }

    /// Records that `lease` no longer holds `key`, and lets the head of the queue go.
    pub(crate) fn clear_holder(&self, key: &str, lease: &Arc<LeaseShared>) {
        let mut map = self.lock();
        let Some(slot) = map.get_mut(key) else { return };
        match slot {
            Slot::Held(h) => {
                if Arc::ptr_eq(h, lease) {
                    map.remove(key);
                }
            }
            Slot::Queue(q) => {
                if q.holder.as_ref().is_some_and(|h| Arc::ptr_eq(h, lease)) {
                    q.holder = None;
                    q.wake_head();
                }
                if q.is_idle() {
                    map.remove(key);
                }
            }
        }
    }

    /// Takes the head waiter out of the queue to offer it `lease`'s hand-off, if `lease` is the
    /// holder and somebody waits.
    pub(crate) fn offer(&self, key: &str, lease: &Arc<LeaseShared>) -> Option<HandoffOffer<T>> {
        let mut map = self.lock();
        let q = queue_of(&mut map, key)?;
        if !q.holder.as_ref().is_some_and(|h| Arc::ptr_eq(h, lease)) {
            return None;
        }
        // A waiter with a label of its own is not handed a lease written with another: it
        // takes it through the engine, which writes its label.
        if q.waiters.first_key_value()?.1.label.is_some() {
            return None;
        }
        let (id, w) = q.waiters.pop_first()?;
        q.offered += 1;
        Some(HandoffOffer {
            id,
            turn: w.turn,
            options: w.options,
            label: w.label,
            handoff: w.handoff,
        })
    }

    /// Completes an offer: `new_lease` becomes the holder and `value` goes to the waiter. If
    /// the waiter has gone, gives `value` back.
    pub(crate) fn deliver(
        &self,
        key: &str,
        offer: HandoffOffer<T>,
        new_lease: &Arc<LeaseShared>,
        value: T,
    ) -> Result<(), T> {
        let mut map = self.lock();
        let q = entry(&mut map, key);
        q.offered = q.offered.saturating_sub(1);
        match offer.handoff.send(value) {
            Ok(()) => {
                q.holder = Some(new_lease.clone());
                tidy(&mut map, key);
                Ok(())
            }
            Err(v) => {
                tidy(&mut map, key);
                Err(v)
            }
        }
    }

    /// Puts an offered waiter back at the head of the queue (the hand-off did not happen).
    pub(crate) fn withdraw(&self, key: &str, offer: HandoffOffer<T>) {
        let mut map = self.lock();
        let q = entry(&mut map, key);
        q.offered = q.offered.saturating_sub(1);
        if offer.handoff.is_closed() {
            tidy(&mut map, key);
            return;
        }
        offer.turn.notify_one();
        // Its id is older than every waiter's that joined since: it is the head again.
        q.waiters.insert(
            offer.id,
            Waiter {
                turn: offer.turn,
                options: offer.options,
                label: offer.label,
                handoff: offer.handoff,
            },
        );
    }
}

impl<T> QueuePlace<'_, T> {
    /// Where this waiter stands now.
    pub(crate) fn position(&mut self) -> QueuePosition<T> {
        if let Some(rx) = self.rx.as_mut()
            && let Ok(v) = rx.try_recv()
        {
            self.rx = None;
            return QueuePosition::Handed(v);
        }
        let map = self.queues.lock();
        let Some(slot) = map.get(self.key) else {
            return QueuePosition::Head;
        };
        let q = slot.queue();
        let is_head = q
            .and_then(|q| q.waiters.first_key_value())
            .is_some_and(|(id, _)| *id == self.id);
        if is_head {
            return match slot.holder() {
                Some(h) if h.is_held() => QueuePosition::Behind(Some(h.clone())),
                // Released, and the release is on its way: wait for it to complete (the holder
                // then clears itself and nudges us), or our attempt would only race it (and,
                // on Redis, find the lock handed to the next client).
                Some(h) if h.is_released() => QueuePosition::Behind(None),
                // Lost while its guard lives: the lock may be free, go and ask.
                _ => QueuePosition::Head,
            };
        }
        // Behind others, or offered a hand-off: the releasing holder will deliver it or put us
        // back.
        if q.is_some_and(|q| q.waiters.contains_key(&self.id)) || self.rx.is_some() {
            QueuePosition::Behind(None)
        } else {
            QueuePosition::Head
        }
    }

    /// Waits until this waiter's position may have changed. Returns a hand-off if one came.
    pub(crate) async fn changed(&mut self, holder: Option<&Arc<LeaseShared>>) -> Option<T> {
        let turn = &self.turn;
        let rx = &mut self.rx;
        let lost = async {
            match holder {
                Some(h) => {
                    h.ended().await;
                }
                None => std::future::pending().await,
            }
        };
        let handed = async {
            match rx.as_mut() {
                Some(r) => r.await.ok(),
                None => std::future::pending().await,
            }
        };
        // In a fixed order (each branch only says "look again", but a hand-off that came is
        // taken at once): tokio's random one would make the model checks' runs differ.
        let got = tokio::select! {
            biased;
            v = handed => v,
            () = turn.notified() => return None,
            () = lost => return None,
        };
        self.rx = None;
        got
    }

    /// The token for this waiter's next attempt: the queue's wait token (see `KeyQueue`).
    pub(crate) fn wait_token(&self) -> Token {
        match self.queues.lock().get_mut(self.key) {
            Some(slot) => Token::clone(
                slot.queue_mut()
                    .wait_token
                    .get_or_insert_with(|| Box::new(Token::generate())),
            ),
            None => Token::generate(),
        }
    }

    /// Resolves when the queue nudges this waiter (a local holder appeared or went).
    pub(crate) async fn local_holder_changed(&self) {
        self.turn.notified().await;
    }
}

impl<T> Drop for QueuePlace<'_, T> {
    fn drop(&mut self) {
        let mut map = self.queues.lock();
        let Some(q) = queue_of(&mut map, self.key) else {
            return;
        };
        let was_head = q
            .waiters
            .first_key_value()
            .is_some_and(|(id, _)| *id == self.id);
        if q.waiters.remove(&self.id).is_some() && was_head {
            q.wake_head();
        }
        tidy(&mut map, self.key);
        // A hand-off delivered but never taken: dropping the receiver drops the value, whose own
        // Drop releases the lease.
    }
}
#[cfg(test)]
mod tests;

#[cfg(all(test, distlock_loom))]
mod loom_model;

#[cfg(all(test, distlock_loom))]
impl<T> LocalQueues<T> {
    /// Whether no name has an entry (for the model checks).
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// What a held lock costs the client in its structures: the lease, and its name's entry here
/// (a client holds 100,000 locks; P10 of distlock-bench measures the whole process).
#[cfg(all(test, target_pointer_width = "64"))]
mod size {
    #[test]
    fn a_held_lock_stays_small() {
        let lease = std::mem::size_of::<crate::lease::LeaseShared>();
        let queue = std::mem::size_of::<super::KeyQueue<u64>>();
        let entry = std::mem::size_of::<super::Slot<u64>>();
        // 136 bytes and the `Arc`'s 16 make an allocation of 160 with glibc's 8-byte header
        // and 16-byte steps (176 at 152, before its token was kept compact; 192 at 168, before
        // its TTL, end and failing flag shared 8 bytes and the loss counter moved into its
        // lock; 208 at 184, before its kind took 5 bytes and its `Notify`'s cell 8; 224 at
        // 200, before its `Notify` was made at the first wait; 256 at 232, before its instants
        // were packed): the next field costs a bigger one.
        assert!(lease <= 136, "a lease is {lease} bytes");
        assert!(queue <= 72, "a local queue is {queue} bytes");
        assert!(entry <= 16, "a held name's entry is {entry} bytes");
    }
}
