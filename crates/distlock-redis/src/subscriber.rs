//! Wake-ups for waiters: one pub/sub connection per backend, shared by every waiter.
//!
//! It listens on:
//! - this client's own wake channel, `<prefix>wake:<client id>`, where a release that handed a
//!   lock to this client says so (`\t<fence> <seq> <token> <lock key>`), or names a lock key
//!   this client should try again (releases wake only the client whose turn it is, so other
//!   clients' processes are not woken for nothing);
//! - for each lock a task of this client waits for, `__keyspace@<db>__:<lock key>`, which the
//!   server publishes to when the key is deleted, expires or is evicted, if keyspace
//!   notifications are on (`notify-keyspace-events` with `K` and `g` plus `x`, for example
//!   `Kgx`). This wakes waiters when a client in another language deletes its plain lock key,
//!   or when a crashed holder's lease runs out.
//!
//! On a Cluster there is no per-client channel: each lock a task waits for has its own sharded
//! channel in the lock's slot (see `WakeChannel`), subscribed with `SSUBSCRIBE` through
//! redis-rs's Cluster connection, and no keyspace channel (notifications are node-local).
//!
//! A lock's channel stays subscribed for [`LINGER`] after the last waiter here has gone (the
//! next wait on a hot lock comes soon); meanwhile a grant of that lock is passed on at once,
//! since nobody here will take it.
//!
//! The connection is opened at the first wait, not at connect: uncontended users never open it.
//! When it breaks, it is reopened with back-off, every channel is subscribed again, and every
//! waiter is woken (an event may have been missed in between).
//!
//! It is a direct connection (see [`crate::lane`]) read by this task itself: a wake-up reaches
//! the waiter with one task hand-off, where redis-rs's pub/sub connection adds a driver task
//! and a channel (about a tenth of a hand-off between processes on one CPU). Over TLS, which
//! direct connections do not speak, it is redis-rs's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_core::engine::{Subscription, WakeHub};
use futures_util::StreamExt;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use crate::config::RedisConfig;
use crate::keys::{KeyLayout, LockKeys, WakeChannel};
use crate::lane::{self, Direct, Target};
use crate::node::Node;
use crate::scripts::with_lib;

/// How long a lock's channels stay subscribed after its last waiter here has gone. A client that
/// takes turns on a hot lock stops waiting at every acquisition and waits again soon after:
/// without this, each turn cost an `UNSUBSCRIBE`, a `leave` script and a `SUBSCRIBE` (three of
/// the five commands of a contended cycle), and the next wait a round trip before it could
/// queue up.
const LINGER: Duration = Duration::from_secs(1);

/// The keyspace events that mean the lock key is gone.
const GONE_EVENTS: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];

enum Cmd {
    Subscribe(String),
    Unsubscribe(String),
}

/// What the backend and the subscriber share about waits, under one mutex.
#[derive(Default)]
pub(crate) struct WaitState {
    /// Locks a release of ours just handed to another client while tasks of ours still wait,
    /// and until when to believe it: their next attempt would only find the lock busy, so it is
    /// answered here (they are queued, and handed the lock in their turn).
    pub(crate) elsewhere: HashMap<String, Instant>,
    /// How many wake-ups this client has had: a release records `elsewhere` only if none came
    /// while it was in flight (that wake-up may have been our turn already).
    pub(crate) wakes: u64,
    /// Locks handed to this client, by lock name, not yet taken by one of its attempts.
    pub(crate) grants: HashMap<String, Grant>,
    /// Our registration in each lock's queue, by lock name, while we believe it is there
    /// (scripts keep it instead of queueing again, or remove it).
    pub(crate) queued: HashMap<String, String>,
    /// Registrations this client sent, by lock name, oldest first (at most `MAX_REGS`): when a
    /// grant names one, the lease was written after it was sent.
    pub(crate) regs: HashMap<String, VecDeque<Reg>>,
    /// The registration of ours, by number, that each lock's last grant served: an attempt
    /// whose reply says it queued us does not believe it if the grant for that very
    /// registration came first.
    pub(crate) served: HashMap<String, u64>,
    /// Tokens whose lock was taken after a wait (so others may be waiting too): their release
    /// may hand the lock over, and leads with a `PING` (see `RedisBackend::run_led`).
    pub(crate) contended: HashSet<String>,
}

/// How many contended tokens are remembered (each is forgotten at its release; a bound for
/// guards that are never released, say leaked with `mem::forget`).
const MAX_CONTENDED: usize = 4096;

impl WaitState {
    /// A script queued our registration `reg`, number `seq`, for `key`: believe it is there,
    /// unless the grant for that very registration came before the reply. Believing a served
    /// one still queued would keep the next release from queueing us again, and the other
    /// clients' tasks would pass the lock among themselves.
    pub(crate) fn believe_queued(&mut self, key: &str, seq: u64, reg: String) {
        if self.served.get(key) != Some(&seq) {
            self.queued.insert(key.to_owned(), reg);
        }
    }

    pub(crate) fn mark_contended(&mut self, token: &str) {
        if self.contended.len() >= MAX_CONTENDED {
            self.contended.clear();
        }
        self.contended.insert(token.to_owned());
    }
}

/// A lock handed to this client by a release.
pub(crate) enum Grant {
    /// Handed to `token`, with `fence`, on the registration numbered `seq`.
    Handed { token: String, fence: u64, seq: u64 },
    /// An attempt with `token` took the lock with `fence`, possibly one a release had already
    /// handed to it (its message still on the way): ignore that message when it comes. A
    /// grant to `token` with another fence is a later hand-over, to a registration of
    /// `token` that was still queued: nobody uses it, and the next attempt takes it over.
    Taken { token: String, fence: u64 },
}

/// One registration sent: its number, when it was sent, and the TTL it asked for.
#[derive(Clone, Copy)]
pub(crate) struct Reg {
    pub(crate) seq: u64,
    pub(crate) at: Instant,
    pub(crate) ttl: Duration,
}

/// How many registrations per lock are remembered.
pub(crate) const MAX_REGS: usize = 16;

pub(crate) type Shared = Arc<Mutex<WaitState>>;

/// The shared subscriber of one backend.
pub(crate) struct Subscriber {
    hub: WakeHub,
    /// Taken by the task when it starts (at the first subscription), with the receiving end
    /// of `_stop`.
    start: Mutex<Option<(Start, oneshot::Receiver<()>)>>,
    /// Dropped with the subscriber (the last clone of its engine): the task then ends, and
    /// its connection closes. Without it, the task of an engine left behind (a Sentinel
    /// master that failed over) would keep reconnecting to a dead server for ever.
    _stop: oneshot::Sender<()>,
}

struct Start {
    rx: mpsc::UnboundedReceiver<Cmd>,
    client: redis::Client,
    /// Where a direct connection goes; `None` over TLS.
    target: Option<Target>,
    /// Requests (leaving a queue) go through the engine's connections.
    node: Node,
    wake: WakeChannel,
    /// A Cluster's seed URLs: wake-ups come on sharded channels, through redis-rs's Cluster
    /// connection (it subscribes on each slot's node, and again after slots move).
    cluster: Option<Vec<String>>,
    shared: Shared,
    layout: KeyLayout,
    db: i64,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        node: Node,
        config: &RedisConfig,
        wake: WakeChannel,
        cluster: Option<Vec<String>>,
        shared: Shared,
    ) -> Self {
        let layout = config.layout.clone();
        let (connect_timeout, response_timeout) = (config.connect_timeout, config.response_timeout);
        let (tx, rx) = mpsc::unbounded_channel();
        let tx2 = tx.clone();
        let hub = WakeHub::new(
            move |key| {
                let _ = tx.send(Cmd::Subscribe(key.to_owned()));
            },
            move |key| {
                let _ = tx2.send(Cmd::Unsubscribe(key.to_owned()));
            },
        );
        let db = client.get_connection_info().redis_settings().db();
        let target = Target::of(client.get_connection_info());
        let (stop, stopped) = oneshot::channel();
        Subscriber {
            _stop: stop,
            hub,
            start: Mutex::new(Some((
                Start {
                    rx,
                    target,
                    client,
                    node,
                    wake,
                    cluster,
                    shared,
                    layout,
                    db,
                    connect_timeout,
                    response_timeout,
                },
                stopped,
            ))),
        }
    }

    /// Whether a waiter of this client is subscribed to `key`'s wake-ups, confirmed by the
    /// server (it then queues up for a targeted one; a waiter that cannot hear them must not,
    /// or releases would hand it the lock in vain).
    pub(crate) fn is_watching(&self, key: &str) -> bool {
        self.hub.is_confirmed(key)
    }

    /// A subscription to `key`'s release events, confirmed by the server within the response
    /// timeout (or returned unconfirmed, in which case the waiter's fallback interval bounds
    /// its sleep).
    pub(crate) async fn subscribe(&self, key: &str, response_timeout: Duration) -> Subscription {
        let started = self
            .start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((start, stopped)) = started {
            let task = run(self.hub.clone(), start);
            tokio::spawn(async move {
                tokio::select! {
                    () = task => {}
                    _ = stopped => {}
                }
            });
        }
        let mut sub = self.hub.subscribe(key);
        if !sub.confirmed(response_timeout).await {
            tracing::debug!(target: "distlock", key,
                "release-event subscription not confirmed in time; the wait falls back to polling");
        }
        sub
    }
}

/// The channel subscribed to for one lock: its keyspace channel, or on a Cluster its sharded
/// wake channel.
fn key_channel(start: &Start, key: &str) -> String {
    let lock_key = start.layout.lock_key(key);
    if start.wake.is_sharded() {
        start.wake.sharded_channel(&lock_key)
    } else {
        format!("__keyspace@{}__:{lock_key}", start.db)
    }
}

/// What the connection task knows: which locks are watched, and how messages map back to them.
#[derive(Default)]
struct Routes {
    /// Keyspace channel (on a Cluster: sharded wake channel) -> lock name.
    keyspace: HashMap<String, String>,
    /// Lock key (the payload of a wake-up) -> lock name.
    locks: HashMap<String, String>,
}

impl Routes {
    fn apply(&mut self, start: &Start, cmd: &Cmd) {
        match cmd {
            Cmd::Subscribe(k) => {
                self.keyspace.insert(key_channel(start, k), k.clone());
                self.locks.insert(start.layout.lock_key(k), k.clone());
            }
            Cmd::Unsubscribe(k) => {
                self.keyspace.remove(&key_channel(start, k));
                self.locks.remove(&start.layout.lock_key(k));
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }
}

/// The outcome of one SUBSCRIBE or UNSUBSCRIBE.
enum Reply {
    Done,
    /// Refused by the server (an ACL without this channel): the connection stays.
    Refused,
    Broken,
}

/// A published message.
struct Msg {
    channel: Vec<u8>,
    payload: Vec<u8>,
}

/// The pub/sub connection.
enum Conn {
    /// Read by the subscriber task itself. `early`: messages that came while a subscription
    /// request waited for its confirmation, served first.
    Direct { io: Direct, early: VecDeque<Msg> },
    /// redis-rs's (TLS).
    Shared {
        sink: redis::aio::PubSubSink,
        stream: redis::aio::PubSubStream,
    },
    /// redis-rs's Cluster connection (RESP3), for sharded channels; messages come as pushes.
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    },
}

impl Conn {
    async fn open(start: &Start) -> Result<Conn, String> {
        if let Some(seeds) = &start.cluster {
            let (tx, pushes) = mpsc::unbounded_channel();
            let client = redis::cluster::ClusterClientBuilder::new(seeds.clone())
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .connection_timeout(start.connect_timeout)
                .response_timeout(start.response_timeout)
                .build()
                .map_err(|e| e.to_string())?;
            return match tokio::time::timeout(start.connect_timeout, client.get_async_connection())
                .await
            {
                Ok(Ok(conn)) => Ok(Conn::Cluster { conn, pushes }),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".to_owned()),
            };
        }
        if let Some(target) = &start.target {
            return match lane::connect(target, start.connect_timeout).await {
                Ok(io) => Ok(Conn::Direct {
                    io,
                    early: VecDeque::new(),
                }),
                Err(e) => Err(e.to_string()),
            };
        }
        match tokio::time::timeout(start.connect_timeout, start.client.get_async_pubsub()).await {
            Ok(Ok(c)) => {
                let (sink, stream) = c.split();
                Ok(Conn::Shared { sink, stream })
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".to_owned()),
        }
    }

    /// Subscribes to (or unsubscribes from) `chan`, and waits for the server's answer.
    async fn request(&mut self, chan: &str, subscribe: bool, timeout: Duration) -> Reply {
        let reply = match self {
            Conn::Direct { io, early } => {
                tokio::time::timeout(timeout, direct_request(io, early, chan, subscribe)).await
            }
            Conn::Shared { sink, .. } if subscribe => {
                tokio::time::timeout(timeout, sink.subscribe(chan)).await
            }
            Conn::Shared { sink, .. } => {
                tokio::time::timeout(timeout, sink.unsubscribe(chan)).await
            }
            Conn::Cluster { conn, .. } if subscribe => {
                tokio::time::timeout(timeout, conn.ssubscribe(chan)).await
            }
            Conn::Cluster { conn, .. } => {
                tokio::time::timeout(timeout, conn.sunsubscribe(chan)).await
            }
        };
        match reply {
            Ok(Ok(())) => Reply::Done,
            Ok(Err(e))
                if !e.is_io_error()
                    && !e.is_connection_dropped()
                    && e.kind() != redis::ErrorKind::Parse =>
            {
                tracing::debug!(target: "distlock", channel = %chan, error = %e,
                    "subscription refused");
                Reply::Refused
            }
            Ok(Err(e)) => {
                tracing::debug!(target: "distlock", channel = %chan, error = %e,
                    "subscription failed");
                Reply::Broken
            }
            Err(_) => Reply::Broken,
        }
    }

    /// The next message; `None` when the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel-safe: a message is taken off the connection only when it is returned.
    async fn next(&mut self) -> Option<Msg> {
        match self {
            Conn::Direct { io, early } => {
                if let Some(m) = early.pop_front() {
                    return Some(m);
                }
                loop {
                    match io.next_frame().await {
                        // Anything else is a late confirmation: nothing to do.
                        Ok(v) => {
                            if let Some(m) = message(v) {
                                return Some(m);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(target: "distlock", error = %e, "pub/sub read failed");
                            return None;
                        }
                    }
                }
            }
            Conn::Shared { stream, .. } => stream.next().await.map(|m| Msg {
                channel: m.get_channel_name().as_bytes().to_vec(),
                payload: m.get_payload_bytes().to_vec(),
            }),
            Conn::Cluster { pushes, .. } => loop {
                let push = pushes.recv().await?;
                match push.kind {
                    redis::PushKind::SMessage => {
                        let mut data = push.data.into_iter();
                        if let (
                            Some(Value::BulkString(channel)),
                            Some(Value::BulkString(payload)),
                        ) = (data.next(), data.next())
                        {
                            return Some(Msg { channel, payload });
                        }
                    }
                    // A node's connection broke: messages may have been lost meanwhile. Start
                    // afresh (every waiter is woken, every channel subscribed again).
                    redis::PushKind::Disconnection => return None,
                    // Confirmations (also of redis-rs's own re-subscriptions).
                    _ => {}
                }
            },
        }
    }
}

/// Sends `SUBSCRIBE` or `UNSUBSCRIBE` and reads up to its confirmation, keeping the messages
/// that come first. A server error (`NOPERM`) is returned as such.
async fn direct_request(
    io: &mut Direct,
    early: &mut VecDeque<Msg>,
    chan: &str,
    subscribe: bool,
) -> Result<(), redis::RedisError> {
    let (name, kind): (&str, &[u8]) = if subscribe {
        ("SUBSCRIBE", b"subscribe")
    } else {
        ("UNSUBSCRIBE", b"unsubscribe")
    };
    let mut cmd = redis::cmd(name);
    cmd.arg(chan);
    io.send(std::iter::once(&cmd)).await?;
    loop {
        let v = io.next_frame().await?;
        if let Value::ServerError(e) = v {
            return Err(e.into());
        }
        if let Value::Array(items) = &v
            && let [Value::BulkString(k), Value::BulkString(c), Value::Int(_)] = items.as_slice()
            && k.as_slice() == kind
            && c.as_slice() == chan.as_bytes()
        {
            return Ok(());
        }
        match message(v) {
            Some(m) => early.push_back(m),
            None => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "an unexpected reply on the pub/sub connection",
                )));
            }
        }
    }
}

/// A `message` push as channel and payload; `None` for anything else.
fn message(v: Value) -> Option<Msg> {
    let Value::Array(items) = v else { return None };
    let mut items = items.into_iter();
    match (items.next(), items.next(), items.next(), items.next()) {
        (
            Some(Value::BulkString(kind)),
            Some(Value::BulkString(channel)),
            Some(Value::BulkString(payload)),
            None,
        ) if kind == b"message" => Some(Msg { channel, payload }),
        _ => None,
    }
}

/// A lock's waiters are woken: forget that a release of ours handed it to somebody else, and
/// apply `update` (what the message says) under the same lock.
fn wake(hub: &WakeHub, shared: &Shared, name: &str, update: impl FnOnce(&mut WaitState)) {
    {
        let mut st = shared.lock().unwrap_or_else(PoisonError::into_inner);
        st.wakes += 1;
        st.elsewhere.remove(name);
        update(&mut st);
    }
    hub.notify(name);
}

/// A grant message, `\t<fence> <seq> <token> <lock key>`.
fn parse_grant(payload: &[u8]) -> Option<(u64, u64, &str, &str)> {
    let text = std::str::from_utf8(payload.strip_prefix(b"\t")?).ok()?;
    let mut parts = text.splitn(4, ' ');
    let fence = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let token = parts.next()?;
    let lock_key = parts.next()?;
    Some((fence, seq, token, lock_key))
}

/// Records a lock handed to `token` of this client, unless an attempt already took this very
/// grant (same token and fence). Our registration left the queue with it.
pub(crate) fn record_grant(st: &mut WaitState, name: &str, fence: u64, seq: u64, token: &str) {
    st.queued.remove(name);
    // No allocation on a hot lock's every hand-over: its entry stays.
    match st.served.get_mut(name) {
        Some(s) => *s = seq,
        None => {
            st.served.insert(name.to_owned(), seq);
        }
    }
    if let Some(Grant::Taken { token: t, fence: f }) = st.grants.get(name)
        && t == token
        && *f == fence
    {
        st.grants.remove(name);
        return;
    }
    st.grants.insert(
        name.to_owned(),
        Grant::Handed {
            token: token.to_owned(),
            fence,
            seq,
        },
    );
}

async fn run(hub: WakeHub, mut start: Start) {
    let mut routes = Routes::default();
    let mut attempt = 0u32;
    loop {
        // Drain commands that came while disconnected.
        while let Ok(cmd) = start.rx.try_recv() {
            routes.apply(&start, &cmd);
        }
        if start.rx.is_closed() && routes.is_empty() {
            return;
        }
        let mut conn = match Conn::open(&start).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e, "pub/sub connection failed");
                backoff(&mut attempt, &mut start, &mut routes).await;
                continue;
            }
        };
        // Our wake channel first: waiters count as watching only once it is confirmed. (On a
        // Cluster each lock's own channel is its wake channel.)
        let wake_ok = if start.wake.is_sharded() {
            true
        } else {
            match conn
                .request(start.wake.base(), true, start.response_timeout)
                .await
            {
                Reply::Done => true,
                Reply::Refused => false,
                Reply::Broken => {
                    backoff(&mut attempt, &mut start, &mut routes).await;
                    continue;
                }
            }
        };
        let all: Vec<String> = routes.keyspace.keys().cloned().collect();
        let mut broken = false;
        for chan in &all {
            if let Reply::Broken = conn.request(chan, true, start.response_timeout).await {
                broken = true;
                break;
            }
        }
        if broken {
            backoff(&mut attempt, &mut start, &mut routes).await;
            continue;
        }
        attempt = 0;
        for name in routes.locks.values() {
            if wake_ok {
                hub.set_confirmed(name, true);
            } else {
                hub.set_refused(name);
            }
        }
        // Events may have been missed while disconnected.
        forget_hints(&start.shared);
        hub.notify_all();
        // Locks nobody here waits for any more, still subscribed, and until when.
        let mut lingering: HashMap<String, Instant> = HashMap::new();
        let mut linger_timer = Box::pin(tokio::time::sleep(LINGER));
        loop {
            tokio::select! {
                cmd = start.rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    match cmd {
                        Cmd::Subscribe(key) => {
                            // Still subscribed if it lingers: no round trip.
                            if lingering.remove(&key).is_none() {
                                routes.apply(&start, &Cmd::Subscribe(key.clone()));
                                let chan = key_channel(&start, &key);
                                match conn.request(&chan, true, start.response_timeout).await {
                                    Reply::Broken => break,
                                    // A Cluster waiter hears nothing without its lock's channel.
                                    Reply::Refused if start.wake.is_sharded() => {
                                        hub.set_refused(&key);
                                        continue;
                                    }
                                    _ => {}
                                }
                            }
                            if wake_ok {
                                hub.set_confirmed(&key, true);
                            } else {
                                hub.set_refused(&key);
                            }
                        }
                        Cmd::Unsubscribe(key) => {
                            // A registration of ours still queued, or a grant nobody took:
                            // leave now (a release would hand the lock to nobody). Otherwise
                            // the next wait will likely come soon: stay subscribed a while.
                            if must_leave(&start.shared, &key) {
                                leave_queue(&start, &key).await;
                            }
                            let until = Instant::now() + LINGER;
                            if lingering.is_empty() {
                                linger_timer.as_mut().reset(until.into());
                            }
                            lingering.insert(key, until);
                        }
                    }
                }
                () = &mut linger_timer, if !lingering.is_empty() => {
                    let now = Instant::now();
                    let done: Vec<String> = lingering
                        .iter()
                        .filter(|(_, until)| **until <= now)
                        .map(|(k, _)| k.clone())
                        .collect();
                    let mut broken = false;
                    for key in done {
                        lingering.remove(&key);
                        let chan = key_channel(&start, &key);
                        routes.apply(&start, &Cmd::Unsubscribe(key.clone()));
                        leave_queue(&start, &key).await;
                        if let Reply::Broken = conn.request(&chan, false, start.response_timeout).await {
                            broken = true;
                            break;
                        }
                    }
                    if broken {
                        break;
                    }
                    if let Some(next) = lingering.values().min() {
                        linger_timer.as_mut().reset((*next).into());
                    }
                }
                msg = conn.next() => {
                    let Some(Msg { channel, payload }) = msg else { break };
                    let payload = payload.as_slice();
                    let to_us = if start.wake.is_sharded() {
                        std::str::from_utf8(&channel).is_ok_and(|c| routes.keyspace.contains_key(c))
                    } else {
                        channel == start.wake.base().as_bytes()
                    };
                    if to_us {
                        if let Some((fence, seq, token, lock_key)) = parse_grant(payload) {
                            match routes.locks.get(lock_key) {
                                Some(name) if !lingering.contains_key(name) => {
                                    wake(&hub, &start.shared, name, |st| {
                                        record_grant(st, name, fence, seq, token);
                                    });
                                }
                                // Handed to us, but nobody here waits any more: pass it on,
                                // unless an attempt took this very grant (a task holds it).
                                _ => {
                                    if !took_already(&start.shared, token, fence) {
                                        leave_lock_key(&start, lock_key, token).await;
                                    }
                                }
                            }
                        } else if let Ok(lock_key) = std::str::from_utf8(payload)
                            && let Some(name) = routes.locks.get(lock_key)
                            && !lingering.contains_key(name)
                        {
                            // Taken out of the queue and told to try.
                            wake(&hub, &start.shared, name, |st| {
                                st.queued.remove(name);
                            });
                        }
                    } else if let Ok(channel) = std::str::from_utf8(&channel)
                        && let Some(name) = routes.keyspace.get(channel)
                        && !lingering.contains_key(name)
                        && GONE_EVENTS.contains(&payload)
                    {
                        wake(&hub, &start.shared, name, |_| {});
                    }
                    // Let the woken waiter run before this task reads the socket again (a read
                    // that finds nothing is a wasted system call on the new holder's way).
                    tokio::task::yield_now().await;
                }
            }
        }
        // Lingering channels are not subscribed again.
        for (key, _) in lingering.drain() {
            routes.apply(&start, &Cmd::Unsubscribe(key));
        }
        tracing::debug!(target: "distlock", "pub/sub connection lost; reconnecting");
        hub.unconfirm_all();
        forget_hints(&start.shared);
        hub.notify_all();
    }
}

/// Whether an attempt of ours took the lock this grant (of `token`, with `fence`) hands over:
/// then a task holds it, and the message, late, must not pass it on. Forgets the record.
fn took_already(shared: &Shared, token: &str, fence: u64) -> bool {
    let mut st = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let found = st.grants.iter().find_map(|(name, g)| match g {
        Grant::Taken { token: t, fence: f } if t == token && *f == fence => Some(name.clone()),
        _ => None,
    });
    found.is_some_and(|name| st.grants.remove(&name).is_some())
}

/// Whether this client must leave `key`'s queue now that nobody here waits: a registration of
/// ours is still queued, or a lock was handed to us that nobody took.
fn must_leave(shared: &Shared, key: &str) -> bool {
    let st = shared.lock().unwrap_or_else(PoisonError::into_inner);
    st.queued.contains_key(key) || matches!(st.grants.get(key), Some(Grant::Handed { .. }))
}

fn forget_hints(shared: &Shared) {
    let mut st = shared.lock().unwrap_or_else(PoisonError::into_inner);
    st.wakes += 1;
    st.elsewhere.clear();
    // Releases that found us deaf (PUBLISH reached nobody) dropped our registrations.
    st.queued.clear();
}

/// Nobody of this client waits for `key` any more: leave its queue, and pass on a lock handed
/// to us meanwhile (best effort; the registration expires, and an unused grant with its TTL).
async fn leave_queue(start: &Start, key: &str) {
    let handed = {
        let mut st = start.shared.lock().unwrap_or_else(PoisonError::into_inner);
        st.regs.remove(key);
        st.queued.remove(key);
        st.served.remove(key);
        // A `Taken` record stays: its grant message may still come, and must not pass on a
        // lock a task of ours holds.
        if matches!(st.grants.get(key), Some(Grant::Handed { .. }))
            && let Some(Grant::Handed { token, .. }) = st.grants.remove(key)
        {
            token
        } else {
            String::new()
        }
    };
    leave_lock_key(start, &start.layout.lock_key(key), &handed).await;
}

async fn leave_lock_key(start: &Start, lock_key: &str, handed: &str) {
    static LEAVE: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = LEAVE.get_or_init(|| redis::Script::new(with_lib!("scripts/leave.lua")));
    let keys = LockKeys::derive(lock_key.to_owned());
    let mut now = itoa::Buffer::new();
    let lock_keys = [keys.lock(), keys.meta(), keys.waiters()];
    let wake = start.wake.for_lock(lock_key);
    let args = [&*wake, handed, now.format(crate::scripts::unix_ms())];
    let call = start
        .node
        .run(script, &lock_keys, &args, "leaving the waiters' queue");
    if let Ok(Err(e)) = tokio::time::timeout(start.response_timeout, call).await {
        tracing::debug!(target: "distlock", lock_key, error = %e, "leaving the waiters' queue failed");
    }
}

/// Waits before reconnecting (10 ms doubling to 1 s), still taking commands meanwhile.
async fn backoff(attempt: &mut u32, start: &mut Start, routes: &mut Routes) {
    let delay = Duration::from_millis(10 * (1u64 << (*attempt).min(7))).min(Duration::from_secs(1));
    *attempt = attempt.saturating_add(1);
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return,
            cmd = start.rx.recv() => match cmd {
                Some(cmd) => routes.apply(start, &cmd),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_testkit::RedisServer;

    async fn direct(server: &RedisServer) -> Direct {
        let info = redis::Client::open(server.url()).unwrap();
        let target = Target::of(info.get_connection_info()).expect("a TCP target");
        lane::connect(&target, Duration::from_secs(5))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn messages_that_come_before_a_confirmation_are_kept_in_order() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let mut conn = Conn::Direct {
            io: direct(&server).await,
            early: VecDeque::new(),
        };
        let t = Duration::from_secs(5);
        assert!(matches!(conn.request("a", true, t).await, Reply::Done));
        // Published before we ask for "b": they are on the socket ahead of its confirmation.
        for i in 0..50 {
            assert_eq!(server.cli(&["PUBLISH", "a", &i.to_string()]), "1");
        }
        assert!(matches!(conn.request("b", true, t).await, Reply::Done));
        assert_eq!(server.cli(&["PUBLISH", "b", "last"]), "1");
        for i in 0..50 {
            let m = conn.next().await.expect("a message");
            assert_eq!(
                (m.channel, m.payload),
                (b"a".to_vec(), i.to_string().into_bytes())
            );
        }
        let m = conn.next().await.expect("a message");
        assert_eq!((m.channel, m.payload), (b"b".to_vec(), b"last".to_vec()));
        // Unsubscribed: a message to "a" no longer comes.
        assert!(matches!(conn.request("a", false, t).await, Reply::Done));
        assert_eq!(server.cli(&["PUBLISH", "a", "late"]), "0");
    }

    #[tokio::test]
    async fn a_subscription_the_acl_forbids_is_refused_and_the_connection_stays() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        server.cli(&[
            "ACL",
            "SETUSER",
            "deaf",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
            "&ok",
        ]);
        let url = format!("redis://deaf:pw@127.0.0.1:{}", server.port());
        let info = redis::Client::open(url).unwrap();
        let target = Target::of(info.get_connection_info()).unwrap();
        let mut conn = Conn::Direct {
            io: lane::connect(&target, Duration::from_secs(5))
                .await
                .unwrap(),
            early: VecDeque::new(),
        };
        let t = Duration::from_secs(5);
        assert!(matches!(conn.request("no", true, t).await, Reply::Refused));
        assert!(matches!(conn.request("ok", true, t).await, Reply::Done));
        assert_eq!(server.cli(&["PUBLISH", "ok", "x"]), "1");
        let m = conn.next().await.expect("a message");
        assert_eq!(m.payload, b"x".to_vec());
    }

    #[test]
    fn only_message_pushes_are_messages() {
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let m = message(Value::Array(vec![bulk(b"message"), bulk(b"c"), bulk(b"p")])).unwrap();
        assert_eq!((m.channel, m.payload), (b"c".to_vec(), b"p".to_vec()));
        for v in [
            Value::Array(vec![bulk(b"subscribe"), bulk(b"c"), Value::Int(1)]),
            Value::Array(vec![bulk(b"message"), bulk(b"c")]),
            Value::Array(vec![bulk(b"message"), bulk(b"c"), bulk(b"p"), bulk(b"q")]),
            Value::Array(vec![bulk(b"message"), bulk(b"c"), Value::Int(1)]),
            Value::Int(1),
            Value::Nil,
        ] {
            assert!(message(v).is_none());
        }
    }

    fn handed(st: &WaitState, name: &str) -> Option<(String, u64, u64)> {
        match st.grants.get(name)? {
            Grant::Handed { token, fence, seq } => Some((token.clone(), *fence, *seq)),
            Grant::Taken { .. } => None,
        }
    }

    /// A state where the task with token `t` took lock `k` with fence 5.
    fn took_t_with_fence_5() -> WaitState {
        let mut st = WaitState::default();
        st.grants.insert(
            "k".into(),
            Grant::Taken {
                token: "t".into(),
                fence: 5,
            },
        );
        st
    }

    #[test]
    fn the_message_of_a_grant_an_attempt_already_took_is_ignored() {
        let mut st = took_t_with_fence_5();
        record_grant(&mut st, "k", 5, 1, "t");
        assert!(st.grants.is_empty());
    }

    #[test]
    fn a_later_grant_to_a_token_that_took_the_lock_before_is_kept_for_take_over() {
        // The token's task took the lock (fence 5) and released it; another registration of
        // the same token was still queued, and a release handed the lock to it (fence 7).
        // Dropping that message left the lock with nobody until its TTL ran out.
        let mut st = took_t_with_fence_5();
        st.queued.insert("k".into(), "reg".into());
        record_grant(&mut st, "k", 7, 3, "t");
        assert_eq!(handed(&st, "k"), Some(("t".into(), 7, 3)));
        assert!(st.queued.is_empty());
        // Another token's Taken mark does not hide a grant either.
        record_grant(&mut st, "j", 9, 4, "u");
        assert_eq!(handed(&st, "j"), Some(("u".into(), 9, 4)));
    }
}
