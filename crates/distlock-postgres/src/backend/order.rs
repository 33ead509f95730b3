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
//! A client writes its tickets on a session of its own, its queue session, which also holds
//! each live ticket's marker (see `marker`): an attempt without a ticket reads the table only
//! when a marker says that somebody may wait.
//!
//! The table is `UNLOGGED`: tickets are about waiters of the moment, which a server crash
//! ends anyway.

use std::collections::HashMap;
use std::time::Duration;

use distlock_core::engine::{AcquireRequest, LeaseKind, LockError};
use distlock_core::recipes::MutexExt;
use tokio::time::Instant;

use super::{PgBackend, marker, ttl_ms};
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
    /// When its row lapses, as this client reckons it.
    until: Instant,
    /// The queue session (its generation) that holds the ticket's marker (see `marker`).
    marked: Option<u64>,
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

    /// After a busy waiting attempt: takes a ticket for it (and its marker first, see
    /// `marker`), or keeps its ticket alive; on the client's queue session.
    ///
    /// # Errors
    /// The server's; the attempt is then busy all the same (an attempt without a ticket only
    /// waits behind the others).
    pub(super) async fn keep_ticket(
        &self,
        req: &AcquireRequest<'_>,
        lock_id: i64,
    ) -> Result<(), LockError> {
        self.ticket(req.token.as_str(), req.kind, req.ttl, lock_id)
            .await
    }

    /// A ticket for the waiter `token` (of `kind`, for a lease of `ttl`), new or kept alive:
    /// see [`keep_ticket`](Self::keep_ticket).
    pub(super) async fn ticket(
        &self,
        token: &str,
        kind: LeaseKind,
        ttl: Duration,
        lock_id: i64,
    ) -> Result<(), LockError> {
        const DOING: &str = "queueing for a PostgreSQL lock";
        let now = Instant::now();
        let known = self.inner.tickets.by_token.locked().get(token).copied();
        let q = self.queue_session().await?;
        let client = &q.conn.client;
        let limit = self.config().response_timeout;
        let marked = known.is_some_and(|t| t.marked == Some(q.generation));
        let (k1, k2) = marker::key(lock_id);
        let keep = known.map_or(GRACE_MIN, |t| grace(now.duration_since(t.tried), ttl));
        // Until the ticket is recorded with its marker.
        let unsure = (!marked).then(|| marker::Unsure::new(&q));
        let run = async {
            if !marked {
                client.execute(&q.sql.mark, &[&k1, &k2]).await?;
            }
            let kept = match known {
                Some(t) => {
                    let n = client
                        .execute(&q.sql.keep, &[&t.lock_id, &t.seq, &ttl_ms(keep)])
                        .await?;
                    (n > 0).then_some(t.seq)
                }
                None => None,
            };
            let lives = match kept {
                Some(seq) => (seq, keep),
                // A new ticket (or one swept after a long lapse): at the back. Tickets long
                // lapsed of the same lock go.
                None => {
                    let code = kind_code(kind);
                    let row = client
                        .query_one(&q.sql.insert, &[&lock_id, &code, &ttl_ms(GRACE_MIN)])
                        .await?;
                    (row.get(0), GRACE_MIN)
                }
            };
            Ok::<_, tokio_postgres::Error>(lives)
        };
        // (Failed, a marker taken for no ticket would hold others back for nothing: `unsure`
        // closes the session.)
        let (seq, lives) = tokio::time::timeout(limit, run)
            .await
            .map_err(|_| marker::timeout(DOING, limit))?
            .map_err(|e| map_err(e, DOING))?;
        let forgotten: Vec<(i32, i32)> = {
            let mut tickets = self.inner.tickets.by_token.locked();
            let mut forgotten = Vec::new();
            tickets.retain(|_, t| {
                let keep = now.duration_since(t.tried) < FORGET_AFTER;
                if !keep && t.marked == Some(q.generation) {
                    forgotten.push(marker::key(t.lock_id));
                }
                keep
            });
            tickets.insert(
                token.to_owned(),
                Ticket {
                    lock_id,
                    seq,
                    tried: now,
                    until: now + lives,
                    marked: Some(q.generation),
                },
            );
            forgotten
        };
        if let Some(unsure) = unsure {
            unsure.answered();
        }
        self.inner.queue.changed();
        if !forgotten.is_empty() {
            self.unmark(&q, &forgotten).await;
        }
        Ok(())
    }

    /// Deletes `token`'s ticket, if it has one (its waiter got the lock or gave up), and gives
    /// back its marker. A delete that fails leaves the row to lapse.
    pub(super) async fn drop_ticket(&self, token: &str) {
        if !self.inner.tickets.by_token.locked().contains_key(token) {
            return;
        }
        let limit = self.config().response_timeout;
        let q = self.queue_if_open().await;
        let Some(t) = self.inner.tickets.by_token.locked().remove(token) else {
            return;
        };
        match q {
            Some(q) if t.marked == Some(q.generation) => {
                let unsure = marker::Unsure::new(&q);
                let (k1, k2) = marker::key(t.lock_id);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&t.lock_id, &t.seq, &k1, &k2];
                let left = q.conn.client.execute(&q.sql.leave, &params);
                if matches!(tokio::time::timeout(limit, left).await, Ok(Ok(_))) {
                    unsure.answered();
                }
            }
            // Its marker was given back after a lapse, or ended with an earlier queue
            // session: the row alone.
            Some(q) => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&t.lock_id, &t.seq];
                let deleted = q.conn.client.execute(&q.sql.delete, &params);
                let _ = tokio::time::timeout(limit, deleted).await;
            }
            None => {
                let Ok(session) = self.inner.pool.any_session().await else {
                    return;
                };
                let s = &self.config().schema;
                let delete =
                    format!("DELETE FROM {s}.distlock_waiters WHERE lock_id = $1 AND seq = $2");
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&t.lock_id, &t.seq];
                let deleted = session.conn().client.execute(&delete, &params);
                let _ = tokio::time::timeout(limit, deleted).await;
            }
        }
    }

    /// The markers of tickets whose rows lapsed [`marker::LINGER`] ago: no longer marked (their
    /// waiter takes its marker again if it tries again), with the queue session that held
    /// each.
    pub(super) fn lapsed_markers(&self, now: Instant) -> Vec<(u64, (i32, i32))> {
        let mut tickets = self.inner.tickets.by_token.locked();
        let mut due = Vec::new();
        for t in tickets.values_mut() {
            if let Some(generation) = t.marked
                && t.until + marker::LINGER <= now
            {
                t.marked = None;
                due.push((generation, marker::key(t.lock_id)));
            }
        }
        due
    }

    /// When the next marked ticket lapses.
    pub(super) fn next_lapse(&self) -> Option<Instant> {
        let tickets = self.inner.tickets.by_token.locked();
        tickets
            .values()
            .filter(|t| t.marked.is_some())
            .map(|t| t.until)
            .min()
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
            .map_err(|_| marker::timeout(DOING, limit))?
            .map_err(|e| map_err(e, DOING))?;
        let n: i64 = row.get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }
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
