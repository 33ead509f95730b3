//! `distlock release --force`: an operator's break-glass.

use clap::Args;

use crate::{exit, status};

#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Required: this removes another process's lock, which may still be working under it.
    #[arg(long)]
    force: bool,
    /// Print what was removed as one JSON object (`removed`, then the status fields).
    #[arg(long)]
    json: bool,
    /// The lock name.
    key: String,
}

pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    if !args.force {
        eprintln!(
            "distlock: release removes whoever holds {:?}, which may still be working under it; \
             pass --force to do it (a lock of your own is released when its `distlock run` ends)",
            args.key
        );
        return exit::USAGE;
    }
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let removed = match client.force_release(&args.key).await {
        Ok(r) => r,
        Err(e) => return exit::report(&format!("cannot break lock {:?}", args.key), &e),
    };
    match &removed {
        Some(st) => {
            eprintln!(
                "distlock: WARNING: lock {:?} broken by force. Its holder was not stopped and may \
                 still be working as if it held the lock, until it notices the loss at its next \
                 renewal; only writes fenced with DISTLOCK_FENCE are safe from it.",
                args.key
            );
            if args.json {
                let mut v = status::as_json(&args.key, st);
                v["removed"] = true.into();
                println!("{v}");
            } else {
                print!("removed {}", status::as_text(&args.key, st));
            }
        }
        None if args.json => {
            let mut v = status::as_json(&args.key, &distlock::LockStatus::free());
            v["removed"] = false.into();
            println!("{v}");
        }
        None => println!("{}: free, nothing removed", args.key),
    }
    0
}
