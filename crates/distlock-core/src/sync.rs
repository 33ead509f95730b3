//! A mutex that a panic elsewhere does not poison for good.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `lock()` that takes the data of a poisoned mutex as it is: the lock state kept behind these
/// mutexes stays consistent at every step (no invariant spans a panic), and a panic in one task
/// must not stop every later lock and release. The one helper for it, for the core and the
/// engines.
pub trait MutexExt<T> {
    /// Locks the mutex, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> MutexExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
