//! The state of one run, shared by the orchestrator's loop (`run`) and the fault injector
//! (`faults`): the worker processes and their links, the protected resources, the engine, the
//! history, and the faults that could not be injected.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_testkit::FaultProxy;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::engine::Engine;
use crate::netns::NetNs;
use crate::resource::Register;

/// One worker process and its links.
pub(crate) struct Worker {
    pub(crate) child: Child,
    /// Lines for its stdin, written by a task that owns the pipe.
    pub(crate) input: mpsc::UnboundedSender<String>,
    pub(crate) pid: i32,
    /// Its proxies, one per server.
    pub(crate) proxies: Vec<FaultProxy>,
    /// Its network namespace, where partitions are nftables rules.
    pub(crate) netns: Option<NetNs>,
    /// The file libfaketime reads this worker's clock offset from.
    pub(crate) faketime: Option<PathBuf>,
    /// The operation in progress, if any.
    pub(crate) op: Option<u64>,
    /// It holds the lock for this operation.
    pub(crate) holding: Option<u64>,
    /// Everything it holds now: the one lock's operation, or a group member's ownerships of
    /// partitions (`holding` is the latest of them).
    pub(crate) owning: Vec<u64>,
    pub(crate) paused: bool,
    /// Its last acquire failed: the next operation starts after a pause, as a client backs
    /// off (an engine that fails fast while it is unreachable would make a tight loop).
    pub(crate) backoff: bool,
}

/// The state of one run, shared by the orchestrator's loop and the fault injector.
pub(crate) struct RunState {
    pub(crate) workers: Vec<Worker>,
    pub(crate) history: History,
    pub(crate) fenced: Register,
    pub(crate) unfenced: Register,
    /// The registers of the other names (fenced, unfenced): a multi-name scenario's.
    pub(crate) keyed: std::collections::HashMap<String, (Register, Register)>,
    pub(crate) engine: Engine,
    /// A pause waits for the next worker that checks its lease before writing.
    pub(crate) pause_at_check: Option<Duration>,
    /// A client clock jump waits for the next worker under libfaketime that takes the lock:
    /// seconds back, and how long it is paused.
    pub(crate) jump_at_acquire: Option<(u64, Duration)>,
    /// Faults the injector could not inject (a missing tool, a failed signal): any one fails
    /// the run, since its "no violation" would be about faults that never happened.
    pub(crate) not_injected: Vec<String>,
    pub(crate) stopping: bool,
    /// Faults under way in tasks of their own (a worker's pause, a client clock jump), each
    /// recorded when it ends: the run waits for them before it stops.
    pub(crate) recording: usize,
    pub(crate) next_op: u64,
    /// The run's bite (`bite.rs`): a holder whose lease a fault breaks on purpose.
    pub(crate) bite: crate::bite::Bite,
}

/// The history: every event, in memory and as JSON lines.
pub(crate) struct History {
    pub(crate) events: Vec<Value>,
    pub(crate) out: BufWriter<File>,
}

impl History {
    pub(crate) fn create(path: &Path) -> std::io::Result<History> {
        Ok(History {
            events: Vec::new(),
            out: BufWriter::new(File::create(path)?),
        })
    }

    pub(crate) fn record(&mut self, v: Value) {
        let _ = writeln!(self.out, "{v}");
        self.events.push(v);
    }
}

pub(crate) type SharedRef = Arc<Mutex<RunState>>;

pub(crate) fn lock(s: &SharedRef) -> std::sync::MutexGuard<'_, RunState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fault that could not be injected: recorded in the history and kept, so that the run
/// fails at its end (a "no violation" about a fault that never happened proves nothing).
pub(crate) fn not_injected(shared: &SharedRef, what: String, why: String) {
    eprintln!("distlock-faults: could not inject {what}: {why}");
    let mut s = lock(shared);
    s.history
        .record(json!({"ev": "fault-not-injected", "what": what, "why": why,
        "t": crate::mono::now_ns()}));
    s.not_injected.push(format!("{what}: {why}"));
}
