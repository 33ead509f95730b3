//! Fences a program can count on: the [`Fence`] type, and guards that always carry one
//! ([`Fenced`]).
//!
//! An untyped guard's [`fence`](LockGuard::fence) is an `Option`, since some engines give none
//! (memcached, Redlock). A program that writes through a fence asks for a
//! [`FencedClient`](crate::FencedClient) instead: making one fails on an engine without fences,
//! with the engine's reason, and every guard it gives has a [`Fence`], never an `Option`.

use std::fmt;
use std::ops::Deref;

use super::typed::sealed::Sealed;
use super::{Guard, LockGuard, Released};
use crate::engine::{Backend, Fencing};
use crate::error::{ErrorKind, LockError};

/// A fencing token: every new holder of a name gets a greater one than every holder before it,
/// so a protected resource that remembers the largest it has seen can refuse a stale holder's
/// writes. Ordered, and written as its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// The fence `n`.
    pub const fn new(n: u64) -> Self {
        Fence(n)
    }

    /// Its number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<Fence> for u64 {
    fn from(f: Fence) -> u64 {
        f.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A guard `G` with its lease's [`Fence`], from a [`FencedClient`](crate::FencedClient) (or a
/// request made [`fenced`](crate::LockRequest::fenced)). It reads as `G` through `Deref`.
#[must_use = "dropping a guard releases its lease in the background"]
pub struct Fenced<G> {
    guard: G,
    fence: Fence,
}

impl<G: Guard> Guard for Fenced<G> {}
impl<G: Guard> Sealed for Fenced<G> {
    fn wrap(guard: LockGuard) -> Result<Self, LockGuard> {
        let Some(fence) = guard.fence() else {
            return Err(guard);
        };
        Ok(Fenced {
            guard: G::wrap(guard)?,
            fence: Fence(fence),
        })
    }

    fn fenced() -> bool {
        true
    }
}

impl<G> Fenced<G> {
    /// The lease's fence.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The guard inside.
    pub fn into_inner(self) -> G {
        self.guard
    }
}

impl<G: Into<LockGuard>> Fenced<G> {
    /// Releases the lease (see [`LockGuard::release`]).
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<Released, LockError> {
        self.guard.into().release().await
    }
}

impl<G> Deref for Fenced<G> {
    type Target = G;
    fn deref(&self) -> &G {
        &self.guard
    }
}

impl<G: fmt::Debug> fmt::Debug for Fenced<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fenced")
            .field("fence", &self.fence.0)
            .field("guard", &self.guard)
            .finish()
    }
}

/// Refuses an engine that gives no fences, with its reason.
pub(crate) fn require_fences(backend: &dyn Backend) -> Result<(), LockError> {
    match backend.capabilities().fencing {
        Fencing::Monotonic => Ok(()),
        Fencing::Unavailable(why) => Err(LockError::new(
            ErrorKind::Unsupported,
            format!("the {} engine gives no fences: {why}", backend.name()),
        )),
    }
}

/// The error for a lease an engine granted without a fence to a guard that needs one (the
/// lease has been given back).
pub(crate) fn no_fence(backend: &dyn Backend, key: &str) -> LockError {
    LockError::new(
        ErrorKind::Protocol,
        format!(
            "the {} engine granted {key:?} without a fence (a resend it could not trace); the \
             lease was given back",
            backend.name()
        ),
    )
}
