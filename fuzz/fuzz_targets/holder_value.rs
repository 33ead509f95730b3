//! Holder values as engines read them back from a server (a Redis value or hash field, an
//! etcd or ZooKeeper node's value, a memcached item, a PostgreSQL or MySQL row), which any
//! client of that server could have written: the kind tag in front, the holder value (`<token>
//! <since ms> <owner>`), tokens and their compact form, and the lease kinds' tags. What
//! distlock writes must read back as written.
#![no_main]

use distlock_core::recipes::{CompactToken, HolderValue, tag_value, untag_value};
use distlock_core::{LeaseKind, Token};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    // Read as the engines read a stored value.
    let (kind, holder) = untag_value(text);
    let value = HolderValue::parse(holder);
    let _ = value.label();
    let _ = LeaseKind::from_tag(text);

    // A value distlock writes reads back as written, for every token distlock can write: a
    // value that starts with `~` reads as a tagged one, whatever wrote it, so `Token::parse`
    // refuses a token that starts with one (this target found the misreading).
    if value.token.starts_with('~') {
        assert!(Token::parse(value.token).is_err(), "{text:?}");
        return;
    }
    let written = tag_value(kind, value.encode());
    let (kind_again, holder_again) = untag_value(&written);
    assert_eq!(kind_again, kind);
    assert_eq!(HolderValue::parse(holder_again).token, value.token);
    if let (Some(owner), Some(_)) = (value.owner, value.since_ms) {
        let again = HolderValue::parse(holder_again);
        assert_eq!(again, value, "{written:?}");
        assert_eq!(again.owner, Some(owner));
    }

    // A token read from elsewhere, and the compact form a map keeps it in.
    if let Ok(token) = Token::parse(text) {
        let compact = CompactToken::from(&token);
        assert!(compact.matches(token.as_str()));
        assert_eq!(compact.to_token().as_str(), token.as_str());
        assert_eq!(CompactToken::of(text), compact);
    }
    let compact = CompactToken::of(text);
    assert!(compact.matches(text));
    assert_eq!(compact.to_token().as_str(), text);
});
