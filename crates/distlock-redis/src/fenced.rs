//! Fenced writes to a resource kept in Redis: the half of fencing that runs where the data is.

use distlock_core::{ErrorKind, LockError};
use redis::aio::ConnectionLike;

use crate::error::map_err;
use crate::replies::{FencedWrite, ScriptReply};

/// Writes `value` to the resource `key` (a hash with the fields `value` and `fence`) only when
/// `fence` is at least the highest fence that wrote it before, atomically (one Lua script).
///
/// `Ok(true)`: written. `Ok(false)`: refused, because a holder with a newer fence wrote it: the
/// caller's lock is stale (it paused past its TTL, say) and its write must not land. Works with
/// fences from any engine, on any connection (the resource need not live where the locks do).
///
/// Fences are compared as whole numbers of any size up to `u64::MAX`, digit by digit (Lua's
/// numbers are doubles, exact only to 2^53).
///
/// ```no_run
/// # async fn demo(
/// #     locks: distlock_core::LockClient,
/// # ) -> Result<(), distlock_core::LockError> {
/// # let to_err = |e: redis::RedisError| distlock_core::LockError::new(distlock_core::ErrorKind::Connection, e.to_string());
/// let data = redis::Client::open("redis://127.0.0.1:6379").map_err(to_err)?;
/// let mut conn = data.get_multiplexed_async_connection().await.map_err(to_err)?;
/// let guard = locks.acquire("report").await?;
/// let fence = guard.fence().expect("Redis gives fences");
/// // ... long work, during which the lease may run out ...
/// if !distlock_redis::fenced_set(&mut conn, "report:data", fence, b"contents").await? {
///     // A newer holder wrote it: this holder's lock is stale. Stop; do not retry.
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The connection's errors; `Protocol` when the key holds something that is not such a hash.
pub async fn fenced_set(
    conn: &mut impl ConnectionLike,
    key: &str,
    fence: u64,
    value: impl AsRef<[u8]>,
) -> Result<bool, LockError> {
    const DOING: &str = "writing a fenced value";
    let reply: redis::Value = crate::scripts::fenced_set()
        .script()
        .key(key)
        .arg(fence.to_string())
        .arg(value.as_ref())
        .invoke_async(conn)
        .await
        .map_err(|e| map_err(e, DOING))?;
    let written = FencedWrite::decode(&reply, DOING)? == FencedWrite::Written;
    if !written {
        distlock_core::metrics::fence_refused("redis");
    }
    Ok(written)
}

/// Reads a resource written by [`fenced_set`]: its value and the fence that wrote it.
///
/// # Errors
/// The connection's errors; `Protocol` for a malformed fence.
pub async fn fenced_get(
    conn: &mut impl ConnectionLike,
    key: &str,
) -> Result<Option<(Vec<u8>, u64)>, LockError> {
    let (value, fence): (Option<Vec<u8>>, Option<String>) = redis::cmd("HMGET")
        .arg(key)
        .arg("value")
        .arg("fence")
        .query_async(conn)
        .await
        .map_err(|e| map_err(e, "reading a fenced value"))?;
    match (value, fence) {
        (Some(v), Some(f)) => {
            let f = f.parse().map_err(|_| {
                LockError::new(
                    ErrorKind::Protocol,
                    format!("the fence of {key:?} is {f:?}, not a number"),
                )
            })?;
            Ok(Some((v, f)))
        }
        _ => Ok(None),
    }
}
