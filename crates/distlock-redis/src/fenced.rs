//! Fenced writes to a resource kept in Redis: the half of fencing that runs where the data is.

use distlock_core::{ErrorKind, LockError};
use redis::aio::ConnectionLike;

use crate::error::map_err;
use crate::replies::{FencedWrite, ScriptReply};

/// A redis-rs error as the library's [`LockError`], of the kind the Redis engine gives its own
/// (`Connection`, `Auth`, `Timeout`, `Protocol`, a refused certificate…): for the calls a
/// program makes on its own connections beside [`fenced_set`].
///
/// ```no_run
/// # async fn demo(conn: &mut redis::aio::MultiplexedConnection) -> Result<(), distlock_core::LockError> {
/// let n: u64 = redis::cmd("DBSIZE")
///     .query_async(conn)
///     .await
///     .map_err(distlock_redis::lock_error)?;
/// # let _ = n; Ok(()) }
/// ```
pub fn lock_error(e: redis::RedisError) -> LockError {
    map_err(e, "a request of the program's own")
}

/// A connection to the Redis that keeps a fenced resource (any URL redis-rs opens, `rediss://`
/// included), for [`fenced_set`] and [`fenced_get`]: the resource need not live where the
/// locks do.
///
/// # Errors
/// `Config` for a URL redis-rs refuses; the connection's errors as [`lock_error`] gives them.
pub async fn resource_connection(
    url: &str,
) -> Result<redis::aio::MultiplexedConnection, LockError> {
    const DOING: &str = "connecting to the resource's Redis";
    let client = redis::Client::open(url).map_err(|e| {
        LockError::new(
            ErrorKind::Config,
            format!("{DOING}: {}: {e}", distlock_core::url::redact(url)),
        )
    })?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| map_err(e, DOING))
}

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
/// let mut conn = distlock_redis::resource_connection("redis://127.0.0.1:6379").await?;
/// let locks = locks.fenced()?; // every guard carries a fence
/// let guard = locks.lock("report").acquire().await?;
/// // ... long work, during which the lease may run out ...
/// let fence = guard.fence().get();
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
