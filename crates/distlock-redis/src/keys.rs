//! How lock names map to Redis keys.

/// Naming of the keys behind one lock name.
///
/// With the defaults, the lock `orders` uses:
/// - `distlock:{orders}`: the lock itself, a plain string `<token> <since ms> <owner>` with a
///   TTL;
/// - `distlock:{orders}:fence`: the fence counter, never expires: a sorted set with one member,
///   `f`, whose score is the last fence given (a sorted set for `ZADD GT`, which raises it to a
///   floor in one plain command; see `scripts/fence.lua`);
/// - `distlock:{orders}:meta`: a hash with the token and fence of the last holder that took the
///   lock through the waiting path, for `status` (and, from releases before the fence key, a
///   `fence` field no longer used);
/// - `distlock:{orders}:waiters`: the queue of waiting clients, a list of their registrations
///   (what a release writes when it hands the lock to one of them), gone when empty;
/// - the channel `distlock:wake:<client id>`: one per client, where a release tells it that it
///   was handed the lock (or to try again).
///
/// The `{…}` hash tag keeps the keys in one Cluster slot. A name that already carries a hash tag
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
        self.push_lock_key(&mut k, name);
        k
    }

    fn push_lock_key(&self, k: &mut String, name: &str) {
        k.push_str(&self.prefix);
        if self.hash_tag && !has_hash_tag(name) {
            k.push('{');
            k.push_str(name);
            k.push('}');
        } else {
            k.push_str(name);
        }
    }

    /// The channel prefix a client's wake-ups go to: `<prefix>wake:<client id>`.
    /// Refuses a prefix with a space or a control character: queue registrations and wake-up
    /// messages are space-separated, and the prefix starts every channel name in them.
    pub(crate) fn check(&self) -> Result<(), distlock_core::LockError> {
        if self
            .prefix
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(distlock_core::LockError::new(
                distlock_core::ErrorKind::Config,
                format!(
                    "the key prefix {:?} contains a space or a control character",
                    self.prefix
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn wake_prefix(&self) -> String {
        format!("{}wake:", self.prefix)
    }

    /// The lock key and the keys derived from it, in one allocation (the hot paths build them
    /// for every request).
    pub(crate) fn keys(&self, name: &str) -> LockKeys {
        let mut buf = String::with_capacity(self.keys_len(name));
        self.push_lock_key(&mut buf, name);
        LockKeys::derive(buf)
    }

    /// The bytes `name`'s keys take, end to end (the lock key four times over, and the suffixes).
    fn keys_len(&self, name: &str) -> usize {
        4 * (self.prefix.len() + name.len() + 2) + SUFFIX_LEN
    }

    /// [`keys`](Self::keys), built in this thread's scratch buffer, for `f`: a request that
    /// copies its keys into its command before its first await (the uncontended acquire and
    /// release) then allocates nothing for them. A call inside `f` gets a buffer of its own.
    pub(crate) fn with_keys<R>(&self, name: &str, f: impl FnOnce(&LockKeys) -> R) -> R {
        let mut buf = SCRATCH.take();
        buf.clear();
        buf.reserve(self.keys_len(name));
        self.push_lock_key(&mut buf, name);
        let keys = LockKeys::derive(buf);
        let out = f(&keys);
        // A buffer grown by a huge name is not kept.
        if keys.buf.capacity() <= SCRATCH_KEPT {
            SCRATCH.set(keys.buf);
        }
        out
    }

    pub(crate) fn meta_key(lock_key: &str) -> String {
        format!("{lock_key}:meta")
    }

    pub(crate) fn fence_key(lock_key: &str) -> String {
        format!("{lock_key}:fence")
    }
}

thread_local! {
    /// The scratch buffer of [`KeyLayout::with_keys`].
    static SCRATCH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// The most capacity the scratch buffer keeps between calls.
const SCRATCH_KEPT: usize = 4096;

const SUFFIXES: [&str; 3] = [":meta", ":waiters", ":fence"];
const SUFFIX_LEN: usize = 5 + 8 + 6;

/// The keys of one lock: see [`KeyLayout`].
pub(crate) struct LockKeys {
    buf: String,
    ends: [usize; 4],
}

impl LockKeys {
    /// The keys derived from a lock key (`buf` holds exactly the lock key).
    pub(crate) fn derive(mut buf: String) -> Self {
        let lock_len = buf.len();
        buf.reserve(3 * lock_len + SUFFIX_LEN);
        let mut ends = [lock_len, 0, 0, 0];
        for (i, suffix) in SUFFIXES.iter().enumerate() {
            buf.extend_from_within(..lock_len);
            buf.push_str(suffix);
            ends[i + 1] = buf.len();
        }
        LockKeys { buf, ends }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }
    pub(crate) fn lock(&self) -> &str {
        self.part(0)
    }
    pub(crate) fn meta(&self) -> &str {
        self.part(1)
    }
    pub(crate) fn waiters(&self) -> &str {
        self.part(2)
    }
    pub(crate) fn fence(&self) -> &str {
        self.part(3)
    }
}

/// The part of `key` that Redis Cluster hashes to choose its slot: the first non-empty `{…}`,
/// or the whole key. Keys with the same part are in the same slot.
pub(crate) fn hashed_part(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(close) = key[open + 1..].find('}')
        && close > 0
    {
        return &key[open + 1..open + 1 + close];
    }
    key
}

/// Whether Redis Cluster would hash only part of `name` (a non-empty `{…}`).
fn has_hash_tag(name: &str) -> bool {
    match name.find('{') {
        Some(open) => name[open + 1..].find('}').is_some_and(|close| close > 0),
        None => false,
    }
}

/// Where releases tell this client that a lock is its turn.
///
/// On one server (or Sentinel's master) it is one channel per client, `<prefix>wake:<id>`,
/// shared by all its locks. On a Cluster, where a classic `PUBLISH` goes to every node and its
/// count covers only the publishing node's listeners, it is one sharded channel per lock,
/// `<lock key>:wake:<id>`, in the lock's slot: registrations name it behind the byte 0x01, which
/// tells the scripts to `SPUBLISH` (see `tell` in `scripts/lib.lua`).
#[derive(Clone, Debug)]
pub(crate) struct WakeChannel {
    /// `<prefix>wake:<id>`.
    base: std::sync::Arc<str>,
    id: std::sync::Arc<str>,
    sharded: bool,
}

/// Marks a sharded channel in a registration.
const SHARDED: char = '\u{1}';

impl WakeChannel {
    pub(crate) fn new(layout: &KeyLayout, id: &str, sharded: bool) -> Self {
        WakeChannel {
            base: format!("{}{id}", layout.wake_prefix()).into(),
            id: id.into(),
            sharded,
        }
    }

    pub(crate) fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// The per-client channel (not used on a Cluster).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The channel a registration for `lock_key` names (what scripts tell).
    pub(crate) fn for_lock<'a>(&'a self, lock_key: &str) -> std::borrow::Cow<'a, str> {
        if self.sharded {
            std::borrow::Cow::Owned(format!("{SHARDED}{}", self.sharded_channel(lock_key)))
        } else {
            std::borrow::Cow::Borrowed(&self.base)
        }
    }

    /// On a Cluster, the sharded channel to subscribe to for `lock_key`.
    pub(crate) fn sharded_channel(&self, lock_key: &str) -> String {
        format!("{lock_key}:wake:{}", self.id)
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
        let k = l.keys("orders");
        assert_eq!(
            [k.lock(), k.meta(), k.waiters(), k.fence()],
            [
                "distlock:{orders}",
                "distlock:{orders}:meta",
                "distlock:{orders}:waiters",
                "distlock:{orders}:fence",
            ]
        );
        assert_eq!(l.wake_prefix(), "distlock:wake:");
        assert_eq!(l.lock_key("user:{42}:cart"), "distlock:user:{42}:cart");
        assert_eq!(l.lock_key("odd{}name"), "distlock:{odd{}name}");
        let plain = KeyLayout {
            prefix: String::new(),
            hash_tag: false,
        };
        assert_eq!(plain.lock_key("k"), "k");
    }

    #[test]
    fn scratch_keys_are_the_keys_and_a_nested_call_gets_its_own() {
        let l = KeyLayout::default();
        let all = |k: &LockKeys| [k.lock(), k.meta(), k.waiters(), k.fence()].map(str::to_owned);
        for name in ["orders", "a-much-longer-name-than-the-first", "x"] {
            let outer = l.with_keys(name, |k| {
                let inner = l.with_keys("other", all);
                assert_eq!(inner, all(&l.keys("other")));
                all(k)
            });
            assert_eq!(outer, all(&l.keys(name)), "{name}");
        }
        // The buffer is kept between calls, and one grown past the limit is not.
        let kept = || {
            SCRATCH.with(|s| {
                let b = s.take();
                let c = b.capacity();
                s.set(b);
                c
            })
        };
        assert!(kept() > 0);
        l.with_keys(&"n".repeat(SCRATCH_KEPT), |k| {
            assert!(k.fence().ends_with(":fence"))
        });
        assert!(kept() <= SCRATCH_KEPT);
    }
}
