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

use crate::exit;

/// Time the command gets between SIGTERM and SIGKILL after the lock is lost.
const KILL_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Lease length; the watchdog renews it every TTL/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// Wait at most this long for a busy lock (default: wait as long as it takes).
    #[arg(long, value_parser = crate::parse_duration, value_name = "D", conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is busy (exit 75).
    #[arg(long)]
    no_wait: bool,
    /// The holder label that `distlock status` shows (default: host/pid).
    #[arg(long)]
    label: Option<String>,
    /// The lock name.
    key: String,
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
    let options = match LockOptions::builder().ttl(args.ttl).wait(wait).build() {
        Ok(o) => o,
        Err(e) => return exit::report("invalid options", &e),
    };
    let backend = match distlock::open_backend(args.engine.url()).await {
        Ok(b) => b,
        Err(e) => return exit::report("cannot open the lock engine", &e),
    };
    let mut builder = LockClient::builder(backend).options(options);
    if let Some(label) = args.label {
        builder = builder.owner(label);
    }
    let client = builder.build();

    let guard = match client.acquire(&args.key).await {
        Ok(g) => g,
        Err(e) => {
            let code = exit::report(&format!("cannot take lock {:?}", args.key), &e);
            if code == exit::CONFLICT
                && let Ok(distlock::LockStatus {
                    owner: Some(owner), ..
                }) = client.status(&args.key).await
            {
                eprintln!("distlock: held by {owner}");
            }
            return code;
        }
    };

    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env("DISTLOCK_KEY", &args.key)
        .env_remove("DISTLOCK_FENCE");
    if let Some(fence) = guard.fence() {
        cmd.env("DISTLOCK_FENCE", fence.to_string());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return exit::CANNOT_EXEC;
        }
    };

    let outcome = supervise(&mut child, &guard).await;
    let released = guard.release().await;
    match outcome {
        Outcome::Exited(status) => match released {
            Ok(Released::Held) => status_code(status),
            Ok(Released::Lost(reason)) => {
                eprintln!(
                    "distlock: lock {:?} was lost before the command finished ({reason}); \
                     its work may not have been exclusive",
                    args.key
                );
                exit::LOST
            }
            Err(e) => {
                // The command finished while we held the lock; only the release failed, and the
                // TTL will free the lock.
                eprintln!("distlock: warning: release failed ({e}); the lock frees at its TTL");
                status_code(status)
            }
        },
        Outcome::Lost(reason) => {
            eprintln!(
                "distlock: lock {:?} lost while the command ran: {reason}",
                args.key
            );
            exit::LOST
        }
        Outcome::WaitFailed(e) => {
            eprintln!("distlock: lost track of the command: {e}");
            exit::SOFTWARE
        }
    }
}

enum Outcome {
    Exited(ExitStatus),
    Lost(LostReason),
    WaitFailed(std::io::Error),
}

/// Waits for the child, forwarding SIGINT/SIGTERM/SIGHUP to it; stops it if the lock is lost.
async fn supervise<B: distlock::Backend>(
    child: &mut Child,
    guard: &distlock::LockGuard<B>,
) -> Outcome {
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw);
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(s) => Outcome::Exited(s),
                    Err(e) => Outcome::WaitFailed(e),
                };
            }
            reason = guard.lost() => {
                stop(child, pid).await;
                return Outcome::Lost(reason);
            }
            Some(()) = recv(&mut sigint) => forward(pid, Signal::SIGINT),
            Some(()) = recv(&mut sigterm) => forward(pid, Signal::SIGTERM),
            Some(()) = recv(&mut sighup) => forward(pid, Signal::SIGHUP),
        }
    }
}

async fn recv(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

fn forward(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, sig);
    }
}

/// SIGTERM, then SIGKILL after the grace period.
async fn stop(child: &mut Child, pid: Option<Pid>) {
    forward(pid, Signal::SIGTERM);
    if tokio::time::timeout(KILL_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The command's exit status as ours: its code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}
