//! A server name as the pool keeps it (twice a lease: in its record and in its session's set of
//! names): inline up to [`INLINE`] bytes, shared above.
//!
//! A PostgreSQL advisory lock's name is its 64-bit id in decimal (20 characters at most, 22 with
//! the prefix of a shared hold), a MySQL named lock's `dl:` and the lock's name: short names
//! need no allocation of their own beside the pointer an `Arc<str>` would take.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The longest name kept inline.
pub(super) const INLINE: usize = 22;

/// A server name: 24 bytes, and no allocation up to [`INLINE`] bytes.
#[derive(Clone)]
pub(super) enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl Key {
    pub(super) fn new(s: &str) -> Self {
        match u8::try_from(s.len()) {
            Ok(len) if s.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..s.len()].copy_from_slice(s.as_bytes());
                Key::Inline { len, bytes }
            }
            _ => Key::Shared(Arc::from(s)),
        }
    }

    pub(super) fn as_str(&self) -> &str {
        match self {
            // Copied whole from a `str` of that length: valid UTF-8.
            Key::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Key::Shared(s) => s,
        }
    }
}

impl std::ops::Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Key {}

/// As the `str` hashes: a map of keys is looked up by `&str` ([`Borrow`]).
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn short_names_are_inline_long_ones_shared_and_both_read_back() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
        let id = "s:-9223372036854775808";
        assert_eq!(id.len(), INLINE);
        let long = "dl:a-lock-name-longer-than-the-inline-room";
        for s in ["", "42", id, long, "é-ü"] {
            let k = Key::new(s);
            assert_eq!(k.as_str(), s);
            assert_eq!(k.is_empty(), s.is_empty());
            assert_eq!(matches!(k, Key::Inline { .. }), s.len() <= INLINE);
        }
        // Looked up by `&str` in a map of keys, as the pool does.
        let mut m: HashMap<Key, u8, foldhash::fast::RandomState> = HashMap::default();
        m.insert(Key::new(id), 1);
        m.insert(Key::new(long), 2);
        assert_eq!(m.get(id), Some(&1));
        assert_eq!(m.get(long), Some(&2));
        assert_eq!(m.get("s:-922337203685477580"), None);
        assert_eq!(Key::new(long), Key::new(long).clone());
    }
}
