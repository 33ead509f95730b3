//! rslock behind the peer protocol of `bench/peers/README.md`: `cycles N URL…` (lock then
//! unlock of one key over the masters given) and `contend URL TASKS START_NS MILLIS HOLD_US`
//! (tasks on one current-thread runtime, rslock's own retry for waiting).

use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(30);

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match args.first().map(String::as_str) {
        Some("cycles") => {
            let n: usize = args[1].parse().expect("N");
            let manager = rslock::LockManager::new(args[2..].to_vec());
            rt.block_on(async {
                // Warm-up: connections and scripts.
                for _ in 0..50 {
                    let lock = manager.lock("peer:rslock", TTL).await.expect("lock");
                    manager.unlock(&lock).await;
                }
                let t0 = Instant::now();
                for _ in 0..n {
                    let lock = manager.lock("peer:rslock", TTL).await.expect("lock");
                    manager.unlock(&lock).await;
                }
                println!("{:.1}", n as f64 / t0.elapsed().as_secs_f64());
            });
        }
        Some("contend") => {
            let url = args[1].clone();
            let tasks: usize = args[2].parse().expect("TASKS");
            let start_ns: u64 = args[3].parse().expect("START_NS");
            let millis: u64 = args[4].parse().expect("MILLIS");
            let hold = Duration::from_micros(args[5].parse().expect("HOLD_US"));
            let end = start_ns + millis * 1_000_000;
            let (got, errors) = rt.block_on(async {
                let mut running = Vec::new();
                for _ in 0..tasks {
                    let manager = rslock::LockManager::new(vec![url.clone()]);
                    running.push(tokio::spawn(async move {
                        while mono_ns() < start_ns {
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        }
                        let (mut got, mut errors) = (0u64, 0u64);
                        while mono_ns() < end {
                            // rslock's own waiting: its default retries with a delay.
                            match manager.lock("peer:rslock:hot", TTL).await {
                                Ok(lock) => {
                                    if mono_ns() < end {
                                        got += 1;
                                    }
                                    if !hold.is_zero() {
                                        tokio::time::sleep(hold).await;
                                    }
                                    manager.unlock(&lock).await;
                                }
                                Err(_) => errors += 1,
                            }
                        }
                        (got, errors)
                    }));
                }
                let (mut got, mut errors) = (0, 0);
                for r in running {
                    let (g, e) = r.await.expect("a task panicked");
                    got += g;
                    errors += e;
                }
                (got, errors)
            });
            println!("{}", serde_json::json!({"acquisitions": got, "errors": errors}));
        }
        Some("handoff") => {
            // One locker taking turns with another process: each acquisition's times (P3).
            let url = args[1].clone();
            let hold = Duration::from_micros(args[2].parse().expect("HOLD_US"));
            let gap = Duration::from_micros(args[3].parse().expect("GAP_US"));
            let start_ns: u64 = args[4].parse().expect("START_NS");
            let millis: u64 = args[5].parse().expect("MILLIS");
            let end = start_ns + millis * 1_000_000;
            let (events, errors) = rt.block_on(async {
                let manager = rslock::LockManager::new(vec![url]);
                while mono_ns() < start_ns {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                let (mut events, mut errors) = (Vec::new(), 0u64);
                let mut asked = None;
                while mono_ns() < end {
                    let called = *asked.get_or_insert_with(mono_ns);
                    match manager.lock("peer:rslock:handoff", TTL).await {
                        Ok(lock) => {
                            asked = None;
                            let acquired = mono_ns();
                            tokio::time::sleep(hold).await;
                            let sent = mono_ns();
                            manager.unlock(&lock).await;
                            events.push([acquired, sent, called]);
                            tokio::time::sleep(gap).await;
                        }
                        Err(_) => errors += 1,
                    }
                }
                (events, errors)
            });
            println!("{}", serde_json::json!({"events": events, "errors": errors}));
        }
        Some("renew") => {
            println!("n/a (no automatic renewal)");
            std::process::exit(3);
        }
        Some("rw-cycles" | "rw-mix") => {
            println!("n/a (no read-write lock)");
            std::process::exit(3);
        }
        Some("sem-cycles" | "sem-contend") => {
            println!("n/a (no semaphore)");
            std::process::exit(3);
        }
        _ => {
            eprintln!("usage: cycles N URL… | contend URL TASKS START_NS MILLIS HOLD_US");
            std::process::exit(2);
        }
    }
}
