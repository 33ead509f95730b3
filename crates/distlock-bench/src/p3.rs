//! P3: hand-off latency, unloaded: release sent → the other process acquired, in round trips,
//! beside a raw redis-rs floor and the peers.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_testkit::RedisServer;

use crate::common::{median, mono_ns};
use crate::p2::Contention;
use crate::peers;

/// A peer's P3: hand-offs counted, p50 and p99 in µs; or why there are none.
pub(crate) type HandoffFigures = Result<(u64, f64, f64), peers::Figure>;

/// P3 of a peer: two of its processes take turns (hold 3 ms, pause 0.3 ms), each waiting its
/// own way; the release → other process acquired times, in µs (count, p50, p99).
pub(crate) fn peer_handoff(
    server: &RedisServer,
    peer: &peers::Peer,
    millis: u64,
) -> HandoffFigures {
    let start_ns = mono_ns() + 2_000_000_000;
    let deadline = Instant::now() + Duration::from_millis(2000 + millis) + Duration::from_secs(30);
    let args = [
        server.url(),
        "3000".into(),
        "300".into(),
        start_ns.to_string(),
        millis.to_string(),
    ];
    let children: Vec<_> = (0..2)
        .map(|_| peer.start("handoff", &args))
        .collect::<Result<_, _>>()
        .map_err(|e| peers::Figure::Failed(e.to_string()))?;
    // (acquired, release sent, asked, process)
    let mut events: Vec<(u64, u64, u64, usize)> = Vec::new();
    for (p, c) in children.into_iter().enumerate() {
        let v = peer.finish(c, deadline)?;
        for e in v["events"].as_array().into_iter().flatten() {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            events.push((f(0), f(1), f(2), p));
        }
    }
    events.sort_by_key(|e| e.0);
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for w in events.windows(2) {
        let (prev, next) = (w[0], w[1]);
        // A hand-off: the other process was already waiting when this release began.
        if next.3 != prev.3 && next.2 <= prev.1 && next.0 >= prev.1 {
            let _ = h.record(next.0 - prev.1);
        }
    }
    if h.is_empty() {
        return Err(peers::Figure::Failed(
            "no hand-off between the two processes".into(),
        ));
    }
    Ok((
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
    ))
}

/// Interleaved rounds of the unloaded hand-off (P3).
pub(crate) const P3_ROUNDS: usize = 5;

/// One round of P3: its unit, both modes, and the raw floor's p50 (µs).
pub(crate) struct P3Round {
    pub(crate) idle_rtt: f64,
    pub(crate) modes: [Contention; 2],
    pub(crate) raw: f64,
}

/// A P3 line: medians over the rounds, each ratio to its own round's idle round trip.
pub(crate) struct P3Row {
    pub(crate) name: &'static str,
    pub(crate) count: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) idle_rtts: f64,
    pub(crate) worst_idle_rtts: f64,
}

impl P3Row {
    /// `pick`: a round's hand-off count, p50 and p99 (µs).
    pub(crate) fn of(
        rounds: &[P3Round],
        name: &'static str,
        pick: impl Fn(&P3Round) -> (u64, f64, f64),
    ) -> P3Row {
        let picked: Vec<(u64, f64, f64, f64)> = rounds
            .iter()
            .map(|r| {
                let (n, p50, p99) = pick(r);
                (n, p50, p99, p50 / r.idle_rtt.max(f64::MIN_POSITIVE))
            })
            .collect();
        P3Row {
            name,
            count: picked.iter().map(|p| p.0).sum(),
            p50_us: median(picked.iter().map(|p| p.1).collect()),
            p99_us: median(picked.iter().map(|p| p.2).collect()),
            idle_rtts: median(picked.iter().map(|p| p.3).collect()),
            worst_idle_rtts: picked.iter().map(|p| p.3).fold(0.0, f64::max),
        }
    }
}

/// The raw floor's lock, its keys and its waiter's channel.
pub(crate) const RAW_KEYS: [&str; 4] = [
    "distlock:{rawbench}",
    "distlock:{rawbench}:meta",
    "distlock:{rawbench}:waiters",
    "distlock:{rawbench}:fence",
];
pub(crate) const RAW_CHANNEL: &str = "distlock:wake:rawbench";

/// The raw floor's waiter: redis-rs's blocking pub/sub, stamping each message as it is read.
pub(crate) fn raw_waiter(url: &str, count: usize) {
    let client = redis::Client::open(url).expect("client");
    let mut con = client.get_connection().expect("connection");
    let mut ps = con.as_pubsub();
    ps.subscribe(RAW_CHANNEL).expect("subscribe");
    ps.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        if ps.get_message().is_err() {
            break;
        }
        got.push(mono_ns());
    }
    println!("{}", serde_json::json!(got));
}

/// The raw floor's holder: writes the lock and queues the waiter's registration, pauses 3 ms,
/// then sends what a distlock release sends (a `PING`, then the release script by SHA) with
/// redis-rs's blocking connection, stamping the moment before.
pub(crate) fn raw_holder(url: &str, count: usize, start_ns: u64) {
    let client = redis::Client::open(url).expect("client");
    let mut con = client.get_connection().expect("connection");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(distlock_redis::release_script())
        .query(&mut con)
        .expect("load the release script");
    let now = mono_ns();
    if start_ns > now {
        std::thread::sleep(Duration::from_nanos(start_ns - now));
    }
    let mut sent = Vec::with_capacity(count);
    for i in 0..count {
        let _: () = redis::pipe()
            .cmd("SET")
            .arg(RAW_KEYS[0])
            .arg(format!("raw{i} 0 raw"))
            .arg("PX")
            .arg(30_000)
            .ignore()
            .cmd("RPUSH")
            .arg(RAW_KEYS[2])
            .arg(format!("{RAW_CHANNEL} 30000 {i} raw{} raw", i + 1))
            .ignore()
            .query(&mut con)
            .expect("set up a hand-over");
        std::thread::sleep(Duration::from_millis(3));
        let at = mono_ns();
        let (_, handed): (String, i64) = redis::pipe()
            .cmd("PING")
            .cmd("EVALSHA")
            .arg(&sha)
            .arg(RAW_KEYS.len())
            .arg(&RAW_KEYS[..])
            .arg(format!("raw{i}"))
            .arg(wall_ms())
            .query(&mut con)
            .expect("release");
        assert_eq!(handed, 2, "the release handed the lock over");
        sent.push(at);
    }
    println!("{}", serde_json::json!(sent));
}

pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The raw-client floor of the unloaded hand-off: release sent -> the waiter read the message,
/// p50 in µs, over `count` hand-overs between two processes.
pub(crate) async fn raw_handoff(server: &RedisServer, count: usize) -> f64 {
    let exe = std::env::current_exe().expect("own path");
    let url = server.url();
    let waiter = tokio::process::Command::new(&exe)
        .args(["raw-waiter", "--url", &url, "--count", &count.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the raw waiter");
    let start_ns = (mono_ns() + 300_000_000).to_string();
    let holder = tokio::process::Command::new(&exe)
        .args(["raw-holder", "--url", &url, "--count", &count.to_string()])
        .args(["--start-ns", &start_ns])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the raw holder");
    let stamps = |out: std::process::Output| -> Vec<u64> {
        serde_json::from_slice(&out.stdout).expect("raw client JSON")
    };
    let sent = stamps(holder.wait_with_output().await.expect("raw holder"));
    let got = stamps(waiter.wait_with_output().await.expect("raw waiter"));
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for (s, g) in sent.iter().zip(&got) {
        let _ = h.record(g.saturating_sub(*s));
    }
    server.cli(&["DEL", RAW_KEYS[0], RAW_KEYS[1], RAW_KEYS[2], RAW_KEYS[3]]);
    h.value_at_quantile(0.5) as f64 / 1000.0
}
