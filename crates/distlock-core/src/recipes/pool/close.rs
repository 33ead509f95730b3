//! Closing sessions: one at once, for a reason that every lease on it is lost with; those that
//! have stayed empty, before the server's idle timeout does; and every one when the pool goes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{Session, SessionOps, SessionPool};
use crate::engine::LostReason;
use crate::sync::MutexExt;

/// How often the pool looks for sessions that have stayed empty, to close them before the
/// server's idle timeout does (a clean close, not a server-side error in its log).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a session with no timeout set may stay empty before the pool closes it.
const EMPTY_UNTIMED: Duration = Duration::from_secs(60);

impl<O: SessionOps> SessionPool<O> {
    /// Ends a session now, for `why`: every lease on it is lost.
    pub fn close(&self, session: &Session<O::Conn>, why: LostReason) {
        session.end.end(why);
        self.ops.close(&session.conn);
        self.state.locked().sessions.remove(&session.id);
        self.room.notify_waiters();
    }

    /// Closes sessions that have stayed empty for half their idle timeout.
    fn sweep_once(&self) {
        let now = Instant::now();
        let stale: Vec<Arc<Session<O::Conn>>> = {
            let st = self.state.locked();
            st.sessions
                .values()
                .filter(|s| s.keys.is_empty() && s.placing == 0)
                .filter(|s| {
                    let limit = s.timeout.map_or(EMPTY_UNTIMED, |t| t / 2);
                    s.empty_since.is_some_and(|e| now >= e + limit) || s.session.is_over()
                })
                .map(|s| s.session.clone())
                .collect()
        };
        for s in stale {
            self.close(&s, LostReason::Expired);
        }
    }
}

impl<O: SessionOps> Drop for SessionPool<O> {
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for s in st.sessions.values() {
            self.ops.close(&s.session.conn);
        }
    }
}

/// The pool's sweeping task: every [`SWEEP_EVERY`], until the pool is gone.
pub(super) async fn sweep<O: SessionOps>(pool: Weak<SessionPool<O>>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(pool) = pool.upgrade() else { return };
        pool.sweep_once();
    }
}
