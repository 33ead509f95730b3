//! A reply's first line (`HD c123 t30`, `VA 42 c7`, `NF`, an error line), read into its parts,
//! and a value's bytes checked against the size the line gave. Pure functions of the bytes the
//! server sent: a line or value no meta-protocol server sends is a `Protocol` error, never a
//! panic or an allocation of the size the server names.

use distlock_core::{ErrorKind, LockError};

/// The longest first line of a reply the engine reads: ours are a code and a few flags; a
/// server that sends more without ending the line is not one.
pub(crate) const MAX_LINE: usize = 4096;

/// The largest value the engine ever reads back (a holder label); a bigger one is not ours.
pub(crate) const MAX_VALUE: usize = 64 * 1024;

/// A reply's first line, read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Head {
    /// Its two-letter code (`HD`, `NS`, `EX`, `NF`, `EN`, `VA`).
    pub(crate) code: &'static str,
    /// For `VA`, the size of the value that follows the line.
    pub(crate) size: Option<usize>,
    /// The item's CAS (`c`), when given.
    pub(crate) cas: Option<u64>,
    /// The item's seconds left (`t`), when given.
    pub(crate) ttl: Option<i64>,
}

/// Reads a reply's first line, `line` (with or without its line end) answering `request`
/// (the request's first line, for the error messages).
///
/// # Errors
/// `Protocol` for an error line (the server refused the request) and for a line no
/// meta-protocol server sends.
pub(crate) fn parse_head(line: &[u8], request: &str) -> Result<Head, LockError> {
    let text = line.trim_ascii_end();
    let mut words = text.split(|&b| b == b' ');
    let code = match words.next().unwrap_or_default() {
        b"HD" => "HD",
        b"NS" => "NS",
        b"EX" => "EX",
        b"NF" => "NF",
        b"EN" => "EN",
        b"VA" => "VA",
        b"CLIENT_ERROR" | b"SERVER_ERROR" | b"ERROR" => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!(
                    "memcached refused {request:?}: {}",
                    String::from_utf8_lossy(shown(text))
                ),
            ));
        }
        _ => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!(
                    "memcached answered {:?} to {request:?} (not a meta-protocol server?)",
                    String::from_utf8_lossy(shown(text)),
                ),
            ));
        }
    };
    let bad = |what: &str| {
        LockError::new(
            ErrorKind::Protocol,
            format!(
                "memcached answered {:?}: {what}",
                String::from_utf8_lossy(shown(text))
            ),
        )
    };
    let size = if code == "VA" {
        let size = words
            .next()
            .and_then(number::<usize>)
            .filter(|&s| s <= MAX_VALUE)
            .ok_or_else(|| bad("a bad value size"))?;
        Some(size)
    } else {
        None
    };
    let (mut cas, mut ttl) = (None, None);
    for w in words {
        match w.split_first() {
            Some((b'c', n)) => cas = Some(number(n).ok_or_else(|| bad("a bad CAS"))?),
            Some((b't', n)) => ttl = Some(number(n).ok_or_else(|| bad("a bad TTL"))?),
            _ => {}
        }
    }
    Ok(Head {
        code,
        size,
        cas,
        ttl,
    })
}

/// A value as read after a `VA` line: `size` bytes and the line end. Returns the value.
///
/// # Errors
/// `Protocol` when the value does not end with `\r\n` where the size says.
pub(crate) fn value_of(mut read: Vec<u8>, size: usize) -> Result<Vec<u8>, LockError> {
    if read.len() != size + 2 || !read.ends_with(b"\r\n") {
        return Err(LockError::new(
            ErrorKind::Protocol,
            format!("memcached sent a value of {size} bytes without its line end"),
        ));
    }
    read.truncate(size);
    Ok(read)
}

/// At most the first 200 bytes of a line, for an error message.
fn shown(text: &[u8]) -> &[u8] {
    &text[..text.len().min(200)]
}

/// A decimal number in a reply (`-1` for a TTL that never runs out).
fn number<T: std::str::FromStr>(digits: &[u8]) -> Option<T> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_into_their_parts() {
        let h = parse_head(b"VA 5 c42 t-1\r\n", "mg k").unwrap();
        assert_eq!(
            h,
            Head {
                code: "VA",
                size: Some(5),
                cas: Some(42),
                ttl: Some(-1)
            }
        );
        assert_eq!(parse_head(b"HD\r\n", "ms k").unwrap().code, "HD");
        assert_eq!(value_of(b"hello\r\n".to_vec(), 5).unwrap(), b"hello");
    }

    #[test]
    fn junk_is_a_protocol_error() {
        for line in [
            &b"\r\n"[..],
            b"VA\r\n",
            b"VA 10000000000000\r\n",
            b"VA -1\r\n",
            b"HD cx\r\n",
            b"HD t99999999999999999999\r\n",
            b"SERVER_ERROR out of memory\r\n",
            b"+OK\r\n",
        ] {
            let e = parse_head(line, "mg k").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Protocol, "{line:?}");
        }
        assert!(value_of(b"hellox\n".to_vec(), 5).is_err());
    }
}
