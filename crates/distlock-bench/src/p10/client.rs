//! One P10 client process: takes N names one by one, holds them for three TTLs while the
//! watchdog renews them, and reports what that cost it.
//!
//! It talks to its parent on stdout: a line `acquired` once every name is held (the parent then
//! reads the server's memory), then one JSON line with the figures.

use std::io::Write;
use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions};

use crate::common::pin_self;

/// What the parent asks of a client.
pub(crate) struct Ask<'a> {
    pub(crate) url: &'a str,
    pub(crate) names: usize,
    pub(crate) ttl: Duration,
    pub(crate) pin: bool,
    /// The names' prefix.
    pub(crate) prefix: &'a str,
}

/// The process's resident memory, in bytes (`/proc/self/statm`, in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    pages * page
}

/// CPU time this process has used (user and system), in seconds.
fn cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(u.user_time()) + tv(u.system_time())
}

/// The name of lock `i` (short, as a user's would be).
pub(crate) fn name(prefix: &str, i: usize) -> String {
    format!("{prefix}/{i}")
}

/// Runs the client (a current-thread runtime: one core's worth of work, as pinned).
pub(crate) fn run(ask: &Ask<'_>) {
    if ask.pin {
        pin_self(0);
    }
    // A renewal that fails says so (the run's figures would hide it).
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let figures = rt.block_on(hold(ask));
    println!("{figures}");
}

async fn hold(ask: &Ask<'_>) -> serde_json::Value {
    let options = LockOptions::builder()
        .ttl(ask.ttl)
        .build()
        .expect("options");
    let client = LockClient::builder(distlock::open_backend(ask.url).await.expect("connect"))
        .options(options)
        .build();
    // Warm the connection, the scripts and the allocator before the baseline.
    for _ in 0..20 {
        let g = client
            .acquire(&format!("{}/warm", ask.prefix))
            .await
            .expect("warm-up acquire");
        let _ = g.release().await.expect("warm-up release");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = rss_bytes();
    let cpu_before = cpu_seconds();
    let t0 = Instant::now();
    let mut guards = Vec::with_capacity(ask.names);
    let name = |i| name(ask.prefix, i);
    for i in 0..ask.names {
        match client.try_acquire(&name(i)).await {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => panic!("{} is taken: names must be free", name(i)),
            Err(e) => panic!("acquiring {} (the {i}th): {e}", name(i)),
        }
    }
    let acquire_s = t0.elapsed().as_secs_f64();
    let acquire_cpu = cpu_seconds() - cpu_before;
    let rss_held = rss_bytes();
    println!("acquired");
    let _ = std::io::stdout().flush();
    // Three TTLs, renewals only.
    let hold = ask.ttl * 3;
    let (cpu0, t1) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(hold).await;
    let hold_cpu = cpu_seconds() - cpu0;
    let hold_s = t1.elapsed().as_secs_f64();
    // Before the other client below adds its own connection and buffers.
    let rss_end = rss_bytes();
    let held = guards.iter().filter(|g| g.is_held()).count();
    // The server's view, from another client: a sample of names spread over all must be
    // refused to it.
    let sample: Vec<usize> = (0..100).map(|k| k * ask.names / 100).collect();
    let mut taken_by_other = 0;
    let mut sample_error = None;
    match distlock::open_backend(ask.url).await {
        Ok(backend) => {
            let other = LockClient::builder(backend).options(options).build();
            for &i in &sample {
                match other.try_acquire(&name(i)).await {
                    Ok(Some(g)) => {
                        taken_by_other += 1;
                        let _ = g.release().await;
                    }
                    Ok(None) => {}
                    Err(e) => sample_error = Some(e.to_string()),
                }
            }
        }
        // Not refused either: the check could not be made (say, a server out of connections).
        Err(e) => {
            taken_by_other = sample.len();
            sample_error = Some(e.to_string());
        }
    }
    let t2 = Instant::now();
    for g in guards {
        let _ = g.release().await;
    }
    let release_s = t2.elapsed().as_secs_f64();
    serde_json::json!({
        "names": ask.names,
        "acquire_s": acquire_s,
        "acquire_cpu_s": acquire_cpu,
        "hold_s": hold_s,
        "hold_cpu_s": hold_cpu,
        "held_after": held,
        "sample": sample.len(),
        "sample_taken_by_other": taken_by_other,
        "sample_error": sample_error,
        "rss_before": rss_before,
        "rss_held": rss_held,
        "rss_end": rss_end,
        "release_s": release_s,
    })
}
