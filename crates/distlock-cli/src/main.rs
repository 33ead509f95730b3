//! The `distlock` command.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod bench;
mod check;
mod crowd;
mod deadline;
mod exit;
mod group;
mod held;
mod join;
mod lead;
mod leader;
mod list;
mod logs;
mod release;
mod run;
mod status;
mod term;
mod when;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  distlock run nightly-report -- ./report.sh          # local lock (no server needed)
  distlock run --no-wait backup -- pg_dump mydb        # exit 75 at once if someone holds it
  distlock run --url redis://10.0.0.5:6379 --ttl 10s --wait 1m deploy -- ./deploy.sh
  distlock run --url postgres://app@db/app orders -- sh -c 'psql -c \"... WHERE fence <= $DISTLOCK_FENCE\"'
  DISTLOCK_URL=redis://cache:6379/0 distlock status deploy --json
  distlock list --url redis+cluster://10.0.0.5:7000 --watch   # every lock, who holds it, who waits
  distlock release --force deploy                      # break-glass: remove whoever holds it
  distlock lead --url etcd://10.0.0.7:2379 --value $(hostname):8080 scheduler -- ./scheduler
  distlock leader --url etcd://10.0.0.7:2379 scheduler --watch
  distlock bench --url redis://cache:6379 --tasks 32 --keys 4 --duration 10s
  distlock check --url etcd://10.0.0.7:2379            # a short correctness check
  distlock completions bash > /etc/bash_completion.d/distlock

Engines (--url or DISTLOCK_URL): file:///dir (the default: a local directory), redis://,
rediss://, redis+sentinel://, redis+cluster://, redlock://, etcd://, etcds://, zk://,
postgres://, mysql:// (or mariadb://), memcached://, memcacheds://. Passwords: DISTLOCK_PASSWORD
or --password-file, never the command line; certificates: the URL or DISTLOCK_TLS_CA,
DISTLOCK_TLS_CERT, DISTLOCK_TLS_KEY.

Exit status: the command's own; 75 when the lock could not be had (busy, or the wait timed
out; --conflict-exit-code); 70 when the lock was lost while the command ran (it is sent SIGTERM,
then SIGKILL; --lost-exit-code); 69 when the lock engine is unreachable; 78 for a configuration
error; 77 when the engine refused our credentials; 64 for bad usage or a bad key; 1 when
`check` found a violation.";

/// Run commands under a distributed lock, see who holds one, break one, and measure or check
/// a deployment.
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
    /// Campaign in the election NAME and run CMD while leading (DISTLOCK_FENCE is the epoch);
    /// stop CMD by the leadership's local deadline if it is lost, then campaign again.
    Lead(lead::LeadArgs),
    /// Show who leads the election NAME, with its epoch and value; --watch follows changes.
    Leader(leader::LeaderArgs),
    /// Show whether KEY is held, by whom, for how long, and its fence.
    Status(status::StatusArgs),
    /// Show the group NAME: its members, and each partition's owner, fence and assigned
    /// member.
    Group(group::GroupArgs),
    /// Show which member of the group NAME owns KEY (its partition, value and fence).
    Owner(group::OwnerArgs),
    /// Join the group NAME as member ID and print each partition gained, draining and lost,
    /// until SIGINT or SIGTERM (then leave gracefully).
    Join(join::JoinArgs),
    /// List every lock held (or waited for) on the engine, with its holders and waiters;
    /// --watch redraws it as it changes.
    List(list::ListArgs),
    /// Break the lock KEY whoever holds it (an operator's break-glass; needs --force).
    Release(release::ReleaseArgs),
    /// Load a deployment: lock throughput, acquire and hand-off latency, fairness.
    Bench(bench::BenchArgs),
    /// Check a deployment: workers run a fenced read-modify-write under the lock, and every
    /// overlap, stale fence or lost update is reported.
    Check(check::CheckArgs),
    /// Runs CMD under a deadline that only its `lead` parent moves (internal).
    #[command(hide = true)]
    ChildDeadline(deadline::DeadlineArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
struct Engine {
    /// The lock engine: file:///dir (default: a local lock directory), redis://host:port/db,
    /// rediss://…, redis+sentinel://, redis+cluster://, redlock://h1,h2,h3, etcd://, zk://,
    /// postgres://, mysql://, memcached://.
    #[arg(long, env = "DISTLOCK_URL", value_name = "URL")]
    url: Option<String>,
    /// Read the engine's password from this file (its first line), not from the URL, where
    /// `ps` would show it. DISTLOCK_PASSWORD gives it too; DISTLOCK_SENTINEL_PASSWORD gives
    /// Redis Sentinel's own. Certificates: the URL's parameters (tls_ca, sslrootcert, ssl-ca…)
    /// or DISTLOCK_TLS_CA, DISTLOCK_TLS_CERT, DISTLOCK_TLS_KEY (PGSSLROOTCERT… for PostgreSQL).
    #[arg(long, env = "DISTLOCK_PASSWORD_FILE", value_name = "PATH")]
    password_file: Option<std::path::PathBuf>,
}

/// `--metrics-addr`, for the commands that run a while.
#[derive(Debug, Args)]
struct MetricsArgs {
    /// Serve the lock metrics (distlock_*: acquire and wait times, locks held, losses, renewal
    /// failures, hand-offs) in Prometheus' text format on this address while distlock runs,
    /// e.g. 127.0.0.1:9464 (any path: /metrics).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

impl MetricsArgs {
    /// Starts serving, if asked; the exit status of why it cannot. Called outside the
    /// command's runtime, so the exporter gets a thread and a runtime of its own: a command
    /// that keeps its runtime busy (bench's lockers on the file engine) must not starve it.
    fn serve(&self) -> Result<(), u8> {
        let Some(addr) = self.metrics_addr else {
            return Ok(());
        };
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| {
                eprintln!("distlock: cannot serve the metrics on {addr}: {e}");
                exit::CONFIG
            })
    }
}

impl Engine {
    /// The engine's URL, with the password from the file or the environment put in.
    fn url(&self) -> Result<String, distlock::LockError> {
        let url = self
            .url
            .as_deref()
            .filter(|u| !u.is_empty())
            .unwrap_or("file://");
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let password = match &self.password_file {
            Some(path) => Some(read_secret(path)?),
            None => env("DISTLOCK_PASSWORD"),
        };
        let mut url = distlock::url::with_password(url, password.as_deref());
        if let Some(p) = env("DISTLOCK_SENTINEL_PASSWORD") {
            let sep = if url.contains('?') { '&' } else { '?' };
            url = format!(
                "{url}{sep}sentinel_password={}",
                distlock::url::percent_encode(&p)
            );
        }
        Ok(url)
    }
}

impl Engine {
    /// The engine opened, or the exit status of why it could not be (reported on stderr).
    async fn open(&self) -> Result<std::sync::Arc<dyn distlock::Backend>, u8> {
        let url = self.url().map_err(|e| exit::report_open(&e))?;
        distlock::open_backend(&url)
            .await
            .map_err(|e| exit::report_open(&e))
    }

    /// A client of the engine with the default options (see [`open`](Self::open)).
    async fn client(&self) -> Result<distlock::LockClient, u8> {
        Ok(distlock::LockClient::new(self.open().await?))
    }
}

/// The first line of a secret's file (without its line ending).
fn read_secret(path: &std::path::Path) -> Result<String, distlock::LockError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        distlock::LockError::new(
            distlock::ErrorKind::Config,
            format!("reading the password file {}: {e}", path.display()),
        )
    })?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::tools::parse_duration(text).map_err(|e| e.message().to_owned())
}

/// A duration as the options take it: `0`, `250ms`, `1.5s`.
fn show_duration(d: Duration) -> String {
    if d.is_zero() {
        "0".into()
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// `--version`: the version, and the engines compiled in (made once, for the process's life).
fn version() -> &'static str {
    let text = format!(
        "{}\nengines: {}",
        env!("CARGO_PKG_VERSION"),
        distlock::tools::engines().join(", ")
    );
    Box::leak(text.into_boxed_str())
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .version(version())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let args: Vec<String> = std::env::args().skip(1).collect();
            let run_without_dashes = e.kind() == clap::error::ErrorKind::UnknownArgument
                && args.first().is_some_and(|a| a == "run")
                && !args.iter().any(|a| a == "--");
            if run_without_dashes {
                eprintln!(
                    "distlock: the command goes after `--`: distlock run [OPTIONS] KEY -- CMD [ARGS...]"
                );
                return ExitCode::from(exit::USAGE);
            }
            return ExitCode::from(exit::usage(&e));
        }
    };
    logs::init();
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "distlock",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let metrics = match &cli.command {
        Command::Run(args) => Some(&args.metrics),
        Command::Bench(args) => Some(&args.metrics),
        _ => None,
    };
    if let Some(Err(code)) = metrics.map(MetricsArgs::serve) {
        return ExitCode::from(code);
    }
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
            Command::Lead(args) => lead::lead(args).await,
            Command::Leader(args) => leader::leader(args).await,
            Command::ChildDeadline(args) => deadline::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Group(args) => group::group(args).await,
            Command::Owner(args) => group::owner(args).await,
            Command::Join(args) => join::join(args).await,
            Command::List(args) => list::list(args).await,
            Command::Release(args) => release::release(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::Check(args) => check::check(args).await,
            Command::Completions { .. } => exit::SOFTWARE,
        }
    });
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_show_as_typed() {
        assert_eq!(show_duration(Duration::ZERO), "0");
        assert_eq!(show_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1.5s");
    }
}
