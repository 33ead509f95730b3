//! P10's crowd on one hot name (Redis): 64 waiters (4 processes × 16 tasks, P2's shape) beside
//! 1,024 (16 processes × 64 tasks), zero hold, in interleaved rounds: throughput, fairness
//! (fewest over most acquisitions per process) and the commands the clients send per
//! acquisition. A crowd sixteen times larger should cost no more commands per lock taken:
//! each process's local queue sends one contender to the server, whatever its tasks.

use distlock_testkit::RedisServer;
use serde_json::Value;

use crate::common::{Mode, median, pin_self};
use crate::p2::{Contention, contention_shaped};

/// The two crowds: (processes, tasks each).
pub(crate) const SHAPES: [(usize, usize); 2] = [(4, 16), (16, 64)];

/// The medians of one crowd's rounds.
pub(crate) struct Crowd {
    pub(crate) processes: usize,
    pub(crate) tasks: usize,
    pub(crate) per_sec: f64,
    pub(crate) fairness: f64,
    pub(crate) cmds_per_acq: f64,
    pub(crate) calls_per_acq: f64,
}

impl Crowd {
    fn of(shape: (usize, usize), runs: &[Contention]) -> Crowd {
        let m = |f: fn(&Contention) -> f64| median(runs.iter().map(f).collect());
        Crowd {
            processes: shape.0,
            tasks: shape.1,
            per_sec: m(|c| c.per_sec),
            fairness: m(|c| c.fairness),
            cmds_per_acq: m(|c| c.cmds_per_acq),
            calls_per_acq: m(|c| c.calls_per_acq),
        }
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::json!({
            "processes": self.processes,
            "tasks": self.tasks,
            "per_sec": self.per_sec,
            "fairness": self.fairness,
            "cmds_per_acq": self.cmds_per_acq,
            "calls_per_acq": self.calls_per_acq,
        })
    }
}

/// Runs both crowds `rounds` times, interleaved, `millis` each, against a Redis started here
/// (pinned with this process and its workers to CPU 0 when `pin`).
pub(crate) fn run(rounds: usize, millis: u64, pin: bool) -> Vec<Crowd> {
    let Some(server) = RedisServer::start() else {
        eprintln!("p10 waiters: no redis-server");
        return Vec::new();
    };
    if pin {
        server.pin_to_cpu(0);
        // The workers inherit it.
        pin_self(0);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runs: Vec<Vec<Contention>> = SHAPES.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds.max(1) {
        for (i, &shape) in SHAPES.iter().enumerate() {
            let c = rt.block_on(contention_shaped(
                &server,
                Mode::Events,
                shape,
                millis,
                1,
                (0, 0),
            ));
            eprintln!(
                "p10 waiters {}×{}: {:.0}/s, fairness {:.3}, {:.3} commands/acq",
                shape.0, shape.1, c.per_sec, c.fairness, c.cmds_per_acq
            );
            runs[i].push(c);
        }
    }
    SHAPES
        .iter()
        .zip(&runs)
        .map(|(&shape, r)| Crowd::of(shape, r))
        .collect()
}

/// The table and the bars.
pub(crate) fn render(crowds: &[Crowd], rounds: usize, millis: u64, pinning: &str) -> String {
    let mut out = format!(
        "P10 crowd on one hot name (Redis, events and local queues, zero hold): {rounds} \
         interleaved round(s) of {millis} ms, medians ({pinning})\n\n\
         | waiters | processes × tasks | acq/s | fairness (min/max per process) | commands sent per acq | server calls per acq |\n\
         |---:|---|---:|---:|---:|---:|\n"
    );
    for c in crowds {
        out.push_str(&format!(
            "| {} | {} × {} | {:.0} | {:.3} | {:.3} | {:.3} |\n",
            c.processes * c.tasks,
            c.processes,
            c.tasks,
            c.per_sec,
            c.fairness,
            c.cmds_per_acq,
            c.calls_per_acq
        ));
    }
    if let [small, big] = crowds {
        let ratio = big.cmds_per_acq / small.cmds_per_acq;
        out.push_str("\n| bar | figure | met |\n|---|---:|---|\n");
        for (bar, figure, met) in [
            (
                "commands per acquisition at 1,024 ≤ 1.2× at 64",
                format!("{ratio:.3}×"),
                ratio <= 1.2,
            ),
            (
                "fairness at 1,024 ≥ 0.8",
                format!("{:.3}", big.fairness),
                big.fairness >= 0.8,
            ),
        ] {
            out.push_str(&format!(
                "| {bar} | {figure} | {} |\n",
                if met { "yes" } else { "**no**" }
            ));
        }
    }
    out
}
