//! Redis behind Sentinel: the master is found through the sentinels, and found again when
//! requests to it fail (a failover moved it).

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireMany, AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, Breaker, Capabilities,
    Downgrade, ErrorKind, Handover, LeaseCheck, LeaseRef, Linger, Listener, Lister, LockError,
    LockStatus, ManyAttempt, MultiLock, Names, NextWaiter, Relabel, RenewItem, Subscription,
    WakeSource,
};
use redis::Value;

use crate::backend::RedisBackend;
use crate::config::{MultiHostUrl, RedisConfig, strip_scheme};
use crate::error::map_err;
use crate::replies::text;

/// Where the sentinels are, which master they watch, and how to talk to it.
///
/// From a URL: `redis+sentinel://[user:password@]host1:port1,host2:port2,…/<master name>[/db]
/// [?params]` (`rediss+sentinel://` for TLS to the sentinels and the master). The credentials,
/// database and parameters are the master's: those of [`RedisConfig`] (`prefix`, `hash_tag`,
/// `connect_timeout`, `response_timeout`, `wait_replicas`, `wait_timeout`), plus
/// `sentinel_username` and `sentinel_password` for sentinels that require them.
#[derive(Clone)]
pub struct SentinelConfig {
    sentinels: Vec<String>,
    master_name: String,
    /// The master's URL up to its address, and from its path on.
    scheme: &'static str,
    userinfo: String,
    tail: String,
    sentinel_auth: String,
    /// The master's settings (its address is a placeholder until the sentinels name it).
    master: RedisConfig,
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("master", &self.master)
            .finish_non_exhaustive()
    }
}

impl SentinelConfig {
    /// Parses a `redis+sentinel://` URL (see the type's documentation).
    ///
    /// # Errors
    /// `Config` for a malformed URL, a missing master name or a bad parameter.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg_err = |m: String| LockError::new(ErrorKind::Config, m);
        let (scheme, rest) = strip_scheme(text, "redis+sentinel", "rediss+sentinel")?;
        let mut parts = MultiHostUrl::parse(rest)?;
        let mut sentinel_auth = String::new();
        let user = parts.take("sentinel_username");
        let password = parts.take("sentinel_password");
        if user.is_some() || password.is_some() {
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            sentinel_auth = format!(
                "{}:{}@",
                enc(user.as_deref().unwrap_or("")),
                enc(password.as_deref().unwrap_or(""))
            );
        }
        let mut path = parts.path.trim_start_matches('/').splitn(2, '/');
        let master_name = path.next().unwrap_or_default();
        if master_name.is_empty() {
            return Err(cfg_err(
                "the Sentinel URL names no master: redis+sentinel://host:port,…/<master name>"
                    .into(),
            ));
        }
        let master_name = url::form_urlencoded::parse(master_name.as_bytes())
            .next()
            .map_or_else(String::new, |(k, _)| k.into_owned());
        let db = path.next().filter(|d| !d.is_empty());
        let tail = format!(
            "{}{}",
            db.map(|d| format!("/{d}")).unwrap_or_default(),
            parts.rest_query()
        );
        let userinfo = parts.userinfo.to_owned();
        let sentinels: Vec<String> = parts.hosts.iter().map(|h| (*h).to_owned()).collect();
        for s in &sentinels {
            // Each sentinel's address must be one a client can open.
            redis::Client::open(format!("{scheme}://{sentinel_auth}{s}/").as_str()).map_err(
                |e| cfg_err(format!("invalid sentinel address {s:?}: {e}")).with_source(e),
            )?;
        }
        let master = RedisConfig::from_url(&format!("{scheme}://{userinfo}sentinel-master{tail}"))?;
        Ok(SentinelConfig {
            sentinels,
            master_name,
            scheme,
            userinfo,
            tail,
            sentinel_auth,
            master,
        })
    }

    /// The settings the master is reached with: key prefix and hash tag, timeouts, `WAIT`.
    pub fn master_settings(&self) -> &RedisConfig {
        &self.master
    }

    /// Replaces those settings (the address in `settings` is not used: the sentinels give it).
    #[must_use]
    pub fn with_master_settings(mut self, settings: RedisConfig) -> Self {
        self.master = settings;
        self
    }

    /// The configuration of the master at `host:port`, with the settings of this one.
    fn at(&self, host: &str, port: u16) -> Result<RedisConfig, LockError> {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let mut cfg = RedisConfig::from_url(&format!(
            "{}://{}{host}:{port}{}",
            self.scheme, self.userinfo, self.tail
        ))?;
        cfg.layout = self.master.layout.clone();
        cfg.connect_timeout = self.master.connect_timeout;
        cfg.response_timeout = self.master.response_timeout;
        cfg.wait = self.master.wait;
        #[cfg(feature = "tls")]
        {
            cfg.certs.clone_from(&self.master.certs);
            cfg.tls.clone_from(&self.master.tls);
        }
        Ok(cfg)
    }
}

/// The master in use, and which discovery found it.
struct Current {
    backend: RedisBackend,
    addr: (String, u16),
    generation: u64,
}

struct SentinelShared {
    config: SentinelConfig,
    current: RwLock<Arc<Current>>,
    /// Held while the sentinels are asked (one discovery at a time); when the last one ended.
    resolving: tokio::sync::Mutex<Instant>,
}

/// A lock engine on the master that Redis Sentinel names, which follows failovers.
///
/// It is the single-instance engine ([`RedisBackend`]) on whichever server the sentinels call
/// master: at start, and again whenever a request fails with a broken connection, a timeout,
/// `READONLY` (the server was demoted) or too few replicas acknowledging (`wait_replicas`: a
/// paused master that was failed over meanwhile), it asks the sentinels in turn
/// (`SENTINEL GET-MASTER-ADDR-BY-NAME`), checks with `ROLE` that the server named is a master,
/// and moves there if it changed. Requests that fail meanwhile report their error (an acquire
/// whose reply was lost is resent by the client, with the same token, to the new master).
///
/// What a failover does to held locks depends on replication: a lock written on the old master
/// but not yet copied to the replica that is promoted is gone on the new master, and someone
/// else can take it. `wait_replicas` (see [`RedisConfig::wait_replicas`]) narrows that window;
/// the crate README's table says exactly what each deployment guarantees.
#[derive(Clone)]
pub struct SentinelBackend {
    inner: Arc<SentinelShared>,
}

impl fmt::Debug for SentinelBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cur = self.current();
        f.debug_struct("SentinelBackend")
            .field("master_name", &self.inner.config.master_name)
            .field("master", &format_args!("{}:{}", cur.addr.0, cur.addr.1))
            .finish()
    }
}

/// Discoveries closer together than this, for the same failure, ask the sentinels once.
const REDISCOVER_GAP: Duration = Duration::from_millis(100);

impl SentinelBackend {
    /// Finds the master through the sentinels a URL names, and connects to it.
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` when no sentinel answers or none knows the master;
    /// the master's own connection errors.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(SentinelConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: SentinelConfig) -> Result<Self, LockError> {
        config.master.layout.check()?;
        let addr = discover(&config).await?;
        let backend = RedisBackend::with_config(config.at(&addr.0, addr.1)?).await?;
        Ok(SentinelBackend {
            inner: Arc::new(SentinelShared {
                config,
                current: RwLock::new(Arc::new(Current {
                    backend,
                    addr,
                    generation: 0,
                })),
                resolving: tokio::sync::Mutex::new(Instant::now()),
            }),
        })
    }

    /// The master in use now, as `host:port`.
    pub fn master_addr(&self) -> String {
        let cur = self.current();
        format!("{}:{}", cur.addr.0, cur.addr.1)
    }

    /// The engine on the master in use now (for its key names and counters).
    pub fn master(&self) -> RedisBackend {
        self.current().backend.clone()
    }

    fn current(&self) -> Arc<Current> {
        self.inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `call` on the master in use now; after an error that says the master may have
    /// moved, follows it (see [`follow`](Self::follow)).
    async fn on_master<T>(
        &self,
        call: impl AsyncFnOnce(&RedisBackend) -> Result<T, LockError>,
    ) -> Result<T, LockError> {
        let cur = self.current();
        let r = call(&cur.backend).await;
        self.follow(&cur, r.as_ref().err()).await;
        r
    }

    /// After a request to `used` failed with `result`'s error: if the error means the master
    /// may have moved, asks the sentinels and moves with it.
    async fn follow(&self, used: &Current, error: Option<&LockError>) {
        let Some(e) = error else { return };
        // A missed `WAIT` too: a master that lost its replicas may be one that was failed
        // over while it was paused, and is not yet demoted.
        if !matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::QuorumNotReached { .. }
        ) {
            return;
        }
        let mut last = self.inner.resolving.lock().await;
        if self.current().generation != used.generation || last.elapsed() < REDISCOVER_GAP {
            // Another task has just looked (and moved, or found it where it was).
            return;
        }
        let found = discover(&self.inner.config).await;
        *last = Instant::now();
        let addr = match found {
            Ok(a) if a != used.addr => a,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(target: "distlock", error = %e, "Sentinel discovery failed");
                return;
            }
        };
        let backend = match self.inner.config.at(&addr.0, addr.1) {
            Ok(cfg) => RedisBackend::with_config(cfg)
                .await
                .map(|b| b.keeping_fences_of(&used.backend)),
            Err(e) => Err(e),
        };
        match backend {
            Ok(backend) => {
                tracing::info!(target: "distlock", from = %format_args!("{}:{}", used.addr.0, used.addr.1),
                    to = %format_args!("{}:{}", addr.0, addr.1), "following the Sentinel master");
                *self
                    .inner
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Arc::new(Current {
                    backend,
                    addr,
                    generation: used.generation + 1,
                });
            }
            Err(e) => {
                tracing::warn!(target: "distlock", error = %e, "cannot reach the new Sentinel master");
            }
        }
    }
}

/// Asks the sentinels in turn for the master's address, and checks with `ROLE` that the server
/// there is a master (a sentinel may not have seen a failover yet).
async fn discover(config: &SentinelConfig) -> Result<(String, u16), LockError> {
    let mut errors = Vec::new();
    // Every sentinel refusing our credentials (a password, a certificate) is an Auth error,
    // not an unreachable deployment.
    let mut all_auth = true;
    for s in &config.sentinels {
        match ask(config, s).await {
            Ok(addr) => return Ok(addr),
            Err(e) => {
                all_auth &= e.kind() == ErrorKind::Auth;
                errors.push(format!("{s}: {e}"));
            }
        }
    }
    Err(LockError::new(
        if all_auth && !errors.is_empty() {
            ErrorKind::Auth
        } else {
            ErrorKind::Connection
        },
        format!(
            "no sentinel gave a master for {:?}: {}",
            config.master_name,
            errors.join("; ")
        ),
    ))
}

async fn ask(config: &SentinelConfig, sentinel: &str) -> Result<(String, u16), LockError> {
    const DOING: &str = "asking a sentinel for the master";
    let master = &config.master;
    let timeouts = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(master.connect_timeout))
        .set_response_timeout(Some(master.response_timeout));
    // The sentinels take the same CA and client certificate as the masters.
    let client = master
        .open_client(&format!(
            "{}://{}{sentinel}/",
            config.scheme, config.sentinel_auth
        ))
        .map_err(|e| map_err(e, DOING))?;
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&timeouts)
        .await
        .map_err(|e| map_err(e, DOING))?;
    let reply: Value = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(&config.master_name)
        .query_async(&mut conn)
        .await
        .map_err(|e| map_err(e, DOING))?;
    let addr = match &reply {
        Value::Array(v) => match v.as_slice() {
            [h, p] => text(h).zip(text(p).and_then(|p| p.parse::<u16>().ok())),
            _ => None,
        },
        Value::Nil => {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("it does not know a master named {:?}", config.master_name),
            ));
        }
        _ => None,
    };
    let (host, port) = addr.ok_or_else(|| crate::error::protocol(DOING, &reply))?;
    // The server named must itself say it is the master.
    let cfg = config.at(&host, port)?;
    let client = cfg.open_client(&cfg.url).map_err(|e| map_err(e, DOING))?;
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&timeouts)
        .await
        .map_err(|e| map_err(e, "connecting to the master a sentinel named"))?;
    let role: Value = redis::cmd("ROLE")
        .query_async(&mut conn)
        .await
        .map_err(|e| map_err(e, "asking the master its role"))?;
    match &role {
        Value::Array(v) if v.first().and_then(text).as_deref() == Some("master") => {
            Ok((host, port))
        }
        _ => Err(LockError::new(
            ErrorKind::Connection,
            format!("{host}:{port}, which it named, is not a master (yet)"),
        )),
    }
}

#[distlock_core::engine::async_trait]
impl Backend for SentinelBackend {
    fn name(&self) -> &'static str {
        "redis+sentinel"
    }

    fn capabilities(&self) -> Capabilities {
        self.current().backend.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.on_master(async |b| b.acquire(req).await).await
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| b.renew(lease, ttl).await).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| b.release(lease).await).await
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        self.on_master(async |b| b.inspect(key).await).await
    }

    distlock_core::capability_getters!(
        batch_renew: BatchRenew,
        wake_source: WakeSource,
        handover: Handover,
        breaker: Breaker,
        downgrade: Downgrade,
        relabel: Relabel,
        lister: Lister,
        linger: Linger,
        multi_lock: MultiLock,
    );
}

#[distlock_core::engine::async_trait]
impl MultiLock for SentinelBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        self.on_master(async |b| b.acquire_all(req).await).await
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &distlock_core::engine::Token,
        ttl: std::time::Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| b.renew_all(names, token, ttl).await)
            .await
    }

    async fn release_all(
        &self,
        names: &[&str],
        token: &distlock_core::engine::Token,
    ) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| b.release_all(names, token).await)
            .await
    }
}

#[distlock_core::engine::async_trait]
impl Linger for SentinelBackend {
    async fn linger(
        &self,
        lease: &LeaseRef<'_>,
        ttl: std::time::Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| Linger::linger(b, lease, ttl).await)
            .await
    }
}

#[distlock_core::engine::async_trait]
impl Lister for SentinelBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
        self.on_master(async |b| Lister::names(b, prefix, budget).await)
            .await
    }
}

// Each capability is the current master's, and a failure sends us to the sentinels.

#[distlock_core::engine::async_trait]
impl BatchRenew for SentinelBackend {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let cur = self.current();
        let r = cur.backend.renew_many(items).await;
        let error = r.iter().find_map(|x| x.as_ref().err());
        self.follow(&cur, error).await;
        r
    }
}

#[distlock_core::engine::async_trait]
impl WakeSource for SentinelBackend {
    /// A subscription on a master that is later left behind stops firing; the waiter's
    /// fallback interval then bounds its sleeps.
    async fn subscribe(
        &self,
        key: &str,
        who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        self.on_master(async |b| b.subscribe(key, who).await).await
    }

    fn watching(&self, key: &str) -> bool {
        self.current().backend.watching(key)
    }
}

#[distlock_core::engine::async_trait]
impl Handover for SentinelBackend {
    async fn release_requeue(
        &self,
        lease: &LeaseRef<'_>,
        next: &NextWaiter<'_>,
    ) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| b.release_requeue(lease, next).await)
            .await
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for SentinelBackend {
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        self.on_master(async |b| b.break_once(key).await).await
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for SentinelBackend {
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| Relabel::relabel(b, lease, owner).await)
            .await
    }
}

#[distlock_core::engine::async_trait]
impl Downgrade for SentinelBackend {
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        ttl: std::time::Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.on_master(async |b| Downgrade::downgrade(b, lease, ttl).await)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_sentinels_a_master_and_the_master_settings() {
        let c = SentinelConfig::from_url(
            "redis+sentinel://u:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/3?prefix=app:\
             &wait_replicas=1&sentinel_password=s%40cret",
        )
        .expect("valid");
        assert_eq!(c.sentinels, ["10.0.0.1:26379", "10.0.0.2:26379"]);
        assert_eq!(c.master_name, "mymaster");
        assert_eq!(c.sentinel_auth, ":s%40cret@");
        assert_eq!(c.master.layout.prefix, "app:");
        assert!(c.master.wait.is_some());
        let m = c.at("10.0.0.9", 6380).expect("master config");
        assert_eq!(m.url, "redis://u:pw@10.0.0.9:6380/3");
        assert_eq!(c.at("::1", 6380).unwrap().url, "redis://u:pw@[::1]:6380/3");
        let tls = SentinelConfig::from_url("rediss+sentinel://h:1/m").unwrap();
        assert_eq!(tls.at("h", 2).unwrap().url, "rediss://h:2");
    }

    #[test]
    fn bad_sentinel_urls_are_config_errors() {
        for bad in [
            "redis://h:1/m",
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:1,,h:2/m",
            "redis+sentinel://h:1/m?wait_replicas=0",
            "redis+sentinel://h:99999/m",
            "redis+sentinel://h:1/m/notadb",
        ] {
            let e = SentinelConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }
}
