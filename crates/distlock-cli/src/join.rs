//! `distlock join`: joins a group as a member and prints each change of what it owns, one line
//! each (or JSON), until SIGINT or SIGTERM, when it leaves gracefully (each partition drained
//! for the grace, then released). A sidecar for a service that routes by owner, and a member
//! for scripts: `gained P fence F`, `draining P fence F`, `lost P fence F [reason]`.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use distlock::{LockOptions, OwnershipEvent};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::broadcast::error::RecvError;

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
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(OwnershipEvent::Gained(o)) => {
                    line(&args, "gained", Some(o.partition), Some(o.fence.get()), None);
                }
                Ok(OwnershipEvent::Draining { owned, .. }) => {
                    line(&args, "draining", Some(owned.partition), Some(owned.fence.get()), None);
                }
                Ok(OwnershipEvent::Lost { owned, reason }) => {
                    let why = reason.map(|r| r.to_string());
                    line(&args, "lost", Some(owned.partition), Some(owned.fence.get()), why);
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return exit::SOFTWARE,
            },
            reason = member.lost() => {
                // Its task lets every partition go; say so, and end as a lost lease does.
                line(&args, "left", None, None, Some(format!("membership lost: {reason}")));
                return exit::LOST;
            }
            Some(()) = recv(&mut sigint) => break,
            Some(()) = recv(&mut sigterm) => break,
        }
    }
    let left = member.leave().await;
    while let Ok(e) = events.try_recv() {
        if let OwnershipEvent::Lost { owned, reason } = e {
            let why = reason.map(|r| r.to_string());
            line(
                &args,
                "lost",
                Some(owned.partition),
                Some(owned.fence.get()),
                why,
            );
        }
    }
    line(&args, "left", None, None, None);
    match left {
        Ok(()) => 0,
        Err(e) => exit::report("leaving the group", &e),
    }
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
