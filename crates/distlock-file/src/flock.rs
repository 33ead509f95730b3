//! Holding a lock file with `flock(2)`: opening it (created when missing), taking its lock,
//! shared or exclusive, without waiting, checking that the path still names the file locked (a
//! forced release puts another file there), and probing whether another open file holds it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use distlock_core::engine::LockError;

use crate::io_err;

/// A file's device and inode.
pub(crate) type FileId = (u64, u64);

/// A file's device and inode.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Whether `path` still names the file whose id is `id`.
pub(crate) fn still_at(path: &Path, id: (u64, u64)) -> bool {
    std::fs::metadata(path).is_ok_and(|m| file_id(&m) == id)
}

/// A locked file: the descriptor that holds the flock, opened for reading only, and one open
/// for writing. A waiter's attempt that finds the lock busy closes a read-only descriptor,
/// which tells nobody; the holder's writer closes when the lease ends (its release, or its
/// process's death), after the flock is gone, and that close is the release event waiters
/// watch for (`IN_CLOSE_WRITE`, see `watch`).
pub(crate) struct Locked {
    pub(crate) lock: File,
    pub(crate) writer: File,
}

/// Opens `path` for reading, creating it first when it is missing.
fn open_read(path: &Path) -> std::io::Result<File> {
    match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            drop(
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)?,
            );
            File::open(path)
        }
        opened => opened,
    }
}

/// Opens (creating) `path` and takes its flock, shared or exclusive, without waiting; checks
/// that the path still names the file locked (a forced release swaps files). `None`: busy.
pub(crate) fn lock_file(path: &Path, shared: bool) -> Result<Option<(Locked, FileId)>, LockError> {
    for _ in 0..3 {
        let file = open_read(path).map_err(|e| io_err("opening", path, e))?;
        let locked = if shared {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(io_err("locking", path, e)),
        }
        // A forced release may have put a new file at the path since we opened it: the lock
        // is the file the path names now.
        let id = file_id(&file.metadata().map_err(|e| io_err("reading", path, e))?);
        if !still_at(path, id) {
            continue;
        }
        let writer = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err("opening", path, e))?;
        // The same file, unless a forced release swapped it in between.
        if writer.metadata().is_ok_and(|m| file_id(&m) == id) {
            return Ok(Some((Locked { lock: file, writer }, id)));
        }
    }
    Ok(None)
}

/// Whether `file` is locked by another open file: a writer, probed with a shared lock; or
/// anybody, probed with an exclusive one (taken for an instant, and given back).
pub(crate) fn probe(file: &File, path: &Path, shared: bool) -> Result<bool, LockError> {
    let got = if shared {
        file.try_lock_shared()
    } else {
        file.try_lock()
    };
    match got {
        Ok(()) => {
            let _ = file.unlock();
            Ok(false)
        }
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(io_err("probing", path, e)),
    }
}
