//! What the scripts answer, as types: one reply type per script, converted from the Redis
//! value here and nowhere else. A value a script cannot answer is a protocol error (a
//! different script under the same hash, a proxy that mangles replies).

use std::time::Duration;

use distlock_core::engine::{LeaseCheck, LockError};
use redis::Value;

use crate::error::protocol;

/// A script's reply type.
pub(crate) trait ScriptReply: Sized {
    /// The reply, if `v` is one.
    fn parse(v: &Value) -> Option<Self>;

    /// The reply, or a protocol error naming what was being done.
    fn decode(v: &Value, doing: &str) -> Result<Self, LockError> {
        Self::parse(v).ok_or_else(|| protocol(doing, v))
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// A reply's text, if it is a string.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A `PTTL` as a remaining lease: `None` for -1 (no TTL: a foreign lock) and -2 (gone).
fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// A fence the scripts return: numbers from 1 up, 0 for none recorded.
fn fence(v: &Value) -> Option<u64> {
    int(v)
        .and_then(|f| u64::try_from(f).ok())
        .filter(|f| *f > 0)
}

/// The token-compared scripts that change one key (`extend.lua`, `redlock_release.lua`):
/// 1 ours (changed), 0 no lock, -1 another owner's (untouched).
impl ScriptReply for LeaseCheck {
    fn parse(v: &Value) -> Option<Self> {
        match int(v)? {
            1 => Some(LeaseCheck::Ours),
            0 => Some(LeaseCheck::Missing),
            -1 => Some(LeaseCheck::Foreign),
            _ => None,
        }
    }
}

/// `acquire_many.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ManyReply {
    /// Every name ours, a fence each in order.
    Acquired { fences: Vec<u64> },
    /// The name at this place (from 0) is another holder's.
    Busy {
        name: usize,
        holder_ttl: Option<Duration>,
    },
}

impl ScriptReply for ManyReply {
    fn parse(v: &Value) -> Option<Self> {
        let Value::Array(items) = v else { return None };
        match items.first().and_then(int)? {
            1 => Some(ManyReply::Acquired {
                fences: items[1..].iter().map(fence).collect::<Option<_>>()?,
            }),
            0 if items.len() == 3 => Some(ManyReply::Busy {
                name: usize::try_from(int(&items[1])?).ok()?.checked_sub(1)?,
                holder_ttl: pttl(int(&items[2])?),
            }),
            _ => None,
        }
    }
}

/// `acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// `{1, fence}`: the lock is ours.
    Acquired { fence: u64 },
    /// `{0, pttl, queued}`: busy; the holder's remaining lease (when it has one), and whether
    /// this call queued our registration (`false`: it kept the one we had, or did not queue).
    Busy {
        holder_ttl: Option<Duration>,
        queued: bool,
    },
}

impl ScriptReply for AcquireReply {
    fn parse(v: &Value) -> Option<Self> {
        let Value::Array(items) = v else { return None };
        match (items.first().and_then(int)?, items.get(1)) {
            (1, Some(f)) => Some(AcquireReply::Acquired { fence: fence(f)? }),
            (0, Some(ms)) => Some(AcquireReply::Busy {
                holder_ttl: pttl(int(ms)?),
                queued: items.get(2).and_then(int) == Some(1),
            }),
            _ => None,
        }
    }
}

/// `permit_acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitReply {
    /// `{1, fence}`: a permit is ours.
    Acquired { fence: u64 },
    /// `{0, ms, queued}`: no permit for us now; the first holder's remaining lease (when there
    /// is a holder), and whether this call queued us.
    Busy {
        holder_ttl: Option<Duration>,
        queued: bool,
    },
    /// `{-1, permits}`: the semaphore is in use with this number of permits.
    OtherSize { permits: u32 },
    /// `{-2}`: a lock holds the name.
    LockHeld,
}

impl ScriptReply for PermitReply {
    fn parse(v: &Value) -> Option<Self> {
        let Value::Array(items) = v else { return None };
        match (items.first().and_then(int)?, items.get(1)) {
            (1, Some(f)) => Some(PermitReply::Acquired { fence: fence(f)? }),
            (0, Some(ms)) => Some(PermitReply::Busy {
                holder_ttl: pttl(int(ms)?),
                queued: items.get(2).and_then(int) == Some(1),
            }),
            (-1, Some(p)) => Some(PermitReply::OtherSize {
                permits: u32::try_from(int(p)?).ok()?,
            }),
            (-2, None) => Some(PermitReply::LockHeld),
            _ => None,
        }
    }
}

/// `read_acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadReply {
    /// `{1, fence}`: the share is ours; the fence is the counter as the last writer left it
    /// (0 before any writer).
    Acquired { fence: u64 },
    /// `{0, pttl, queued}`: a writer holds the lock or waits for it.
    Busy { holder_ttl: Option<Duration> },
    /// `{-2}`: a semaphore holds the name.
    SemaphoreHeld,
}

impl ScriptReply for ReadReply {
    fn parse(v: &Value) -> Option<Self> {
        let Value::Array(items) = v else { return None };
        match (items.first().and_then(int)?, items.get(1)) {
            (1, Some(f)) => Some(ReadReply::Acquired {
                fence: u64::try_from(int(f)?).ok()?,
            }),
            (0, Some(ms)) => Some(ReadReply::Busy {
                holder_ttl: pttl(int(ms)?),
            }),
            (-2, None) => Some(ReadReply::SemaphoreHeld),
            _ => None,
        }
    }
}

/// `release.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// 0: no lock.
    Missing,
    /// -1: another owner's lock, untouched.
    Foreign,
    /// 1: released, left free.
    Freed,
    /// 2: released and handed to another client (with our next task's registration: ours is
    /// in the queue, the one we believed there or the one sent).
    HandedOver,
    /// 3: the same, and our next task's registration was added to the queue.
    HandedOverRequeued,
    /// `{4, fence}`: handed to our own next task (nobody else waits).
    HandedToOwn { fence: u64 },
}

impl ReleaseReply {
    /// What the release found under the key.
    pub(crate) fn check(&self) -> LeaseCheck {
        match self {
            ReleaseReply::Missing => LeaseCheck::Missing,
            ReleaseReply::Foreign => LeaseCheck::Foreign,
            _ => LeaseCheck::Ours,
        }
    }
}

impl ScriptReply for ReleaseReply {
    fn parse(v: &Value) -> Option<Self> {
        match v {
            Value::Int(0) => Some(ReleaseReply::Missing),
            Value::Int(-1) => Some(ReleaseReply::Foreign),
            Value::Int(1) => Some(ReleaseReply::Freed),
            Value::Int(2) => Some(ReleaseReply::HandedOver),
            Value::Int(3) => Some(ReleaseReply::HandedOverRequeued),
            Value::Array(items) => match items.as_slice() {
                [Value::Int(4), f] => Some(ReleaseReply::HandedToOwn { fence: fence(f)? }),
                _ => None,
            },
            _ => None,
        }
    }
}

/// `status.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StatusReply {
    /// `{0, last fence, waiters}`: nobody holds the lock.
    Free {
        last_fence: Option<u64>,
        waiters: u64,
    },
    /// `{1, last fence, waiters, pttl, value, meta token, holder fence}`.
    Held {
        /// The holder's remaining lease, if its key has a TTL.
        ttl: Option<Duration>,
        /// The lock key's value (`<token> <since> <owner>` for distlock holders).
        value: String,
        /// The token the meta hash recorded with `holder_fence`.
        meta_token: String,
        holder_fence: Option<u64>,
        last_fence: Option<u64>,
        waiters: u64,
    },
    /// `{2 (readers) or 3 (permits), last fence, waiters, [permits,] then per holder: token,
    /// fence, ms left, holder value}`.
    Shared {
        /// `None` for readers, the semaphore's size for permits.
        permits: Option<u32>,
        holders: Vec<SharedHolder>,
        last_fence: Option<u64>,
        waiters: u64,
    },
}

/// A reader or a permit holder, as `status.lua` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedHolder {
    pub(crate) token: String,
    pub(crate) fence: Option<u64>,
    pub(crate) ttl: Option<Duration>,
    /// `<token> <since> <owner>`, or empty when it was not recorded.
    pub(crate) value: String,
}

impl ScriptReply for StatusReply {
    fn parse(v: &Value) -> Option<Self> {
        let Value::Array(items) = v else { return None };
        let last_fence = items.get(1).and_then(fence);
        let waiters = u64::try_from(items.get(2).and_then(int)?).unwrap_or(0);
        match items.first().and_then(int)? {
            0 => Some(StatusReply::Free {
                last_fence,
                waiters,
            }),
            1 => Some(StatusReply::Held {
                ttl: pttl(items.get(3).and_then(int)?),
                value: items.get(4).and_then(text)?,
                meta_token: items.get(5).and_then(text).unwrap_or_default(),
                holder_fence: items.get(6).and_then(fence),
                last_fence,
                waiters,
            }),
            code @ (2 | 3) => {
                let (permits, rest) = if code == 3 {
                    let n = u32::try_from(items.get(3).and_then(int)?).ok()?;
                    (Some(n), items.get(4..)?)
                } else {
                    (None, items.get(3..)?)
                };
                let holders = rest
                    .chunks(4)
                    .map(|h| {
                        Some(SharedHolder {
                            token: h.first().and_then(text)?,
                            fence: h.get(1).and_then(fence),
                            ttl: pttl(h.get(2).and_then(int)?),
                            value: h.get(3).and_then(text).unwrap_or_default(),
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some(StatusReply::Shared {
                    permits,
                    holders,
                    last_fence,
                    waiters,
                })
            }
            _ => None,
        }
    }
}

/// `leave.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaveReply {
    /// 0: nothing to pass on.
    Left,
    /// 1: the lock handed to us was freed.
    Freed,
    /// 2: the lock handed to us was handed to the next client.
    HandedOver,
}

impl ScriptReply for LeaveReply {
    fn parse(v: &Value) -> Option<Self> {
        match int(v)? {
            0 => Some(LeaveReply::Left),
            1 => Some(LeaveReply::Freed),
            2 => Some(LeaveReply::HandedOver),
            _ => None,
        }
    }
}

/// `redlock_acquire.lua`, on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterAcquireReply {
    /// 1: the lock is ours here (newly set, or already ours: re-armed).
    Ours,
    /// `{0, pttl}`: another owner holds it, for this long (when it has a TTL).
    Held { ttl: Option<Duration> },
}

impl ScriptReply for MasterAcquireReply {
    fn parse(v: &Value) -> Option<Self> {
        match v {
            Value::Int(1) => Some(MasterAcquireReply::Ours),
            Value::Array(items) => match items.as_slice() {
                [Value::Int(0), Value::Int(ms)] => {
                    Some(MasterAcquireReply::Held { ttl: pttl(*ms) })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// `redlock_acquire_many.lua`, on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterManyReply {
    /// 1: every name is ours here (newly set, or already ours: written again).
    Ours,
    /// `{0, i, pttl}`: the name at this place (from 0) is another owner's, for this long (when
    /// it has a TTL); nothing was written.
    Held { name: usize, ttl: Option<Duration> },
}

impl ScriptReply for MasterManyReply {
    fn parse(v: &Value) -> Option<Self> {
        match v {
            Value::Int(1) => Some(MasterManyReply::Ours),
            Value::Array(items) => match items.as_slice() {
                [Value::Int(0), Value::Int(i), Value::Int(ms)] => Some(MasterManyReply::Held {
                    name: usize::try_from(*i).ok()?.checked_sub(1)?,
                    ttl: pttl(*ms),
                }),
                _ => None,
            },
            _ => None,
        }
    }
}

/// `fenced_set.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FencedWrite {
    /// 1: written.
    Written,
    /// 0: a newer fence wrote the resource; the writer's lock is stale.
    Stale,
}

impl ScriptReply for FencedWrite {
    fn parse(v: &Value) -> Option<Self> {
        match int(v)? {
            1 => Some(FencedWrite::Written),
            0 => Some(FencedWrite::Stale),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(items: &[Value]) -> Value {
        Value::Array(items.to_vec())
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn every_reply_of_every_script_parses_and_nothing_else_does() {
        use Value::Int;
        assert_eq!(LeaseCheck::parse(&Int(1)), Some(LeaseCheck::Ours));
        assert_eq!(LeaseCheck::parse(&Int(0)), Some(LeaseCheck::Missing));
        assert_eq!(LeaseCheck::parse(&Int(-1)), Some(LeaseCheck::Foreign));
        assert_eq!(LeaseCheck::parse(&Int(2)), None);

        assert_eq!(
            AcquireReply::parse(&arr(&[Int(1), Int(7)])),
            Some(AcquireReply::Acquired { fence: 7 })
        );
        assert_eq!(
            AcquireReply::parse(&arr(&[Int(1), Int(1_795_471_436_111_000)])),
            Some(AcquireReply::Acquired {
                fence: 1_795_471_436_111_000
            })
        );
        assert_eq!(AcquireReply::parse(&arr(&[Int(1), Int(0)])), None);
        assert_eq!(
            AcquireReply::parse(&arr(&[Int(0), Int(250), Int(1)])),
            Some(AcquireReply::Busy {
                holder_ttl: Some(Duration::from_millis(250)),
                queued: true
            })
        );
        assert_eq!(
            AcquireReply::parse(&arr(&[Int(0), Int(-1), Int(0)])),
            Some(AcquireReply::Busy {
                holder_ttl: None,
                queued: false
            })
        );
        assert_eq!(AcquireReply::parse(&Int(1)), None);

        for (v, r) in [
            (Int(0), ReleaseReply::Missing),
            (Int(-1), ReleaseReply::Foreign),
            (Int(1), ReleaseReply::Freed),
            (Int(2), ReleaseReply::HandedOver),
            (Int(3), ReleaseReply::HandedOverRequeued),
            (
                arr(&[Int(4), Int(9)]),
                ReleaseReply::HandedToOwn { fence: 9 },
            ),
        ] {
            assert_eq!(ReleaseReply::parse(&v), Some(r));
        }
        assert_eq!(ReleaseReply::parse(&Int(5)), None);
        assert_eq!(ReleaseReply::parse(&arr(&[Int(4), Int(0)])), None);

        assert_eq!(
            StatusReply::parse(&arr(&[Int(0), Int(3), Int(2)])),
            Some(StatusReply::Free {
                last_fence: Some(3),
                waiters: 2
            })
        );
        assert_eq!(
            StatusReply::parse(&arr(&[
                Int(1),
                Int(3),
                Int(0),
                Int(900),
                bulk("tok 1 host/1"),
                bulk("tok"),
                Int(3),
            ])),
            Some(StatusReply::Held {
                ttl: Some(Duration::from_millis(900)),
                value: "tok 1 host/1".into(),
                meta_token: "tok".into(),
                holder_fence: Some(3),
                last_fence: Some(3),
                waiters: 0
            })
        );
        assert_eq!(StatusReply::parse(&arr(&[Int(1), Int(900)])), None);
        let reader = |t: &str, f: i64| [bulk(t), Int(f), Int(500), bulk(&format!("{t} 1 host/2"))];
        let mut permits = vec![Int(3), Int(9), Int(1), Int(4)];
        permits.extend(reader("a", 8));
        permits.extend(reader("b", 9));
        match StatusReply::parse(&arr(&permits)) {
            Some(StatusReply::Shared {
                permits: Some(4),
                holders,
                last_fence: Some(9),
                waiters: 1,
            }) => {
                assert_eq!(holders.len(), 2);
                assert_eq!(holders[1].token, "b");
                assert_eq!(holders[1].fence, Some(9));
                assert_eq!(holders[1].ttl, Some(Duration::from_millis(500)));
            }
            other => panic!("{other:?}"),
        }
        let mut readers = vec![Int(2), Int(5), Int(0)];
        readers.extend(reader("a", 5));
        readers.push(bulk("half"));
        assert_eq!(StatusReply::parse(&arr(&readers)), None, "a cut-off holder");

        assert_eq!(LeaveReply::parse(&Int(2)), Some(LeaveReply::HandedOver));
        assert_eq!(LeaveReply::parse(&Int(3)), None);
        assert_eq!(
            MasterAcquireReply::parse(&arr(&[Int(0), Int(40)])),
            Some(MasterAcquireReply::Held {
                ttl: Some(Duration::from_millis(40))
            })
        );
        assert_eq!(MasterAcquireReply::parse(&Int(0)), None);
        assert_eq!(MasterManyReply::parse(&Int(1)), Some(MasterManyReply::Ours));
        assert_eq!(
            MasterManyReply::parse(&arr(&[Int(0), Int(2), Int(-1)])),
            Some(MasterManyReply::Held { name: 1, ttl: None })
        );
        assert_eq!(
            MasterManyReply::parse(&arr(&[Int(0), Int(0), Int(5)])),
            None
        );
        assert_eq!(MasterManyReply::parse(&arr(&[Int(1)])), None);
        assert_eq!(FencedWrite::parse(&Int(0)), Some(FencedWrite::Stale));
        assert_eq!(FencedWrite::parse(&bulk("1")), None);
    }
}
