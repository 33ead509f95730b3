//! Forced release (`Breaker`): a fresh, unlocked file with the same fence counter renamed over
//! the held lock file.

use std::fs::File;

use distlock_core::engine::{BreakOutcome, Breaker, LockError};
use distlock_core::recipes::breakable;

use crate::record::{HEADER, parse, read_all};
use crate::status::status_blocking;
use crate::{FileBackend, io_err};

#[distlock_core::engine::async_trait]
impl Breaker for FileBackend {
    /// Puts a fresh, unlocked file with the same fence counter in place of the held one
    /// (an atomic rename): the next acquire locks the new file, and the holder's next renewal
    /// finds its file gone from the path. The holder's process is not touched.
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        let key = key.to_owned();
        self.blocking(move |me| break_blocking(me, &key)).await
    }
}

fn break_blocking(me: &FileBackend, key: &str) -> Result<BreakOutcome, LockError> {
    let st = status_blocking(me, key)?;
    if !breakable(key, &st)? {
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
