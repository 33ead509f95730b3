//! Every lock held on an engine: [`LockClient::list`].

use futures_util::StreamExt;

use crate::client::LockClient;
use crate::engine::LockStatus;
use crate::error::{ErrorKind, LockError};
use crate::key::validate_key;

/// How many statuses are read at once while listing.
const READS_IN_FLIGHT: usize = 16;

/// The locks [`LockClient::list`] found, by name.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Listing {
    /// The locks held or waited for, sorted by name.
    pub locks: Vec<ListedLock>,
    /// Whether the scan stopped at its limit: there may be more.
    pub more: bool,
}

/// One lock of a [`Listing`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ListedLock {
    /// Its name.
    pub name: String,
    /// Its status, as [`LockClient::status`] reads it; an error for this lock alone (its keys
    /// changed type under the scan, the server stopped answering) does not end the listing.
    pub status: Result<LockStatus, LockError>,
}

impl ListedLock {
    /// The lock `name`, with `status`.
    pub fn new(name: String, status: Result<LockStatus, LockError>) -> Self {
        ListedLock { name, status }
    }

    /// Whether it is held or waited for (an error counts: it is shown).
    fn in_use(&self) -> bool {
        match &self.status {
            Ok(st) => st.held || st.waiters.is_some_and(|n| n > 0),
            Err(_) => true,
        }
    }
}

impl LockClient {
    /// Every lock whose name starts with `prefix` that is held or waited for now, at most
    /// `limit` of them, with each one's status: its kind, every holder (label, TTL left,
    /// fence) and its waiters where the engine can tell.
    ///
    /// The engine's scan is bounded by `limit` too and never blocks the server (on Redis,
    /// `SCAN` with a `COUNT`, never `KEYS`); each name found is then read as
    /// [`status`](Self::status) reads it, a few at a time. The listing is not a snapshot:
    /// locks taken or released during it may or may not appear.
    ///
    /// # Errors
    /// `Unsupported` on engines that cannot list (the message says why), `Config` for a
    /// zero limit, and the engine's errors from the scan.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Listing, LockError> {
        if limit == 0 {
            return Err(LockError::new(
                ErrorKind::Config,
                "a listing's limit must be at least 1".to_owned(),
            ));
        }
        let backend = self.backend();
        let Some(lister) = backend.lister() else {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot list its locks: {}",
                    backend.name(),
                    backend.capabilities().why_no_list
                ),
            ));
        };
        let found = lister.names(prefix, limit).await?;
        let mut names = found.names;
        names.retain(|n| n.starts_with(prefix) && validate_key(n).is_ok());
        names.sort_unstable();
        names.dedup();
        let read = futures_util::stream::iter(names)
            .map(|name| async move {
                let status = self.status(&name).await;
                ListedLock { name, status }
            })
            .buffered(READS_IN_FLIGHT);
        let mut locks: Vec<ListedLock> = read
            .filter(|l| std::future::ready(l.in_use()))
            .collect()
            .await;
        let mut more = found.more;
        if locks.len() > limit {
            locks.truncate(limit);
            more = true;
        }
        Ok(Listing { locks, more })
    }
}
