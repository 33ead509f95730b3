//! One try of a writer's or reader's advisory lock, and a writer's downgrade; a semaphore's
//! permit is in `permits`.

use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Downgrade, ErrorKind, LeaseCheck, LeaseKind, LeaseRef, LockError,
    LostReason,
};
use distlock_core::recipes::pool::Session;

use super::acquire::confirmed;
use super::settings::Fast;
use super::{PgBackend, PgConn, SHARED_PREFIX, Taking, lock_id};
use crate::error::map_err;

#[distlock_core::engine::async_trait]
impl Downgrade for PgBackend {
    /// On the writer's own session: the shared hold is taken (a session's holds never block
    /// each other), then the exclusive one given back. Between the two statements the session
    /// holds both, so no writer of another session can get in.
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        _ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.downgrade_inner(lease).await
    }
}

impl PgBackend {
    async fn downgrade_inner(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "downgrading a PostgreSQL advisory lock to a shared one";
        let pool = &self.inner.pool;
        let token = lease.token.as_str();
        let Some(held) = pool.held(lease.name, token) else {
            return Ok(LeaseCheck::Missing);
        };
        if held.key().starts_with(SHARED_PREFIX) {
            // Done already (a resent request).
            return Ok(LeaseCheck::Ours);
        }
        let session = held.session();
        if session.is_over() {
            return Ok(LeaseCheck::Missing);
        }
        let conn = session.conn();
        let id = lock_id(lease.name);
        let steps = async {
            // (Not prepared when the session opens: a downgrade is rare, and a statement more
            // there would be a round trip more for every session.)
            let limit = self.config().response_timeout;
            let shared: bool = tokio::time::timeout(
                limit,
                conn.client
                    .query_one("SELECT pg_try_advisory_lock_shared($1::bigint)", &[&id]),
            )
            .await
            .map_err(|_| {
                LockError::new(
                    ErrorKind::Timeout,
                    format!("{DOING}: no answer within {limit:?}"),
                )
            })?
            .map_err(|e| map_err(e, DOING))?
            .get(0);
            let unlocked: bool = pool
                .ops()
                .unlock_notifying(conn, &conn.unlock, id, DOING)
                .await?
                .get(0);
            Ok::<_, LockError>(shared && unlocked)
        };
        match steps.await {
            Ok(true) => {
                pool.rekey(lease.name, token, &format!("{SHARED_PREFIX}{id}"));
                Ok(LeaseCheck::Ours)
            }
            Ok(false) | Err(_) if session.is_over() => Ok(LeaseCheck::Missing),
            outcome => {
                // The session's holds are no longer known (a shared hold the pool does not
                // track would block writers until the session ends): end the session, which
                // frees them all. Its leases report lost.
                pool.close(session, LostReason::Unreachable);
                match outcome {
                    Err(e) => Err(e),
                    _ => Err(LockError::new(
                        ErrorKind::Protocol,
                        format!("{DOING}: the session did not hold what the pool recorded"),
                    )),
                }
            }
        }
    }
}

impl PgBackend {
    /// One try of a writer's or reader's lock, behind the live tickets ahead of `seq` (see
    /// `order`).
    pub(super) async fn try_lock(
        &self,
        req: &AcquireRequest<'_>,
        id: i64,
        seq: Option<i64>,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a PostgreSQL advisory lock";
        let pool = &self.inner.pool;
        let token = req.token.as_str();
        let shared = req.kind == LeaseKind::Shared;
        let key = if shared {
            format!("{SHARED_PREFIX}{id}")
        } else {
            id.to_string()
        };
        let mut tries = 0;
        loop {
            let placed = (req.name, key.as_str(), token);
            let Some(lease) = pool.place_try(&mut tries, placed, req.ttl, DOING).await? else {
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            let session: &Session<PgConn> = lease.session();
            let conn = session.conn();
            let sent = tokio::time::Instant::now();
            let keep = || pool.keep_for(session, req.ttl);
            let (statement, fast) = if shared {
                (&conn.acquire_shared, &conn.acquire_shared_fast)
            } else {
                (&conn.acquire, &conn.acquire_fast)
            };
            // An attempt without a ticket tries the fast statement first: it decides when
            // nobody waits and the session's settings stay (see `settings`).
            let fast = match seq {
                None => {
                    pool.ops()
                        .query_fast(conn, fast, &keep, id, req.owner, DOING)
                        .await
                }
                Some(_) => Ok(Fast::Full),
            };
            let row = match fast {
                Ok(Fast::Answered(row)) => Ok(Some(row)),
                Ok(Fast::Full) => {
                    pool.ops()
                        .query_keeping(
                            conn,
                            statement,
                            &keep,
                            Some(Taking::Lock(id, req.owner, seq)),
                            DOING,
                        )
                        .await
                }
                Err(e) => Err(e),
            };
            let fence: Option<i64> = match row {
                Ok(Some(row)) => row.get(0),
                Ok(None) => {
                    pool.withdraw_unknown(&lease).await;
                    return Err(LockError::new(
                        ErrorKind::Protocol,
                        format!("{DOING}: the statement returned no row"),
                    ));
                }
                // PostgreSQL keeps a session-level advisory lock even when the statement that
                // took it failed: it is unlocked (or the session closed).
                Err(e) => {
                    pool.failed(&lease, e).await?;
                    continue;
                }
            };
            let Some(fence) = fence else {
                pool.withdraw(&lease);
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            return Ok(confirmed(pool, &lease, sent, req, fence));
        }
    }
}
