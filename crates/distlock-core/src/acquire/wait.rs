//! Waiting for a lease: the loop of attempts around [`attempt`], each round the turn in the
//! local queue, the subscription to release events, one attempt, and the pause until an event,
//! the holder's remaining lease or the back-off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::Instrument;

use super::{Acquisition, TryOutcome, attempt, spawn_clean_up};
use crate::engine::{LeaseKind, Subscription};
use crate::error::LockError;
use crate::guard::{ClientState, Handoff, LockGuard};
use crate::local::{LocalQueues, QueuePlace, QueuePosition};
use crate::sync::MutexExt;
use crate::token::Token;

/// A waiter's subscription; kept in the local queue for the next head when the waiter goes.
struct KeptOnDrop<'a> {
    local: Option<&'a LocalQueues<Handoff>>,
    key: &'a str,
    sub: Option<Subscription>,
}

impl Drop for KeptOnDrop<'_> {
    fn drop(&mut self) {
        if let (Some(local), Some(sub)) = (self.local, self.sub.take()) {
            local.keep_subscription(self.key, sub);
        }
    }
}

/// The token of a wait without a local queue (each task of the client waits on the engine on
/// its own: readers, permits, or a client without local queues). The waiting attempts may have
/// queued it on the engine: a reader or a permit that stops waiting (a timeout, a dropped
/// future, a failed engine) removes that entry in the background, so it holds back nobody
/// behind it. (An exclusive waiter's entry goes when the client's last waiter for the name
/// goes: see the engines' wake-ups.)
struct OwnToken<'a> {
    holding: &'a Arc<ClientState>,
    want: Acquisition<'a>,
    token: Option<Token>,
    /// A waiting attempt used the token.
    queued: bool,
}

impl OwnToken<'_> {
    /// The lease was taken with the token: nothing to remove.
    fn taken(&mut self) {
        self.token = None;
    }

    /// The next attempt takes a new token; the old one's entry is removed.
    fn renew(&mut self) {
        self.give_up();
    }

    fn give_up(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if !std::mem::take(&mut self.queued) || self.want.kind == LeaseKind::Exclusive {
            return;
        }
        spawn_clean_up(self.holding, &self.want, token);
    }
}

impl Drop for OwnToken<'_> {
    fn drop(&mut self) {
        self.give_up();
    }
}

/// Waits for the lease; the caller bounds the wait with the wait timeout.
///
/// Tasks of one client that wait for the same name queue locally, and only the head talks to
/// the engine. After a busy attempt the head subscribes to release events (where the engine
/// has them), tries once more, then sleeps until an event, the holder's remaining lease or the
/// fallback interval; without events it backs off.
///
/// With `engine_errors` (a wait with a budget), an attempt that fails for a reason that may
/// pass (the engine unreachable, a timeout, a missed quorum: a fail-over under way) is tried
/// again with backoff, and the slot holds the last such error until an attempt gets an
/// answer; without it, such an error ends the wait.
pub(crate) async fn wait_for(
    holding: &Arc<ClientState>,
    want: Acquisition<'_>,
    engine_errors: Option<&std::sync::Mutex<Option<LockError>>>,
) -> Result<LockGuard, LockError> {
    let timer = crate::metrics::Timer::start();
    let waited = AtomicBool::new(false);
    let got = wait_in(holding, want, engine_errors, &waited).await;
    if got.is_ok() && waited.load(Ordering::Relaxed) {
        let engine = holding.driver().backend().name();
        crate::metrics::waited(engine, want.kind, want.key, timer.elapsed());
    }
    got
}

/// [`wait_for`]'s loop; `waited` is set once the lock was found busy (or the local queue had
/// someone ahead).
async fn wait_in(
    holding: &Arc<ClientState>,
    want: Acquisition<'_>,
    engine_errors: Option<&std::sync::Mutex<Option<LockError>>>,
    waited: &AtomicBool,
) -> Result<LockGuard, LockError> {
    let mut w = Waiter::join(holding, want, engine_errors, waited);
    loop {
        // Our turn in the local queue, or a hand-off from a local holder.
        if let Some(g) = w.turn().await {
            return Ok(g);
        }
        w.take_kept_subscription();
        w.subscribe_first().await;
        let holder_ttl = match w.try_once().await {
            Round::Taken(g) => return Ok(g),
            Round::Failed(e) => return Err(e),
            Round::Again => continue,
            Round::Busy(holder_ttl) => holder_ttl,
        };
        if w.subscribe_after_busy().await {
            continue;
        }
        let pause = w.next_pause(holder_ttl);
        w.sleep(pause).await;
    }
}

/// What one attempt of a wait came to.
enum Round {
    /// The lease is ours.
    Taken(LockGuard),
    /// The wait ends with this error.
    Failed(LockError),
    /// The attempt failed in a way that may pass, and was paused after: the next round starts.
    Again,
    /// The lock is busy; the holder's remaining lease, when the engine said.
    Busy(Option<Duration>),
}

/// One wait, across its rounds: its place in the local queue, its subscription, its own token,
/// and the counts that shape its pauses and its logs.
///
/// The three fields that do something when dropped are declared in the order they must drop
/// (a struct's fields drop in the order declared): the own token (its queued entry is cleaned
/// up), the subscription, then the place in the local queue.
struct Waiter<'a> {
    holding: &'a Arc<ClientState>,
    want: Acquisition<'a>,
    /// See [`wait_for`].
    engine_errors: Option<&'a std::sync::Mutex<Option<LockError>>>,
    /// Set once the lock was found busy (or the local queue had someone ahead).
    waited: &'a AtomicBool,
    local: Option<&'a LocalQueues<Handoff>>,
    /// Without a local queue, this wait's own token (with one, the queue's, shared by its
    /// successive heads): every attempt of a wait uses the same token, so a release that hands
    /// the lock to the registered waiter finds it.
    own: OwnToken<'a>,
    /// Declared before the ticket, so dropped before it: the subscription is kept for the next
    /// head while this waiter is still in the queue.
    slot: KeptOnDrop<'a>,
    ticket: Option<QueuePlace<'a, Handoff>>,
    subscribing: Subscribing,
    round: u32,
    /// Attempts in a row that failed (see `engine_errors`).
    failures: u32,
    /// Attempts so far (for the acquire's span).
    tries: u32,
    /// A failed attempt was logged at WARN already (the others go at DEBUG).
    warned: bool,
}

impl<'a> Waiter<'a> {
    /// A wait for `want`: in the local queue for its name, where the kind has one.
    fn join(
        holding: &'a Arc<ClientState>,
        want: Acquisition<'a>,
        engine_errors: Option<&'a std::sync::Mutex<Option<LockError>>>,
        waited: &'a AtomicBool,
    ) -> Self {
        let Acquisition {
            key,
            options,
            kind,
            holder,
        } = want;
        let local = holding.local_for(kind);
        let ticket = local.map(|l| l.join(key, *options, holder.label));
        let slot = KeptOnDrop {
            local,
            key,
            sub: None,
        };
        let own = OwnToken {
            holding,
            want,
            token: None,
            queued: false,
        };
        Waiter {
            holding,
            want,
            engine_errors,
            waited,
            local,
            own,
            slot,
            ticket,
            subscribing: Subscribing::default(),
            round: 0,
            failures: 0,
            tries: 0,
            warned: false,
        }
    }

    /// Waits for this wait's turn in the local queue (at once without one): `Some` when a
    /// local holder hands it the lease instead.
    async fn turn(&mut self) -> Option<LockGuard> {
        let t = self.ticket.as_mut()?;
        loop {
            match t.position() {
                QueuePosition::Handed(h) => match h.into_guard() {
                    Some(g) => return Some(g),
                    None => continue,
                },
                QueuePosition::Head => return None,
                QueuePosition::Behind(holder) => {
                    self.waited.store(true, Ordering::Relaxed);
                    if let Some(h) = t.changed(holder.as_ref()).await
                        && let Some(g) = h.into_guard()
                    {
                        return Some(g);
                    }
                }
            }
        }
    }

    /// Takes over a previous head's subscription, if the local queue kept one.
    fn take_kept_subscription(&mut self) {
        let Acquisition { key, options, .. } = self.want;
        if options.events()
            && self.slot.sub.is_none()
            && let Some(kept_sub) = self.local.and_then(|l| l.take_kept_subscription(key))
        {
            // A previous head's subscription, still active: no need to subscribe and try again
            // after this attempt.
            self.slot.sub = Some(kept_sub);
            self.subscribing.before_attempt();
        }
    }

    /// Subscribes before the attempt where that costs no round trip: a reader or a permit
    /// whose name other waiters of this client listen for already.
    async fn subscribe_first(&mut self) {
        let Acquisition {
            key, options, kind, ..
        } = self.want;
        if options.events()
            && !self.subscribing.is_subscribed()
            && kind != LeaseKind::Exclusive
            && self.holding.driver().watching(key)
        {
            // Other waiters of this client listen for the name already: subscribing costs no
            // round trip, so it comes first, and the first attempt can take its place in the
            // engine's queue (no attempt more after subscribing).
            let token = self.own.token.get_or_insert_with(Token::generate).clone();
            // The engine may queue the token as it subscribes (PostgreSQL takes its ticket
            // then): given up from here, it is cleaned up as after a waiting attempt.
            self.own.queued = true;
            if let Ok(Some(s)) = self.holding.driver().subscribe(key, kind, &token).await {
                self.slot.sub = Some(s);
                self.subscribing.before_attempt();
            }
        }
    }

    /// The token this wait's next request carries: the local queue's, or its own (made at its
    /// first use). `queued`: the request may queue it on the engine.
    fn token(&mut self, queued: bool) -> Token {
        match self.ticket.as_ref() {
            Some(t) => t.wait_token(),
            None => {
                self.own.queued |= queued;
                self.own.token.get_or_insert_with(Token::generate).clone()
            }
        }
    }

    /// One attempt. An error that may pass, in a wait with a budget, is kept in the budget's
    /// slot and paused after (backing off), and the token is given up.
    async fn try_once(&mut self) -> Round {
        // Only a first attempt with no subscription yet may take the engine's fast path.
        let queue = self.subscribing.is_subscribed() || self.round > 0;
        let token = self.token(queue);
        self.tries = self.tries.saturating_add(1);
        let engine = self.holding.driver().backend().name();
        match attempt(self.holding, self.want, queue, token)
            .instrument(crate::trace::attempt(engine, self.tries))
            .await
        {
            Ok(TryOutcome::Taken(g)) => {
                self.own.taken();
                Round::Taken(g)
            }
            Ok(TryOutcome::Busy(ttl)) => {
                self.waited.store(true, Ordering::Relaxed);
                self.failures = 0;
                if let Some(slot) = self.engine_errors {
                    *slot.locked() = None;
                }
                Round::Busy(ttl)
            }
            Err(e) => {
                let Some(slot) = self.engine_errors.filter(|_| e.is_retryable()) else {
                    return Round::Failed(e);
                };
                crate::trace::engine_retry(self.want.key, &e, self.tries, &mut self.warned);
                *slot.locked() = Some(e);
                // The failed request may have taken the lock, and its clean-up releases that
                // token: the next attempt takes a new one (the local queue retires its own).
                self.own.renew();
                tokio::time::sleep(engine_retry_delay(self.failures)).await;
                self.failures = self.failures.saturating_add(1);
                Round::Again
            }
        }
    }

    /// After the first busy attempt, with events: subscribes to release events. `true` when it
    /// did, and the next attempt goes at once.
    async fn subscribe_after_busy(&mut self) -> bool {
        let Acquisition {
            key, options, kind, ..
        } = self.want;
        if self.subscribing.after_busy(options.events()) == AfterBusy::Pause {
            return false;
        }
        // (The token the next attempts carry: the engine may tell this waiter by it. Without a
        // local queue, as above: the engine may queue the token as it subscribes.)
        let token = self.token(true);
        let listening = match self.holding.driver().subscribe(key, kind, &token).await {
            Ok(Some(s)) => {
                self.slot.sub = Some(s);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(target: "distlock", key, error = %e,
                    "cannot subscribe to release events; polling");
                false
            }
        };
        self.subscribing.subscribed(listening) == AfterBusy::Retry
    }

    /// The pause after this round's busy attempt, and the round counted: with events that hear
    /// every release, until the holder's lease ends (at most the wake fallback); otherwise the
    /// back-off.
    fn next_pause(&mut self, holder_ttl: Option<Duration>) -> Duration {
        let options = self.want.options;
        let pause = match self.slot.sub {
            Some(_) if self.holding.driver().hears_every_release() => {
                let cap = options.wake_fallback();
                holder_ttl.map_or(cap, |t| (t + Duration::from_millis(1)).min(cap))
            }
            // Without events, or with events that miss some ends (a holder's death): back off.
            _ => options.backoff().delay(self.round, holder_ttl),
        };
        self.round = self.round.saturating_add(1);
        pause
    }

    /// Sleeps for `pause`, or until a release event or a change of the local holder.
    async fn sleep(&mut self, pause: Duration) {
        let Waiter { slot, ticket, .. } = self;
        let sub = &mut slot.sub;
        let event = async {
            match sub.as_mut() {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        let local_holder_changed = async {
            match ticket.as_ref() {
                Some(t) => t.local_holder_changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = event => {}
            () = local_holder_changed => {}
        }
    }
}

/// What a wait does after a busy attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterBusy {
    /// Subscribe to the name's release events, then ask [`Subscribing::subscribed`].
    Subscribe,
    /// Try again at once.
    Retry,
    /// Pause until an event (if subscribed), the holder's remaining lease or the back-off.
    Pause,
}

/// A wait's rule for release events: subscribe after the first busy attempt, then try again
/// before pausing, so that a release between that attempt and the subscription (which nobody
/// would tell this waiter of) is never missed: the attempt after the subscription sees it. A
/// subscription made before an attempt (a previous head's, or one that costs no round trip)
/// needs no attempt more. (`loom_model` checks it against a release on another thread.)
#[derive(Debug, Default)]
pub(crate) struct Subscribing {
    /// Subscribed, or tried to and could not: it does not try again.
    subscribed: bool,
}

impl Subscribing {
    /// Whether the wait has subscribed (or tried to).
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscribed
    }

    /// The wait has a subscription before its next attempt.
    pub(crate) fn before_attempt(&mut self) {
        self.subscribed = true;
    }

    /// The attempt found the lock busy; `events`: the wait asks for release events.
    /// `Subscribe` once, and `Pause` after that (or without events).
    pub(crate) fn after_busy(&mut self, events: bool) -> AfterBusy {
        if !events || self.subscribed {
            return AfterBusy::Pause;
        }
        self.subscribed = true;
        AfterBusy::Subscribe
    }

    /// The subscription after a busy attempt is made (`listening`) or failed: `Retry` if it
    /// listens now, for a release may have come before it; `Pause` (polling) if not.
    pub(crate) fn subscribed(&self, listening: bool) -> AfterBusy {
        if listening {
            AfterBusy::Retry
        } else {
            AfterBusy::Pause
        }
    }
}

/// The pause after `failures` failed attempts in a row (0-based) of a wait: 50 ms doubling
/// to 2 s, with jitter (half to all of it), so that clients do not come back together when
/// the engine does.
fn engine_retry_delay(failures: u32) -> Duration {
    let full = Duration::from_millis(50)
        .saturating_mul(1u32 << failures.min(6))
        .min(Duration::from_secs(2));
    let lo = full.as_micros() as u64 / 2;
    let hi = full.as_micros() as u64;
    Duration::from_micros(rand::Rng::random_range(&mut rand::rng(), lo..=hi))
}

#[cfg(all(test, distlock_loom))]
mod loom_model;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_retries_back_off_to_two_seconds() {
        for _ in 0..50 {
            let first = engine_retry_delay(0);
            assert!((Duration::from_millis(25)..=Duration::from_millis(50)).contains(&first));
            let late = engine_retry_delay(30);
            assert!((Duration::from_secs(1)..=Duration::from_secs(2)).contains(&late));
        }
    }
}
