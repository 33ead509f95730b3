//! Wake-up events for waiters.
//!
//! An engine that can tell when a lock is released (Redis pub/sub and keyspace notifications,
//! PostgreSQL `LISTEN`) hands out [`Subscription`]s. It multiplexes them with a [`WakeHub`]: one
//! entry per key however many waiters watch it, one server-side subscription per key, opened
//! when the first waiter comes and closed when the last one goes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

// The hub's mutex is loom's in the model checks (`crate::sync::shim`); its counters stay std's:
// what orders them for a waiter is the `Notify` beside them, which loom does not see into.
use crate::sync::shim::{Locked, Mutex, MutexGuard};

/// [`SlotShared::status`]: the server has confirmed the subscription.
const CONFIRMED: u8 = 1;
/// [`SlotShared::status`]: the server refused the subscription (an ACL without the channel):
/// waiting for a confirmation is pointless until the next reconnect.
const REFUSED: u8 = 2;

/// What the subscribers of one key share: how many events came, whether the server has
/// confirmed (or refused) the subscription, and where to wait for a change. (An atomic counter
/// and one `Notify`: lighter than a `watch` channel on the path of every wake-up.)
struct SlotShared {
    events: AtomicU64,
    status: AtomicU8,
    changed: Notify,
}

impl SlotShared {
    /// Waits until `done` says something, checking after every change. Cancel-safe.
    async fn wait_for<T>(&self, mut done: impl FnMut(&Self) -> Option<T>) -> T {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a change between the check and the wait wakes it.
            changed.as_mut().enable();
            if let Some(v) = done(self) {
                return v;
            }
            changed.await;
        }
    }

    /// Sets the status; wakes the waiters if it changed.
    fn set_status(&self, status: u8) {
        if self.status.swap(status, Ordering::AcqRel) != status {
            self.changed.notify_waiters();
        }
    }
}

/// One waiter's own events: the wake-ups an engine addressed to its token.
struct Target {
    events: AtomicU64,
    changed: Notify,
}

struct Slot {
    shared: Arc<SlotShared>,
    refs: usize,
    /// The subscribers that gave their token, by token.
    targets: HashMap<String, Arc<Target>>,
}

type Hook = Box<dyn Fn(&str) + Send + Sync>;

struct HubInner {
    slots: Mutex<HashMap<String, Slot>>,
    on_first: Hook,
    on_last: Hook,
}

/// Multiplexes wake-up subscriptions by key, for engine implementations.
///
/// `on_first(key)` runs when a key gets its first subscriber and `on_last(key)` when its last
/// subscriber goes; both run under the hub's lock, so they are called in a total order and an
/// engine that forwards them to one task (for example over an unbounded channel) never sees an
/// unsubscribe overtake the subscribe it undoes. They must not block.
#[derive(Clone)]
pub struct WakeHub {
    inner: Arc<HubInner>,
}

impl fmt::Debug for WakeHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeHub")
            .field("keys", &self.keys().len())
            .finish()
    }
}

impl WakeHub {
    /// A hub that calls `on_first` and `on_last` as keys gain their first and lose their last
    /// subscriber.
    pub fn new(
        on_first: impl Fn(&str) + Send + Sync + 'static,
        on_last: impl Fn(&str) + Send + Sync + 'static,
    ) -> Self {
        WakeHub {
            inner: Arc::new(HubInner {
                slots: Mutex::new(HashMap::new()),
                on_first: Box::new(on_first),
                on_last: Box::new(on_last),
            }),
        }
    }

    /// A subscription to `key`'s events.
    pub fn subscribe(&self, key: &str) -> Subscription {
        self.subscribe_inner(key, None)
    }

    /// A subscription to `key`'s events, and to the wake-ups addressed to the waiter of
    /// `token` alone ([`notify_token`](Self::notify_token)): an engine that tells the next
    /// waiter in line by its token wakes that one task, not every waiter of the key.
    pub fn subscribe_token(&self, key: &str, token: &str) -> Subscription {
        self.subscribe_inner(key, Some(token))
    }

    fn subscribe_inner(&self, key: &str, token: Option<&str>) -> Subscription {
        let mut slots = self.lock();
        let slot = match slots.get_mut(key) {
            Some(slot) => {
                slot.refs += 1;
                slot
            }
            None => {
                let shared = Arc::new(SlotShared {
                    events: AtomicU64::new(0),
                    status: AtomicU8::new(0),
                    changed: Notify::new(),
                });
                (self.inner.on_first)(key);
                slots.entry(key.to_owned()).or_insert(Slot {
                    shared,
                    refs: 1,
                    targets: HashMap::new(),
                })
            }
        };
        let target = token.map(|t| {
            let target = Arc::new(Target {
                events: AtomicU64::new(0),
                changed: Notify::new(),
            });
            slot.targets.insert(t.to_owned(), target.clone());
            target
        });
        let shared = slot.shared.clone();
        let seen = shared.events.load(Ordering::Acquire);
        Subscription {
            shared: Some(shared),
            seen,
            target: target.map(|t| (t, 0)),
            reg: Some(Registration {
                hub: self.clone(),
                key: key.to_owned(),
                token: token.map(str::to_owned),
            }),
            _guard: None,
        }
    }

    /// Wakes the subscriber of `key` that gave `token` ([`subscribe_token`](Self::subscribe_token))
    /// alone. When none gave it (most often that waiter got its lease already, by an attempt
    /// of its own, and the message came late), one other subscriber by token, so that a
    /// wake-up meant for a waiter that stopped is not lost; and when there is none of those,
    /// every subscriber of `key`. (Waking them all here would make them all try, each attempt
    /// a command, and each late message more of them.)
    pub fn notify_token(&self, key: &str, token: &str) {
        let slots = self.lock();
        let Some(slot) = slots.get(key) else { return };
        match slot
            .targets
            .get(token)
            .or_else(|| slot.targets.values().next())
        {
            Some(target) => {
                target.events.fetch_add(1, Ordering::AcqRel);
                target.changed.notify_waiters();
            }
            None => {
                slot.shared.events.fetch_add(1, Ordering::AcqRel);
                slot.shared.changed.notify_waiters();
            }
        }
    }

    /// Wakes every subscriber of `key`.
    pub fn notify(&self, key: &str) {
        if let Some(slot) = self.lock().get(key) {
            slot.shared.events.fetch_add(1, Ordering::AcqRel);
            slot.shared.changed.notify_waiters();
        }
    }

    /// Wakes every subscriber of every key (after a reconnect, when events may have been missed).
    pub fn notify_all(&self) {
        for slot in self.lock().values() {
            slot.shared.events.fetch_add(1, Ordering::AcqRel);
            slot.shared.changed.notify_waiters();
        }
    }

    /// Marks `key`'s subscription as confirmed by the server (or not, after a disconnect).
    pub fn set_confirmed(&self, key: &str, confirmed: bool) {
        if let Some(slot) = self.lock().get(key) {
            slot.shared
                .set_status(if confirmed { CONFIRMED } else { 0 });
        }
    }

    /// Marks `key`'s subscription as refused by the server: waiters stop waiting for its
    /// confirmation (and poll). A later `set_confirmed` or `unconfirm_all` clears it.
    pub fn set_refused(&self, key: &str) {
        if let Some(slot) = self.lock().get(key) {
            slot.shared.set_status(REFUSED);
        }
    }

    /// Marks every subscription as unconfirmed (the connection is gone).
    pub fn unconfirm_all(&self) {
        for slot in self.lock().values() {
            slot.shared.set_status(0);
        }
    }

    /// Whether `key` has subscribers and the server has confirmed its subscription.
    pub fn is_confirmed(&self, key: &str) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|slot| slot.shared.status.load(Ordering::Acquire) == CONFIRMED)
    }

    /// The keys that currently have subscribers.
    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.inner.slots.locked()
    }

    fn unsubscribe(&self, key: &str, token: Option<&str>) {
        let mut slots = self.lock();
        if let Some(slot) = slots.get_mut(key) {
            if let Some(t) = token {
                slot.targets.remove(t);
            }
            slot.refs -= 1;
            if slot.refs == 0 {
                slots.remove(key);
                (self.inner.on_last)(key);
            }
        }
    }
}

struct Registration {
    hub: WakeHub,
    key: String,
    token: Option<String>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.unsubscribe(&self.key, self.token.as_deref());
    }
}

/// A waiter's subscription to one key's release events. Dropping it unsubscribes (the last
/// subscriber of a key closes the server-side subscription).
pub struct Subscription {
    shared: Option<Arc<SlotShared>>,
    /// The event count this subscription has already reported.
    seen: u64,
    /// Its own events (a subscription by token), and the count of them already reported.
    target: Option<(Arc<Target>, u64)>,
    reg: Option<Registration>,
    /// Whatever the engine ties to the life of this waiter's subscription (dropped with it).
    _guard: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("key", &self.reg.as_ref().map(|r| r.key.as_str()))
            .finish()
    }
}

impl Subscription {
    /// A subscription that never fires (for tests, and engines that have events only sometimes).
    pub fn never() -> Self {
        Subscription {
            shared: None,
            seen: 0,
            target: None,
            reg: None,
            _guard: None,
        }
    }

    /// The same subscription, holding `guard` until it is dropped: an engine that counts its
    /// waiters of one kind ([`WakeSource::subscribe`](super::WakeSource::subscribe))
    /// learns when the last of them stops waiting.
    #[must_use]
    pub fn with_guard(mut self, guard: impl Send + Sync + 'static) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }

    /// Resolves at the next event after the last one this subscription saw. Never resolves if
    /// it never fires ([`never`](Self::never), or its hub is gone).
    ///
    /// # Cancel safety
    /// Cancel-safe: an event that arrives while nobody awaits is kept for the next call.
    pub async fn next(&mut self) {
        let Some(shared) = self.shared.as_ref() else {
            return std::future::pending().await;
        };
        let seen = self.seen;
        let key_event =
            shared.wait_for(|s| Some(s.events.load(Ordering::Acquire)).filter(|now| *now != seen));
        let Some((target, seen_own)) = self.target.as_mut() else {
            self.seen = key_event.await;
            return;
        };
        let own_event = async {
            loop {
                let changed = target.changed.notified();
                tokio::pin!(changed);
                // Registered before the check: an event between the check and the wait wakes it.
                changed.as_mut().enable();
                let now = target.events.load(Ordering::Acquire);
                if now != *seen_own {
                    return now;
                }
                changed.await;
            }
        };
        tokio::select! {
            biased;
            own = own_event => *seen_own = own,
            all = key_event => self.seen = all,
        }
    }

    /// Waits up to `limit` for the server to confirm the subscription (or refuse it). Returns
    /// whether it confirmed it.
    pub async fn confirmed(&mut self, limit: Duration) -> bool {
        let Some(shared) = self.shared.as_ref() else {
            return false;
        };
        let wait = shared.wait_for(|s| match s.status.load(Ordering::Acquire) {
            0 => None,
            status => Some(status == CONFIRMED),
        });
        tokio::time::timeout(limit, wait).await.unwrap_or(false)
    }

    /// Whether the server has confirmed the subscription.
    pub fn is_confirmed(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.status.load(Ordering::Acquire) == CONFIRMED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_wake_up_by_token_reaches_that_waiter_alone() {
        let hub = WakeHub::new(|_| {}, |_| {});
        let mut a = hub.subscribe_token("k", "ta");
        let mut b = hub.subscribe_token("k", "tb");
        let mut plain = hub.subscribe("k");
        let quiet = Duration::from_millis(20);
        hub.notify_token("k", "tb");
        tokio::time::timeout(Duration::from_secs(1), b.next())
            .await
            .expect("b was told");
        assert!(tokio::time::timeout(quiet, a.next()).await.is_err());
        assert!(tokio::time::timeout(quiet, plain.next()).await.is_err());
        // Kept while nobody waits, once.
        hub.notify_token("k", "ta");
        tokio::time::timeout(Duration::from_secs(1), a.next())
            .await
            .expect("a kept its event");
        assert!(tokio::time::timeout(quiet, a.next()).await.is_err());
        // A token nobody here waits with: another waiter by token, so the wake-up is not lost.
        drop(b);
        hub.notify_token("k", "tb");
        tokio::time::timeout(Duration::from_secs(1), a.next())
            .await
            .expect("a woke for a gone waiter");
        assert!(tokio::time::timeout(quiet, plain.next()).await.is_err());
        // A key-wide event still reaches a waiter by token.
        hub.notify("k");
        tokio::time::timeout(Duration::from_secs(1), a.next())
            .await
            .expect("a heard the key's event");
        tokio::time::timeout(Duration::from_secs(1), plain.next())
            .await
            .expect("so did the plain subscriber");
        // No waiter by token left: every subscriber.
        drop(a);
        hub.notify_token("k", "ta");
        tokio::time::timeout(Duration::from_secs(1), plain.next())
            .await
            .expect("the plain subscriber woke");
        drop(plain);
        assert!(hub.keys().is_empty(), "the last one out unsubscribed");
    }

    #[tokio::test]
    async fn one_server_subscription_per_key_and_events_reach_every_waiter() {
        let firsts = Arc::new(AtomicUsize::new(0));
        let lasts = Arc::new(AtomicUsize::new(0));
        let (f, l) = (firsts.clone(), lasts.clone());
        let hub = WakeHub::new(
            move |_| {
                f.fetch_add(1, Ordering::SeqCst);
            },
            move |_| {
                l.fetch_add(1, Ordering::SeqCst);
            },
        );
        let mut a = hub.subscribe("k");
        let mut b = hub.subscribe("k");
        assert_eq!(firsts.load(Ordering::SeqCst), 1);
        hub.notify("k");
        hub.notify("other");
        tokio::time::timeout(Duration::from_secs(1), a.next())
            .await
            .expect("a woke");
        tokio::time::timeout(Duration::from_secs(1), b.next())
            .await
            .expect("b woke");
        // Nothing new: a second wait does not fire.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), a.next())
                .await
                .is_err()
        );
        assert!(!a.is_confirmed());
        hub.set_confirmed("k", true);
        assert!(a.confirmed(Duration::from_millis(10)).await);
        // Refused while a waiter waits for the confirmation: it returns at once, with false.
        hub.unconfirm_all();
        let waiting = tokio::spawn(async move {
            let ok = b.confirmed(Duration::from_secs(5)).await;
            (b, ok)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.set_refused("k");
        let (mut b, ok) = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the refusal ended the wait")
            .unwrap();
        assert!(!ok);
        assert!(!hub.is_confirmed("k"));
        hub.set_confirmed("k", true);
        assert!(b.is_confirmed() && hub.is_confirmed("k"));
        hub.unconfirm_all();
        assert!(!b.is_confirmed());
        // Unconfirmed and not refused: the wait lasts its limit.
        assert!(!b.confirmed(Duration::from_millis(20)).await);
        // Events that come while nobody waits are kept, once.
        hub.notify("k");
        hub.notify("k");
        tokio::time::timeout(Duration::from_secs(1), a.next())
            .await
            .expect("a kept the events");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), a.next())
                .await
                .is_err()
        );
        // A waiter already waiting is woken by a later event.
        let waiting = tokio::spawn(async move {
            a.next().await;
            a
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.notify("k");
        let a = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken")
            .unwrap();
        drop(a);
        assert_eq!(lasts.load(Ordering::SeqCst), 0);
        drop(b);
        assert_eq!(lasts.load(Ordering::SeqCst), 1);
        assert!(hub.keys().is_empty());
    }
}

/// One watch task per lock, on a named target (the key or node just before ours in a queue):
/// for engines whose waiters watch their predecessor. Pointing a lock at the target it already
/// watches, with its task still running, does nothing; any other target replaces the task.
#[derive(Debug, Default)]
pub struct PredecessorWatches {
    tasks: std::sync::Mutex<HashMap<String, (String, tokio::task::AbortHandle)>>,
}

impl PredecessorWatches {
    /// Watches `target` for `key` with the task `start` spawns, unless it is watched already.
    pub fn point(&self, key: &str, target: &str, start: impl FnOnce() -> tokio::task::AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if tasks
            .get(key)
            .is_some_and(|(t, task)| t == target && !task.is_finished())
        {
            return;
        }
        if let Some((_, old)) = tasks.remove(key) {
            old.abort();
        }
        tasks.insert(key.to_owned(), (target.to_owned(), start()));
    }

    /// Stops watching for `key`.
    pub fn stop(&self, key: &str) {
        let removed = self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if let Some((_, task)) = removed {
            task.abort();
        }
    }
}
