//! `memcacheds://` against a real memcached that speaks TLS only (`-Z`) and demands client
//! certificates, with certificates made at run time.

use distlock_core::{ErrorKind, LockError};
use distlock_memcached::MemcachedBackend;
use distlock_testkit::tls_cases::{refused, refused_identities};
use distlock_testkit::{Memcached, Pki};

async fn lock_once(url: &str) -> Result<(), LockError> {
    distlock_testkit::tls_cases::lock_once(MemcachedBackend::connect(url).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_takes_good_clients_and_refuses_the_rest() {
    let pki = Pki::generate();
    let Some(mc) = Memcached::start_tls(&pki) else {
        return;
    };
    let ca = pki.ca.display();
    let (cert, key) = (pki.client.cert.display(), pki.client.key.display());
    for params in [
        format!("?tls_ca={ca}&tls_cert={cert}&tls_key={key}"),
        format!("?tls_ca={ca}&tls_cert={cert}&tls_key={key}&tls_verify=ca"),
        format!("?tls_cert={cert}&tls_key={key}&tls_verify=none"),
    ] {
        lock_once(&mc.url(&params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
    }
    refused(
        lock_once(&mc.url(&format!("?tls_cert={cert}&tls_key={key}"))).await,
        ErrorKind::Auth,
        "the server's certificate was refused",
        "no CA",
    );
    for (params, kind, words, case) in refused_identities(&pki) {
        refused(
            lock_once(&mc.url(&format!("?{params}"))).await,
            kind,
            words,
            case,
        );
    }
    // Clear text to the TLS port: no answer the engine takes, a typed error.
    let plain = format!(
        "memcached://127.0.0.1:{}?connect_timeout=1s&response_timeout=1s",
        mc.port()
    );
    let e = lock_once(&plain)
        .await
        .expect_err("clear text to a TLS port");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Protocol
        ),
        "{e}"
    );
}
