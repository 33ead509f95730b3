//! Exit statuses (sysexits.h where one fits), and the one-line error reports.

use distlock::{ErrorKind, LockError};

/// A violation found by `check`.
pub(crate) const VIOLATION: u8 = 1;
/// Bad usage: a bad option or key (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The engine is unreachable or failed (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (EX_SOFTWARE), unless `--lost-exit-code` says.
pub(crate) const LOST: u8 = 70;
/// Internal failure, such as a command that cannot be started.
pub(crate) const SOFTWARE: u8 = 70;
/// The lock could not be had: busy, or the wait timed out (EX_TEMPFAIL), unless
/// `--conflict-exit-code` says.
pub(crate) const CONFLICT: u8 = 75;
/// The engine refused our credentials or privileges (EX_NOPERM).
pub(crate) const NOPERM: u8 = 77;
/// A configuration error (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The command could not be run (as in shells).
pub(crate) const CANNOT_EXEC: u8 = 127;

/// `err` and its causes on one line: each cause once (a message that already quotes its
/// cause does not repeat it).
pub(crate) fn one_line(err: &LockError) -> String {
    distlock::tools::error_chain(err)
}

/// Prints `distlock: <doing>: <err>` on one line and returns the matching exit status.
pub(crate) fn report(doing: &str, err: &LockError) -> u8 {
    eprintln!("distlock: {doing}: {}", one_line(err));
    code(err)
}

/// Prints why the lock engine could not be opened and returns the exit status: 69 for any
/// engine that does not answer, whether it refused the connection or stayed silent (a timeout
/// here is not a busy lock).
pub(crate) fn report_open(err: &LockError) -> u8 {
    let code = code(err);
    eprintln!("distlock: cannot open the lock engine: {}", one_line(err));
    if code == CONFLICT { UNAVAILABLE } else { code }
}

/// The exit status of an error.
pub(crate) fn code(err: &LockError) -> u8 {
    match err.kind() {
        ErrorKind::Busy | ErrorKind::Timeout => CONFLICT,
        ErrorKind::Config | ErrorKind::KindConflict => CONFIG,
        ErrorKind::InvalidKey => USAGE,
        ErrorKind::Lost => LOST,
        ErrorKind::Auth => NOPERM,
        _ => UNAVAILABLE,
    }
}

/// A command-line error: help and version go to stdout as usual (status 0); a mistake is one
/// line on stderr (status 64), with a pointer to `--help`.
pub(crate) fn usage(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind as K;
    if matches!(
        e.kind(),
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
            USAGE
        } else {
            0
        };
    }
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("bad usage");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    eprintln!("distlock: {first} (see distlock --help)");
    USAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_join_on_one_line_once() {
        let io = std::io::Error::other("connection refused");
        let e = LockError::new(ErrorKind::Connection, "connecting to 127.0.0.1:1").with_source(io);
        let line = one_line(&e);
        assert!(line.ends_with(": connection refused"), "{line}");
        assert!(!line.contains('\n'));
        let quoted = LockError::new(ErrorKind::Connection, "x: connection refused")
            .with_source(std::io::Error::other("connection refused"));
        assert_eq!(one_line(&quoted).matches("connection refused").count(), 1);
    }
}
