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
fn ttls_become_whole_milliseconds() {
    assert_eq!(ttl_ms(Duration::from_secs(30)), 30_000);
    assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
    // Rounded up: the server must not end the session before the lease does.
    assert_eq!(ttl_ms(Duration::from_micros(1_500_100)), 1501);
}
