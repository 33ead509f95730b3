//! The report: the tables printed (and written as Markdown with `--report`), the bars of the
//! brief with their figures, and the raw figures as JSON (`--json`).

use std::time::Duration;

use distlock_testkit::RedisServer;

use crate::Cli;
use crate::common::{Mode, median, redis_version, show, shown};
use crate::p2::{Contention, PeerContention};
use crate::p3::{HandoffFigures, P3Round, P3Row};
use crate::p4::P4;
use crate::p5::P5Row;
use crate::{p6, peers};

/// Every figure of a run, as the scenarios measured them.
pub(crate) struct Results<'a> {
    pub(crate) cli: &'a Cli,
    pub(crate) server: &'a RedisServer,
    pub(crate) pinning: &'static str,
    pub(crate) rounds: usize,
    pub(crate) cycles: usize,
    pub(crate) millis: u64,
    pub(crate) peer_list: &'a [peers::Peer],
    pub(crate) p1_sync: f64,
    pub(crate) p1_async: f64,
    pub(crate) p1_ours: f64,
    pub(crate) rtt: f64,
    pub(crate) p1_peers: Vec<peers::Figure>,
    pub(crate) p1_lat: [hdrhistogram::Histogram<u64>; 2],
    /// P1 over TLS beside TCP (`None` when the TLS server could not start).
    pub(crate) p1_tls: Option<crate::p1::TlsFigures>,
    pub(crate) p4: P4,
    pub(crate) p5: Vec<P5Row>,
    pub(crate) runs: Vec<Contention>,
    pub(crate) p2_waiters: usize,
    pub(crate) p2_shape: (usize, usize),
    pub(crate) p2_peers: Vec<PeerContention>,
    pub(crate) p3: Vec<P3Round>,
    pub(crate) idle_rtt: f64,
    pub(crate) raw_count: usize,
    pub(crate) p3_peer_millis: u64,
    pub(crate) p3_peers: Vec<(String, HandoffFigures)>,
    pub(crate) p6_locks: usize,
    pub(crate) p6_ttl: Duration,
    pub(crate) p6_window: Duration,
    pub(crate) p6_rows: Vec<p6::Row>,
    pub(crate) p7: crate::p7::P7,
    pub(crate) p8_failovers: Vec<crate::p8::Failover>,
    pub(crate) p8_observing: Vec<crate::p8::Observing>,
    pub(crate) p9: crate::p9::Figures,
}

/// Prints the report, and writes it as Markdown and JSON when the command line asks.
pub(crate) fn write(results: Results<'_>) {
    let Results {
        cli,
        server,
        pinning,
        rounds,
        cycles,
        millis,
        peer_list,
        p1_sync,
        p1_async,
        p1_ours,
        rtt,
        p1_peers,
        p1_lat,
        p1_tls,
        p4,
        p5,
        runs,
        p2_waiters,
        p2_shape,
        p2_peers,
        p3,
        idle_rtt,
        raw_count,
        p3_peer_millis,
        p3_peers,
        p6_locks,
        p6_ttl,
        p6_window,
        p6_rows,
        p7,
        p8_failovers,
        p8_observing,
        p9,
    } = results;
    // The report: printed, and written as Markdown with --report.
    let mut report = String::new();
    macro_rules! outln {
        () => {
            report.push('\n')
        };
        ($($t:tt)*) => {{
            report.push_str(&format!($($t)*));
            report.push('\n');
        }};
    }
    macro_rules! out {
        ($($t:tt)*) => {
            report.push_str(&format!($($t)*))
        };
    }
    outln!(
        "distlock-bench — Redis {} — {pinning}",
        redis_version(server)
    );
    outln!();
    outln!(
        "P1 uncontended acquire+release, one client, {rounds} round(s) × {cycles} cycles, medians"
    );
    outln!("| client | cycles/s | vs async floor |");
    outln!("|---|---:|---:|");
    outln!(
        "| redis-rs sync SET NX PX + EVALSHA (floor) | {p1_sync:.0} | {:.2} |",
        p1_sync / p1_async
    );
    outln!("| redis-rs async SET NX PX + EVALSHA (floor) | {p1_async:.0} | 1.00 |");
    outln!(
        "| distlock try_acquire + release | {p1_ours:.0} | {:.2} |",
        p1_ours / p1_async
    );
    for (peer, fig) in peer_list.iter().zip(&p1_peers) {
        outln!(
            "| {} lock + unlock | {} | {} |",
            peer.name,
            fig.cell(0),
            fig.value()
                .map_or(String::new(), |r| format!("{:.2}", r / p1_async))
        );
    }
    if peer_list.is_empty() {
        outln!("| peers | n/a (not installed: run bench/run.sh) | |");
    }
    for (peer, fig) in peer_list.iter().zip(&p1_peers) {
        if let Some(r) = fig.value() {
            outln!();
            out!("distlock vs {}: {:.2}×", peer.name, p1_ours / r);
        }
    }
    outln!();
    outln!();
    if let Some(t) = &p1_tls {
        out!("{}", crate::p1::render_tls(t, rounds, cycles));
        outln!();
    }
    outln!("P1 one cycle's time (µs), {cycles} cycles of each, alternating");
    outln!("| client | p50 | p90 | p99 | p99.9 | max |");
    outln!("|---|---:|---:|---:|---:|---:|");
    for (name, h) in ["redis-rs async floor", "distlock"].iter().zip(&p1_lat) {
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
        outln!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            h.max() as f64 / 1000.0
        );
    }
    outln!();
    outln!(
        "P4 Redlock over {} masters, uncontended acquire+release, one client, {rounds} round(s) × {cycles} cycles, medians",
        p4.masters
    );
    outln!("| client | cycles/s | vs raw parallel floor | cycle µs | in parallel PING rounds |");
    outln!("|---|---:|---:|---:|---:|");
    let p4_row = |name: &str, per_sec: f64| {
        format!(
            "| {name} | {per_sec:.0} | {:.2} | {:.1} | {:.2} |",
            per_sec / p4.floor,
            1e6 / per_sec,
            1e6 / per_sec / p4.parallel_rtt_us.max(f64::MIN_POSITIVE)
        )
    };
    outln!(
        "{}",
        p4_row(
            "raw floor: SET NX PX, then the release script, on all masters at once",
            p4.floor,
        )
    );
    outln!(
        "{}",
        p4_row("distlock RedlockBackend try_acquire + release", p4.ours)
    );
    for (peer, fig) in peer_list.iter().zip(&p4.peers) {
        match fig.value() {
            Some(r) => outln!("{}", p4_row(&format!("{} lock + unlock", peer.name), r)),
            None => outln!("| {} | {} | | | |", peer.name, fig.cell(0)),
        }
    }
    if peer_list.is_empty() {
        outln!("| peers | n/a (not installed: run bench/run.sh) | | | |");
    }
    for (peer, fig) in peer_list.iter().zip(&p4.peers) {
        if let Some(r) = fig.value() {
            outln!(
                "distlock vs {} over {} masters: {:.2}×",
                peer.name,
                p4.masters,
                p4.ours / r
            );
        }
    }
    outln!(
        "parallel PING round to all masters: {:.1} µs (median of 1000); a cycle is two rounds",
        p4.parallel_rtt_us
    );
    outln!();
    outln!("P5 other engines, uncontended acquire+release, one client, {rounds} round(s), medians");
    out!("{}", crate::p5::render(&p5));
    outln!();
    outln!(
        "PING round trip: {rtt:.1} µs (median of 1000 back to back); {idle_rtt:.1} µs (each after a 2 ms pause: median of the P3 rounds' medians of 150)"
    );
    outln!();
    let runtime = if cli.worker_threads <= 1 {
        "current-thread runtime".to_owned()
    } else {
        format!("multi-thread runtime, {} threads", cli.worker_threads)
    };
    outln!("P2/P3 one hot key, zero hold, {millis} ms per run, each process on a tokio {runtime}");
    outln!(
        "| mode | waiters | processes | acq/s | vs P1 | fairness | cmds/acq (sent) | server calls/acq | hand-off p50 µs | p99 µs | cross-process p50 | in RTTs |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs.iter().filter(|r| r.hold_us == 0) {
        outln!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.mode.name(),
            r.waiters,
            r.processes,
            r.per_sec,
            r.per_sec / p1_ours,
            r.fairness,
            r.cmds_per_acq,
            r.calls_per_acq,
            shown(r.handoffs, r.handoff_p50_us, 0),
            shown(r.handoffs, r.handoff_p99_us, 0),
            shown(r.cross_count, r.cross_p50_us, 0),
            shown(
                r.cross_count,
                r.cross_p50_us / rtt.max(f64::MIN_POSITIVE),
                1
            ),
        );
    }
    outln!();
    outln!(
        "P2 beside the peers: one hot key, {} processes × {} tasks, {millis} ms per run; each library waits its own way",
        p2_shape.0,
        p2_shape.1
    );
    outln!(
        "| client | hold | acq/s | vs distlock's P1 | fairness (min/max per process) | commands sent per acq | server calls per acq (INFO commandstats, script calls included) | errors |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs
        .iter()
        .filter(|r| r.mode == Mode::Events && r.waiters == p2_waiters)
    {
        outln!(
            "| distlock (events) | {} ms | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | 0 |",
            r.hold_us / 1000,
            r.per_sec,
            r.per_sec / p1_ours,
            r.fairness,
            r.cmds_per_acq,
            r.calls_per_acq
        );
    }
    for c in &p2_peers {
        match &c.result {
            Ok(r) => outln!(
                "| {} | {} ms | {:.0} | {:.2} | {:.2} | - | {:.2} | {} |",
                c.name,
                c.hold_us / 1000,
                r.per_sec,
                r.per_sec / p1_ours,
                r.fairness,
                r.calls_per_acq,
                r.errors
            ),
            Err(f) => outln!(
                "| {} | {} ms | {} | | | | | |",
                c.name,
                c.hold_us / 1000,
                f.cell(0)
            ),
        }
    }
    outln!();
    outln!(
        "P3 hand-off latency, unloaded: 2 processes, 1 task each; a holder keeps the lock 3 ms, then pauses 0.3 ms; {} interleaved round(s), medians over rounds",
        p3.len()
    );
    outln!(
        "| mode | hand-offs | release → other process acquired p50 µs | p99 µs | in idle RTTs | worst round | in back-to-back RTTs |"
    );
    outln!("|---|---:|---:|---:|---:|---:|---:|");
    let p3_rows: Vec<P3Row> = (0..2)
        .map(|m| {
            P3Row::of(&p3, p3[0].modes[m].mode.name(), |r| {
                let c = &r.modes[m];
                (c.cross_count, c.cross_p50_us, c.cross_p99_us)
            })
        })
        .chain(std::iter::once(P3Row::of(
            &p3,
            "raw redis-rs floor: the same PING + release script, blocking clients, 3 ms pauses",
            |r| (raw_count as u64, r.raw, 0.0),
        )))
        .collect();
    for row in &p3_rows {
        outln!(
            "| {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.1} |",
            row.name,
            row.count,
            row.p50_us,
            if row.p99_us > 0.0 {
                format!("{:.0}", row.p99_us)
            } else {
                String::new()
            },
            row.idle_rtts,
            row.worst_idle_rtts,
            row.p50_us / rtt.max(f64::MIN_POSITIVE),
        );
    }
    for (name, r) in &p3_peers {
        match r {
            Ok((count, p50, p99)) => outln!(
                "| {name} (its own waiting, one run of {} ms) | {count} | {p50:.1} | {p99:.0} | {:.1} | | {:.1} |",
                p3_peer_millis,
                p50 / idle_rtt.max(f64::MIN_POSITIVE),
                p50 / rtt.max(f64::MIN_POSITIVE)
            ),
            Err(f) => outln!("| {name} | {} | | | | | |", f.cell(0)),
        }
    }
    outln!(
        "per round, idle RTT / events p50 / raw floor p50 (µs): {}",
        p3.iter()
            .map(|r| format!(
                "{:.1} / {:.1} / {:.1}",
                r.idle_rtt, r.modes[0].cross_p50_us, r.raw
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    outln!(
        "distlock events vs the raw floor: {:.2}× its hand-off time (median of the rounds' ratios)",
        median(
            p3.iter()
                .map(|r| r.modes[0].cross_p50_us / r.raw.max(f64::MIN_POSITIVE))
                .collect()
        )
    );
    outln!();
    outln!(
        "P6 {p6_locks} held locks kept alive by automatic renewal, TTL {} (renewed every TTL/3), measured over {}",
        show(p6_ttl),
        show(p6_window)
    );
    outln!(
        "| engine | client | still held | renewal round trips per tick | server requests per tick | per lock renewed | client CPU % of a core | server CPU % |"
    );
    outln!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &p6_rows {
        match &r.result {
            Ok(f) => outln!(
                "| {} | {} | {} | {} | {:.0} | {} | {:.1} | {:.1} |",
                r.engine,
                r.client,
                f.held_after,
                f.trips_per_tick
                    .map_or("-".to_owned(), |t| format!("{t:.1}")),
                f.requests_per_tick,
                significant(f.requests_per_renewal),
                f.client_cpu_pct,
                f.server_cpu_pct
            ),
            Err(fig) => outln!(
                "| {} | {} | {} | | | | | |",
                r.engine,
                r.client,
                fig.cell(0)
            ),
        }
    }
    outln!(
        "server requests: Redis commands (INFO commandstats), etcd gRPC unary calls and stream messages (/metrics), ZooKeeper packets received (mntr), PostgreSQL keep-alive statements the client sent (its own statistics lag), MariaDB statements received (Questions)"
    );
    for note in p6_rows
        .iter()
        .filter_map(|r| r.result.as_ref().ok()?.note.as_deref())
    {
        outln!("{note}");
    }
    outln!();
    out!("{}", p7.render(pinning));
    outln!();
    // Fail-over times are TTLs and wake-ups: measured on the machine as it is.
    out!(
        "{}",
        crate::p8::render(&p8_failovers, &p8_observing, "not pinned")
    );
    outln!();
    out!("{}", p9.render(pinning));
    // The bars of the brief (§4), each with its figure.
    outln!();
    outln!("Bars");
    outln!("| bar | figure | met |");
    outln!("|---|---:|---|");
    let mut bar = |name: &str, figure: Option<f64>, ok: &dyn Fn(f64) -> bool| {
        let (fig, met) = match figure {
            Some(f) => (format!("{f:.3}"), if ok(f) { "yes" } else { "**no**" }),
            None => ("n/a".to_owned(), "not measured"),
        };
        outln!("| {name} | {fig} | {met} |");
    };
    let rslock_of = |figs: &[peers::Figure]| {
        peer_list
            .iter()
            .zip(figs)
            .find(|(p, _)| p.name.starts_with("rslock"))
            .and_then(|(_, f)| f.value())
    };
    bar(
        "P1 ≥ 0.95× the async floor",
        Some(p1_ours / p1_async),
        &|f| f >= 0.95,
    );
    bar(
        "P1 ≥ rslock (ratio)",
        rslock_of(&p1_peers).map(|r| p1_ours / r),
        &|f| f >= 1.0,
    );
    let p2_run = runs
        .iter()
        .find(|r| r.mode == Mode::Events && r.waiters == p2_waiters && r.hold_us == 0);
    bar(
        "P2 throughput ≥ 0.5× P1",
        p2_run.map(|r| r.per_sec / p1_ours),
        &|f| f >= 0.5,
    );
    bar("P2 fairness ≥ 0.5", p2_run.map(|r| r.fairness), &|f| {
        f >= 0.5
    });
    bar(
        "P2 commands per acquisition ≤ 4 (sent by the clients)",
        p2_run.map(|r| r.cmds_per_acq),
        &|f| f <= 4.0,
    );
    bar(
        "P3 hand-off p50 ≤ 3 round trips",
        p3_rows.first().map(|r| r.idle_rtts),
        &|f| f <= 3.0,
    );
    bar(
        "P4 ≥ 1.5× rslock (ratio)",
        rslock_of(&p4.peers).map(|r| p4.ours / r),
        &|f| f >= 1.5,
    );
    for r in &p5 {
        bar(
            &format!("P5 {} ≥ 0.9× its floor", r.engine),
            Some(r.ours / r.floor),
            &|f| f >= 0.9,
        );
    }
    bar(
        "P9 metrics and spans cost the uncontended cycle ≤ 3 %",
        Some(p9.slowdown() * 100.0),
        &|f| f <= 3.0,
    );
    for (name, fig, met) in crate::p8::bars(&p8_failovers) {
        outln!(
            "| {name} | {} | {} |",
            fig.map_or("n/a".to_owned(), |f| format!("{f:.1}")),
            if met { "yes" } else { "**no**" }
        );
    }
    for (name, fig, met) in p7.bars() {
        outln!(
            "| {name} | {} | {} |",
            fig.map_or("n/a".to_owned(), |f| format!("{f:.3}")),
            if met { "yes" } else { "**no**" }
        );
    }
    print!("{report}");
    if let Some(path) = &cli.report {
        std::fs::write(path, markdown_report(&report, pinning, cli)).expect("write the report");
    }
    if let Some(path) = &cli.json {
        let p1_latency: serde_json::Map<String, serde_json::Value> = ["floor", "distlock"]
            .iter()
            .zip(&p1_lat)
            .map(|(name, h)| {
                let pts: Vec<serde_json::Value> =
                    [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0]
                        .iter()
                        .map(|p| {
                            serde_json::json!([p, h.value_at_quantile(p / 100.0) as f64 / 1000.0])
                        })
                        .collect();
                ((*name).to_owned(), serde_json::Value::Array(pts))
            })
            .collect();
        let json = serde_json::json!({
            "pinning": pinning,
            "worker_threads": cli.worker_threads,
            "redis": redis_version(server),
            "p1": { "rounds": rounds, "cycles": cycles, "sync_floor": p1_sync,
                    "async_floor": p1_async, "distlock": p1_ours,
                    "peers": peer_list.iter().zip(&p1_peers)
                        .map(|(p, f)| (p.name.clone(), f.json()))
                        .collect::<serde_json::Map<_, _>>() },
            "p1_tls": p1_tls.as_ref().map(|t| serde_json::json!({
                "tcp_floor": t.tcp_floor, "tcp_distlock": t.tcp_ours,
                "tls_floor": t.tls_floor, "tls_distlock": t.tls_ours,
            })),
            "p5": p5.iter().map(|r| serde_json::json!({
                "engine": r.engine, "floor": r.floor_name, "floor_per_sec": r.floor,
                "distlock_per_sec": r.ours,
            })).collect::<Vec<_>>(),
            "p4": { "masters": p4.masters, "raw_parallel_floor": p4.floor, "distlock": p4.ours,
                    "parallel_ping_us": p4.parallel_rtt_us,
                    "peers": peer_list.iter().zip(&p4.peers)
                        .map(|(p, f)| (p.name.clone(), f.json()))
                        .collect::<serde_json::Map<_, _>>() },
            "p2_peers": p2_peers.iter().map(|c| match &c.result {
                Ok(r) => serde_json::json!({
                    "client": c.name, "hold_us": c.hold_us, "per_sec": r.per_sec,
                    "fairness": r.fairness, "server_calls_per_acq": r.calls_per_acq,
                    "errors": r.errors,
                }),
                Err(f) => serde_json::json!({ "client": c.name, "hold_us": c.hold_us, "result": f.json() }),
            }).collect::<Vec<_>>(),
            "p1_latency_us": p1_latency,
            "p6": {
                "locks": p6_locks, "ttl_ms": p6_ttl.as_millis() as u64,
                "window_ms": p6_window.as_millis() as u64,
                "rows": p6_rows.iter().map(|r| match &r.result {
                    Ok(f) => serde_json::json!({
                        "engine": r.engine, "client": r.client, "held_after": f.held_after,
                        "round_trips_per_tick": f.trips_per_tick,
                        "requests_per_tick": f.requests_per_tick,
                        "requests_per_renewal": f.requests_per_renewal,
                        "client_cpu_pct": f.client_cpu_pct, "server_cpu_pct": f.server_cpu_pct,
                        "note": f.note,
                    }),
                    Err(fig) => serde_json::json!({
                        "engine": r.engine, "client": r.client, "result": fig.json()
                    }),
                }).collect::<Vec<_>>(),
            },
            "rtt_us": rtt,
            "idle_rtt_us": idle_rtt,
            "contention": runs.iter().map(|r| serde_json::json!({
                "mode": r.mode.name(), "waiters": r.waiters, "processes": r.processes,
                "hold_us": r.hold_us,
                "per_sec": r.per_sec, "fairness": r.fairness, "cmds_per_acq": r.cmds_per_acq,
                "server_calls_per_acq": r.calls_per_acq,
                "handoff_p50_us": r.handoff_p50_us, "handoff_p99_us": r.handoff_p99_us,
                "cross_process_p50_us": r.cross_p50_us,
            })).collect::<Vec<_>>(),
            "p3_unloaded": p3_rows.iter().map(|r| serde_json::json!({
                "mode": r.name, "hold_us": 3000, "gap_us": 300, "handoffs": r.count,
                "cross_process_p50_us": r.p50_us, "cross_process_p99_us": r.p99_us,
                "idle_rtts": r.idle_rtts, "worst_round_idle_rtts": r.worst_idle_rtts,
            })).collect::<Vec<_>>(),
            "p3_peers": p3_peers.iter().map(|(name, r)| match r {
                Ok((count, p50, p99)) => serde_json::json!({
                    "client": name, "handoffs": count, "cross_process_p50_us": p50,
                    "cross_process_p99_us": p99,
                }),
                Err(f) => serde_json::json!({ "client": name, "result": f.json() }),
            }).collect::<Vec<_>>(),
            "p3_idle_rtt_us_per_round": p3.iter().map(|r| r.idle_rtt).collect::<Vec<_>>(),
            "p7": p7.json(),
            "p8": crate::p8::json(&p8_failovers, &p8_observing),
            "p9": p9.json(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json).expect("json"))
            .expect("write the JSON");
    }
}

/// The report as a Markdown page: where and how it was measured, then the tables (each with
/// the blank line Markdown wants before it).
fn markdown_report(report: &str, pinning: &str, cli: &Cli) -> String {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Every CPU of the machine (our own affinity is CPU 0 alone when pinned).
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let mut page = format!(
        "# Benchmarks\n\n\
         Written by `bench/run.sh` (distlock-bench{} with the peers) on {}.\n\n\
         - Machine: {cores} vCPU ({cpu}), Linux {}.\n\
         - CPU pinning: {pinning}.\n\
         - Rounds are interleaved (floor, distlock and every peer in each round); the tables show \
         medians over rounds. Raw figures: the JSON written with `--json`.\n\
         - Peers: installed by `bench/run.sh` outside the repository \
         ([bench/peers/README.md](../bench/peers/README.md)); a cell that says n/a names the \
         feature the library lacks.\n\n",
        if cli.quick { " --quick" } else { "" },
        run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        run("uname", &["-r"]),
    );
    page.push_str(
        "![Throughput against waiters](img/throughput-vs-waiters.png)\n\n\
         ![One uncontended cycle's time](img/p1-latency.png)\n\n",
    );
    let mut prev_table = false;
    for line in report.lines() {
        let table = line.starts_with('|');
        if table && !prev_table {
            page.push('\n');
        }
        if !table && prev_table && !line.is_empty() {
            page.push('\n');
        }
        page.push_str(line);
        page.push('\n');
        prev_table = table;
    }
    // P10's figures (its own command, not part of this run), kept in bench/p10.md.
    if let Ok(p10) = std::fs::read_to_string("bench/p10.md") {
        page.push('\n');
        page.push_str(&p10);
    }
    // The Python package's figures (bench/python.py, its own command), kept in bench/python.md.
    if let Ok(python) = std::fs::read_to_string("bench/python.md") {
        page.push('\n');
        page.push_str(&python);
    }
    // The hand-written notes on the misses, when run from the repository's root.
    if let Ok(notes) = std::fs::read_to_string("bench/notes.md") {
        page.push('\n');
        page.push_str(&notes.replacen("# Notes", "## Notes", 1));
    }
    page
}

/// Three significant digits, for ratios that may be far below one.
fn significant(x: f64) -> String {
    if x == 0.0 || x >= 100.0 {
        return format!("{x:.0}");
    }
    let decimals = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}
