//! Taking a lease on the pool: a session found for it or opened (waiting for room at the cap),
//! and the request's outcome: confirmed, withdrawn, or given back when unknown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::place::{Choice, choose, forget, reserve};
use super::{
    Names, PLACE_TRIES, Placement, PoolLease, Session, SessionEnd, SessionOps, SessionPool,
    SessionState,
};
use crate::error::{ErrorKind, LockError};
use crate::sync::MutexExt;
use crate::token::CompactToken;

/// Decrements the count of sessions being opened if the open is dropped half-way.
struct Opening<'a, O: SessionOps> {
    pool: &'a SessionPool<O>,
    done: bool,
}

impl<O: SessionOps> Drop for Opening<'_, O> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.state.locked().opening -= 1;
            self.pool.room.notify_waiters();
        }
    }
}

impl<O: SessionOps> SessionPool<O> {
    /// Finds a session for a lease of `ttl` on server name `key` (lock `name`, our `token`),
    /// opening one if needed, and reserves the name on it.
    ///
    /// # Errors
    /// The engine's when a session cannot be opened; [`ErrorKind::Exhausted`] when the pool is
    /// at its cap and no session can take the name within the pool's wait.
    pub async fn place(
        &self,
        name: &str,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Placement<O::Conn>, LockError> {
        let give_up = Instant::now() + self.limits.wait;
        // Registered for room before looking (so a change after the look is not missed), but
        // only once a look found none: the common path allocates nothing for it.
        let mut waited = false;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            if waited {
                room.as_mut().enable();
            }
            let open = {
                let mut st = self.state.locked();
                match choose(&mut st, key, ttl, self.limits.sessions) {
                    Choice::HeldHere => return Ok(Placement::HeldHere),
                    Choice::Use(id) => {
                        return Ok(Placement::On(reserve(&mut st, id, name, key, token)));
                    }
                    Choice::Open => {
                        st.opening += 1;
                        true
                    }
                    Choice::Wait if !waited => {
                        waited = true;
                        continue;
                    }
                    Choice::Wait => false,
                }
            };
            if open {
                let mut guard = Opening {
                    pool: self,
                    done: false,
                };
                let end = SessionEnd::new();
                let opened = self.ops.open(end.clone()).await;
                guard.done = true;
                let mut st = self.state.locked();
                st.opening -= 1;
                let conn = match opened {
                    Ok(c) => c,
                    Err(e) => {
                        drop(st);
                        self.room.notify_waiters();
                        return Err(e);
                    }
                };
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let session = Arc::new(Session { id, conn, end });
                st.sessions.insert(
                    id,
                    SessionState {
                        session,
                        ttl,
                        keys: Names::default(),
                        placing: 0,
                        keep_until: None,
                        timeout: None,
                        empty_since: None,
                    },
                );
                let lease = reserve(&mut st, id, name, key, token);
                drop(st);
                // Requests waiting for room may fit on it.
                self.room.notify_waiters();
                return Ok(Placement::On(lease));
            }
            if tokio::time::timeout_at(give_up, room).await.is_err() {
                return Err(LockError::new(
                    ErrorKind::Exhausted,
                    format!(
                        "no session of the pool could take {name:?} within {:?}: all {} are in \
                         use for it (raise sessions= in the URL)",
                        self.limits.wait, self.limits.sessions
                    ),
                ));
            }
        }
    }

    /// The lease was taken: its holder renews it (`renewed`), or the client releases it
    /// `ttl` after `sent`.
    ///
    /// Returns `false` when the request was given up meanwhile and its clean-up released the
    /// name already (the acquire's caller is gone then).
    pub fn confirm(
        &self,
        lease: &PoolLease<O::Conn>,
        sent: Instant,
        ttl: Duration,
        renewed: bool,
    ) -> bool {
        let mut st = self.state.locked();
        let release_at = (!renewed).then_some(sent + ttl);
        let tracked = match st.lease_mut(lease.token.as_str()) {
            Some(t) if t.serial == lease.serial => {
                t.set_held();
                t.set_release_at(release_at);
                true
            }
            _ => false,
        };
        if let Some(s) = st.sessions.get_mut(&lease.session.id) {
            s.placing = s.placing.saturating_sub(1);
            if tracked {
                s.keys.taken(&lease.key);
            }
        }
        drop(st);
        if tracked && let Some(at) = release_at {
            self.release_at(CompactToken::from(&lease.token), lease.serial, at);
        }
        tracked
    }

    /// The next session for one try of an acquire: `Ok(None)` when one of our own sessions
    /// holds `key` already (the lock is busy). A session that ends before the try's statement
    /// ran held nothing, so the acquire may go once more, on another ([`failed`](Self::failed)
    /// says so); `tries` counts them, and after [`PLACE_TRIES`] sessions in a row the acquire
    /// fails (`Connection`, with `doing`).
    ///
    /// # Errors
    /// [`place`](Self::place)'s, and the one above.
    pub async fn place_try(
        &self,
        tries: &mut u32,
        (name, key, token): (&str, &str, &str),
        ttl: Duration,
        doing: &str,
    ) -> Result<Option<PoolLease<O::Conn>>, LockError> {
        if *tries >= PLACE_TRIES {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{doing}: {PLACE_TRIES} sessions in a row ended under the request"),
            ));
        }
        *tries += 1;
        Ok(match self.place(name, key, token, ttl).await? {
            Placement::On(lease) => Some(lease),
            Placement::HeldHere => None,
        })
    }

    /// A try's statement on `lease` failed with `e`. `Ok(())`: its session had ended, so it
    /// took nothing there; try again on another ([`place_try`](Self::place_try)). Otherwise
    /// `e`, once whatever the statement may have taken is given back
    /// ([`withdraw_unknown`](Self::withdraw_unknown)).
    ///
    /// # Errors
    /// `e`, as said.
    pub async fn failed(&self, lease: &PoolLease<O::Conn>, e: LockError) -> Result<(), LockError> {
        if lease.session.is_over() {
            self.withdraw(lease);
            Ok(())
        } else {
            self.withdraw_unknown(lease).await;
            Err(e)
        }
    }

    /// The request did not take the lock (busy, or the session ended under it): its name is
    /// free on the session again.
    pub fn withdraw(&self, lease: &PoolLease<O::Conn>) {
        {
            let mut st = self.state.locked();
            if let Some(s) = st.sessions.get_mut(&lease.session.id) {
                s.placing = s.placing.saturating_sub(1);
            }
            forget(&mut st, lease);
        }
        self.room.notify_waiters();
    }

    /// The request's statement failed, and may have taken the lock: unlock it on the session,
    /// or, if that fails too, close the session (which frees it, with everything else on it).
    pub async fn withdraw_unknown(&self, lease: &PoolLease<O::Conn>) {
        self.unlock_or_close(&lease.session, &lease.key).await;
        self.withdraw(lease);
    }

    /// Any open session, for a read (a status): the least busy one, or a new one.
    ///
    /// # Errors
    /// The engine's when a session cannot be opened; `Exhausted` at the cap with none open.
    pub async fn any_session(&self) -> Result<Arc<Session<O::Conn>>, LockError> {
        {
            let st = self.state.locked();
            if let Some(s) = st
                .sessions
                .values()
                .filter(|s| !s.session.is_over())
                .min_by_key(|s| s.placing)
            {
                return Ok(s.session.clone());
            }
        }
        // Opened as a session of its own; it joins the pool.
        match self.place("", "", "", Duration::ZERO).await? {
            Placement::On(lease) => {
                let session = lease.session.clone();
                self.withdraw(&lease);
                Ok(session)
            }
            Placement::HeldHere => unreachable!("no lease is placed under the empty key"),
        }
    }
}
