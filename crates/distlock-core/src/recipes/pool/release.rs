//! Giving leases back: a release, a held lease moved to a new server name (a downgrade), and
//! a lease nobody renews, released by the client at its deadline; an unlock that fails closes
//! its session, which frees the lock with everything else on it.

use std::time::Duration;

use tokio::time::Instant;

use super::{Key, Session, SessionOps, SessionPool, Tracked};
use crate::engine::{LeaseCheck, LostReason};
use crate::error::LockError;
use crate::sync::MutexExt;
use crate::token::CompactToken;

/// How long a failed unlock waits for the session's reader to report that the session ended,
/// before the pool closes it itself.
const ENDING_GRACE: Duration = Duration::from_millis(100);

impl<O: SessionOps> SessionPool<O> {
    /// Records that the held lease of `token` on `name` now holds the server name `key` on the
    /// same session (a writer downgraded to a reader: the engine took the shared hold and gave
    /// the exclusive one back on that session). `false` when the pool has no such lease.
    pub fn rekey(&self, name: &str, token: &str, key: &str) -> bool {
        let mut st = self.state.locked();
        let name = st.name_hash(name);
        let Some(t) = st.lease_mut(token).filter(|t| t.held() && t.on(name)) else {
            return false;
        };
        let key = Key::new(key);
        let old = std::mem::replace(&mut t.key, key.clone());
        let session = t.session.id;
        if let Some(s) = st.sessions.get_mut(&session) {
            s.keys.rename(&old, key);
        }
        true
    }

    /// Releases the lease of `token` on `name` (held, or left behind by an acquire whose outcome
    /// was never learned).
    ///
    /// # Errors
    /// None so far: a session that cannot unlock is closed, which frees the lock.
    pub async fn release(&self, name: &str, token: &str) -> Result<LeaseCheck, LockError> {
        let tracked = {
            let mut st = self.state.locked();
            match st.tracked(name, token) {
                Some(_) => st.forget(token),
                None => None,
            }
        };
        let Some(tracked) = tracked else {
            return Ok(LeaseCheck::Missing);
        };
        Ok(self.release_tracked(tracked).await)
    }

    /// Unlocks a record the pool has let go of: what [`release`](Self::release) answers.
    async fn release_tracked(&self, t: Tracked<O::Conn>) -> LeaseCheck {
        let was = self.unlock_or_close(&t.session, &t.key).await;
        self.unreserve(&t.session, &t.key);
        match was {
            Some(true) => LeaseCheck::Ours,
            // Closed because the unlock failed: the lock went with the session, which held it
            // while it lived.
            None if t.held() => LeaseCheck::Ours,
            _ => LeaseCheck::Missing,
        }
    }

    /// Unlocks the server name `key` on `session`: whether it was held there, `None` when the
    /// session had to be closed instead (or had ended).
    pub(super) async fn unlock_or_close(
        &self,
        session: &Session<O::Conn>,
        key: &str,
    ) -> Option<bool> {
        if session.is_over() {
            return Some(false);
        }
        match self.ops.unlock(&session.conn, key).await {
            Ok(was) => Some(was),
            Err(_) if session.is_over() => Some(false),
            // The session may be ending right now (the server timed it out, or terminated it),
            // its reader about to say why: that reason, not ours, for the locks on it.
            Err(_)
                if tokio::time::timeout(ENDING_GRACE, session.end.wait())
                    .await
                    .is_ok() =>
            {
                Some(false)
            }
            Err(e) => {
                tracing::warn!(target: "distlock", key, error = %e,
                    "could not unlock on a shared session: closing it, and every lock on it");
                self.close(session, LostReason::Unreachable);
                None
            }
        }
    }

    fn unreserve(&self, session: &Session<O::Conn>, key: &str) {
        {
            let mut st = self.state.locked();
            if let Some(s) = st.sessions.get_mut(&session.id) {
                s.keys.remove(key);
                if s.keys.is_empty() {
                    s.empty_since = Some(Instant::now());
                }
            }
        }
        self.room.notify_waiters();
    }

    /// Its holder no longer renews the lease of `token` on `name`: the client releases it
    /// `ttl` from now (at once for zero).
    pub fn detach(&self, name: &str, token: &str, ttl: Duration) {
        let at = Instant::now() + ttl;
        let lease = {
            let mut st = self.state.locked();
            let name = st.name_hash(name);
            match st.lease_mut(token) {
                Some(t) if t.held() && t.on(name) => {
                    let at = t.release_at().map_or(at, |r| r.min(at));
                    t.set_release_at(Some(at));
                    Some((t.serial, at))
                }
                _ => None,
            }
        };
        if let Some((serial, at)) = lease {
            self.release_at(CompactToken::of(token), serial, at);
        }
    }

    /// Releases the lease of `token` (placement `serial`) at `at`, unless it is released or
    /// its release moves before.
    pub(super) fn release_at(&self, token: CompactToken, serial: u64, at: Instant) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.me.clone();
        rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(pool) = pool.upgrade() else { return };
            let due = {
                let mut st = pool.state.locked();
                let due = st
                    .leases
                    .get(&token)
                    .is_some_and(|t| t.serial == serial && t.release_due(at));
                if due { st.leases.remove(&token) } else { None }
            };
            if let Some(t) = due {
                pool.release_tracked(t).await;
            }
        });
    }
}
