//! The semaphore on advisory locks: N slot locks and a size lock (see
//! `PgBackend::acquire_permit`); its statements, a permit's try and unlock, and its holders
//! for `status`.

use distlock_core::engine::{
    AcquireRequest, Attempt, ErrorKind, LeaseKind, LockError, LockStatus, LostReason,
};
use distlock_core::recipes::pool::Session;
use distlock_core::recipes::{MutexExt, kind_conflict};
use tokio_postgres::Statement;

use super::acquire::confirmed;
use super::status::holder_of;
use super::{APP_TAG, PgBackend, PgConn, PgOps, Taking, lock_id};
use crate::error::{map_err, within};

/// The pool key of a permit of the semaphore with base id `<base>`: `s:p<base>`. As a shared
/// key, many sessions of a client may hold it, but one session only once, so that a session
/// never takes a slot it already holds (advisory locks stack within a session).
pub(super) const PERMIT_PREFIX: &str = "s:p";

/// A semaphore's base id: its slots are `base # i` (XOR) for i below its number of permits,
/// apart from the lock ids of names (`lock_id`), including its own name's.
pub(crate) fn permit_base(name: &str) -> i64 {
    lock_id(&format!("{name}\u{0}permits"))
}

/// The first key of a semaphore's size lock (two int4 keys, the second its number of
/// permits): 31 bits of its base id.
fn size_key(base: i64) -> i32 {
    ((base >> 32) & 0x7fff_ffff) as i32
}

/// A semaphore's statements on one session.
pub(super) struct PermitSql {
    /// The shared hold on the semaphore's size lock `($1, $2)` (two int4 keys: the size is the
    /// second, readable in `pg_locks`), then, once it is ours, another size held by anyone.
    pub(super) size: Statement,
    /// The first free slot of `$2` (`$1 # i`), its fence, the timeout and the label.
    pub(super) take: Statement,
    /// Gives back slot `$1` and the size hold `($2, $3)`; notifies when it gave back a slot
    /// and somebody may wait (the semaphore's marker `($4, $5)`, channel `$6`).
    pub(super) unlock: Statement,
}

/// A permit held (or being taken) on a session: its slot's lock id, once known, and its size
/// lock.
#[derive(Debug, Clone, Copy)]
pub(super) struct PermitHold {
    pub(super) slot: Option<i64>,
    pub(super) size_key: i32,
    pub(super) permits: i32,
    /// The statement that takes a slot was sent and its answer not read (the attempt was
    /// dropped half-way): the session may hold a slot that `slot` does not name.
    pub(super) taking: bool,
}

impl PgOps {
    /// The semaphore statements of `conn`, prepared on first use.
    pub(super) async fn permit_sql<'c>(
        &self,
        conn: &'c PgConn,
    ) -> Result<&'c PermitSql, LockError> {
        const DOING: &str = "preparing the semaphore statements";
        let s = &self.config.schema;
        conn.permit_sql
            .get_or_try_init(|| async {
                let size = "WITH s AS (SELECT pg_try_advisory_lock_shared($1::int, $2::int) AS ok) \
                     SELECT s.ok, \
                            (SELECT l.objid::bigint FROM pg_locks l \
                             WHERE s.ok AND l.locktype = 'advisory' AND l.objsubid = 2 \
                               AND l.granted AND l.classid = $1::int::oid \
                               AND l.objid <> $2::int::oid \
                             LIMIT 1) \
                     FROM s";
                // A recursive query tries one slot at a time, and the next only while none was
                // free: no slot is locked beyond the one it returns (a LIMIT would not promise
                // that).
                // Behind the live tickets ahead (see `order`): no slot is tried then.
                let ahead = super::order::ahead_sql(s, LeaseKind::Permit { permits: 1 }, "$5");
                let take = format!(
                    "WITH RECURSIVE t(i, got) AS ( \
                       SELECT 0, pg_try_advisory_lock($1::bigint # 0::bigint) WHERE NOT {ahead} \
                       UNION ALL \
                       SELECT i + 1, pg_try_advisory_lock($1::bigint # (i + 1)::bigint) \
                       FROM t WHERE NOT got AND i + 1 < $2::int) \
                     SELECT $1::bigint # t.i::bigint, nextval('{s}.distlock_fence'), \
                            set_config('idle_session_timeout', $3::text, false) \
                            || set_config('application_name', \
                                 left('{APP_TAG} - ' || $3::text || ' ' || $4::text, 63), false) \
                     FROM t WHERE got"
                );
                // Its waiters' tickets and marker name the semaphore's base id: `$4`, `$5` its
                // marker, `$6` its channel.
                // (A busy attempt gives back only its size hold, which frees no permit: it
                // notified its own waiter, which tried again at once, a busy loop.)
                let unlock = format!(
                    "SELECT pg_advisory_unlock($1::bigint), \
                            pg_advisory_unlock_shared($2::int, $3::int), {}",
                    super::listen::notify_sql(Some("$1::bigint IS NOT NULL"), "$4", "$5", "$6")
                );
                let (size, take, unlock) = tokio::try_join!(
                    conn.client.prepare(size),
                    conn.client.prepare(&take),
                    conn.client.prepare(&unlock),
                )
                .map_err(|e| map_err(e, DOING))?;
                Ok::<_, LockError>(PermitSql { size, take, unlock })
            })
            .await
    }

    /// Gives back the permit this session holds for the semaphore whose pool key is `key`.
    pub(super) async fn unlock_permit(
        &self,
        conn: &PgConn,
        key: &str,
        base: &str,
    ) -> Result<bool, LockError> {
        const DOING: &str = "releasing a PostgreSQL semaphore permit";
        let base: i64 = base.parse().map_err(|_| {
            LockError::new(ErrorKind::Protocol, format!("not a permit key: {key:?}"))
        })?;
        let hold = conn.permits.locked().get(&base).copied();
        let Some(hold) = hold else {
            // Nothing of it was ever sent on this session.
            return Ok(false);
        };
        let sql = self.permit_sql(conn).await?;
        let hold = match hold {
            PermitHold {
                slot: None,
                taking: true,
                ..
            } => PermitHold {
                slot: self.slot_held(conn, base, hold.permits).await?,
                ..hold
            },
            _ => hold,
        };
        let (k1, k2) = super::marker::key(base);
        let channel = format!("{}{base}", super::listen::CHANNEL);
        let row = self
            .query_one(
                conn,
                &sql.unlock,
                &[
                    &hold.slot,
                    &hold.size_key,
                    &hold.permits,
                    &k1,
                    &k2,
                    &channel,
                ],
                DOING,
            )
            .await?;
        conn.permits.locked().remove(&base);
        // (A slot of NULL: only the size hold was taken; the slot's unlock answers NULL.)
        let (slot, size): (Option<bool>, bool) = (row.get(0), row.get(1));
        Ok(slot.unwrap_or(false) && size)
    }
}

impl PgOps {
    /// The slot of the semaphore `base` (of `permits`) that this session holds, if any: after
    /// an attempt dropped half-way, whose statement took the first free slot (or none) with
    /// nobody to read which. (Rare: it reads `pg_locks`.)
    async fn slot_held(
        &self,
        conn: &PgConn,
        base: i64,
        permits: i32,
    ) -> Result<Option<i64>, LockError> {
        const DOING: &str = "finding the slot a PostgreSQL permit took";
        let limit = self.config.response_timeout;
        let row = tokio::time::timeout(
            limit,
            conn.client.query_opt(
                "SELECT s.slot FROM (SELECT $1::bigint # i::bigint AS slot \
                                     FROM generate_series(0, $2::int - 1) i) s \
                 JOIN pg_locks l ON l.pid = pg_backend_pid() AND l.locktype = 'advisory' \
                   AND l.objsubid = 1 AND l.granted \
                   AND l.classid = ((s.slot >> 32) & 4294967295)::oid \
                   AND l.objid = (s.slot & 4294967295)::oid \
                 LIMIT 1",
                &[&base, &permits],
            ),
        )
        .await
        .map_err(|_| super::marker::timeout(DOING, limit))?
        .map_err(|e| map_err(e, DOING))?;
        Ok(row.map(|r| r.get(0)))
    }
}

impl PgBackend {
    /// One of `permits` permits of the semaphore `req.name` (whose base id is `base`): on a
    /// pooled session that holds no other permit of it, the size hold (the number of permits,
    /// which other holders check), then the first free slot, its fence, the session's timeout
    /// and label, in one statement.
    pub(super) async fn acquire_permit(
        &self,
        req: &AcquireRequest<'_>,
        permits: u32,
        base: i64,
        seq: Option<i64>,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a PostgreSQL semaphore permit";
        let pool = &self.inner.pool;
        let token = req.token.as_str();
        let n = i32::try_from(permits)
            .map_err(|_| LockError::new(ErrorKind::Config, "too many permits"))?;
        let size = size_key(base);
        let key = format!("{PERMIT_PREFIX}{base}");
        let mut tries = 0;
        loop {
            let placed = (req.name, key.as_str(), token);
            let Some(lease) = pool.place_try(&mut tries, placed, req.ttl, DOING).await? else {
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            let session: &Session<PgConn> = lease.session();
            let conn = session.conn();
            let sent = tokio::time::Instant::now();
            let sql = match pool.ops().permit_sql(conn).await {
                Ok(sql) => sql,
                Err(e) => {
                    pool.withdraw(&lease);
                    return Err(e);
                }
            };
            // Recorded before anything is sent: a release of this key gives back whatever of
            // it the session took.
            conn.permits.locked().insert(
                base,
                PermitHold {
                    slot: None,
                    size_key: size,
                    permits: n,
                    taking: false,
                },
            );
            let give_back = || async {
                let _ = pool
                    .ops()
                    .unlock_permit(conn, &key, &key[PERMIT_PREFIX.len()..])
                    .await;
                pool.withdraw(&lease);
            };
            let sized = pool
                .ops()
                .query_one(conn, &sql.size, &[&size, &n], DOING)
                .await;
            let theirs: Option<i64> = match sized {
                Ok(row) => row.get(1),
                Err(e) => {
                    if session.is_over() {
                        conn.permits.locked().remove(&base);
                    }
                    pool.failed(&lease, e).await?;
                    continue;
                }
            };
            if let Some(theirs) = theirs {
                give_back().await;
                return Err(kind_conflict(
                    req.name,
                    req.kind,
                    LeaseKind::Permit {
                        permits: u32::try_from(theirs).unwrap_or(0),
                    },
                ));
            }
            let keep = || pool.keep_for(session, req.ttl);
            let taking = |on: bool| {
                if let Some(h) = conn.permits.locked().get_mut(&base) {
                    h.taking = on;
                }
            };
            taking(true);
            let taken = pool
                .ops()
                .query_keeping(
                    conn,
                    &sql.take,
                    &keep,
                    Some(Taking::Permit(base, n, req.owner, seq)),
                    DOING,
                )
                .await;
            taking(false);
            let row = match taken {
                Ok(Some(row)) => row,
                Ok(None) => {
                    give_back().await;
                    return Ok(Attempt::Busy { holder_ttl: None });
                }
                Err(e) if !session.is_over() => {
                    // Which slot it took, if any, is not known: the session goes, and with it
                    // everything it held.
                    pool.withdraw(&lease);
                    pool.close(session, LostReason::Unreachable);
                    return Err(e);
                }
                Err(e) => {
                    conn.permits.locked().remove(&base);
                    pool.failed(&lease, e).await?;
                    continue;
                }
            };
            let (slot, fence): (i64, i64) = (row.get(0), row.get(1));
            if let Some(h) = conn.permits.locked().get_mut(&base) {
                h.slot = Some(slot);
            }
            return Ok(confirmed(pool, &lease, sent, req, fence));
        }
    }
}

impl PgBackend {
    /// The holders of the semaphore `name`: one row per session holding its size lock, with
    /// the session's label (a shared session's label carries no fence).
    pub(super) async fn semaphore_status(
        &self,
        conn: &PgConn,
        name: &str,
    ) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a PostgreSQL semaphore's status";
        let size = size_key(permit_base(name));
        let rows = within(
            self.config().response_timeout,
            DOING,
            conn.client.query(
                "SELECT a.application_name, \
                        CASE WHEN a.state = 'idle' \
                             THEN (extract(epoch FROM now() - a.state_change) * 1000)::bigint END, \
                        l.objid::bigint \
                 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
                   AND l.classid = $1::int::oid",
                &[&size],
            ),
        )
        .await?;
        let holders = rows
            .iter()
            .map(|row| {
                let app: Option<String> = row.get(0);
                let idle: Option<i64> = row.get(1);
                let permits: i64 = row.get(2);
                let kind = LeaseKind::Permit {
                    permits: u32::try_from(permits).unwrap_or(0),
                };
                // (A shared session's label has no fence.)
                holder_of(kind, app, idle)
            })
            .collect::<Vec<_>>();
        // The waiters of the semaphore, or of a lock of that name that is free this instant.
        let waiters = if holders.is_empty() {
            self.waiting(lock_id(name)).await?
        } else {
            self.waiting(permit_base(name)).await?
        };
        Ok(LockStatus::held_by(holders).with_waiters(Some(waiters)))
    }
}
