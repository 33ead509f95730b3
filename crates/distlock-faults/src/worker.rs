//! A worker process: one lock client that runs the orchestrator's operations, one at a time,
//! and reports everything it sees on stdout (one JSON object per line).
//!
//! Its critical section is read → work → check → write on the protected resource, which the
//! orchestrator holds: the worker asks for reads and writes on stdout and gets the answers on
//! stdin. Being its own process, a worker can be paused (SIGSTOP) or killed (SIGKILL) alone,
//! and run under libfaketime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::clock::{Clock, SystemClock};
use distlock::{Leadership, LeaseKind, LockClient, LockGuard, LockOptions, MultiGuard, Released};
use distlock_core::seeded::SeededBug;
use distlock_testkit::seeded::{self, WallClock};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

use crate::mono;

/// The worker's settings, from its command line.
#[derive(Debug, Clone)]
pub(crate) struct WorkerArgs {
    pub(crate) url: String,
    pub(crate) id: usize,
    /// Its incarnation (a replacement of a killed worker has the next one).
    pub(crate) inc: u64,
    pub(crate) ttl: Duration,
}

/// One operation, as the orchestrator sends it.
#[derive(Debug, Clone)]
struct Op {
    n: u64,
    key: String,
    /// The work between the read and the check.
    hold: Duration,
    /// The time between the check and the write (where a pause does the most harm).
    gap: Duration,
    renew: bool,
    /// `release`, `abandon` (leak the guard) or `cancel` (drop the future after `cancel_after`).
    end: String,
    cancel_after: Duration,
    wait: Duration,
    /// A pause before the operation starts (after a failed acquire).
    delay: Duration,
    /// The kind of lease: a writer (or mutex) reads and writes the resource; a reader or a
    /// permit reads it.
    kind: LeaseKind,
    /// A campaign in the election of that name instead of a lock: the leader reads and writes
    /// the resource with its epoch.
    election: bool,
    /// Several names taken at once (`lock_many`) instead of `key`: the holder reads and writes
    /// each name's resource with that name's fence.
    keys: Vec<String>,
    /// A membership of the group `key` with this many partitions instead of a lock (see
    /// `partitions.rs`): joined for `hold`, then left (`end` `leave`) or dropped.
    partitions: Option<u32>,
    /// Seeds the membership's choices (which partition to act on, the work's durations).
    seed: u64,
}

impl Op {
    fn parse(v: &Value) -> Option<Op> {
        let ms = |k: &str| Duration::from_millis(v.get(k).and_then(Value::as_u64).unwrap_or(0));
        Some(Op {
            n: v.get("n")?.as_u64()?,
            key: v.get("key")?.as_str()?.to_owned(),
            hold: ms("hold_ms"),
            gap: ms("gap_ms"),
            renew: v.get("renew").and_then(Value::as_bool).unwrap_or(true),
            end: v
                .get("end")
                .and_then(Value::as_str)
                .unwrap_or("release")
                .to_owned(),
            cancel_after: ms("cancel_ms"),
            wait: ms("wait_ms"),
            delay: ms("delay_ms"),
            kind: match v.get("kind").and_then(Value::as_str) {
                Some("shared") => LeaseKind::Shared,
                Some("permit") => LeaseKind::Permit {
                    permits: u32::try_from(v.get("permits").and_then(Value::as_u64)?).ok()?,
                },
                _ => LeaseKind::Exclusive,
            },
            election: v.get("kind").and_then(Value::as_str) == Some("leader"),
            keys: v
                .get("keys")
                .and_then(Value::as_array)
                .map(|k| {
                    k.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            partitions: (v.get("kind").and_then(Value::as_str) == Some("member"))
                .then(|| v.get("partitions").and_then(Value::as_u64))
                .flatten()
                .and_then(|p| u32::try_from(p).ok()),
            seed: v.get("seed").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// Writes events to stdout, one line each, flushed at once.
#[derive(Clone)]
struct Out(Arc<Mutex<tokio::io::Stdout>>);

impl Out {
    async fn send(&self, mut v: Value) {
        if let Some(o) = v.as_object_mut() {
            o.entry("t").or_insert_with(|| json!(mono::now_ns()));
        }
        let mut line = v.to_string();
        line.push('\n');
        let mut out = self.0.lock().await;
        // The orchestrator gone means the run is over: nothing to do but stop.
        if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
            std::process::exit(0);
        }
    }
}

/// The lock client's clock: the system's, or under the seeded bug `wall-clock` one that
/// follows the wall clock.
static CLOCK: std::sync::OnceLock<Arc<dyn Clock>> = std::sync::OnceLock::new();

fn clock() -> &'static Arc<dyn Clock> {
    CLOCK.get_or_init(|| match SeededBug::from_env() {
        Some(SeededBug::WallClock) => Arc::new(WallClock::default()),
        _ => Arc::new(SystemClock),
    })
}

/// The lease deadline `vu` (on this process's lock clock) as monotonic nanoseconds.
fn vu_ns(vu: Instant) -> i128 {
    mono::instant_ns(vu, clock().now())
}

pub(crate) async fn run(args: WorkerArgs) -> Result<(), String> {
    let backend = distlock::open_backend(&args.url)
        .await
        .map_err(|e| format!("worker {}: {e}", args.id))?;
    let backend = seeded::wrap(backend, SeededBug::from_env());
    let base = LockOptions::builder()
        .ttl(args.ttl)
        .build()
        .map_err(|e| e.to_string())?;
    let client = LockClient::builder(backend)
        .owner(format!("worker-{}", args.id))
        .clock(clock().clone())
        .options(base)
        .build();
    let out = Out(Arc::new(Mutex::new(tokio::io::stdout())));
    out.send(json!({"ev": "ready", "pid": std::process::id()}))
        .await;

    // stdin carries operations and the answers to our resource requests.
    let (op_tx, mut op_rx) = mpsc::unbounded_channel::<Value>();
    let (reply_tx, reply_rx) = mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let to = if v.get("reply").is_some() {
                &reply_tx
            } else {
                &op_tx
            };
            if to.send(v).is_err() {
                break;
            }
        }
        // stdin closed: the orchestrator is gone.
        std::process::exit(0);
    });
    let replies = Arc::new(Mutex::new(reply_rx));
    while let Some(v) = op_rx.recv().await {
        if v.get("op").and_then(Value::as_str) == Some("exit") {
            break;
        }
        let Some(op) = Op::parse(&v) else { continue };
        let n = op.n;
        if !op.delay.is_zero() {
            tokio::time::sleep(op.delay).await;
        }
        if op.partitions.is_some() {
            member_op(&client, &args, &op, &out, &replies).await;
        } else if op.end == "cancel" {
            let cancel_after = op.cancel_after;
            let body = one_op(&client, &op, &out, &replies);
            if tokio::time::timeout(cancel_after, body).await.is_err() {
                out.send(json!({"ev": "cancel", "n": n})).await;
            }
        } else {
            one_op(&client, &op, &out, &replies).await;
        }
        // For the leak checks: live tasks and resident memory after each operation.
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        out.send(json!({"ev": "done", "n": n, "tasks": tasks, "rss_kb": rss_kb()}))
            .await;
    }
    Ok(())
}

/// Asks the orchestrator for something and waits for its answer to this operation.
async fn ask(
    out: &Out,
    replies: &Mutex<mpsc::UnboundedReceiver<Value>>,
    req: Value,
    n: u64,
) -> Option<Value> {
    out.send(req).await;
    let mut rx = replies.lock().await;
    while let Some(v) = rx.recv().await {
        // Answers to a cancelled operation arrive late: skip them.
        if v.get("n").and_then(Value::as_u64) == Some(n) {
            return Some(v);
        }
    }
    None
}

async fn one_op(
    client: &LockClient,
    op: &Op,
    out: &Out,
    replies: &Mutex<mpsc::UnboundedReceiver<Value>>,
) {
    let n = op.n;
    let opts = match LockOptions::builder()
        .ttl(client.default_options().ttl())
        .auto_renew(op.renew)
        .wait_timeout(op.wait)
        .build()
    {
        Ok(o) => o,
        Err(e) => {
            out.send(json!({"ev": "fail", "f": "acquire", "n": n, "err": e.to_string()}))
                .await;
            return;
        }
    };
    // The names asked for (multi-name scenarios): a waiter's whole set, for CK7 (`many.rs`).
    let invoke = if op.keys.is_empty() {
        json!({"ev": "invoke", "f": "acquire", "n": n})
    } else {
        json!({"ev": "invoke", "f": "acquire", "n": n, "keys": op.keys})
    };
    out.send(invoke).await;
    let taken = if op.keys.len() > 1 {
        client
            .lock_many(op.keys.iter().cloned())
            .options(opts)
            .acquire()
            .await
            .map(Holding::Many)
    } else if op.election {
        client
            .election(&op.key)
            .options(opts)
            .value(format!("op-{n}"))
            .campaign()
            .await
            .map(Holding::Leader)
    } else {
        client
            .lock(&op.key)
            .options(opts)
            .kind(op.kind)
            .acquire()
            .await
            .map(Holding::Lock)
    };
    let held = match taken {
        Ok(h) => h,
        Err(e) => {
            let ev = if e.is_ambiguous() { "info" } else { "fail" };
            out.send(json!({"ev": ev, "f": "acquire", "n": n, "err": e.to_string()}))
                .await;
            return;
        }
    };
    let fences = held.fences(&op.key);
    let fence = fences.first().and_then(|(_, f)| *f);
    let permits = match op.kind {
        LeaseKind::Permit { permits } => permits,
        _ => 0,
    };
    let mut ok = json!({
        "ev": "ok", "f": "acquire", "n": n, "fence": fence,
        "vu": vu_ns(held.valid_until()) as i64,
        "validity_ms": opts.validity().as_millis() as u64,
        "token": held.token().as_str(),
        "kind": if op.election { "leader" } else { op.kind.name() }, "permits": permits,
    });
    if !op.keys.is_empty() {
        // Each name's fence (one for a single-name lock of a multi-name scenario): the checkers
        // take each name's history apart (see `many.rs`).
        ok["fences"] = fences
            .iter()
            .map(|(k, f)| (k.clone(), json!(f)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    out.send(ok).await;
    // Renewals and the lost signal, as they happen, until the operation ends.
    let watch = tokio::spawn(watch_lease(held.handle(), out.clone(), n));
    let _stop_watch = AbortOnDrop(watch.abort_handle());
    critical_section(&held, op, out, replies, &fences).await;
    match (op.end.as_str(), held) {
        ("abandon", Holding::Lock(guard)) => {
            out.send(json!({"ev": "abandon", "n": n})).await;
            let _ = guard.leak();
        }
        (_, held) => {
            out.send(json!({"ev": "invoke", "f": "release", "n": n}))
                .await;
            let released = match held {
                Holding::Lock(g) => g.release().await,
                Holding::Many(g) => g.release().await,
                Holding::Leader(l) => l.resign().await,
            };
            match released {
                Ok(r) => {
                    let why = match r {
                        Released::Held => None,
                        Released::Lost(reason) => Some(reason.to_string()),
                    };
                    out.send(json!({"ev": "ok", "f": "release", "n": n,
                        "held": r.was_held(), "why": why}))
                        .await;
                }
                Err(e) => {
                    let ev = if e.is_ambiguous() { "info" } else { "fail" };
                    out.send(json!({"ev": ev, "f": "release", "n": n, "err": e.to_string()}))
                        .await;
                }
            }
        }
    }
}

/// What an operation holds: a lock's guard, several names' guard, or an election's
/// leadership.
enum Holding {
    Lock(LockGuard),
    Many(MultiGuard),
    Leader(Leadership),
}

impl Holding {
    /// The resource keys it acts on (`key`, an operation's one), each with its fence.
    fn fences(&self, key: &str) -> Vec<(String, Option<u64>)> {
        match self {
            Holding::Lock(g) => vec![(key.to_owned(), g.fence())],
            Holding::Leader(l) => vec![(key.to_owned(), l.guard().fence())],
            Holding::Many(g) => g
                .names()
                .iter()
                .cloned()
                .zip(g.fences().iter().copied())
                .collect(),
        }
    }

    fn valid_until(&self) -> std::time::Instant {
        match self {
            Holding::Lock(g) => g.valid_until(),
            Holding::Many(g) => g.valid_until(),
            Holding::Leader(l) => l.guard().valid_until(),
        }
    }

    fn token(&self) -> distlock::Token {
        match self {
            Holding::Lock(g) => g.token(),
            Holding::Many(g) => g.token(),
            Holding::Leader(l) => l.guard().token(),
        }
    }

    fn handle(&self) -> distlock::LeaseHandle {
        match self {
            Holding::Lock(g) => g.handle(),
            Holding::Many(g) => g.handle(),
            Holding::Leader(l) => l.guard().handle(),
        }
    }

    /// Whether the holder believes it may act: the guard's `is_held`, a leader's `is_leading`.
    fn believes_held(&self) -> bool {
        match self {
            Holding::Lock(g) => g.is_held(),
            Holding::Many(g) => g.is_held(),
            Holding::Leader(l) => l.is_leading(),
        }
    }
}

/// read → work → check that the lease is still valid → gap → write the value read plus one
/// (each key's, for several names: every read, then every write).
async fn critical_section(
    held: &Holding,
    op: &Op,
    out: &Out,
    replies: &Mutex<mpsc::UnboundedReceiver<Value>>,
    fences: &[(String, Option<u64>)],
) {
    let n = op.n;
    let mut reads = Vec::with_capacity(fences.len());
    for (key, fence) in fences {
        let Some(read) = ask(
            out,
            replies,
            json!({"req": "read", "n": n, "key": key, "fence": fence}),
            n,
        )
        .await
        else {
            return;
        };
        reads.push(read);
    }
    tokio::time::sleep(op.hold).await;
    // The time of the check, read before it: a check that passes came before the deadline it
    // reports (CK9), however long this process is paused around it.
    let checked = mono::now_ns();
    if !held.believes_held() {
        out.send(json!({"ev": "skip-write", "n": n})).await;
        return;
    }
    // The claim: we hold the lock until `vu`. A pause here, after the check, is the classic
    // "stop-the-world pause at the worst moment".
    let vu = vu_ns(held.valid_until()) as i64;
    out.send(json!({"ev": "check", "n": n, "vu": vu, "checked": checked}))
        .await;
    tokio::time::sleep(op.gap).await;
    if op.kind != LeaseKind::Exclusive && !op.election {
        // Readers and permits only read.
        return;
    }
    for ((key, fence), read) in fences.iter().zip(&reads) {
        let value = read.get("value").and_then(Value::as_i64).unwrap_or(0) + 1;
        let uvalue = read.get("uvalue").and_then(Value::as_i64).unwrap_or(0) + 1;
        let mut req = json!({"req": "write", "n": n, "key": key, "fence": fence,
            "value": value, "uvalue": uvalue});
        // The SQL form's rows, when the scenario has them.
        for k in ["sw", "srw"] {
            if let Some(v) = read.get(k).and_then(Value::as_i64) {
                req[k] = json!(v + 1);
            }
        }
        let _ = ask(out, replies, req, n).await;
    }
}

/// A membership of a group ([`crate::scenario::Kinds::Partitions`]): joins, and while it owns
/// partitions acts on them one at a time, each with a fenced read-modify-write of the
/// partition's resource (`p<partition>`), until its stint is over or its membership is lost;
/// then leaves gracefully or drops the membership (every partition let go at once).
///
/// Each ownership (a partition with one fence) is one hold of the history, numbered by
/// [`hold_number`]: an `ok acquire` with its fence and partition when [`Membership::owned`]
/// first lists it, its reads, checks and writes, and an `invoke release` when the member stops
/// acting on it (`owned` no longer lists it, or the stint ends), so that the checkers, written
/// for a lock's holders, check each partition's owners (`partitions.rs`). The time at which an
/// ownership is first reported held (`vu` of its grant) is read between two calls of `owned`
/// that both list it (granted before the first, still valid after the second), and each
/// check's before the call that found it held: a claim that the partition was ours at that
/// instant, which a lease valid on the local clock backs.
///
/// [`Membership::owned`]: distlock::Membership::owned
async fn member_op(
    client: &LockClient,
    args: &WorkerArgs,
    op: &Op,
    out: &Out,
    replies: &Mutex<mpsc::UnboundedReceiver<Value>>,
) {
    use std::collections::BTreeMap;

    use distlock::OwnershipEvent;
    use tokio::sync::broadcast::error::TryRecvError;

    let n = op.n;
    let Some(partitions) = op.partitions else {
        return;
    };
    let member = format!("w{}-{}-{n}", args.id, args.inc);
    let group = client
        .group(&op.key)
        .partitions(partitions)
        .ttl(args.ttl)
        .grace(args.ttl / 5)
        .interval(Duration::from_millis(100));
    out.send(json!({"ev": "invoke", "f": "join", "n": n, "member": member}))
        .await;
    let joined = tokio::time::timeout(
        op.wait,
        group.join(member.as_str(), format!("worker-{}", args.id)),
    )
    .await;
    let m = match joined {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            let ev = if e.is_ambiguous() { "info" } else { "fail" };
            out.send(json!({"ev": ev, "f": "join", "n": n, "err": e.to_string()}))
                .await;
            return;
        }
        Err(_) => {
            out.send(json!({"ev": "info", "f": "join", "n": n, "err": "timed out"}))
                .await;
            return;
        }
    };
    out.send(json!({"ev": "ok", "f": "join", "n": n, "member": member,
        "epoch": m.epoch().get()}))
        .await;
    let mut events = m.events();
    let mut rng = XorShift::new(op.seed);
    // The ownerships being acted on: (partition, fence) → hold number.
    let mut open: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    // The ownerships whose lease a `Lost` event reported lost, until they leave `open`.
    let mut lost_holds: std::collections::BTreeSet<(u32, u64)> = Default::default();
    let until = tokio::time::Instant::now() + op.hold;
    let end = loop {
        // The member's own account of its changes, for the history (a loss's reason, a
        // partition draining); what it owns is read from `owned` below.
        loop {
            let (owned, what) = match events.try_recv() {
                Ok(OwnershipEvent::Lost {
                    owned,
                    reason: Some(r),
                }) => (owned, json!({"ev": "lost", "reason": format!("{r:?}")})),
                Ok(OwnershipEvent::Draining { owned, until }) => (
                    owned,
                    json!({"ev": "draining", "until": vu_ns(until) as i64}),
                ),
                Ok(_) => continue,
                Err(TryRecvError::Lagged(k)) => {
                    out.send(json!({"ev": "events-lagged", "n": n, "missed": k}))
                        .await;
                    continue;
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            };
            let k = (owned.partition, owned.fence.get());
            if let Some(&h) = open.get(&k) {
                if what["ev"] == "lost" {
                    lost_holds.insert(k);
                }
                let mut what = what;
                what["n"] = json!(h);
                out.send(what).await;
            }
        }
        // What is ours at `t`: listed by `owned` both before and after it. A lease listed
        // before was granted before; listed after, it was still valid after (a lease is valid
        // over one span of time), so at `t` too.
        let before: Vec<(u32, u64)> = m
            .owned()
            .iter()
            .map(|o| (o.partition, o.fence.get()))
            .collect();
        let t = mono::now_ns();
        let owned: Vec<(u32, u64)> = m
            .owned()
            .iter()
            .map(|o| (o.partition, o.fence.get()))
            .filter(|k| before.contains(k))
            .collect();
        // Stopped acting on what `owned` no longer lists (let go, lost, or past its local
        // deadline): a loss when the membership is lost too (a pause, a cut link).
        let still_member = m.is_member();
        let gone: Vec<(u32, u64)> = open
            .keys()
            .filter(|k| !owned.contains(k))
            .copied()
            .collect();
        for k in gone {
            if let Some(h) = open.remove(&k) {
                // A loss if its lease was reported lost, or the membership is gone (a pause,
                // a cut link); let go otherwise (a move, a drain's end).
                let was_lost = lost_holds.remove(&k);
                let why = if still_member && !was_lost {
                    "let-go"
                } else {
                    "lost"
                };
                out.send(json!({"ev": "invoke", "f": "release", "n": h, "why": why}))
                    .await;
            }
        }
        if !still_member {
            break "lost";
        }
        if tokio::time::Instant::now() >= until {
            break if op.end == "drop" { "drop" } else { "leave" };
        }
        for &(p, fence) in &owned {
            if open.contains_key(&(p, fence)) {
                continue;
            }
            let h = hold_number(
                args.id,
                args.inc,
                HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
            );
            open.insert((p, fence), h);
            out.send(json!({"ev": "invoke", "f": "acquire", "n": h, "t": t}))
                .await;
            out.send(
                json!({"ev": "ok", "f": "acquire", "n": h, "t": t, "fence": fence,
                "partition": p, "key": format!("p{p}"), "vu": t, "validity_ms": 0,
                "kind": "exclusive", "permits": 0, "member": member, "stint": n}),
            )
            .await;
        }
        let Some(&(p, fence)) = (!owned.is_empty()).then(|| &owned[rng.below(owned.len())]) else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let h = open[&(p, fence)];
        act_on_partition(&m, (p, fence), h, &mut rng, out, replies).await;
    };
    // It acts on nothing from here on.
    for (_, h) in std::mem::take(&mut open) {
        out.send(json!({"ev": "invoke", "f": "release", "n": h, "why": end}))
            .await;
    }
    out.send(json!({"ev": "invoke", "f": "leave", "n": n, "how": end}))
        .await;
    if end == "leave" {
        match m.leave().await {
            Ok(()) => out.send(json!({"ev": "ok", "f": "leave", "n": n})).await,
            Err(e) => {
                out.send(json!({"ev": "info", "f": "leave", "n": n, "err": e.to_string()}))
                    .await;
            }
        }
    } else {
        drop(m);
    }
}

/// A fenced read-modify-write of partition `p`'s resource by hold `h`, which owns it with
/// `fence`: read → work → check that `owned` still lists it → gap → write the value read plus
/// one (a pause after the check does the most harm, as for a lock's holder).
async fn act_on_partition(
    m: &distlock::Membership,
    (p, fence): (u32, u64),
    h: u64,
    rng: &mut XorShift,
    out: &Out,
    replies: &Mutex<mpsc::UnboundedReceiver<Value>>,
) {
    let key = format!("p{p}");
    let Some(read) = ask(
        out,
        replies,
        json!({"req": "read", "n": h, "key": key, "fence": fence}),
        h,
    )
    .await
    else {
        return;
    };
    tokio::time::sleep(Duration::from_millis(5 + rng.below(36) as u64)).await;
    let checked = mono::now_ns();
    if !m
        .owned()
        .iter()
        .any(|o| o.partition == p && o.fence.get() == fence)
    {
        out.send(json!({"ev": "skip-write", "n": h})).await;
        return;
    }
    // Ours at `checked`, which was read before the check: the claim.
    out.send(json!({"ev": "check", "n": h, "vu": checked + 1, "checked": checked}))
        .await;
    tokio::time::sleep(Duration::from_millis(5 + rng.below(16) as u64)).await;
    let value = read.get("value").and_then(Value::as_i64).unwrap_or(0) + 1;
    let uvalue = read.get("uvalue").and_then(Value::as_i64).unwrap_or(0) + 1;
    let _ = ask(
        out,
        replies,
        json!({"req": "write", "n": h, "key": key, "fence": fence,
            "value": value, "uvalue": uvalue}),
        h,
    )
    .await;
}

/// The ownerships of partitions this process has reported, over all its memberships.
static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The number of a worker's `k`-th ownership of a partition in the history: apart from the
/// orchestrator's operation numbers (which stay far below 2^48) and from every other worker's
/// and incarnation's.
pub(crate) fn hold_number(id: usize, inc: u64, k: u64) -> u64 {
    ((id as u64 + 1) << 48) | ((inc & 0xffff) << 32) | (k & 0xffff_ffff)
}

/// A small seeded generator for a membership's choices.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x % n as u64) as usize
    }
}

/// Reports every move of the lease's deadline (a renewal) and its end.
async fn watch_lease(handle: distlock::LeaseHandle, out: Out, n: u64) {
    let mut last = handle.valid_until();
    let ended = handle.ended();
    tokio::pin!(ended);
    loop {
        tokio::select! {
            end = &mut ended => {
                if let Some(reason) = end.lost() {
                    out.send(json!({"ev": "lost", "n": n, "reason": format!("{reason:?}")})).await;
                }
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(2)) => {
                let vu = handle.valid_until();
                if vu > last {
                    last = vu;
                    out.send(json!({"ev": "renewed", "n": n, "vu": vu_ns(vu) as i64})).await;
                }
            }
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resident memory in KiB, from `/proc/self/statm` (4 KiB pages).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}
