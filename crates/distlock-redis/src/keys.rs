//! How lock names map to Redis keys.

/// Naming of the keys behind one lock name.
///
/// With the defaults, the lock `orders` uses:
/// - `distlock:{orders}`: the lock itself, a plain string holding the token, with a TTL;
/// - `distlock:{orders}:meta`: a hash with the fence counter (never expires) and the holder's
///   label and fence, for `status`;
/// - `distlock:{orders}:released`: the channel release announces on (for waiters);
/// - `distlock:{orders}:waiters`, `…:alive`, `…:resv`: the queue of waiting clients, their
///   registration expiries, and the short reservation of the client a release woke (these
///   expire by themselves a few seconds after the last waiter).
///
/// The `{…}` hash tag keeps the three in one Cluster slot. A name that already carries a hash tag
/// is used as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    pub(crate) prefix: String,
    pub(crate) hash_tag: bool,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            prefix: "distlock:".into(),
            hash_tag: true,
        }
    }
}

impl KeyLayout {
    pub(crate) fn lock_key(&self, name: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + name.len() + 2);
        k.push_str(&self.prefix);
        if self.hash_tag && !has_hash_tag(name) {
            k.push('{');
            k.push_str(name);
            k.push('}');
        } else {
            k.push_str(name);
        }
        k
    }

    pub(crate) fn meta_key(lock_key: &str) -> String {
        format!("{lock_key}:meta")
    }

    pub(crate) fn release_channel(lock_key: &str) -> String {
        format!("{lock_key}:released")
    }

    /// The queue of waiting clients, the hash of their registration expiries, and the short
    /// reservation a release gives the client it wakes.
    pub(crate) fn queue_keys(lock_key: &str) -> [String; 3] {
        [
            format!("{lock_key}:waiters"),
            format!("{lock_key}:alive"),
            format!("{lock_key}:resv"),
        ]
    }
}

/// Whether Redis Cluster would hash only part of `name` (a non-empty `{…}`).
fn has_hash_tag(name: &str) -> bool {
    match name.find('{') {
        Some(open) => name[open + 1..].find('}').is_some_and(|close| close > 0),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let l = KeyLayout::default();
        assert_eq!(l.lock_key("orders"), "distlock:{orders}");
        assert_eq!(
            KeyLayout::meta_key(&l.lock_key("orders")),
            "distlock:{orders}:meta"
        );
        assert_eq!(
            KeyLayout::release_channel(&l.lock_key("orders")),
            "distlock:{orders}:released"
        );
        assert_eq!(l.lock_key("user:{42}:cart"), "distlock:user:{42}:cart");
        assert_eq!(l.lock_key("odd{}name"), "distlock:{odd{}name}");
        let plain = KeyLayout {
            prefix: String::new(),
            hash_tag: false,
        };
        assert_eq!(plain.lock_key("k"), "k");
    }
}
