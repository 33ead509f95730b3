//! A mutex that a panic elsewhere does not poison for good, and the synchronisation types of
//! the core's shared state ([`shim`]): std's, or loom's in the model checks.

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

/// The mutexes and atomics of the state that tasks share in the local queues, the leases, the
/// loss counter and the wake hub: std's in every build but the model checks' (`src/models/`,
/// `--cfg distlock_loom` in a test build: `.ci/loom`), where they are loom's, so that loom
/// sees every access and tries every interleaving of them. `Locked` is [`MutexExt`] for
/// whichever mutex it is.
#[cfg(not(all(test, distlock_loom)))]
pub(crate) mod shim {
    pub(crate) use super::MutexExt as Locked;
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use std::sync::{Mutex, MutexGuard};
}

#[cfg(all(test, distlock_loom))]
pub(crate) mod shim {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    use std::sync::PoisonError;

    /// [`MutexExt`](super::MutexExt) for loom's mutex.
    pub(crate) trait Locked<T> {
        fn locked(&self) -> MutexGuard<'_, T>;
    }

    impl<T> Locked<T> for Mutex<T> {
        fn locked(&self) -> MutexGuard<'_, T> {
            self.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// A model thread's stack: the lease's log line and tokio's futures need more than the
    /// 32 KiB loom gives a thread.
    const STACK: usize = 256 << 10;

    /// Runs `model` under every interleaving loom tries with at most `preemptions`
    /// preemptions a run (`LOOM_MAX_PREEMPTIONS`, when set, for every model), and every outcome
    /// its memory model allows of each atomic access. The model runs on a thread of its own,
    /// with [`STACK`].
    pub(crate) fn check(preemptions: usize, model: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(preemptions);
        }
        let model = std::sync::Arc::new(model);
        builder.check(move || {
            let model = model.clone();
            spawn(move || model()).join().expect("the model's thread");
        });
    }

    /// `loom::thread::spawn`, with [`STACK`].
    pub(crate) fn spawn<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> loom::thread::JoinHandle<T> {
        loom::thread::Builder::new()
            .stack_size(STACK)
            .spawn(f)
            .expect("a model thread")
    }
}
