//! What `bench` and `check` share: many lockers, each with its own client and connections
//! (as separate processes would have), and a progress bar that follows the clock.

use std::time::{Duration, Instant};

use distlock::{LockClient, LockOptions};

use crate::exit;

/// `n` clients of the engine at `url`, labelled `<label> <role>-<i>`; or the exit status of
/// the error that stopped them (already reported).
pub(crate) async fn clients(
    url: &str,
    n: u32,
    ttl: Duration,
    label: Option<&str>,
    role: &str,
) -> Result<Vec<LockClient>, u8> {
    let options = LockOptions::builder()
        .ttl(ttl)
        .build()
        .map_err(|e| exit::report("invalid options", &e))?;
    let label = label.map_or_else(distlock::tools::default_owner, str::to_owned);
    let mut clients = Vec::new();
    for i in 0..n {
        let backend = distlock::open_backend(url)
            .await
            .map_err(|e| exit::report_open(&e))?;
        clients.push(
            LockClient::builder(backend)
                .options(options)
                .owner(format!("{label} {role}-{i}"))
                .build(),
        );
    }
    Ok(clients)
}

/// Moves `bar` with the time since `started`, until aborted.
pub(crate) fn follow_clock(
    bar: &indicatif::ProgressBar,
    started: Instant,
) -> tokio::task::JoinHandle<()> {
    let bar = bar.clone();
    tokio::spawn(async move {
        loop {
            bar.set_position(u64::try_from(started.elapsed().as_millis()).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}
