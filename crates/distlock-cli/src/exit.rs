//! Exit statuses (sysexits.h where one fits).

use distlock::{ErrorKind, LockError};

/// A bad key (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The engine is unreachable or failed (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (EX_SOFTWARE).
pub(crate) const LOST: u8 = 70;
/// Internal failure, such as a command that cannot be started.
pub(crate) const SOFTWARE: u8 = 70;
/// The lock could not be had: busy, or the wait timed out (EX_TEMPFAIL).
pub(crate) const CONFLICT: u8 = 75;
/// A configuration error (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The command could not be run (as in shells).
pub(crate) const CANNOT_EXEC: u8 = 127;

/// Prints `err` with its chain of causes and returns the matching exit status.
pub(crate) fn report(doing: &str, err: &LockError) -> u8 {
    let mut text = format!("distlock: {doing}: {err}");
    let mut cause = std::error::Error::source(err);
    while let Some(c) = cause {
        text.push_str(&format!("\n  caused by: {c}"));
        cause = c.source();
    }
    eprintln!("{text}");
    match err.kind() {
        ErrorKind::Busy | ErrorKind::Timeout => CONFLICT,
        ErrorKind::Config => CONFIG,
        ErrorKind::InvalidKey => USAGE,
        ErrorKind::Lost => LOST,
        _ => UNAVAILABLE,
    }
}
