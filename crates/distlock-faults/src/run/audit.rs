//! The leak audit: the lock's copies on the Redis servers, read every so often during the run
//! (and once more at its end).

use std::time::Duration;

use serde_json::{Value, json};

use crate::mono;
use crate::state::{SharedRef, lock};

/// Reads the lock's copies on every Redis server every `every`, and records the ones it finds
/// (the leak check: a copy that belongs to no holder must not stay).
pub(super) async fn audit(shared: SharedRef, ports: Vec<u16>, every: Duration) {
    if ports.is_empty() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        // A paused or restarting server is skipped this time.
        let copies: Vec<Value> = lock_copies(&ports, Duration::from_millis(100))
            .await
            .into_iter()
            .map(|(i, token, owner)| json!([i, token, owner]))
            .collect();
        // Empty audits are recorded too: a leak is a copy seen in consecutive audits.
        lock(&shared)
            .history
            .record(json!({"ev": "audit", "t": mono::now_ns(), "copies": copies}));
    }
}

/// The lock's copies on the Redis servers at `ports`: (server, token, owner) for each server
/// that has one and answers within `timeout`.
pub(super) async fn lock_copies(ports: &[u16], timeout: Duration) -> Vec<(usize, String, String)> {
    let name = "distlock:{k}";
    let mut copies = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let read = async {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("GET")
                .arg(name)
                .query_async::<Option<String>>(&mut c)
                .await
                .ok()?
        };
        if let Ok(Some(v)) = tokio::time::timeout(timeout, read).await {
            let mut parts = v.split(' ');
            let token = parts.next().unwrap_or("").to_owned();
            let owner = parts.nth(1).unwrap_or("").to_owned();
            copies.push((i, token, owner));
        }
    }
    copies
}
