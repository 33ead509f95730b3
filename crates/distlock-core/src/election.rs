//! Leader election on a lock: the leader holds the election's name as an exclusive lease, its
//! epoch is that lease's fence, and the value it publishes (an address, say) rides in its holder
//! label, so followers read who leads, since which epoch and with what value in one `status`.
//! Written once, on the engine interface: every engine with fences holds elections.
//!
//! What it promises, and what the tools that users have today do not (see
//! `docs/leader-election.md`):
//! - **A fenced epoch.** Each leadership's epoch is above every earlier one of the election, so
//!   a resource that keeps the highest epoch it has seen refuses a deposed leader's writes.
//! - **A local deadline.** Leadership ends on this process's monotonic clock before the lease
//!   could have passed to anyone else: [`Leadership::lost`] fires then, not later, and
//!   [`Leadership::is_leading`] turns false.
//! - **No phantom leader.** A campaign that waited takes the lease through the same path as a
//!   lock, which re-checks our own key, node or row after every wait.
//! - **Hand-over without waiting out the lease.** Resigning (or dropping the leadership)
//!   releases the lease at once, and the next campaigner, woken by the release where the engine
//!   has events, takes over within a few round trips.

use std::fmt;
use std::time::Duration;

use futures_util::Stream;

use crate::acquire::{Acquisition, HolderRole};
use crate::client::LockClient;
use crate::engine::{Fencing, LeaseKind, LockStatus, Subscription};
use crate::error::{ErrorKind, LockError};
use crate::guard::{Fence, LockGuard, Released};
use crate::lease::LostReason;
use crate::options::{LockOptions, LockOptionsBuilder, Wait};

/// How often an [`Observer`] reads the leader when no event comes (default).
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_secs(1);

/// The first pause of an observer that found nobody leading: it reads again soon (a campaigner
/// is about to take over), doubling up to its interval.
const VACANT_FIRST_PAUSE: Duration = Duration::from_millis(25);

/// The most bytes a published value may have.
pub const MAX_VALUE_LEN: usize = 1024;

/// An election on one name, made by [`LockClient::election`]: campaign for it, or follow it.
///
/// ```no_run
/// # async fn serve() {}
/// # async fn demo(
/// #     locks: distlock_core::LockClient,
/// # ) -> Result<(), distlock_core::LockError> {
/// let election = locks.election("scheduler").value("10.0.0.5:8080");
/// let leading = election.campaign().await?;
/// // Pass the epoch with every write: the store refuses a lower one than it has seen.
/// let epoch = leading.epoch();
/// tokio::select! {
///     reason = leading.lost() => eprintln!("deposed at epoch {epoch}: {reason}"),
///     () = serve() => {}
/// }
/// leading.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "an election does nothing until it campaigns or is read"]
pub struct Election {
    client: LockClient,
    name: String,
    value: String,
    options: LockOptionsBuilder,
    interval: Duration,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

impl Clone for Election {
    fn clone(&self) -> Self {
        Election {
            client: self.client.clone(),
            name: self.name.clone(),
            value: self.value.clone(),
            options: self.options.clone(),
            interval: self.interval,
        }
    }
}

impl LockClient {
    /// The election `name`. Its leader holds the lock `name` (so `distlock status NAME` shows
    /// it), with this client's options; a campaign waits as they say (for ever by default).
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            client: self.clone(),
            name: name.into(),
            value: String::new(),
            options: self.default_options().to_builder(),
            interval: DEFAULT_OBSERVE_INTERVAL,
        }
    }
}

/// Who leads an election, as followers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's label (host/pid unless its client set another).
    pub who: String,
    /// When it took the lease, in ms since the Unix epoch on its own wall clock, where the
    /// engine keeps it (for people, never for deciding anything).
    pub since_ms: Option<u64>,
    /// Its epoch: the fence of its lease, above every earlier leader's. `None` only for a
    /// holder that did not come through an election (another tool's lock on the name).
    pub epoch: Option<Fence>,
    /// The value it published, if it came through an election. `None` also when the engine
    /// could not keep the whole value.
    pub value: Option<String>,
    /// Its remaining lease, where the engine tells.
    pub ttl: Option<Duration>,
    /// Its token, where the engine stores one.
    pub token: Option<String>,
}

impl Election {
    /// The name of the election (and of its lock).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value a leader of this client publishes to followers (an address, say): at most
    /// [`MAX_VALUE_LEN`] bytes.
    pub fn value(mut self, value: impl Into<String>) -> Self {
        self.value = value.into();
        self
    }

    /// The lease of a leadership: leadership ends at most this long after the last renewal
    /// the engine confirmed (less the drift allowance), and a follower takes over at most
    /// this long after a leader dies without resigning.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// How a campaign waits (for ever by default; [`Wait::No`] is one attempt).
    pub fn wait(mut self, wait: Wait) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// Replaces the lock options a leadership is taken with.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options.to_builder();
        self
    }

    /// How often an observer reads the leader when no event tells it of a change (default
    /// [`DEFAULT_OBSERVE_INTERVAL`]): what following costs the engine.
    pub fn observe_interval(mut self, every: Duration) -> Self {
        self.interval = every.max(Duration::from_millis(10));
        self
    }

    /// Waits until we lead, and returns the leadership.
    ///
    /// # Errors
    /// `Unsupported` on an engine without fences (an election's epoch is its fence), `Config`
    /// for options or a value the engine cannot hold, `Timeout` when a wait budget runs out,
    /// and the engine's errors.
    ///
    /// # Cancel safety
    /// Cancel-safe: a campaign dropped half-way cleans up what it took, as an acquire does.
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        let (options, label) = self.prepare()?;
        let guard = self.client.lease_as(self.want(&options, &label)).await?;
        self.leadership(guard).await
    }

    /// One attempt: `Ok(None)` when somebody else leads.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign).
    ///
    /// # Cancel safety
    /// As [`campaign`](Self::campaign).
    pub async fn try_campaign(&self) -> Result<Option<Leadership>, LockError> {
        let (options, label) = self.prepare()?;
        let guard = self
            .client
            .try_lease_as(self.want(&options, &label))
            .await?;
        match guard {
            Some(g) => self.leadership(g).await.map(Some),
            None => Ok(None),
        }
    }

    /// Leads for as long as it runs, as Curator's `LeaderSelector` does: campaigns, runs
    /// `term` with each leadership's epoch, and campaigns again when that leadership is lost,
    /// cancelling its `term` (dropped at the await it is parked on) at the local deadline,
    /// before anyone else can lead. When a `term` finishes, the leadership is resigned and its
    /// output returned.
    ///
    /// ```no_run
    /// # async fn schedule(_epoch: distlock_core::Fence) {}
    /// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
    /// // Runs the scheduler whenever this process leads, for ever.
    /// locks
    ///     .election("scheduler")
    ///     .lead(|epoch| async move {
    ///         loop {
    ///             schedule(epoch).await; // writes carry the epoch, for the store to fence
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), except that a campaign that fails with an error worth
    /// retrying (an engine out of reach, a wait budget spent) is tried again after a pause
    /// (100 ms, doubling up to 5 s).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropped, it drops the running term and resigns (as dropping a leadership
    /// does).
    pub async fn lead<F, Fut, T>(&self, mut term: F) -> Result<T, LockError>
    where
        F: FnMut(Fence) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        const FIRST_PAUSE: Duration = Duration::from_millis(100);
        let mut pause = FIRST_PAUSE;
        loop {
            let leadership = match self.campaign().await {
                Ok(l) => l,
                Err(e) if e.is_retryable() || e.kind() == ErrorKind::Timeout => {
                    tracing::warn!(election = %self.name, error = %e, "campaigning again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                    continue;
                }
                Err(e) => return Err(e),
            };
            pause = FIRST_PAUSE;
            let epoch = leadership.epoch();
            let ended = tokio::select! {
                biased;
                reason = leadership.lost() => Err(reason),
                out = term(epoch) => Ok(out),
            };
            match ended {
                Ok(out) => {
                    let _ = leadership.resign().await;
                    return Ok(out);
                }
                Err(reason) => {
                    tracing::warn!(
                        election = %self.name,
                        %epoch,
                        %reason,
                        "leadership lost: campaigning again"
                    );
                }
            }
        }
    }

    /// Who leads now, if anybody: one read of the lock's status.
    ///
    /// # Errors
    /// `InvalidKey`, and the engine's errors.
    ///
    /// # Cancel safety
    /// Cancel-safe (a read).
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let status = self.client.status(&self.name).await?;
        Ok(leader_of(&status))
    }

    /// A follower's view: each change of leader, as it happens (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            seen: None,
            sub: None,
        }
    }

    /// The options and holder label of a campaign, checked.
    fn prepare(&self) -> Result<(LockOptions, String), LockError> {
        let backend = self.client.backend();
        if let Fencing::Unavailable(why) = backend.capabilities().fencing {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot hold elections: an election's epoch is its lock's \
                     fence, and this engine gives none ({why})",
                    backend.name()
                ),
            ));
        }
        check_value(&self.value)?;
        let label = leader_label(self.client.owner(), &self.value);
        Ok((self.options.clone().build()?, label))
    }

    fn want<'a>(&'a self, options: &'a LockOptions, label: &'a str) -> Acquisition<'a> {
        Acquisition {
            holder: HolderRole {
                label: Some(label),
                recorded: true,
            },
            ..Acquisition::new(&self.name, LeaseKind::Exclusive, options)
        }
    }

    /// The leadership of `guard`, whose fence is its epoch. An engine with fences gives one
    /// with every lease; one that did not (a resend it could not trace) is no leadership: the
    /// lease goes back.
    async fn leadership(&self, guard: LockGuard) -> Result<Leadership, LockError> {
        let Some(epoch) = guard.fence() else {
            let _ = guard.release().await;
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!(
                    "the {} engine took election {:?} without a fence: no epoch to lead with",
                    self.client.backend().name(),
                    self.name
                ),
            ));
        };
        Ok(Leadership {
            epoch: Fence::new(epoch),
            guard,
            value: self.value.clone(),
            owner: self.client.owner().to_owned(),
        })
    }
}

/// Refuses a value longer than [`MAX_VALUE_LEN`].
fn check_value(value: &str) -> Result<(), LockError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(LockError::new(
            ErrorKind::Config,
            format!(
                "an election's value is at most {MAX_VALUE_LEN} bytes, not {}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// The leader of an election, from its lock's status.
pub(crate) fn leader_of(status: &LockStatus) -> Option<Leader> {
    let holder = status
        .holders
        .iter()
        .find(|h| h.kind == LeaseKind::Exclusive)?;
    let (who, since_ms) = split_since(holder.owner.as_deref().unwrap_or(""));
    let (who, value) = match parse_leader_label(who) {
        Some((who, value)) => (who.to_owned(), value),
        None => (who.to_owned(), None),
    };
    Some(Leader {
        who,
        since_ms,
        epoch: holder.fence.map(Fence::new),
        value,
        ttl: holder.ttl,
        token: holder.token.clone(),
    })
}

/// A holder label as engines show it, `<label> since <ms>`, split.
fn split_since(shown: &str) -> (&str, Option<u64>) {
    if let Some((label, ms)) = shown.rsplit_once(" since ")
        && let Ok(ms) = ms.parse()
    {
        return (label, Some(ms));
    }
    (shown, None)
}

/// What separates a leader's label from its value in the holder label it writes.
const VALUE_MARK: &str = " value=";

/// A leader's holder label: its client's label, then ` value=<length>:<value>`, the value
/// percent-encoded (no space, no line break, printable ASCII only, which every engine keeps
/// as it is), its length in bytes before it so that a value an engine cut short reads as none.
fn leader_label(owner: &str, value: &str) -> String {
    let mut out = String::with_capacity(owner.len() + VALUE_MARK.len() + value.len() + 8);
    out.push_str(owner);
    out.push_str(VALUE_MARK);
    out.push_str(&value.len().to_string());
    out.push(':');
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:/@[]".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reads a label written by [`leader_label`]: the leader's label, and its value (`None` when
/// it was cut short or is not valid UTF-8). `None` for a label without a value.
fn parse_leader_label(label: &str) -> Option<(&str, Option<String>)> {
    let (who, rest) = label.rsplit_once(VALUE_MARK)?;
    let (len, encoded) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let mut bytes = Vec::with_capacity(len);
    let mut it = encoded.bytes();
    let mut whole = true;
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex = [it.next(), it.next()];
            let byte = match hex {
                [Some(h), Some(l)] => std::str::from_utf8(&[h, l])
                    .ok()
                    .and_then(|s| u8::from_str_radix(s, 16).ok()),
                _ => None,
            };
            match byte {
                Some(byte) => bytes.push(byte),
                None => {
                    whole = false;
                    break;
                }
            }
        } else {
            bytes.push(b);
        }
    }
    let value = (whole && bytes.len() == len)
        .then(|| String::from_utf8(bytes).ok())
        .flatten();
    Some((who, value))
}

/// Our leadership of an election: the lease on its name, renewed by the watchdog.
///
/// Dropping it resigns (a release spawned on the runtime, as a guard's drop): a follower takes
/// over within a few round trips, not after the lease.
#[must_use = "dropping a leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    epoch: Fence,
    value: String,
    /// The client's label, which the leader's label starts with.
    owner: String,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.guard.key())
            .field("epoch", &self.epoch)
            .field("leading", &self.is_leading())
            .finish()
    }
}

impl Leadership {
    /// The epoch of this leadership: above every earlier leader's of the election. Pass it
    /// with every write, and have the resource refuse an epoch below the highest it has seen:
    /// a deposed leader that still believes it leads (paused past its lease) is then turned
    /// away.
    pub fn epoch(&self) -> Fence {
        self.epoch
    }

    /// The value published with it (the last one [`proclaim`](Self::proclaim)ed).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Publishes `value` in place of the one this leadership has, without a new election
    /// (etcd's `Proclaim`): the epoch, the lease and its deadline stay. A follower's
    /// [`leader`](Election::leader) read shows it at once; an [`Observer`] reports it as a
    /// change at its next read (a proclamation is not a release, so it sends no release event:
    /// within the observe interval).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
    /// let mut leading = locks.election("scheduler").value("10.0.0.5:8080").campaign().await?;
    /// // ... the leader moves to another port: followers learn it, the epoch stays ...
    /// leading.proclaim("10.0.0.5:9090").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - `Config` for a value over [`MAX_VALUE_LEN`] bytes (nothing is sent);
    /// - `Lost` when the leadership has ended (the lease is then reported lost, as a renewal
    ///   would);
    /// - `Unsupported` on an engine that cannot write a holder's label in place;
    /// - the engine's errors otherwise: the old value or the new one is published, and calling
    ///   again is safe.
    ///
    /// # Cancel safety
    /// The new value may or may not have been written; [`value`](Self::value) still says the
    /// old one. Calling again is safe.
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<(), LockError> {
        let value = value.into();
        check_value(&value)?;
        self.guard
            .relabel(&leader_label(&self.owner, &value))
            .await?;
        self.value = value;
        Ok(())
    }

    /// Whether we still lead: the lease is ours and its local deadline has not passed. No
    /// I/O.
    pub fn is_leading(&self) -> bool {
        if crate::seeded::on(crate::seeded::SeededBug::LeaderKeepsLeading) {
            return true;
        }
        self.guard.is_held()
    }

    /// The local deadline of this leadership on the monotonic clock: when the last confirmed
    /// renewal was sent, plus the TTL, less the drift allowance. No other leader can have
    /// been elected before it.
    pub fn deadline(&self) -> std::time::Instant {
        self.guard.valid_until()
    }

    /// Resolves when leadership ends without a resignation: the local deadline passed with no
    /// confirmed renewal, the engine no longer has our lease, or its session ended (an etcd
    /// lease revoked, a ZooKeeper session expired).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// The lease under it (its key is the election's name, its fence the epoch).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down at once: the lease is released, and the next campaigner takes over.
    ///
    /// # Errors
    /// The engine's, when the release could not be sent (the lease then runs out by itself).
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<Released, LockError> {
        self.guard.release().await
    }
}

/// Follows an election, as a `tokio::sync::watch` receiver follows its value: [`changed`]
/// waits for the next leader (or for nobody leading), and [`borrow`] reads the leader last
/// seen. Made by [`Election::observe`].
///
/// ```no_run
/// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
/// let mut observer = locks.election("scheduler").observe();
/// // The first `changed()` returns after the first read: a new observer has seen nothing.
/// while observer.changed().await.is_ok() {
///     match observer.borrow() {
///         Some(leader) => println!("{} leads (epoch {:?})", leader.who, leader.epoch),
///         None => println!("nobody leads"),
///     }
/// }
/// # Ok(()) }
/// ```
///
/// It subscribes to the engine's release events for the name where it has them (etcd and
/// ZooKeeper watches; Redis when keyspace notifications are on), and reads the leader at each
/// event, every observe interval otherwise, and soon again while nobody leads. Each read is one
/// status read; a change is a new epoch (or nobody), so one epoch is never reported with two
/// leaders, or a new value the leader [proclaimed](Leadership::proclaim).
///
/// [`changed`]: Observer::changed
/// [`borrow`]: Observer::borrow
pub struct Observer {
    election: Election,
    /// The last view reported: `None` before the first, then the leader (or nobody).
    seen: Option<Option<Leader>>,
    /// The release events of the election's key, kept from the first wait on (a subscription
    /// per wait would subscribe and unsubscribe at the server each time).
    sub: Option<Subscription>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name)
            .field("leader", &self.borrow())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// Waits until the leader differs from the one last seen (a new epoch, a new value, or
    /// nobody leading),
    /// and marks it seen: [`borrow`](Self::borrow) reads it. A new observer has seen nothing, so
    /// its first call returns after the first read, whoever leads.
    ///
    /// # Errors
    /// The engine's. The observer goes on from the leader last seen: call it again.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is marked seen until it returns.
    pub async fn changed(&mut self) -> Result<(), LockError> {
        let holding = self.election.client.holding().clone();
        let driver = holding.driver();
        let name = self.election.name.as_str();
        let mut pause = VACANT_FIRST_PAUSE;
        loop {
            // Subscribed before the read: a release after it wakes us.
            if self.seen.is_some() && self.sub.is_none() {
                self.sub = driver.subscribe_any(name).await.unwrap_or(None);
            }
            let now = self.election.leader().await?;
            let differs = match &self.seen {
                None => true,
                Some(last) => view(last.as_ref()) != view(now.as_ref()),
            };
            if differs {
                self.seen = Some(now);
                return Ok(());
            }
            let wait = if now.is_some() {
                self.election.interval
            } else {
                let p = pause;
                pause = (pause * 2).min(self.election.interval);
                p
            };
            match self.sub.as_mut() {
                Some(s) => {
                    tokio::select! {
                        () = s.next() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                None => tokio::time::sleep(wait).await,
            }
        }
    }

    /// The leader last seen by [`changed`](Self::changed): `None` when nobody led then, or
    /// before the first change was seen. No I/O.
    pub fn borrow(&self) -> Option<&Leader> {
        self.seen.as_ref().and_then(Option::as_ref)
    }

    /// Whether [`changed`](Self::changed) has seen a view yet.
    pub fn has_seen(&self) -> bool {
        self.seen.is_some()
    }

    /// Each view as it changes, as a stream: the leader (or `None` for nobody) after each
    /// change, the first one after the first read; an engine's error is an item, and the
    /// stream goes on after it.
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>, LockError>> + Send {
        futures_util::stream::unfold(self, |mut o| async move {
            let next = o.changed().await.map(|()| o.borrow().cloned());
            Some((next, o))
        })
    }
}

/// What tells two views of an election apart: a new leader has a new epoch (and token), and
/// a leader that proclaimed a new value has that value.
fn view(leader: Option<&Leader>) -> Option<(Option<Fence>, Option<&str>, Option<&str>)> {
    leader.map(|l| (l.epoch, l.token.as_deref(), l.value.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaders_value_reads_back_whatever_its_bytes() {
        for value in [
            "",
            "10.0.0.5:8080",
            "http://[::1]:80/x?y=1&z=2",
            "a value with spaces, 100% of them",
            "line\nbreak and \u{e9}t\u{e9}",
            " value=3:abc",
        ] {
            let label = leader_label("host/42", value);
            assert!(
                label.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
                    && !label[..label.len()].contains('\n'),
                "{label:?}"
            );
            let (who, back) = parse_leader_label(&label).expect("a leader's label");
            assert_eq!(who, "host/42");
            assert_eq!(back.as_deref(), Some(value), "{label:?}");
        }
    }

    #[test]
    fn a_value_cut_short_reads_as_none() {
        let label = leader_label("host/42", "10.0.0.5:8080");
        for cut in 0..label.len() {
            let short = &label[..cut];
            if let Some((_, value)) = parse_leader_label(short) {
                assert_eq!(value, None, "{short:?} read as a whole value");
            }
        }
    }

    #[test]
    fn engines_labels_give_who_since_and_value() {
        let shown = format!("{} since 1795471436111", leader_label("web-1", "10.0.0.5"));
        let status = LockStatus::held(Some(shown), Some(7), Some(Duration::from_secs(3)));
        let l = leader_of(&status).unwrap();
        assert_eq!(l.who, "web-1");
        assert_eq!(l.since_ms, Some(1_795_471_436_111));
        assert_eq!(l.epoch, Some(Fence::new(7)));
        assert_eq!(l.value.as_deref(), Some("10.0.0.5"));
        // Another tool's lock on the name: a holder without a value.
        let other = LockStatus::held(Some("cron since 5".into()), None, None);
        let l = leader_of(&other).unwrap();
        assert_eq!((l.who.as_str(), l.value), ("cron", None));
        assert!(leader_of(&LockStatus::free()).is_none());
    }
}
