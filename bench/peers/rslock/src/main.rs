//! rslock's uncontended Redlock cycle, for distlock-bench's P4 row: `lock` then `unlock` of one
//! key over the masters given, `cycles` times, on a current-thread runtime. Prints cycles per
//! second (one line). Usage: `distlock-peer-rslock CYCLES URL…`.

use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let cycles: usize = args
        .next()
        .and_then(|c| c.parse().ok())
        .expect("usage: distlock-peer-rslock CYCLES URL…");
    let urls: Vec<String> = args.collect();
    assert!(!urls.is_empty(), "no Redis URL given");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let manager = rslock::LockManager::new(urls);
        let ttl = Duration::from_secs(30);
        // Warm-up: connections and scripts.
        for _ in 0..50 {
            let lock = manager.lock("peer:rslock", ttl).await.expect("lock");
            manager.unlock(&lock).await;
        }
        let t0 = Instant::now();
        for _ in 0..cycles {
            let lock = manager.lock("peer:rslock", ttl).await.expect("lock");
            manager.unlock(&lock).await;
        }
        println!("{:.1}", cycles as f64 / t0.elapsed().as_secs_f64());
    });
}
