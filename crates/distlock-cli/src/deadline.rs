//! `distlock child-deadline` (hidden): runs CMD under a deadline on the monotonic clock that
//! only the `distlock lead` process that started it moves, so that CMD stops by the
//! leadership's local deadline even when that process is paused (SIGSTOP, a stalled VM) or
//! killed: it sends CMD SIGTERM a grace period before the deadline and SIGKILL at it, unless a
//! later deadline came first. This is `consul lock`'s open bug (hashicorp/consul#9788, a child
//! killed about 90 s after the lock was lost) made impossible by construction: the parent can
//! only move the deadline while it is alive and leading.
//!
//! The parent listens on a Unix socket and this process connects to it. Each line it sends is
//! `D <ns>` (the deadline, in nanoseconds of `CLOCK_MONOTONIC`, which both processes read) or
//! `S` (stop now: SIGTERM, and SIGKILL after the grace period or at the deadline, whichever
//! comes first). The first line comes before CMD starts. A parent that goes away (killed,
//! crashed) takes its leadership with it on the engines whose lease is a connection
//! (PostgreSQL, MySQL free its locks at once): CMD gets SIGKILL at once. A paused parent keeps
//! its connection, and the deadline stands. This process exits with CMD's status (128 + the
//! signal that killed it).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::Signal;
use nix::time::{ClockId, clock_gettime};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::exit;
use crate::run::{forward, recv, status_code};

#[derive(Debug, Args)]
pub(crate) struct DeadlineArgs {
    /// The parent's socket.
    #[arg(long, value_name = "PATH")]
    control: PathBuf,
    /// How long before the deadline CMD gets SIGTERM (SIGKILL at the deadline).
    #[arg(long, value_parser = crate::parse_duration, value_name = "D")]
    grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// The monotonic clock in nanoseconds (the same in every process of the machine).
pub(crate) fn monotonic_ns() -> u128 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u128::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u128::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// What one line of the parent says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// The deadline moves to this monotonic instant (ns).
    Until(u128),
    /// Stop now.
    Stop,
}

impl Order {
    pub(crate) fn parse(line: &str) -> Option<Order> {
        match line.trim().split_once(' ') {
            Some(("D", ns)) => ns.parse().ok().map(Order::Until),
            None if line.trim() == "S" => Some(Order::Stop),
            _ => None,
        }
    }

    pub(crate) fn line(&self) -> String {
        match self {
            Order::Until(ns) => format!("D {ns}\n"),
            Order::Stop => "S\n".to_owned(),
        }
    }
}

/// A monotonic instant (ns) as a tokio instant.
fn instant_of(ns: u128) -> Instant {
    let left = ns.saturating_sub(monotonic_ns());
    Instant::now() + Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}

pub(crate) async fn run(args: DeadlineArgs) -> u8 {
    let stream = match UnixStream::connect(&args.control).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("distlock: child-deadline: cannot reach its parent: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut lines = BufReader::new(stream).lines();
    let first = lines.next_line().await.ok().flatten();
    let Some(Order::Until(first)) = first.as_deref().and_then(Order::parse) else {
        // No leadership to run under: CMD never starts.
        return exit::LOST;
    };
    let mut deadline = instant_of(first);
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut child = match Command::new(program).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: cannot run {}: {e}", program.to_string_lossy());
            return exit::CANNOT_EXEC;
        }
    };
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(nix::unistd::Pid::from_raw);
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    let grace = args.grace;
    let mut stopping = false;
    let mut termed = false;
    let mut parent = true;
    loop {
        let term_at = if stopping {
            Instant::now()
        } else {
            deadline.checked_sub(grace).unwrap_or(deadline)
        };
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(s) => status_code(s),
                    Err(_) => exit::SOFTWARE,
                };
            }
            line = lines.next_line(), if parent => match line.ok().flatten().as_deref().map(Order::parse) {
                Some(Some(Order::Until(ns))) if !stopping => deadline = instant_of(ns),
                Some(Some(Order::Stop)) => {
                    stopping = true;
                    deadline = deadline.min(Instant::now() + grace);
                }
                Some(_) => {}
                // The parent is gone (killed, crashed): its leadership may end with it (an
                // engine whose lease is a connection frees it at once), so CMD stops now.
                None => {
                    parent = false;
                    let _ = child.start_kill();
                }
            },
            () = tokio::time::sleep_until(term_at), if !termed => {
                forward(pid, Signal::SIGTERM);
                termed = true;
            }
            () = tokio::time::sleep_until(deadline) => {
                let _ = child.start_kill();
                // Its status comes with the next wait.
                let status = child.wait().await;
                return status.map_or(exit::SOFTWARE, status_code);
            }
            Some(()) = recv(&mut sigint) => forward(pid, Signal::SIGINT),
            Some(()) = recv(&mut sigterm) => forward(pid, Signal::SIGTERM),
            Some(()) = recv(&mut sighup) => forward(pid, Signal::SIGHUP),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_read_back() {
        for o in [Order::Until(12_345_678_901_234), Order::Stop] {
            assert_eq!(Order::parse(&o.line()), Some(o));
        }
        assert_eq!(Order::parse("D x"), None);
        assert_eq!(Order::parse("X 1"), None);
        assert!(monotonic_ns() > 0);
    }
}
