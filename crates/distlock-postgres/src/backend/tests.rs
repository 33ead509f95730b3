use super::*;

#[test]
fn lock_ids_are_stable() {
    // The first 8 bytes of SHA-256("orders"): the same in every version and language.
    assert_eq!(lock_id("orders"), lock_id("orders"));
    assert_ne!(lock_id("orders"), lock_id("orders2"));
    let digest = Sha256::digest(b"orders");
    assert_eq!(lock_id("orders").to_be_bytes(), digest[..8]);
}

#[test]
fn holder_labels_read_back() {
    assert_eq!(
        parse_label("distlock 42 30000 vm/123"),
        Some((Some(42), 30_000, "vm/123".to_owned()))
    );
    assert_eq!(
        parse_label("distlock - 30000 vm/123"),
        Some((None, 30_000, "vm/123".to_owned()))
    );
    assert_eq!(
        parse_label("distlock 42 30000"),
        Some((Some(42), 30_000, String::new()))
    );
    assert_eq!(parse_label("psql"), None);
    assert_eq!(parse_label("distlock x 1 a"), None);
}

#[test]
fn ttls_become_whole_milliseconds() {
    assert_eq!(ttl_ms(Duration::from_secs(30)), 30_000);
    assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
    // Rounded up: the server must not end the session before the lease does.
    assert_eq!(ttl_ms(Duration::from_micros(1_500_100)), 1501);
}
