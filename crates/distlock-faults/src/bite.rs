//! The bite (issue 46): once a run, early, the orchestrator makes the scenario's own kind of
//! fault break a holder's lease, so that every scenario whose faults can break one shows it.
//!
//! A lease is broken, for the resource, when its holder writes after its lease ended and after
//! another holder wrote. A correct client checks its lease just before it writes, so that needs
//! the write to come late: the holder stopped between its check and its write (a pause, a
//! client clock jump), its write held in flight (a link fault: the orchestrator serves the
//! resource, so it holds the write as a slow network would), or its lock taken away on the
//! server while it is in its critical section (a forced release, an eviction, a restart
//! without persistence, a server clock jump, a fail-over to a replica that lagged, a reset
//! connection that ends a database session). The orchestrator takes the next holder that
//! checks its lease (a writer, or a permit's holder), applies the fault, and keeps it there
//! until another holder has acquired and written (a semaphore: until as many others hold
//! permits as there are), 6 TTLs at most; then it lets go, so the stale write arrives. This
//! module says which fault bites in which scenario (or why none can) and keeps the bite's
//! state; `bitten.rs` carries it out.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::engine::EngineKind;
use crate::scenario::{Fault, Kinds, Scenario};

/// The faults' turn: the injector holds it for each fault, a bite for the whole bite (here,
/// where both the injector and `bitten.rs` can use it without importing each other).
pub(crate) type Turn = std::sync::Arc<tokio::sync::Mutex<()>>;

/// How a bite breaks the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// SIGSTOP right after the check.
    Pause,
    /// The wall clock set back and SIGSTOP right after the check (libfaketime).
    ClockJump,
    /// Every link of the worker cut (the proxy drops everything), its write held.
    Cut,
    /// Every reply to the worker delayed past the request timeout (its renewals fail while the
    /// server still sees them), its write held.
    Delay,
    /// The lock deleted on the server (an operator's forced release), the write held.
    Steal,
    /// memcached: the lock's item evicted, the write held.
    Evict,
    /// The server's clock jumps 2 TTLs forward (every lock key expires), the write held.
    ServerClock,
    /// The server killed and restarted at once without persistence, the write held.
    RestartVolatile,
    /// A holder that took the lock while the replica was cut off: the master killed, the
    /// replica promoted without its lock, the write held.
    LaggingFailover,
    /// The worker's connections reset (a lost reply): the database session ends, and the
    /// server frees its locks; the write held.
    Reset,
}

impl Kind {
    /// The fault's kind in the history.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Pause => "pause-holder",
            Kind::ClockJump => "client-clock-jump",
            Kind::Cut => "partition",
            Kind::Delay => "delay-replies",
            Kind::Steal => "steal",
            Kind::Evict => "evict",
            Kind::ServerClock => "server-clock-jump",
            Kind::RestartVolatile => "restart-volatile",
            Kind::LaggingFailover => "lagging-failover",
            Kind::Reset => "lose-replies",
        }
    }

    /// Whether the lease is lost on the server's side (violations in its window are caveats).
    pub(crate) fn server_side(self) -> bool {
        matches!(
            self,
            Kind::Steal
                | Kind::Evict
                | Kind::ServerClock
                | Kind::RestartVolatile
                | Kind::LaggingFailover
                | Kind::Reset
        )
    }

    /// Whether the worker process is stopped (SIGSTOP) rather than its write held.
    pub(crate) fn stops(self) -> bool {
        matches!(self, Kind::Pause | Kind::ClockJump)
    }
}

/// What a scenario's bite is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    Bite(Kind),
    /// No fault of the scenario can break a lease, and why.
    Cannot(String),
}

/// Whether the engine loses its locks when its server is killed and restarted at once.
fn restart_loses_locks(e: EngineKind) -> bool {
    matches!(
        e,
        EngineKind::Redis { persist: false } | EngineKind::Memcached | EngineKind::Mysql
    )
}

/// The scenario's bite: the first of its faults, in this order, that can break a lease.
pub(crate) fn plan(s: &Scenario) -> Plan {
    use Fault::*;
    let has = |f: Fault| s.faults.contains(&f);
    let e = s.engine;
    let kind = if has(PauseHolder) {
        Some(Kind::Pause)
    } else if has(ClientClockJump) {
        Some(Kind::ClockJump)
    } else if has(Partition) {
        Some(Kind::Cut)
    } else if has(DelayReplies) {
        Some(Kind::Delay)
    } else if has(Steal) {
        Some(Kind::Steal)
    } else if has(Evict) {
        Some(Kind::Evict)
    } else if has(ServerClockJump) {
        Some(Kind::ServerClock)
    } else if has(LaggingFailover) && e.fails_over_async() {
        Some(Kind::LaggingFailover)
    } else if has(RestartServer) && restart_loses_locks(e) {
        Some(Kind::RestartVolatile)
    } else if has(LoseReplies) && e.connection_bound() {
        Some(Kind::Reset)
    } else {
        None
    };
    if let Some(k) = kind {
        return Plan::Bite(k);
    }
    if s.faults.is_empty() {
        return Plan::Cannot(
            "no faults; a holder that outlives its lease sees it at its check and skips its write"
                .to_owned(),
        );
    }
    let mut why: Vec<&str> = Vec::new();
    for f in &s.faults {
        let reason = match f {
            KillHolder => "a killed holder never writes again",
            LoseReplies => {
                "a lost reply leaves the request done and the lock in place (the client counts \
                 its lease from the send, so it only believes in less of it)"
            }
            PauseServer => {
                "a paused server holds every client back alike, and a holder acts only within \
                 the lease it counted from its request"
            }
            RestartServer if matches!(e, EngineKind::Redlock { .. }) => {
                "a restarted minority of masters leaves the lock on a majority"
            }
            RestartServer => "a restart keeps the locks (persistence)",
            LaggingFailover => {
                "with wait_replicas=1 nothing counts until the replica has it, so a fail-over \
                 keeps every lock"
            }
            _ => continue,
        };
        if !why.contains(&reason) {
            why.push(reason);
        }
    }
    Plan::Cannot(why.join("; "))
}

/// Whether the scenario's holders write the resource (semaphores only read).
pub(crate) fn writes(s: &Scenario) -> bool {
    !matches!(s.kinds, Kinds::Semaphore { .. })
}

/// A bite under way.
#[derive(Debug, Clone)]
pub(crate) struct Active {
    pub(crate) kind: Kind,
    pub(crate) w: usize,
    pub(crate) n: u64,
    pub(crate) pid: i32,
    /// The keys the bitten holder read (the ones whose writes by others land the bite).
    pub(crate) keys: Vec<String>,
    /// Its writes, held until the bite ends.
    pub(crate) held: Vec<Value>,
    /// Another holder wrote one of `keys` since the bite began (a semaphore: every permit was
    /// someone else's at once).
    pub(crate) other_wrote: bool,
    pub(crate) start: i64,
}

/// The bite's state, kept with the run's: what the orchestrator's loop tells it, and the bite
/// under way.
#[derive(Debug, Default)]
pub(crate) struct Bite {
    /// Waiting for the next eligible check: holders acquired at or after this instant
    /// (monotonic ns) qualify.
    pub(crate) armed: Option<i64>,
    pub(crate) active: Option<Active>,
    /// The kind a bite applies, once its task knows it.
    pub(crate) kind: Option<Kind>,
    /// A semaphore's permits (0: not a semaphore): its holders, which only read, are bitten
    /// too, and a bite has taken over once this many others hold permits at once.
    pub(crate) permits: usize,
    /// Each live hold: whether it may be bitten, and when it was granted.
    holds: HashMap<u64, (bool, i64)>,
    /// The keys each live hold read.
    reads: HashMap<u64, Vec<String>>,
    /// Operations whose future is dropped part way: they may never write, so they are not
    /// bitten.
    cancelled: std::collections::HashSet<u64>,
    /// The last bitten hold, once let go, and whether its stale write has arrived since.
    pub(crate) stale: Option<(u64, bool)>,
}

impl Bite {
    /// Operation `n` was handed out (`op` as sent).
    pub(crate) fn sent(&mut self, n: u64, op: &Value) {
        if op.get("end").and_then(Value::as_str) == Some("cancel") {
            self.cancelled.insert(n);
        }
    }

    /// An event from worker `id` (not a resource request); returns the bite this check
    /// started, if it started one (the caller stops the worker for [`Kind::stops`]).
    pub(crate) fn observe(&mut self, id: usize, pid: i32, v: &Value) -> Option<Kind> {
        let n = v.get("n").and_then(Value::as_u64)?;
        let t = v.get("t").and_then(Value::as_i64).unwrap_or(0);
        match (
            v.get("ev").and_then(Value::as_str).unwrap_or(""),
            v.get("f").and_then(Value::as_str).unwrap_or(""),
        ) {
            ("ok", "acquire") => {
                let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
                let eligible = (matches!(kind, "exclusive" | "leader")
                    || (self.permits > 0 && kind == "permit"))
                    && !self.cancelled.contains(&n);
                self.holds.insert(n, (eligible, t));
                None
            }
            ("invoke", "release") | ("abandon", _) | ("cancel", _) | ("done", _) => {
                self.holds.remove(&n);
                self.reads.remove(&n);
                if v.get("ev").and_then(Value::as_str) == Some("done") {
                    self.cancelled.remove(&n);
                }
                None
            }
            ("check", _) => {
                let after = self.armed?;
                let kind = self.kind?;
                if self.active.is_some() {
                    return None;
                }
                match self.holds.get(&n) {
                    Some(&(true, acq)) if acq >= after => {}
                    _ => return None,
                }
                self.armed = None;
                self.active = Some(Active {
                    kind,
                    w: id,
                    n,
                    pid,
                    keys: self.reads.get(&n).cloned().unwrap_or_default(),
                    held: Vec::new(),
                    other_wrote: false,
                    start: crate::mono::now_ns(),
                });
                Some(kind)
            }
            _ => None,
        }
    }

    /// A resource request from worker `id`: records a read's key; returns true when it is the
    /// bitten holder's write, which is then held.
    pub(crate) fn intercept(&mut self, id: usize, req: &str, v: &Value) -> bool {
        let Some(n) = v.get("n").and_then(Value::as_u64) else {
            return false;
        };
        let key = v
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or("k")
            .to_owned();
        if req == "read" {
            let keys = self.reads.entry(n).or_default();
            if !keys.contains(&key) {
                keys.push(key);
            }
            return false;
        }
        match &mut self.active {
            Some(a) if a.w == id && a.n == n && !a.kind.stops() => {
                a.held.push(v.clone());
                true
            }
            _ => false,
        }
    }

    /// A semaphore: `others` holders other than the bitten one hold permits now (a grant
    /// just came).
    pub(crate) fn held_by(&mut self, others: usize) {
        if let Some(a) = &mut self.active
            && self.permits > 0
            && others >= self.permits
        {
            a.other_wrote = true;
        }
    }

    /// A write by operation `n` of `key` was applied to the resource.
    pub(crate) fn wrote(&mut self, n: u64, key: &str) {
        if let Some((m, arrived)) = &mut self.stale
            && *m == n
        {
            *arrived = true;
        }
        if let Some(a) = &mut self.active
            && a.n != n
            && a.keys.iter().any(|k| k == key)
        {
            a.other_wrote = true;
        }
    }
}

/// The bites of one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) kind: Option<Kind>,
    /// Bites after which another holder had taken over the lease (and written) before the
    /// bitten one went on (and its stale write arrived).
    pub(crate) landed: u64,
    /// Bites that found no holder in time, after which nobody took over in 6 TTLs, or whose
    /// holder never wrote after.
    pub(crate) missed: u64,
}

/// How long a run must be for a bite that did not land to fail it.
pub(crate) const FULL_RUN: Duration = Duration::from_secs(30);

/// Whether a run of `duration` with leases of `ttl` is held to its bite: a full run, or one of
/// ten TTLs (a bite lands within a few: CI's 12 s runs of the Redis scenarios, TTL 1 s, are).
pub(crate) fn held_to_it(duration: Duration, ttl: Duration) -> bool {
    duration >= FULL_RUN || duration >= ttl * 10
}

/// The scenario line's part about leases: the bites and the unfenced control's loss, or why
/// no fault here can break a lease.
pub(crate) fn clause(s: &Scenario, t: &Tally, lost: u64, accepted: u64) -> String {
    match plan(s) {
        Plan::Cannot(why) => format!("no fault here can break a lease: {why}"),
        Plan::Bite(k) => {
            let unfenced = if writes(s) {
                let pct = if accepted == 0 {
                    0.0
                } else {
                    100.0 * lost as f64 / accepted as f64
                };
                format!("unfenced control lost {pct:.1}% ({lost} of {accepted})")
            } else {
                "unfenced control n/a (holders only read)".to_owned()
            };
            format!(
                "leases broken: {} (bites landed; {} missed; by {}); {unfenced}",
                t.landed,
                t.missed,
                k.name()
            )
        }
    }
}

/// What is wrong with a run whose faults can break a lease: no bite landed, or the unfenced
/// control lost nothing. `None` when nothing is, or nothing can break a lease here.
pub(crate) fn complaint(s: &Scenario, t: &Tally, lost: u64) -> Option<String> {
    let Plan::Bite(k) = plan(s) else {
        return None;
    };
    if t.landed == 0 {
        return Some(format!(
            "{}: no bite landed ({} missed): no {} broke a lease, so the run proves little",
            s.name,
            t.missed,
            k.name()
        ));
    }
    if writes(s) && lost == 0 {
        return Some(format!(
            "{}: the unfenced control lost nothing although {} bite(s) landed",
            s.name, t.landed
        ));
    }
    None
}

/// The report's account of the bites.
pub(crate) fn to_json(s: &Scenario, t: &Tally) -> Value {
    match plan(s) {
        Plan::Cannot(why) => json!({"can_break_a_lease": false, "why_not": why}),
        Plan::Bite(k) => json!({"can_break_a_lease": true, "kind": k.name(),
            "leases_broken": t.landed, "bites_missed": t.missed,
            "unfenced_applies": writes(s)}),
    }
}

#[cfg(test)]
mod tests;
