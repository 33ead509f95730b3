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
//! It is a direct connection (see [`crate::direct`]) read by this task itself, over TCP, a Unix
//! socket or TLS: a wake-up reaches the waiter with one task hand-off, where redis-rs's pub/sub
//! connection adds a driver task and a channel (about a tenth of a hand-off between processes
//! on one CPU). Over TLS, an attempt whose direct connection cannot be opened (its handshake
//! failed) uses redis-rs's.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_core::engine::Subscription;
use distlock_core::recipes::WakeHub;
use futures_util::StreamExt;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use crate::config::RedisConfig;
use crate::connection::ServerConnection;
use crate::direct::{self, Endpoint, RespConnection};
use crate::handover::{Handovers, parse_grant, parse_told};
use crate::keys::{KeyLayout, LockKeys, WakeChannel};
use crate::scripts::{Scripts, unix_ms};

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
    /// The last exclusive waiter of this client for the lock stopped waiting (its readers or
    /// permits may wait on).
    WritersLeft(String),
}

/// The shared subscriber of one backend.
pub(crate) struct Subscriber {
    hub: WakeHub,
    /// Commands to the task.
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Taken by the task when it starts (at the first subscription), with the receiving end
    /// of `_stop`.
    start: Mutex<Option<(SubscriberTask, oneshot::Receiver<()>)>>,
    /// Dropped with the subscriber (the last clone of its engine): the task then ends, and
    /// its connection closes. Without it, the task of an engine left behind (a Sentinel
    /// master that failed over) would keep reconnecting to a dead server for ever.
    _stop: oneshot::Sender<()>,
}

/// What the subscriber's task owns: its commands, where to connect, and what it tells.
struct SubscriberTask {
    rx: mpsc::UnboundedReceiver<Cmd>,
    client: redis::Client,
    /// Where a direct connection goes (`None` on a Cluster, or when the direct connection
    /// cannot go there).
    target: Option<Endpoint>,
    /// Requests (leaving a queue) go through the engine's connections.
    conn: ServerConnection,
    scripts: Arc<Scripts>,
    wake: WakeChannel,
    /// A Cluster's seed URLs: wake-ups come on sharded channels, through redis-rs's Cluster
    /// connection (it subscribes on each slot's node, and again after slots move).
    cluster: Option<Vec<String>>,
    /// The deployment's configuration (its CA and client certificate for the Cluster
    /// connection).
    config: RedisConfig,
    handovers: Handovers,
    layout: KeyLayout,
    db: i64,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        conn: ServerConnection,
        scripts: Arc<Scripts>,
        config: &RedisConfig,
        wake: WakeChannel,
        cluster: Option<Vec<String>>,
        handovers: Handovers,
    ) -> Self {
        let layout = config.layout.clone();
        let (connect_timeout, response_timeout) = (config.connect_timeout, config.response_timeout);
        let (tx, rx) = mpsc::unbounded_channel();
        let tx2 = tx.clone();
        let cmds = tx.clone();
        let hub = WakeHub::new(
            move |key| {
                let _ = tx.send(Cmd::Subscribe(key.to_owned()));
            },
            move |key| {
                let _ = tx2.send(Cmd::Unsubscribe(key.to_owned()));
            },
        );
        let db = client.get_connection_info().redis_settings().db();
        let target = conn.endpoint().filter(|_| !direct::switched_off("events"));
        let (stop, stopped) = oneshot::channel();
        Subscriber {
            _stop: stop,
            hub,
            cmds,
            start: Mutex::new(Some((
                SubscriberTask {
                    rx,
                    target,
                    client,
                    conn,
                    scripts,
                    wake,
                    cluster,
                    config: config.clone(),
                    handovers,
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

    /// The last exclusive waiter of this client for `key` stopped waiting: its registrations
    /// leave the queue, and a lock handed to it meanwhile is passed on (readers of this client
    /// may still wait for `key`: they never take a writer's grant).
    pub(crate) fn writers_left(&self, key: &str) {
        let _ = self.cmds.send(Cmd::WritersLeft(key.to_owned()));
    }

    /// A subscription to `key`'s release events, confirmed by the server within the response
    /// timeout (or returned unconfirmed, in which case the waiter's fallback interval bounds
    /// its sleep).
    pub(crate) async fn subscribe(
        &self,
        key: &str,
        token: Option<&str>,
        response_timeout: Duration,
    ) -> Subscription {
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
        let mut sub = match token {
            Some(token) => self.hub.subscribe_token(key, token),
            None => self.hub.subscribe(key),
        };
        if !sub.confirmed(response_timeout).await {
            tracing::debug!(target: "distlock", key,
                "release-event subscription not confirmed in time; the wait falls back to polling");
        }
        sub
    }
}

/// The channel subscribed to for one lock: its keyspace channel, or on a Cluster its sharded
/// wake channel.
fn key_channel(start: &SubscriberTask, key: &str) -> String {
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
    fn apply(&mut self, start: &SubscriberTask, cmd: &Cmd) {
        match cmd {
            Cmd::Subscribe(k) => {
                self.keyspace.insert(key_channel(start, k), k.clone());
                self.locks.insert(start.layout.lock_key(k), k.clone());
            }
            Cmd::Unsubscribe(k) => {
                self.keyspace.remove(&key_channel(start, k));
                self.locks.remove(&start.layout.lock_key(k));
            }
            // While disconnected nothing is sent: a grant that comes after the reconnection,
            // while no writer of ours waits, is passed on then.
            Cmd::WritersLeft(_) => {}
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
    Direct {
        io: RespConnection,
        early: VecDeque<Msg>,
    },
    /// redis-rs's pub/sub connection: where the direct connection cannot go, or over TLS when
    /// it could not be opened.
    RedisRs {
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
    async fn open(start: &SubscriberTask) -> Result<Conn, String> {
        if let Some(seeds) = &start.cluster {
            let (tx, pushes) = mpsc::unbounded_channel();
            let client = start
                .config
                .cluster_builder(seeds.iter().map(String::as_str))
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
            match direct::connect(target, start.connect_timeout).await {
                Ok(io) => {
                    return Ok(Conn::Direct {
                        io,
                        early: VecDeque::new(),
                    });
                }
                // Over TLS, any failure (a handshake, or an unreachable server) is tried again
                // with redis-rs's connection: a handshake only the direct connection fails
                // must not leave the waiters without events.
                Err(e) if target.is_tls() => {
                    tracing::debug!(target: "distlock", error = %e,
                        "the direct pub/sub connection could not be opened; trying redis-rs's");
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        match tokio::time::timeout(start.connect_timeout, start.client.get_async_pubsub()).await {
            Ok(Ok(c)) => {
                let (sink, stream) = c.split();
                Ok(Conn::RedisRs { sink, stream })
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
            Conn::RedisRs { sink, .. } if subscribe => {
                tokio::time::timeout(timeout, sink.subscribe(chan)).await
            }
            Conn::RedisRs { sink, .. } => {
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
            Conn::RedisRs { stream, .. } => stream.next().await.map(|m| Msg {
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
                    // A node's connection broke: messages may have been lost meanwhile. SubscriberTask
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
    io: &mut RespConnection,
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

/// A `message` push as channel and payload (for the fuzz targets: `crate::fuzzing`).
#[cfg(fuzzing)]
pub(crate) fn fuzz_message(v: Value) -> Option<(Vec<u8>, Vec<u8>)> {
    message(v).map(|m| (m.channel, m.payload))
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

async fn run(hub: WakeHub, mut start: SubscriberTask) {
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
        start.handovers.forget_hints();
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
                        Cmd::WritersLeft(key) => {
                            if !start.handovers.writer_waiting(&key) {
                                let handed = start.handovers.leave(&key);
                                let lock_key = start.layout.lock_key(&key);
                                leave_lock_key(&start, &lock_key, &handed, true).await;
                            }
                        }
                        Cmd::Unsubscribe(key) => {
                            // A registration of ours still queued, or a grant nobody took:
                            // leave now (a release would hand the lock to nobody). Otherwise
                            // the next wait will likely come soon: stay subscribed a while.
                            if start.handovers.must_leave(&key) {
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
                                Some(name)
                                    if !lingering.contains_key(name)
                                        && start.handovers.writer_waiting(name) =>
                                {
                                    start.handovers.granted(name, fence, seq, token);
                                    hub.notify(name);
                                }
                                // Handed to us while only our readers or permits wait (they
                                // never take a writer's grant): pass it on.
                                Some(name) if !lingering.contains_key(name) => {
                                    if !start.handovers.took_already(token, fence) {
                                        let handed = start.handovers.leave(name);
                                        let handed = if handed.is_empty() { token } else { &handed };
                                        leave_lock_key(&start, lock_key, handed, true).await;
                                    }
                                }
                                // Handed to us, but nobody here waits any more: pass it on,
                                // unless an attempt took this very grant (a task holds it).
                                _ => {
                                    if !start.handovers.took_already(token, fence) {
                                        leave_lock_key(&start, lock_key, token, false).await;
                                    }
                                }
                            }
                        } else if let Some((token, lock_key)) = parse_told(payload)
                            && let Some(name) = routes.locks.get(lock_key)
                            && !lingering.contains_key(name)
                        {
                            // One waiter told by its token that a permit may be its own, or
                            // that its reader's share is written: that task alone tries if it
                            // waits by its token (a permit's), else every waiter of the name.
                            // Our other registrations are still queued: none is forgotten.
                            hub.notify_token(name, token);
                        } else if let Ok(lock_key) = std::str::from_utf8(payload)
                            && let Some(name) = routes.locks.get(lock_key)
                            && !lingering.contains_key(name)
                        {
                            // Taken out of the queue and told to try.
                            start.handovers.told_to_try(name);
                            hub.notify(name);
                        }
                    } else if let Ok(channel) = std::str::from_utf8(&channel)
                        && let Some(name) = routes.keyspace.get(channel)
                        && !lingering.contains_key(name)
                        && GONE_EVENTS.contains(&payload)
                    {
                        start.handovers.key_gone(name);
                        hub.notify(name);
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
        start.handovers.forget_hints();
        hub.notify_all();
    }
}

/// Nobody of this client waits for `key` any more: leave its queue, and pass on a lock handed
/// to us meanwhile (best effort; the registration expires, and an unused grant with its TTL).
async fn leave_queue(start: &SubscriberTask, key: &str) {
    let handed = start.handovers.leave(key);
    leave_lock_key(start, &start.layout.lock_key(key), &handed, false).await;
}

/// Runs `leave.lua` for `lock_key`: our registrations leave its queue (only the exclusive
/// waiters' with `writers_only`), and a lock handed to `handed` (if not empty) is passed on.
async fn leave_lock_key(start: &SubscriberTask, lock_key: &str, handed: &str, writers_only: bool) {
    let keys = LockKeys::derive(lock_key.to_owned());
    let mut now = itoa::Buffer::new();
    let lock_keys = [keys.lock(), keys.meta(), keys.waiters(), keys.fence()];
    let wake = start.wake.for_lock(lock_key);
    let only = if writers_only { "1" } else { "" };
    let args = [&*wake, handed, now.format(unix_ms()), only];
    let call = start.conn.run(
        &start.scripts.leave,
        &lock_keys,
        &args,
        "leaving the waiters' queue",
    );
    if let Ok(Err(e)) = tokio::time::timeout(start.response_timeout, call).await {
        tracing::debug!(target: "distlock", lock_key, error = %e, "leaving the waiters' queue failed");
    }
}

/// Waits before reconnecting (10 ms doubling to 1 s), still taking commands meanwhile.
async fn backoff(attempt: &mut u32, start: &mut SubscriberTask, routes: &mut Routes) {
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

    fn endpoint(url: &str) -> Endpoint {
        let config = RedisConfig::from_url(url).unwrap();
        let info = redis::Client::open(url).unwrap();
        Endpoint::of(info.get_connection_info(), &config).expect("a direct target")
    }

    async fn direct(server: &RedisServer) -> RespConnection {
        let target = endpoint(&server.url());
        direct::connect(&target, Duration::from_secs(5))
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
        let target = endpoint(&url);
        let mut conn = Conn::Direct {
            io: direct::connect(&target, Duration::from_secs(5))
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

    /// Over TLS the subscriber reads a direct connection too; one whose handshake fails
    /// (`target`, a CA that does not sign the server's certificate) gives way to redis-rs's.
    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn over_tls_the_pub_sub_connection_is_direct_or_redis_rs_when_refused() {
        let pki = distlock_testkit::Pki::generate();
        let Some(server) = RedisServer::start_tls(&pki, false, &[]) else {
            return;
        };
        let base = format!("rediss://127.0.0.1:{}/", server.tls_port());
        let good = RedisConfig::from_url(&format!("{base}?tls_ca={}", pki.ca.display())).unwrap();
        let stranger = format!("{base}?tls_ca={}", pki.other_ca.display());
        let (conn, client) = ServerConnection::connect(&good).await.unwrap();
        for (target, direct) in [(conn.endpoint(), true), (Some(endpoint(&stranger)), false)] {
            let (_tx, rx) = mpsc::unbounded_channel();
            let task = SubscriberTask {
                rx,
                client: client.clone(),
                target,
                conn: conn.clone(),
                scripts: Arc::new(Scripts::new()),
                wake: WakeChannel::new(&good.layout, "tls", false),
                cluster: None,
                config: good.clone(),
                handovers: Handovers::default(),
                layout: good.layout.clone(),
                db: 0,
                connect_timeout: Duration::from_secs(5),
                response_timeout: Duration::from_secs(5),
            };
            let mut opened = Conn::open(&task).await.expect("a pub/sub connection");
            assert_eq!(matches!(opened, Conn::Direct { .. }), direct);
            let t = Duration::from_secs(5);
            assert!(matches!(opened.request("c", true, t).await, Reply::Done));
            assert_eq!(server.cli(&["PUBLISH", "c", "over tls"]), "1");
            let m = opened.next().await.expect("a message");
            assert_eq!(m.payload, b"over tls".to_vec());
        }
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
}
