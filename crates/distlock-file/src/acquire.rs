//! Taking a lease: an exclusive or shared `flock` on the lock file, or one of a semaphore's
//! slot files under its record's `flock`, and the new holder's record written in it.

use std::time::Duration;

use distlock_core::engine::{Attempt, LeaseKind, LockError};

use crate::FileBackend;
use crate::flock::lock_file;
use crate::linger;
use crate::record::{HEADER, next_fence, now_ms, parse, read_all, write_record};

pub(crate) fn acquire_blocking(
    me: &FileBackend,
    key: &str,
    token: &str,
    owner: &str,
    kind: LeaseKind,
) -> Result<Attempt, LockError> {
    if let Some(h) = me.held().get(token).filter(|h| h.key == key) {
        // A retried request with our token: already ours.
        return Ok(Attempt::Acquired {
            fence: Some(h.fence),
        });
    }
    if let LeaseKind::Permit { permits } = kind {
        return acquire_permit(me, key, token, owner, permits);
    }
    let path = me.lock_path(key);
    let shared = kind == LeaseKind::Shared;
    let Some((mut file, id)) = lock_file(&path, shared)? else {
        return Ok(Attempt::Busy { holder_ttl: None });
    };
    // From here on we hold the flock; any error drops `file`, which releases it.
    let rec = parse(&read_all(&mut file.lock, &path)?, &path)?;
    if let Some(left) = linger::left(&rec) {
        // A holder left its lease to run out by itself: still taken, for `left`.
        return Ok(Attempt::Busy {
            holder_ttl: Some(left),
        });
    }
    let fence = if shared {
        // A reader's fence is the last writer's: readers never write the file (others may be
        // reading it), and no writer can change it while we hold our share.
        rec.fence
    } else {
        let fence = next_fence(&rec, &path)?;
        write_record(&mut file.writer, &path, &holder_body(fence, owner, key))?;
        fence
    };
    Ok(me.hold(token, key, kind, fence, path, id, file))
}

/// The record a holder writes in the file it locks: its fence, label, start and name.
pub(crate) fn holder_body(fence: u64, owner: &str, key: &str) -> String {
    format!(
        "{HEADER}\nfence={fence}\nowner={}\nsince={}\nkey={}\n",
        owner.replace('\n', " "),
        now_ms(),
        key.replace('\n', " ")
    )
}

/// One of `permits` slot files of the semaphore `key`, under its record's flock (held for a
/// few reads and writes): the record checks the number of permits and counts the fence.
fn acquire_permit(
    me: &FileBackend,
    key: &str,
    token: &str,
    owner: &str,
    permits: u32,
) -> Result<Attempt, LockError> {
    let record = me.semaphore_path(key);
    // The record is locked only for a few local reads and writes: a short retry rides out
    // another process's turn.
    let mut tries = 0;
    let (mut rfile, _) = loop {
        match lock_file(&record, false)? {
            Some(r) => break r,
            None if tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(250));
            }
            None => return Ok(Attempt::Busy { holder_ttl: None }),
        }
    };
    let rec = parse(&read_all(&mut rfile.lock, &record)?, &record)?;
    if let Some(theirs) = rec.permits.filter(|&p| p != permits) {
        // Another size is recorded: a conflict while any of its permits is held.
        for slot in 0..theirs {
            if lock_file(&me.slot_path(key, slot), true)?.is_none() {
                return Err(distlock_core::recipes::kind_conflict(
                    key,
                    LeaseKind::Permit { permits },
                    LeaseKind::Permit { permits: theirs },
                ));
            }
        }
    }
    for slot in 0..permits {
        let path = me.slot_path(key, slot);
        let Some((mut file, id)) = lock_file(&path, false)? else {
            continue;
        };
        let fence = next_fence(&rec, &record)?;
        let body = format!(
            "{HEADER}\nfence={fence}\npermits={permits}\nkey={}\n",
            key.replace('\n', " ")
        );
        write_record(&mut rfile.writer, &record, &body)?;
        // The slot's own file names its holder, for status (nobody else reads it while the
        // slot is held).
        write_record(&mut file.writer, &path, &holder_body(fence, owner, key))?;
        return Ok(me.hold(
            token,
            key,
            LeaseKind::Permit { permits },
            fence,
            path,
            id,
            file,
        ));
    }
    Ok(Attempt::Busy { holder_ttl: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::Token;
    use distlock_core::engine::ErrorKind;

    #[test]
    fn corrupt_files_are_protocol_errors_and_leave_the_lock_free() {
        let d = tempfile::tempdir().expect("tempdir");
        let b = FileBackend::new(d.path()).expect("backend");
        std::fs::write(b.lock_path("k"), "garbage\n").expect("write");
        let t = Token::generate();
        let x = LeaseKind::Exclusive;
        let e = acquire_blocking(&b, "k", t.as_str(), "me", x).expect_err("corrupt");
        assert_eq!(e.kind(), ErrorKind::Protocol);
        std::fs::write(b.lock_path("k"), format!("{HEADER}\nfence=41\n")).expect("write");
        let got = acquire_blocking(&b, "k", t.as_str(), "me", x).expect("acquire");
        assert_eq!(got, Attempt::Acquired { fence: Some(42) });
    }
}
