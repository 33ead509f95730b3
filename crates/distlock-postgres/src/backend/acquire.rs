//! An acquire: the lock id and its name recorded, a resent request found held already, one
//! try of the lease's kind (see `kinds` and `permits`), an election leader's row (see `recorded`), and the
//! waiter's ticket kept or dropped (see `order`).

use distlock_core::engine::{AcquireRequest, Attempt, LeaseKind, LockError};
use distlock_core::recipes::pool::{PoolLease, SessionPool};

use super::{PgBackend, PgConn, PgOps, names};

/// A lease the statement took, once the pool has recorded it (`Busy` if its session ended
/// meanwhile).
pub(super) fn confirmed(
    pool: &SessionPool<PgOps>,
    lease: &PoolLease<PgConn>,
    sent: tokio::time::Instant,
    req: &AcquireRequest<'_>,
    fence: i64,
) -> Attempt {
    if pool.confirm(lease, sent, req.ttl, req.renewed) {
        Attempt::Acquired {
            fence: u64::try_from(fence).ok(),
        }
    } else {
        Attempt::Busy { holder_ttl: None }
    }
}

impl PgBackend {
    /// One attempt (`Backend::acquire`).
    pub(super) async fn acquire_inner(
        &self,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempt, LockError> {
        // The id a waiter's ticket names (see `order`): the lock's, or the semaphore's base;
        // recorded with the name for `distlock list` (the server knows the lock by its id
        // only).
        let (id, new_name) = self.name_id(req.name, req.kind);
        // Sent when this call ends, or is dropped half-way: the writer's connection is not
        // opened beside the attempt's.
        let _name = new_name.then(|| names::NameToSend {
            backend: self,
            name: req.name,
            kind: req.kind,
            id,
        });
        let pool = &self.inner.pool;
        let token = req.token.as_str();
        if pool.resent_and_held(req) {
            // The reply came after all: the lock is ours already (never locked twice: a
            // session-level advisory lock counts its acquisitions). A recorded holder's fence
            // is known.
            return Ok(Attempt::Acquired {
                fence: self.recorded_fence(token),
            });
        }
        let seq = self.ticket_seq(token);
        let attempt = match req.kind {
            LeaseKind::Permit { permits } => self.acquire_permit(req, permits, id, seq).await?,
            _ => self.try_lock(req, id, seq).await?,
        };
        if let (true, LeaseKind::Exclusive, Attempt::Acquired { fence: Some(fence) }) =
            (req.recorded, req.kind, attempt)
            && let Err(e) = self.record(req, fence).await
        {
            // Not a holder status can name: the lock goes back.
            let _ = self.inner.pool.release(req.name, token).await;
            return Err(e);
        }
        match attempt {
            Attempt::Busy { .. } if req.mode.waits() => {
                // A waiter: in the queue from now, or kept in it.
                if let Err(e) = self.keep_ticket(req, id).await {
                    tracing::debug!(target: "distlock", key = req.name, error = %e,
                        "no ticket for a PostgreSQL waiter: it waits unordered this round");
                }
            }
            Attempt::Busy { .. } => {}
            _ if seq.is_some() => self.drop_ticket(token).await,
            _ => {}
        }
        Ok(attempt)
    }
}
