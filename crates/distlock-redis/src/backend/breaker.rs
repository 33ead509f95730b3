//! Breaking a lock (`Breaker`): a release with the holder's token, read first.

use distlock_core::engine::{BreakOutcome, Breaker, LeaseCheck, LeaseKind, LockError, Token};
use distlock_core::recipes::shares_unbreakable;

use super::RedisBackend;

#[distlock_core::engine::async_trait]
impl Breaker for RedisBackend {
    /// Releases the lock with its holder's token, read first: exactly a release by the holder
    /// (the next waiting client is handed the lock, or woken).
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        let (st, token) = self.holder(key).await?;
        if st.holders.iter().any(|h| h.kind != LeaseKind::Exclusive) {
            return Err(shares_unbreakable(key, "readers or a semaphore's permits"));
        }
        let Some(token) = token.filter(|_| st.held) else {
            return Ok(BreakOutcome::Free);
        };
        let token = Token::stored(&token)?;
        Ok(match self.release_inner(key, &token, None).await? {
            LeaseCheck::Ours => BreakOutcome::Broken(st),
            LeaseCheck::Missing => BreakOutcome::Free,
            _ => BreakOutcome::Changed,
        })
    }
}
