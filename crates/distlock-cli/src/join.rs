//! `distlock join`: joins a group as a member and prints each change of what it owns, one line
//! each (or JSON), until SIGINT or SIGTERM, when it leaves gracefully (each partition drained
//! for the grace, then released). A sidecar for a service that routes by owner, and a member
//! for scripts: `gained P fence F`, `draining P fence F`, `lost P fence F [reason]`.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use distlock::{LockOptions, OwnershipEvent};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::exit;
use crate::run::recv;

#[derive(Debug, Args)]
pub(crate) struct JoinArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// The membership's and the partitions' leases: another member takes this one's
    /// partitions at most a TTL after it dies.
    #[arg(long, default_value = "15s", value_parser = crate::parse_duration, value_name = "D")]
    ttl: Duration,
    /// The group's number of partitions (fixed while any of its leases lives).
    #[arg(long, default_value_t = distlock::DEFAULT_PARTITIONS, value_name = "P")]
    partitions: u32,
    /// How long a partition that moved to another member stays this one's before it is let go.
    #[arg(long, default_value = "0s", value_parser = crate::parse_duration, value_name = "D")]
    grace: Duration,
    /// How often the group's members are read (a join or a leave moves partitions within it).
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration, value_name = "D")]
    interval: Duration,
    /// The value other members and routers read (`distlock owner`), such as this host's
    /// address.
    #[arg(long, default_value = "")]
    value: String,
    /// One JSON object per line: event (joined, gained, draining, lost, left), partition,
    /// fence, reason.
    #[arg(long)]
    json: bool,
    /// The group's name.
    name: String,
    /// This member's id, unique in the group.
    id: String,
}

pub(crate) async fn join(args: JoinArgs) -> u8 {
    let options = match LockOptions::builder().ttl(args.ttl).build() {
        Ok(o) => o,
        Err(e) => return exit::report("bad options", &e),
    };
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let group = client
        .group(&args.name)
        .partitions(args.partitions)
        .options(options)
        .grace(args.grace)
        .interval(args.interval);
    let member = match group.join(&args.id, &args.value).await {
        Ok(m) => m,
        Err(e) => return exit::report("cannot join the group", &e),
    };
    let mut events = member.events();
    line(&args, "joined", None, Some(member.epoch().get()), None);
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let lost = loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(e) => show(&args, &e),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return exit::SOFTWARE,
            },
            reason = member.lost() => break Some(reason),
            Some(()) = recv(&mut sigint) => break None,
            Some(()) = recv(&mut sigterm) => break None,
        }
    };
    // Left (or ended by the loss): the task drains or lets go of every partition, and each
    // change is printed as it happens. A second signal stops waiting for the grace: the
    // partitions then run out with their leases.
    let leaving = member.leave();
    tokio::pin!(leaving);
    let left = loop {
        tokio::select! {
            left = &mut leaving => break Some(left),
            event = events.recv() => match event {
                Ok(e) => show(&args, &e),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => {}
            },
            Some(()) = recv(&mut sigint) => break None,
            Some(()) = recv(&mut sigterm) => break None,
        }
    };
    loop {
        match events.try_recv() {
            Ok(e) => show(&args, &e),
            Err(TryRecvError::Lagged(_)) => {}
            Err(_) => break,
        }
    }
    if let Some(reason) = lost {
        line(
            &args,
            "left",
            None,
            None,
            Some(format!("membership lost: {reason}")),
        );
        return exit::LOST;
    }
    match left {
        Some(Ok(())) => {
            line(&args, "left", None, None, None);
            0
        }
        Some(Err(e)) => {
            line(&args, "left", None, None, Some(exit::one_line(&e)));
            exit::report("leaving the group", &e)
        }
        None => {
            let why = "cut short: the partitions run out with their leases";
            line(&args, "left", None, None, Some(why.to_owned()));
            0
        }
    }
}

/// One ownership event as a line.
fn show(args: &JoinArgs, event: &OwnershipEvent) {
    let (what, owned, reason) = match event {
        OwnershipEvent::Gained(o) => ("gained", o, None),
        OwnershipEvent::Kept(o) => ("kept", o, None),
        OwnershipEvent::Draining { owned, .. } => ("draining", owned, None),
        OwnershipEvent::Lost { owned, reason } => ("lost", owned, reason.map(|r| r.to_string())),
        _ => return,
    };
    line(
        args,
        what,
        Some(owned.partition),
        Some(owned.fence.get()),
        reason,
    );
}

/// One event as a line of text or JSON, flushed at once (a pipe reads it as it happens).
fn line(
    args: &JoinArgs,
    event: &str,
    partition: Option<u32>,
    fence: Option<u64>,
    reason: Option<String>,
) {
    let text = if args.json {
        let v = serde_json::json!({
            "event": event,
            "group": args.name,
            "member": args.id,
            "partition": partition,
            "fence": fence,
            "reason": reason,
        });
        format!("{v}\n")
    } else {
        let mut s = event.to_owned();
        if let Some(p) = partition {
            s.push_str(&format!(" {p}"));
        }
        if let Some(f) = fence {
            let what = if partition.is_some() {
                "fence"
            } else {
                "epoch"
            };
            s.push_str(&format!(" {what} {f}"));
        }
        if let Some(r) = reason {
            s.push_str(&format!(" ({r})"));
        }
        s.push('\n');
        s
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
