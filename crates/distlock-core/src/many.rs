//! Several names locked together, all or none: `client.lock_many(names)`.
//!
//! The names are checked, made distinct and sorted (one canonical order, whatever order the
//! caller gave), and taken by the engine's [`MultiLock`](crate::engine::MultiLock) in one
//! attempt that takes every name or none. Held, they are one lease: one token, one TTL, one
//! watchdog renewal of all of them, one lost signal (any name lost ends it), one release. A
//! waiter holds nothing while it waits (no hold-and-wait), so no set of clients can deadlock
//! over their names, in whatever order they pass them.
//!
//! How a waiter waits: after a busy attempt it subscribes to the release events of the name it
//! found busy (each name once, as it is found busy), tries again at once, and then sleeps until
//! one of those names is released, the holder's remaining lease ends or the back-off. It is not
//! queued on the engine: single-name waiters of a busy name, and other multi-name waiters, may
//! take a name first. A multi-name lock that keeps meeting busy names can so wait long under
//! steady contention; its wait timeout bounds that.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::client::LockClient;
use crate::engine::{
    AcquireMany, AcquireMode, LeaseKind, ManyAttempt, Subscription, many_key, shown_names as shown,
};
use crate::error::{ErrorKind, LockError};
use crate::guard::ClientState;
use crate::lease::{LeaseShared, LeaseSpec};
use crate::options::{LockOptions, LockOptionsBuilder, Wait};
use crate::token::Token;

mod guard;

pub use guard::MultiGuard;

/// The most names one multi-name lock may have.
pub const MAX_NAMES: usize = 10_000;

/// A request for several names at once, made by [`LockClient::lock_many`]: a [`MultiGuard`]
/// when granted. Nothing is sent until `acquire` or `try_acquire`.
///
/// ```no_run
/// # async fn demo(
/// #     locks: distlock_core::LockClient,
/// # ) -> Result<(), distlock_core::LockError> {
/// use std::time::Duration;
///
/// let order = locks
///     .lock_many(["sku:17", "sku:4", "sku:17", "sku:9"])
///     .wait_timeout(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// // The names distinct and sorted, a fence for each.
/// assert_eq!(order.names(), ["sku:17", "sku:4", "sku:9"]);
/// for (name, fence) in order.names().iter().zip(order.fences()) {
///     println!("{name}: fence {fence:?}");
/// }
/// order.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is sent with acquire or try_acquire"]
#[derive(Debug)]
pub struct ManyLockRequest<'a> {
    client: &'a LockClient,
    names: Vec<String>,
    options: LockOptionsBuilder,
}

impl LockClient {
    /// A request for every name of `names` at once, all or none (exclusive locks). Each name is
    /// the same lock as [`lock`](Self::lock)'s: a single-name lock and a multi-name lock of a
    /// name exclude each other. See [`ManyLockRequest`] and the module `many` of the guide.
    pub fn lock_many<I, S>(&self, names: I) -> ManyLockRequest<'_>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ManyLockRequest {
            client: self,
            names: names.into_iter().map(Into::into).collect(),
            options: self.default_options().to_builder(),
        }
    }
}

impl ManyLockRequest<'_> {
    crate::options::request_option_setters!();

    /// Takes every name, waiting as the options say.
    ///
    /// # Errors
    /// `InvalidKey` for no names, a bad name or more than [`MAX_NAMES`]; `Unsupported` on an
    /// engine that cannot take several names at once (the reason named); `Busy` with
    /// [`no_wait`](Self::no_wait); `Timeout` after the wait timeout; the engine's errors.
    ///
    /// # Cancel safety
    /// A request in flight when the future is dropped is undone in the background.
    pub async fn acquire(self) -> Result<MultiGuard, LockError> {
        let options = self.options.clone().build()?;
        let names = canonical(self.names)?;
        let holding = self.client.holding();
        if names.len() == 1 {
            let guard = self
                .client
                .lease(&names[0], LeaseKind::Exclusive, &options)
                .await?;
            return Ok(MultiGuard::single(names, guard));
        }
        holding.driver().multi()?;
        let shown = shown(&names);
        let engine = holding.driver().backend().name();
        let span = crate::trace::acquire(engine, &shown, LeaseKind::Exclusive);
        let timer = crate::metrics::Timer::start();
        let got = wait_as(holding, &names, &options, &shown)
            .instrument(span.clone())
            .await;
        let outcome = crate::metrics::outcome(&got);
        crate::trace::acquired(&span, outcome, None);
        crate::metrics::acquire(
            engine,
            LeaseKind::Exclusive,
            &shown,
            outcome,
            timer.elapsed(),
        );
        got
    }

    /// One attempt on every name: `Ok(None)` when one of them is busy (and none is taken).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), without `Busy` and `Timeout`.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>, LockError> {
        let options = self.options.clone().build()?;
        let names = canonical(self.names)?;
        let holding = self.client.holding();
        if names.len() == 1 {
            let guard = self
                .client
                .try_lease(&names[0], LeaseKind::Exclusive, &options)
                .await?;
            return Ok(guard.map(|g| MultiGuard::single(names, g)));
        }
        holding.driver().multi()?;
        try_many(holding, &names, &options).await
    }
}

/// Takes `names` (two or more), waiting as `options` say; `shown` names them in errors.
async fn wait_as(
    holding: &Arc<ClientState>,
    names: &[String],
    options: &LockOptions,
    shown: &str,
) -> Result<MultiGuard, LockError> {
    match options.wait() {
        Wait::No => match try_many(holding, names, options).await? {
            Some(g) => Ok(g),
            None => Err(LockError::busy(shown)),
        },
        Wait::Forever => wait_many(holding, names, options, None).await,
        Wait::Timeout(d) => {
            let last = std::sync::Mutex::new(None);
            let waited =
                tokio::time::timeout(d, wait_many(holding, names, options, Some(&last))).await;
            let last = last
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match (waited, last) {
                (Ok(r), _) => r,
                (Err(_), Some(cause)) => Err(LockError::after(
                    format_args!("waited {d:?} for locks {shown}; the last attempt failed"),
                    cause,
                )),
                (Err(_), None) => Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("waited {d:?} for locks {shown} without getting them all"),
                )),
            }
        }
    }
}

/// The names checked, distinct and sorted.
fn canonical(mut names: Vec<String>) -> Result<Vec<String>, LockError> {
    if names.is_empty() {
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            "a multi-name lock needs at least one name",
        ));
    }
    for n in &names {
        crate::key::validate_key(n)?;
    }
    names.sort_unstable();
    names.dedup();
    if names.len() > MAX_NAMES {
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            format!(
                "a multi-name lock takes at most {MAX_NAMES} names, not {}",
                names.len()
            ),
        ));
    }
    Ok(names)
}

/// One attempt with a new token.
async fn try_many(
    holding: &Arc<ClientState>,
    names: &[String],
    options: &LockOptions,
) -> Result<Option<MultiGuard>, LockError> {
    match attempt_many(holding, names, options, Token::generate()).await? {
        Outcome::Taken(g) => Ok(Some(g)),
        Outcome::Busy { .. } => Ok(None),
    }
}

/// What one attempt found.
enum Outcome {
    Taken(MultiGuard),
    Busy {
        name: usize,
        holder_ttl: Option<Duration>,
    },
}

/// Releases what a given-up attempt may have taken (in the background, trying again until it
/// is answered or the lease would have run out).
struct Undo<'a> {
    holding: &'a Arc<ClientState>,
    names: &'a [String],
    token: &'a Token,
    ttl: Duration,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (holding, names, token, ttl) = (
            self.holding.clone(),
            self.names.to_vec(),
            self.token.clone(),
            self.ttl,
        );
        rt.spawn(async move {
            let driver = holding.driver();
            let give_up = driver.now() + ttl;
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut pause = Duration::from_millis(20);
            loop {
                let Ok(multi) = driver.multi() else { return };
                match multi.release_all(&names, &token).await {
                    Ok(_) => return,
                    Err(_) if driver.now() + pause < give_up => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(500));
                    }
                    Err(e) => {
                        tracing::debug!(target: "distlock", error = %e,
                            "undoing a given-up multi-name attempt failed; the TTL will free it");
                        return;
                    }
                }
            }
        });
    }
}

/// One attempt with `token`, resent with it while replies are lost.
async fn attempt_many(
    holding: &Arc<ClientState>,
    names: &[String],
    options: &LockOptions,
    token: Token,
) -> Result<Outcome, LockError> {
    let driver = holding.driver();
    let ttl = options.ttl();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut req = AcquireMany::new(&refs, &token, ttl, driver.owner(), driver.clock());
    let mut undo = Undo {
        holding,
        names,
        token: &token,
        ttl,
        armed: true,
    };
    let mut resent = 0;
    let (sent, fences) = loop {
        let sent = driver.now();
        match driver.acquire_all(&req).await {
            Ok(ManyAttempt::Acquired { fences }) if fences.len() == names.len() => {
                break (sent, fences);
            }
            Ok(ManyAttempt::Acquired { fences }) => {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!(
                        "the {} engine gave {} fences for {} names",
                        driver.backend().name(),
                        fences.len(),
                        names.len()
                    ),
                ));
            }
            Ok(ManyAttempt::Busy { name, holder_ttl }) => {
                // A resend's busy answer may follow an earlier send that took them all.
                undo.armed = resent > 0;
                return Ok(Outcome::Busy { name, holder_ttl });
            }
            Err(e) if e.is_ambiguous() && resent < options.acquire_retries() => {
                resent += 1;
                req = req.mode(AcquireMode::Try.resent());
                tracing::debug!(target: "distlock", error = %e, resent,
                    "multi-name acquire reply lost; resending with the same token");
            }
            Err(e) => {
                // Whatever the error, the names may have been written before it (a write
                // not yet on the replicas, a reply the engine could not read): the undo stays
                // armed, and costs one release of names that are not ours when nothing was.
                return Err(e);
            }
        }
    };
    undo.armed = false;
    drop(undo);
    let spec = LeaseSpec {
        key: Arc::from(many_key(names)),
        token,
        kind: LeaseKind::Exclusive,
        fence: None,
        clock: driver.clock().clone(),
        options: *options,
        recorded: false,
        engine: driver.backend().name(),
    };
    let lease = Arc::new(LeaseShared::new(spec, sent));
    tracing::debug!(target: "distlock", names = %shown(names), ?fences, "locks acquired");
    Ok(Outcome::Taken(MultiGuard::new(
        names.to_vec(),
        fences,
        holding.guard(lease),
    )))
}

/// Waits for every name: attempts with a new token each, subscribing to each name found busy.
/// With `engine_errors` (a wait with a budget), an error that may pass is kept there and tried
/// again after a back-off.
async fn wait_many(
    holding: &Arc<ClientState>,
    names: &[String],
    options: &LockOptions,
    engine_errors: Option<&std::sync::Mutex<Option<LockError>>>,
) -> Result<MultiGuard, LockError> {
    let driver = holding.driver();
    let mut subs: Vec<Subscription> = Vec::new();
    let mut subscribed = vec![false; names.len()];
    let mut round = 0u32;
    let mut failures = 0u32;
    loop {
        let token = Token::generate();
        let holder_ttl = match attempt_many(holding, names, options, token.clone()).await {
            Ok(Outcome::Taken(g)) => return Ok(g),
            Ok(Outcome::Busy { name, holder_ttl }) => {
                failures = 0;
                if let Some(slot) = engine_errors {
                    *crate::sync::MutexExt::locked(slot) = None;
                }
                // Subscribe, then try again at once: a release in between is not missed.
                if options.events() && name < names.len() && !subscribed[name] {
                    subscribed[name] = true;
                    // As a follower, not a waiter: this attempt's token is not queued on the
                    // engine, and no single-name waiter's book-keeping (a writer counted, a
                    // ticket) must stand for it.
                    match driver.subscribe_any(&names[name]).await {
                        Ok(Some(s)) => {
                            subs.push(s);
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => tracing::debug!(target: "distlock", name = %names[name],
                            error = %e, "cannot subscribe to release events; polling"),
                    }
                }
                holder_ttl
            }
            Err(e) => {
                let Some(slot) = engine_errors.filter(|_| e.is_retryable()) else {
                    return Err(e);
                };
                *crate::sync::MutexExt::locked(slot) = Some(e);
                tokio::time::sleep(Duration::from_millis(50 << failures.min(5))).await;
                failures = failures.saturating_add(1);
                continue;
            }
        };
        // Backing off, woken early by a release event: a multi-name waiter is not queued on
        // the engine, so a release that hands the name to a queued waiter, or that tells only
        // the queued ones (Redis), may never reach it.
        let pause = options.backoff().delay(round, holder_ttl);
        round = round.saturating_add(1);
        let any_event = async {
            if subs.is_empty() {
                return std::future::pending().await;
            }
            let nexts = subs.iter_mut().map(|s| Box::pin(s.next()));
            futures_util::future::select_all(nexts).await;
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = any_event => {}
        }
    }
}
