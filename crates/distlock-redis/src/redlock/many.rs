//! Several names at once on Redlock (`MultiLock`): on each master one script takes every name
//! or none (`redlock_acquire_many.lua`), sent to all masters at once as a single name's acquire
//! is; the quorum and the validity are decided as for one name (`RedlockBackend::conclude`),
//! and an attempt that is not ours releases every name on every master. A renewal extends
//! every name on a master only if all still hold our token there (`extend_many.lua`), and holds
//! on a majority; a release is a compare-and-delete of each name on every master. No fences,
//! as for one name.

use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireMany, Attempt, LeaseCheck, LockError, ManyAttempt, MultiLock, Token,
};
use distlock_core::recipes::HolderValue;

use super::{RedlockBackend, Vote, lease_of, no_quorum};
use crate::replies::MasterManyReply;
use crate::scripts::ttl_ms;

impl From<MasterManyReply> for Vote {
    fn from(reply: MasterManyReply) -> Self {
        match reply {
            MasterManyReply::Ours => Vote::Yes,
            MasterManyReply::Held { ttl, .. } => Vote::Held(ttl),
        }
    }
}

/// The name to report busy: the one most masters found held (the first in the names' order
/// among equals); `None` when no master found one held.
fn busiest(replies: &[Option<MasterManyReply>], names: usize) -> Option<usize> {
    let mut counts = vec![0usize; names];
    for r in replies.iter().flatten() {
        if let MasterManyReply::Held { name, .. } = r
            && let Some(c) = counts.get_mut(*name)
        {
            *c += 1;
        }
    }
    let most = counts.iter().copied().max().filter(|&m| m > 0)?;
    counts.iter().position(|&c| c == most)
}

impl RedlockBackend {
    /// The names' lock keys, in their order.
    fn lock_keys(&self, names: &[&str]) -> Vec<String> {
        names.iter().map(|n| self.layout.lock_key(n)).collect()
    }

    /// Compare-and-delete of every name on every master, each within `limit`.
    async fn release_many_on_all(
        &self,
        keys: &[&str],
        token: &Token,
        limit: Duration,
    ) -> Vec<Vote> {
        self.on_all(
            &self.scripts.release_many,
            keys,
            &[token.as_str()],
            limit,
            "releasing Redlock locks",
        )
        .await
    }
}

#[distlock_core::engine::async_trait]
impl MultiLock for RedlockBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        const DOING: &str = "taking several Redlock locks";
        let started = Instant::now();
        let owned = self.lock_keys(req.names);
        let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        let value = HolderValue::now(req.token.as_str(), req.owner).encode();
        let mut ttl_buf = itoa::Buffer::new();
        let ttl = ttl_buf.format(ttl_ms(req.ttl));
        let limit = self.timeout_for(req.ttl);
        // Every attempt runs the script: it takes the names all or none on each master, and
        // writes again the names already ours (a resent request).
        let replies = self
            .replies(
                &self.scripts.acquire_many,
                &keys,
                &[req.token.as_str(), &value, ttl],
                limit,
                DOING,
            )
            .await;
        let votes: Vec<Vote> = replies
            .iter()
            .map(|r| r.map_or(Vote::Failed, Vote::from))
            .collect();
        // Not ours: every name we may have is taken back, on every master.
        let take_back = self.release_many_on_all(&keys, req.token, limit);
        match Self::conclude(&votes, req.ttl, started, DOING, take_back).await? {
            Attempt::Busy { holder_ttl } => Ok(ManyAttempt::Busy {
                // A majority may be short of us with no master finding a name held (too little
                // validity left): the first name stands for them all.
                name: busiest(&replies, req.names.len()).unwrap_or(0),
                holder_ttl,
            }),
            _ => Ok(ManyAttempt::Acquired {
                fences: vec![None; req.names.len()],
            }),
        }
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing several Redlock locks";
        let owned = self.lock_keys(names);
        let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        let mut ttl_buf = itoa::Buffer::new();
        let votes = self
            .on_all(
                &self.scripts.extend_many,
                &keys,
                &[token.as_str(), ttl_buf.format(ttl_ms(ttl))],
                self.timeout_for(ttl),
                DOING,
            )
            .await;
        lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))
    }

    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing several Redlock locks";
        let owned = self.lock_keys(names);
        let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        let limit = self.nodes[0].response_timeout;
        let votes = self.release_many_on_all(&keys, token, limit).await;
        lease_of(&votes).map_err(|(got, needed)| no_quorum(DOING, got, needed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_name_is_the_one_most_masters_found_held() {
        let held = |name| Some(MasterManyReply::Held { name, ttl: None });
        assert_eq!(
            busiest(
                &[held(2), held(1), held(2), None, Some(MasterManyReply::Ours)],
                3
            ),
            Some(2)
        );
        assert_eq!(busiest(&[held(2), held(1)], 3), Some(1));
        // A name out of range (a mangled reply) is not counted.
        assert_eq!(busiest(&[held(7), Some(MasterManyReply::Ours)], 3), None);
    }
}
