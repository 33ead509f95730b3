//! The cases every engine's TLS test runs: a client that connects and locks, and one that
//! is refused with a given kind of error and words.

use distlock_core::{Backend, ErrorKind, LockClient, LockError};

/// Takes and releases one lock through a freshly connected engine (`connected` is the result
/// of the engine's `connect`).
///
/// # Errors
/// The connection's error, or the acquire's or the release's.
pub async fn lock_once<B: Backend>(connected: Result<B, LockError>) -> Result<(), LockError> {
    let client = LockClient::new(connected?);
    let guard = client.acquire("tls-lock").await?;
    assert!(guard.is_held());
    assert!(guard.release().await?.was_held());
    Ok(())
}

/// Asserts that `result` failed with `kind` and a message that contains `words` (`case`
/// names the case in the failure).
#[track_caller]
pub fn refused(result: Result<(), LockError>, kind: ErrorKind, words: &str, case: &str) {
    let e = result.expect_err(case);
    assert_eq!(e.kind(), kind, "{case}: {e}");
    assert!(
        e.to_string().contains(words),
        "{case}: {e:?} lacks {words:?}"
    );
}
