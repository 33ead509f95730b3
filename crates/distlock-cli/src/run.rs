//! `distlock run`: run a command while holding a lock.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use distlock::{LockClient, LockOptions, LostReason, Released, Wait};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::held::{Held, shown};
use crate::{exit, term};

/// How long a wait goes on before the spinner shows (so a lock taken at once draws nothing).
const SPINNER_AFTER: Duration = Duration::from_millis(250);

/// What to do with the command when the lock is lost under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM, then SIGKILL after --kill-grace.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Let it run to its end (with a warning).
    Ignore,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    engine: crate::Engine,
    #[command(flatten)]
    pub(crate) metrics: crate::MetricsArgs,
    /// Lease length; the watchdog renews it every TTL/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// Wait at most this long for a busy lock (default: wait as long as it takes).
    #[arg(long, value_parser = crate::parse_duration, value_name = "D", conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is busy (exit 75).
    #[arg(long)]
    no_wait: bool,
    /// Run as a reader of the read-write lock KEY: readers share it, a plain `run` (a writer)
    /// excludes them. DISTLOCK_FENCE is then the last writer's place (see the library guide).
    /// One KEY only.
    #[arg(long, conflicts_with = "permits")]
    shared: bool,
    /// Run under one of N permits of the semaphore KEY: at most N commands at once. Every run
    /// on KEY must give the same N (exit 78 otherwise, while KEY has holders). One KEY only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(distlock::MAX_PERMITS)))]
    permits: Option<u32>,
    /// Keep the lock after CMD ends until D has passed since it was taken (this host's
    /// monotonic clock): a job that cron starts on every host then runs once a period, however
    /// quick it is and however far apart (less than D) the hosts' clocks are. Where leases
    /// outlive their holder (Redis, etcd, memcached, the file engine's exclusive locks) the
    /// lease is left to run out then and distlock exits at once; elsewhere (ZooKeeper,
    /// PostgreSQL, MySQL) distlock keeps the lock until then, and a signal ends that wait and
    /// releases.
    #[arg(long, value_parser = crate::parse_duration, value_name = "D")]
    hold_at_least: Option<Duration>,
    /// Renew the lease for at most D since it was taken: the lock then runs out, and --on-lost
    /// applies to a command still running (a hung job cannot keep the lock forever).
    #[arg(long, value_parser = crate::parse_duration, value_name = "D")]
    hold_at_most: Option<Duration>,
    /// The holder label that `distlock status` shows (default: host/pid).
    #[arg(long)]
    label: Option<String>,
    /// What happens to the command if the lock is lost while it runs. Whatever it is, distlock
    /// then exits with --lost-exit-code once the command has ended.
    #[arg(long, value_enum, default_value_t = OnLost::Term, value_name = "ACTION")]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL when the lock is lost (--on-lost term).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration, value_name = "D")]
    kill_grace: Duration,
    /// Exit status when the lock could not be had (busy, or the wait timed out).
    #[arg(long, default_value_t = exit::CONFLICT, value_name = "N")]
    conflict_exit_code: u8,
    /// Exit status when the lock was lost while the command ran.
    #[arg(long, default_value_t = exit::LOST, value_name = "N")]
    lost_exit_code: u8,
    /// The lock name; several names are taken together, all or none, in one sorted order
    /// (exclusive locks only): DISTLOCK_KEYS has them one a line, DISTLOCK_FENCES their fences.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub(crate) async fn run(args: RunArgs) -> u8 {
    let wait = match (args.no_wait, args.wait) {
        (true, _) => Wait::No,
        (false, Some(d)) if d.is_zero() => Wait::No,
        (false, Some(d)) => Wait::Timeout(d),
        (false, None) => Wait::Forever,
    };
    if let (Some(least), Some(most)) = (args.hold_at_least, args.hold_at_most)
        && least > most
    {
        eprintln!(
            "distlock: --hold-at-least {least:?} is longer than --hold-at-most {most:?}: the lock \
             cannot be kept that long"
        );
        return exit::USAGE;
    }
    if args.keys.len() > 1 && (args.shared || args.permits.is_some()) {
        eprintln!(
            "distlock: several KEYs are taken as exclusive locks only: --shared and --permits \
             take one KEY"
        );
        return exit::USAGE;
    }
    if let Err(e) = options(&args, wait) {
        return exit::report("invalid options", &e);
    }
    let what = shown(&args.keys);
    let url = match args.engine.url() {
        Ok(u) => u,
        Err(e) => return exit::report_open(&e),
    };
    // With a wait budget, an engine that cannot be reached yet (a fail-over under way) is
    // tried again within it, and the lock is waited for with what is left. The spinner (on a
    // terminal) covers both.
    let started = tokio::time::Instant::now();
    let mut spinner = term::WaitSpinner::start(SPINNER_AFTER, &args.keys[0]);
    let opened = match wait {
        Wait::Timeout(d) => distlock::tools::open_backend_within(&url, d).await,
        _ => distlock::open_backend(&url).await,
    };
    let backend = match opened {
        Ok(b) => b,
        Err(e) => {
            if let Some(s) = spinner {
                s.finish();
            }
            return exit::report_open(&e);
        }
    };
    let wait = match wait {
        Wait::Timeout(d) => Wait::Timeout(
            d.saturating_sub(started.elapsed())
                .max(Duration::from_millis(1)),
        ),
        w => w,
    };
    let options = match options(&args, wait) {
        Ok(o) => o,
        Err(e) => return exit::report("invalid options", &e),
    };
    let mut builder = LockClient::builder(backend).options(options);
    if let Some(label) = args.label {
        builder = builder.owner(label);
    }
    let client = builder.build();

    let kind = match (args.shared, args.permits) {
        (true, _) => distlock::LeaseKind::Shared,
        (false, Some(permits)) => distlock::LeaseKind::Permit { permits },
        (false, None) => distlock::LeaseKind::Exclusive,
    };
    if let Some(s) = spinner.as_mut() {
        s.watch(&client, &args.keys[0]);
    }
    let acquired = Held::take(&client, &args.keys, kind).await;
    if let Some(s) = spinner {
        s.finish();
    }
    let taken = tokio::time::Instant::now();
    let guard = match acquired {
        Ok(g) => g,
        Err(e) => {
            let code = exit::report(&format!("cannot take lock {what}"), &e);
            if code != exit::CONFLICT {
                return code;
            }
            // Who holds it, if the engine says so at once (the wait is over: a silent engine
            // must not keep us).
            let status = tokio::time::timeout(Duration::from_secs(1), client.status(&args.keys[0]));
            if let Ok(Ok(distlock::LockStatus {
                owner: Some(owner), ..
            })) = status.await
            {
                eprintln!("distlock: held by {owner}");
            }
            return args.conflict_exit_code;
        }
    };

    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut cmd = Command::new(program);
    cmd.args(rest).env("DISTLOCK_KIND", kind.name());
    guard.set_env(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return exit::CANNOT_EXEC;
        }
    };

    let handle = guard.handle();
    let outcome = supervise(&mut child, &handle, args.on_lost, args.kill_grace, &what).await;
    let released = match (args.hold_at_least, &outcome) {
        // The lease is left on the engine to run out at taken + D: nothing to wait for here.
        (Some(least), ChildEnd::Exited(_)) if guard.lingers() => guard.release_after(least).await,
        (Some(least), ChildEnd::Exited(status)) => {
            if !hold_until(&handle, taken + least).await {
                // The job ran under the lock; only the rest of the period is unguarded.
                eprintln!(
                    "distlock: warning: lock {what} lost after the command ended, before \
                     --hold-at-least ran out: another host may run the job again this period"
                );
                let status = *status;
                let _ = guard.release().await;
                return status_code(status);
            }
            guard.release().await
        }
        _ => guard.release().await,
    };
    match outcome {
        ChildEnd::Exited(status) => match released {
            Ok(Released::Held) => status_code(status),
            Ok(Released::Lost(reason)) => {
                eprintln!(
                    "distlock: lock {what} was lost before the command finished ({reason}); \
                     its work may not have been exclusive"
                );
                args.lost_exit_code
            }
            Err(e) => {
                // The command finished while we held the lock; only the release failed, and the
                // TTL will free the lock.
                eprintln!("distlock: warning: release failed ({e}); the lock frees at its TTL");
                status_code(status)
            }
        },
        ChildEnd::Lost(reason) => {
            eprintln!("distlock: lock {what} lost while the command ran: {reason}");
            args.lost_exit_code
        }
        ChildEnd::WaitFailed(e) => {
            eprintln!("distlock: lost track of the command: {e}");
            exit::SOFTWARE
        }
    }
}

/// The lock options of a run.
fn options(args: &RunArgs, wait: Wait) -> Result<LockOptions, distlock::LockError> {
    let mut b = LockOptions::builder().ttl(args.ttl).wait(wait);
    if let Some(most) = args.hold_at_most {
        b = b.max_hold(most);
    }
    b.build()
}

/// Keeps the lock until `until` (the watchdog renews it meanwhile), or until a signal comes.
/// `false` when the lock was lost first.
async fn hold_until(guard: &distlock::LeaseHandle, until: tokio::time::Instant) -> bool {
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    tokio::select! {
        () = tokio::time::sleep_until(until) => true,
        _ = guard.lost() => false,
        Some(()) = recv(&mut sigint) => true,
        Some(()) = recv(&mut sigterm) => true,
    }
}

enum ChildEnd {
    Exited(ExitStatus),
    Lost(LostReason),
    WaitFailed(std::io::Error),
}

/// Waits for the child, forwarding SIGINT/SIGTERM/SIGHUP to it; when the lock is lost, stops
/// it (or lets it finish) as `on_lost` says.
async fn supervise(
    child: &mut Child,
    guard: &distlock::LeaseHandle,
    on_lost: OnLost,
    grace: Duration,
    what: &str,
) -> ChildEnd {
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw);
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    let mut lost = None;
    loop {
        tokio::select! {
            status = child.wait() => {
                return match (status, lost) {
                    (_, Some(reason)) => ChildEnd::Lost(reason),
                    (Ok(s), None) => ChildEnd::Exited(s),
                    (Err(e), None) => ChildEnd::WaitFailed(e),
                };
            }
            reason = guard.lost(), if lost.is_none() => {
                match on_lost {
                    OnLost::Term => {
                        stop(child, pid, grace).await;
                        return ChildEnd::Lost(reason);
                    }
                    OnLost::Kill => {
                        let _ = child.kill().await;
                        return ChildEnd::Lost(reason);
                    }
                    OnLost::Ignore => {
                        eprintln!(
                            "distlock: warning: lock {what} lost ({reason}); the command goes on \
                             (--on-lost ignore), without the lock"
                        );
                        lost = Some(reason);
                    }
                }
            }
            Some(()) = recv(&mut sigint) => forward(pid, Signal::SIGINT),
            Some(()) = recv(&mut sigterm) => forward(pid, Signal::SIGTERM),
            Some(()) = recv(&mut sighup) => forward(pid, Signal::SIGHUP),
        }
    }
}

pub(crate) async fn recv(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

pub(crate) fn forward(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, sig);
    }
}

/// SIGTERM, then SIGKILL after the grace period.
async fn stop(child: &mut Child, pid: Option<Pid>, grace: Duration) {
    forward(pid, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// The command's exit status as ours: its code, or 128 + the signal that killed it.
pub(crate) fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}
