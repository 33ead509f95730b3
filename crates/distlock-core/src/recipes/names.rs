//! The names recorder of the engines whose server knows a lock only by an id or a digest
//! (PostgreSQL's advisory locks, MySQL's long names): `distlock list` needs the name behind
//! each, so a client records it the first time it uses it, in the background (an acquire never
//! waits for it), a batch per statement.
//!
//! The engine supplies the statement; the recorder keeps which keys this client recorded (a
//! bounded set of 64-bit hashes, not the names: a client holding 100,000 locks would keep a
//! copy of each), the channel to one writer task, the batching, and the forgetting of a batch
//! whose write failed (each of its names is then recorded again at its next use).

use std::collections::HashSet;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::mpsc;

use crate::error::LockError;
use crate::sync::MutexExt;

/// How many keys a client remembers having recorded before it starts over (a client that uses
/// ever new names records each once per so many).
pub const REMEMBERED: usize = 65_536;

/// The most names one statement records.
pub const BATCH: usize = 500;

/// One name to record: the engine's key for it (its id, or its server-side name, with the
/// kind), and the name.
pub type Record<K> = (K, String);

/// Which keys this client recorded, and the channel to its writer.
#[derive(Debug)]
pub struct NameRecorder<K> {
    /// The keys recorded, by a 64-bit hash of each (seeded per client). Two keys of one hash
    /// (one chance in about 2^64 a pair) leave the second unrecorded until the set starts
    /// over: `distlock list` misses it meanwhile; no lock depends on this set.
    seen: Mutex<HashSet<u64, foldhash::fast::RandomState>>,
    hasher: foldhash::fast::RandomState,
    writer: Mutex<Option<mpsc::UnboundedSender<Record<K>>>>,
}

impl<K> Default for NameRecorder<K> {
    fn default() -> Self {
        NameRecorder {
            seen: Mutex::default(),
            hasher: foldhash::fast::RandomState::default(),
            writer: Mutex::new(None),
        }
    }
}

impl<K: Hash + Send + 'static> NameRecorder<K> {
    /// Whether `key` is new to this client: `true` once (it is marked recorded), `false` after,
    /// until a failed write or the set's starting over forgets it.
    pub fn first_use(&self, key: &K) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut seen = self.seen.locked();
        if seen.contains(&hash) {
            return false;
        }
        if seen.len() >= REMEMBERED {
            seen.clear();
        }
        seen.insert(hash)
    }

    /// Forgets `key`: it is recorded again at its next use.
    pub fn forget(&self, key: &K) {
        self.seen.locked().remove(&self.hasher.hash_one(key));
    }

    /// Sends `name` to the writer, which `start` spawns with its receiving end the first time
    /// (give it to [`write_batches`]). Outside a runtime nothing is sent, and the key is
    /// forgotten: recorded at its next use.
    pub fn send<F>(
        &self,
        key: K,
        name: String,
        start: impl FnOnce(mpsc::UnboundedReceiver<Record<K>>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut writer = self.writer.locked();
        if writer.is_none() {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                drop(writer);
                self.forget(&key);
                return;
            };
            let (tx, rx) = mpsc::unbounded_channel();
            rt.spawn(start(rx));
            *writer = Some(tx);
        }
        if let Some(tx) = writer.as_ref() {
            let _ = tx.send((key, name));
        }
    }
}

/// The writer's loop, spawned by [`NameRecorder::send`]'s `start`: takes what was sent, up to
/// [`BATCH`] names at a time, and has `write` record them on the engine (one statement), until
/// the channel closes or the engine is dropped. A batch whose write fails is forgotten, so each
/// of its names is recorded again at its next use.
pub async fn write_batches<S, K, W, Fut>(
    engine: Weak<S>,
    mut rx: mpsc::UnboundedReceiver<Record<K>>,
    recorder: fn(&S) -> &NameRecorder<K>,
    write: W,
) where
    S: Send + Sync + 'static,
    K: Hash + Send + 'static,
    W: Fn(Arc<S>, Vec<Record<K>>) -> Fut,
    Fut: Future<Output = Result<(), LockError>>,
{
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(n) => batch.push(n),
                Err(_) => break,
            }
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let hashes: Vec<u64> = {
            let r = recorder(&engine);
            batch.iter().map(|(k, _)| r.hasher.hash_one(k)).collect()
        };
        if let Err(e) = write(engine.clone(), batch).await {
            let mut seen = recorder(&engine).seen.locked();
            for h in hashes {
                seen.remove(&h);
            }
            tracing::debug!(target: "distlock", error = %e, "cannot record the locks' names");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::error::ErrorKind;

    #[derive(Default)]
    struct Engine {
        names: NameRecorder<u32>,
        written: Mutex<Vec<u32>>,
        fail: AtomicBool,
    }

    fn recorder(e: &Engine) -> &NameRecorder<u32> {
        &e.names
    }

    async fn write(e: Arc<Engine>, batch: Vec<Record<u32>>) -> Result<(), LockError> {
        if e.fail.load(Ordering::SeqCst) {
            return Err(LockError::new(ErrorKind::Connection, "down"));
        }
        e.written.locked().extend(batch.iter().map(|(k, _)| *k));
        Ok(())
    }

    fn use_name(e: &Arc<Engine>, key: u32) {
        if e.names.first_use(&key) {
            let engine = Arc::downgrade(e);
            e.names.send(key, format!("name-{key}"), |rx| {
                write_batches(engine, rx, recorder, write)
            });
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn each_name_is_written_once_and_again_after_a_failed_write() {
        let e = Arc::new(Engine::default());
        for key in [1, 2, 1, 2, 3] {
            use_name(&e, key);
        }
        settle().await;
        assert_eq!(*e.written.locked(), vec![1, 2, 3], "each once");
        e.fail.store(true, Ordering::SeqCst);
        use_name(&e, 4);
        settle().await;
        assert!(e.names.first_use(&4), "a failed write is forgotten");
        e.names.forget(&4);
        e.fail.store(false, Ordering::SeqCst);
        use_name(&e, 4);
        use_name(&e, 1);
        settle().await;
        assert_eq!(*e.written.locked(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn the_set_starts_over_when_full() {
        let r = NameRecorder::<usize>::default();
        for k in 0..REMEMBERED {
            assert!(r.first_use(&k));
            assert!(!r.first_use(&k), "remembered");
        }
        // Full: the next use starts the set over, and the others are forgotten.
        assert!(r.first_use(&REMEMBERED));
        assert!(r.first_use(&0));
    }
}
