//! The first attempt's fast path: `SET NX PX` and the fence's `ZADD GT`, plain commands
//! pipelined in one round trip (no script), and the fence floor it proposes.

use distlock_core::engine::{AcquireRequest, Attempt, LockError};
use distlock_core::recipes::HolderValue;
use distlock_core::seeded::{self, SeededBug};
use redis::Value;

use super::RedisBackend;
use crate::connection::push_wait;
use crate::error::{map_err, protocol};
use crate::scripts::ttl_ms;

impl RedisBackend {
    /// The first attempt, pipelined in one round trip: `SET NX PX`, then the fence,
    /// `ZADD fence GT CH floor f` (the floor becomes the fence if it is above every fence given
    /// so far; see [`fence_floor`]), and `WAIT` for replicas when configured. Plain commands: no
    /// script runs on the fast path. When the floor is not above the counter (another client's
    /// clock ahead of ours, or two acquisitions in one microsecond), a second round trip takes
    /// the next number instead (`ZINCRBY`), still while the lock is ours.
    pub(super) async fn acquire_fast(
        &self,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis lock";
        let (name, token) = (req.name, req.token);
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.ignore_errors();
        // Seeded bug `counter-fence`: the bare counter, no floor.
        let floor =
            (!seeded::on(SeededBug::CounterFence)).then(|| fence_floor(self.seen.floor(name)));
        // The keys and the value are copied into the commands: the keys are written in a
        // scratch buffer, and nothing of them is kept across the round trip.
        self.layout.with_keys(name, |keys| {
            let mut ttl = itoa::Buffer::new();
            pipe.cmd("SET")
                .arg(keys.lock())
                .arg(HolderValue::now(token.as_str(), req.owner).encode())
                .arg("NX")
                .arg("PX")
                .arg(ttl.format(ttl_ms(req.ttl)));
            match floor {
                Some(floor) => pipe
                    .cmd("ZADD")
                    .arg(keys.fence())
                    .arg("GT")
                    .arg("CH")
                    .arg(floor)
                    .arg("f"),
                None => pipe.cmd("ZINCRBY").arg(keys.fence()).arg(1).arg("f"),
            };
        });
        if let Some(wait) = self.conn.wait {
            push_wait(&mut pipe, wait);
        }
        let replies = self.conn.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
        let fence = match replies.as_slice() {
            [Value::Okay, Value::Int(1), ..] if floor.is_some() => floor,
            [Value::Okay, Value::Int(0), ..] if floor.is_some() => None,
            [Value::Okay, counted, ..] if floor.is_none() => score(counted),
            [Value::Okay, bad, ..] => {
                // The lock is set but the fence failed (junk under the fence key): undo the
                // lock before reporting, so nothing stays half taken.
                Box::pin(self.undo(name, token)).await;
                return Err(match bad {
                    Value::ServerError(e) => map_err(e.clone().into(), DOING),
                    other => protocol(DOING, other),
                });
            }
            [Value::Nil, ..] => return Ok(Attempt::Busy { holder_ttl: None }),
            // Refused (NOPERM, a read-only replica…): nothing was written.
            [Value::ServerError(e), ..] => return Err(map_err(e.clone().into(), DOING)),
            _ => return Err(protocol(DOING, &Value::Array(replies))),
        };
        if let Some(wait) = self.conn.wait {
            let acks = wait.acks(replies.get(2), DOING);
            Box::pin(self.undo_unreplicated(name, token, wait, acks)).await?;
        }
        let fence = match fence {
            Some(f) => f,
            None => match Box::pin(self.next_number(name)).await {
                Ok(f) => f,
                Err(e) => {
                    Box::pin(self.undo(name, token)).await;
                    return Err(e);
                }
            },
        };
        self.seen.record(name, fence);
        Ok(Attempt::Acquired { fence: Some(fence) })
    }

    /// The fence counter's next number (`ZINCRBY`), for a lock of ours whose floor was not
    /// above the counter; waited for by replicas when configured, as the acquisition was.
    async fn next_number(&self, name: &str) -> Result<u64, LockError> {
        const DOING: &str = "taking a Redis lock's fence";
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.ignore_errors();
        self.layout.with_keys(name, |keys| {
            pipe.cmd("ZINCRBY").arg(keys.fence()).arg(1).arg("f");
        });
        if let Some(wait) = self.conn.wait {
            push_wait(&mut pipe, wait);
        }
        let replies = self.conn.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
        if let Some(wait) = self.conn.wait {
            wait.check(wait.acks(replies.get(1), DOING))?;
        }
        match replies.first() {
            Some(Value::ServerError(e)) => Err(map_err(e.clone().into(), DOING)),
            Some(v) => score(v).ok_or_else(|| protocol(DOING, v)),
            None => Err(protocol(DOING, &Value::Array(replies))),
        }
    }
}

/// The fence a first attempt proposes: this client's wall clock in microseconds, or one above
/// the highest fence of the lock it saw, whichever is larger. It becomes the fence when it is
/// above the counter (`ZADD GT`). A clock past 2^52 µs (the year 2112: a clock set wrong) is
/// left out: the score, a double, must still count in ones.
fn fence_floor(seen: u64) -> u64 {
    const LIMIT: u64 = 1 << 52;
    let now = wall_us();
    let now = if now < LIMIT { now } else { 0 };
    now.max(seen.saturating_add(1))
}

/// The wall clock in microseconds since the epoch (0 before it).
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A sorted set's score as a fence: a whole number from 1 up (RESP2 sends it as text, RESP3 as
/// a double).
fn score(v: &Value) -> Option<u64> {
    let f = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<f64>().ok()?,
        Value::Double(d) => *d,
        _ => return None,
    };
    (f.is_finite() && f >= 1.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0)
        .then_some(f as u64)
}
