//! P10: many locks held by one client. On each engine (started here), a client process takes
//! N names one by one (TTL 3 s), holds them for three TTLs while its watchdog renews them, and
//! reports: the time to take them, its CPU while holding, how many it still holds, whether
//! another client is refused a sample of them, and its memory per held lock (resident set over
//! its baseline after warm-up). The parent reads the server's memory with every name held and
//! its CPU while they are held.
//!
//! One client process per engine and size, pinned with the server to CPU 0 unless `--no-pin`;
//! the bars compare sizes of the same run.
//!
//! The other parts of P10 (`--part`): `cluster.rs` (a million locks over a Redis Cluster by
//! four clients), `waiters.rs` (1,024 waiters on one hot name beside 64), `stampede.rs` (many
//! `distlock run` processes on one name, on every engine).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) mod client;
pub(crate) mod cluster;
pub(crate) mod engines;
pub(crate) mod stampede;
pub(crate) mod waiters;

/// The TTL the issue fixes for these runs (`--p10-ttl` changes it, for probes).
pub(crate) const TTL: Duration = Duration::from_secs(3);

/// One engine at one size.
pub(crate) struct Row {
    pub(crate) engine: &'static str,
    pub(crate) names: usize,
    pub(crate) ttl: Duration,
    /// The client's own figures (see `client.rs`).
    pub(crate) client: Value,
    /// Server memory with every name held, over the server's before the client came.
    pub(crate) server_bytes: i64,
    /// Server CPU while the names were held, as a share of one core.
    pub(crate) server_cpu: f64,
}

impl Row {
    fn f(&self, key: &str) -> f64 {
        self.client[key].as_f64().unwrap_or(f64::NAN)
    }

    pub(crate) fn acquire_s(&self) -> f64 {
        self.f("acquire_s")
    }

    /// Client CPU while holding, as a share of one core.
    pub(crate) fn client_cpu(&self) -> f64 {
        self.f("hold_cpu_s") / self.f("hold_s")
    }

    /// Client memory per held lock, in bytes: the most its resident set grew over the
    /// baseline while holding, per name.
    pub(crate) fn client_bytes_per_lock(&self) -> f64 {
        let grown = self.f("rss_held").max(self.f("rss_end")) - self.f("rss_before");
        grown.max(0.0) / self.names as f64
    }

    pub(crate) fn held_after(&self) -> u64 {
        self.client["held_after"].as_u64().unwrap_or(0)
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::json!({
            "engine": self.engine,
            "names": self.names,
            "ttl_ms": self.ttl.as_millis() as u64,
            "client": self.client,
            "client_cpu": self.client_cpu(),
            "client_bytes_per_lock": self.client_bytes_per_lock(),
            "server_bytes": self.server_bytes,
            "server_cpu": self.server_cpu,
        })
    }
}

/// A server as P10 needs it: its URL, its memory and its CPU so far.
pub(crate) struct Server<'a> {
    pub(crate) engine: &'static str,
    pub(crate) url: String,
    pub(crate) memory: Box<dyn Fn() -> u64 + 'a>,
    pub(crate) cpu: Box<dyn Fn() -> f64 + 'a>,
}

/// Runs one client of `names` locks against `server` and collects its row.
pub(crate) fn measure(server: &Server<'_>, names: usize, pin: bool, ttl: Duration) -> Row {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "p10-client",
        "--url",
        &server.url,
        "--names",
        &names.to_string(),
        "--ttl-ms",
        &ttl.as_millis().to_string(),
    ]);
    if pin {
        cmd.arg("--pin");
    }
    let before = (server.memory)();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a P10 client");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    let first = next();
    assert_eq!(first, "acquired", "P10 client on {}", server.engine);
    let (held_memory, cpu0, t0) = ((server.memory)(), (server.cpu)(), Instant::now());
    let last = next();
    let server_cpu = ((server.cpu)() - cpu0) / t0.elapsed().as_secs_f64();
    let status = child.wait().expect("wait for the P10 client");
    assert!(
        status.success(),
        "P10 client on {}: {status}",
        server.engine
    );
    let client: Value = serde_json::from_str(&last).expect("the client's figures");
    Row {
        engine: server.engine,
        names,
        ttl,
        client,
        server_bytes: held_memory as i64 - before as i64,
        server_cpu,
    }
}

/// The process's resident set (VmRSS), in bytes, for servers the test kit gives a pid only.
pub(crate) fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The CPU a process has used, in seconds (utime + stime of `/proc/<pid>/stat`).
pub(crate) fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

fn bytes_shown(bytes: f64) -> String {
    if bytes.is_nan() {
        "-".into()
    } else {
        format!("{:.0}", bytes)
    }
}

/// The table, and the bars of each engine (its largest size against 10,000).
pub(crate) fn render(rows: &[Row], pinning: &str) -> String {
    let ttl = rows.first().map_or(TTL, |r| r.ttl);
    let mut out = format!(
        "P10 many locks held by one client: N names taken one by one, TTL {} s, held {} s \
         while the watchdog renews them; one client process per row ({pinning})\n\n\
         | engine | N | acquire all | client CPU holding | held after 3 TTLs | refused to another client | client bytes/lock | server bytes/lock | server CPU holding |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        ttl.as_secs_f64(),
        ttl.as_secs_f64() * 3.0
    );
    for r in rows {
        let sample = r.client["sample"].as_u64().unwrap_or(0);
        let taken = r.client["sample_taken_by_other"].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "| {} | {} | {:.2} s | {:.1} % | {} | {}/{} | {} | {} | {:.1} % |\n",
            r.engine,
            r.names,
            r.acquire_s(),
            r.client_cpu() * 100.0,
            r.held_after(),
            sample - taken,
            sample,
            bytes_shown(r.client_bytes_per_lock()),
            bytes_shown(r.server_bytes as f64 / r.names as f64),
            r.server_cpu * 100.0,
        ));
    }
    out.push_str("\nBars (each engine's largest N against its 10,000 row of the same run)\n\n");
    out.push_str("| engine | bar | figure | met |\n|---|---|---:|---|\n");
    for (engine, bar, figure, met) in bars(rows) {
        out.push_str(&format!(
            "| {engine} | {bar} | {figure} | {} |\n",
            if met { "yes" } else { "**no**" }
        ));
    }
    out
}

/// Every bar of the issue that the rows can speak to.
pub(crate) fn bars(rows: &[Row]) -> Vec<(&'static str, &'static str, String, bool)> {
    let mut out = Vec::new();
    let mut engines: Vec<&'static str> = rows.iter().map(|r| r.engine).collect();
    engines.dedup();
    for engine in engines {
        let of = |n: usize| rows.iter().find(|r| r.engine == engine && r.names == n);
        let Some(big) = rows
            .iter()
            .filter(|r| r.engine == engine)
            .max_by_key(|r| r.names)
        else {
            continue;
        };
        out.push((
            engine,
            "all held after 3 TTLs",
            format!("{}/{}", big.held_after(), big.names),
            big.held_after() == big.names as u64
                && big.client["sample_taken_by_other"].as_u64() == Some(0),
        ));
        out.push((
            engine,
            "client CPU ≤ 15 % of a core",
            format!("{:.1} %", big.client_cpu() * 100.0),
            big.client_cpu() <= 0.15,
        ));
        out.push((
            engine,
            "client memory ≤ 512 B per lock",
            format!("{:.0} B", big.client_bytes_per_lock()),
            big.client_bytes_per_lock() <= 512.0,
        ));
        if let Some(ten) = of(10_000).filter(|_| big.names > 10_000) {
            let k = big.names as f64 / 10_000.0;
            let cpu = big.client_cpu() / ten.client_cpu();
            out.push((
                engine,
                "client CPU ≤ 10× the 10,000 row (per 10× N)",
                format!("{cpu:.1}×"),
                cpu <= k,
            ));
            let t = big.acquire_s() / ten.acquire_s();
            out.push((
                engine,
                "acquire all ≤ 11× the 10,000 row (per 10× N)",
                format!("{t:.1}×"),
                t <= 1.1 * k,
            ));
        }
    }
    out
}
