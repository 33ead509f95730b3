//! The ZooKeeper session: the client, followed through suspensions and expiries. A session
//! suspended (the client lost its server) or expired ends every lock taken before it, at once:
//! Curator's standard policy, since the server may expire the session meanwhile. After an
//! expiry a new session is opened.

use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError, LostReason, SessionEnd, SessionWatch};
use distlock_core::recipes::MutexExt;
use tokio::sync::watch;
use zookeeper_client::{Client, Error, SessionState};

use crate::config::ZkConfig;

/// One session of the client.
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) id: i64,
}

/// The current session, and the count of losses (suspensions and expiries) so far: a lock
/// taken before the latest loss can no longer be trusted.
pub(crate) struct ZkSessions {
    pub(crate) config: ZkConfig,
    current: RwLock<Arc<Session>>,
    /// How many times the session was suspended or expired, and why the last time.
    losses: watch::Sender<(u64, LostReason)>,
    /// The end of the locks taken since the last loss: the next loss. Every lock taken
    /// between two losses hears it through this one end.
    epoch: Mutex<SessionEnd>,
}

/// Whether a request failed because its connection did (its effect, if it had one, unknown).
pub(crate) fn connection_lost(e: &Error) -> bool {
    matches!(e, Error::ConnectionLoss | Error::Custom(_))
}

pub(crate) fn map_err(e: Error, doing: &str) -> LockError {
    let kind = match &e {
        // `Custom` is how the client fails the requests of a connection that broke under them
        // ("no response from connection in 800ms", an I/O error): the connection's loss.
        Error::ConnectionLoss
        | Error::SessionExpired
        | Error::ClientClosed
        | Error::NoHosts
        | Error::Custom(_) => ErrorKind::Connection,
        Error::Timeout => ErrorKind::Timeout,
        Error::NoAuth | Error::AuthFailed => ErrorKind::Auth,
        Error::BadArguments(_) => ErrorKind::InvalidKey,
        _ => ErrorKind::Protocol,
    };
    LockError::caused_by(kind, doing, e)
}

async fn connect(config: &ZkConfig) -> Result<Client, LockError> {
    let doing = format!("connecting to ZooKeeper at {}", config.cluster);
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(config.connect_timeout);
    if let Some(digest) = &config.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    #[cfg(feature = "tls")]
    let tls = match &config.tls {
        Some(settings) => Some(tls::options(settings)?),
        None => None,
    };
    let cluster = config.cluster.as_str();
    let connect = async move {
        #[cfg(feature = "tls")]
        if let Some(options) = tls {
            return connector.with_tls(options).secure_connect(cluster).await;
        }
        connector.connect(cluster).await
    };
    let limit = config.connect_timeout + config.session_timeout;
    // No server that answers within the limit is an unreachable engine, not a busy lock: the
    // client tries each server again until then, so a refused connection also ends here.
    let unreachable = || {
        LockError::new(
            ErrorKind::Connection,
            format!("{doing}: no server answered within {limit:?}"),
        )
    };
    match tokio::time::timeout(limit, connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(Error::Timeout)) | Err(_) => {
            // The client retries a failed handshake as it retries a refused connection, and
            // keeps no reason: one handshake of our own tells a refused certificate apart.
            #[cfg(feature = "tls")]
            if let Some(settings) = &config.tls
                && let Some(e) = tls::why_refused(settings, config, &doing).await
            {
                return Err(e);
            }
            Err(unreachable())
        }
        Ok(Err(e)) => Err(map_err(e, &doing)),
    }
}

/// `zks://`: the client's options from the URL's settings, and the reason a handshake fails.
#[cfg(feature = "tls")]
mod tls {
    use distlock_core::engine::{ErrorKind, LockError};
    use distlock_tls::{TlsSettings, Verify};
    use zookeeper_client::TlsOptions;

    use crate::config::ZkConfig;

    /// The ZooKeeper client's TLS options: the CA as PEM text (the system's roots without
    /// `tls_ca`), our certificate and key, and whether names are checked.
    pub(super) fn options(settings: &TlsSettings) -> Result<TlsOptions, LockError> {
        // The files are read through distlock-tls first, for its typed errors naming them.
        settings.client_config()?;
        // The client builds its rustls configuration with the process's default provider.
        distlock_tls::install_default_provider();
        let ca = match &settings.ca {
            Some(path) => read(path)?,
            None => distlock_tls::system_roots_pem()?,
        };
        let refused = |what: &str, e: zookeeper_client::Error| {
            LockError::caused_by(
                ErrorKind::Config,
                format!("the ZooKeeper client refused {what}"),
                e,
            )
        };
        let mut options = TlsOptions::new()
            .with_pem_ca(&ca)
            .map_err(|e| refused("the CA", e))?;
        if let (Some(cert), Some(key)) = (&settings.cert, &settings.key) {
            options = options
                .with_pem_identity(&read(cert)?, &read(key)?)
                .map_err(|e| refused("the client certificate and key", e))?;
        }
        match settings.verify {
            Verify::Full => Ok(options),
            Verify::Chain => Ok(without_names(options)),
            // Refused when the URL was parsed.
            Verify::EncryptOnly => Err(LockError::new(
                ErrorKind::Unsupported,
                "zks:// always checks the server's chain",
            )),
        }
    }

    /// `tls_verify=ca`. The client marks the call `unsafe` as a warning that names go
    /// unchecked; it touches no memory: the chain is still checked.
    #[allow(unsafe_code)]
    fn without_names(options: TlsOptions) -> TlsOptions {
        // SAFETY: no memory safety condition; the option only skips the name check, which
        // `tls_verify=ca` asks for.
        unsafe { options.with_no_hostname_verification() }
    }

    fn read(path: &std::path::Path) -> Result<String, LockError> {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::caused_by(ErrorKind::Config, format!("reading {}", path.display()), e)
        })
    }

    /// A handshake with each server in turn, with the same trust and certificate: the first
    /// refused certificate (ours or the server's) as a typed error, or `None` when no server
    /// refused one (none answered, or the handshake went through).
    pub(super) async fn why_refused(
        settings: &TlsSettings,
        config: &ZkConfig,
        doing: &str,
    ) -> Option<LockError> {
        let connector = settings.connector().ok()?;
        let limit = config.connect_timeout;
        for host in &config.hosts {
            let Some((name, port)) = host.rsplit_once(':') else {
                continue;
            };
            let Ok(port) = port.parse::<u16>() else {
                continue;
            };
            let name = name.trim_start_matches('[').trim_end_matches(']');
            let Ok(Ok(tcp)) =
                tokio::time::timeout(limit, tokio::net::TcpStream::connect((name, port))).await
            else {
                continue;
            };
            if let Ok(Err(e)) =
                tokio::time::timeout(limit, settings.connect(&connector, name, tcp)).await
                && matches!(e.kind(), ErrorKind::Auth | ErrorKind::Config)
            {
                return Some(LockError::new(e.kind(), format!("{doing}: {e}")));
            }
        }
        None
    }
}

impl ZkSessions {
    /// Opens the first session and follows it.
    pub(crate) async fn open(config: ZkConfig) -> Result<Arc<ZkSessions>, LockError> {
        let client = connect(&config).await?;
        let session = Arc::new(Session {
            id: client.session_id().0,
            client,
        });
        let (losses, _) = watch::channel((0, LostReason::Unreachable));
        let sessions = Arc::new(ZkSessions {
            config,
            current: RwLock::new(session.clone()),
            losses,
            epoch: Mutex::new(SessionEnd::new()),
        });
        monitor(Arc::downgrade(&sessions), &session);
        Ok(sessions)
    }

    /// The session in use.
    pub(crate) fn current(&self) -> Arc<Session> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many losses so far.
    pub(crate) fn losses(&self) -> u64 {
        self.losses.borrow().0
    }

    /// Resolves, with the reason, at the first loss after `since` losses.
    pub(crate) fn lost_after(
        &self,
        since: u64,
    ) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let mut losses = self.losses.subscribe();
        async move {
            loop {
                let (n, why) = *losses.borrow_and_update();
                if n != since {
                    return why;
                }
                if losses.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// How the lock taken after `since` losses hears the next one: with every lock taken since
    /// the same loss, or at once when one came meanwhile.
    pub(crate) fn session_watch(&self, since: u64) -> SessionWatch {
        let epoch = self.epoch.locked();
        if self.losses() == since {
            return SessionWatch::Shared {
                session: since,
                end: epoch.clone(),
            };
        }
        SessionWatch::Own(Box::pin(self.lost_after(since)))
    }

    fn count_loss(&self, why: LostReason) {
        let mut epoch = self.epoch.locked();
        self.losses
            .send_modify(|(n, reason)| (*n, *reason) = (*n + 1, why));
        epoch.end(why);
        *epoch = SessionEnd::new();
    }
}

/// Follows `session`'s state: a suspension or an expiry counts as a loss; after an expiry a new
/// session is opened.
fn monitor(sessions: Weak<ZkSessions>, session: &Arc<Session>) {
    let mut states = session.client.state_watcher();
    tokio::spawn(async move {
        loop {
            let state = states.changed().await;
            let Some(s) = sessions.upgrade() else { return };
            match state {
                SessionState::Disconnected => {
                    tracing::warn!(target: "distlock",
                        "ZooKeeper connection lost: locks held are no longer trusted");
                    s.count_loss(LostReason::Unreachable);
                }
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                    tracing::warn!(target: "distlock", ?state,
                        "ZooKeeper session ended: its locks are gone");
                    s.count_loss(LostReason::Expired);
                    if state == SessionState::Closed {
                        return;
                    }
                    reconnect(&s).await;
                    return;
                }
                _ => {}
            }
        }
    });
}

/// Opens a new session (retrying until it works or the engine is dropped) and follows it.
async fn reconnect(sessions: &Arc<ZkSessions>) {
    let mut delay = Duration::from_millis(50);
    loop {
        match connect(&sessions.config).await {
            Ok(client) => {
                let session = Arc::new(Session {
                    id: client.session_id().0,
                    client,
                });
                *sessions
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = session.clone();
                monitor(Arc::downgrade(sessions), &session);
                return;
            }
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e, "ZooKeeper reconnect failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}
