//! The `distlock` command.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod exit;
mod run;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  distlock run nightly-report -- ./report.sh          # local lock (no server needed)
  distlock run --no-wait backup -- pg_dump mydb        # exit 75 at once if someone holds it
  distlock run --url redis://10.0.0.5:6379 --ttl 10s --wait 1m deploy -- ./deploy.sh
  DISTLOCK_URL=redis://cache:6379/0 distlock status deploy --json

Exit status: the command's own; 75 when the lock could not be had (busy, or the wait timed
out); 70 when the lock was lost while the command ran (it is sent SIGTERM, then SIGKILL);
69 when the lock engine is unreachable; 78 for a configuration error; 64 for a bad key.";

/// Run commands under a distributed lock, and see who holds one.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD while holding the lock KEY; the child gets DISTLOCK_KEY and DISTLOCK_FENCE.
    Run(run::RunArgs),
    /// Show whether KEY is held, by whom, for how long, and its fence.
    Status(status::StatusArgs),
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
struct Engine {
    /// The lock engine: file:///dir (default: a local lock directory), redis://host:port/db,
    /// rediss://…, redis+unix:///socket.
    #[arg(long, env = "DISTLOCK_URL", value_name = "URL")]
    url: Option<String>,
}

impl Engine {
    fn url(&self) -> &str {
        self.url
            .as_deref()
            .filter(|u| !u.is_empty())
            .unwrap_or("file://")
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::parse_duration(text).map_err(|e| e.message().to_owned())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
        }
    });
    ExitCode::from(code)
}

/// Logs go to stderr; `DISTLOCK_LOG=debug` (or info, warn, error, off) sets the level.
fn init_logging() {
    let level = match std::env::var("DISTLOCK_LOG").as_deref() {
        Ok("trace") => Some(tracing_subscriber::filter::LevelFilter::TRACE),
        Ok("debug") => Some(tracing_subscriber::filter::LevelFilter::DEBUG),
        Ok("info") => Some(tracing_subscriber::filter::LevelFilter::INFO),
        Ok("error") => Some(tracing_subscriber::filter::LevelFilter::ERROR),
        Ok("off") => None,
        _ => Some(tracing_subscriber::filter::LevelFilter::WARN),
    };
    if let Some(level) = level {
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .with_target(false)
            .init();
    }
}
