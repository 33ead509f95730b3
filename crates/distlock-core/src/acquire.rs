//! Taking a lease: one attempt (resent with the same token while replies are lost, cleaned up
//! when given up), and the waiting loop around it (the local queue, release events, back-off).
//! Written once, for every engine and every kind of lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::Instrument;

use crate::driver::Driver;
use crate::engine::{AcquireMode, Attempt, LeaseCheck, LeaseKind, LeaseRef, Subscription};
use crate::error::LockError;
use crate::guard::{ClientState, Handoff, LockGuard};
use crate::lease::{LeaseShared, LeaseSpec};
use crate::local::{LocalQueues, QueuePosition};
use crate::options::LockOptions;
use crate::sync::MutexExt;
use crate::token::Token;

/// What one attempt found.
pub(crate) enum TryOutcome {
    Taken(LockGuard),
    Busy(Option<Duration>),
}

/// One lease request: a name, a kind and the options it is taken with.
#[derive(Clone, Copy)]
pub(crate) struct Acquisition<'a> {
    pub(crate) key: &'a str,
    pub(crate) kind: LeaseKind,
    pub(crate) options: &'a LockOptions,
    pub(crate) holder: HolderRole<'a>,
}

/// How a request's holder is written, when not as the client's other requests: its own label
/// (an election's, which carries the leader's value), and whether `status` must be able to
/// give its fence (an election's epoch).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HolderRole<'a> {
    pub(crate) label: Option<&'a str>,
    pub(crate) recorded: bool,
}

impl<'a> Acquisition<'a> {
    /// A request written as the client's others are.
    pub(crate) fn new(key: &'a str, kind: LeaseKind, options: &'a LockOptions) -> Self {
        Acquisition {
            key,
            kind,
            options,
            holder: HolderRole::default(),
        }
    }
}

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

/// Releases a lease taken by a request whose outcome we never learned, if the acquire is given
/// up or its future is dropped half-way.
struct PendingCleanup<'a> {
    holding: &'a Arc<ClientState>,
    want: Acquisition<'a>,
    token: &'a Token,
    armed: bool,
}

impl Drop for PendingCleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The token may hold the lock: never let a later attempt of this wait reuse it.
        if let Some(local) = self.holding.local_for(self.want.kind) {
            local.retire_token(self.want.key, self.token);
        }
        spawn_clean_up(self.holding, &self.want, self.token.clone());
    }
}

/// Runs [`clean_up`] for `token`'s lease of `want` in the background, on the current runtime
/// (outside one, nothing is sent: the lease or the queued entry ends with its TTL).
fn spawn_clean_up(holding: &Arc<ClientState>, want: &Acquisition<'_>, token: Token) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let holding = holding.clone();
        let (key, kind, ttl) = (want.key.to_owned(), want.kind, want.options.ttl());
        rt.spawn(async move {
            let lease = crate::engine::LeaseRef::new(&key, &token, kind);
            clean_up(holding.driver(), &lease, ttl).await;
        });
    }
}

/// Releases what a given-up request may have taken. The engine may be failing right then (the
/// reason the request was given up): the release is tried again, backing off, until it is
/// answered or the lease would have run out by itself.
async fn clean_up(driver: &Driver, lease: &LeaseRef<'_>, ttl: Duration) {
    let give_up = driver.now() + ttl;
    let mut pause = Duration::from_millis(20);
    loop {
        match driver.release(lease, None).await {
            Ok(_) => return,
            Err(e) if driver.now() + pause < give_up => {
                tracing::debug!(target: "distlock", key = lease.name, error = %e,
                    "cleaning up after a given-up acquire failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                tracing::debug!(target: "distlock", key = lease.name, error = %e,
                    "cleaning up after a given-up acquire failed; the TTL will free the lock");
                return;
            }
        }
    }
}

/// One attempt with `token`, resent while replies are lost. `queue`: see
/// [`AcquireMode::Wait`](crate::engine::AcquireMode::Wait).
pub(crate) async fn attempt(
    holding: &Arc<ClientState>,
    want: Acquisition<'_>,
    queue: bool,
    token: Token,
) -> Result<TryOutcome, LockError> {
    let driver = holding.driver();
    let Acquisition {
        key,
        kind,
        options,
        holder,
    } = want;
    let ttl = options.ttl();
    // The lease's copy of the name, made now so that an engine keeps the same one (see
    // `AcquireRequest::name_arc`).
    let name: Arc<str> = Arc::from(key);
    let mut req = driver
        .request(key, kind, &token, ttl, options.auto_renew())
        .shared_name(&name)
        .mode(if queue {
            AcquireMode::Wait
        } else {
            AcquireMode::Try
        })
        .recorded(holder.recorded);
    if let Some(label) = holder.label {
        req = req.owner(label);
    }
    let mut cleanup = PendingCleanup {
        holding,
        want,
        token: &token,
        armed: true,
    };
    let mut resent = 0;
    // Whether an acquisition found from earlier ran out before it was confirmed, and was asked
    // for again (once).
    let mut started_over = false;
    let (sent, fence) = loop {
        let sent = driver.now();
        match driver.acquire(&req).await {
            Ok(Attempt::Acquired { fence }) => break (sent, fence),
            Ok(Attempt::AcquiredEarlier {
                fence,
                age,
                ttl: granted_ttl,
            }) => {
                // The lease began at most `age` ago. Use it as it is if most of it is left;
                // otherwise (or when its TTL is not ours, or its start unknown) renew it first,
                // from now.
                let now = driver.now();
                let validity = options.validity();
                if granted_ttl == ttl
                    && let Some(since) = age.and_then(|e| now.checked_sub(e))
                    && since + validity > now + validity / 2
                {
                    break (since, fence);
                }
                let sent = driver.now();
                match driver.renew(&req.lease(), ttl).await {
                    Ok(LeaseCheck::Ours) => break (sent, fence),
                    Ok(LeaseCheck::Missing) if !started_over && options.acquire_retries() > 0 => {
                        // It ran out before we could use it (the first send's reply was slow,
                        // a member was killed under it): that says nothing of anybody else
                        // holding the lock, so it is asked for once more, as a resend (our
                        // entry, if it is there after all, is found and renewed). The clean-up
                        // stays armed whatever that answers (see below).
                        started_over = true;
                        req = req.mode(req.mode.resent());
                        tracing::debug!(target: "distlock", key, ?age,
                            "an acquisition counted from earlier ran out unconfirmed; asking again");
                    }
                    Ok(check) => {
                        tracing::debug!(target: "distlock", key, ?check, ?age,
                            "an acquisition counted from earlier was not confirmed by a renewal");
                        // It ran out before we could use it, or so the engine says: an answer
                        // from a replica just promoted may not list a write it has yet to
                        // apply. The clean-up stays armed: releasing a lease that is gone
                        // costs one request; leaving one that is there would keep the lock
                        // from everybody, us included, for as long as our session lives
                        // (its drop also retires the token).
                        return Ok(TryOutcome::Busy(None));
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(Attempt::Busy { holder_ttl }) => {
                // After an unconfirmed acquisition from earlier, a first attempt still gives
                // its token back (an answer from a replica just promoted may not list that
                // write yet); a waiter keeps its place in the queue.
                cleanup.armed = started_over && !queue;
                return Ok(TryOutcome::Busy(holder_ttl));
            }
            Err(e) if e.is_ambiguous() && resent < options.acquire_retries() => {
                resent += 1;
                req = req.mode(req.mode.resent());
                tracing::debug!(target: "distlock", key, error = %e, resent,
                    "acquire reply lost; resending with the same token");
            }
            Err(e) => {
                // Leave cleanup armed only if a request may have taken the lock: this one, or
                // an earlier send whose reply was lost (a resend refused outright, say for no
                // leader, says nothing about what the first one did).
                cleanup.armed = e.is_ambiguous() || resent > 0 || started_over;
                return Err(e);
            }
        }
    };
    cleanup.armed = false;
    drop(cleanup);
    if let Some(local) = holding.local_for(kind) {
        local.retire_token(key, &token);
    }
    let validity = options.validity();
    let sent = if crate::seeded::on(crate::seeded::SeededBug::ReplyTimeValidity) {
        driver.now()
    } else {
        sent
    };
    let spec = LeaseSpec {
        key: name,
        token,
        kind,
        fence,
        clock: driver.clock().clone(),
        options: *options,
        recorded: holder.recorded,
        engine: driver.backend().name(),
    };
    let lease = Arc::new(LeaseShared::new(spec, sent));
    tracing::debug!(target: "distlock", key, fence = ?fence,
        valid_for_ms = validity.as_millis() as u64, "lock acquired");
    Ok(TryOutcome::Taken(holding.guard(lease)))
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
    let Acquisition {
        key,
        options,
        kind,
        holder,
    } = want;
    let local = holding.local_for(kind);
    let mut ticket = local.map(|l| l.join(key, *options, holder.label));
    // Declared after the ticket, so dropped before it: the subscription is kept for the next
    // head while this waiter is still in the queue.
    let mut slot = KeptOnDrop {
        local,
        key,
        sub: None,
    };
    let sub = &mut slot.sub;
    let mut subscribed = false;
    let mut round = 0u32;
    // Without a local queue, this wait's own token (with one, the queue's, shared by its
    // successive heads): every attempt of a wait uses the same token, so a release that hands
    // the lock to the registered waiter finds it.
    let mut own = OwnToken {
        holding,
        want,
        token: None,
        queued: false,
    };
    // Attempts in a row that failed (see `engine_errors`).
    let mut failures = 0u32;
    // Attempts so far (for the acquire's span).
    let mut tries = 0u32;
    // A failed attempt was logged at WARN already (the others go at DEBUG).
    let mut warned = false;
    loop {
        // Our turn in the local queue, or a hand-off from a local holder.
        if let Some(t) = ticket.as_mut() {
            loop {
                match t.position() {
                    QueuePosition::Handed(h) => match h.into_guard() {
                        Some(g) => return Ok(g),
                        None => continue,
                    },
                    QueuePosition::Head => break,
                    QueuePosition::Behind(holder) => {
                        waited.store(true, Ordering::Relaxed);
                        if let Some(h) = t.changed(holder.as_ref()).await
                            && let Some(g) = h.into_guard()
                        {
                            return Ok(g);
                        }
                    }
                }
            }
        }
        if options.events()
            && sub.is_none()
            && let Some(kept_sub) = local.and_then(|l| l.take_kept_subscription(key))
        {
            // A previous head's subscription, still active: no need to subscribe and try again
            // after this attempt.
            *sub = Some(kept_sub);
            subscribed = true;
        }
        if options.events()
            && !subscribed
            && kind != LeaseKind::Exclusive
            && holding.driver().watching(key)
        {
            // Other waiters of this client listen for the name already: subscribing costs no
            // round trip, so it comes first, and the first attempt can take its place in the
            // engine's queue (no attempt more after subscribing).
            let token = own.token.get_or_insert_with(Token::generate).clone();
            // The engine may queue the token as it subscribes (PostgreSQL takes its ticket
            // then): given up from here, it is cleaned up as after a waiting attempt.
            own.queued = true;
            if let Ok(Some(s)) = holding.driver().subscribe(key, kind, &token).await {
                *sub = Some(s);
                subscribed = true;
            }
        }
        // Only a first attempt with no subscription yet may take the engine's fast path.
        let queue = subscribed || round > 0;
        let token = match ticket.as_ref() {
            Some(t) => t.wait_token(),
            None => {
                own.queued |= queue;
                own.token.get_or_insert_with(Token::generate).clone()
            }
        };
        tries = tries.saturating_add(1);
        let engine = holding.driver().backend().name();
        let holder_ttl = match attempt(holding, want, queue, token)
            .instrument(crate::trace::attempt(engine, tries))
            .await
        {
            Ok(TryOutcome::Taken(g)) => {
                own.taken();
                return Ok(g);
            }
            Ok(TryOutcome::Busy(ttl)) => {
                waited.store(true, Ordering::Relaxed);
                failures = 0;
                if let Some(slot) = engine_errors {
                    *slot.locked() = None;
                }
                ttl
            }
            Err(e) => {
                let Some(slot) = engine_errors.filter(|_| e.is_retryable()) else {
                    return Err(e);
                };
                crate::trace::engine_retry(key, &e, tries, &mut warned);
                *slot.locked() = Some(e);
                // The failed request may have taken the lock, and its clean-up releases that
                // token: the next attempt takes a new one (the local queue retires its own).
                own.renew();
                tokio::time::sleep(engine_retry_delay(failures)).await;
                failures = failures.saturating_add(1);
                continue;
            }
        };
        if options.events() && !subscribed {
            // Subscribe first, then try again, then wait: a release between our attempt and
            // the subscription cannot be missed.
            subscribed = true;
            // (The token the next attempts carry: the engine may tell this waiter by it.)
            let token = match ticket.as_ref() {
                Some(t) => t.wait_token(),
                None => {
                    // As above: the engine may queue the token as it subscribes.
                    own.queued = true;
                    own.token.get_or_insert_with(Token::generate).clone()
                }
            };
            match holding.driver().subscribe(key, kind, &token).await {
                Ok(Some(s)) => {
                    *sub = Some(s);
                    continue;
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(target: "distlock", key, error = %e,
                    "cannot subscribe to release events; polling"),
            }
        }
        let pause = match sub {
            Some(_) if holding.driver().hears_every_release() => {
                let cap = options.wake_fallback();
                holder_ttl.map_or(cap, |t| (t + Duration::from_millis(1)).min(cap))
            }
            // Without events, or with events that miss some ends (a holder's death): back off.
            _ => options.backoff().delay(round, holder_ttl),
        };
        round = round.saturating_add(1);
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
