//! `distlock lead`: campaign in an election, run a command while leading, and step down.
//!
//! While it leads, CMD runs under a keeper process (`child-deadline`) that holds the
//! leadership's local deadline: each renewal the engine confirms moves it, and nothing else
//! does. If the deadline comes (renewals failed, or this process is paused or killed), the
//! keeper sends CMD SIGTERM a grace period before it and SIGKILL at it: CMD has stopped before
//! the lease could pass to a follower. A loss the engine reports early (the lease gone, a
//! session ended) stops CMD at once. Then `lead` campaigns again, unless `--once`. SIGTERM or
//! SIGINT to `lead` stops CMD (the same way, within the grace period) and resigns at once, so
//! a follower takes over within a few round trips rather than a lease.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use distlock::{LockClient, LockOptions, Released, Wait};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::deadline::{Order, monotonic_ns};
use crate::exit;
use crate::run::{recv, status_code};

#[derive(Debug, Args)]
pub(crate) struct LeadArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// The leadership's lease: the watchdog renews it every TTL/3, and a follower takes over
    /// at most a TTL after a leader dies without stepping down.
    #[arg(long, default_value = "15s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// How long before the leadership's local deadline CMD gets SIGTERM (SIGKILL at the
    /// deadline). It must fit in the lease with a renewal interval to spare.
    #[arg(long, default_value = "3s", value_parser = crate::parse_duration, value_name = "D")]
    kill_grace: Duration,
    /// The value followers read (`distlock leader`), such as this host's address.
    #[arg(long, default_value = "")]
    value: String,
    /// The leader's label (default: host/pid).
    #[arg(long)]
    label: Option<String>,
    /// Lead once: when leadership is lost, exit (--lost-exit-code) instead of campaigning
    /// again.
    #[arg(long)]
    once: bool,
    /// Exit status when leadership was lost under CMD (with --once).
    #[arg(long, default_value_t = exit::LOST, value_name = "N")]
    lost_exit_code: u8,
    /// The election's name (its lock's).
    name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// The lock options of a leadership: the TTL, a campaign that waits for ever.
fn options(args: &LeadArgs) -> Result<LockOptions, distlock::LockError> {
    LockOptions::builder()
        .ttl(args.ttl)
        .wait(Wait::Forever)
        .build()
}

/// Why a grace period does not fit the lease, if it does not: after a renewal the lease has
/// the validity left, and the next renewal comes an interval later, so the SIGTERM point
/// (deadline − grace) must lie beyond it, or CMD would be stopped while the leader is healthy.
pub(crate) fn grace_misfit(options: &LockOptions, grace: Duration) -> Option<String> {
    let validity = options.validity();
    let every = options.renew_interval();
    (grace + every >= validity).then(|| {
        format!(
            "--kill-grace {grace:?} does not fit in the lease: the leadership is valid for \
             {validity:?} after each renewal, renewed every {every:?}, so the grace period must \
             be under {:?} (a longer --ttl, or a shorter --kill-grace)",
            validity.saturating_sub(every)
        )
    })
}

pub(crate) async fn lead(args: LeadArgs) -> u8 {
    let options = match options(&args) {
        Ok(o) => o,
        Err(e) => return exit::report("invalid options", &e),
    };
    if let Some(why) = grace_misfit(&options, args.kill_grace) {
        eprintln!("distlock: {why}");
        return exit::USAGE;
    }
    let backend = match args.engine.open().await {
        Ok(b) => b,
        Err(code) => return code,
    };
    let mut builder = LockClient::builder(backend).options(options);
    if let Some(label) = &args.label {
        builder = builder.owner(label.clone());
    }
    let client = builder.build();
    let election = client.election(&args.name).value(args.value.clone());
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    // Back-off between campaigns that failed for a reason that may pass (the engine
    // unreachable, a session that expired while this process was paused): a candidate keeps
    // campaigning through them.
    let mut pause = Duration::from_millis(100);
    loop {
        let leading = tokio::select! {
            l = election.campaign() => match l {
                Ok(l) => l,
                Err(e) if e.is_retryable() || e.kind() == distlock::ErrorKind::Lost => {
                    eprintln!(
                        "distlock: campaigning in {:?}: {}; trying again in {pause:?}",
                        args.name,
                        exit::one_line(&e)
                    );
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        Some(()) = recv(&mut sigint) => return 130,
                        Some(()) = recv(&mut sigterm) => return 143,
                    }
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
                Err(e) => return exit::report(&format!("cannot campaign in {:?}", args.name), &e),
            },
            // Nothing runs yet: stop campaigning.
            Some(()) = recv(&mut sigint) => return 130,
            Some(()) = recv(&mut sigterm) => return 143,
        };
        pause = Duration::from_millis(100);
        eprintln!(
            "distlock: leading {:?} at epoch {}",
            args.name,
            leading.epoch()
        );
        let ended = serve(&args, &leading, (&mut sigint, &mut sigterm, &mut sighup)).await;
        match ended {
            Served::Exited(code) => {
                // CMD ended while we led: step down at once, and end with its status.
                return match leading.resign().await {
                    Ok(Released::Held) | Err(_) => code,
                    Ok(Released::Lost(reason)) => {
                        eprintln!(
                            "distlock: leadership of {:?} ended before the command did \
                             ({reason}); its work may not have been exclusive",
                            args.name
                        );
                        args.lost_exit_code
                    }
                };
            }
            Served::Signalled(code) => {
                let _ = leading.resign().await;
                return code;
            }
            Served::Lost(reason) => {
                eprintln!(
                    "distlock: leadership of {:?} lost ({reason}); the command was stopped",
                    args.name
                );
                drop(leading);
                if args.once {
                    return args.lost_exit_code;
                }
            }
            Served::Failed(code) => {
                let _ = leading.resign().await;
                return code;
            }
        }
    }
}

/// How a leadership's service ended.
enum Served {
    /// CMD ended on its own, with this status.
    Exited(u8),
    /// A signal came to `lead`: CMD was stopped; exit with this status.
    Signalled(u8),
    /// Leadership was lost: CMD was stopped.
    Lost(distlock::LostReason),
    /// CMD could not be run under its keeper.
    Failed(u8),
}

type Signals<'a> = (
    &'a mut Option<tokio::signal::unix::Signal>,
    &'a mut Option<tokio::signal::unix::Signal>,
    &'a mut Option<tokio::signal::unix::Signal>,
);

/// Runs CMD under its keeper while `leading` lasts.
async fn serve(
    args: &LeadArgs,
    leading: &distlock::Leadership,
    (sigint, sigterm, sighup): Signals<'_>,
) -> Served {
    let Some((mut keeper, mut control)) = start(args, leading).await else {
        return Served::Failed(exit::SOFTWARE);
    };
    let pid = keeper
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(nix::unistd::Pid::from_raw);
    let mut sent = leading.deadline();
    // Often enough that a renewal reaches the keeper well before the grace period starts.
    let mut tick = tokio::time::interval(Duration::from_millis(100).min(args.ttl / 20));
    loop {
        tokio::select! {
            status = keeper.wait() => {
                return Served::Exited(status.map_or(exit::SOFTWARE, status_code));
            }
            reason = leading.lost() => {
                let _ = control.write_all(Order::Stop.line().as_bytes()).await;
                let _ = keeper.wait().await;
                return Served::Lost(reason);
            }
            _ = tick.tick() => {
                let now = leading.deadline();
                if now != sent && leading.is_leading() {
                    sent = now;
                    let line = Order::Until(deadline_ns(now)).line();
                    if control.write_all(line.as_bytes()).await.is_err() {
                        // The keeper is gone; its exit comes next.
                    }
                }
            }
            Some(()) = recv(sigint) => {
                return stopped(&mut keeper, &mut control, 130).await;
            }
            Some(()) = recv(sigterm) => {
                return stopped(&mut keeper, &mut control, 143).await;
            }
            Some(()) = recv(sighup) => crate::run::forward(pid, nix::sys::signal::Signal::SIGHUP),
        }
    }
}

/// Stops CMD (SIGTERM, SIGKILL after the grace period) and waits for its end.
async fn stopped(keeper: &mut Child, control: &mut UnixStream, code: u8) -> Served {
    let _ = control.write_all(Order::Stop.line().as_bytes()).await;
    let _ = keeper.wait().await;
    Served::Signalled(code)
}

/// A deadline on the monotonic clock, in ns.
fn deadline_ns(at: std::time::Instant) -> u128 {
    let left = at.saturating_duration_since(std::time::Instant::now());
    monotonic_ns() + left.as_nanos()
}

/// Starts CMD under its keeper, and gives it the first deadline.
async fn start(args: &LeadArgs, leading: &distlock::Leadership) -> Option<(Child, UnixStream)> {
    let path = std::env::temp_dir().join(format!(
        "distlock-lead-{}-{}.sock",
        std::process::id(),
        distlock::Token::generate()
    ));
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("distlock: cannot open {}: {e}", path.display());
            return None;
        }
    };
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("distlock: cannot find its own executable: {e}");
            let _ = std::fs::remove_file(&path);
            return None;
        }
    };
    let keeper = Command::new(me)
        .arg("child-deadline")
        .arg("--control")
        .arg(&path)
        .arg("--grace")
        .arg(crate::show_duration(args.kill_grace))
        .arg("--")
        .args(&args.command)
        .env("DISTLOCK_KEY", &args.name)
        .env("DISTLOCK_KIND", "leader")
        .env("DISTLOCK_FENCE", leading.epoch().to_string())
        .env("DISTLOCK_EPOCH", leading.epoch().to_string())
        .spawn();
    let mut keeper = match keeper {
        Ok(k) => k,
        Err(e) => {
            eprintln!("distlock: cannot start the command's keeper: {e}");
            let _ = std::fs::remove_file(&path);
            return None;
        }
    };
    let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
    let _ = std::fs::remove_file(&path);
    let Ok(Ok((mut control, _))) = accepted else {
        eprintln!("distlock: the command's keeper did not connect");
        let _ = keeper.start_kill();
        let _ = keeper.wait().await;
        return None;
    };
    let first = Order::Until(deadline_ns(leading.deadline())).line();
    if control.write_all(first.as_bytes()).await.is_err() {
        let _ = keeper.wait().await;
        return None;
    }
    Some((keeper, control))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_period_must_leave_room_for_a_renewal() {
        let o = LockOptions::builder()
            .ttl(Duration::from_secs(15))
            .build()
            .unwrap();
        assert!(grace_misfit(&o, Duration::from_secs(3)).is_none());
        let why = grace_misfit(&o, Duration::from_secs(10)).expect("10 s of 15 s does not fit");
        assert!(why.contains("--kill-grace"), "{why}");
    }
}
