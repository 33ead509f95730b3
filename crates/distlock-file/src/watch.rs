//! Release events on Linux: inotify on the lock directory.
//!
//! A lease's file is held through two descriptors (see `Locked`): the flock's, read-only, and
//! a writer that closes after the flock is gone, whether the holder released the lease or its
//! process died. That close is an `IN_CLOSE_WRITE` event on the file; a waiter's attempt that
//! finds a lock busy closes only a read-only descriptor, and makes none. One watch on the
//! directory covers every lock in it, so subscribing costs no system call; the watch starts
//! with the first subscription and ends with the engine.
//!
//! The events are read on a thread of the engine's own (the workspace has no `unsafe` code,
//! which registering the descriptor with tokio needs), which polls the descriptor and looks
//! every half second whether its engine is gone.
//!
//! Events a waiter may still miss: a forced release puts a new file at the path (a rename), and
//! the kernel may close a dead process's writer before its flock's descriptor. Waiters
//! therefore keep their back-off between attempts ([`WakeSource::hears_every_release`] says
//! no); an event cuts a pause short.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use distlock_core::engine::{LeaseKind, Listener, LockError, Subscription, WakeSource};
use distlock_core::recipes::{MutexExt, WakeHub};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::FileBackend;

/// How often the watching thread looks whether its engine is gone.
const STOP_CHECK_MS: u16 = 500;

/// The watch of one engine's directory.
pub(crate) struct Watcher {
    hub: WakeHub,
    /// Whether the watch runs: unknown until the first subscription, then for good.
    state: Mutex<State>,
    /// Set when the engine is dropped: the watching thread ends.
    stop: Arc<AtomicBool>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    NotStarted,
    Watching,
    /// inotify is not available here (no instances left, a file system without it): waiters
    /// back off as without events.
    Failed,
}

impl Watcher {
    pub(crate) fn new() -> Self {
        Watcher {
            hub: WakeHub::new(|_| {}, |_| {}),
            state: Mutex::new(State::NotStarted),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts the watch of `dir` if it has not started; whether it runs.
    fn ensure(&self, dir: &Path) -> bool {
        let mut state = self.state.locked();
        if *state == State::NotStarted {
            *state = match start(dir, self.hub.clone(), self.stop.clone()) {
                Ok(()) => State::Watching,
                Err(e) => {
                    tracing::debug!(target: "distlock", dir = %dir.display(), error = %e,
                        "cannot watch the lock directory; waiters back off");
                    State::Failed
                }
            };
        }
        *state == State::Watching
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The hub key of a file of the directory: a lock file's name, or for a permit's slot file
/// (`<stem>.sem.<n>`) its semaphore record's name (`<stem>.sem`), which all its waiters watch.
fn key_of_file(name: &str) -> Option<&str> {
    if name.ends_with(".lock") {
        return Some(name);
    }
    let (record, slot) = name.rsplit_once('.')?;
    (record.ends_with(".sem") && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit()))
        .then_some(record)
}

/// Opens the inotify instance, watches `dir`, and reads its events on a thread of its own
/// until `stop` is set.
fn start(dir: &Path, hub: WakeHub, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(
        dir,
        AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_ONLYDIR,
    )?;
    std::thread::Builder::new()
        .name("distlock-file-watch".to_owned())
        .spawn(move || read_events(&inotify, &hub, &stop))?;
    Ok(())
}

/// Reads events and wakes the subscribers of each file that a writer closed.
fn read_events(inotify: &Inotify, hub: &WakeHub, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(STOP_CHECK_MS)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return fail(hub, e),
        }
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => return fail(hub, e),
        };
        for event in events {
            if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                // Events were dropped: anyone may have missed theirs.
                hub.notify_all();
            } else if let Some(key) = event
                .name
                .as_deref()
                .and_then(|n| n.to_str())
                .and_then(key_of_file)
            {
                hub.notify(key);
            }
        }
    }
}

/// The watch failed: every waiter tries again, then backs off as without events.
fn fail(hub: &WakeHub, e: Errno) {
    tracing::debug!(target: "distlock", error = %e,
        "the lock directory's watch failed; waiters back off");
    hub.notify_all();
}

impl FileBackend {
    /// The hub key that `name`'s waiters of `kind` watch.
    fn watch_key(&self, name: &str, kind: LeaseKind) -> Option<String> {
        let path: PathBuf = match kind {
            LeaseKind::Permit { .. } => self.semaphore_path(name),
            _ => self.lock_path(name),
        };
        path.file_name()?.to_str().map(str::to_owned)
    }

    fn subscribe_key(&self, name: &str, kind: LeaseKind) -> Option<Subscription> {
        let watcher = &self.inner.watcher;
        if !watcher.ensure(&self.inner.dir) {
            return None;
        }
        let key = self.watch_key(name, kind)?;
        let sub = watcher.hub.subscribe(&key);
        // The directory's watch is in place: nothing to wait for.
        watcher.hub.set_confirmed(&key, true);
        Some(sub)
    }
}

#[distlock_core::engine::async_trait]
impl WakeSource for FileBackend {
    async fn subscribe(
        &self,
        name: &str,
        who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        let kind = match who {
            Listener::Waiter { kind, .. } => kind,
            _ => LeaseKind::Exclusive,
        };
        Ok(self.subscribe_key(name, kind))
    }

    /// A forced release, or a dead process whose writer closes before its flock's descriptor,
    /// sends no event that a waiter can act on.
    fn hears_every_release(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_map_to_the_keys_their_waiters_watch() {
        assert_eq!(key_of_file("jobs.lock"), Some("jobs.lock"));
        assert_eq!(key_of_file("jobs.v2.sem.3"), Some("jobs.v2.sem"));
        assert_eq!(key_of_file("jobs.sem.12"), Some("jobs.sem"));
        // The semaphore's record is rewritten by every attempt: never a release event.
        assert_eq!(key_of_file("jobs.sem"), None);
        assert_eq!(key_of_file("jobs.sem."), None);
        assert_eq!(key_of_file("jobs.x.3"), None);
        assert_eq!(key_of_file("notes.txt"), None);
    }

    fn try_take(b: &FileBackend, key: &str, token: &str, kind: LeaseKind) -> bool {
        matches!(
            crate::acquire::acquire_blocking(b, key, token, "test", kind).expect("attempt"),
            distlock_core::engine::Attempt::Acquired { .. }
        )
    }

    fn release(b: &FileBackend, token: &str) {
        assert!(b.held().remove(token).is_some());
    }

    /// Busy attempts wake nobody (waiters would wake each other for ever); a release, and a
    /// reader's or a permit's, wakes the key's subscribers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_end_of_a_lease_is_an_event() {
        let d = tempfile::tempdir().expect("tempdir");
        let holder = FileBackend::new(d.path()).expect("engine");
        let waiter = FileBackend::new(d.path()).expect("engine");
        let quiet = std::time::Duration::from_millis(150);
        let soon = std::time::Duration::from_secs(2);
        let permits = LeaseKind::Permit { permits: 2 };
        for (key, kind) in [
            ("mutex", LeaseKind::Exclusive),
            ("readers", LeaseKind::Shared),
            ("sem", permits),
        ] {
            // A writer waits for the readers; a permit waiter for a full semaphore.
            let wants = if kind == LeaseKind::Shared {
                LeaseKind::Exclusive
            } else {
                kind
            };
            assert!(try_take(&holder, key, "h1", kind));
            if kind == permits {
                assert!(try_take(&holder, key, "h2", kind));
            }
            // (Creating a lock file closes a writer: let that event pass first.)
            tokio::time::sleep(quiet).await;
            let mut sub = waiter.subscribe_key(key, wants).expect("watching");
            for i in 0..5 {
                assert!(!try_take(&waiter, key, &format!("w{i}"), wants), "{key}");
            }
            // Another lock's life is not this key's event.
            assert!(try_take(&holder, "other", "o", LeaseKind::Exclusive));
            release(&holder, "o");
            assert!(
                tokio::time::timeout(quiet, sub.next()).await.is_err(),
                "{key}: busy attempts woke the waiter"
            );
            release(&holder, "h1");
            tokio::time::timeout(soon, sub.next())
                .await
                .unwrap_or_else(|_| panic!("{key}: the release woke nobody"));
            assert!(try_take(&waiter, key, "w", wants), "{key}");
            release(&waiter, "w");
            if kind == permits {
                release(&holder, "h2");
            }
        }
    }
}
