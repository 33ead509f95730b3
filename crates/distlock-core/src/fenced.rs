//! A client that says once, when it is made, that its program needs fences: [`FencedClient`],
//! from [`LockClient::fenced`]. Its guards are [`Fenced`], each with a [`Fence`](crate::Fence).

use std::fmt;
use std::ops::Deref;

use crate::client::LockClient;
use crate::error::LockError;
use crate::guard::{Fenced, LockGuard, Permit, ReadGuard, WriteGuard, require_fences};
use crate::request::LockRequest;

/// A client whose guards always carry a [`Fence`](crate::Fence), from [`LockClient::fenced`]: made only on an
/// engine that gives fences. It reads as its [`LockClient`] through `Deref`.
///
/// ```no_run
/// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
/// let locks = locks.fenced()?; // `Unsupported` on memcached or Redlock, with the reason
/// let guard = locks.lock("ledger").acquire().await?;
/// let fence: distlock_core::Fence = guard.fence(); // no Option to unwrap
/// // ... write to the ledger, passing `fence.get()` along ...
/// guard.release().await?;
/// # let _ = fence;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FencedClient {
    client: LockClient,
}

impl fmt::Debug for FencedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FencedClient").field(&self.client).finish()
    }
}

impl LockClient {
    /// This client, as one whose guards always carry a [`Fence`](crate::Fence) (see [`FencedClient`]).
    ///
    /// # Errors
    /// `Unsupported` on an engine that gives no fences, with the engine's reason.
    pub fn fenced(&self) -> Result<FencedClient, LockError> {
        require_fences(self.backend())?;
        Ok(FencedClient {
            client: self.clone(),
        })
    }
}

impl FencedClient {
    /// A request for the lock `key` (see [`LockClient::lock`]).
    pub fn lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, Fenced<LockGuard>> {
        self.client.lock(key).fenced()
    }

    /// A request for a reader's lease (see [`LockClient::read_lock`]).
    pub fn read_lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, Fenced<ReadGuard>> {
        self.client.read_lock(key).fenced()
    }

    /// A request for a writer's lease (see [`LockClient::write_lock`]).
    pub fn write_lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, Fenced<WriteGuard>> {
        self.client.write_lock(key).fenced()
    }

    /// A request for one of `permits` permits (see [`LockClient::semaphore`]).
    pub fn semaphore<'a>(&'a self, key: &'a str, permits: u32) -> LockRequest<'a, Fenced<Permit>> {
        self.client.semaphore(key, permits).fenced()
    }

    /// The client inside.
    pub fn into_inner(self) -> LockClient {
        self.client
    }
}

impl Deref for FencedClient {
    type Target = LockClient;
    fn deref(&self) -> &LockClient {
        &self.client
    }
}
