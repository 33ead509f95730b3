//! P7's tables.

use super::*;

impl P7 {
    /// The P7 tables, as Markdown lines.
    pub(crate) fn render(&self, pinning: &str) -> String {
        let mut s = String::new();
        macro_rules! outln {
            ($($t:tt)*) => {{
                s.push_str(&format!($($t)*));
                s.push('\n');
            }};
        }
        let names = &self.peer_names;
        outln!(
            "P7 read-write locks and semaphores, uncontended acquire+release, one client ({pinning}), {} round(s) × {} cycles, medians",
            self.rounds,
            self.cycles
        );
        outln!(
            "| kind | raw floor (redis-rs async; server clock, a lease per holder) | floor cycles/s | distlock cycles/s | distlock / floor | commands sent per cycle (floor / distlock) | server calls per cycle (floor / distlock) | server CPU µs per cycle (floor / distlock) |{}",
            names
                .iter()
                .map(|n| format!(" {n} cycles/s |"))
                .collect::<String>()
        );
        outln!(
            "|---|---|---:|---:|---:|---:|---:|---:|{}",
            "---:|".repeat(names.len())
        );
        for r in &self.cycle_rows {
            outln!(
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} |{}",
                r.kind.name(),
                r.kind.floor_name(),
                r.floor,
                r.ours,
                r.ratio,
                r.floor_cmds,
                r.ours_cmds,
                r.floor_calls,
                r.ours_calls,
                r.floor_cpu_us,
                r.ours_cpu_us,
                self.kept(&r.peers)
                    .map(|f| format!(" {} |", f.cell(0)))
                    .collect::<String>()
            );
        }
        outln!(
            "distlock / floor is the median of the rounds' ratios. Peers: the writer row is a peer's writer or mutex (redis-semaphore's Mutex), the permit row its Semaphore(4).{}",
            if self.left_out.is_empty() {
                String::new()
            } else {
                format!(
                    " Left out (no read-write lock or semaphore): {}.",
                    self.left_out.join(", ")
                )
            }
        );
        outln!("");
        outln!(
            "P7 one hot name, a semaphore of {PERMITS} permits, {} processes, zero hold, {} ms per run; each library waits its own way",
            PROCESSES,
            self.millis
        );
        outln!(
            "| client | waiters | acq/s | fairness (min/max per process) | commands sent per acq | server calls per acq | longest wait ms | errors |"
        );
        outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for h in &self.hot {
            outln!(
                "| distlock semaphore | {} ({} × {}) | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {} |",
                h.waiters,
                h.processes,
                h.waiters / h.processes,
                h.per_sec,
                h.fairness,
                h.cmds_per_acq,
                h.calls_per_acq,
                h.longest_wait_ms,
                h.errors
            );
        }
        let shape = self.mix_shape;
        for c in &self.hot_peers {
            outln!("{}", peer_hot_row(c, shape));
        }
        outln!("");
        outln!(
            "P7 one hot exclusive key (a writer; the peers' mutex or writer), {} × {}, zero hold, {} ms",
            shape.0,
            shape.1,
            self.millis
        );
        outln!(
            "| client | waiters | acq/s | fairness (min/max per process) | commands sent per acq | server calls per acq | longest wait ms | errors |"
        );
        outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
        let m = &self.hot_mutex;
        outln!(
            "| distlock write_lock | {} ({} × {}) | {:.0} | {:.2} | {:.2} | {:.2} | - | 0 |",
            m.waiters,
            m.processes,
            m.waiters / m.processes,
            m.per_sec,
            m.fairness,
            m.cmds_per_acq,
            m.calls_per_acq
        );
        for c in &self.hot_mutex_peers {
            outln!("{}", peer_hot_row(c, shape));
        }
        outln!("");
        outln!(
            "P7 {}% read / {}% write on one read-write lock, {} processes × {} tasks, zero hold, {} ms; distlock's tasks wait at most until 5 s past the end (longer: an error)",
            100 - WRITE_PCT,
            WRITE_PCT,
            shape.0,
            shape.1,
            self.millis
        );
        outln!(
            "| client | acq/s | reader acquisitions | writer acquisitions | fairness (min/max per process) | commands sent per acq | server calls per acq | longest wait ms | errors |"
        );
        outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        outln!("{}", mix_row("distlock read_lock / write_lock", &self.mix));
        for (name, r) in &self.mix_peers {
            match r {
                Ok(m) => outln!("{}", mix_row(name, m)),
                Err(f) => outln!("| {name} | {} | | | | | | | |", f.cell(0)),
            }
        }
        s
    }

    /// The figures of the peers kept in the tables, out of every peer's (in peer-list order).
    fn kept<'a>(&'a self, figs: &'a [Figure]) -> impl Iterator<Item = &'a Figure> + 'a {
        figs.iter()
            .zip(&self.keep)
            .filter(|(_, k)| **k)
            .map(|(f, _)| f)
    }

    /// The bars of P7: (name, figure, met).
    pub(crate) fn bars(&self) -> Vec<(String, Option<f64>, bool)> {
        let mut v: Vec<(String, Option<f64>, bool)> = self
            .cycle_rows
            .iter()
            .map(|r| {
                (
                    format!("P7 {} cycle ≥ 0.9× its raw floor", r.kind.name()),
                    Some(r.ratio),
                    r.ratio >= 0.9,
                )
            })
            .collect();
        let top = self.hot.last();
        v.push((
            "P7 semaphore fairness ≥ 0.8 (most waiters)".into(),
            top.map(|h| h.fairness),
            top.is_some_and(|h| h.fairness >= 0.8),
        ));
        // Flat: the most waiters' commands per acquisition within 20% of the fewest's.
        let flat = match (self.hot.first(), self.hot.last()) {
            (Some(a), Some(b)) if self.hot.len() > 1 => Some(b.cmds_per_acq / a.cmds_per_acq),
            _ => None,
        };
        v.push((
            format!(
                "P7 semaphore commands per acquisition flat from {} to {} waiters (ratio ≤ 1.2)",
                self.hot.first().map_or(0, |h| h.waiters),
                self.hot.last().map_or(0, |h| h.waiters)
            ),
            flat,
            flat.is_some_and(|f| f <= 1.2),
        ));
        v
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let peer_hot = |c: &PeerContention| match &c.result {
            Ok(r) => serde_json::json!({
                "client": c.name, "per_sec": r.per_sec, "fairness": r.fairness,
                "server_calls_per_acq": r.calls_per_acq, "errors": r.errors,
            }),
            Err(f) => serde_json::json!({ "client": c.name, "result": f.json() }),
        };
        let mix = |m: &Mix| {
            serde_json::json!({
                "per_sec": m.per_sec, "reads": m.reads, "writes": m.writes,
                "fairness": m.fairness, "cmds_per_acq": m.cmds_per_acq,
                "server_calls_per_acq": m.calls_per_acq, "errors": m.errors,
                "longest_wait_ms": m.longest_wait_ms,
            })
        };
        serde_json::json!({
            "rounds": self.rounds, "cycles": self.cycles, "millis": self.millis,
            "permits": PERMITS, "write_pct": WRITE_PCT,
            "cycle": self.cycle_rows.iter().map(|r| serde_json::json!({
                "kind": r.kind.name(), "floor": r.kind.floor_name(),
                "floor_per_sec": r.floor, "distlock_per_sec": r.ours, "ratio": r.ratio,
                "floor_cmds": r.floor_cmds, "distlock_cmds": r.ours_cmds,
                "floor_server_calls": r.floor_calls, "distlock_server_calls": r.ours_calls,
                "floor_server_cpu_us": r.floor_cpu_us, "distlock_server_cpu_us": r.ours_cpu_us,
                "peers": self.peer_names.iter().zip(self.kept(&r.peers))
                    .map(|(n, f)| (n.clone(), f.json()))
                    .collect::<serde_json::Map<_, _>>(),
            })).collect::<Vec<_>>(),
            "hot_semaphore": self.hot.iter().map(|h| serde_json::json!({
                "waiters": h.waiters, "processes": h.processes, "per_sec": h.per_sec,
                "fairness": h.fairness, "cmds_per_acq": h.cmds_per_acq,
                "server_calls_per_acq": h.calls_per_acq, "longest_wait_ms": h.longest_wait_ms,
                "errors": h.errors,
            })).collect::<Vec<_>>(),
            "hot_semaphore_peers": self.hot_peers.iter().map(peer_hot).collect::<Vec<_>>(),
            "hot_mutex": {
                "waiters": self.hot_mutex.waiters, "per_sec": self.hot_mutex.per_sec,
                "fairness": self.hot_mutex.fairness, "cmds_per_acq": self.hot_mutex.cmds_per_acq,
                "server_calls_per_acq": self.hot_mutex.calls_per_acq,
            },
            "hot_mutex_peers": self.hot_mutex_peers.iter().map(peer_hot).collect::<Vec<_>>(),
            "mix": mix(&self.mix),
            "mix_peers": self.mix_peers.iter().map(|(n, r)| match r {
                Ok(m) => serde_json::json!({ "client": n, "figures": mix(m) }),
                Err(f) => serde_json::json!({ "client": n, "result": f.json() }),
            }).collect::<Vec<_>>(),
        })
    }
}

/// `text` with a blank line on both sides of every table, as Markdown wants (the full report's
/// page does the same for its own text).
pub(crate) fn spaced(text: &str) -> String {
    let mut page = String::new();
    let mut prev_table = false;
    for line in text.lines() {
        let table = line.starts_with('|');
        if table != prev_table && !line.is_empty() {
            page.push('\n');
        }
        page.push_str(line);
        page.push('\n');
        prev_table = table;
    }
    page
}

fn peer_hot_row(c: &PeerContention, (p, t): (usize, usize)) -> String {
    match &c.result {
        Ok(r) => format!(
            "| {} | {} ({p} × {t}) | {:.0} | {:.2} | - | {:.2} | - | {} |",
            c.name,
            p * t,
            r.per_sec,
            r.fairness,
            r.calls_per_acq,
            r.errors
        ),
        Err(f) => format!("| {} | {} | {} | | | | | |", c.name, p * t, f.cell(0)),
    }
}

fn mix_row(name: &str, m: &Mix) -> String {
    format!(
        "| {name} | {:.0} | {} | {} | {:.2} | {} | {:.2} | {} | {} |",
        m.per_sec,
        m.reads,
        m.writes,
        m.fairness,
        m.cmds_per_acq.map_or("-".to_owned(), |c| format!("{c:.2}")),
        m.calls_per_acq,
        m.longest_wait_ms
            .map_or("-".to_owned(), |w| format!("{w:.0}")),
        m.errors
    )
}
