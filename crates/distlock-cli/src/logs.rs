//! The command's log on stderr, and what it says while a wait tries a failing engine again.
//!
//! - Colours only on a terminal, and never under `NO_COLOR` (no-color.org): a log that goes
//!   to a pipe, a file or journald is plain text.
//! - `DISTLOCK_LOG` sets the level (default `warn`; `off` for nothing).
//! - The library logs each retry of a wait under the target `distlock::retry` (the first at
//!   WARN, the others at DEBUG). Below DEBUG they are kept out of the log: on a terminal the
//!   spinner says that the engine is being tried again, and why; elsewhere one line says so,
//!   once per process, and the final error follows if the wait fails.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The target of the library's retry events.
const RETRY_TARGET: &str = "distlock::retry";

/// Whether stderr gets colours: a terminal, and `NO_COLOR` unset or empty.
pub(crate) fn colors() -> bool {
    crate::term::stderr_is_tty() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The level `DISTLOCK_LOG` names (`None`: off).
fn level(setting: Option<&str>) -> Option<LevelFilter> {
    match setting {
        Some("trace") => Some(LevelFilter::TRACE),
        Some("debug") => Some(LevelFilter::DEBUG),
        Some("info") => Some(LevelFilter::INFO),
        Some("error") => Some(LevelFilter::ERROR),
        Some("off") => None,
        _ => Some(LevelFilter::WARN),
    }
}

/// Installs the log on stderr (see the module docs).
pub(crate) fn init() {
    let level = level(std::env::var("DISTLOCK_LOG").ok().as_deref());
    // At DEBUG and below the log shows every retry itself.
    let detailed = level.is_some_and(|l| l >= LevelFilter::DEBUG);
    let log = level.map(|level| {
        let targets = Targets::new().with_default(level);
        let targets = if detailed {
            targets
        } else {
            targets.with_target(RETRY_TARGET, LevelFilter::OFF)
        };
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(colors())
            .with_filter(targets)
    });
    // The spinner's note on a terminal (whatever the log level: it is not a log); the one
    // line elsewhere, unless the log is off or shows every retry.
    let tty = crate::term::stderr_is_tty();
    let notes = (tty || (level.is_some() && !detailed)).then(|| {
        RetryNotes { print_once: !tty }
            .with_filter(Targets::new().with_target(RETRY_TARGET, LevelFilter::DEBUG))
    });
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(notes)
        .try_init();
}

/// Takes the retry events: the spinner's note on a terminal, one line elsewhere.
struct RetryNotes {
    /// Print the first retry as a line of its own (stderr is not a terminal, and the log does
    /// not show the retries).
    print_once: bool,
}

static PRINTED: AtomicBool = AtomicBool::new(false);

impl<S: tracing::Subscriber> Layer<S> for RetryNotes {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut retry = Retry::default();
        event.record(&mut retry);
        if self.print_once {
            if !PRINTED.swap(true, Ordering::Relaxed) {
                eprintln!("distlock: {}", retry.line());
            }
        } else {
            crate::term::note_retry(retry.note());
        }
    }
}

/// The fields of a retry event.
#[derive(Debug, Default)]
struct Retry {
    message: String,
    error: String,
    attempt: u64,
}

impl Retry {
    /// The line printed once, outside a terminal: what failed, why, and that it goes on.
    fn line(&self) -> String {
        let doing = self
            .message
            .split_once(';')
            .map_or(self.message.as_str(), |(what, _)| what);
        format!(
            "{doing} ({}); trying again within the wait (DISTLOCK_LOG=debug shows each attempt)",
            self.error
        )
    }

    /// The spinner's line.
    fn note(&self) -> String {
        format!(
            "retrying the lock engine (attempt {} failed: {})",
            self.attempt, self.error
        )
    }
}

impl Visit for Retry {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "error" => value.clone_into(&mut self.error),
            "message" => value.clone_into(&mut self.message),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "attempt" {
            self.attempt = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_comes_from_distlock_log() {
        assert_eq!(level(None), Some(LevelFilter::WARN));
        assert_eq!(level(Some("debug")), Some(LevelFilter::DEBUG));
        assert_eq!(level(Some("off")), None);
        assert_eq!(level(Some("nonsense")), Some(LevelFilter::WARN));
    }

    #[test]
    fn a_retry_reads_as_one_line_and_a_note() {
        let r = Retry {
            message: "cannot open the lock engine; trying again within the wait".into(),
            error: "connection error: connecting to 127.0.0.1:1: refused".into(),
            attempt: 3,
        };
        assert_eq!(
            r.line(),
            "cannot open the lock engine (connection error: connecting to 127.0.0.1:1: \
             refused); trying again within the wait (DISTLOCK_LOG=debug shows each attempt)"
        );
        assert_eq!(
            r.note(),
            "retrying the lock engine (attempt 3 failed: connection error: connecting to \
             127.0.0.1:1: refused)"
        );
    }
}
