#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod acquire;
mod breaker;
mod flock;
mod linger;
mod many;
mod names;
mod record;
mod relabel;
mod status;
#[cfg(target_os = "linux")]
mod watch;

/// The fuzz targets' way in (`fuzz/`): built only with `--cfg fuzzing`, never in a normal
/// build.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    /// A lock file's contents as the engine reads them back: `Ok` or a typed error, never a
    /// panic. Returns the fence read, if the text is a record.
    pub fn lock_file(text: &str) -> Option<u64> {
        crate::record::parse(text, std::path::Path::new("fuzzed"))
            .ok()
            .map(|r| r.fence)
    }
}

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, Capabilities, ErrorKind, Fencing, LeaseCheck, LeaseKind,
    LeaseRef, LockError, LockStatus,
};
use distlock_core::recipes::MutexExt;

use crate::acquire::acquire_blocking;
use crate::flock::{FileId, Locked, still_at};
use crate::names::file_name;
use crate::status::status_blocking;

/// The lock engine on local files. See the crate docs.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<FileShared>,
}

struct FileShared {
    dir: PathBuf,
    /// Open, locked files by token. Dropping a `File` closes it, which releases the flock.
    held: Mutex<HashMap<String, Held>>,
    /// The files of multi-name holds, by token (see `many`).
    held_many: Mutex<HashMap<String, Vec<many::HeldName>>>,
    /// Release events (see `watch`).
    #[cfg(target_os = "linux")]
    watcher: watch::Watcher,
}

struct Held {
    key: String,
    kind: LeaseKind,
    fence: u64,
    /// The locked file: the lock file, or a semaphore's slot file.
    path: PathBuf,
    /// The locked file's device and inode: a forced release puts another file at the path.
    id: (u64, u64),
    /// The file, as it holds its flock and can be written. Dropped in this order: the flock
    /// goes first, then the writer's close tells watchers (see [`Locked`]).
    file: Locked,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

/// The directory used when a `file://` URL names none: `distlock` under the system's temporary
/// directory.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join("distlock")
}

impl FileBackend {
    /// An engine keeping its lock files in `dir`, created if missing.
    ///
    /// # Errors
    /// `Io` when the directory cannot be created or is not a directory.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, LockError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| {
            LockError::caused_by(
                ErrorKind::Io,
                format_args!("cannot create lock directory {}", dir.display()),
                e,
            )
        })?;
        if !dir.is_dir() {
            return Err(LockError::new(
                ErrorKind::Io,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(FileBackend {
            inner: Arc::new(FileShared {
                dir,
                held: Mutex::new(HashMap::new()),
                held_many: Mutex::new(HashMap::new()),
                #[cfg(target_os = "linux")]
                watcher: watch::Watcher::new(),
            }),
        })
    }

    /// Parses `file:///abs/dir` (or `file://` alone for [`default_dir`]) and opens the engine.
    ///
    /// # Errors
    /// `Config` for a URL that is not `file://` or names a host; `Io` as in [`new`](Self::new).
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg = |m: String| LockError::new(ErrorKind::Config, m);
        if text == "file://" || text == "file:" {
            return Self::new(default_dir());
        }
        let url = url::Url::parse(text)
            .map_err(|e| cfg(format!("malformed file URL: {e}")).with_source(e))?;
        if url.scheme() != "file" {
            return Err(cfg(format!("{:?} is not a file:// URL", url.scheme())));
        }
        if let Some((name, _)) = url.query_pairs().next() {
            return Err(cfg(format!(
                "unknown file URL parameter {name:?} (the file engine takes none)"
            )));
        }
        if url
            .host_str()
            .is_some_and(|h| !h.is_empty() && h != "localhost")
        {
            return Err(cfg(
                "a file:// URL must name a local directory (file:///path)".into(),
            ));
        }
        let path = url
            .to_file_path()
            .map_err(|()| cfg(format!("{text:?} does not name a local directory")))?;
        if path == Path::new("/") {
            return Self::new(default_dir());
        }
        Self::new(path)
    }

    /// The directory holding the lock files.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The file that holds the lock `name`.
    pub fn lock_path(&self, name: &str) -> PathBuf {
        self.inner.dir.join(file_name(name))
    }

    /// The record of the semaphore `name` (its fence counter and number of permits).
    fn semaphore_path(&self, name: &str) -> PathBuf {
        self.lock_path(name).with_extension("sem")
    }

    /// The file of permit `slot` of the semaphore `name`.
    fn slot_path(&self, name: &str, slot: u32) -> PathBuf {
        self.lock_path(name).with_extension(format!("sem.{slot}"))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.inner.held.locked()
    }

    fn held_many(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<many::HeldName>>> {
        self.inner.held_many.locked()
    }

    /// Keeps `file`, locked, as `token`'s hold of `key` with `fence`.
    #[allow(clippy::too_many_arguments)]
    fn hold(
        &self,
        token: &str,
        key: &str,
        kind: LeaseKind,
        fence: u64,
        path: PathBuf,
        id: FileId,
        file: Locked,
    ) -> Attempt {
        let held = Held {
            key: key.to_owned(),
            kind,
            fence,
            path,
            id,
            file,
        };
        self.held().insert(token.to_owned(), held);
        Attempt::Acquired { fence: Some(fence) }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&FileBackend) -> Result<T, LockError> + Send + 'static,
    ) -> Result<T, LockError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me))
            .await
            .map_err(|e| LockError::caused_by(ErrorKind::Io, "file lock task failed", e))?
    }
}

fn io_err(doing: &str, path: &Path, e: std::io::Error) -> LockError {
    LockError::caused_by(ErrorKind::Io, format_args!("{doing} {}", path.display()), e)
}

#[distlock_core::engine::async_trait]
impl Backend for FileBackend {
    fn name(&self) -> &'static str {
        "file"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, false)
            .with_shared()
            .with_permits()
            .no_downgrade_because(
                "flock(2) turns an exclusive lock into a shared one by releasing it and then \
                 locking again, so another writer could get in between",
            )
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        // Synchronous on purpose: a non-blocking flock plus a few bytes of local I/O, with no
        // await point, so a cancelled acquire can never leave a lock taken behind its back
        // (a spawn_blocking task would run on after its future is dropped).
        acquire_blocking(self, req.name, req.token.as_str(), req.owner, req.kind)
    }

    async fn renew(&self, lease: &LeaseRef<'_>, _ttl: Duration) -> Result<LeaseCheck, LockError> {
        // The flock lasts as long as our open file: renewing is checking we still have it, and
        // that it is still the lock file (not swapped out by a forced release).
        let key = lease.name;
        let (path, id) = match self.held().get(lease.token.as_str()) {
            Some(h) if h.key == key => (h.path.clone(), h.id),
            _ => return Ok(LeaseCheck::Missing),
        };
        Ok(if still_at(&path, id) {
            LeaseCheck::Ours
        } else {
            LeaseCheck::Missing
        })
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        let mut held = self.held();
        match held.get(token.as_str()) {
            Some(h) if h.key == key => {
                // Closing the file releases the flock (of a file a forced release may have
                // swapped out already: then the lock was not ours any more).
                let ours = still_at(&h.path, h.id);
                held.remove(token.as_str());
                Ok(if ours {
                    LeaseCheck::Ours
                } else {
                    LeaseCheck::Missing
                })
            }
            _ => Ok(LeaseCheck::Missing),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        let key = key.to_owned();
        self.blocking(move |me| status_blocking(me, &key)).await
    }

    #[cfg(target_os = "linux")]
    fn wake_source(&self) -> Option<&dyn distlock_core::engine::WakeSource> {
        Some(self)
    }

    distlock_core::capability_getters!(
        lister: Lister,
        breaker: Breaker,
        relabel: Relabel,
        linger: Linger,
        multi_lock: MultiLock,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let d = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}", d.path().display());
        assert_eq!(FileBackend::from_url(&url).expect("ok").dir(), d.path());
        assert_eq!(
            FileBackend::from_url("http://x")
                .map_err(|e| e.kind())
                .err(),
            Some(ErrorKind::Config)
        );
        assert_eq!(
            FileBackend::from_url("file://remotehost/x")
                .map_err(|e| e.kind())
                .err(),
            Some(ErrorKind::Config)
        );
    }
}
