//! P10's stampede: N processes started at once, each `distlock run --wait 2m NAME -- CMD` on
//! one name. Every command appends a start line and an end line (its fence and its number) to
//! one log; the log must show each process's command exactly once, never two at a time, with
//! fences strictly increasing in the order they ran. A thread counts the server's established
//! connections (`/proc/net/tcp`) every few milliseconds meanwhile, for the most it saw.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Server;

/// How long each process waits for the lock (`--wait`), as the issue fixes it.
const WAIT: &str = "2m";

/// One engine's stampede.
pub(crate) struct Stampede {
    pub(crate) engine: &'static str,
    pub(crate) processes: usize,
    /// From the first process started to the last one ended.
    pub(crate) total: Duration,
    /// The most established connections the server had at once (None: no TCP port).
    pub(crate) most_connections: Option<usize>,
    /// Processes that exited 0.
    pub(crate) succeeded: usize,
    /// Every way the log breaks the rules (empty: it keeps them all).
    pub(crate) broken: Vec<String>,
    /// Whether every run had a fence (an engine without fencing gives none).
    pub(crate) fenced: bool,
    /// The first lines of the first failing process's stderr.
    pub(crate) first_error: Option<String>,
}

impl Stampede {
    pub(crate) fn ok(&self) -> bool {
        self.broken.is_empty() && self.succeeded == self.processes
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::json!({
            "engine": self.engine,
            "processes": self.processes,
            "total_s": self.total.as_secs_f64(),
            "most_connections": self.most_connections,
            "succeeded": self.succeeded,
            "broken": self.broken,
            "fenced": self.fenced,
            "first_error": self.first_error,
        })
    }
}

/// The `distlock` binary beside this one (cargo builds both into one target directory).
pub(crate) fn distlock_binary() -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    let path = me.with_file_name("distlock");
    assert!(
        path.exists(),
        "this part runs {}: build it first (cargo build -p distlock-cli, with the same \
         profile as distlock-bench)",
        path.display()
    );
    path
}

/// The established TCP connections whose local port is `port`: the server's ends.
fn connections_to(port: u16) -> usize {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|l| {
                    let mut f = l.split_whitespace();
                    let local = f.nth(1).unwrap_or("");
                    let state = f.nth(1).unwrap_or("");
                    state == "01" && local.ends_with(&want)
                })
                .count()
        })
        .sum()
}

/// Samples `connections_to(port)` every 2 ms until `stop`; the most it saw.
fn count_connections(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut most = 0;
        while !stop.load(Ordering::Relaxed) {
            most = most.max(connections_to(port));
            std::thread::sleep(Duration::from_millis(2));
        }
        most
    })
}

/// The command each process runs under the lock: a start line, a short pause, an end line.
const SCRIPT: &str = r#"printf 'start %s %s\n' "$DISTLOCK_FENCE" "$STAMPEDE_ID" >> "$STAMPEDE_LOG"
sleep 0.005
printf 'end %s %s\n' "$DISTLOCK_FENCE" "$STAMPEDE_ID" >> "$STAMPEDE_LOG""#;

/// Runs `processes` processes at once against `url` (a TCP server on `port`, or none).
pub(crate) fn run_one(
    engine: &'static str,
    url: &str,
    port: Option<u16>,
    processes: usize,
) -> Stampede {
    let distlock = distlock_binary();
    let dir = std::env::temp_dir().join(format!(
        "distlock-stampede-{}-{}",
        std::process::id(),
        engine.to_lowercase()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let log = dir.join("runs.log");
    let name = format!("stampede/{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let counter = port.map(|p| count_connections(p, stop.clone()));
    let started = Instant::now();
    let children: Vec<Child> = (0..processes)
        .map(|i| {
            let err = std::fs::File::create(dir.join(format!("{i}.err"))).expect("stderr file");
            Command::new(&distlock)
                .args(["run", "--wait", WAIT, "--url", url, &name, "--", "sh", "-c"])
                .arg(SCRIPT)
                .env("STAMPEDE_ID", i.to_string())
                .env("STAMPEDE_LOG", &log)
                .env_remove("DISTLOCK_PASSWORD_FILE")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .expect("start distlock run")
        })
        .collect();
    let mut succeeded = 0;
    let mut first_error = None;
    for (i, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait for distlock run");
        if status.success() {
            succeeded += 1;
        } else if first_error.is_none() {
            let text = std::fs::read_to_string(dir.join(format!("{i}.err"))).unwrap_or_default();
            let head: Vec<&str> = text.lines().take(3).collect();
            first_error = Some(format!("process {i}: {status}: {}", head.join(" / ")));
        }
    }
    let total = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let most_connections = counter.map(|c| c.join().expect("the connection counter"));
    // memcached is the one engine without fences (its capability says so).
    let (broken, fenced) = check_log(&log, processes, engine != "memcached");
    let _ = std::fs::remove_dir_all(&dir);
    Stampede {
        engine,
        processes,
        total,
        most_connections,
        succeeded,
        broken,
        fenced,
        first_error,
    }
}

/// What the log breaks of the rules: each id once, a start followed by its own end, fences
/// strictly increasing.
fn check_log(log: &Path, processes: usize, fencing: bool) -> (Vec<String>, bool) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut broken = Vec::new();
    let mut seen = vec![0u32; processes];
    let mut open: Option<(String, String)> = None;
    let mut last_fence: Option<u64> = None;
    let (mut starts, mut unfenced) = (0usize, 0usize);
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        let [what, fence, id] = f[..] else {
            broken.push(format!(
                "line {}: {line:?} is not `start|end FENCE ID`",
                n + 1
            ));
            continue;
        };
        match (what, open.take()) {
            ("start", None) => {
                starts += 1;
                match fence.parse::<u64>() {
                    // No DISTLOCK_FENCE: an engine without fencing (memcached).
                    Err(_) if fence.is_empty() => unfenced += 1,
                    Ok(f) if last_fence.is_none_or(|l| f > l) => last_fence = Some(f),
                    Ok(f) => broken.push(format!(
                        "line {}: fence {f} after {}",
                        n + 1,
                        last_fence.unwrap_or(0)
                    )),
                    Err(_) => broken.push(format!("line {}: no fence ({fence:?})", n + 1)),
                }
                match id.parse::<usize>().ok().and_then(|i| seen.get_mut(i)) {
                    Some(count) => *count += 1,
                    None => broken.push(format!("line {}: no process {id:?}", n + 1)),
                }
                open = Some((fence.to_owned(), id.to_owned()));
            }
            ("start", Some((_, other))) => {
                broken.push(format!("line {}: {id} started while {other} ran", n + 1));
                open = Some((fence.to_owned(), id.to_owned()));
            }
            ("end", Some((f, i))) if f == fence && i == id => {}
            ("end", o) => broken.push(format!(
                "line {}: end of {id} while {:?} ran",
                n + 1,
                o.map(|(_, i)| i)
            )),
            _ => broken.push(format!("line {}: {line:?}", n + 1)),
        }
    }
    if let Some((_, id)) = open {
        broken.push(format!("{id} never ended"));
    }
    if unfenced > 0 && (fencing || unfenced < starts) {
        broken.push(format!("{unfenced} of {starts} runs had no fence"));
    }
    let twice = seen.iter().filter(|&&c| c > 1).count();
    let never = seen.iter().filter(|&&c| c == 0).count();
    if twice > 0 {
        broken.push(format!("{twice} commands ran more than once"));
    }
    if never > 0 {
        broken.push(format!("{never} commands never ran"));
    }
    (broken, starts > 0 && unfenced == 0)
}

/// The port of a `scheme://…127.0.0.1:PORT…` URL.
pub(crate) fn port_of(url: &str) -> Option<u16> {
    let rest = &url[url.find("127.0.0.1:")? + "127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The stampede on every engine named in `only` (all when empty), the file engine included.
pub(crate) fn run(processes: usize, only: &[String]) -> Vec<Stampede> {
    let mut out = Vec::new();
    let mut once = |engine: &'static str, url: &str, port: Option<u16>| {
        let s = run_one(engine, url, port, processes);
        eprintln!("p10 stampede: {}", s.json());
        out.push(s);
    };
    if only.is_empty() || only.iter().any(|o| o == "file") {
        let dir =
            std::env::temp_dir().join(format!("distlock-stampede-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a lock directory");
        once("file", &format!("file://{}", dir.display()), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
    super::engines::each(false, only, |server: Server<'_>| {
        once(server.engine, &server.url, port_of(&server.url));
    });
    out
}

/// The stampede's table.
pub(crate) fn render(rows: &[Stampede]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut out = format!(
        "P10 stampede: {} processes started at once, each `distlock run --wait {WAIT} NAME -- CMD` \
         on one name (unpinned)\n\n\
         | engine | runs ended well | exactly once, one at a time, fences increasing | fences | total time | most server connections |\n\
         |---|---:|---|---|---:|---:|\n",
        first.processes
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {}/{} | {} | {} | {:.1} s | {} |\n",
            r.engine,
            r.succeeded,
            r.processes,
            if r.broken.is_empty() {
                "yes".to_owned()
            } else {
                format!("**no**: {}", r.broken[..r.broken.len().min(3)].join("; "))
            },
            if r.fenced {
                "every run"
            } else {
                "none (the engine has no fencing)"
            },
            r.total.as_secs_f64(),
            r.most_connections.map_or("-".into(), |c| c.to_string()),
        ));
    }
    for r in rows.iter().filter(|r| r.first_error.is_some()) {
        out.push_str(&format!(
            "\n{}: {}\n",
            r.engine,
            r.first_error.as_deref().unwrap_or("")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::check_log;

    fn check(lines: &str, processes: usize) -> (Vec<String>, bool) {
        let path = std::env::temp_dir().join(format!(
            "distlock-stampede-test-{}-{}",
            std::process::id(),
            lines.len()
        ));
        std::fs::write(&path, lines).unwrap();
        let out = check_log(&path, processes, !lines.contains("start  "));
        let _ = std::fs::remove_file(&path);
        out
    }

    #[test]
    fn a_log_that_keeps_the_rules_passes() {
        let (broken, fenced) = check("start 1 1\nend 1 1\nstart 4 0\nend 4 0\n", 2);
        assert!(broken.is_empty(), "{broken:?}");
        assert!(fenced);
        let (broken, fenced) = check("start  1\nend  1\nstart  0\nend  0\n", 2);
        assert!(broken.is_empty(), "{broken:?}");
        assert!(!fenced);
    }

    #[test]
    fn each_broken_rule_is_named() {
        let overlap = check("start 1 0\nstart 2 1\nend 2 1\nend 1 0\n", 2).0;
        assert!(
            overlap.iter().any(|b| b.contains("started while")),
            "{overlap:?}"
        );
        let backwards = check("start 2 0\nend 2 0\nstart 2 1\nend 2 1\n", 2).0;
        assert!(
            backwards.iter().any(|b| b.contains("fence 2 after 2")),
            "{backwards:?}"
        );
        let twice = check("start 1 0\nend 1 0\nstart 2 0\nend 2 0\n", 2).0;
        assert!(
            twice.iter().any(|b| b.contains("more than once")),
            "{twice:?}"
        );
        assert!(twice.iter().any(|b| b.contains("never ran")), "{twice:?}");
        let mixed = check("start 1 0\nend 1 0\nstart  1\nend  1\n", 2).0;
        assert!(
            mixed.iter().any(|b| b.contains("had no fence")),
            "{mixed:?}"
        );
        let cut = check("start 1 0\n", 1).0;
        assert!(cut.iter().any(|b| b.contains("never ended")), "{cut:?}");
        let stranger = check("start 1 0\nend 1 0\nstart 2 7\nend 2 7\n", 1).0;
        assert!(
            stranger.iter().any(|b| b.contains("no process")),
            "{stranger:?}"
        );
        let path =
            std::env::temp_dir().join(format!("distlock-stampede-unfenced-{}", std::process::id()));
        std::fs::write(&path, "start  0\nend  0\n").unwrap();
        let (lost, _) = check_log(&path, 1, true);
        let _ = std::fs::remove_file(&path);
        assert!(lost.iter().any(|b| b.contains("had no fence")), "{lost:?}");
    }
}
