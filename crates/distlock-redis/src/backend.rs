//! The single-instance Redis engine.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_core::{
    AcquireRequest, Attempt, Backend, Capabilities, Fencing, LeaseCheck, LockError, LockStatus,
    RenewItem, Subscription, Token,
};
use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::RedisConfig;
use crate::error::{map_err, protocol};
use crate::keys::KeyLayout;
use crate::subscriber::Subscriber;

/// The Lua scripts, hashed once per backend and run with EVALSHA (loaded on NOSCRIPT).
struct Scripts {
    acquire: redis::Script,
    extend: redis::Script,
    release: redis::Script,
    status: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: redis::Script::new(include_str!("scripts/acquire.lua")),
            extend: redis::Script::new(include_str!("scripts/extend.lua")),
            release: redis::Script::new(include_str!("scripts/release.lua")),
            status: redis::Script::new(include_str!("scripts/status.lua")),
        }
    }
}

/// A lock engine on one Redis server (or a primary whose failover you accept; see the docs on
/// replication).
///
/// - acquire: one script, one round trip: `SET key token NX PX ttl` plus the fence counter's
///   `HINCRBY`; a retry with our own token re-arms the TTL and returns the same fence;
/// - release: compare-and-delete, and a `PUBLISH` that wakes waiters, in the same script;
/// - extend: compare-and-pexpire; the watchdog's renewals of many locks go out as one pipeline;
/// - waiting: one shared pub/sub connection (opened at the first wait) watches the release
///   channel and the key's keyspace notifications;
/// - fencing: a per-key counter that never expires, strictly increasing with every new holder
///   as long as the server keeps its data (persistence on, no failover to a lagging replica).
#[derive(Clone)]
pub struct RedisBackend {
    conn: ConnectionManager,
    layout: KeyLayout,
    scripts: std::sync::Arc<Scripts>,
    subscriber: std::sync::Arc<Subscriber>,
    response_timeout: Duration,
    /// This backend's id in the waiters' queue (one per backend, shared by its tasks).
    client_id: std::sync::Arc<str>,
    target: String,
}

/// How long (ms) a release reserves the lock for the waiter it wakes (others are not woken, and
/// other distlock clients' attempts are refused meanwhile; plain `SET NX` clients are not).
const RESERVATION_MS: &str = "100";

/// How long (ms) a waiter's place in the queue lasts without a new attempt. Waiters try again at
/// least every `wake_fallback` (1 s by default), which renews it.
const REGISTRATION_MS: &str = "5000";

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.target)
            .field("layout", &self.layout)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to the server a URL names (see [`RedisConfig`] for the accepted forms).
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when the server cannot be reached;
    /// `Auth` when it refuses the credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(RedisConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: RedisConfig) -> Result<Self, LockError> {
        let target = config.redacted_url();
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| map_err(e, "opening the Redis client"))?;
        let client_id: std::sync::Arc<str> = Token::generate().as_str().into();
        let cm = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(client.clone(), cm)
            .await
            .map_err(|e| map_err(e, &format!("connecting to {target}")))?;
        // Authentication errors surface on the first command, not at connect: check now.
        let _: Value = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| map_err(e, &format!("talking to {target}")))?;
        let subscriber = Subscriber::new(
            client.clone(),
            conn.clone(),
            config.layout.clone(),
            client_id.clone(),
            config.connect_timeout,
            config.response_timeout,
        );
        Ok(RedisBackend {
            conn,
            layout: config.layout,
            scripts: std::sync::Arc::new(Scripts::new()),
            subscriber: std::sync::Arc::new(subscriber),
            response_timeout: config.response_timeout,
            client_id,
            target,
        })
    }

    /// The Redis key that holds the lock `name` (a plain string whose value is the token).
    /// Another client (redis-py, node-redlock, redsync, `redis-cli SET … NX PX`) that locks this
    /// key excludes ours, and ours excludes it.
    pub fn lock_key(&self, name: &str) -> String {
        self.layout.lock_key(name)
    }

    /// The hash that keeps the fence counter (never expires) and the holder's label.
    pub fn meta_key(&self, name: &str) -> String {
        KeyLayout::meta_key(&self.layout.lock_key(name))
    }

    /// The channel a release of the lock `name` is announced on.
    pub fn release_channel(&self, name: &str) -> String {
        KeyLayout::release_channel(&self.layout.lock_key(name))
    }

    async fn run(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[&str],
        doing: &str,
    ) -> Result<Value, LockError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn)
            .await
            .map_err(|e| map_err(e, doing))
    }

    /// One pipeline of compare-and-pexpire scripts, one reply per item (errors such as
    /// NOSCRIPT come back as `Value::ServerError` in their place).
    async fn extend_pipeline(
        &self,
        lock_keys: &[String],
        items: &[RenewItem<'_>],
    ) -> Result<Vec<Value>, redis::RedisError> {
        let hash = self.scripts.extend.get_hash();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (k, item) in lock_keys.iter().zip(items) {
            pipe.cmd("EVALSHA")
                .arg(hash)
                .arg(1)
                .arg(k)
                .arg(item.token.as_str())
                .arg(ttl_ms(item.ttl));
        }
        let mut conn = self.conn.clone();
        pipe.query_async(&mut conn).await
    }
}

fn lease_check(v: &Value) -> Option<LeaseCheck> {
    match v {
        Value::Int(1) => Some(LeaseCheck::Ours),
        Value::Int(0) => Some(LeaseCheck::Missing),
        Value::Int(-1) => Some(LeaseCheck::Foreign),
        _ => None,
    }
}

/// The same error for every item of a failed batch.
fn copy_err(e: &LockError) -> LockError {
    LockError::new(e.kind(), e.message().to_owned())
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

fn ttl_ms(ttl: Duration) -> u64 {
    // Options guarantee whole milliseconds ≥ 1 and at most a year; clamp anyway.
    (ttl.as_millis() as u64).max(1)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }

    async fn try_acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis lock";
        let lock_key = self.layout.lock_key(req.key);
        let meta_key = KeyLayout::meta_key(&lock_key);
        let ttl = ttl_ms(req.ttl).to_string();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let now = now.to_string();
        let [waiters, alive, resv] = KeyLayout::queue_keys(&lock_key);
        // Queue up for a targeted wake-up only while subscribed to them.
        let id = if self.subscriber.is_watching(req.key) {
            &*self.client_id
        } else {
            ""
        };
        let reply = self
            .run(
                &self.scripts.acquire,
                &[&lock_key, &meta_key, &waiters, &alive, &resv],
                &[
                    req.token.as_str(),
                    &ttl,
                    req.owner,
                    &now,
                    id,
                    REGISTRATION_MS,
                ],
                DOING,
            )
            .await?;
        let Value::Array(items) = &reply else {
            return Err(protocol(DOING, &reply));
        };
        match (items.first().and_then(int), items.get(1).and_then(int)) {
            (Some(1), Some(fence)) if fence > 0 => Ok(Attempt::Acquired {
                fence: Some(fence as u64),
            }),
            (Some(0), Some(pttl)) => Ok(Attempt::Busy {
                // -1: a foreign lock without TTL, or reserved for the waiter a release woke;
                // -2: it vanished in between.
                holder_ttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
            }),
            _ => Err(protocol(DOING, &reply)),
        }
    }

    async fn extend(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "extending a Redis lock";
        let lock_key = self.layout.lock_key(key);
        let ms = ttl_ms(ttl).to_string();
        let reply = self
            .run(
                &self.scripts.extend,
                &[&lock_key],
                &[token.as_str(), &ms],
                DOING,
            )
            .await?;
        lease_check(&reply).ok_or_else(|| protocol(DOING, &reply))
    }

    async fn release(&self, key: &str, token: &Token) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redis lock";
        let lock_key = self.layout.lock_key(key);
        let channel = KeyLayout::release_channel(&lock_key);
        let [waiters, alive, resv] = KeyLayout::queue_keys(&lock_key);
        let reply = self
            .run(
                &self.scripts.release,
                &[&lock_key, &waiters, &alive, &resv],
                &[token.as_str(), &channel, RESERVATION_MS],
                DOING,
            )
            .await?;
        lease_check(&reply).ok_or_else(|| protocol(DOING, &reply))
    }

    /// All renewals in one pipeline: one round trip however many locks are held.
    async fn extend_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> Vec<Result<LeaseCheck, LockError>> {
        const DOING: &str = "renewing Redis locks";
        if items.is_empty() {
            return Vec::new();
        }
        let lock_keys: Vec<String> = items.iter().map(|i| self.layout.lock_key(i.key)).collect();
        let mut replies = self.extend_pipeline(&lock_keys, items).await;
        if let Ok(r) = &replies
            && r.iter().any(is_noscript)
        {
            // The server lost its script cache (restart, SCRIPT FLUSH): load and send again.
            // Compare-and-pexpire is idempotent, so resending the ones that ran is harmless.
            let mut conn = self.conn.clone();
            if let Err(e) = self.scripts.extend.load_async(&mut conn).await {
                replies = Err(e);
            } else {
                replies = self.extend_pipeline(&lock_keys, items).await;
            }
        }
        match replies {
            Ok(values) if values.len() == items.len() => values
                .iter()
                .map(|v| match v {
                    Value::ServerError(e) => Err(map_err(e.clone().into(), DOING)),
                    other => lease_check(other).ok_or_else(|| protocol(DOING, other)),
                })
                .collect(),
            Ok(values) => {
                let err = protocol(DOING, &Value::Array(values));
                items.iter().map(|_| Err(copy_err(&err))).collect()
            }
            Err(e) => {
                let err = map_err(e, DOING);
                items.iter().map(|_| Err(copy_err(&err))).collect()
            }
        }
    }

    async fn subscribe(&self, key: &str) -> Result<Option<Subscription>, LockError> {
        Ok(Some(
            self.subscriber.subscribe(key, self.response_timeout).await,
        ))
    }

    async fn status(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a Redis lock's status";
        let lock_key = self.layout.lock_key(key);
        let meta_key = KeyLayout::meta_key(&lock_key);
        let reply = self
            .run(&self.scripts.status, &[&lock_key, &meta_key], &[], DOING)
            .await?;
        let Value::Array(items) = &reply else {
            return Err(protocol(DOING, &reply));
        };
        match items.first().and_then(int) {
            Some(0) => Ok(LockStatus::free()),
            Some(1) => {
                let ttl = items
                    .get(1)
                    .and_then(int)
                    .and_then(|p| (p >= 0).then(|| Duration::from_millis(p as u64)));
                let owner =
                    items
                        .get(2)
                        .and_then(text)
                        .map(|o| match items.get(3).and_then(text) {
                            Some(since) => format!("{o} since {since}"),
                            None => o,
                        });
                let fence = items.get(4).and_then(int).map(|f| f as u64);
                Ok(LockStatus::held(
                    owner.or_else(|| Some("(not a distlock client)".into())),
                    fence,
                    ttl,
                ))
            }
            _ => Err(protocol(DOING, &reply)),
        }
    }
}
