//! Arrival order across kinds: waiters' tickets in the table `distlock_waiters`.
//!
//! Advisory locks are tried, never waited for in the server (a wait would hold a pooled
//! session), so on their own they serve whoever tries first when a lock is freed: a stream of
//! readers can keep a writer out for ever. A waiter therefore takes a ticket, a row of
//! `(lock_id, seq, kind, until)` numbered by an identity column, after its first busy attempt,
//! and every attempt's statement tries the advisory lock only when no live ticket that
//! conflicts with it is ahead: behind every ticket for an attempt without one, behind the
//! tickets with a lower number for a waiter. A reader conflicts with a waiting writer's ticket,
//! a writer with any; a permit with any earlier permit's ticket (first come, first served).
//!
//! A ticket lives while its waiter keeps trying: each attempt moves its `until` to a few times
//! the time since the waiter's previous attempt (at least [`GRACE_MIN`], at most the lease's
//! TTL). A waiter that stops (it got the lock, gave up, or its process died) holds nobody back
//! for longer than that: the lock, the release of a given-up reader or permit, and the next
//! attempt after a lapse each delete or ignore it. Rows whose `until` passed long ago are
//! swept by the next ticket of the same lock.
//!
//! The table is `UNLOGGED`: tickets are about waiters of the moment, which a server crash
//! ends anyway.

use std::collections::HashMap;
use std::time::Duration;

use distlock_core::engine::{AcquireRequest, ErrorKind, LeaseKind, LockError, MutexExt};
use tokio::time::Instant;

use super::{PgBackend, ttl_ms};
use crate::error::map_err;

/// The least time a ticket outlives its waiter's last attempt.
pub(super) const GRACE_MIN: Duration = Duration::from_secs(1);

/// The code of a ticket's kind in the table.
pub(super) fn kind_code(kind: LeaseKind) -> i16 {
    match kind {
        LeaseKind::Exclusive => 0,
        LeaseKind::Shared => 1,
        _ => 2,
    }
}

/// The condition that a live ticket holds back an attempt of `kind` on the lock id `$1`, with
/// the parameter `seq` its own ticket's number (NULL: behind every ticket).
pub(super) fn ahead_sql(schema: &str, kind: LeaseKind, seq: &str) -> String {
    let conflicts = match kind {
        LeaseKind::Exclusive => "true",
        LeaseKind::Shared => "w.kind = 0",
        _ => "w.kind = 2",
    };
    format!(
        "EXISTS (SELECT 1 FROM {schema}.distlock_waiters w \
                 WHERE w.lock_id = $1::bigint AND w.until > now() \
                   AND ({seq}::bigint IS NULL OR w.seq < {seq}::bigint) AND {conflicts})"
    )
}

/// The table's definition.
pub(super) fn waiters_ddl(schema: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {schema}.distlock_waiters ( \
           lock_id bigint NOT NULL, \
           seq bigint GENERATED ALWAYS AS IDENTITY, \
           kind smallint NOT NULL, \
           until timestamptz NOT NULL, \
           PRIMARY KEY (lock_id, seq))"
    )
}

/// A waiter's ticket, as this client knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    lock_id: i64,
    seq: i64,
    /// When the waiter last tried.
    tried: Instant,
}

/// This client's tickets, by their waiter's token.
#[derive(Debug, Default)]
pub(super) struct Tickets {
    by_token: std::sync::Mutex<HashMap<String, Ticket>>,
}

/// How long a ticket is kept once its waiter has tried: three times the gap between its last
/// two attempts, within [`GRACE_MIN`] and the TTL.
fn grace(gap: Duration, ttl: Duration) -> Duration {
    (gap * 3).min(ttl).max(GRACE_MIN)
}

/// Tickets not tried for this long are forgotten by the client (their row has lapsed).
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl PgBackend {
    /// The number of `token`'s ticket, if it has one.
    pub(super) fn ticket_seq(&self, token: &str) -> Option<i64> {
        self.inner
            .tickets
            .by_token
            .locked()
            .get(token)
            .map(|t| t.seq)
    }

    /// After a busy waiting attempt: takes a ticket for it, or keeps its ticket alive.
    ///
    /// # Errors
    /// The server's; the attempt is then busy all the same (an attempt without a ticket only
    /// waits behind the others).
    pub(super) async fn keep_ticket(
        &self,
        req: &AcquireRequest<'_>,
        lock_id: i64,
    ) -> Result<(), LockError> {
        const DOING: &str = "queueing for a PostgreSQL lock";
        let token = req.token.as_str();
        let now = Instant::now();
        let known = self.inner.tickets.by_token.locked().get(token).copied();
        let s = &self.config().schema;
        let session = self.inner.pool.any_session().await?;
        let client = &session.conn().client;
        let limit = self.config().response_timeout;
        let run = async {
            match known {
                Some(t) => {
                    let keep = ttl_ms(grace(now.duration_since(t.tried), req.ttl));
                    let n = client
                        .execute(
                            &format!(
                                "UPDATE {s}.distlock_waiters \
                                 SET until = now() + $3::bigint * interval '1 millisecond' \
                                 WHERE lock_id = $1 AND seq = $2"
                            ),
                            &[&t.lock_id, &t.seq, &keep],
                        )
                        .await?;
                    Ok::<_, tokio_postgres::Error>((n > 0).then_some(t.seq))
                }
                None => Ok(None),
            }
        };
        let kept = tokio::time::timeout(limit, run)
            .await
            .map_err(|_| timeout(DOING, limit))?
            .map_err(|e| map_err(e, DOING))?;
        let seq = match kept {
            Some(seq) => seq,
            // A new ticket (or one swept after a long lapse): at the back. Tickets long
            // lapsed of the same lock go.
            None => {
                let keep = ttl_ms(GRACE_MIN);
                let insert = format!(
                    "WITH gone AS (DELETE FROM {s}.distlock_waiters \
                                   WHERE lock_id = $1 AND until < now() - interval '1 minute') \
                     INSERT INTO {s}.distlock_waiters (lock_id, kind, until) \
                     VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond') \
                     RETURNING seq"
                );
                let code = kind_code(req.kind);
                let row = tokio::time::timeout(
                    limit,
                    client.query_one(&insert, &[&lock_id, &code, &keep]),
                )
                .await
                .map_err(|_| timeout(DOING, limit))?
                .map_err(|e| map_err(e, DOING))?;
                row.get(0)
            }
        };
        let mut tickets = self.inner.tickets.by_token.locked();
        tickets.retain(|_, t| now.duration_since(t.tried) < FORGET_AFTER);
        tickets.insert(
            token.to_owned(),
            Ticket {
                lock_id,
                seq,
                tried: now,
            },
        );
        Ok(())
    }

    /// Deletes `token`'s ticket, if it has one (its waiter got the lock or gave up). A delete
    /// that fails leaves the row to lapse.
    pub(super) async fn drop_ticket(&self, token: &str) {
        let Some(t) = self.inner.tickets.by_token.locked().remove(token) else {
            return;
        };
        let Ok(session) = self.inner.pool.any_session().await else {
            return;
        };
        let s = &self.config().schema;
        let delete = format!("DELETE FROM {s}.distlock_waiters WHERE lock_id = $1 AND seq = $2");
        let _ = tokio::time::timeout(
            self.config().response_timeout,
            session
                .conn()
                .client
                .execute(&delete, &[&t.lock_id, &t.seq]),
        )
        .await;
    }

    /// The live tickets of the lock id `id` (its waiters).
    pub(super) async fn waiting(&self, id: i64) -> Result<u64, LockError> {
        const DOING: &str = "counting a PostgreSQL lock's waiters";
        let session = self.inner.pool.any_session().await?;
        let s = &self.config().schema;
        let count = format!(
            "SELECT count(*) FROM {s}.distlock_waiters WHERE lock_id = $1 AND until > now()"
        );
        let limit = self.config().response_timeout;
        let row = tokio::time::timeout(limit, session.conn().client.query_one(&count, &[&id]))
            .await
            .map_err(|_| timeout(DOING, limit))?
            .map_err(|e| map_err(e, DOING))?;
        let n: i64 = row.get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

fn timeout(doing: &str, limit: Duration) -> LockError {
    LockError::new(
        ErrorKind::Timeout,
        format!("{doing}: no answer within {limit:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_outlives_a_few_polls_within_bounds() {
        let ttl = Duration::from_secs(30);
        assert_eq!(grace(Duration::from_millis(5), ttl), GRACE_MIN);
        assert_eq!(grace(Duration::from_secs(2), ttl), Duration::from_secs(6));
        assert_eq!(grace(Duration::from_secs(20), ttl), ttl);
        // A TTL under the floor: the floor still (a ticket that lapses between polls orders
        // nothing).
        assert_eq!(
            grace(Duration::from_secs(2), Duration::from_millis(500)),
            GRACE_MIN
        );
    }

    #[test]
    fn readers_wait_behind_writers_only() {
        let shared = ahead_sql("s", LeaseKind::Shared, "$4");
        assert!(shared.contains("w.kind = 0"), "{shared}");
        assert!(ahead_sql("s", LeaseKind::Exclusive, "$4").contains("AND true)"));
        let permit = ahead_sql("s", LeaseKind::Permit { permits: 3 }, "$5");
        assert!(permit.contains("w.kind = 2"), "{permit}");
        assert!(permit.contains("w.seq < $5::bigint"), "{permit}");
    }
}
