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

/// The clients a server that demands certificates from the kit's CA must refuse, as URL
/// parameters with distlock's names (`tls_ca`, `tls_cert`, `tls_key`, joined by `&`), each
/// with the kind and words of its error and the name of the case: no client certificate, a
/// stranger's (another CA's), and a CA file that does not exist.
pub fn refused_identities(
    pki: &crate::Pki,
) -> Vec<(String, ErrorKind, &'static str, &'static str)> {
    let ca = pki.ca.display();
    let (scert, skey) = (pki.stranger.cert.display(), pki.stranger.key.display());
    vec![
        (
            format!("tls_ca={ca}"),
            ErrorKind::Auth,
            "refused our client certificate",
            "no client certificate",
        ),
        (
            format!("tls_ca={ca}&tls_cert={scert}&tls_key={skey}"),
            ErrorKind::Auth,
            "refused our client certificate",
            "a client certificate from another CA",
        ),
        (
            "tls_ca=/nonexistent/ca.pem".to_owned(),
            ErrorKind::Config,
            "/nonexistent/ca.pem",
            "a missing CA file",
        ),
    ]
}
