//! The peer libraries (bench/peers/README.md): programs that `bench/run.sh` installs outside
//! the repository, one folder each with an executable `run` and a `name`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One installed peer.
pub(crate) struct Peer {
    pub(crate) name: String,
    run: PathBuf,
}

/// A peer's figure for one scenario: a number, or why it has none.
#[derive(Clone, Debug)]
pub(crate) enum Figure {
    Value(f64),
    /// The library lacks the feature (the peer said `n/a (…)`).
    NotApplicable(String),
    /// The peer failed; the message says how.
    Failed(String),
}

impl Figure {
    /// The cell of a table: the number with `decimals`, or the reason.
    pub(crate) fn cell(&self, decimals: usize) -> String {
        match self {
            Figure::Value(v) => format!("{v:.decimals$}"),
            Figure::NotApplicable(why) => why.clone(),
            Figure::Failed(why) => format!("failed: {why}"),
        }
    }

    pub(crate) fn value(&self) -> Option<f64> {
        match self {
            Figure::Value(v) => Some(*v),
            _ => None,
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        match self {
            Figure::Value(v) => serde_json::json!(v),
            Figure::NotApplicable(why) => serde_json::json!({ "n/a": why }),
            Figure::Failed(why) => serde_json::json!({ "failed": why }),
        }
    }
}

/// The median of a peer's rounds (the first non-number when any round has none).
pub(crate) fn median_figure(rounds: &[Figure]) -> Figure {
    if let Some(other) = rounds.iter().find(|f| f.value().is_none()) {
        return other.clone();
    }
    let v: Vec<f64> = rounds.iter().filter_map(Figure::value).collect();
    if v.is_empty() {
        return Figure::Failed("no rounds".into());
    }
    Figure::Value(crate::median(v))
}

/// The peers installed in `dir`, in folder-name order.
pub(crate) fn discover(dir: &Path) -> Vec<Peer> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("distlock-bench: no peers folder {}", dir.display());
        return Vec::new();
    };
    let mut peers: Vec<(String, Peer)> = entries
        .flatten()
        .filter_map(|e| {
            let run = e.path().join("run");
            let name = std::fs::read_to_string(e.path().join("name")).ok()?;
            run.is_file().then(|| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    Peer {
                        name: name.trim().to_owned(),
                        run,
                    },
                )
            })
        })
        .collect();
    peers.sort_by(|a, b| a.0.cmp(&b.0));
    peers.into_iter().map(|(_, p)| p).collect()
}

/// A file for a peer's stderr (a pipe nobody drains while the peer runs could fill up and
/// stall it); its last line explains a failure.
fn stderr_file() -> (Stdio, PathBuf) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "distlock-peer-{}-{}.err",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    match std::fs::File::create(&path) {
        Ok(f) => (Stdio::from(f), path),
        Err(_) => (Stdio::null(), path),
    }
}

/// The last non-empty line of a peer's stderr file (and the file removed).
fn last_error(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned()
}

impl Peer {
    fn outcome(&self, out: std::process::Output) -> Result<String, Figure> {
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match out.status.code() {
            Some(0) => Ok(stdout),
            Some(3) => Err(Figure::NotApplicable(stdout)),
            _ => {
                let err = String::from_utf8_lossy(&out.stderr);
                let last = err
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                Err(Figure::Failed(format!("{} ({})", out.status, last.trim())))
            }
        }
    }

    /// `n` uncontended lock + unlock cycles over `urls`: cycles per second.
    pub(crate) fn cycles(&self, n: usize, urls: &[String]) -> Figure {
        let mut args = vec!["cycles".to_owned(), n.to_string()];
        args.extend_from_slice(urls);
        self.figure(&args)
    }

    /// Runs the peer with `args` (a mode that prints one number, e.g. `rw-cycles read N URL`):
    /// that number.
    pub(crate) fn figure(&self, args: &[String]) -> Figure {
        let out = match Command::new(&self.run)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => o,
            Err(e) => return Figure::Failed(e.to_string()),
        };
        match self.outcome(out) {
            Ok(text) => text
                .parse()
                .map(Figure::Value)
                .unwrap_or_else(|_| Figure::Failed(format!("printed {text:?}"))),
            Err(f) => f,
        }
    }

    /// Starts one process of `mode` (`contend` or `handoff`) with `args`; its stderr goes to
    /// a file.
    pub(crate) fn start(
        &self,
        mode: &str,
        args: &[String],
    ) -> std::io::Result<(std::process::Child, PathBuf)> {
        let (err, path) = stderr_file();
        Command::new(&self.run)
            .arg(mode)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map(|c| (c, path))
    }

    /// The JSON object a process started by [`start`](Self::start) printed once it has
    /// finished; killed (and failed) if it runs past `deadline`.
    pub(crate) fn finish(
        &self,
        (mut child, err): (std::process::Child, PathBuf),
        deadline: std::time::Instant,
    ) -> Result<serde_json::Value, Figure> {
        // Its stdout is read as it goes (a long event list would fill the pipe).
        let mut stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
            text
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if std::time::Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_file(&err);
                    return Err(Figure::Failed("still running long after its end".into()));
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(e) => return Err(Figure::Failed(e.to_string())),
            }
        };
        let text = reader.join().unwrap_or_default().trim().to_owned();
        let why = last_error(&err);
        match status.code() {
            Some(0) => serde_json::from_str(&text)
                .map_err(|_| Figure::Failed(format!("printed {text:?} ({why})"))),
            Some(3) => Err(Figure::NotApplicable(text)),
            _ => Err(Figure::Failed(format!("{status} ({why})"))),
        }
    }

    /// `renew URL N MILLIS TTL_MS`: the peer takes N locks with its automatic renewal, prints
    /// `ready` (then `at_ready` runs), holds them for MILLIS, prints
    /// `{"held": h, "cpu_s": c, "seconds": s}` (its CPU over the window), and releases them
    /// once we answer with a line. Returns (held, cpu_s, seconds).
    pub(crate) fn renew(
        &self,
        url: &str,
        n: usize,
        window: std::time::Duration,
        ttl: std::time::Duration,
        at_ready: impl FnOnce(),
    ) -> Result<(usize, f64, f64), Figure> {
        use std::io::{BufRead, Write};
        let (err, err_path) = stderr_file();
        let mut child = Command::new(&self.run)
            .args([
                "renew",
                url,
                &n.to_string(),
                &window.as_millis().to_string(),
                &ttl.as_millis().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| Figure::Failed(e.to_string()))?;
        // Ten thousand locks can take an interpreter minutes to set up; past this it has hung.
        let pid = child.id().to_string();
        let limit = window + std::time::Duration::from_secs(600);
        let (done, timer) = std::sync::mpsc::channel::<()>();
        let killer = std::thread::spawn(move || {
            if timer.recv_timeout(limit).is_err() {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        });
        let finished = move || {
            let _ = done.send(());
            let _ = killer.join();
        };
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        if first.trim() != "ready" {
            // It said why (n/a), or failed: either way it is ending by itself.
            drop(child.stdin.take());
            let out = child
                .wait_with_output()
                .map_err(|e| Figure::Failed(e.to_string()));
            finished();
            return Err(match out {
                Ok(o) if o.status.code() == Some(3) => {
                    Figure::NotApplicable(first.trim().to_owned())
                }
                Ok(o) => Figure::Failed(format!(
                    "{} {} ({})",
                    o.status,
                    first.trim(),
                    last_error(&err_path)
                )),
                Err(f) => f,
            });
        }
        at_ready();
        let figures = lines.next().and_then(Result::ok).unwrap_or_default();
        if let Some(mut stdin) = child.stdin.take() {
            let _ = writeln!(stdin);
        }
        let _ = child.wait();
        finished();
        let why = last_error(&err_path);
        let v: serde_json::Value = serde_json::from_str(&figures)
            .map_err(|_| Figure::Failed(format!("printed {figures:?} ({why})")))?;
        Ok((
            v["held"].as_u64().unwrap_or(0) as usize,
            v["cpu_s"].as_f64().unwrap_or(0.0),
            v["seconds"].as_f64().unwrap_or(1.0),
        ))
    }
}
