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
use std::sync::{Mutex, PoisonError};
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

/// The shared subscriber of one backend.
pub(crate) struct Subscriber {
    hub: WakeHub,
    /// Taken by the task when it starts (at the first subscription).
    start: Mutex<Option<Start>>,
}

struct Start {
    rx: mpsc::UnboundedReceiver<Cmd>,
    client: redis::Client,
    layout: KeyLayout,
    db: i64,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        layout: KeyLayout,
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
                layout,
                db,
                connect_timeout,
                response_timeout,
            })),
        }
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
                    if let Cmd::Subscribe(k) = &cmd && confirmed {
                        hub.set_confirmed(k, true);
                    }
                }
                msg = stream.next() => {
                    let Some(msg) = msg else { break };
                    let channel = msg.get_channel_name();
                    let Some(name) = routes.get(channel) else { continue };
                    if channel.starts_with("__keyspace@")
                        && !GONE_EVENTS.contains(&msg.get_payload_bytes())
                    {
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
