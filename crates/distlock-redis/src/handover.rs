//! The server-side hand-over, as this client keeps track of it.
//!
//! Each lock has a queue of waiting clients on the server (a list; see `scripts/queue.lua`).
//! A waiting attempt adds this client's *registration* to it:
//! `<wake channel> <ttl ms> <seq> <token> <owner>`, what a release writes when it hands the
//! lock to us and where it tells us. A release that finds clients queued writes the lock for the
//! first live one and tells it on its own channel with a *grant*:
//! `\t<fence> <seq> <token> <lock key>`. A reader it lets in is told by its token,
//! `\n<token> <lock key>` (the client's other registrations stay queued); a client it takes
//! out of the queue without the lock is told to try again with the bare lock key. The
//! subscriber hears grants; the next attempt of the waiting task takes the lock from here,
//! without a round trip.
//!
//! What the backend and the subscriber know of this, under one mutex, changed only through the
//! methods of [`Handovers`]: grants not yet taken, the registration we believe queued, the
//! registrations sent, which of them the last grant served, the tokens whose release may hand
//! over, and the hint that a release of ours just handed a lock elsewhere.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::engine::{Attempt, LeaseCheck};
use distlock_core::recipes::MutexExt;

use crate::replies::ReleaseReply;
use crate::scripts::ttl_ms;

/// How many registrations per lock are remembered.
const MAX_REGS: usize = 16;

/// How many contended tokens are remembered (each is forgotten at its release; a bound for
/// guards that are never released, say leaked with `mem::forget`).
const MAX_CONTENDED: usize = 4096;

/// How long a release of ours that handed the lock to another client answers our own waiting
/// tasks' attempts with "busy" without asking (they are queued behind; a wake-up ends it).
const ELSEWHERE_HINT: Duration = Duration::from_millis(100);

/// A registration in a lock's queue: where to tell us (`channel`), and what a release writes
/// when it hands the lock to us.
pub(crate) fn registration(
    channel: &str,
    ttl: Duration,
    seq: u64,
    token: &str,
    owner: &str,
) -> String {
    format!("{channel} {} {seq} {token} {owner}", ttl_ms(ttl))
}

/// A grant message, `\t<fence> <seq> <token> <lock key>`: the fence, the registration's
/// number, the token and the lock key.
pub(crate) fn parse_grant(payload: &[u8]) -> Option<(u64, u64, &str, &str)> {
    let text = std::str::from_utf8(payload.strip_prefix(b"\t")?).ok()?;
    let mut parts = text.splitn(4, ' ');
    let fence = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let token = parts.next()?;
    let lock_key = parts.next()?;
    Some((fence, seq, token, lock_key))
}

/// A message telling one waiter by its token to try, `\n<token> <lock key>` (a permit's
/// release tells the next waiters in line this way, and a release that lets readers in tells
/// each of them): the token and the lock key.
pub(crate) fn parse_told(payload: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(payload.strip_prefix(b"\n")?).ok()?;
    text.split_once(' ')
}

/// A lock handed to this client by a release.
pub(crate) enum Grant {
    /// Handed to `token`, with `fence`, on the registration numbered `seq`.
    Handed { token: String, fence: u64, seq: u64 },
    /// An attempt with `token` took the lock with `fence`, possibly one a release had already
    /// handed to it (its message still on the way): ignore that message when it comes. A
    /// grant to `token` with another fence is a later hand-over, to a registration of
    /// `token` that was still queued: nobody uses it, and the next attempt takes it over.
    Taken { token: String, fence: u64 },
}

impl Grant {
    /// The token of an unused hand-over, which the next attempt takes over.
    pub(crate) fn unused_token(&self) -> Option<&str> {
        match self {
            Grant::Handed { token, .. } => Some(token),
            Grant::Taken { .. } => None,
        }
    }
}

/// One registration sent: its number, when it was sent, and the TTL it asked for.
#[derive(Clone, Copy)]
struct Reg {
    seq: u64,
    at: Instant,
    ttl: Duration,
}

#[derive(Default)]
struct WaitState {
    /// Locks a release of ours just handed to another client while tasks of ours still wait,
    /// and until when to believe it: their next attempt would only find the lock busy, so it is
    /// answered here (they are queued, and handed the lock in their turn).
    elsewhere: HashMap<String, Instant>,
    /// How many wake-ups this client has had: a release records `elsewhere` only if none came
    /// while it was in flight (that wake-up may have been our turn already).
    wakes: u64,
    /// Locks handed to this client, by lock name, not yet taken by one of its attempts.
    grants: HashMap<String, Grant>,
    /// Our registration in each lock's queue, by lock name, while we believe it is there
    /// (scripts keep it instead of queueing again, or remove it).
    queued: HashMap<String, String>,
    /// Registrations this client sent, by lock name, oldest first (at most `MAX_REGS`): when a
    /// grant names one, the lease was written after it was sent.
    regs: HashMap<String, VecDeque<Reg>>,
    /// The registration of ours, by number, that each lock's last grant served: an attempt
    /// whose reply says it queued us does not believe it if the grant for that very
    /// registration came first.
    served: HashMap<String, u64>,
    /// How many of this client's exclusive waiters wait for each lock (subscribed to its
    /// wake-ups): only they use grants and the registrations above.
    writers: HashMap<String, usize>,
    /// Tokens whose lock was taken after a wait (so others may be waiting too): their release
    /// may hand the lock over, and leads with a `PING` (see
    /// `ServerConnection::run_after_ping`).
    contended: HashSet<String>,
}

impl WaitState {
    /// A script queued our registration `reg`, number `seq`, for `key`: believe it is there,
    /// unless the grant for that very registration came before the reply. Believing a served
    /// one still queued would keep the next release from queueing us again, and the other
    /// clients' tasks would pass the lock among themselves.
    fn believe_queued(&mut self, key: &str, seq: u64, reg: String) {
        if self.served.get(key) != Some(&seq) {
            self.queued.insert(key.to_owned(), reg);
        }
    }

    fn mark_contended(&mut self, token: &str) {
        if self.contended.len() >= MAX_CONTENDED {
            self.contended.clear();
        }
        self.contended.insert(token.to_owned());
    }

    /// Numbers a registration for `key` about to be sent, and remembers when.
    fn register(&mut self, seq: u64, key: &str, ttl: Duration) {
        let reg = Reg {
            seq,
            at: Instant::now(),
            ttl,
        };
        match self.regs.get_mut(key) {
            Some(q) => {
                if q.len() >= MAX_REGS {
                    q.pop_front();
                }
                q.push_back(reg);
            }
            None => {
                self.regs
                    .insert(key.to_owned(), std::iter::once(reg).collect());
            }
        }
    }

    /// A wake-up for `name`: it ends the hint that the lock is elsewhere.
    fn woken(&mut self, name: &str) {
        self.wakes += 1;
        self.elsewhere.remove(name);
    }

    /// Records a lock handed to `token` of this client, unless an attempt already took this
    /// very grant (same token and fence). Our registration left the queue with it.
    fn record_grant(&mut self, name: &str, fence: u64, seq: u64, token: &str) {
        self.queued.remove(name);
        // No allocation on a hot lock's every hand-over: its entry stays.
        match self.served.get_mut(name) {
            Some(s) => *s = seq,
            None => {
                self.served.insert(name.to_owned(), seq);
            }
        }
        if let Some(Grant::Taken { token: t, fence: f }) = self.grants.get(name)
            && t == token
            && *f == fence
        {
            self.grants.remove(name);
            return;
        }
        self.grants.insert(
            name.to_owned(),
            Grant::Handed {
                token: token.to_owned(),
                fence,
                seq,
            },
        );
    }

    /// A release of ours handed the lock to another client while tasks of ours still wait;
    /// `requeued` says the script queued `mine` (registration number `seq`) for them,
    /// otherwise it kept the registration we believed queued. `wakes` is the wake-up count
    /// when the release was sent.
    ///
    /// What the wake-ups that came meanwhile did to the belief is already in the state (a
    /// grant or a "try again" took it away); what the script queued is believed unless the
    /// grant for that very registration came first. Forgetting it for any other wake-up (a
    /// grant of a turn our task had already taken by an attempt, say) left it in the queue
    /// unknown to us: the next attempt queued us a second time, and this client took two turns
    /// in every round from then on. The hint that the lock is elsewhere is only left if no
    /// wake-up came: that one may have been our turn already.
    fn handed_elsewhere(&mut self, key: &str, requeued: bool, seq: u64, mine: String, wakes: u64) {
        if requeued {
            self.believe_queued(key, seq, mine);
        }
        if self.wakes == wakes {
            self.elsewhere
                .insert(key.to_owned(), Instant::now() + ELSEWHERE_HINT);
        }
    }
}

/// What a release sends, decided before it is sent.
pub(crate) struct ReleasePlan {
    /// A hand-over is likely (our tasks wait, or the lock was taken after a wait): lead with a
    /// `PING`.
    pub(crate) lead: bool,
    /// The number of the registration sent for our next task, if any.
    pub(crate) seq: u64,
    /// The wake-up count when the release was sent.
    wakes: u64,
    /// Our registration in the queue, if we believe we have one (else empty).
    pub(crate) believed: String,
}

/// The hand-over state of one backend, shared with its subscriber; clones share it.
#[derive(Clone, Default)]
pub(crate) struct Handovers {
    state: Arc<Mutex<WaitState>>,
    /// Numbers registrations.
    next_seq: Arc<AtomicU64>,
}

impl Handovers {
    fn seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A waiting attempt is about to queue for `key` with `ttl`: its registration's number,
    /// and our registration we believe is queued already (or empty).
    pub(crate) fn queue_for(&self, key: &str, ttl: Duration) -> (u64, String) {
        let seq = self.seq();
        let mut st = self.state.locked();
        st.register(seq, key, ttl);
        let believed = st.queued.get(key).cloned().unwrap_or_default();
        (seq, believed)
    }

    /// A lock a release handed to `token`, if one did: its fence, how long ago at most it was
    /// written, and its TTL. A grant for another token of ours is returned as `Err`: no
    /// task of ours uses it any more (the local queue shares one token between its heads), so
    /// this attempt takes the lock over.
    pub(crate) fn take_grant(&self, key: &str, token: &str) -> Option<Result<Attempt, Grant>> {
        let mut st = self.state.locked();
        if st.grants.is_empty() {
            return None;
        }
        let (fence, seq) = match st.grants.get(key)? {
            Grant::Handed {
                token: t,
                fence,
                seq,
            } if t == token => (*fence, *seq),
            Grant::Handed { .. } => return st.grants.remove(key).map(Err),
            Grant::Taken { .. } => return None,
        };
        st.grants.remove(key);
        let (elapsed, ttl) = match st.regs.get_mut(key) {
            Some(q) => {
                let found = q.iter().find(|r| r.seq == seq).copied();
                q.retain(|r| r.seq > seq);
                found.map_or((None, Duration::ZERO), |r| (Some(r.at.elapsed()), r.ttl))
            }
            None => (None, Duration::ZERO),
        };
        st.mark_contended(token);
        Some(Ok(Attempt::AcquiredEarlier {
            fence: Some(fence),
            age: elapsed,
            ttl,
        }))
    }

    /// Puts back a grant [`take_grant`](Self::take_grant) returned for take-over, when the
    /// attempt that was to take it over failed (unless a newer one came meanwhile).
    pub(crate) fn restore_grant(&self, key: &str, grant: Grant) {
        self.state
            .locked()
            .grants
            .entry(key.to_owned())
            .or_insert(grant);
    }

    /// How long the lock stays handed to another client, if a release of ours just gave it
    /// away while our tasks wait.
    pub(crate) fn elsewhere_left(&self, key: &str) -> Option<Duration> {
        let mut st = self.state.locked();
        let until = *st.elsewhere.get(key)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            st.elsewhere.remove(key);
            return None;
        }
        Some(left)
    }

    /// An attempt with `token` took `key` with `fence`. `after_wait`: it had waited (others
    /// may wait too, and its release may hand over); `watching`: this client hears `key`'s
    /// wake-ups (it may be queued, and a grant may be on its way).
    pub(crate) fn acquired(
        &self,
        key: &str,
        token: &str,
        fence: u64,
        after_wait: bool,
        watching: bool,
    ) {
        if !after_wait && !watching {
            return;
        }
        let mut st = self.state.locked();
        if after_wait {
            st.mark_contended(token);
        }
        if watching {
            st.queued.remove(key);
            // A grant to this token may still be on its way: it is taken.
            match st.grants.get(key) {
                Some(Grant::Handed { token: t, .. }) if t == token => {
                    st.grants.remove(key);
                }
                Some(Grant::Handed { .. }) => {}
                _ => {
                    st.grants.insert(
                        key.to_owned(),
                        Grant::Taken {
                            token: token.to_owned(),
                            fence,
                        },
                    );
                }
            }
        }
    }

    /// A waiting attempt found `key` busy: the script queued our registration `reg` (number
    /// `seq`) if `queued`, else it kept the one we had and `seq` was not used.
    pub(crate) fn busy(&self, key: &str, seq: u64, queued: bool, reg: String) {
        let mut st = self.state.locked();
        if queued {
            st.believe_queued(key, seq, reg);
        } else if let Some(q) = st.regs.get_mut(key) {
            q.retain(|r| r.seq != seq);
        }
    }

    /// Plans the release of `token`'s lock on `key`. `next_ttl`: a task of ours still waits
    /// for it, asking for that TTL (its registration is numbered now).
    pub(crate) fn plan_release(
        &self,
        key: &str,
        token: &str,
        next_ttl: Option<Duration>,
    ) -> ReleasePlan {
        let seq = next_ttl.map_or(0, |_| self.seq());
        let mut st = self.state.locked();
        let mut lead = next_ttl.is_some();
        if !st.contended.is_empty() && st.contended.remove(token) {
            lead = true;
        }
        // Only a queued release can leave a hint: read the wake count only then.
        let wakes = if let Some(ttl) = next_ttl {
            st.register(seq, key, ttl);
            st.wakes
        } else {
            0
        };
        let believed = if st.queued.is_empty() {
            String::new()
        } else {
            st.queued.get(key).cloned().unwrap_or_default()
        };
        ReleasePlan {
            lead,
            seq,
            wakes,
            believed,
        }
    }

    /// What the release script answered, recorded: `mine` is the registration sent for our
    /// next task (with token `next_token`), if any. `None`: an answer the plan did not allow.
    pub(crate) fn released(
        &self,
        key: &str,
        reply: &ReleaseReply,
        plan: ReleasePlan,
        mine: String,
        next_token: Option<&str>,
    ) -> Option<LeaseCheck> {
        if next_token.is_none() && plan.believed.is_empty() {
            // A plain release: nothing of ours to keep track of.
            return match reply {
                ReleaseReply::HandedOverRequeued | ReleaseReply::HandedToOwn { .. } => None,
                other => Some(other.check()),
            };
        }
        let mut st = self.state.locked();
        match (reply, next_token) {
            (ReleaseReply::HandedOver | ReleaseReply::HandedOverRequeued, Some(_)) => {
                let requeued = matches!(reply, ReleaseReply::HandedOverRequeued);
                st.handed_elsewhere(key, requeued, plan.seq, mine, plan.wakes);
                Some(LeaseCheck::Ours)
            }
            (ReleaseReply::Freed | ReleaseReply::HandedOver, _) => {
                st.queued.remove(key);
                Some(LeaseCheck::Ours)
            }
            (ReleaseReply::HandedToOwn { fence }, Some(token)) => {
                // Handed to our own next task.
                st.queued.remove(key);
                st.grants.insert(
                    key.to_owned(),
                    Grant::Handed {
                        token: token.to_owned(),
                        fence: *fence,
                        seq: plan.seq,
                    },
                );
                Some(LeaseCheck::Ours)
            }
            (ReleaseReply::Missing | ReleaseReply::Foreign, _) => Some(reply.check()),
            _ => None,
        }
    }

    /// A grant for `name` came (see [`parse_grant`]).
    pub(crate) fn granted(&self, name: &str, fence: u64, seq: u64, token: &str) {
        let mut st = self.state.locked();
        st.woken(name);
        st.record_grant(name, fence, seq, token);
    }

    /// A release took our registration for `name` out of the queue and told us to try.
    pub(crate) fn told_to_try(&self, name: &str) {
        let mut st = self.state.locked();
        st.woken(name);
        st.queued.remove(name);
    }

    /// `name`'s lock key is gone (a keyspace event).
    pub(crate) fn key_gone(&self, name: &str) {
        self.state.locked().woken(name);
    }

    /// Whether an attempt of ours took the lock this grant (of `token`, with `fence`) hands
    /// over: then a task holds it, and the message, late, must not pass it on. Forgets the
    /// record.
    pub(crate) fn took_already(&self, token: &str, fence: u64) -> bool {
        let mut st = self.state.locked();
        let found = st.grants.iter().find_map(|(name, g)| match g {
            Grant::Taken { token: t, fence: f } if t == token && *f == fence => Some(name.clone()),
            _ => None,
        });
        found.is_some_and(|name| st.grants.remove(&name).is_some())
    }

    /// Whether this client must leave `key`'s queue now that nobody here waits: a registration
    /// of ours is still queued, or a lock was handed to us that nobody took.
    pub(crate) fn must_leave(&self, key: &str) -> bool {
        let st = self.state.locked();
        st.queued.contains_key(key) || matches!(st.grants.get(key), Some(Grant::Handed { .. }))
    }

    /// The subscription was (re)opened or lost: events may have been missed. Hints end, and
    /// releases that found us deaf (`PUBLISH` reached nobody) dropped our registrations.
    pub(crate) fn forget_hints(&self) {
        let mut st = self.state.locked();
        st.wakes += 1;
        st.elsewhere.clear();
        st.queued.clear();
    }

    /// An exclusive waiter of this client starts waiting for `key`.
    pub(crate) fn writer_waits(&self, key: &str) {
        *self
            .state
            .locked()
            .writers
            .entry(key.to_owned())
            .or_default() += 1;
    }

    /// An exclusive waiter of this client stops waiting for `key`: whether it was the last.
    pub(crate) fn writer_done(&self, key: &str) -> bool {
        let mut st = self.state.locked();
        let Some(n) = st.writers.get_mut(key) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            st.writers.remove(key);
            return true;
        }
        false
    }

    /// Whether an exclusive waiter of this client waits for `key` (a grant then finds a task
    /// to take it).
    pub(crate) fn writer_waiting(&self, key: &str) -> bool {
        self.state.locked().writers.contains_key(key)
    }

    /// Nobody of this client waits for `key` any more: forgets our place in its queue, and
    /// returns the token of a lock handed to us meanwhile that nobody took (or empty), to pass
    /// on.
    pub(crate) fn leave(&self, key: &str) -> String {
        let mut st = self.state.locked();
        st.regs.remove(key);
        st.queued.remove(key);
        st.served.remove(key);
        // A `Taken` record stays: its grant message may still come, and must not pass on a
        // lock a task of ours holds.
        if matches!(st.grants.get(key), Some(Grant::Handed { .. }))
            && let Some(Grant::Handed { token, .. }) = st.grants.remove(key)
        {
            token
        } else {
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_the_release_queued_is_believed_unless_its_own_grant_came_first() {
        // A wake-up came while the release was in flight: the late message of a grant (number
        // 4) whose lock a task of ours had already taken by an attempt.
        let mut st = WaitState::default();
        st.served.insert("k".into(), 4);
        st.wakes = 1;
        st.handed_elsewhere("k", true, 7, "reg7".into(), 0);
        assert_eq!(st.queued.get("k").map(String::as_str), Some("reg7"));
        assert!(st.elsewhere.is_empty(), "a wake-up came: no hint");

        // The grant for the registration just queued came before the reply: it has gone.
        let mut st = WaitState::default();
        st.served.insert("k".into(), 7);
        st.handed_elsewhere("k", true, 7, "reg7".into(), 0);
        assert!(st.queued.is_empty());
        assert!(st.elsewhere.contains_key("k"), "no wake-up: the hint stays");

        // The script kept the registration we believed in: the belief is left as it is.
        let mut st = WaitState::default();
        st.queued.insert("k".into(), "reg3".into());
        st.wakes = 2;
        st.handed_elsewhere("k", false, 7, "reg7".into(), 1);
        assert_eq!(st.queued.get("k").map(String::as_str), Some("reg3"));
    }

    fn handed(st: &WaitState, name: &str) -> Option<(String, u64, u64)> {
        match st.grants.get(name)? {
            Grant::Handed { token, fence, seq } => Some((token.clone(), *fence, *seq)),
            Grant::Taken { .. } => None,
        }
    }

    /// A state where the task with token `t` took lock `k` with fence 5.
    fn took_t_with_fence_5() -> WaitState {
        let mut st = WaitState::default();
        st.grants.insert(
            "k".into(),
            Grant::Taken {
                token: "t".into(),
                fence: 5,
            },
        );
        st
    }

    #[test]
    fn the_message_of_a_grant_an_attempt_already_took_is_ignored() {
        let mut st = took_t_with_fence_5();
        st.record_grant("k", 5, 1, "t");
        assert!(st.grants.is_empty());
    }

    #[test]
    fn a_later_grant_to_a_token_that_took_the_lock_before_is_kept_for_take_over() {
        // The token's task took the lock (fence 5) and released it; another registration of
        // the same token was still queued, and a release handed the lock to it (fence 7).
        // Dropping that message left the lock with nobody until its TTL ran out.
        let mut st = took_t_with_fence_5();
        st.queued.insert("k".into(), "reg".into());
        st.record_grant("k", 7, 3, "t");
        assert_eq!(handed(&st, "k"), Some(("t".into(), 7, 3)));
        assert!(st.queued.is_empty());
        // Another token's Taken mark does not hide a grant either.
        st.record_grant("j", 9, 4, "u");
        assert_eq!(handed(&st, "j"), Some(("u".into(), 9, 4)));
    }

    #[test]
    fn grants_parse_and_anything_else_does_not() {
        assert_eq!(
            parse_grant(b"\t12 3 tok lock:key with space"),
            Some((12, 3, "tok", "lock:key with space"))
        );
        for bad in [&b"12 3 tok k"[..], b"\tx 3 tok k", b"\t12 3 tok", b"\t"] {
            assert_eq!(parse_grant(bad), None);
        }
    }
}
