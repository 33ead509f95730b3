//! A client from a URL with options of its own, in one chain:
//! `distlock::client(url).ttl(…).owner(…).connect().await?`.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Clock, LockClient, LockError, LockOptions, LockOptionsBuilder};

use crate::schemes::open_backend;

/// A client of the engine `url` names (see [`open_backend`] for the URLs), with options set
/// before it connects. [`connect`](crate::connect) is the same with every default.
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
///
/// let locks = distlock::client("redis://127.0.0.1:6379")
///     .ttl(Duration::from_secs(30))
///     .wait_timeout(Duration::from_secs(5))
///     .owner("billing-1")
///     .connect()
///     .await?;
/// let guard = locks.lock("invoices:2026-11").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn client(url: impl Into<String>) -> ClientBuilder {
    ClientBuilder {
        url: url.into(),
        options: LockOptions::builder(),
        owner: None,
        clock: None,
        local_queue: None,
    }
}

/// Builder of a [`LockClient`] from a URL, made by [`client`]. Nothing is opened until
/// [`connect`](Self::connect).
#[must_use = "a builder does nothing until connect"]
pub struct ClientBuilder {
    url: String,
    options: LockOptionsBuilder,
    owner: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    local_queue: Option<bool>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &distlock_core::url::redact(&self.url))
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Every default option of the client's acquisitions at once (a call can still change any
    /// of them: [`LockClient::lock`]).
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options.to_builder();
        self
    }

    /// The lease length of the client's locks (see [`LockOptionsBuilder::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// How long the client's acquisitions wait for a busy lock before `Timeout` (see
    /// [`LockOptionsBuilder::wait_timeout`]).
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.options = self.options.wait_timeout(wait);
        self
    }

    /// The holder label shown by `status` (default `host/pid`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The monotonic clock lease deadlines are measured on (tests inject one).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// In-process singleflight (default on): see
    /// [`LockClientBuilder::local_queue`](distlock_core::LockClientBuilder::local_queue).
    pub fn local_queue(mut self, on: bool) -> Self {
        self.local_queue = Some(on);
        self
    }

    /// Checks the options, opens the engine and builds the client.
    ///
    /// # Errors
    /// `Config` for options that do not hold together (a zero TTL, say), checked before
    /// anything is opened; then as [`open_backend`].
    pub async fn connect(self) -> Result<LockClient, LockError> {
        let options = self.options.build()?;
        let backend = open_backend(&self.url).await?;
        let mut builder = LockClient::builder(backend).options(options);
        if let Some(owner) = self.owner {
            builder = builder.owner(owner);
        }
        if let Some(clock) = self.clock {
            builder = builder.clock(clock);
        }
        if let Some(on) = self.local_queue {
            builder = builder.local_queue(on);
        }
        Ok(builder.build())
    }
}
