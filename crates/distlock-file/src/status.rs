//! Who holds a lock: the writer the lock file names, readers seen by probing its `flock`, a
//! lease left to run out by itself, or the holders of a semaphore's slot files.

use std::fs::File;
use std::path::PathBuf;

use distlock_core::engine::{HolderStatus, LeaseKind, LockError, LockStatus};

use crate::flock::{probe, still_at};
use crate::record::{label, parse, read_all};
use crate::{FileBackend, io_err, linger};

/// How many times a status reads a writer's record that is not written yet (2 ms apart).
const RECORD_TRIES: u32 = 50;

pub(crate) fn status_blocking(me: &FileBackend, key: &str) -> Result<LockStatus, LockError> {
    let path = me.lock_path(key);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return semaphore_status(me, key);
        }
        Err(e) => return Err(io_err("opening", &path, e)),
    };
    // Held in this process? (flock would not tell us: it conflicts with our own open files.)
    let ours = me
        .held()
        .values()
        .find(|h| h.key == key && still_at(&path, h.id))
        .map(|h| h.kind);
    let writer = match ours {
        Some(kind) => kind == LeaseKind::Exclusive,
        // A writer blocks a shared probe.
        None => probe(&file, &path, true)?,
    };
    // Readers block an exclusive probe (taken for an instant).
    let readers = !writer && (ours.is_some() || probe(&file, &path, false)?);
    let mut rec = parse(&read_all(&mut file, &path)?, &path)?;
    // Another process's writer that has just created the file writes its record next: read
    // again for a moment rather than show a holder with no record (no owner, fence 0; a
    // `leader --watch` printed it as a leader named "" at epoch 0).
    let mut tries = 0;
    while writer && ours.is_none() && rec.fence == 0 && tries < RECORD_TRIES {
        std::thread::sleep(std::time::Duration::from_millis(2));
        rec = parse(&read_all(&mut file, &path)?, &path)?;
        tries += 1;
    }
    if !writer && !readers {
        if let Some(left) = linger::left(&rec) {
            // Left to run out by itself: held by whoever left it, for `left`.
            return Ok(LockStatus::held(label(&rec), Some(rec.fence), Some(left))
                .with_last_fence(Some(rec.fence)));
        }
        return semaphore_status(me, key);
    }
    if readers {
        // Readers do not write the file (others may be reading it): they cannot be listed one
        // by one; their fence is the last writer's.
        let st = LockStatus::held_by(vec![
            HolderStatus::new(LeaseKind::Shared).fence(Some(rec.fence)),
        ]);
        return Ok(st.with_last_fence(Some(rec.fence)));
    }
    Ok(LockStatus::held(label(&rec), Some(rec.fence), None).with_last_fence(Some(rec.fence)))
}

/// The holders of the semaphore `key`: each slot file that is locked, with the holder its file
/// names; free when there is no semaphore of that name.
fn semaphore_status(me: &FileBackend, key: &str) -> Result<LockStatus, LockError> {
    let record = me.semaphore_path(key);
    let rec = match std::fs::read_to_string(&record) {
        Ok(text) => parse(&text, &record)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LockStatus::free()),
        Err(e) => return Err(io_err("reading", &record, e)),
    };
    let Some(permits) = rec.permits else {
        return Ok(LockStatus::free());
    };
    let held_here: Vec<PathBuf> = me
        .held()
        .values()
        .filter(|h| h.key == key && matches!(h.kind, LeaseKind::Permit { .. }))
        .map(|h| h.path.clone())
        .collect();
    let mut holders = Vec::new();
    for slot in 0..permits {
        let path = me.slot_path(key, slot);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("opening", &path, e)),
        };
        if !held_here.contains(&path) && !probe(&file, &path, false)? {
            continue;
        }
        let slot_rec = parse(&read_all(&mut file, &path)?, &path)?;
        holders.push(
            HolderStatus::new(LeaseKind::Permit { permits })
                .owner(label(&slot_rec))
                .fence(Some(slot_rec.fence).filter(|f| *f > 0)),
        );
    }
    Ok(LockStatus::held_by(holders).with_last_fence(Some(rec.fence)))
}
