//! A lock's status: the sessions that hold its advisory lock, each described by the holder
//! label in its `application_name` (or by its row in `distlock_holders`, see `recorded`), and
//! its waiters; a semaphore's in `permits`.

use std::time::Duration;

use distlock_core::engine::{HolderStatus, LeaseKind, LockError, LockStatus};
use distlock_core::recipes::HolderValue;

use super::{APP_TAG, PgBackend, lock_id};
use crate::error::within;

/// A holder label read (for the fuzz targets: `crate::fuzzing`).
#[cfg(fuzzing)]
pub(crate) fn fuzz_label(app: &str) -> Option<(Option<u64>, i64, String)> {
    parse_label(app)
}

/// Reads a holder label: its fence (`-` on a shared session, whose locks have one each), TTL in
/// milliseconds and owner.
fn parse_label(app: &str) -> Option<(Option<u64>, i64, String)> {
    let mut words = app.splitn(4, ' ');
    if words.next()? != APP_TAG {
        return None;
    }
    let fence = match words.next()? {
        "-" => None,
        f => Some(f.parse().ok()?),
    };
    let ttl = words.next()?.parse().ok()?;
    Some((fence, ttl, words.next().unwrap_or_default().to_owned()))
}

/// A holding session as `status` lists it, from its label in `application_name` ("<tag> <fence
/// or -> <ttl ms> <owner>", as the acquire wrote it; another role's session may show nothing,
/// and a session that changed its application_name shows that) and how long it has been idle.
pub(super) fn holder_of(kind: LeaseKind, app: Option<String>, idle: Option<i64>) -> HolderStatus {
    match app.as_deref().and_then(parse_label) {
        Some((fence, ttl, owner)) => {
            let remaining = ttl.saturating_sub(idle.unwrap_or(0));
            HolderStatus::new(kind)
                .owner(Some(owner))
                .fence(fence)
                .ttl(Some(Duration::from_millis(
                    u64::try_from(remaining).unwrap_or(0),
                )))
        }
        None => HolderStatus::new(kind).owner(app),
    }
}

impl PgBackend {
    /// Every session that holds the lock (one writer, or every reader), each with the label
    /// its acquire wrote, and the number of waiters (their live tickets: see `order`).
    pub(super) async fn status(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a PostgreSQL lock's status";
        let id = lock_id(key);
        let session = self.inner.pool.any_session().await?;
        let conn = session.conn();
        let rows = within(
            self.config().response_timeout,
            DOING,
            conn.client.query(&conn.status, &[&id]),
        )
        .await?;
        if rows.is_empty() {
            return self.semaphore_status(conn, key).await;
        }
        let mut last_fence = None;
        let holders = rows
            .iter()
            .map(|row| {
                let app: Option<String> = row.get(0);
                let idle: Option<i64> = row.get(1);
                let last: Option<i64> = row.get(2);
                let shared: Option<bool> = row.get(3);
                let (fence, holder): (Option<i64>, Option<String>) = (row.get(4), row.get(5));
                last_fence = last.and_then(|l| u64::try_from(l).ok());
                let kind = if shared == Some(true) {
                    LeaseKind::Shared
                } else {
                    LeaseKind::Exclusive
                };
                let h = holder_of(kind, app, idle);
                match (fence, holder) {
                    // Recorded by the holder itself (see `recorded`): its own label and fence.
                    (Some(fence), Some(holder)) => {
                        let value = HolderValue::parse(&holder);
                        let token = Some(value.token.to_owned()).filter(|t| !t.is_empty());
                        h.owner(Some(value.label()))
                            .fence(u64::try_from(fence).ok())
                            .token(token)
                    }
                    _ => h,
                }
            })
            .collect();
        let waiters = self.waiting(id).await?;
        Ok(LockStatus::held_by(holders)
            .with_last_fence(last_fence)
            .with_waiters(Some(waiters)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_labels_read_back() {
        assert_eq!(
            parse_label("distlock 42 30000 vm/123"),
            Some((Some(42), 30_000, "vm/123".to_owned()))
        );
        assert_eq!(
            parse_label("distlock - 30000 vm/123"),
            Some((None, 30_000, "vm/123".to_owned()))
        );
        assert_eq!(
            parse_label("distlock 42 30000"),
            Some((Some(42), 30_000, String::new()))
        );
        assert_eq!(parse_label("psql"), None);
        assert_eq!(parse_label("distlock x 1 a"), None);
    }
}
