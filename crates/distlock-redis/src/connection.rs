//! The connection to one Redis server, or to a Cluster, as the engines talk to it: redis-rs's
//! multiplexed connection (reconnecting) and, to one server, the direct connection beside it
//! (see `direct`), with the command counter; and the typed runs of the scripts. The
//! single-instance engine has one; Redlock has one per master.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LeaseCheck, LockError, RenewItem};
use futures_util::future::Either;
use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use crate::config::{RedisConfig, WaitReplicas};
use crate::direct::{DirectConnection, Endpoint};
use crate::error::map_err;
use crate::replies::ScriptReply;
use crate::scripts::{LuaScript, ttl_ms};

/// A connection to one server, or to a Cluster; cheap to clone (the clones share the
/// connections).
#[derive(Clone)]
pub(crate) struct ServerConnection {
    transport: Transport,
    /// Commands sent (a pipeline counts each of its commands).
    sent: Arc<AtomicU64>,
    pub(crate) response_timeout: Duration,
    connect_timeout: Duration,
    /// The server's URL without credentials, for logs and errors.
    pub(crate) target: Arc<str>,
    /// `WAIT` for replicas after each write that takes or keeps a lock.
    pub(crate) wait: Option<WaitReplicas>,
}

/// Where a scan of the keys runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanNode {
    /// The one server (or any node of a Cluster, for a command about the Cluster).
    Server,
    /// A master of a Cluster, by the address it announces.
    Master { host: String, port: u16 },
}

/// The masters in a `CLUSTER NODES` answer that are not failing: `host:port@cport[,hostname]`
/// of each line whose flags say `master`.
fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let _id = words.next()?;
            let addr = words.next()?;
            let flags = words.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            let addr = addr.split([',', '@']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .filter(|(host, port)| !host.is_empty() && *port != 0)
        .collect()
}

/// How requests reach the server(s).
#[derive(Clone)]
enum Transport {
    /// One server: redis-rs's multiplexed connection, and a plain connection for whichever
    /// request finds it free (see `direct`).
    Single {
        multiplexed: ConnectionManager,
        direct: DirectConnection,
        /// Where direct connections go (this one's, and the subscriber's).
        endpoint: Option<Endpoint>,
    },
    /// A Cluster: redis-rs routes each request (one slot per pipeline) to the slot's master,
    /// following `MOVED` and `ASK`.
    Cluster(ClusterConnection),
}

impl ServerConnection {
    /// Connects and checks the credentials with a `PING` (redis-rs reports a refused `AUTH`
    /// only at the first command); the direct connection is opened too, but a failure there
    /// only means the multiplexed connection carries everything.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<(Self, redis::Client), LockError> {
        let (node, client) = Self::lazy(config)?;
        node.ping().await?;
        node.open_direct().await;
        Ok((node, client))
    }

    /// Connects to a Cluster through its seed nodes (`settings` gives the timeouts, `WAIT`
    /// and credentials) and checks it with a `PING` to every master.
    pub(crate) async fn connect_cluster(
        seeds: &[RedisConfig],
        settings: &RedisConfig,
    ) -> Result<Self, LockError> {
        check_wait(settings)?;
        let target = format!(
            "the Cluster at {}",
            seeds
                .iter()
                .map(RedisConfig::redacted_url)
                .collect::<Vec<_>>()
                .join(",")
        );
        let urls: Vec<&str> = seeds.iter().map(|s| s.url.as_str()).collect();
        let client = settings
            .cluster_builder(urls)
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .retries(2)
            .build()
            .map_err(|e| map_err(e, &format!("configuring {target}")))?;
        let limit = settings.connect_timeout + settings.response_timeout;
        let conn = match tokio::time::timeout(limit, client.get_async_connection()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(map_err(e, &format!("connecting to {target}"))),
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("connecting to {target}: no answer"),
                ));
            }
        };
        let node = ServerConnection {
            transport: Transport::Cluster(conn),
            sent: Arc::new(AtomicU64::new(0)),
            response_timeout: settings.response_timeout,
            connect_timeout: settings.connect_timeout,
            target: target.into(),
            wait: settings.wait,
        };
        node.ping().await?;
        Ok(node)
    }

    /// Where a direct connection to this server goes (`None` for a Cluster).
    pub(crate) fn endpoint(&self) -> Option<Endpoint> {
        match &self.transport {
            Transport::Single { endpoint, .. } => endpoint.clone(),
            Transport::Cluster(_) => None,
        }
    }

    async fn open_direct(&self) {
        if let Transport::Single { direct, .. } = &self.transport {
            direct.open().await;
        }
    }

    /// [`connect`](Self::connect), except that a server that cannot be reached now is not an
    /// error: the node is returned with `false`, and its connections keep trying at each use.
    /// Refused credentials are still an error.
    pub(crate) async fn connect_lazily(config: &RedisConfig) -> Result<(Self, bool), LockError> {
        let (node, _) = Self::lazy(config)?;
        match node.ping().await {
            Ok(()) => {
                node.open_direct().await;
                Ok((node, true))
            }
            Err(e) if e.kind() == ErrorKind::Auth => Err(e),
            Err(e) => {
                tracing::debug!(target: "distlock", server = &*node.target, error = %e,
                    "server unreachable at start; will retry");
                Ok((node, false))
            }
        }
    }

    fn lazy(config: &RedisConfig) -> Result<(Self, redis::Client), LockError> {
        check_wait(config)?;
        let target = config.redacted_url();
        let client = config
            .open_client(&config.url)
            .map_err(|e| map_err(e, "opening the Redis client"))?;
        let cm = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), cm)
            .map_err(|e| map_err(e, &format!("connecting to {target}")))?;
        let endpoint = Endpoint::of(client.get_connection_info(), config);
        let direct = DirectConnection::new(endpoint.clone(), config.connect_timeout);
        let node = ServerConnection {
            transport: Transport::Single {
                multiplexed: conn,
                direct,
                endpoint,
            },
            sent: Arc::new(AtomicU64::new(0)),
            response_timeout: config.response_timeout,
            connect_timeout: config.connect_timeout,
            target: target.into(),
            wait: config.wait,
        };
        Ok((node, client))
    }

    async fn ping(&self) -> Result<(), LockError> {
        let ping = redis::cmd("PING");
        let sent = async {
            match &self.transport {
                Transport::Single {
                    multiplexed: conn, ..
                } => ping.query_async::<Value>(&mut conn.clone()).await,
                Transport::Cluster(conn) => ping.query_async::<Value>(&mut conn.clone()).await,
            }
        };
        match tokio::time::timeout(self.connect_timeout + self.response_timeout, sent).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(map_err(e, &format!("talking to {}", self.target))),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("connecting to {}: no answer", self.target),
            )),
        }
    }

    /// The nodes a scan of every key visits: the server, or each master of a Cluster (from
    /// `CLUSTER NODES`).
    pub(crate) async fn scan_nodes(&self) -> Result<Vec<ScanNode>, LockError> {
        if matches!(self.transport, Transport::Single { .. }) {
            return Ok(vec![ScanNode::Server]);
        }
        const DOING: &str = "listing the Cluster's masters";
        let reply = self
            .on_node(
                &ScanNode::Server,
                redis::cmd("CLUSTER").arg("NODES").clone(),
                DOING,
            )
            .await?;
        let text = match &reply {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::VerbatimString { text, .. } => text.clone(),
            Value::SimpleString(s) => s.clone(),
            other => {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!("{DOING}: CLUSTER NODES answered {other:?}"),
                ));
            }
        };
        Ok(cluster_masters(&text)
            .into_iter()
            .map(|(host, port)| ScanNode::Master { host, port })
            .collect())
    }

    /// Sends `cmd` to `node` (a Cluster's master by address; any node for
    /// [`ScanNode::Server`]), within the response timeout.
    pub(crate) async fn on_node(
        &self,
        node: &ScanNode,
        cmd: redis::Cmd,
        doing: &str,
    ) -> Result<Value, LockError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        self.count(1);
        let sent = async {
            match (&self.transport, node) {
                (Transport::Single { multiplexed, .. }, _) => {
                    cmd.query_async::<Value>(&mut multiplexed.clone()).await
                }
                (Transport::Cluster(conn), ScanNode::Server) => {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                    conn.clone().route_command(cmd, routing).await
                }
                (Transport::Cluster(conn), ScanNode::Master { host, port }) => {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    });
                    conn.clone().route_command(cmd, routing).await
                }
            }
        };
        match tokio::time::timeout(self.response_timeout, sent).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(map_err(e, doing)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("{doing}: no answer from {}", self.target),
            )),
        }
    }

    pub(crate) fn commands_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One round trip: on the direct connection when it is free, else on the multiplexed one.
    /// One reply per command, server errors in their place.
    ///
    /// The way is chosen before the first poll, and the future is the chosen one's alone: it
    /// sits inside every request's future, which the engine boxes for each call.
    pub(crate) fn send<'a>(
        &'a self,
        pipe: &'a redis::Pipeline,
    ) -> impl Future<Output = Result<Vec<Value>, redis::RedisError>> + Send + 'a {
        self.count(pipe.len());
        let checkout = match &self.transport {
            Transport::Single { direct, .. } => direct.checkout(),
            Transport::Cluster(_) => None,
        };
        match checkout {
            Some(checkout) => {
                Either::Left(checkout.round_trip(pipe.cmd_iter(), self.response_timeout))
            }
            None => Either::Right(self.send_multiplexed(pipe)),
        }
    }

    /// A round trip on the multiplexed connection only (the watchdog's batches: they must not
    /// wait behind, or hold up, a caller's request on the direct connection). Counted by the
    /// caller.
    pub(crate) async fn send_multiplexed(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>, redis::RedisError> {
        match &self.transport {
            Transport::Single {
                multiplexed: conn, ..
            } => pipe.query_async(&mut conn.clone()).await,
            Transport::Cluster(conn) => pipe.query_async(&mut conn.clone()).await,
        }
    }

    /// Loads `script` into the server's cache (after a `NOSCRIPT`).
    /// (On a Cluster, redis-rs sends `SCRIPT LOAD` to every node.)
    pub(crate) async fn load(&self, script: &redis::Script) -> Result<(), redis::RedisError> {
        self.count(1);
        match &self.transport {
            Transport::Single {
                multiplexed: conn, ..
            } => script.load_async(&mut conn.clone()).await.map(|_| ()),
            Transport::Cluster(conn) => script.load_async(&mut conn.clone()).await.map(|_| ()),
        }
    }

    /// Runs a script by hash (one command, built without intermediate copies), loading it
    /// and sending again if the server has lost its script cache; its reply, typed.
    pub(crate) async fn run<R: ScriptReply>(
        &self,
        script: &LuaScript<R>,
        keys: &[&str],
        args: &[&str],
        doing: &str,
    ) -> Result<R, LockError> {
        let call = ScriptCall::new(script, keys, args, false);
        self.run_call(script, &call, doing).await
    }

    /// Sends a script's call (see [`ScriptCall`]), loading the script and sending again if the
    /// server has lost its script cache; its reply, typed.
    pub(crate) async fn run_call<R: ScriptReply>(
        &self,
        script: &LuaScript<R>,
        call: &ScriptCall,
        doing: &str,
    ) -> Result<R, LockError> {
        let reply = self.run_in(&call.pipe, script.script(), call.at).await;
        let value = reply
            .and_then(|mut r| taken(&mut r, call.at))
            .map_err(|e| map_err(e, doing))?;
        R::decode(&value, doing)
    }

    /// [`run`](Self::run), then `WAIT` for replicas on the same connection when the node is
    /// configured to (see [`WaitReplicas`]): the script's reply, and how many replicas
    /// acknowledged (`None` without `WAIT`).
    pub(crate) async fn run_waited<R: ScriptReply>(
        &self,
        script: &LuaScript<R>,
        keys: &[&str],
        args: &[&str],
        doing: &str,
    ) -> Result<(R, Option<Acks>), LockError> {
        let Some(wait) = self.wait else {
            return Ok((self.run(script, keys, args, doing).await?, None));
        };
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.ignore_errors();
        pipe.add_command(evalsha(script.hash(), keys, args));
        push_wait(&mut pipe, wait);
        let mut replies = self
            .run_in(&pipe, script.script(), 0)
            .await
            .map_err(|e| map_err(e, doing))?;
        let acks = wait.acks(replies.get(1), doing);
        let value = taken(&mut replies, 0).map_err(|e| map_err(e, doing))?;
        Ok((R::decode(&value, doing)?, Some(acks)))
    }

    /// Sends `pipe`, whose command `at` runs `script` by hash; if the server lost its script
    /// cache, loads it and sends the whole pipeline again.
    async fn run_in(
        &self,
        pipe: &redis::Pipeline,
        script: &redis::Script,
        at: usize,
    ) -> Result<Vec<Value>, redis::RedisError> {
        let replies = self.send(pipe).await?;
        if !replies.get(at).is_some_and(is_noscript) {
            return Ok(replies);
        }
        self.load(script).await?;
        self.send(pipe).await
    }
}

fn check_wait(config: &RedisConfig) -> Result<(), LockError> {
    match config.wait {
        Some(w) if Duration::from_millis(w.timeout_ms) >= config.response_timeout => {
            Err(LockError::new(
                ErrorKind::Config,
                "wait_timeout must be below response_timeout",
            ))
        }
        _ => Ok(()),
    }
}

/// How many replicas acknowledged a `WAIT`, or why it could not be told.
pub(crate) type Acks = Result<u32, LockError>;

impl WaitReplicas {
    /// The replicas a `WAIT` reply counts, or the error that stands for "not known to be
    /// replicated".
    pub(crate) fn acks(self, reply: Option<&Value>, doing: &str) -> Acks {
        match reply {
            Some(Value::Int(n)) if *n >= 0 => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
            Some(Value::ServerError(e)) => Err(map_err(e.clone().into(), doing)),
            other => Err(crate::error::protocol(doing, other.unwrap_or(&Value::Nil))),
        }
    }

    /// `Ok` when enough replicas acknowledged; otherwise the error an acquire or renewal reports.
    pub(crate) fn check(self, acks: Acks) -> Result<(), LockError> {
        let got = acks?;
        // Seeded bug `ignore-wait` (test-only): the count is not looked at.
        if got >= self.replicas
            || distlock_core::seeded::on(distlock_core::seeded::SeededBug::IgnoreWait)
        {
            return Ok(());
        }
        Err(LockError::new(
            ErrorKind::QuorumNotReached {
                got: got as usize,
                needed: self.replicas as usize,
            },
            format!(
                "only {got} of the {} replicas asked for acknowledged the lock within {} ms",
                self.replicas, self.timeout_ms
            ),
        ))
    }
}

/// Appends `WAIT replicas timeout` (it covers every write this connection sent before it).
pub(crate) fn push_wait(pipe: &mut redis::Pipeline, wait: WaitReplicas) {
    pipe.cmd("WAIT").arg(wait.replicas).arg(wait.timeout_ms);
}

/// One script's command by hash, built before the request's first await: the keys and
/// arguments are copied into it, so they need not live across the round trip (the hot paths
/// build the keys in a scratch buffer, see `KeyLayout::with_keys`).
pub(crate) struct ScriptCall {
    pipe: redis::Pipeline,
    /// Where the script's reply is in the pipeline's replies.
    at: usize,
}

impl ScriptCall {
    /// The call, after a `PING` in the same write when `ping_first` is set.
    ///
    /// Why a release that may hand the lock over leads with a `PING`: Redis writes the replies
    /// of one event-loop turn to the most recently queued client first. Without the `PING`,
    /// the releasing client is queued after the waiter the script publishes to, so it is woken
    /// first, and on a busy CPU its own work runs before the new holder hears of its turn. The
    /// `PING` queues the releasing client before the script runs: the waiter is written to
    /// first. Harmless where the order differs: one more tiny command in the same write.
    pub(crate) fn new<R: ScriptReply>(
        script: &LuaScript<R>,
        keys: &[&str],
        args: &[&str],
        ping_first: bool,
    ) -> ScriptCall {
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.ignore_errors();
        if ping_first {
            pipe.cmd("PING");
        }
        pipe.add_command(evalsha(script.hash(), keys, args));
        let at = pipe.len() - 1;
        ScriptCall { pipe, at }
    }
}

/// `EVALSHA hash nkeys keys… args…`, built without intermediate copies.
fn evalsha(hash: &str, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let len = keys.iter().chain(args).map(|a| a.len()).sum::<usize>() + 48;
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), len);
    cmd.arg("EVALSHA")
        .arg(hash)
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

/// Reply `at` of a pipeline, a server error as `Err`.
fn taken(replies: &mut [Value], at: usize) -> Result<Value, redis::RedisError> {
    match replies.get_mut(at).map(std::mem::take) {
        Some(Value::ServerError(e)) => Err(e.into()),
        Some(v) => Ok(v),
        None => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "no reply to a command",
        ))),
    }
}

impl ServerConnection {
    /// The watchdog's batch: `script` (compare-and-pexpire) for every item, on its lock key;
    /// see [`renew_batch`](Self::renew_batch).
    pub(crate) async fn extend_batch(
        &self,
        script: &LuaScript<LeaseCheck>,
        lock_keys: &[String],
        items: &[RenewItem<'_>],
        doing: &str,
    ) -> Vec<Result<LeaseCheck, LockError>> {
        let calls: Vec<RenewCall<'_>> = lock_keys
            .iter()
            .map(|k| RenewCall {
                script,
                keys: vec![k.clone()],
                extra: None,
            })
            .collect();
        self.renew_batch(&calls, items, doing).await
    }

    /// The watchdog's batch: each item's renewal script (`calls[i]`, a compare-and-pexpire of
    /// a lock, a reader's share or a permit) in one pipeline on the multiplexed connection (on
    /// a Cluster, one per slot, sent together), then `WAIT` when the node waits for replicas.
    /// One result per item: the script's reply, or the error that stands for it (the
    /// transport's, the server's, or "not acknowledged by the replicas" for a renewal that
    /// took). A server that lost its script cache gets the missing scripts again and its whole
    /// pipeline once more (every renewal script is idempotent).
    pub(crate) async fn renew_batch(
        &self,
        calls: &[RenewCall<'_>],
        items: &[RenewItem<'_>],
        doing: &str,
    ) -> Vec<Result<LeaseCheck, LockError>> {
        if !matches!(self.transport, Transport::Cluster(_)) {
            let all: Vec<usize> = (0..items.len()).collect();
            return self.renew_group(calls, items, &all, doing).await;
        }
        let mut slots: std::collections::HashMap<redis::cluster_routing::Slot, Vec<usize>> =
            std::collections::HashMap::new();
        for (i, c) in calls.iter().enumerate() {
            let first = c.keys.first().map_or(&[][..], |k| k.as_bytes());
            let slot = redis::cluster_routing::Slot::for_key(first);
            slots.entry(slot).or_default().push(i);
        }
        let groups: Vec<Vec<usize>> = slots.into_values().collect();
        let replies = futures_util::future::join_all(
            groups
                .iter()
                .map(|group| self.renew_group(calls, items, group, doing)),
        )
        .await;
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        for (group, replies) in groups.iter().zip(replies) {
            for (&i, r) in group.iter().zip(replies) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(crate::error::protocol(doing, &Value::Nil))))
            .collect()
    }

    /// One pipeline of [`renew_batch`](Self::renew_batch): the items at `which`.
    async fn renew_group(
        &self,
        calls: &[RenewCall<'_>],
        items: &[RenewItem<'_>],
        which: &[usize],
        doing: &str,
    ) -> Vec<Result<LeaseCheck, LockError>> {
        let mut pipe = redis::Pipeline::with_capacity(which.len() + 1);
        pipe.ignore_errors();
        for &i in which {
            let call = &calls[i];
            let cmd = pipe
                .cmd("EVALSHA")
                .arg(call.script.hash())
                .arg(call.keys.len());
            for k in &call.keys {
                cmd.arg(k);
            }
            cmd.arg(items[i].lease.token.as_str())
                .arg(ttl_ms(items[i].ttl));
            if let Some(extra) = &call.extra {
                cmd.arg(extra);
            }
        }
        if let Some(wait) = self.wait {
            push_wait(&mut pipe, wait);
        }
        let sent = async {
            self.count(pipe.len());
            let replies = self.send_multiplexed(&pipe).await?;
            let mut missing: Vec<&LuaScript<LeaseCheck>> = Vec::new();
            for (&i, r) in which.iter().zip(&replies) {
                let script = calls[i].script;
                if is_noscript(r) && !missing.iter().any(|m| m.hash() == script.hash()) {
                    missing.push(script);
                }
            }
            if missing.is_empty() {
                return Ok(replies);
            }
            for script in missing {
                self.load(script.script()).await?;
            }
            self.count(pipe.len());
            self.send_multiplexed(&pipe).await
        };
        let mut replies = match sent.await {
            Ok(r) if r.len() == pipe.len() => r,
            Ok(r) => {
                let e = crate::error::protocol(doing, &Value::Array(r));
                return which.iter().map(|_| Err(again(&e))).collect();
            }
            Err(e) => {
                let e = map_err(e, doing);
                return which.iter().map(|_| Err(again(&e))).collect();
            }
        };
        let unreplicated = self.wait.and_then(|w| {
            let acks = w.acks(replies.get(which.len()), doing);
            w.check(acks).err()
        });
        replies.truncate(which.len());
        replies
            .into_iter()
            .map(|v| match v {
                Value::ServerError(e) => Err(map_err(e.into(), doing)),
                v => match (LeaseCheck::decode(&v, doing)?, &unreplicated) {
                    // Renewed here, not known to be on the replicas: not a renewal to count on.
                    (LeaseCheck::Ours, Some(e)) => Err(again(e)),
                    (check, _) => Ok(check),
                },
            })
            .collect()
    }
}

/// One renewal of a batch: the script that renews the lease, and the script's keys (all in
/// one slot), before the token and the TTL; and an argument after them, for a script that
/// takes one.
pub(crate) struct RenewCall<'a> {
    pub(crate) script: &'a LuaScript<LeaseCheck>,
    pub(crate) keys: Vec<String>,
    pub(crate) extra: Option<String>,
}

/// The same error again, for another item of a failed batch.
fn again(e: &LockError) -> LockError {
    LockError::new(e.kind(), e.message().to_owned())
}

/// Whether a reply is the server's `NOSCRIPT` error (in a pipeline, in its place).
fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_come_from_cluster_nodes() {
        let nodes = "07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460\n\
                     67ed 127.0.0.1:30002@40002,redis-b master - 0 1 2 connected 5461-10922\n\
                     292f 127.0.0.1:30003@40003 master,fail - 0 1 3 connected\n\
                     e7d1 127.0.0.1:30004@40004 slave 07c3 0 1 1 connected\n";
        assert_eq!(
            cluster_masters(nodes),
            [
                ("127.0.0.1".to_owned(), 30001),
                ("127.0.0.1".to_owned(), 30002)
            ]
        );
    }
}
