//! `distlock::client(url)`: options set before the engine is opened, checked first.

use std::time::Duration;

use distlock::ErrorKind;

#[tokio::test]
async fn options_that_do_not_hold_are_refused_before_anything_is_opened() {
    // Nothing listens on port 1: a refusal from the options comes before any connection.
    let e = distlock::client("redis://127.0.0.1:1")
        .ttl(Duration::ZERO)
        .connect()
        .await
        .expect_err("a zero TTL");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let e = distlock::client("nosuch://x")
        .connect()
        .await
        .expect_err("an unknown scheme");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

#[tokio::test]
async fn a_client_from_a_url_has_the_options_it_was_given() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let locks = distlock::client(&url)
        .ttl(Duration::from_secs(7))
        .wait_timeout(Duration::from_millis(200))
        .owner("billing-1")
        .connect()
        .await
        .unwrap();
    assert_eq!(locks.owner(), "billing-1");
    assert_eq!(locks.default_options().ttl(), Duration::from_secs(7));
    let guard = locks.lock("invoices").acquire().await.unwrap();
    let status = locks.status("invoices").await.unwrap();
    assert!(
        status.holders[0]
            .owner
            .as_deref()
            .is_some_and(|o| o.starts_with("billing-1")),
        "{status:?}"
    );
    // Another client of the same URL waits 200 ms, as its options say, then gives up.
    let other = distlock::client(&url)
        .wait_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let e = other.acquire("invoices").await.expect_err("held");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(guard.release().await.unwrap().was_held());
}
