//! The library's own log, kept in memory for a test to show when it fails: a flaky failure
//! in CI is then explained by what the client did just before, not only by its symptom.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// The `distlock` debug events of this test process, newest last (all its tests together).
#[derive(Debug, Clone, Default)]
pub struct Logs {
    lines: Arc<Mutex<Vec<u8>>>,
}

/// The most kept, in bytes; older lines go first.
const KEPT: usize = 1 << 20;

impl Logs {
    /// Starts keeping the log (once per process; later calls return the same log).
    pub fn capture() -> Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let writer = logs.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            // A test binary that set its own keeps it: this log then stays empty.
            let _ = tracing::subscriber::set_global_default(subscriber);
            logs
        })
        .clone()
    }

    /// The last `n` lines that contain `needle`.
    pub fn tail(&self, needle: &str, n: usize) -> String {
        let all = self.lines.lock().unwrap();
        let text = String::from_utf8_lossy(&all);
        let hits: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
        hits[hits.len().saturating_sub(n)..].join("\n")
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut all = self.lines.lock().unwrap();
        all.extend_from_slice(buf);
        if all.len() > KEPT {
            let cut = all.len() - KEPT / 2;
            all.drain(..cut);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Logs;

    #[test]
    fn keeps_the_librarys_events() {
        let logs = Logs::capture();
        tracing::debug!(target: "distlock", key = "k1", "an event of the library");
        tracing::trace!(target: "distlock", "too fine to keep");
        let tail = logs.tail("k1", 5);
        assert!(tail.contains("an event of the library"), "{tail:?}");
        assert!(logs.tail("too fine", 5).is_empty());
    }
}
