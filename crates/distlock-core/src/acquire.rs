//! Taking a lease: one attempt (resent with the same token while replies are lost, cleaned up
//! when given up), and the waiting loop around it (the local queue, release events, back-off:
//! `acquire/wait.rs`). Written once, for every engine and every kind of lease.

use std::sync::Arc;
use std::time::Duration;

use crate::driver::Driver;
use crate::engine::{AcquireMode, Attempt, LeaseCheck, LeaseKind, LeaseRef};
use crate::error::LockError;
use crate::guard::{ClientState, LockGuard};
use crate::lease::{LeaseShared, LeaseSpec};
use crate::options::LockOptions;
use crate::token::Token;

mod wait;

pub(crate) use wait::wait_for;

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
