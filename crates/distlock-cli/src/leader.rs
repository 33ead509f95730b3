//! `distlock leader`: who leads an election, with its epoch and value; `--watch` prints each
//! change as it happens.

use std::time::Duration;

use clap::Args;
use distlock::Leader;

use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Print each change of leader as it happens (until interrupted).
    #[arg(long)]
    watch: bool,
    /// How often --watch reads the leader when the engine sends no event.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration, value_name = "D")]
    interval: Duration,
    /// One JSON object per line: name, leader (null when nobody leads), epoch, value, since_ms,
    /// since (RFC 3339), ttl_ms, token.
    #[arg(long)]
    json: bool,
    /// The election's name.
    name: String,
}

pub(crate) async fn leader(args: LeaderArgs) -> u8 {
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let election = client.election(&args.name).observe_interval(args.interval);
    if !args.watch {
        return match election.leader().await {
            Ok(l) => {
                print!("{}", show(&args.name, l.as_ref(), args.json));
                0
            }
            Err(e) => exit::report("cannot read the leader", &e),
        };
    }
    let mut observer = election.observe();
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    loop {
        tokio::select! {
            change = observer.changed() => match change {
                Ok(()) => {
                    use std::io::Write;
                    print!("{}", show(&args.name, observer.borrow(), args.json));
                    let _ = std::io::stdout().flush();
                }
                Err(e) => return exit::report("cannot read the leader", &e),
            },
            Some(()) = crate::run::recv(&mut sigint) => return 0,
            Some(()) = crate::run::recv(&mut sigterm) => return 0,
        }
    }
}

/// One leader (or nobody) as a line of text or JSON.
fn show(name: &str, leader: Option<&Leader>, json: bool) -> String {
    if json {
        let v = match leader {
            Some(l) => serde_json::json!({
                "name": name,
                "leader": l.who,
                "epoch": l.epoch.map(u64::from),
                "value": l.value,
                "since_ms": l.since_ms,
                "since": l.since_ms.and_then(|ms| crate::when::rfc3339(ms.into())),
                "ttl_ms": l.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
                "token": l.token,
            }),
            None => serde_json::json!({ "name": name, "leader": null }),
        };
        return format!("{v}\n");
    }
    match leader {
        None => format!("{name}: no leader\n"),
        Some(l) => {
            let epoch = l.epoch.map_or("unknown".into(), |e| e.to_string());
            let value = match &l.value {
                Some(v) if !v.is_empty() => format!(", value {v:?}"),
                _ => String::new(),
            };
            let ttl = l.ttl.map_or(String::new(), |t| {
                format!(", lease {} left", crate::when::duration(t))
            });
            let since = l.since_ms.map_or(String::new(), |ms| {
                format!(
                    " ({})",
                    crate::when::since(ms.into(), crate::when::now_ms())
                )
            });
            format!(
                "{name}: led by {}{since} at epoch {epoch}{value}{ttl}\n",
                l.who
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_and_somebody_read_as_lines() {
        assert_eq!(show("jobs", None, false), "jobs: no leader\n");
        let none: serde_json::Value = serde_json::from_str(&show("jobs", None, true)).unwrap();
        assert!(none["leader"].is_null());
    }
}
