//! What the CLI shows on a terminal: the waiting spinner, the bench progress bar. Nothing is
//! drawn when stderr is not a terminal (logs, pipes, cron).

use std::io::IsTerminal;
use std::time::Duration;

use distlock::{Backend, LockClient, LockStatus};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether stderr is a terminal (and so may show spinners and bars).
pub(crate) fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// A spinner on stderr while we wait for a lock, naming its holder (read every second).
pub(crate) struct WaitSpinner {
    bar: ProgressBar,
    poller: tokio::task::JoinHandle<()>,
}

impl WaitSpinner {
    /// Starts the spinner, or nothing when stderr is not a terminal.
    pub(crate) fn start<B: Backend>(client: &LockClient<B>, key: &str) -> Option<Self> {
        if !stderr_is_tty() {
            return None;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(format!("waiting for {key}"));
        bar.enable_steady_tick(Duration::from_millis(100));
        let (client, key, shown) = (client.clone(), key.to_owned(), bar.clone());
        let poller = tokio::spawn(async move {
            loop {
                if let Ok(st) = client.status(&key).await {
                    shown.set_message(waiting_for(&key, &st));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Some(WaitSpinner { bar, poller })
    }

    /// Stops and erases the spinner.
    pub(crate) fn finish(self) {
        self.poller.abort();
        self.bar.finish_and_clear();
    }
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
