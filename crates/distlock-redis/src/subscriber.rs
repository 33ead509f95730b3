//! Release events for waiters: one pub/sub connection per backend, shared by every waiter.
//!
//! For each watched lock it subscribes to two channels:
//! - `<lock key>:released`, which distlock's release script publishes to;
//! - `__keyspace@<db>__:<lock key>`, which the server publishes to when the key is deleted,
//!   expires or is evicted, if keyspace notifications are on (`notify-keyspace-events` with
//!   `K` and `g` plus `x`, for example `Kgx`). This wakes waiters when a client in another
//!   language deletes its plain lock key, or when a crashed holder's lease runs out.
//!
//! The connection is opened at the first wait, not at connect: uncontended users never open it.
//! When it breaks, it is reopened with back-off, every channel is subscribed again, and every
//! waiter is woken (an event may have been missed in between).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_core::{Subscription, WakeHub};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::keys::KeyLayout;

/// The keyspace events that mean the lock key is gone.
const GONE_EVENTS: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];

enum Cmd {
    Subscribe(String),
    Unsubscribe(String),
}

/// Leaves the waiters' queue of one lock (when this client has nobody waiting for it any more).
const LEAVE_QUEUE: &str =
    "redis.pcall('ZREM', KEYS[1], ARGV[1]) redis.pcall('HDEL', KEYS[2], ARGV[1]) return 1";

/// The shared subscriber of one backend.
pub(crate) struct Subscriber {
    hub: WakeHub,
    /// Taken by the task when it starts (at the first subscription).
    start: Mutex<Option<Start>>,
}

struct Start {
    rx: mpsc::UnboundedReceiver<Cmd>,
    client: redis::Client,
    conn: redis::aio::ConnectionManager,
    client_id: Arc<str>,
    layout: KeyLayout,
    db: i64,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        conn: redis::aio::ConnectionManager,
        layout: KeyLayout,
        client_id: Arc<str>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
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
        Subscriber {
            hub,
            start: Mutex::new(Some(Start {
                rx,
                client,
                conn,
                client_id,
                layout,
                db,
                connect_timeout,
                response_timeout,
            })),
        }
    }

    /// Whether a waiter of this client is subscribed to `key`'s wake-ups, confirmed by the
    /// server (it then queues up for a targeted one; a waiter that cannot hear them must not,
    /// or releases would reserve the lock for it in vain).
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
        if let Some(start) = started {
            tokio::spawn(run(self.hub.clone(), start));
        }
        let mut sub = self.hub.subscribe(key);
        if !sub.confirmed(response_timeout).await {
            tracing::debug!(target: "distlock", key,
                "release-event subscription not confirmed in time; the wait falls back to polling");
        }
        sub
    }
}

/// The channels watched for one lock, and the lock name each maps back to.
fn channels(layout: &KeyLayout, db: i64, key: &str) -> [String; 2] {
    let lock_key = layout.lock_key(key);
    [
        KeyLayout::release_channel(&lock_key),
        format!("__keyspace@{db}__:{lock_key}"),
    ]
}

async fn run(hub: WakeHub, mut start: Start) {
    // Channel name -> lock name.
    let mut routes: HashMap<String, String> = HashMap::new();
    let mut attempt = 0u32;
    loop {
        // Drain commands that came while disconnected.
        while let Ok(cmd) = start.rx.try_recv() {
            apply(&mut routes, &start, &cmd);
        }
        if start.rx.is_closed() && routes.is_empty() {
            return;
        }
        let conn =
            tokio::time::timeout(start.connect_timeout, start.client.get_async_pubsub()).await;
        let (mut sink, mut stream) = match conn {
            Ok(Ok(c)) => c.split(),
            Ok(Err(e)) => {
                tracing::debug!(target: "distlock", error = %e, "pub/sub connection failed");
                backoff(&mut attempt, &mut start, &mut routes).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(target: "distlock", "pub/sub connection timed out");
                backoff(&mut attempt, &mut start, &mut routes).await;
                continue;
            }
        };
        let all: Vec<String> = routes.keys().cloned().collect();
        let mut broken = false;
        for chan in &all {
            match tokio::time::timeout(start.response_timeout, sink.subscribe(chan)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if !e.is_io_error() && !e.is_connection_dropped() => {}
                _ => {
                    broken = true;
                    break;
                }
            }
        }
        if broken {
            backoff(&mut attempt, &mut start, &mut routes).await;
            continue;
        }
        attempt = 0;
        let names: HashSet<&String> = routes.values().collect();
        for name in names {
            hub.set_confirmed(name, true);
        }
        // Events may have been missed while disconnected.
        hub.notify_all();
        loop {
            tokio::select! {
                cmd = start.rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    let (chans, subscribe) = match &cmd {
                        Cmd::Subscribe(k) => (channels(&start.layout, start.db, k), true),
                        Cmd::Unsubscribe(k) => (channels(&start.layout, start.db, k), false),
                    };
                    apply(&mut routes, &start, &cmd);
                    let mut broken = false;
                    let mut confirmed = true;
                    for chan in &chans {
                        let reply = if subscribe {
                            tokio::time::timeout(start.response_timeout, sink.subscribe(chan)).await
                        } else {
                            tokio::time::timeout(start.response_timeout, sink.unsubscribe(chan)).await
                        };
                        match reply {
                            Ok(Ok(())) => {}
                            // Refused by the server (an ACL without this channel): keep the
                            // connection; this waiter falls back to polling.
                            Ok(Err(e)) if !e.is_io_error() && !e.is_connection_dropped() => {
                                tracing::debug!(target: "distlock", channel = %chan, error = %e,
                                    "subscription refused");
                                confirmed = false;
                            }
                            _ => {
                                broken = true;
                                break;
                            }
                        }
                    }
                    if broken {
                        break;
                    }
                    match &cmd {
                        Cmd::Subscribe(k) if confirmed => hub.set_confirmed(k, true),
                        Cmd::Unsubscribe(k) => leave_queue(&start, k).await,
                        Cmd::Subscribe(_) => {}
                    }
                }
                msg = stream.next() => {
                    let Some(msg) = msg else { break };
                    let channel = msg.get_channel_name();
                    let Some(name) = routes.get(channel) else { continue };
                    let payload = msg.get_payload_bytes();
                    if channel.starts_with("__keyspace@") {
                        if !GONE_EVENTS.contains(&payload) {
                            continue;
                        }
                    } else if payload != b"*"
                        && payload != start.client_id.as_bytes()
                        && payload.len() == start.client_id.len()
                    {
                        // A release woke another client's waiter; ours keeps its place.
                        continue;
                    }
                    hub.notify(name);
                }
            }
        }
        tracing::debug!(target: "distlock", "pub/sub connection lost; reconnecting");
        hub.unconfirm_all();
        hub.notify_all();
    }
}

/// Nobody of this client waits for `key` any more: leave its queue, so a release does not wake
/// us in vain (best effort; the registration also expires by itself).
async fn leave_queue(start: &Start, key: &str) {
    let lock_key = start.layout.lock_key(key);
    let [waiters, alive, _] = KeyLayout::queue_keys(&lock_key);
    let mut conn = start.conn.clone();
    let script = redis::Script::new(LEAVE_QUEUE);
    let mut inv = script.key(waiters);
    inv.key(alive).arg(&*start.client_id);
    let call = inv.invoke_async::<redis::Value>(&mut conn);
    if let Ok(Err(e)) = tokio::time::timeout(start.response_timeout, call).await {
        tracing::debug!(target: "distlock", key, error = %e, "leaving the waiters' queue failed");
    }
}

fn apply(routes: &mut HashMap<String, String>, start: &Start, cmd: &Cmd) {
    match cmd {
        Cmd::Subscribe(k) => {
            for c in channels(&start.layout, start.db, k) {
                routes.insert(c, k.clone());
            }
        }
        Cmd::Unsubscribe(k) => {
            for c in channels(&start.layout, start.db, k) {
                routes.remove(&c);
            }
        }
    }
}

/// Waits before reconnecting (10 ms doubling to 1 s), still taking commands meanwhile.
async fn backoff(attempt: &mut u32, start: &mut Start, routes: &mut HashMap<String, String>) {
    let delay = Duration::from_millis(10 * (1u64 << (*attempt).min(7))).min(Duration::from_secs(1));
    *attempt = attempt.saturating_add(1);
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return,
            cmd = start.rx.recv() => match cmd {
                Some(cmd) => apply(routes, start, &cmd),
                None => return,
            },
        }
    }
}
