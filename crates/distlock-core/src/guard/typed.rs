//! Guards typed by the lease they hold: a reader's, a writer's, a permit's. Each is a
//! [`LockGuard`] inside (read through `Deref`), and only a writer has `downgrade`: a reader's or
//! a permit's cannot even be asked, where one untyped guard failed at run time.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use super::{LeakedLease, LockGuard, Released};
use crate::error::LockError;

/// What a [`LockRequest`](crate::LockRequest) gives when it is granted: [`LockGuard`] (a mutex,
/// or a lease of a kind chosen at run time), [`ReadGuard`], [`WriteGuard`] or [`Permit`].
/// Sealed: the library's guards only.
pub trait Guard: sealed::Sealed + Sized + Send + 'static {}

pub(super) mod sealed {
    pub trait Sealed: Sized {
        /// The guard of a granted lease; the lease back when it cannot be one (a fenced
        /// guard's lease that came without a fence).
        fn wrap(guard: super::LockGuard) -> Result<Self, super::LockGuard>;

        /// Whether the guard needs a fence with every lease.
        fn fenced() -> bool {
            false
        }
    }
}

/// Wraps a granted lease as the guard `G`; the lease back when it cannot be one.
pub(crate) fn wrap<G: Guard>(guard: LockGuard) -> Result<G, LockGuard> {
    <G as sealed::Sealed>::wrap(guard)
}

/// Whether the guard `G` needs a fence with every lease.
pub(crate) fn needs_fence<G: Guard>() -> bool {
    <G as sealed::Sealed>::fenced()
}

impl Guard for LockGuard {}
impl sealed::Sealed for LockGuard {
    fn wrap(guard: LockGuard) -> Result<Self, LockGuard> {
        Ok(guard)
    }
}

macro_rules! typed_guard {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[must_use = "dropping a guard releases its lease in the background"]
        pub struct $name(LockGuard);

        impl Guard for $name {}
        impl sealed::Sealed for $name {
            fn wrap(guard: LockGuard) -> Result<Self, LockGuard> {
                Ok($name(guard))
            }
        }

        impl Deref for $name {
            type Target = LockGuard;
            fn deref(&self) -> &LockGuard {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.0).finish()
            }
        }

        impl From<$name> for LockGuard {
            fn from(guard: $name) -> LockGuard {
                guard.0
            }
        }

        impl $name {
            #[doc = concat!("Releases the ", $what, " (see [`LockGuard::release`]).")]
            ///
            /// # Errors
            /// As [`LockGuard::release`].
            ///
            /// # Cancel safety
            /// As [`LockGuard::release`].
            pub async fn release(self) -> Result<Released, LockError> {
                self.0.release().await
            }

            #[doc = concat!("Releases the ", $what, " once it has been held `at_least` this long (see [`LockGuard::release_after`]).")]
            ///
            /// # Errors
            /// As [`LockGuard::release_after`].
            ///
            /// # Cancel safety
            /// As [`LockGuard::release_after`].
            pub async fn release_after(self, at_least: Duration) -> Result<Released, LockError> {
                self.0.release_after(at_least).await
            }

            #[doc = concat!("Gives the ", $what, " up without releasing it (see [`LockGuard::leak`]).")]
            pub fn leak(self) -> LeakedLease {
                self.0.leak()
            }

            /// The untyped guard inside.
            pub fn into_inner(self) -> LockGuard {
                self.0
            }
        }
    };
}

typed_guard!(
    /// A reader's lease of a read-write lock, from
    /// [`LockClient::read_lock`](crate::LockClient::read_lock): shared with other readers,
    /// excluding writers. It has no `downgrade`: there is nothing below a reader, and asking
    /// does not compile.
    ///
    /// ```compile_fail
    /// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
    /// let reader = locks.read_lock("catalog").acquire().await?;
    /// let reader = reader.downgrade().await?;
    /// # Ok(()) }
    /// ```
    ReadGuard,
    "reader"
);

typed_guard!(
    /// A writer's lease of a read-write lock, from
    /// [`LockClient::write_lock`](crate::LockClient::write_lock): it excludes every reader and
    /// every other writer, and can become a reader without a gap
    /// ([`downgrade`](WriteGuard::downgrade)).
    WriteGuard,
    "writer"
);

typed_guard!(
    /// One permit of a counting semaphore, from
    /// [`LockClient::semaphore`](crate::LockClient::semaphore). It has no `downgrade`.
    ///
    /// ```compile_fail
    /// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
    /// let permit = locks.semaphore("exports", 4).acquire().await?;
    /// let permit = permit.downgrade().await?;
    /// # Ok(()) }
    /// ```
    Permit,
    "permit"
);

impl WriteGuard {
    /// Turns this writer into a reader of the same read-write lock, without letting another
    /// writer in between: the guard keeps its token and its fence (the fence of its own write,
    /// which is the last write a reader may read after), and is renewed and released as a
    /// reader from now on. Readers that were waiting right behind it come in at once; a writer
    /// that was waiting still waits, now for this reader too.
    ///
    /// There is no upgrade: two readers that both asked to become the writer would each wait
    /// for the other to leave. Release the reader and take the writer instead.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
    /// let writer = locks.write_lock("catalog").acquire().await?;
    /// // ... write ...
    /// let reader = writer.downgrade().await?; // no other writer in between
    /// // ... read what was written, alongside other readers ...
    /// reader.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The error, with the writer given back (`?` turns it into a [`LockError`] and drops the
    /// writer, released in the background):
    /// - `Unsupported` on an engine that cannot do it in one step (the message says why);
    /// - `Lost` when the lease had already ended or was no longer ours on the engine (the guard
    ///   then reports it lost);
    /// - engine errors otherwise. The writer is then still the writer it was, as far as this
    ///   client knows, and calling `downgrade` again is safe: the engine's step is idempotent.
    ///   (Had the engine done it after all, the writer's renewals find the lock a reader's, and
    ///   report the lease lost: never a writer that is not one.)
    ///
    /// # Cancel safety
    /// Not cancel-safe in the sense that the engine may have done it: the writer's lease is then
    /// reported lost at its next renewal, as above.
    pub async fn downgrade(mut self) -> Result<ReadGuard, DowngradeError> {
        match self.0.downgrade().await {
            Ok(()) => Ok(ReadGuard(self.0)),
            Err(error) => Err(DowngradeError {
                error,
                writer: self,
            }),
        }
    }
}

/// A [`WriteGuard::downgrade`] that failed: the error, and the writer it leaves.
#[derive(Debug)]
pub struct DowngradeError {
    /// Why it failed.
    pub error: LockError,
    /// The writer, still held as far as this client knows (unless `error` says it was lost).
    pub writer: WriteGuard,
}

impl fmt::Display for DowngradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for DowngradeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<DowngradeError> for LockError {
    fn from(e: DowngradeError) -> LockError {
        e.error
    }
}
