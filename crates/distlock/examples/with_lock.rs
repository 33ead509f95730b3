//! Run a critical section under a lock, with the fencing token passed to the protected resource.
//!
//! `cargo run -p distlock --example with_lock [URL]` (default: the local file engine).

use std::time::Duration;

use distlock::{LockClient, LockOptions};

#[tokio::main]
async fn main() -> Result<(), distlock::LockError> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "file://".into());
    let backend = distlock::open_backend(&url).await?;
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(5))
        .build()?;
    let client = LockClient::builder(backend).options(options).build();

    let report = client
        .with_lock("reports:daily", |lease| async move {
            // Hand the fence to the resource; it must refuse a fence lower than one it has seen.
            println!("holding {} with fence {:?}", lease.key(), lease.fence());
            tokio::time::sleep(Duration::from_millis(50)).await;
            if !lease.is_held() {
                return "stopped: lease lost";
            }
            "done"
        })
        .await?;
    println!("{report}");
    Ok(())
}
