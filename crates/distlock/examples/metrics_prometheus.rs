//! The lock metrics in Prometheus' text format: install a recorder once, then every client of
//! the process records into it (feature `metrics`).
//!
//! `cargo run -p distlock --features metrics --example metrics_prometheus [URL]` (default: the
//! local file engine). A service would serve the text on its own `/metrics` instead of
//! printing it (or use `PrometheusBuilder::with_http_listener`).

use std::time::Duration;

use distlock::{LockClient, LockOptions};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    // A bounded set of names as a `key` label; every other name counts as `_other`.
    distlock::metrics::label_keys(["reports:daily"]);

    let url = std::env::args().nth(1).unwrap_or_else(|| "file://".into());
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(5))
        .build()?;
    let client = LockClient::builder(distlock::open_backend(&url).await?)
        .options(options)
        .build();

    let guard = client.acquire("reports:daily").await?;
    // Another task finds it busy, then waits for it.
    let busy = client.try_acquire("reports:daily").await?;
    assert!(busy.is_none());
    // (A client of an engine chosen at run time: its futures can be spawned.)
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire("reports:daily").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(guard.release().await?.was_held());
    assert!(waiter.await??.release().await?.was_held());
    let other = client.acquire("cleanup").await?;
    assert!(other.release().await?.was_held());

    let text = prometheus.render();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("distlock_") && !l.contains("quantile="))
        .collect();
    println!("{}", ours.join("\n"));
    assert!(
        text.contains("distlock_wait_duration_seconds_count"),
        "the wait was not recorded:\n{text}"
    );
    Ok(())
}
