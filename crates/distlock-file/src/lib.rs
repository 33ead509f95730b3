#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod linger;
mod relabel;
#[cfg(target_os = "linux")]
mod watch;

#[cfg(test)]
use distlock_core::Token;
use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, HolderStatus, LeaseCheck, LeaseKind, LeaseRef, LockError, LockStatus,
};
use distlock_core::recipes::MutexExt;

/// The lock engine on local files. See the crate docs.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<FileShared>,
}

struct FileShared {
    dir: PathBuf,
    /// Open, locked files by token. Dropping a `File` closes it, which releases the flock.
    held: Mutex<HashMap<String, Held>>,
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

/// A file's device and inode.
type FileId = (u64, u64);

/// A file's device and inode.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Whether `path` still names the file whose id is `id`.
fn still_at(path: &Path, id: (u64, u64)) -> bool {
    std::fs::metadata(path).is_ok_and(|m| file_id(&m) == id)
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

/// File name for a lock name: readable when safe, else a 128-bit FNV-1a hash.
fn file_name(name: &str) -> String {
    let safe = name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if safe {
        format!("{name}.lock")
    } else {
        format!("x-{:032x}.lock", fnv1a_128(name.as_bytes()))
    }
}

fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME))
}

fn io_err(doing: &str, path: &Path, e: std::io::Error) -> LockError {
    LockError::caused_by(ErrorKind::Io, format_args!("{doing} {}", path.display()), e)
}

/// The contents of a lock file, or of a semaphore's record.
#[derive(Debug, Default)]
struct Record {
    fence: u64,
    owner: Option<String>,
    since: Option<u64>,
    /// A semaphore's number of permits, as its holders opened it.
    permits: Option<u32>,
    /// A lease left to run out by itself (see `linger`): until when, and when it was left
    /// (Unix milliseconds).
    until: Option<u64>,
    lingered: Option<u64>,
}

const HEADER: &str = "distlock-file 1";

fn parse(text: &str, path: &Path) -> Result<Record, LockError> {
    let mut rec = Record::default();
    if text.trim().is_empty() {
        return Ok(rec);
    }
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(LockError::new(
            ErrorKind::Protocol,
            format!("{} is not a distlock lock file", path.display()),
        ));
    }
    for line in lines {
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        match k {
            "fence" => {
                rec.fence = v.parse().map_err(|_| {
                    LockError::new(
                        ErrorKind::Protocol,
                        format!("{}: corrupt fence counter {v:?}", path.display()),
                    )
                })?;
            }
            "owner" => rec.owner = Some(v.to_owned()),
            "permits" => rec.permits = v.parse().ok(),
            "since" => rec.since = v.parse().ok(),
            "until" => rec.until = v.parse().ok(),
            "lingered" => rec.lingered = v.parse().ok(),
            _ => {}
        }
    }
    Ok(rec)
}

fn read_all(file: &mut File, path: &Path) -> Result<String, LockError> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("seeking", path, e))?;
    file.read_to_string(&mut text)
        .map_err(|e| io_err("reading", path, e))?;
    Ok(text)
}

/// A locked file: the descriptor that holds the flock, opened for reading only, and one open
/// for writing. A waiter's attempt that finds the lock busy closes a read-only descriptor,
/// which tells nobody; the holder's writer closes when the lease ends (its release, or its
/// process's death), after the flock is gone, and that close is the release event waiters
/// watch for (`IN_CLOSE_WRITE`, see `watch`).
struct Locked {
    lock: File,
    writer: File,
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
fn lock_file(path: &Path, shared: bool) -> Result<Option<(Locked, FileId)>, LockError> {
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

/// Writes a lock file's or semaphore record's contents over `file`.
fn write_record(file: &mut File, path: &Path, body: &str) -> Result<(), LockError> {
    file.set_len(0).map_err(|e| io_err("truncating", path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("seeking", path, e))?;
    file.write_all(body.as_bytes())
        .map_err(|e| io_err("writing", path, e))
}

/// The next fence after the record's: at most `i64::MAX`, as every engine's (a counter that
/// someone set higher by hand is refused, not wrapped).
fn next_fence(rec: &Record, path: &Path) -> Result<u64, LockError> {
    let max = u64::try_from(i64::MAX).unwrap_or(u64::MAX);
    rec.fence
        .checked_add(1)
        .filter(|f| *f <= max)
        .ok_or_else(|| {
            LockError::new(
                ErrorKind::Protocol,
                format!("{}: fence counter overflow", path.display()),
            )
        })
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn acquire_blocking(
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
        let body = format!(
            "{HEADER}\nfence={fence}\nowner={}\nsince={}\nkey={}\n",
            owner.replace('\n', " "),
            now_ms(),
            key.replace('\n', " ")
        );
        write_record(&mut file.writer, &path, &body)?;
        fence
    };
    Ok(me.hold(token, key, kind, fence, path, id, file))
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
        let holder = format!(
            "{HEADER}\nfence={fence}\nowner={}\nsince={}\nkey={}\n",
            owner.replace('\n', " "),
            now_ms(),
            key.replace('\n', " ")
        );
        write_record(&mut file.writer, &path, &holder)?;
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

/// How many times a status reads a writer's record that is not written yet (2 ms apart).
const RECORD_TRIES: u32 = 50;

fn status_blocking(me: &FileBackend, key: &str) -> Result<LockStatus, LockError> {
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

/// A record's holder label: its owner and since when.
fn label(rec: &Record) -> Option<String> {
    rec.owner.clone().map(|o| match rec.since {
        Some(s) => format!("{o} since {s}"),
        None => o,
    })
}

/// Whether `file` is locked by another open file: a writer, probed with a shared lock; or
/// anybody, probed with an exclusive one (taken for an instant, and given back).
fn probe(file: &File, path: &Path, shared: bool) -> Result<bool, LockError> {
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

    fn acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            // Synchronous on purpose: a non-blocking flock plus a few bytes of local I/O, with no
            // await point, so a cancelled acquire can never leave a lock taken behind its back
            // (a spawn_blocking task would run on after its future is dropped).
            acquire_blocking(self, req.name, req.token.as_str(), req.owner, req.kind)
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
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
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
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
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(async move {
            let key = key.to_owned();
            self.blocking(move |me| status_blocking(me, &key)).await
        })
    }

    #[cfg(target_os = "linux")]
    fn wake_source(&self) -> Option<&dyn distlock_core::engine::WakeSource> {
        Some(self)
    }

    fn lister(&self) -> Option<&dyn distlock_core::engine::Lister> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }

    fn relabel(&self) -> Option<&dyn distlock_core::engine::Relabel> {
        Some(self)
    }

    fn linger(&self) -> Option<&dyn distlock_core::engine::Linger> {
        Some(self)
    }
}

impl Breaker for FileBackend {
    /// Puts a fresh, unlocked file with the same fence counter in place of the held one
    /// (an atomic rename): the next acquire locks the new file, and the holder's next renewal
    /// finds its file gone from the path. The holder's process is not touched.
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        let key = key.to_owned();
        Box::pin(self.blocking(move |me| break_blocking(me, &key)))
    }
}

fn break_blocking(me: &FileBackend, key: &str) -> Result<BreakOutcome, LockError> {
    let st = status_blocking(me, key)?;
    if !st.held {
        return Ok(BreakOutcome::Free);
    }
    if st
        .holders
        .iter()
        .any(|h| matches!(h.kind, LeaseKind::Permit { .. }))
    {
        return Err(LockError::new(
            ErrorKind::Unsupported,
            format!("{key:?} is a semaphore: breaking its permits is not supported"),
        ));
    }
    let path = me.lock_path(key);
    let mut file = File::open(&path).map_err(|e| io_err("opening", &path, e))?;
    let rec = parse(&read_all(&mut file, &path)?, &path)?;
    let fresh = path.with_extension(format!("break-{}", std::process::id()));
    let body = format!(
        "{HEADER}\nfence={}\nkey={}\n",
        rec.fence,
        key.replace('\n', " ")
    );
    std::fs::write(&fresh, body).map_err(|e| io_err("writing", &fresh, e))?;
    std::fs::rename(&fresh, &path).map_err(|e| {
        let _ = std::fs::remove_file(&fresh);
        io_err("replacing", &path, e)
    })?;
    Ok(BreakOutcome::Broken(st))
}

/// The lock files and semaphore records of the directory: every name ever used here (files
/// are never deleted), which the status reads then sort out.
impl distlock_core::engine::Lister for FileBackend {
    fn names<'a>(
        &'a self,
        prefix: &'a str,
        _budget: usize,
    ) -> BoxFuture<'a, Result<distlock_core::engine::Names, LockError>> {
        // A local directory: reading it whole is cheap and blocks no server.
        let dir = self.inner.dir.clone();
        let prefix = prefix.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || names_in(&dir, &prefix))
                .await
                .map_err(|e| LockError::caused_by(ErrorKind::Io, "file listing task failed", e))?
        })
    }
}

/// The names of the lock files and semaphore records in `dir` that start with `prefix`.
fn names_in(dir: &Path, prefix: &str) -> Result<distlock_core::engine::Names, LockError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_err("listing", dir, e))?;
    let mut names = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(stem) = file
            .strip_suffix(".lock")
            .or_else(|| file.strip_suffix(".sem"))
        else {
            continue;
        };
        let name = if stem.starts_with("x-") {
            // A hashed name: the file says it.
            match std::fs::read_to_string(entry.path()) {
                Ok(text) => match text.lines().find_map(|l| l.strip_prefix("key=")) {
                    Some(key) => key.to_owned(),
                    None => continue,
                },
                Err(_) => continue,
            }
        } else {
            stem.to_owned()
        };
        if name.starts_with(prefix) {
            names.push(name);
        }
    }
    Ok(distlock_core::engine::Names::new(names, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_stable() {
        assert_eq!(file_name("reports-daily.v2"), "reports-daily.v2.lock");
        let odd = file_name("../etc/passwd");
        assert!(odd.starts_with("x-") && odd.len() == 2 + 32 + 5, "{odd}");
        assert_eq!(odd, file_name("../etc/passwd"));
        assert_ne!(file_name("a/b"), file_name("a/c"));
        assert!(file_name(".hidden").starts_with("x-"));
        assert!(file_name(&"k".repeat(1024)).len() < 64);
        // Known FNV-1a 128 value of the empty input is the offset basis.
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
    }

    /// The fence stops at `i64::MAX` (every engine's most): a counter set past it by hand is
    /// refused, never wrapped, nor read back as no fence.
    #[test]
    fn the_fence_counter_stops_at_the_largest_signed_64_bit_value() {
        let path = Path::new("x.lock");
        let at = |fence| Record {
            fence,
            owner: None,
            since: None,
            permits: None,
            until: None,
            lingered: None,
        };
        let max = u64::try_from(i64::MAX).unwrap();
        assert_eq!(next_fence(&at(max - 1), path).ok(), Some(max));
        for past in [max, u64::MAX - 1, u64::MAX] {
            let e = next_fence(&at(past), path).expect_err("past the last fence");
            assert_eq!(e.kind(), ErrorKind::Protocol);
        }
    }

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
