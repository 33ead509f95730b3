//! P8: leader election. The fail-over time on each engine — from the leader's death (kill -9)
//! or its SIGTERM (it resigns) to the moment the follower, a process of its own that was
//! campaigning, leads — and what following an election costs the engine: its requests per
//! second with 100 observers of a stable leader, beside the leader alone.

use std::time::Duration;

use distlock_core::{LockClient, LockOptions};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::common::{median, mono_ns};
use crate::p6::P6Server;

/// The TTL of P8's leaderships in a full run (`--quick`: 1 s).
pub(crate) const TTL: Duration = Duration::from_secs(3);

/// One engine's fail-over row.
pub(crate) struct Failover {
    pub(crate) engine: String,
    pub(crate) ttl: Duration,
    /// Fail-over after kill -9, ms, each round.
    pub(crate) kill_ms: Vec<f64>,
    /// Fail-over after SIGTERM, ms, each round.
    pub(crate) term_ms: Vec<f64>,
    pub(crate) note: &'static str,
}

/// One engine's cost of observing.
pub(crate) struct Observing {
    pub(crate) engine: String,
    /// The engine's requests per second with the leader alone, and with the observers.
    pub(crate) alone: f64,
    pub(crate) observed: f64,
    pub(crate) observers: usize,
    pub(crate) unit: &'static str,
}

/// The worker process: campaigns in `name`, prints `lead <monotonic ns> <epoch>` once it
/// leads, then keeps leading until SIGTERM (it resigns and exits) or death.
pub(crate) async fn worker(url: String, name: String, ttl: Duration) {
    let backend = distlock::open_backend(&url).await.expect("connect");
    let client = LockClient::builder(backend)
        .options(LockOptions::builder().ttl(ttl).build().expect("options"))
        .build();
    let leading = client.election(name).campaign().await.expect("campaign");
    println!("lead {} {}", mono_ns(), leading.epoch());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {
            let _ = leading.resign().await;
        }
        _ = leading.lost() => {}
    }
}

fn spawn(
    url: &str,
    name: &str,
    ttl: Duration,
) -> (Child, tokio::io::Lines<BufReader<ChildStdout>>) {
    let exe = std::env::current_exe().expect("own path");
    let ttl_ms = ttl.as_millis().to_string();
    let mut child = Command::new(exe)
        .args([
            "p8-worker",
            "--url",
            url,
            "--name",
            name,
            "--ttl-ms",
            &ttl_ms,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a P8 worker");
    let out = child.stdout.take().expect("stdout");
    (child, BufReader::new(out).lines())
}

/// When the worker behind `lines` led (monotonic ns).
async fn led_at(lines: &mut tokio::io::Lines<BufReader<ChildStdout>>) -> u64 {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a leader within 30 s")
        .expect("read a worker")
        .expect("a worker ended without leading");
    line.split_whitespace()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .expect("lead <ns> <epoch>")
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

/// The fail-over times on `url`, `rounds` of each (kill -9, then SIGTERM).
pub(crate) async fn failover(
    engine: &str,
    url: &str,
    (rounds, ttl): (usize, Duration),
    note: &'static str,
) -> Failover {
    let mut row = Failover {
        engine: engine.to_owned(),
        ttl,
        kill_ms: Vec::new(),
        term_ms: Vec::new(),
        note,
    };
    for round in 0..rounds {
        for kill in [true, false] {
            let name = format!("p8-{round}-{kill}");
            let (a, mut a_out) = spawn(url, &name, ttl);
            led_at(&mut a_out).await;
            let (mut b, mut b_out) = spawn(url, &name, ttl);
            // The follower is campaigning (subscribed, queued) by now.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let t0 = mono_ns();
            signal(
                &a,
                if kill {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                },
            );
            let t1 = led_at(&mut b_out).await;
            let ms = t1.saturating_sub(t0) as f64 / 1e6;
            if kill {
                row.kill_ms.push(ms);
            } else {
                row.term_ms.push(ms);
            }
            drop(a);
            signal(&b, Signal::SIGTERM);
            let _ = b.wait().await;
        }
    }
    row
}

/// The engine's requests per second over `window` with a leader alone, then with
/// `observers` observers (4 clients, each following the election), reading as often as
/// [`distlock_core::DEFAULT_OBSERVE_INTERVAL`] says.
pub(crate) async fn observing(
    engine: &str,
    server: &P6Server<'_>,
    url: &str,
    (observers, window, ttl): (usize, Duration, Duration),
) -> Observing {
    // Each client a backend of its own (on any engine, from its URL), as a process would.
    let make = || async { LockClient::new(distlock::open_backend(url).await.expect("connect")) };
    let leader = make().await;
    let leading = leader
        .election("p8-observed")
        .ttl(ttl)
        .campaign()
        .await
        .expect("campaign");
    let rate = |server: &P6Server<'_>| server.requests();
    // Settle, then the leader alone.
    tokio::time::sleep(server.settle()).await;
    let (r0, t0) = (rate(server), mono_ns());
    tokio::time::sleep(window).await;
    tokio::time::sleep(server.settle()).await;
    let (r1, t1) = (rate(server), mono_ns());
    let alone = (r1 - r0) / ((t1 - t0) as f64 / 1e9 - server.settle().as_secs_f64());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(make().await);
    }
    // The observers run in this task, polled together.
    let mut obs: Vec<_> = (0..observers)
        .map(|i| clients[i % clients.len()].election("p8-observed").observe())
        .collect();
    let follow = futures_util::future::join_all(obs.iter_mut().map(|o| async move {
        loop {
            if o.changed().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }));
    let measure = async {
        // Every observer past its first read.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (r2, t2) = (rate(server), mono_ns());
        tokio::time::sleep(window).await;
        (r2, t2, mono_ns())
    };
    let (r2, t2, t3) = tokio::select! {
        m = measure => m,
        _ = follow => unreachable!("observers never end"),
    };
    tokio::time::sleep(server.settle()).await;
    let r3 = rate(server);
    let observed = (r3 - r2) / ((t3 - t2) as f64 / 1e9);
    drop(leading);
    Observing {
        engine: engine.to_owned(),
        alone,
        observed,
        observers,
        unit: server.unit(),
    }
}

/// The P8 tables.
pub(crate) fn render(failovers: &[Failover], observing: &[Observing], pinning: &str) -> String {
    let mut out = format!(
        "P8 leader election: fail-over, from the leader's kill -9 or SIGTERM to the follower \
         leading (each a process of its own, campaigning), TTL {} ms, medians of {} round(s) \
         ({pinning})\n\n\
         | engine | after kill -9 (ms) | after SIGTERM (ms) | note |\n|---|---:|---:|---|\n",
        failovers.first().map_or(0, |f| f.ttl.as_millis()),
        failovers.first().map_or(0, |f| f.kill_ms.len())
    );
    for f in failovers {
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} | {} |\n",
            f.engine,
            median(f.kill_ms.clone()),
            median(f.term_ms.clone()),
            f.note
        ));
    }
    out.push_str(&format!(
        "\nP8 the cost of following an election: the engine's requests per second with its leader \
         alone, and with {} observers (4 clients), each reading the leader at every release event \
         and every {} s otherwise\n\n\
         | engine | leader alone (/s) | with observers (/s) | per observer (/s) | counted |\n|---|---:|---:|---:|---|\n",
        observing.first().map_or(0, |o| o.observers),
        distlock_core::DEFAULT_OBSERVE_INTERVAL.as_secs()
    ));
    for o in observing {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} | {} |\n",
            o.engine,
            o.alone,
            o.observed,
            (o.observed - o.alone) / o.observers as f64,
            o.unit
        ));
    }
    out
}

/// The P8 figures as JSON.
pub(crate) fn json(failovers: &[Failover], observing: &[Observing]) -> serde_json::Value {
    serde_json::json!({
        "ttl_ms": failovers.first().map_or(0, |f| f.ttl.as_millis() as u64),
        "failover": failovers.iter().map(|f| serde_json::json!({
            "engine": f.engine, "kill_ms": f.kill_ms, "term_ms": f.term_ms,
            "kill_ms_median": median(f.kill_ms.clone()),
            "term_ms_median": median(f.term_ms.clone()),
        })).collect::<Vec<_>>(),
        "observing": observing.iter().map(|o| serde_json::json!({
            "engine": o.engine, "alone_per_s": o.alone, "observed_per_s": o.observed,
            "observers": o.observers, "counted": o.unit,
        })).collect::<Vec<_>>(),
    })
}

/// The bars of P8: after SIGTERM, a few round trips (at most 100 ms here, where a round trip
/// is well under a millisecond); after kill -9, the TTL plus one wake-up (at most the TTL and
/// a second).
pub(crate) fn bars(failovers: &[Failover]) -> Vec<(String, Option<f64>, bool)> {
    let mut out = Vec::new();
    for f in failovers {
        let term = (!f.term_ms.is_empty()).then(|| median(f.term_ms.clone()));
        out.push((
            format!("P8 {} fail-over after SIGTERM ≤ 100 ms", f.engine),
            term,
            term.is_some_and(|t| t <= 100.0),
        ));
        let kill = (!f.kill_ms.is_empty()).then(|| median(f.kill_ms.clone()));
        let bound = (f.ttl + Duration::from_secs(1)).as_secs_f64() * 1e3;
        out.push((
            format!("P8 {} fail-over after kill -9 ≤ TTL + 1 s (ms)", f.engine),
            kill,
            kill.is_some_and(|k| k <= bound),
        ));
    }
    out
}
