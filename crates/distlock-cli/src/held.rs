//! What `distlock run` holds: one lock, or several names taken together (`lock_many`).

use std::time::Duration;

use distlock::{LeaseHandle, LockClient, LockError, LockGuard, MultiGuard, Released};
use tokio::process::Command;

pub(crate) enum Held {
    One(LockGuard),
    Many(MultiGuard),
}

impl Held {
    /// Takes `keys` (one name of `kind`, or several exclusive names) as the client's options
    /// say.
    pub(crate) async fn take(
        client: &LockClient,
        keys: &[String],
        kind: distlock::LeaseKind,
    ) -> Result<Held, LockError> {
        match keys {
            [key] => client.lock(key).kind(kind).acquire().await.map(Held::One),
            _ => client
                .lock_many(keys.iter().cloned())
                .acquire()
                .await
                .map(Held::Many),
        }
    }

    /// The lease's handle (its lost signal).
    pub(crate) fn handle(&self) -> LeaseHandle {
        match self {
            Held::One(g) => g.handle(),
            Held::Many(g) => g.handle(),
        }
    }

    /// Whether the lease can be left on the engine to run out by itself.
    pub(crate) fn lingers(&self) -> bool {
        match self {
            Held::One(g) => g.lingers(),
            Held::Many(_) => false,
        }
    }

    /// Releases the lease.
    pub(crate) async fn release(self) -> Result<Released, LockError> {
        match self {
            Held::One(g) => g.release().await,
            Held::Many(g) => g.release().await,
        }
    }

    /// Leaves the lease to run out `least` after it was taken (only where it
    /// [`lingers`](Self::lingers)).
    pub(crate) async fn release_after(self, least: Duration) -> Result<Released, LockError> {
        match self {
            Held::One(g) => g.release_after(least).await,
            Held::Many(g) => g.release().await,
        }
    }

    /// The command's environment: `DISTLOCK_KEYS` (the names in the order they were taken, one
    /// a line), `DISTLOCK_FENCES` (their fences in that order, space-separated, when the engine
    /// gives fences); with one name, `DISTLOCK_KEY` and `DISTLOCK_FENCE` too.
    pub(crate) fn set_env(&self, cmd: &mut Command) {
        cmd.env_remove("DISTLOCK_KEY")
            .env_remove("DISTLOCK_FENCE")
            .env_remove("DISTLOCK_FENCES");
        let (names, fences): (Vec<String>, Vec<Option<u64>>) = match self {
            Held::One(g) => (vec![g.key().to_owned()], vec![g.fence()]),
            Held::Many(g) => (g.names().to_vec(), g.fences().to_vec()),
        };
        cmd.env("DISTLOCK_KEYS", names.join("\n"));
        let fences: Option<Vec<String>> = fences.iter().map(|f| f.map(|f| f.to_string())).collect();
        if let Some(fences) = &fences {
            cmd.env("DISTLOCK_FENCES", fences.join(" "));
        }
        if let ([name], Some(fences)) = (names.as_slice(), &fences) {
            cmd.env("DISTLOCK_KEY", name);
            if let [fence] = fences.as_slice() {
                cmd.env("DISTLOCK_FENCE", fence);
            }
        } else if let [name] = names.as_slice() {
            cmd.env("DISTLOCK_KEY", name);
        }
    }
}

/// The keys as messages show them: `"a"`, or `["a", "b"]`.
pub(crate) fn shown(keys: &[String]) -> String {
    match keys {
        [key] => format!("{key:?}"),
        _ => format!("{keys:?}"),
    }
}
