//! `distlock bench`: a load generator for a user's own deployment.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use distlock::{LockClient, LockOptions, Wait};
use hdrhistogram::Histogram;

use crate::{crowd, exit, term};

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    engine: crate::Engine,
    #[command(flatten)]
    pub(crate) metrics: crate::MetricsArgs,
    /// Concurrent lockers, each with its own client and connections, as separate processes
    /// would have.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    tasks: u32,
    /// Keys the tasks share (task i uses key i mod KEYS); 1 is one hot key.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    keys: u32,
    /// How long each acquisition holds the lock.
    #[arg(long, default_value = "0ms", value_parser = crate::parse_duration, value_name = "D")]
    hold: Duration,
    /// Length of the run.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration, value_name = "D")]
    duration: Duration,
    /// Lease length of each acquisition.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// Prefix of the keys used (PREFIX0, PREFIX1…).
    #[arg(long, default_value = "distlock-bench/")]
    prefix: String,
    /// The holder label (default: host/pid); each task adds its number.
    #[arg(long)]
    label: Option<String>,
    /// Print the figures as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Per key: the last release, for hand-off latency.
#[derive(Default)]
struct KeyState {
    /// When the last holder began its release, and which task it was.
    released: Option<(Instant, u32)>,
}

/// What one task measured.
struct TaskResult {
    acquisitions: u64,
    errors: u64,
    first_error: Option<String>,
    acquire_us: Histogram<u64>,
    handoff_us: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) async fn bench(args: BenchArgs) -> u8 {
    if args.duration.is_zero() {
        eprintln!("distlock: --duration must be more than 0");
        return exit::USAGE;
    }
    let url = match args.engine.url() {
        Ok(u) => u,
        Err(e) => return exit::report_open(&e),
    };
    // Every task's client first (connections are not part of the measurement).
    let clients =
        match crowd::clients(&url, args.tasks, args.ttl, args.label.as_deref(), "bench").await {
            Ok(c) => c,
            Err(code) => return code,
        };
    let engine = clients[0].backend().name();
    let keys: Vec<String> = (0..args.keys)
        .map(|k| format!("{}{k}", args.prefix))
        .collect();
    if let Err(e) = clients[0].status(&keys[0]).await {
        return exit::report("cannot use the bench keys", &e);
    }
    let states: Vec<Mutex<KeyState>> = keys.iter().map(|_| Mutex::default()).collect();

    let bar = term::progress(args.duration, "bench");
    let started = Instant::now();
    let deadline = started + args.duration;
    let ticker = crowd::follow_clock(&bar, started);
    // All tasks on this thread (the engines' clients do their I/O in their own tasks).
    let running = clients.iter().enumerate().map(|(i, client)| {
        let me = u32::try_from(i).unwrap_or(u32::MAX);
        let slot = i % keys.len();
        one_task(client, &keys[slot], &states[slot], me, args.hold, deadline)
    });
    let results = futures_util::future::join_all(running).await;
    let elapsed = started.elapsed();
    ticker.abort();
    bar.finish_and_clear();

    let report = Report::new(&args, engine, &url, elapsed, &results);
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    if report.acquisitions == 0 {
        if let Some(e) = results.iter().find_map(|r| r.first_error.clone()) {
            eprintln!("distlock: no acquisition succeeded; first error: {e}");
        } else {
            eprintln!("distlock: no acquisition succeeded");
        }
        return exit::UNAVAILABLE;
    }
    0
}

/// One task: acquire, hold, release, until the deadline.
async fn one_task(
    client: &LockClient,
    key: &str,
    state: &Mutex<KeyState>,
    me: u32,
    hold: Duration,
    deadline: Instant,
) -> TaskResult {
    let mut r = TaskResult {
        acquisitions: 0,
        errors: 0,
        first_error: None,
        acquire_us: histogram(),
        handoff_us: histogram(),
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            return r;
        }
        let Ok(options) = LockOptions::builder()
            .ttl(client.default_options().ttl())
            .wait(Wait::Timeout(deadline - now))
            .build()
        else {
            return r;
        };
        let asked = Instant::now();
        let guard = match client.lock(key).options(options).acquire().await {
            Ok(g) => g,
            Err(e) if e.kind() == distlock::ErrorKind::Timeout => return r,
            Err(e) => {
                r.errors += 1;
                r.first_error.get_or_insert_with(|| exit::one_line(&e));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let got = Instant::now();
        r.acquisitions += 1;
        let _ = r.acquire_us.record(micros(got - asked).max(1));
        // A hand-off: another task's release began while we were already waiting.
        if let Some((released, by)) = lock(state).released
            && by != me
            && released >= asked
        {
            let _ = r.handoff_us.record(micros(got - released).max(1));
        }
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        lock(state).released = Some((Instant::now(), me));
        if let Err(e) = guard.release().await {
            r.errors += 1;
            r.first_error.get_or_insert_with(|| exit::one_line(&e));
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The figures of a run.
struct Report {
    engine: &'static str,
    url: String,
    tasks: u32,
    keys: u32,
    hold: Duration,
    elapsed: Duration,
    acquisitions: u64,
    errors: u64,
    per_task_min: u64,
    per_task_max: u64,
    acquire: Histogram<u64>,
    handoff: Histogram<u64>,
}

impl Report {
    fn new(
        args: &BenchArgs,
        engine: &'static str,
        url: &str,
        elapsed: Duration,
        results: &[TaskResult],
    ) -> Self {
        let mut acquire = histogram();
        let mut handoff = histogram();
        for r in results {
            let _ = acquire.add(&r.acquire_us);
            let _ = handoff.add(&r.handoff_us);
        }
        let counts = results.iter().map(|r| r.acquisitions);
        Report {
            engine,
            url: distlock::url::redact(url),
            tasks: args.tasks,
            keys: args.keys,
            hold: args.hold,
            elapsed,
            acquisitions: results.iter().map(|r| r.acquisitions).sum(),
            errors: results.iter().map(|r| r.errors).sum(),
            per_task_min: counts.clone().min().unwrap_or(0),
            per_task_max: counts.max().unwrap_or(0),
            acquire,
            handoff,
        }
    }

    fn throughput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// min/max acquisitions per task: 1 is perfectly fair.
    fn fairness(&self) -> f64 {
        if self.per_task_max == 0 {
            return 0.0;
        }
        self.per_task_min as f64 / self.per_task_max as f64
    }

    fn quantiles(h: &Histogram<u64>) -> serde_json::Value {
        if h.is_empty() {
            return serde_json::Value::Null;
        }
        serde_json::json!({
            "count": h.len(),
            "p50": h.value_at_quantile(0.5),
            "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999),
            "max": h.max(),
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": self.engine,
            "url": self.url,
            "tasks": self.tasks,
            "keys": self.keys,
            "hold_ms": self.hold.as_secs_f64() * 1e3,
            "seconds": self.elapsed.as_secs_f64(),
            "acquisitions": self.acquisitions,
            "throughput": self.throughput(),
            "acquire_us": Self::quantiles(&self.acquire),
            "handoff_us": Self::quantiles(&self.handoff),
            "fairness": {
                "min": self.per_task_min,
                "max": self.per_task_max,
                "ratio": self.fairness(),
            },
            "errors": self.errors,
        })
    }

    fn text(&self) -> String {
        let line = |h: &Histogram<u64>| {
            if h.is_empty() {
                return "none".to_owned();
            }
            format!(
                "p50 {}   p99 {}   p99.9 {}   max {}   ({} samples)",
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99)),
                us(h.value_at_quantile(0.999)),
                us(h.max()),
                h.len()
            )
        };
        format!(
            "distlock bench: {} ({}), {} tasks on {} key{}, hold {}, {:.1} s\n\
             acquisitions      {} ({:.1}/s)\n\
             acquire latency   {}\n\
             hand-off latency  {}\n\
             fairness          {:.2} (min {} / max {} acquisitions per task)\n\
             errors            {}\n",
            self.engine,
            self.url,
            self.tasks,
            self.keys,
            if self.keys == 1 { "" } else { "s" },
            crate::show_duration(self.hold),
            self.elapsed.as_secs_f64(),
            self.acquisitions,
            self.throughput(),
            line(&self.acquire),
            line(&self.handoff),
            self.fairness(),
            self.per_task_min,
            self.per_task_max,
            self.errors,
        )
    }
}

/// Microseconds, shown in the unit that reads best.
fn us(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1} ms", v as f64 / 1000.0)
    } else {
        format!("{v} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::us;

    #[test]
    fn latencies_read_well() {
        assert_eq!(us(42), "42 µs");
        assert_eq!(us(12_345), "12.3 ms");
    }
}
