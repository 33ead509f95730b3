//! redlock-rs (the `redlock` crate, synchronous) behind the peer protocol of
//! `bench/peers/README.md`: `cycles N URL…` and `contend URL TASKS START_NS MILLIS HOLD_US`
//! (one thread per task: the crate blocks).

use std::time::{Duration, Instant};

const TTL_MS: usize = 30_000;

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cycles") => {
            let n: usize = args[1].parse().expect("N");
            let mut rl = redlock::RedLock::new(args[2..].to_vec());
            rl.set_retry(1, 1);
            let cycle = |rl: &redlock::RedLock| {
                let lock = rl
                    .lock(b"peer:redlock-rs", TTL_MS)
                    .expect("redis")
                    .expect("uncontended lock");
                rl.unlock(&lock);
            };
            for _ in 0..50 {
                cycle(&rl);
            }
            let t0 = Instant::now();
            for _ in 0..n {
                cycle(&rl);
            }
            println!("{:.1}", n as f64 / t0.elapsed().as_secs_f64());
        }
        Some("contend") => {
            let url = args[1].clone();
            let tasks: usize = args[2].parse().expect("TASKS");
            let start_ns: u64 = args[3].parse().expect("START_NS");
            let millis: u64 = args[4].parse().expect("MILLIS");
            let hold = Duration::from_micros(args[5].parse().expect("HOLD_US"));
            let threads: Vec<_> = (0..tasks)
                .map(|_| {
                    let url = url.clone();
                    std::thread::spawn(move || {
                        // The crate's defaults: 3 tries 0–200 ms apart per lock() call.
                        let rl = redlock::RedLock::new(vec![url]);
                        while mono_ns() < start_ns {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        let end = start_ns + millis * 1_000_000;
                        let (mut got, mut errors) = (0u64, 0u64);
                        while mono_ns() < end {
                            match rl.lock(b"peer:redlock-rs:hot", TTL_MS) {
                                Ok(Some(lock)) => {
                                    if mono_ns() < end {
                                        got += 1;
                                    }
                                    if !hold.is_zero() {
                                        std::thread::sleep(hold);
                                    }
                                    rl.unlock(&lock);
                                }
                                Ok(None) => {}
                                Err(_) => errors += 1,
                            }
                        }
                        (got, errors)
                    })
                })
                .collect();
            let (mut got, mut errors) = (0, 0);
            for t in threads {
                let (g, e) = t.join().expect("a task panicked");
                got += g;
                errors += e;
            }
            println!("{}", serde_json::json!({"acquisitions": got, "errors": errors}));
        }
        Some("handoff") => {
            // One locker taking turns with another process: each acquisition's times (P3).
            let rl = redlock::RedLock::new(vec![args[1].clone()]);
            let hold = Duration::from_micros(args[2].parse().expect("HOLD_US"));
            let gap = Duration::from_micros(args[3].parse().expect("GAP_US"));
            let start_ns: u64 = args[4].parse().expect("START_NS");
            let millis: u64 = args[5].parse().expect("MILLIS");
            let end = start_ns + millis * 1_000_000;
            while mono_ns() < start_ns {
                std::thread::sleep(Duration::from_micros(200));
            }
            let (mut events, mut errors) = (Vec::new(), 0u64);
            let mut asked = None;
            while mono_ns() < end {
                let called = *asked.get_or_insert_with(mono_ns);
                match rl.lock(b"peer:redlock-rs:handoff", TTL_MS) {
                    Ok(Some(lock)) => {
                        asked = None;
                        let acquired = mono_ns();
                        std::thread::sleep(hold);
                        let sent = mono_ns();
                        rl.unlock(&lock);
                        events.push([acquired, sent, called]);
                        std::thread::sleep(gap);
                    }
                    // The crate gave up after its retries: ask again (still waiting).
                    Ok(None) => {}
                    Err(_) => errors += 1,
                }
            }
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
