//! `distlock-faults`: distlock's fault-injection harness, in Jepsen's method.
//!
//! ```text
//! distlock-faults run [--quick] [--scenario NAME]... [--seed N] [--duration 20s] [--out DIR]
//! distlock-faults controls [--bug NAME]... [--attempts 3] [--shard K/N]   (needs --cfg distlock_seeded_bugs)
//! distlock-faults list
//! ```
//!
//! See `docs/reliability.md` for what it does and what it found.

mod bite;
mod bitten;
mod check;
mod engine;
mod faults;
mod linear;
mod many;
mod mono;
mod netns;
mod partitions;
mod report;
mod resource;
mod run;
mod scenario;
mod sql;
mod state;
mod worker;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use crate::check::{Figures, quantile};
use crate::scenario::Scenario;

#[derive(Parser)]
#[command(
    name = "distlock-faults",
    version,
    about = "Fault-injection harness of distlock"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What `run` and `controls` share.
#[derive(Args)]
struct Common {
    /// Seed of the operation mix and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long each scenario runs.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// Where histories and the report go (default: a new temporary folder).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs scenarios and prints one line of figures for each; exits 1 on any violation.
    Run {
        /// The short set that CI runs (holder pause, release after expiry, kill -9 of a holder,
        /// lost replies).
        #[arg(long)]
        quick: bool,
        /// Scenarios to run (default: all; see `list`).
        #[arg(long = "scenario")]
        scenarios: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Runs each seeded bug in the scenario that must catch it; exits 1 unless all are caught.
    Controls {
        /// Bugs to run (default: all).
        #[arg(long = "bug")]
        bugs: Vec<String>,
        /// A control that no violation showed is run again with the next seed, up to this
        /// many runs in all (faults land at random moments: one run can miss a window).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        attempts: u64,
        /// `K/N`: only every N-th control of the list, from the K-th on (K from 1): N
        /// processes with shards 1/N to N/N run every control once between them, side by side.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<Shard>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the scenarios and the negative controls.
    List,
    /// A worker process (started by `run`; it talks JSON lines on stdin and stdout).
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        url: String,
        #[arg(long)]
        id: usize,
        /// Its incarnation: 0, and one more for each replacement of a killed worker.
        #[arg(long, default_value_t = 0)]
        inc: u64,
        #[arg(long)]
        ttl_ms: u64,
    },
}

/// A share of the negative controls: the `k`-th of `n` (from 0).
#[derive(Clone, Copy, Debug)]
struct Shard {
    k: usize,
    n: usize,
}

impl Shard {
    fn takes(self, index: usize) -> bool {
        index % self.n == self.k
    }
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let bad = || format!("{s:?} is not a shard K/N with 1 <= K <= N");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n): (usize, usize) = (
        k.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if k == 0 || k > n {
        return Err(bad());
    }
    Ok(Shard { k: k - 1, n })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    distlock::tools::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock-faults: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(async {
        match cli.cmd {
            Cmd::Worker {
                url,
                id,
                inc,
                ttl_ms,
            } => worker::run(worker::WorkerArgs {
                url,
                id,
                inc,
                ttl: Duration::from_millis(ttl_ms),
            })
            .await
            .map(|()| true),
            Cmd::List => {
                for s in scenario::all() {
                    println!("{:<28} {}", s.name, s.about);
                }
                println!();
                for c in scenario::CONTROLS {
                    println!(
                        "control {:<22} in {:<28} caught by {}",
                        c.bug, c.scenario, c.expect
                    );
                }
                Ok(true)
            }
            Cmd::Run {
                quick,
                scenarios,
                common: c,
            } => run_scenarios(quick, scenarios, c.seed, c.duration, c.out).await,
            Cmd::Controls {
                bugs,
                attempts,
                shard,
                common: c,
            } => run_controls(bugs, attempts, shard, c.seed, c.duration, c.out).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("distlock-faults: {e}");
            ExitCode::from(2)
        }
    }
}

fn out_dir(out: Option<PathBuf>) -> Result<PathBuf, String> {
    let dir = match out {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("distlock-faults-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep(),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// The scenario's line: the figures `shared/TESTING.md` asks for.
fn summary(s: &Scenario, f: &Figures, bites: &bite::Tally) -> String {
    let count = |k: &str| f.faults.get(k).copied().unwrap_or(0);
    let pauses = count("pause-holder") + count("pause-server");
    let partitions = count("partition") + count("delay-replies") + count("lose-replies");
    let restarts = count("restart-volatile")
        + count("restart-persistent")
        + count("kill-holder")
        + count("lagging-failover");
    let jumps = count("server-clock-jump") + count("client-clock-jump");
    // An eviction takes the lock away on the server, as an operator's forced release does.
    let steals = count("steal") + count("evict");
    let total: u64 = f.faults.values().sum();
    let fenced = match &f.fenced {
        Some(_) => format!("{} fenced violations", f.ck1),
        None => "fenced n/a (no fencing tokens)".to_owned(),
    };
    let lost = match &f.fenced {
        Some(_) => format!("{} lost acknowledged updates", f.ck2),
        None => "lost updates n/a".to_owned(),
    };
    let detect = match (quantile(&f.ck8_ms, 0.5), quantile(&f.ck8_ms, 0.99)) {
        (Some(p50), Some(p99)) => format!("loss detection p50 {p50:.0} ms / p99 {p99:.0} ms"),
        _ => "loss detection not exercised".to_owned(),
    };
    let sql = match &f.sql {
        Some(q) => format!(
            "; SQL form: fenced read and write lost {} of {}, write-only fencing lost {} of {}",
            q.rw_lost, q.rw_accepted, q.w_lost, q.w_accepted
        ),
        None => String::new(),
    };
    let handovers = match &f.handovers {
        Some(h) => format!("; {}", h.summary()),
        None => String::new(),
    };
    let mut caveats = String::new();
    if f.ck5_caveat + f.ck1_caveat + f.ck6_caveat > 0 {
        let foreign = if f.ck6_caveat > 0 {
            format!(", {} foreign renew/release", f.ck6_caveat)
        } else {
            String::new()
        };
        caveats = format!(
            "; caveats (server-side faults): {} early acquisitions{foreign}, {} fenced writes out of order",
            f.ck5_caveat, f.ck1_caveat
        );
    }
    format!(
        "{}: {} acquisitions ({} acquires gave up) under {total} faults ({pauses} pauses, {partitions} link faults, \
         {restarts} kills/restarts, {jumps} clock jumps, {steals} forced releases): {fenced}, {lost}, {} token \
         regressions, {} early acquisitions, {} foreign renew/release, {} checks past their deadline, \
         {} liveness misses (max {:.0} ms to free); {}; {detect}{sql}{handovers}{caveats}",
        s.name,
        f.acquisitions,
        f.acquire_failed,
        f.ck3,
        f.ck5,
        f.ck6,
        f.ck9,
        f.ck7,
        f.ck7_max_ms,
        // The bites and the unfenced control's loss, or why no fault here can break a lease.
        bite::clause(s, bites, f.unfenced.lost_updates(), f.unfenced.accepted),
    )
}

/// The linearizability check's clause, after the scenario's line.
fn with_linear(line: String, f: &Figures) -> String {
    match &f.linear {
        Some(v) => format!("{line}; {}", v.summary()),
        None => line,
    }
}

/// Writes the run's page beside its history (`<history>.html`); returns the index's entry. A
/// page that cannot be written is reported, and the run goes on.
fn page(
    o: &run::RunReport,
    s: &Scenario,
    seed: u64,
    bug: Option<&str>,
    line: &str,
) -> Option<(String, bool, String, String)> {
    let path = o.history.with_extension("html");
    let p = report::Page {
        scenario: s.name,
        about: s.about,
        seed,
        bug,
        line,
    };
    let written = report::load(&o.history)
        .and_then(|events| report::write_page(&path, &p, &events, &o.figures));
    if let Err(e) = written {
        eprintln!("distlock-faults: the run's page: {e}");
        return None;
    }
    let file = path.file_name()?.to_string_lossy().into_owned();
    let passed = o.figures.violations() == 0;
    Some((s.name.to_owned(), passed, line.to_owned(), file))
}

/// `report.html`: the one scenario's page, or an index of the scenarios' pages.
fn write_pages(dir: &Path, pages: &[(String, bool, String, String)]) {
    let path = dir.join("report.html");
    let written = match pages {
        [one] => std::fs::copy(dir.join(&one.3), &path).map(|_| ()),
        _ => std::fs::write(&path, report::index(pages)),
    };
    match written {
        Ok(()) => println!("page: {}", path.display()),
        Err(e) => eprintln!("distlock-faults: {}: {e}", path.display()),
    }
}

fn write_report(dir: &Path, name: &str, v: &Value) -> Result<(), String> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(v).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("report: {}", path.display());
    Ok(())
}

async fn run_scenarios(
    quick: bool,
    names: Vec<String>,
    seed: u64,
    duration: Duration,
    out: Option<PathBuf>,
) -> Result<bool, String> {
    let list: Vec<Scenario> = if !names.is_empty() {
        names
            .iter()
            .map(|n| scenario::by_name(n).ok_or_else(|| format!("no scenario {n:?} (see `list`)")))
            .collect::<Result<_, _>>()?
    } else if quick {
        scenario::QUICK
            .iter()
            .filter_map(|n| scenario::by_name(n))
            .collect()
    } else {
        scenario::all()
    };
    let dir = out_dir(out)?;
    println!(
        "distlock-faults: {} scenarios, seed {seed}, {} s each; histories in {}",
        list.len(),
        duration.as_secs(),
        dir.display()
    );
    let mut ok = true;
    let mut report = Vec::new();
    let mut pages = Vec::new();
    for s in &list {
        let o = run::run(s, seed, duration, &dir, None).await?;
        let line = summary(s, &o.figures, &o.bites);
        let line = with_linear(line, &o.figures);
        println!("{line}");
        for e in &o.figures.examples {
            println!("    {e}");
        }
        if o.figures.violations() > 0 {
            ok = false;
        }
        // A full run whose faults can break a lease and did not (no bite landed, or the
        // unfenced control lost nothing) proves little: it fails, as a fault that could not be
        // injected does. A shorter run is only warned.
        let complaint = bite::complaint(s, &o.bites, o.figures.unfenced.lost_updates());
        if let Some(c) = &complaint {
            if bite::held_to_it(duration, s.ttl) {
                println!("    FAULTS DID NOT BITE: {c}");
                ok = false;
            } else {
                println!("    warning (a run under 30 s and 10 TTLs is not held to it): {c}");
            }
        }
        let faults_bite = match bite::plan(s) {
            bite::Plan::Bite(_) => json!(o.figures.unfenced.lost_updates() > 0),
            bite::Plan::Cannot(_) => Value::Null,
        };
        report.push(json!({"scenario": s.name, "about": s.about, "seed": seed,
            "duration_s": duration.as_secs(), "line": line, "figures": o.figures.to_json(),
            "unfenced_lost_updates": faults_bite, "leases": bite::to_json(s, &o.bites),
            "faults_did_not_bite": complaint,
            "history": o.history.display().to_string()}));
        pages.extend(page(&o, s, seed, None, &line));
    }
    write_report(&dir, "report.json", &Value::Array(report))?;
    write_pages(&dir, &pages);
    Ok(ok)
}

async fn run_controls(
    bugs: Vec<String>,
    attempts: u64,
    shard: Option<Shard>,
    seed: u64,
    duration: Duration,
    out: Option<PathBuf>,
) -> Result<bool, String> {
    let in_library = |bug: &str| {
        distlock_core::seeded::SeededBug::from_name(bug).is_some_and(|b| b.in_library())
    };
    let wanted = |c: &scenario::Control| bugs.is_empty() || bugs.iter().any(|b| b == c.bug);
    let controls: Vec<_> = scenario::CONTROLS
        .iter()
        .enumerate()
        .filter(|(i, c)| wanted(c) && shard.is_none_or(|s| s.takes(*i)))
        .map(|(_, c)| *c)
        .collect();
    let needs_cfg = controls.iter().any(|c| in_library(c.bug));
    if needs_cfg && !distlock_core::seeded::available() {
        return Err(
            "this build has no seeded bugs: build the workspace's crates with \
             --cfg distlock_seeded_bugs (bash .ci/seeded shows how)"
                .to_owned(),
        );
    }
    if controls.is_empty() {
        return Err(match shard {
            Some(s) => format!(
                "no control named {bugs:?} in shard {}/{} (see `list`)",
                s.k + 1,
                s.n
            ),
            None => format!("no control named {bugs:?} (see `list`)"),
        });
    }
    let dir = out_dir(out)?;
    let mut caught = 0;
    let mut report = Vec::new();
    for c in &controls {
        let s = scenario::by_name(c.scenario)
            .ok_or_else(|| format!("control {}: no scenario {}", c.bug, c.scenario))?;
        let mut runs = 0;
        let (o, hit) = loop {
            let this_seed = seed.wrapping_add(runs);
            runs += 1;
            let d = duration.max(Duration::from_secs(c.min_secs));
            let o = run::run(&s, this_seed, d, &dir, Some(c.bug)).await?;
            let hit = o.figures.violations() > 0;
            if hit || !c.harness_catches || runs >= attempts {
                break (o, hit);
            }
            println!(
                "control {:<22} no violation with seed {this_seed} ({} acquisitions); again",
                c.bug, o.figures.acquisitions
            );
        };
        let f = &o.figures;
        if hit || !c.harness_catches {
            caught += 1;
        }
        let first = f.examples.first().cloned().unwrap_or_default();
        let caught_or_not = if hit { "caught" } else { "not caught" };
        let verdict = format!("control {} in {}: {caught_or_not}", c.bug, c.scenario);
        let _ = page(&o, &s, seed.wrapping_add(runs - 1), Some(c.bug), &verdict);
        println!(
            "control {:<22} {}: {}",
            c.bug,
            match (hit, c.harness_catches) {
                (true, _) if runs == 1 => "caught".to_owned(),
                (true, _) => format!("caught (run {runs})"),
                (false, true) => format!("NOT CAUGHT in {runs} runs"),
                (false, false) => "not caught (known gap, see list)".to_owned(),
            },
            if hit {
                first
            } else {
                format!("no violation in {} acquisitions", f.acquisitions)
            }
        );
        report.push(
            json!({"bug": c.bug, "scenario": c.scenario, "expected": c.expect,
            "caught": hit, "runs": runs, "figures": f.to_json(),
            "history": o.history.display().to_string()}),
        );
    }
    let known_gaps = controls.iter().filter(|c| !c.harness_catches).count();
    println!(
        "caught {}/{} seeded bugs{}",
        report.iter().filter(|r| r["caught"] == true).count(),
        controls.len(),
        if known_gaps > 0 {
            format!(" ({known_gaps} known gap, listed by `list`)")
        } else {
            String::new()
        }
    );
    write_report(&dir, "controls.json", &Value::Array(report))?;
    Ok(caught == controls.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_controls_between_them_once_each() {
        for n in 1..=4 {
            let shards: Vec<Shard> = (1..=n)
                .map(|k| parse_shard(&format!("{k}/{n}")).unwrap())
                .collect();
            for i in 0..scenario::CONTROLS.len() {
                assert_eq!(
                    shards.iter().filter(|s| s.takes(i)).count(),
                    1,
                    "{i} of {n}"
                );
            }
        }
        for bad in ["0/2", "3/2", "1", "a/2", "1/0", ""] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }
}
