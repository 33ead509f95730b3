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
        let out = match Command::new(&self.run)
            .arg("cycles")
            .arg(n.to_string())
            .args(urls)
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

    /// Starts one contending process (see the README's `contend`).
    pub(crate) fn contend(
        &self,
        url: &str,
        tasks: usize,
        start_ns: u64,
        millis: u64,
        hold_us: u64,
    ) -> std::io::Result<std::process::Child> {
        Command::new(&self.run)
            .args([
                "contend",
                url,
                &tasks.to_string(),
                &start_ns.to_string(),
                &millis.to_string(),
                &hold_us.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    /// The acquisitions and errors a contending process printed once it has finished; killed
    /// (and failed) if it runs past `deadline`.
    pub(crate) fn contended(
        &self,
        mut child: std::process::Child,
        deadline: std::time::Instant,
    ) -> Result<(u64, u64), Figure> {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if std::time::Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Figure::Failed("still running long after its end".into()));
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(e) => return Err(Figure::Failed(e.to_string())),
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|e| Figure::Failed(e.to_string()))?;
        let text = self.outcome(out)?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|_| Figure::Failed(format!("printed {text:?}")))?;
        Ok((
            v["acquisitions"].as_u64().unwrap_or(0),
            v["errors"].as_u64().unwrap_or(0),
        ))
    }
}
