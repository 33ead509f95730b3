#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(test)]
use distlock_core::Token;
use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, LeaseCheck, LeaseRef, LockError, LockStatus, MutexExt,
};

/// The lock engine on local files. See the crate docs.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Open, locked files by token. Dropping a `File` closes it, which releases the flock.
    held: Mutex<HashMap<String, Held>>,
}

struct Held {
    key: String,
    fence: u64,
    /// The locked file's device and inode: a forced release puts another file at the path.
    id: (u64, u64),
    _file: File,
}

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
            inner: Arc::new(Inner {
                dir,
                held: Mutex::new(HashMap::new()),
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

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.inner.held.locked()
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

/// The contents of a lock file.
#[derive(Debug, Default)]
struct Record {
    fence: u64,
    owner: Option<String>,
    since: Option<u64>,
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
            "since" => rec.since = v.parse().ok(),
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

fn acquire_blocking(
    me: &FileBackend,
    key: &str,
    token: &str,
    owner: &str,
) -> Result<Attempt, LockError> {
    if let Some(h) = me.held().get(token).filter(|h| h.key == key) {
        // A retried request with our token: already ours.
        return Ok(Attempt::Acquired {
            fence: Some(h.fence),
        });
    }
    let path = me.lock_path(key);
    let mut tries = 0;
    let (mut file, id) = loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err("opening", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(Attempt::Busy { holder_ttl: None }),
            Err(TryLockError::Error(e)) => return Err(io_err("locking", &path, e)),
        }
        // A forced release may have put a new file at the path since we opened it: the lock
        // is the file the path names now.
        let id = file_id(&file.metadata().map_err(|e| io_err("reading", &path, e))?);
        if still_at(&path, id) {
            break (file, id);
        }
        tries += 1;
        if tries == 3 {
            return Ok(Attempt::Busy { holder_ttl: None });
        }
    };
    // From here on we hold the flock; any error drops `file`, which releases it.
    let rec = parse(&read_all(&mut file, &path)?, &path)?;
    let fence = rec.fence.checked_add(1).ok_or_else(|| {
        LockError::new(
            ErrorKind::Protocol,
            format!("{}: fence counter overflow", path.display()),
        )
    })?;
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let body = format!(
        "{HEADER}\nfence={fence}\nowner={}\nsince={since}\nkey={}\n",
        owner.replace('\n', " "),
        key.replace('\n', " ")
    );
    file.set_len(0)
        .map_err(|e| io_err("truncating", &path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("seeking", &path, e))?;
    file.write_all(body.as_bytes())
        .map_err(|e| io_err("writing", &path, e))?;
    me.held().insert(
        token.to_owned(),
        Held {
            key: key.to_owned(),
            fence,
            id,
            _file: file,
        },
    );
    Ok(Attempt::Acquired { fence: Some(fence) })
}

fn status_blocking(me: &FileBackend, key: &str) -> Result<LockStatus, LockError> {
    let path = me.lock_path(key);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LockStatus::free()),
        Err(e) => return Err(io_err("opening", &path, e)),
    };
    // Held in this process? (flock would not tell us: it conflicts with our own open files.)
    let here = me
        .held()
        .values()
        .any(|h| h.key == key && still_at(&path, h.id));
    let locked = here
        || match file.try_lock_shared() {
            Ok(()) => {
                let _ = file.unlock();
                false
            }
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(e)) => return Err(io_err("probing", &path, e)),
        };
    if !locked {
        return Ok(LockStatus::free());
    }
    let rec = parse(&read_all(&mut file, &path)?, &path)?;
    let owner = rec.owner.map(|o| match rec.since {
        Some(s) => format!("{o} since {s}"),
        None => o,
    });
    Ok(LockStatus::held(owner, Some(rec.fence), None))
}

impl Backend for FileBackend {
    fn name(&self) -> &'static str {
        "file"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, false)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        // Synchronous on purpose: a non-blocking flock plus a few bytes of local I/O, with no
        // await point, so a cancelled acquire can never leave a lock taken behind its back
        // (a spawn_blocking task would run on after its future is dropped).
        acquire_blocking(self, req.name, req.token.as_str(), req.owner)
    }

    async fn renew(&self, lease: &LeaseRef<'_>, _ttl: Duration) -> Result<LeaseCheck, LockError> {
        // The flock lasts as long as our open file: renewing is checking we still have it, and
        // that it is still the lock file (not swapped out by a forced release).
        let key = lease.name;
        let id = match self.held().get(lease.token.as_str()) {
            Some(h) if h.key == key => h.id,
            _ => return Ok(LeaseCheck::Missing),
        };
        Ok(if still_at(&self.lock_path(key), id) {
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
                let ours = still_at(&self.lock_path(key), h.id);
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

    fn breaker(&self) -> Option<&dyn Breaker> {
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
        let e = acquire_blocking(&b, "k", t.as_str(), "me").expect_err("corrupt");
        assert_eq!(e.kind(), ErrorKind::Protocol);
        std::fs::write(b.lock_path("k"), format!("{HEADER}\nfence=41\n")).expect("write");
        let got = acquire_blocking(&b, "k", t.as_str(), "me").expect("acquire");
        assert_eq!(got, Attempt::Acquired { fence: Some(42) });
    }
}
