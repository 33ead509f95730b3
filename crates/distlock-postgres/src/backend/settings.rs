//! A session's settings (its `idle_session_timeout` and the holder label in
//! `application_name`), and the fast acquire that leaves them as they are.
//!
//! Every lease a session takes sets its timeout to what its locks still need and its label to
//! `distlock - <timeout ms> <owner>`: two `set_config` calls, a quarter of an uncontended
//! acquire's server time. Most acquires would write the values already there (one TTL and one
//! owner per client: the timeout is the latest deadline on the session less now, the new
//! lock's TTL). So the client remembers what the session's statements left in effect, and an
//! attempt without a waiter's ticket whose values are those sends the fast statement (see
//! `marker`), which sets nothing: the session then has the very settings the full statement
//! would have given it. Whatever is not known for sure (a statement that may set them still
//! unanswered, one that failed, whose settings PostgreSQL rolled back, or one dropped
//! half-way) makes the next attempt send the full statement.

use std::time::Duration;

use distlock_core::engine::LockError;
use distlock_core::recipes::MutexExt;
use tokio_postgres::{Row, Statement};

use super::{PgConn, PgOps, marker, ttl_ms};

/// What a session's statements left in effect, as far as the client knows.
#[derive(Debug, Default)]
pub(super) struct Settings {
    state: std::sync::Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// The timeout in ms, when known.
    timeout: Option<i64>,
    /// The label's timeout and owner, when known.
    label: Option<(i64, String)>,
    /// Statements sent that may set them, not answered yet.
    sending: u32,
}

impl Settings {
    /// A statement that may set them is being sent (call it under the session's order lock).
    pub(super) fn sending(&self) -> Sending<'_> {
        self.state.locked().sending += 1;
        Sending {
            settings: self,
            answered: false,
        }
    }

    /// Whether the session has the timeout `ms` and the label of `ms` and `owner` for sure.
    fn are(&self, ms: i64, owner: &str) -> bool {
        let known = self.state.locked();
        known.sending == 0
            && known.timeout == Some(ms)
            && known
                .label
                .as_ref()
                .is_some_and(|(m, o)| *m == ms && o == owner)
    }
}

/// A statement that may set the settings, until its answer says what it left.
#[derive(Debug)]
pub(super) struct Sending<'a> {
    settings: &'a Settings,
    answered: bool,
}

impl Sending<'_> {
    fn answered(mut self, update: impl FnOnce(&mut Known)) {
        self.answered = true;
        let mut known = self.settings.state.locked();
        known.sending -= 1;
        update(&mut known);
    }

    /// It set the timeout (a keep-alive).
    pub(super) fn timeout_set(self, ms: i64) {
        self.answered(|k| k.timeout = Some(ms));
    }

    /// It set the timeout and the label (a lease taken).
    pub(super) fn both_set(self, ms: i64, owner: &str) {
        self.answered(|k| {
            k.timeout = Some(ms);
            match &mut k.label {
                Some((m, o)) if o == owner => *m = ms,
                label => *label = Some((ms, owner.to_owned())),
            }
        });
    }

    /// It set nothing (no lease taken).
    pub(super) fn unchanged(self) {
        self.answered(|_| {});
    }

    /// It failed: what it set, if anything, was rolled back, or is not known.
    pub(super) fn unknown(self) {
        self.answered(forget);
    }
}

fn forget(known: &mut Known) {
    known.timeout = None;
    known.label = None;
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            // Dropped half-way: it may or may not have run.
            let mut known = self.settings.state.locked();
            known.sending -= 1;
            forget(&mut known);
        }
    }
}

/// What the fast statement said.
pub(super) enum Fast {
    /// Its answer: the fence, or NULL for a busy lock.
    Answered(Row),
    /// The full statement must decide: the settings must be set, or somebody may wait.
    Full,
}

/// The fast statement's answer when a waiter's marker is held (a fence is never negative).
const SOMEBODY_WAITS: i64 = -1;

impl PgOps {
    /// Tries the lock `id` with `statement`, the fast form (`$1` the lock id, `$2`, `$3` its
    /// marker), when the session's settings are what the full statement would set for `keep`
    /// and `owner`; under the session's order lock, as [`PgOps::query_keeping`].
    ///
    /// # Errors
    /// The server's, or `Timeout`.
    pub(super) async fn query_fast(
        &self,
        conn: &PgConn,
        statement: &Statement,
        keep: &(dyn Fn() -> Duration + Send + Sync),
        id: i64,
        owner: &str,
        doing: &str,
    ) -> Result<Fast, LockError> {
        let order = conn.order.lock().await;
        if !conn.settings.are(ttl_ms(keep()), owner) {
            return Ok(Fast::Full);
        }
        let (k1, k2) = marker::key(id);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&id, &k1, &k2];
        let row = conn.client.query_one(statement, &params);
        let row = self.sent_in_order(order, row, doing).await?;
        if row.get::<_, Option<i64>>(0) == Some(SOMEBODY_WAITS) {
            return Ok(Fast::Full);
        }
        Ok(Fast::Answered(row))
    }
}

/// The fast acquire: `lock` of `$1` (which gives `fence` when granted), unless somebody may
/// wait (the marker `($2, $3)` is held).
pub(super) fn fast_sql(lock: &str, fence: &str) -> String {
    format!(
        "SELECT CASE WHEN {} THEN {SOMEBODY_WAITS}::bigint \
                     WHEN {lock}($1::bigint) THEN {fence} END",
        marker::waiting_sql("$2", "$3")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_known_only_once_answered() {
        let s = Settings::default();
        assert!(!s.are(30_000, "me"), "nothing known at first");
        s.sending().both_set(30_000, "me");
        assert!(s.are(30_000, "me"));
        assert!(!s.are(30_000, "you"));
        assert!(!s.are(29_999, "me"));
        // In flight: not known until answered.
        let sent = s.sending();
        assert!(!s.are(30_000, "me"));
        sent.unchanged();
        assert!(s.are(30_000, "me"));
        // A keep-alive moves the timeout, not the label.
        s.sending().timeout_set(20_000);
        assert!(!s.are(20_000, "me"));
        s.sending().both_set(20_000, "me");
        assert!(s.are(20_000, "me"));
        // A failure, or a statement dropped half-way, forgets them.
        s.sending().unknown();
        assert!(!s.are(20_000, "me"));
        s.sending().both_set(20_000, "me");
        drop(s.sending());
        assert!(!s.are(20_000, "me"));
    }
}
