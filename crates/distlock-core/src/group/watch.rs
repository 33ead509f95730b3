//! [`GroupWatch`]: each change of a group's members, as it is read.

use futures_util::Stream;

use super::{Group, View};
use crate::error::LockError;

/// Follows a group's members, from [`Group::watch`]: [`changed`](Self::changed) reads them
/// every interval (the group's, 1 s by default) and returns when they differ from the view
/// before (a member joined, left, or joined again with a new epoch or value). Each view has a
/// version one above the one before, from 1.
#[derive(Debug)]
pub struct GroupWatch {
    group: Group,
    seen: Option<View>,
}

impl GroupWatch {
    pub(crate) fn new(group: Group) -> Self {
        GroupWatch { group, seen: None }
    }

    /// Waits for the next view that differs from the last one given (the first call gives the
    /// view at once).
    ///
    /// # Errors
    /// As [`Group::members`]; the watch can be used again after an error.
    ///
    /// # Cancel safety
    /// Cancel-safe: a view read and not returned is read again.
    pub async fn changed(&mut self) -> Result<&View, LockError> {
        let mut first = self.seen.is_none();
        loop {
            if !first {
                tokio::time::sleep(self.group.poll_interval()).await;
            }
            first = false;
            let members = self.group.members().await?;
            if self.seen.as_ref().is_some_and(|v| v.members == members) {
                continue;
            }
            let version = self.seen.as_ref().map_or(1, |v| v.version + 1);
            return Ok(self.seen.insert(View { version, members }));
        }
    }

    /// The last view given, if any.
    pub fn borrow(&self) -> Option<&View> {
        self.seen.as_ref()
    }

    /// The views as a stream: each change, then an error where a read failed.
    pub fn into_stream(self) -> impl Stream<Item = Result<View, LockError>> + Send {
        futures_util::stream::unfold(self, |mut w| async move {
            let next = w.changed().await.cloned();
            Some((next, w))
        })
    }
}
