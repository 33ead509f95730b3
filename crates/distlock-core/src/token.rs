//! Lock tokens: the unguessable value that identifies one acquisition.

use std::cell::Cell;
use std::fmt;

use crate::error::{ErrorKind, LockError};

mod compact;
pub use compact::CompactToken;

/// Longest token accepted from outside (a token written by another client or given on a command
/// line).
pub const MAX_TOKEN_LEN: usize = 256;

/// The value stored under the lock key for one acquisition: 128 random bits from the OS-seeded
/// CSPRNG, as 32 lowercase hex characters.
///
/// Release and extend compare it with the stored value, so a holder can never delete or renew a
/// lock that is not its own. A retried acquire reuses it, which makes the retry idempotent.
#[derive(Clone)]
pub struct Token(Repr);

/// A generated token's 32 hex digits are kept inline (no allocation: a client holding 100,000
/// locks holds as many tokens); a token read from elsewhere may be any length.
#[derive(Clone)]
enum Repr {
    Hex([u8; 32]),
    Other(Box<str>),
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Token {}

impl std::hash::Hash for Token {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

thread_local! {
    /// The process in which this thread's random generator was last seeded from the OS.
    static SEEDED_IN: Cell<u32> = const { Cell::new(0) };
}

/// 128 random bits that no other process draws too.
///
/// rand's thread generator is not seeded again by `fork()`: without the check below, the
/// children of one parent (gunicorn's and Celery's prefork workers, `multiprocessing`) would
/// draw the same tokens, and one child's acquire would be taken as a resend of another's (the
/// same token), giving one lock to both. A thread seeds its generator again from the OS the
/// first time it draws in a process (a `getpid` per token: tens of nanoseconds).
fn fresh_bits() -> u128 {
    let pid = std::process::id();
    SEEDED_IN.with(|seeded| {
        if seeded.get() != pid {
            // On failure (no OS entropy) the generator goes on from its state; the token's
            // pid mix below still keeps two processes' tokens apart.
            let _ = rand::rng().reseed();
            seeded.set(pid);
        }
    });
    rand::random::<u128>() ^ u128::from(pid)
}

impl Token {
    /// A fresh random token, unique to this process even after a `fork()`.
    pub fn generate() -> Self {
        Token(Repr::Hex(hex128(fresh_bits())))
    }

    /// A token read from elsewhere (another process, a command line).
    ///
    /// # Errors
    /// `Config` when it is empty, longer than [`MAX_TOKEN_LEN`], not printable ASCII, or starts
    /// with `~` (which marks a tagged holder value).
    pub fn parse(s: &str) -> Result<Self, LockError> {
        // A leading `~` marks a tagged holder value (`~r token …`, `recipes::untag_value`): a
        // token that began with one would be read back as another token, or another kind.
        if s.starts_with('~') {
            return Err(LockError::new(
                ErrorKind::Config,
                "a token must not start with '~' (it marks a tagged holder value)",
            ));
        }
        Self::stored(s)
    }

    /// A token read back from an engine's store, to act as its holder there (to break a
    /// lock): as [`parse`](Self::parse), but one that starts with `~` is taken too (another
    /// program may have written it; distlock never gives one out).
    ///
    /// # Errors
    /// `Config` when it is empty, longer than [`MAX_TOKEN_LEN`] or not printable ASCII.
    pub fn stored(s: &str) -> Result<Self, LockError> {
        if s.is_empty() || s.len() > MAX_TOKEN_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LockError::new(
                ErrorKind::Config,
                "a token must be 1 to 256 printable ASCII characters",
            ));
        }
        Ok(Token(Repr::Other(s.into())))
    }

    /// A copy of a token met as a string (a request's), which a map keeps: inline when it is
    /// a generated one (32 lower-case hex digits), so that keeping it allocates nothing.
    pub(crate) fn kept(s: &str) -> Self {
        match <[u8; 32]>::try_from(s.as_bytes()) {
            Ok(b) if b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) => {
                Token(Repr::Hex(b))
            }
            _ => Token(Repr::Other(s.into())),
        }
    }

    /// The token as stored by the engine.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Written by `hex128` only: ASCII hex digits.
            Repr::Hex(b) => std::str::from_utf8(b).unwrap_or_default(),
            Repr::Other(s) => s,
        }
    }
}

/// A map keyed by tokens is looked up with a request's `&str` (hashed and compared as the
/// string, like the token itself).
impl std::borrow::Borrow<str> for Token {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Token {
    // Tokens are capabilities: show only a prefix in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.as_str();
        write!(f, "Token({}…)", &s[..s.len().min(8)])
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Now, in milliseconds since the Unix epoch (0 for a clock set before 1970): the `since` of a
/// holder value.
pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// `bits` as 32 lower-case hex digits, written by hand: `format!` costs several times as much,
/// and a token is made for every acquisition.
fn hex128(bits: u128) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // A byte at a time (a shift of a `u128` by a varying amount costs several instructions,
    // and a lease's token is spelled out at each of its renewals).
    let mut out = [0u8; 32];
    for (pair, byte) in out.chunks_exact_mut(2).zip(bits.to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    out
}

/// The value engines store for a holder: `<token> <since, unix ms> <owner label>` (tokens and
/// the time never contain spaces; the label may). The one codec of it: every engine writes and
/// reads holders through this type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderValue<'a> {
    /// The holder's token.
    pub token: &'a str,
    /// When it took the lock, in ms since the Unix epoch; `None` when another tool wrote the
    /// value.
    pub since_ms: Option<u64>,
    /// The holder's label; `None` when another tool wrote the value.
    pub owner: Option<&'a str>,
}

impl<'a> HolderValue<'a> {
    /// The value for `token` held by `owner` from now (the wall clock, shown to people; never
    /// used for deadlines).
    pub fn now(token: &'a str, owner: &'a str) -> Self {
        HolderValue {
            token,
            since_ms: Some(u64::try_from(unix_ms()).unwrap_or(u64::MAX)),
            owner: Some(owner),
        }
    }

    /// The value as stored (written by hand: `format!` costs several times as much, and a value
    /// is made for every acquisition).
    pub fn encode(&self) -> String {
        let mut digits = itoa::Buffer::new();
        let since = digits.format(self.since_ms.unwrap_or(0));
        let owner = self.owner.unwrap_or_default();
        let mut v = String::with_capacity(self.token.len() + since.len() + owner.len() + 2);
        v.push_str(self.token);
        v.push(' ');
        v.push_str(since);
        v.push(' ');
        v.push_str(owner);
        v
    }

    /// The same holder labelled `owner` (an election's leader publishing a new value): its
    /// token and its start stay; a value another tool wrote gets its start from now.
    pub fn relabelled(&self, owner: &'a str) -> Self {
        HolderValue {
            token: self.token,
            since_ms: self
                .since_ms
                .or_else(|| Some(u64::try_from(unix_ms()).unwrap_or(u64::MAX))),
            owner: Some(owner),
        }
    }

    /// Reads a stored value: the token is everything up to the first space (all of it for a
    /// plain token written by another tool).
    pub fn parse(value: &'a str) -> Self {
        let mut parts = value.splitn(3, ' ');
        let token = parts.next().unwrap_or_default();
        match (parts.next().and_then(|s| s.parse().ok()), parts.next()) {
            (Some(since), Some(owner)) => HolderValue {
                token,
                since_ms: Some(since),
                owner: Some(owner),
            },
            _ => HolderValue {
                token,
                since_ms: None,
                owner: None,
            },
        }
    }

    /// The holder as `status` shows it: `owner since <ms>`, or `(not a distlock client)`.
    pub fn label(&self) -> String {
        match (self.owner, self.since_ms) {
            (Some(owner), Some(since)) => format!("{owner} since {since}"),
            _ => "(not a distlock client)".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_holder_values_read_as_formatted() {
        for bits in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            assert_eq!(
                std::str::from_utf8(&hex128(bits)).unwrap(),
                format!("{bits:032x}")
            );
        }
        let v = HolderValue {
            token: "t0k",
            since_ms: Some(1_700_000_000_123),
            owner: Some("host/42 job"),
        };
        let text = v.encode();
        assert_eq!(text, "t0k 1700000000123 host/42 job");
        assert_eq!(HolderValue::parse(&text), v);
        assert_eq!(v.label(), "host/42 job since 1700000000123");
        let foreign = HolderValue::parse("plain-token");
        assert_eq!(foreign.token, "plain-token");
        assert_eq!(foreign.label(), "(not a distlock client)");
    }

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = Token::generate();
        let b = Token::generate();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(Token::parse("").is_err());
        assert!(Token::parse("has space").is_err());
        assert!(Token::parse(&"x".repeat(257)).is_err());
        // A leading `~` would read back as a tagged holder value.
        assert!(Token::parse("~r").is_err());
        assert!(Token::parse("~abc").is_err());
        assert!(Token::parse("a~b").is_ok());
        // Read back from a store (another program's holder), it is taken as it is.
        assert_eq!(
            Token::stored("~abc").map(|t| t.to_string()).ok().as_deref(),
            Some("~abc")
        );
        assert!(Token::stored("").is_err());
        assert!(Token::stored("has space").is_err());
        assert_eq!(
            Token::parse("abc").map(|t| t.to_string()).ok().as_deref(),
            Some("abc")
        );
    }

    /// A kept copy is the same token, inline for a generated one only (upper-case digits, or
    /// another length, are kept as written).
    #[test]
    fn a_kept_copy_is_inline_only_for_a_generated_token() {
        let a = Token::generate();
        let kept = Token::kept(a.as_str());
        assert_eq!(kept, a);
        assert!(matches!(kept.0, Repr::Hex(_)));
        for other in ["ABCDEF0123456789ABCDEF0123456789", "abc", ""] {
            let kept = Token::kept(other);
            assert_eq!(kept.as_str(), other);
            assert!(matches!(kept.0, Repr::Other(_)), "{other}");
        }
        let map: std::collections::HashSet<Token> = [a.clone()].into();
        assert!(map.contains(a.as_str()));
    }
}
