//! `distlock check`: a short correctness check of a deployment.
//!
//! Workers (each with its own client and connections, as separate hosts would have) take one
//! lock in turn and run a read → pause → write critical section on a shared resource that
//! notices what a broken lock lets through: two workers inside at once, a write whose fence
//! is not above every earlier write's, and updates lost to an interleaved read-modify-write.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use distlock::Fencing;
use distlock::{LockClient, LockOptions, Released, Wait};

use crate::{crowd, exit, term};

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Workers, each with its own client.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=1024))]
    workers: u32,
    /// Length of the check.
    #[arg(long, default_value = "5s", value_parser = crate::parse_duration, value_name = "D")]
    duration: Duration,
    /// Pause inside the critical section, between the read and the write.
    #[arg(long, default_value = "1ms", value_parser = crate::parse_duration, value_name = "D")]
    hold: Duration,
    /// Lease length.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// Prefix of the lock used; a random part is added, so a check never meets a real lock.
    #[arg(long, default_value = "distlock-check/")]
    prefix: String,
    /// The holder label (default: host/pid); each worker adds its number.
    #[arg(long)]
    label: Option<String>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// The protected resource, and what it saw.
#[derive(Debug, Default)]
struct Resource {
    value: u64,
    highest_fence: Option<u64>,
    inside: u32,
    /// Entries while another worker was inside.
    overlaps: u64,
    /// Writes whose fence was not above every earlier write's.
    fence_regressions: u64,
    writes: u64,
}

#[derive(Debug, Default)]
struct Counts {
    acquisitions: u64,
    contended: u64,
    /// Locks found lost before the write (the write was skipped, as a careful client would).
    lost_before_write: u64,
    /// Releases that found the lock already gone.
    lost_at_release: u64,
    errors: u64,
    first_error: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) async fn check(args: CheckArgs) -> u8 {
    let url = match args.engine.url() {
        Ok(u) => u,
        Err(e) => return exit::report_open(&e),
    };
    let key = format!(
        "{}{}",
        args.prefix,
        &distlock::Token::generate().as_str()[..12]
    );
    let clients =
        match crowd::clients(&url, args.workers, args.ttl, args.label.as_deref(), "check").await {
            Ok(c) => c,
            Err(code) => return code,
        };
    let engine = clients[0].backend().name();
    let fenced = matches!(
        clients[0].backend().capabilities().fencing,
        Fencing::Monotonic
    );
    let resource = Mutex::new(Resource::default());
    let bar = term::progress(args.duration, "check");
    let started = Instant::now();
    let deadline = started + args.duration;
    let running = clients
        .iter()
        .map(|client| worker(client, &key, &resource, args.hold, deadline));
    let ticker = crowd::follow_clock(&bar, started);
    let mut counts = Counts::default();
    for c in futures_util::future::join_all(running).await {
        counts.acquisitions += c.acquisitions;
        counts.contended += c.contended;
        counts.lost_before_write += c.lost_before_write;
        counts.lost_at_release += c.lost_at_release;
        counts.errors += c.errors;
        if counts.first_error.is_none() {
            counts.first_error = c.first_error;
        }
    }
    ticker.abort();
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    // Everything released: the lock is free again. A worker whose wait ended at the deadline
    // may have been handed the lock as it gave up; its client gives it back in the background,
    // so the lock gets a moment (within its TTL) before it counts as left held.
    let left_held = match distlock::connect(&url).await {
        Ok(c) => {
            let give_up = Instant::now() + args.ttl.min(Duration::from_secs(3));
            loop {
                let held = c.status(&key).await.map(|s| s.held).unwrap_or(false);
                if !held || Instant::now() >= give_up {
                    break held;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Err(_) => false,
    };
    let res = lock(&resource);
    let lost_updates = res.writes.saturating_sub(res.value);
    let violations = res.overlaps + lost_updates + if fenced { res.fence_regressions } else { 0 };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "engine": engine,
                "url": distlock::url::redact(&url),
                "key": key,
                "workers": args.workers,
                "seconds": elapsed.as_secs_f64(),
                "acquisitions": counts.acquisitions,
                "contended": counts.contended,
                "writes": res.writes,
                "final_value": res.value,
                "lost_updates": lost_updates,
                "overlaps": res.overlaps,
                "fenced": fenced,
                "fence_regressions": if fenced { Some(res.fence_regressions) } else { None },
                "lost_before_write": counts.lost_before_write,
                "lost_at_release": counts.lost_at_release,
                "errors": counts.errors,
                "left_held": left_held,
                "ok": violations == 0 && counts.acquisitions > 0,
            })
        );
    } else {
        let fences = if fenced {
            res.fence_regressions.to_string()
        } else {
            format!("n/a ({engine} gives no fencing tokens)")
        };
        print!(
            "distlock check: {engine} ({}), {} workers on {key}, hold {}, {:.1} s\n\
             acquisitions       {} ({} found the lock busy first)\n\
             writes             {} (final value {}, lost updates {lost_updates})\n\
             overlaps           {} (two workers inside the critical section at once)\n\
             fence regressions  {fences}\n\
             locks lost         {} before the write (skipped), {} at release\n\
             errors             {}\n\
             left held          {}\n",
            distlock::url::redact(&url),
            args.workers,
            crate::show_duration(args.hold),
            elapsed.as_secs_f64(),
            counts.acquisitions,
            counts.contended,
            res.writes,
            res.value,
            res.overlaps,
            counts.lost_before_write,
            counts.lost_at_release,
            counts.errors,
            if left_held {
                "yes (a lock outlived its holder)"
            } else {
                "no"
            },
        );
        if violations == 0 && counts.acquisitions > 0 {
            println!("result             OK: no violation");
        } else if counts.acquisitions == 0 {
            println!("result             NO DATA: no acquisition succeeded");
        } else {
            println!("result             VIOLATIONS: {violations}");
        }
    }
    if let Some(e) = &counts.first_error {
        eprintln!("distlock: first error: {e}");
    }
    if counts.acquisitions == 0 {
        return exit::UNAVAILABLE;
    }
    if violations > 0 {
        return exit::VIOLATION;
    }
    0
}

async fn worker(
    client: &LockClient,
    key: &str,
    resource: &Mutex<Resource>,
    hold: Duration,
    deadline: Instant,
) -> Counts {
    let mut c = Counts::default();
    let fail = |c: &mut Counts, e: &distlock::LockError| {
        c.errors += 1;
        c.first_error.get_or_insert_with(|| exit::one_line(e));
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            return c;
        }
        let guard = match client.try_acquire(key).await {
            Ok(Some(g)) => g,
            Ok(None) => {
                c.contended += 1;
                let Ok(options) = LockOptions::builder()
                    .ttl(client.default_options().ttl())
                    .wait(Wait::Timeout(deadline - now))
                    .build()
                else {
                    return c;
                };
                match client.lock(key).options(options).acquire().await {
                    Ok(g) => g,
                    Err(e) if e.kind() == distlock::ErrorKind::Timeout => return c,
                    Err(e) => {
                        fail(&mut c, &e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                }
            }
            Err(e) => {
                fail(&mut c, &e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        c.acquisitions += 1;
        let read = {
            let mut r = lock(resource);
            r.inside += 1;
            if r.inside > 1 {
                r.overlaps += 1;
            }
            r.value
        };
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        {
            let mut r = lock(resource);
            if guard.is_held() {
                if let Some(f) = guard.fence() {
                    if r.highest_fence.is_some_and(|h| f <= h) {
                        r.fence_regressions += 1;
                    }
                    r.highest_fence = Some(r.highest_fence.map_or(f, |h| h.max(f)));
                }
                r.value = read + 1;
                r.writes += 1;
            } else {
                c.lost_before_write += 1;
            }
            r.inside -= 1;
        }
        match guard.release().await {
            Ok(Released::Held) => {}
            Ok(Released::Lost(_)) => c.lost_at_release += 1,
            Err(e) => fail(&mut c, &e),
        }
    }
}
