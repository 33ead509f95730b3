//! P10 across a deployment: a Redis Cluster of 3 masters, and client processes that each take
//! their share of the names one by one (TTL 30 s) and hold them for three TTLs while their
//! watchdogs renew them. The parent reads the masters' memory once every client holds its
//! names, and their CPU while the names are held. Unpinned: three servers and several
//! clients on this machine's CPUs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::RedisCluster;
use serde_json::Value;

use super::{cpu_of, rss_of};

/// The TTL the issue fixes for the deployment.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// The masters.
const MASTERS: usize = 3;

/// The run's figures.
pub(crate) struct Deployment {
    pub(crate) clients: Vec<Value>,
    pub(crate) names: usize,
    /// The masters' resident memory with every name held, over theirs before, in bytes.
    pub(crate) server_bytes: i64,
    /// The masters' CPU over one TTL while every name was held, as a share of one core (all
    /// together).
    pub(crate) server_cpu: f64,
    /// From the first client started to the last one holding all its names.
    pub(crate) all_acquired_s: f64,
}

impl Deployment {
    pub(crate) fn held_after(&self) -> u64 {
        self.clients
            .iter()
            .map(|c| c["held_after"].as_u64().unwrap_or(0))
            .sum()
    }

    fn refused(&self) -> (u64, u64) {
        self.clients.iter().fold((0, 0), |(r, s), c| {
            let sample = c["sample"].as_u64().unwrap_or(0);
            let taken = c["sample_taken_by_other"].as_u64().unwrap_or(sample);
            (r + sample.saturating_sub(taken), s + sample)
        })
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::json!({
            "masters": MASTERS,
            "names": self.names,
            "clients": self.clients,
            "server_bytes": self.server_bytes,
            "server_cpu": self.server_cpu,
            "all_acquired_s": self.all_acquired_s,
        })
    }
}

/// `clients` processes of `per_client` names each against a Cluster started here.
pub(crate) fn run(clients: usize, per_client: usize) -> Option<Deployment> {
    let Some(cluster) = RedisCluster::start(MASTERS) else {
        eprintln!("p10 cluster: no redis-server");
        return None;
    };
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.process_id()).collect();
    let memory = || pids.iter().map(|&p| rss_of(p)).sum::<u64>();
    let cpu = || pids.iter().map(|&p| cpu_of(p)).sum::<f64>();
    let url = cluster.url("");
    let exe = std::env::current_exe().expect("own path");
    let before = memory();
    let started = Instant::now();
    let mut children: Vec<_> = (0..clients)
        .map(|k| {
            Command::new(&exe)
                .args(["p10-client", "--url", &url, "--names"])
                .arg(per_client.to_string())
                .args(["--ttl-ms", &TTL.as_millis().to_string(), "--prefix"])
                .arg(format!("c{k}"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a P10 client")
        })
        .collect();
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("stdout")).lines())
        .collect();
    for (k, lines) in readers.iter_mut().enumerate() {
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, "acquired", "P10 cluster client {k}");
    }
    let all_acquired_s = started.elapsed().as_secs_f64();
    let (held_memory, cpu0, t0) = (memory(), cpu(), Instant::now());
    // One TTL of renewals: every client holds all along (each holds three TTLs from the end
    // of its own acquisitions, and the last of them ended before this window began).
    std::thread::sleep(TTL);
    let server_cpu = (cpu() - cpu0) / t0.elapsed().as_secs_f64();
    let mut figures = Vec::new();
    for (k, lines) in readers.iter_mut().enumerate() {
        let last = lines.next().and_then(Result::ok).unwrap_or_default();
        figures.push(
            serde_json::from_str::<Value>(&last)
                .unwrap_or_else(|e| panic!("P10 cluster client {k}'s figures ({e}): {last:?}")),
        );
    }
    for (k, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait for a P10 client");
        assert!(status.success(), "P10 cluster client {k}: {status}");
    }
    Some(Deployment {
        clients: figures,
        names: clients * per_client,
        server_bytes: held_memory as i64 - before as i64,
        server_cpu,
        all_acquired_s,
    })
}

/// The table.
pub(crate) fn render(d: &Deployment) -> String {
    let n = d.clients.len();
    let mut out = format!(
        "P10 across a deployment: a Redis Cluster of {MASTERS} masters, {n} client processes \
         of {} names each, TTL {} s, held {} s (unpinned)\n\n\
         | client | acquire all | client CPU holding | held after 3 TTLs | client bytes/lock |\n\
         |---:|---:|---:|---:|---:|\n",
        d.names / n.max(1),
        TTL.as_secs(),
        TTL.as_secs() * 3
    );
    for (k, c) in d.clients.iter().enumerate() {
        let f = |key: &str| c[key].as_f64().unwrap_or(f64::NAN);
        let grown = f("rss_held").max(f("rss_end")) - f("rss_before");
        out.push_str(&format!(
            "| {k} | {:.1} s | {:.1} % | {} | {:.0} |\n",
            f("acquire_s"),
            f("hold_cpu_s") / f("hold_s") * 100.0,
            c["held_after"].as_u64().unwrap_or(0),
            grown.max(0.0) / f("names"),
        ));
    }
    let (refused, sample) = d.refused();
    let held = d.held_after();
    out.push_str(&format!(
        "\n- held after 3 TTLs: {held}/{} ({}); a sample refused to another client: \
         {refused}/{sample}\n\
         - every client holding all its names {:.1} s after the first started\n\
         - the masters' CPU while held: {:.1} % of a core, all together\n\
         - the masters' memory per held lock: {:.0} B (resident set, all together)\n",
        d.names,
        if held == d.names as u64 && refused == sample {
            "bar met"
        } else {
            "bar **not met**"
        },
        d.all_acquired_s,
        d.server_cpu * 100.0,
        d.server_bytes as f64 / d.names as f64,
    ));
    out
}
