//! What the CLI shows on a terminal: the waiting spinner, the bench progress bar. Nothing is
//! drawn when stderr is not a terminal (logs, pipes, cron).

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock::{LockClient, LockStatus};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether stderr is a terminal (and so may show spinners and bars).
pub(crate) fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// What the library last said of a failing engine it tries again (see `logs`), for the
/// spinner; cleared once the engine answers again.
static RETRY_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// Sets the spinner's note about the engine's retries.
pub(crate) fn note_retry(note: String) {
    *RETRY_NOTE.lock().unwrap_or_else(PoisonError::into_inner) = Some(note);
}

fn retry_note() -> Option<String> {
    RETRY_NOTE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

fn clear_retry_note() {
    *RETRY_NOTE.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// A spinner on stderr from `after` into a wait (so a lock taken at once draws nothing):
/// first while the engine is opened, then while the lock is waited for, naming its holder
/// (read every second). While the engine fails and is tried again, it says so, and why.
pub(crate) struct WaitSpinner {
    bar: ProgressBar,
    /// The line when no retry is under way.
    line: Arc<Mutex<String>>,
    ticker: tokio::task::JoinHandle<()>,
    poller: Option<tokio::task::JoinHandle<()>>,
    /// When it is drawn (nothing is asked of the engine for it before).
    shown_at: tokio::time::Instant,
}

impl WaitSpinner {
    /// Starts the spinner (drawn from `after` on), or nothing when stderr is not a terminal.
    pub(crate) fn start(after: Duration, key: &str) -> Option<Self> {
        if !stderr_is_tty() {
            return None;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        let line = Arc::new(Mutex::new(format!(
            "waiting for {key}: opening the lock engine"
        )));
        let (shown, text) = (bar.clone(), line.clone());
        let shown_at = tokio::time::Instant::now() + after;
        let ticker = tokio::spawn(async move {
            tokio::time::sleep_until(shown_at).await;
            shown.set_draw_target(ProgressDrawTarget::stderr());
            shown.enable_steady_tick(Duration::from_millis(100));
            loop {
                let line = retry_note()
                    .unwrap_or_else(|| text.lock().unwrap_or_else(PoisonError::into_inner).clone());
                shown.set_message(line);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Some(WaitSpinner {
            bar,
            line,
            ticker,
            poller: None,
            shown_at,
        })
    }

    /// The engine is open: the spinner now names the lock's holder, read every second.
    pub(crate) fn watch(&mut self, client: &LockClient, key: &str) {
        clear_retry_note();
        set(&self.line, format!("waiting for {key}"));
        let (client, key, line) = (client.clone(), key.to_owned(), self.line.clone());
        let shown_at = self.shown_at;
        self.poller = Some(tokio::spawn(async move {
            tokio::time::sleep_until(shown_at).await;
            loop {
                if let Ok(st) = client.status(&key).await {
                    // The engine answers: whatever a retry said is over.
                    clear_retry_note();
                    set(&line, waiting_for(&key, &st));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }

    /// Stops and erases the spinner.
    pub(crate) fn finish(self) {
        self.ticker.abort();
        if let Some(p) = self.poller {
            p.abort();
        }
        self.bar.finish_and_clear();
    }
}

fn set(line: &Mutex<String>, text: String) {
    *line.lock().unwrap_or_else(PoisonError::into_inner) = text;
}

/// The spinner's line: who holds the lock we wait for.
pub(crate) fn waiting_for(key: &str, st: &LockStatus) -> String {
    if !st.held {
        return format!("waiting for {key}: just released");
    }
    let holder = match st.owner.as_deref().map(crate::when::split_label) {
        Some((who, Some(since))) => {
            let held_for = crate::when::now_ms().saturating_sub(since);
            let held_for = Duration::from_millis(u64::try_from(held_for).unwrap_or(u64::MAX));
            format!("{who} for {}", crate::when::duration(held_for))
        }
        Some((who, None)) => who.to_owned(),
        None => "an unknown holder".to_owned(),
    };
    let mut line = format!("waiting for {key}: held by {holder}");
    if let Some(f) = st.fence {
        line.push_str(&format!(", fence {f}"));
    }
    if let Some(t) = st.ttl {
        line.push_str(&format!(", lease {} left", crate::when::duration(t)));
    }
    line
}

/// A progress bar over `total` (a run's length), on a terminal only.
pub(crate) fn progress(total: Duration, what: &str) -> ProgressBar {
    if !stderr_is_tty() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(
        Some(u64::try_from(total.as_millis()).unwrap_or(u64::MAX)),
        ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {elapsed}/{duration}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spinner_names_the_holder() {
        let since = crate::when::now_ms() - 12_300;
        let st = LockStatus::held(
            Some(format!("web-1/4242 since {since}")),
            Some(7),
            Some(Duration::from_millis(2500)),
        );
        assert_eq!(
            waiting_for("deploy", &st),
            "waiting for deploy: held by web-1/4242 for 12.3 s, fence 7, lease 2.5 s left"
        );
        assert_eq!(
            waiting_for("deploy", &LockStatus::free()),
            "waiting for deploy: just released"
        );
    }
}
