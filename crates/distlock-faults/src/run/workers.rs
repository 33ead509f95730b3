//! The worker processes: spawning one (in its network namespace, behind its proxies, under
//! libfaketime), sending it lines, handing it its next operation, and pausing it.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use distlock_testkit::FaultProxy;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::Msg;
use crate::engine::EngineKind;
use crate::mono;
use crate::netns::NetNs;
use crate::scenario::Scenario;
use crate::state::{SharedRef, Worker, lock, not_injected};

/// How long a worker waits before its next operation after an acquire that failed.
const BACKOFF_MS: u64 = 50;

/// libfaketime, for client clock jumps.
pub(super) const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

pub(super) struct SpawnCfg {
    pub(super) kind: EngineKind,
    pub(super) netns: bool,
    pub(super) ttl: Duration,
    pub(super) seeded_bug: Option<String>,
    pub(super) faketime: bool,
    pub(super) dir: PathBuf,
    pub(super) tag: String,
    pub(super) upstreams: Vec<std::net::SocketAddr>,
}

pub(super) async fn spawn_worker(
    cfg: &SpawnCfg,
    id: usize,
    inc: u64,
    tx: &mpsc::UnboundedSender<Msg>,
) -> Result<Worker, String> {
    let netns = if cfg.netns {
        Some(NetNs::create(id, inc)?)
    } else {
        None
    };
    let ip: IpAddr = netns
        .as_ref()
        .map_or(Ipv4Addr::LOCALHOST, |n| n.host_ip)
        .into();
    let mut proxies = Vec::new();
    for up in &cfg.upstreams {
        proxies.push(
            FaultProxy::start_on(ip, *up)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let ports: Vec<u16> = proxies.iter().map(FaultProxy::port).collect();
    let url = cfg.kind.url(&ip.to_string(), &ports, cfg.ttl);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let stderr = File::create(cfg.dir.join(format!("{}-w{id}-{inc}.log", cfg.tag)))
        .map_err(|e| e.to_string())?;
    let mut cmd = match &netns {
        Some(n) => n.command(&exe),
        None => Command::new(exe),
    };
    cmd.args(["worker", "--url", &url, "--id", &id.to_string()])
        .args(["--inc", &inc.to_string()])
        .args(["--ttl-ms", &cfg.ttl.as_millis().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .env_remove(distlock_core::seeded::ENV);
    if let Some(bug) = &cfg.seeded_bug {
        cmd.env(distlock_core::seeded::ENV, bug);
    }
    let mut faketime = None;
    if cfg.faketime {
        let f = cfg.dir.join(format!("{}-w{id}.faketime", cfg.tag));
        std::fs::write(&f, "+0\n").map_err(|e| e.to_string())?;
        cmd.env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &f)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        faketime = Some(f);
    }
    let mut child = cmd.spawn().map_err(|e| format!("spawn worker: {e}"))?;
    let pid = child.id().ok_or("worker exited at once")? as i32;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let (input, mut lines_in) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(line) = lines_in.recv().await {
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                return;
            }
        }
    });
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let tx = tx.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(Msg::Line(id, inc, v));
            }
        }
        let _ = tx.send(Msg::Exited(id, inc));
    });
    Ok(Worker {
        child,
        input,
        pid,
        proxies,
        netns,
        faketime,
        op: None,
        holding: None,
        owning: Vec::new(),
        paused: false,
        backoff: false,
    })
}

/// Sends a line to a worker (a dead one's closed pipe is ignored: it is being replaced).
pub(super) fn send(shared: &SharedRef, id: usize, v: &Value) {
    let _ = lock(shared).workers[id].input.send(format!("{v}\n"));
}

pub(super) fn next_op(shared: &SharedRef, id: usize, scenario: &Scenario, rng: &mut StdRng) {
    let op = {
        let mut s = lock(shared);
        if s.stopping {
            return;
        }
        let n = s.next_op;
        s.next_op += 1;
        s.workers[id].op = Some(n);
        let mut op = scenario.op(n, rng);
        if std::mem::take(&mut s.workers[id].backoff) {
            op["delay_ms"] = json!(BACKOFF_MS);
        }
        s.bite.sent(n, &op);
        op
    };
    send(shared, id, &op);
}

pub(crate) fn pause_worker(shared: &SharedRef, id: usize, d: Duration) {
    let (pid, holder) = {
        let mut s = lock(shared);
        let w = &mut s.workers[id];
        w.paused = true;
        (w.pid, w.holding)
    };
    let start = mono::now_ns();
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGSTOP) {
        not_injected(shared, format!("pause of worker {id}"), e.to_string());
        lock(shared).workers[id].paused = false;
        return;
    }
    lock(shared).recording += 1;
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGCONT) {
            not_injected(&shared, format!("thaw of worker {id}"), e.to_string());
        }
        let mut s = lock(&shared);
        if s.workers[id].pid == pid {
            s.workers[id].paused = false;
        }
        s.recording -= 1;
        s.history
            .record(json!({"ev": "fault", "kind": "pause-holder", "w": id,
            "holder": holder, "start": start, "end": mono::now_ns(), "t": mono::now_ns(),
            "server_side": false}));
    });
}
