//! A lease left to run out by itself (`Linger`): the holder writes a deadline into its lock
//! file and lets its `flock` go. Until the deadline, an acquire that gets the `flock` still
//! finds the lock taken (busy for the time left), and `status` names the holder; the next
//! writer's record, or a forced release's fresh file, has no deadline.
//!
//! The deadline is on the wall clock, which every process of the host shares: the file keeps
//! when the lease was left too, so a clock set back never makes it last longer than it was
//! left for. Exclusive locks only: readers do not write the file (others read it at once), and
//! a semaphore's permits are files of their own.

use std::time::Duration;

use distlock_core::engine::{ErrorKind, LeaseCheck, LeaseKind, LeaseRef, Linger, LockError};

use crate::FileBackend;
use crate::flock::still_at;
use crate::record::{HEADER, Record, now_ms, read_all, write_record};

/// How long a record's deadline still holds the lock, if it does. Counted from now, and never
/// for longer than the lease was left for (a clock set back).
pub(crate) fn left(rec: &Record) -> Option<Duration> {
    let until = u128::from(rec.until?);
    let now = now_ms();
    let from = match rec.lingered.map(u128::from) {
        Some(at) if at > now => at,
        _ => now,
    };
    let left = until.checked_sub(from).filter(|l| *l > 0)?;
    Some(Duration::from_millis(
        u64::try_from(left).unwrap_or(u64::MAX),
    ))
}

#[distlock_core::engine::async_trait]
impl Linger for FileBackend {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        // Synchronous, as an acquire: a few bytes of local I/O.
        linger_blocking(self, lease.name, lease.token.as_str(), ttl)
    }

    fn lingers(&self, kind: LeaseKind) -> bool {
        kind == LeaseKind::Exclusive
    }
}

fn linger_blocking(
    me: &FileBackend,
    key: &str,
    token: &str,
    ttl: Duration,
) -> Result<LeaseCheck, LockError> {
    let mut held = {
        let mut map = me.held();
        match map.get(token) {
            Some(h) if h.key == key && h.kind == LeaseKind::Exclusive => {}
            Some(h) if h.key == key => {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    "the file engine leaves only exclusive locks to run out by themselves",
                ));
            }
            _ => return Ok(LeaseCheck::Missing),
        }
        match map.remove(token) {
            Some(h) => h,
            None => return Ok(LeaseCheck::Missing),
        }
    };
    // A forced release swapped the file: not ours any more (dropping `held` lets it go).
    if !still_at(&held.path, held.id) {
        return Ok(LeaseCheck::Missing);
    }
    let written = read_all(&mut held.file.lock, &held.path).and_then(|text| {
        let now = now_ms();
        let until = now + ttl.as_nanos().div_ceil(1_000_000);
        let mut body: String = text
            .lines()
            .filter(|l| !l.starts_with("until=") && !l.starts_with("lingered="))
            .map(|l| format!("{l}\n"))
            .collect();
        if body.is_empty() {
            body = format!("{HEADER}\n");
        }
        body.push_str(&format!("lingered={now}\nuntil={until}\n"));
        write_record(&mut held.file.writer, &held.path, &body)
    });
    match written {
        // Dropping `held` lets the flock go, then closes the writer: waiters wake, try, and
        // find the deadline.
        Ok(()) => Ok(LeaseCheck::Ours),
        Err(e) => {
            // Still ours, held as before: the caller keeps it instead.
            me.held().insert(token.to_owned(), held);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::Token;
    use distlock_core::engine::Attempt;

    fn lease_ref<'a>(key: &'a str, token: &'a Token) -> LeaseRef<'a> {
        LeaseRef::new(key, token, LeaseKind::Exclusive)
    }

    #[tokio::test]
    async fn a_left_lock_stays_taken_until_its_deadline() {
        let d = tempfile::tempdir().expect("tempdir");
        let b = FileBackend::new(d.path()).expect("backend");
        let (t, other) = (Token::generate(), Token::generate());
        let x = LeaseKind::Exclusive;
        let got =
            crate::acquire::acquire_blocking(&b, "job", t.as_str(), "me", x).expect("acquire");
        assert_eq!(got, Attempt::Acquired { fence: Some(1) });
        let check = b
            .linger(&lease_ref("job", &t), Duration::from_millis(400))
            .await
            .expect("linger");
        assert_eq!(check, LeaseCheck::Ours);
        // Our flock is gone, the deadline is not: busy, for about what is left.
        match crate::acquire::acquire_blocking(&b, "job", other.as_str(), "them", x).expect("busy")
        {
            Attempt::Busy {
                holder_ttl: Some(left),
            } => assert!(left <= Duration::from_millis(400), "{left:?}"),
            a => panic!("{a:?}"),
        }
        let st = crate::status::status_blocking(&b, "job").expect("status");
        assert!(st.held, "{st:?}");
        assert!(st.owner.as_deref().is_some_and(|o| o.starts_with("me")));
        std::thread::sleep(Duration::from_millis(450));
        assert!(
            !crate::status::status_blocking(&b, "job")
                .expect("status")
                .held
        );
        // The next writer's fence follows, and its record has no deadline.
        let got =
            crate::acquire::acquire_blocking(&b, "job", other.as_str(), "them", x).expect("free");
        assert_eq!(got, Attempt::Acquired { fence: Some(2) });
        assert!(
            left(
                &crate::record::parse(
                    &std::fs::read_to_string(b.lock_path("job")).expect("read"),
                    &b.lock_path("job")
                )
                .expect("parse")
            )
            .is_none()
        );
        // A lease no longer ours is not left.
        let check = b
            .linger(&lease_ref("job", &t), Duration::from_secs(5))
            .await
            .expect("linger");
        assert_eq!(check, LeaseCheck::Missing);
    }

    #[test]
    fn a_clock_set_back_never_stretches_the_deadline() {
        let now = u64::try_from(now_ms()).expect("ms");
        // Left an hour "in the future" (the clock went back an hour since), for 2 s.
        let rec = Record {
            lingered: Some(now + 3_600_000),
            until: Some(now + 3_602_000),
            ..Record::default()
        };
        assert_eq!(left(&rec), Some(Duration::from_secs(2)));
        let past = Record {
            lingered: Some(now - 5000),
            until: Some(now - 3000),
            ..Record::default()
        };
        assert_eq!(left(&past), None);
    }
}
