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
/// form).
fn bits_of(s: &str) -> Option<[u8; 16]> {
    let digits: &[u8; 32] = s.as_bytes().try_into().ok()?;
    let mut bits = [0u8; 16];
    for (byte, pair) in bits.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(bits)
}

fn digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

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
}
