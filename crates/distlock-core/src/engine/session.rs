//! How the core hears that a session ended: the end itself ([`SessionEnd`]), and what an engine
//! answers for a lease just taken ([`SessionWatch`]).
//!
//! A session usually carries many leases (an etcd lease, a ZooKeeper session, a database
//! connection), so its end is watched once, however many of them are on it, not by a future
//! and a waiter per lease.

use std::sync::Arc;

use tokio::sync::watch;

use super::{BoxFuture, LostReason};

/// Where a session's end is reported: the engine's reader of the connection tells it, and every
/// lease on the session hears it.
#[derive(Clone)]
pub struct SessionEnd(Arc<watch::Sender<Option<LostReason>>>);

impl Default for SessionEnd {
    fn default() -> Self {
        SessionEnd::new()
    }
}

impl std::fmt::Debug for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SessionEnd")
            .field(&*self.0.borrow())
            .finish()
    }
}

impl SessionEnd {
    /// A session that has not ended.
    pub fn new() -> Self {
        SessionEnd(Arc::new(watch::channel(None).0))
    }

    /// The session ended, for `why` (the first reason given stays).
    pub fn end(&self, why: LostReason) {
        self.0.send_if_modified(|e| {
            if e.is_some() {
                return false;
            }
            *e = Some(why);
            true
        });
    }

    /// Whether the session has ended.
    pub fn is_over(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Why the session ended, once it has.
    pub fn reason(&self) -> Option<LostReason> {
        *self.0.borrow()
    }

    /// How many wait for its end.
    #[cfg(test)]
    pub(crate) fn receivers(&self) -> usize {
        self.0.receiver_count()
    }

    /// Resolves with the reason when the session ends.
    pub fn wait(&self) -> BoxFuture<'static, LostReason> {
        let mut rx = self.0.subscribe();
        Box::pin(async move {
            loop {
                if let Some(why) = *rx.borrow_and_update() {
                    return why;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
    }
}

/// How the core learns that the session holding a lease ended
/// ([`Sessions::session_end`](super::Sessions::session_end)).
#[non_exhaustive]
pub enum SessionWatch {
    /// On a session that other leases may share. The core waits for one `end` per `session`,
    /// and when it comes asks [`Sessions::still_on`](super::Sessions::still_on) of each lease
    /// it had on that session: a lease that left it meanwhile (released by the client, moved)
    /// is not lost.
    Shared {
        /// The session among the engine's, unique for as long as the engine lives.
        session: u64,
        /// Its end.
        end: SessionEnd,
    },
    /// A watch of this lease's own, for what no shared session says (a recorded holder's key
    /// deleted, say): resolves with the reason when the lease is lost.
    Own(BoxFuture<'static, LostReason>),
    /// Nothing will say so: the lease is not on a session of the engine's (it ended already).
    Never,
}

impl std::fmt::Debug for SessionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionWatch::Shared { session, end } => f
                .debug_struct("Shared")
                .field("session", session)
                .field("end", end)
                .finish(),
            SessionWatch::Own(_) => f.write_str("Own(..)"),
            SessionWatch::Never => f.write_str("Never"),
        }
    }
}
