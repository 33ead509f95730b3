//! P6 on Redis alone, for an A/B of two commits: `bench/ab_p6.py` builds this file against each
//! commit's `distlock-core` and `distlock-redis` (only the public API, the same at both) and
//! runs the builds in turn.
//!
//! Usage: p6probe URL SERVER_PID LOCKS TTL_MS WINDOW_S
//!
//! Takes LOCKS locks on one client (the watchdog renews them every TTL/3), lets one tick pass,
//! then measures for WINDOW_S seconds: the server's CPU (its /proc stat, utime + stime), this
//! process's CPU, and the commands the server ran (INFO's total_commands_processed, read with
//! redis-cli). Prints one JSON line.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions};
use distlock_redis::RedisBackend;

/// utime + stime of a process, in seconds.
fn cpu_s(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on Linux.
    ticks / 100.0
}

fn commands(port: &str) -> f64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", port, "info", "stats"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_commands_processed")
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (url, pid) = (a[1].clone(), a[2].clone());
    let n: usize = a[3].parse().unwrap();
    let ttl = Duration::from_millis(a[4].parse().unwrap());
    let window = Duration::from_secs(a[5].parse().unwrap());
    let port = url.rsplit(':').next().unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = RedisBackend::connect(&url).await.expect("connect");
        let options = LockOptions::builder().ttl(ttl).build().unwrap();
        let client = LockClient::builder(backend).options(options).build();
        let keys: Vec<String> = (0..n).map(|i| format!("p6-{i}")).collect();
        let mut guards = Vec::with_capacity(n);
        for chunk in keys.chunks(500) {
            let got =
                futures_util::future::join_all(chunk.iter().map(|k| client.try_acquire(k))).await;
            for g in got {
                guards.push(g.expect("acquire").expect("a free key"));
            }
        }
        tokio::time::sleep(ttl / 3).await;
        let (s0, c0, k0, t0) = (cpu_s(&pid), cpu_s("self"), commands(&port), Instant::now());
        tokio::time::sleep(window).await;
        let secs = t0.elapsed().as_secs_f64();
        let (s1, c1, k1) = (cpu_s(&pid), cpu_s("self"), commands(&port));
        let held = guards.iter().filter(|g| g.is_held()).count();
        futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await;
        let ticks = secs / (ttl.as_secs_f64() / 3.0);
        println!(
            "{{\"server_cpu_pct\":{:.3},\"client_cpu_pct\":{:.3},\"commands_per_tick\":{:.1},\"held\":{held}}}",
            (s1 - s0) / secs * 100.0,
            (c1 - c0) / secs * 100.0,
            // Two INFO readings are not renewals.
            (k1 - k0 - 2.0) / ticks,
        );
    });
}
