//! The lock file's contents: the record a holder writes (its fence counter, its owner, since
//! when, a semaphore's number of permits, a lingering lease's deadline), read back and written
//! over in place, and the next fence counted from it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use distlock_core::engine::{ErrorKind, LockError};

use crate::io_err;

/// The contents of a lock file, or of a semaphore's record.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub(crate) fence: u64,
    pub(crate) owner: Option<String>,
    pub(crate) since: Option<u64>,
    /// A semaphore's number of permits, as its holders opened it.
    pub(crate) permits: Option<u32>,
    /// A lease left to run out by itself (see `linger`): until when, and when it was left
    /// (Unix milliseconds).
    pub(crate) until: Option<u64>,
    pub(crate) lingered: Option<u64>,
}

pub(crate) const HEADER: &str = "distlock-file 1";

pub(crate) fn parse(text: &str, path: &Path) -> Result<Record, LockError> {
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

pub(crate) fn read_all(file: &mut File, path: &Path) -> Result<String, LockError> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("seeking", path, e))?;
    file.read_to_string(&mut text)
        .map_err(|e| io_err("reading", path, e))?;
    Ok(text)
}

/// Writes a lock file's or semaphore record's contents over `file`.
pub(crate) fn write_record(file: &mut File, path: &Path, body: &str) -> Result<(), LockError> {
    file.set_len(0).map_err(|e| io_err("truncating", path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("seeking", path, e))?;
    file.write_all(body.as_bytes())
        .map_err(|e| io_err("writing", path, e))
}

/// The next fence after the record's: at most `i64::MAX`, as every engine's (a counter that
/// someone set higher by hand is refused, not wrapped).
pub(crate) fn next_fence(rec: &Record, path: &Path) -> Result<u64, LockError> {
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

pub(crate) fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A record's holder label: its owner and since when.
pub(crate) fn label(rec: &Record) -> Option<String> {
    rec.owner.clone().map(|o| match rec.since {
        Some(s) => format!("{o} since {s}"),
        None => o,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
