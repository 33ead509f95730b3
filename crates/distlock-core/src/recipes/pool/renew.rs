//! Keeping the leases alive: the idle timeout each statement sets, one keep-alive statement per
//! session for a batch of renewals, and the session each lease's end is heard from.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Session, SessionOps, SessionPool};
use crate::engine::{LeaseCheck, RenewItem, SessionWatch};
use crate::error::LockError;
use crate::sync::MutexExt;
use crate::token::CompactToken;

/// How many leases a renewal call looks up under one hold of the pool's lock.
pub(super) const LOOKUPS_PER_LOCK: usize = 1024;

/// The items of one renewal batch on one session, and the longest TTL they ask.
type Group<C> = (Arc<Session<C>>, Vec<usize>, Duration);

impl<O: SessionOps> SessionPool<O> {
    /// The idle timeout a statement sent now on `session` must set so that it keeps every lease
    /// on it, and a lease of `ttl` from now: at least `ttl`, and more while an earlier lease
    /// was given a later deadline.
    ///
    /// The engine must call it in the order its statements run on the session (under the lock
    /// that orders them): a statement whose timeout was computed earlier must not run after
    /// one computed later, or it could cut the later one's deadline short.
    pub fn keep_for(&self, session: &Session<O::Conn>, ttl: Duration) -> Duration {
        let now = Instant::now();
        let mut st = self.state.locked();
        let Some(s) = st.sessions.get_mut(&session.id) else {
            return ttl;
        };
        let until = s.keep_until.map_or(now + ttl, |k| k.max(now + ttl));
        s.keep_until = Some(until);
        let keep = until.saturating_duration_since(now);
        s.timeout = Some(keep);
        keep
    }

    /// Renews every item: one keep-alive statement per session, all at once. (A chunk of the
    /// watchdog's batch at a time: engines on this pool take [`RENEW_CHUNK`](super::RENEW_CHUNK)
    /// leases a chunk.)
    pub async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        // Per session: the items on it and the longest TTL asked.
        let mut groups: HashMap<u64, Group<O::Conn>> = HashMap::new();
        // The pool's lock is taken per step, not for the whole call (16,384 lookups, a
        // millisecond or two): an acquire or a release in between waits for one step at most.
        for (step, chunk) in items.chunks(LOOKUPS_PER_LOCK).enumerate() {
            let st = self.state.locked();
            for (j, item) in chunk.iter().enumerate() {
                let i = step * LOOKUPS_PER_LOCK + j;
                let lease = &item.lease;
                match st.tracked(lease.name, lease.token.as_str()) {
                    Some(t) if t.held() && !t.session.is_over() => {
                        let g = groups
                            .entry(t.session.id)
                            .or_insert_with(|| (t.session.clone(), Vec::new(), Duration::ZERO));
                        g.1.push(i);
                        g.2 = g.2.max(item.ttl);
                    }
                    _ => out[i] = Some(Ok(LeaseCheck::Missing)),
                }
            }
        }
        let pings = groups.into_values().map(|(session, idx, ttl)| async move {
            let sent = Instant::now();
            self.keepalives.fetch_add(1, Ordering::Relaxed);
            let keep = || self.keep_for(&session, ttl);
            let r = self.ops.ping(&session.conn, &keep).await;
            (session, idx, sent, r)
        });
        for (session, idx, sent, r) in futures_util::future::join_all(pings).await {
            for i in idx {
                out[i] = Some(match &r {
                    Ok(()) => {
                        self.renewed(&items[i], sent);
                        Ok(LeaseCheck::Ours)
                    }
                    // The session is gone, and its locks with it.
                    Err(_) if session.is_over() => Ok(LeaseCheck::Missing),
                    Err(e) => Err(LockError::new(e.kind(), e.message().to_owned())),
                });
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Ok(LeaseCheck::Missing)))
            .collect()
    }

    /// A lease the client releases by itself was renewed (extended): its release moves.
    fn renewed(&self, item: &RenewItem<'_>, sent: Instant) {
        let moved = {
            let mut st = self.state.locked();
            match st.lease_mut(item.lease.token.as_str()) {
                Some(t) if t.release_at.is_some() => {
                    t.set_release_at(Some(sent + item.ttl));
                    Some(t.serial)
                }
                _ => None,
            }
        };
        if let Some(serial) = moved {
            self.release_at(
                CompactToken::of(item.lease.token.as_str()),
                serial,
                sent + item.ttl,
            );
        }
    }

    /// The session holding the lease of `token`, shared with the other leases on it; nothing
    /// if there is none.
    pub fn session_end(&self, token: &str) -> SessionWatch {
        match self.state.locked().lease(token) {
            Some(t) => SessionWatch::Shared {
                session: t.session.id,
                end: t.session.end.clone(),
            },
            None => SessionWatch::Never,
        }
    }

    /// Whether the lease of `token` is on `session` (see
    /// [`Sessions::still_on`](crate::engine::Sessions::still_on)). Only while the pool still tracks
    /// it: one the client released by itself at its deadline (nobody renewed it) ended then, as
    /// expired, whatever its session does after.
    pub fn still_on(&self, token: &str, session: u64) -> bool {
        self.state
            .locked()
            .lease(token)
            .is_some_and(|t| t.session.id == session)
    }
}
