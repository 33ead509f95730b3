//! A token as a map of this client's leases keeps it, beside a lease that has the token
//! already: 24 bytes where a [`Token`] takes 40 (a client holding 100,000 locks keeps one in
//! each engine map of its leases).

use std::fmt;

use super::{Repr, Token, hex128};

/// A generated token's 128 bits, or any other token's string. A token has one form only (32
/// lower-case hex digits are always kept as their bits), so two compact tokens are equal
/// exactly when their strings are, and a map looks one up by [`CompactToken::of`] a request's
/// string (no allocation for a generated token).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CompactToken(Form);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Form {
    Bits([u8; 16]),
    Other(Box<str>),
}

impl CompactToken {
    /// The compact form of the token written `s`.
    pub fn of(s: &str) -> Self {
        match bits_of(s) {
            Some(bits) => CompactToken(Form::Bits(bits)),
            None => CompactToken(Form::Other(s.into())),
        }
    }

    /// Whether this is the token written `s` (compared without allocating).
    pub fn matches(&self, s: &str) -> bool {
        match (&self.0, bits_of(s)) {
            (Form::Bits(bits), Some(other)) => *bits == other,
            (Form::Other(own), None) => **own == *s,
            _ => false,
        }
    }

    /// The token again.
    pub fn to_token(&self) -> Token {
        match &self.0 {
            Form::Bits(bits) => Token(Repr::Hex(hex128(u128::from_be_bytes(*bits)))),
            Form::Other(s) => Token(Repr::Other(s.clone())),
        }
    }
}

impl From<&Token> for CompactToken {
    fn from(token: &Token) -> Self {
        match &token.0 {
            Repr::Hex(_) => CompactToken::of(token.as_str()),
            Repr::Other(s) => CompactToken::of(s),
        }
    }
}

impl fmt::Debug for CompactToken {
    // A token is a capability: a prefix only, as `Token` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_token(), f)
    }
}

/// The 128 bits written as `s`, when `s` is 32 lower-case hex digits (a generated token's
/// form). Branch-free over the digits (a table lookup each): engines look a token up by its
/// string at every renewal of every lock (a client holding 100,000 locks at a TTL of 3 s renews
/// 100,000 a second).
fn bits_of(s: &str) -> Option<[u8; 16]> {
    let digits: &[u8; 32] = s.as_bytes().try_into().ok()?;
    let mut bits = [0u8; 16];
    // Any digit that is not one has a value with its high bits set: they collect in `bad`.
    let mut bad = 0u8;
    for (byte, pair) in bits.iter_mut().zip(digits.chunks_exact(2)) {
        let (hi, lo) = (DIGIT[usize::from(pair[0])], DIGIT[usize::from(pair[1])]);
        bad |= hi | lo;
        *byte = (hi << 4) | (lo & 0xf);
    }
    (bad & 0xf0 == 0).then_some(bits)
}

/// Each byte's value as a lower-case hex digit, or `NOT_A_DIGIT`.
const DIGIT: [u8; 256] = {
    let mut table = [NOT_A_DIGIT; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = match c as u8 {
            d @ b'0'..=b'9' => d - b'0',
            d @ b'a'..=b'f' => d - b'a' + 10,
            _ => NOT_A_DIGIT,
        };
        c += 1;
    }
    table
};
const NOT_A_DIGIT: u8 = 0xff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_token_is_the_same_token_in_24_bytes() {
        assert_eq!(std::mem::size_of::<CompactToken>(), 24);
        assert_eq!(std::mem::size_of::<Option<CompactToken>>(), 24);
        let a = Token::generate();
        let c = CompactToken::from(&a);
        assert!(matches!(c.0, Form::Bits(_)));
        assert!(c.matches(a.as_str()));
        assert_eq!(c.to_token(), a);
        assert_eq!(c, CompactToken::of(a.as_str()));
        assert!(!c.matches(Token::generate().as_str()));
        // Not a generated token's form: kept as written, and never equal to a generated one.
        for other in [
            "ABCDEF0123456789ABCDEF0123456789",
            "abc",
            "0123456789abcdef0123456789abcdeg",
        ] {
            let c = CompactToken::of(other);
            assert!(matches!(c.0, Form::Other(_)), "{other}");
            assert!(c.matches(other));
            assert_eq!(c.to_token().as_str(), other);
        }
        // Upper-case digits are another token than the lower-case ones.
        let upper = "ABCDEF0123456789ABCDEF0123456789";
        assert!(!CompactToken::of(upper).matches(&upper.to_ascii_lowercase()));
        assert_ne!(
            CompactToken::of(upper),
            CompactToken::of(&upper.to_ascii_lowercase())
        );
        let zero = "0".repeat(32);
        assert!(CompactToken::of(&zero).matches(&zero));
        assert!(!CompactToken::of(&zero).matches(&"0".repeat(31)));
        let parsed = Token::parse(a.as_str()).unwrap();
        assert_eq!(CompactToken::from(&parsed), c);
        let map: std::collections::HashSet<CompactToken> = [c.clone()].into();
        assert!(map.contains(&CompactToken::of(a.as_str())));
    }

    /// The table-driven parse against the plain one: every ASCII byte at every place of a
    /// generated token's digits, a character of two and of three bytes at every place, and
    /// other lengths.
    #[test]
    fn the_digits_parse_as_the_plain_rule_says() {
        fn plain(s: &str) -> Option<[u8; 16]> {
            if s.len() != 32 || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            let n = u128::from_str_radix(s, 16).ok()?;
            Some(n.to_be_bytes())
        }
        let base = Token::generate();
        let base = base.as_str().as_bytes();
        for place in 0..32 {
            for b in 0..=255u8 {
                let mut bytes = base.to_vec();
                bytes[place] = b;
                let Ok(s) = std::str::from_utf8(&bytes) else {
                    continue;
                };
                assert_eq!(bits_of(s), plain(s), "{s:?}");
            }
        }
        let base = std::str::from_utf8(base).unwrap();
        for place in 0..31 {
            for other in ["é", "€"] {
                // The same byte length as a token (32) or more.
                let s = format!("{}{other}{}", &base[..place], &base[place + 1..]);
                assert_eq!(bits_of(&s), None, "{s:?}");
                assert_eq!(plain(&s), None);
            }
        }
        for len in [0, 1, 31, 33, 64] {
            let s: String = base.chars().cycle().take(len).collect();
            assert_eq!(bits_of(&s), None, "{s:?}");
        }
        assert_eq!(bits_of("f".repeat(32).as_str()), Some([0xff; 16]));
    }
}
