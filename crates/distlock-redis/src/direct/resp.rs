//! The RESP2 replies the direct connection reads: framed here (one reply, or "more bytes
//! needed"), and built as redis-rs [`Value`]s, server errors through redis-rs's own parser. A
//! reply deeper, longer or larger than any lock reply is a protocol error, never a deep
//! recursion, a large allocation or a buffer that grows while the server keeps sending.

use redis::{RedisError, Value};

/// Deeper nesting than any of our replies has is a protocol error, not recursion.
const MAX_DEPTH: usize = 8;
/// Our replies are small; a larger bulk is a protocol error, not an allocation.
const MAX_LEN: usize = 16 << 20;
/// The most values in one reply, counted through its nested arrays. The largest lock reply is
/// a status (`status.lua`): four values a holder, and a read lock's readers have no bound of
/// their own, so this admits 124,999 of them (a client holds 100,000 locks; a semaphore's
/// permits stop at 10,000); a batch of renewals answers 1,024 leases. A longer array is
/// refused before its values are built (and before it is framed again as each read adds to
/// it): its `Value`s take at most about 28 MB.
const MAX_VALUES: usize = 500_000;
/// The most bytes one reply may take: a bulk of [`MAX_LEN`] and a little more. A server that
/// has sent more without completing a reply is not answering a lock request.
const MAX_REPLY: usize = MAX_LEN + 4096;

fn parse_err(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, what))
}

/// One complete RESP2 reply at the start of `buf` and its length, or `None` if more bytes are
/// needed.
pub(super) fn frame(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, RedisError> {
    let mut values = MAX_VALUES;
    match frame_counted(buf, depth, &mut values)? {
        None if buf.len() > MAX_REPLY => Err(parse_err("a reply larger than any lock reply")),
        framed => Ok(framed),
    }
}

/// [`frame`], with `values` the number of values the reply may still have.
fn frame_counted(
    buf: &[u8],
    depth: usize,
    values: &mut usize,
) -> Result<Option<(Value, usize)>, RedisError> {
    *values = values
        .checked_sub(1)
        .ok_or_else(|| parse_err("a reply with more values than any lock reply"))?;
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = buf[..end].split_first() else {
        return Err(parse_err("an empty reply line"));
    };
    let after = end + 2;
    let number = || -> Result<i64, RedisError> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| parse_err("a malformed number in a reply"))
    };
    match kind {
        b'+' if line == b"OK" => Ok(Some((Value::Okay, after))),
        b'+' => Ok(Some((
            Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
            after,
        ))),
        b'-' => {
            // redis-rs builds its server errors (code, kind) from the line itself.
            let value = redis::parse_redis_value(&buf[..after])?;
            Ok(Some((value, after)))
        }
        b':' => Ok(Some((Value::Int(number()?), after))),
        b'$' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let len = usize::try_from(len).map_err(|_| parse_err("a bulk length"))?;
            if len > MAX_LEN {
                return Err(parse_err("a bulk reply larger than any lock reply"));
            }
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            if &buf[after + len..after + len + 2] != b"\r\n" {
                return Err(parse_err("a bulk reply without its terminator"));
            }
            Ok(Some((
                Value::BulkString(buf[after..after + len].to_vec()),
                after + len + 2,
            )))
        }
        b'*' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            if depth >= MAX_DEPTH || len as u64 > *values as u64 {
                return Err(parse_err(
                    "an array reply deeper or longer than any lock reply",
                ));
            }
            let mut items = Vec::with_capacity((len as usize).min(64));
            let mut at = after;
            for _ in 0..len {
                match frame_counted(&buf[at..], depth + 1, values)? {
                    Some((v, used)) => {
                        items.push(v);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(items), at)))
        }
        _ => Err(parse_err("a reply of a type RESP2 does not have")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Value {
        let (v, used) = frame(bytes, 0).unwrap().unwrap();
        assert_eq!(used, bytes.len(), "{bytes:?}");
        v
    }

    #[test]
    fn replies_are_framed_as_redis_rs_parses_them() {
        for bytes in [
            &b"+OK\r\n"[..],
            b"+QUEUED\r\n",
            b":-42\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n:0\r\n$-1\r\n",
            b"-NOSCRIPT No matching script.\r\n",
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        ] {
            assert_eq!(
                one(bytes),
                redis::parse_redis_value(bytes).unwrap(),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn a_partial_reply_asks_for_more_at_every_cut() {
        let bytes = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n:0\r\n$-1\r\n";
        for cut in 0..bytes.len() {
            assert!(frame(&bytes[..cut], 0).unwrap().is_none(), "cut at {cut}");
        }
        // Two replies back to back: the first is framed alone.
        let (v, used) = frame(b":7\r\n+OK\r\n", 0).unwrap().unwrap();
        assert_eq!((v, used), (Value::Int(7), 4));
    }

    #[test]
    fn junk_is_a_parse_error_not_a_panic() {
        for bytes in [
            &b"?what\r\n"[..],
            b"\r\n",
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"*500001\r\n",
        ] {
            let e = frame(bytes, 0).unwrap_err();
            assert_eq!(e.kind(), redis::ErrorKind::Parse, "{bytes:?}");
        }
    }

    #[test]
    fn values_are_counted_through_nesting_and_bytes_capped() {
        // 2,000 arrays of 250 integers: 502,001 values, each array short enough alone.
        let mut bytes = b"*2000\r\n".to_vec();
        for _ in 0..2000 {
            bytes.extend_from_slice(b"*250\r\n");
            bytes.extend_from_slice(&b":1\r\n".repeat(250));
        }
        assert!(frame(&bytes, 0).is_err());
        // A status of 100,000 readers (four values each, and three more) is one of ours.
        let mut bytes = b"*400003\r\n".to_vec();
        bytes.extend_from_slice(&b":1\r\n".repeat(400_003));
        assert!(frame(&bytes, 0).unwrap().is_some());
        // More bytes than any reply, still incomplete: refused, not waited for.
        let mut bytes = b"*2\r\n$16000000\r\n".to_vec();
        bytes.resize(bytes.len() + 16_000_000, b'x');
        bytes.extend_from_slice(b"\r\n$16000000\r\n");
        bytes.resize(MAX_REPLY + 1, b'x');
        assert!(frame(&bytes[..MAX_REPLY], 0).unwrap().is_none());
        assert!(frame(&bytes, 0).is_err());
    }
}
