//! `etcds://` against a real etcd member that serves TLS only and demands client
//! certificates (`--client-cert-auth`), with certificates made at run time, and password auth
//! over it.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockError};
use distlock_etcd::EtcdBackend;
use distlock_testkit::tls_cases::{refused, refused_identities};
use distlock_testkit::{Etcd, Pki};

async fn lock_once(url: &str) -> Result<(), LockError> {
    distlock_testkit::tls_cases::lock_once(EtcdBackend::connect(url).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_client_cert_auth_takes_good_clients_and_refuses_the_rest() {
    let pki = Pki::generate();
    let Some(etcd) = Etcd::start_tls(&pki) else {
        return;
    };
    let ca = pki.ca.display();
    let (cert, key) = (pki.client.cert.display(), pki.client.key.display());
    let port = etcd.members()[0].port();
    let url = |params: &str| format!("etcds://127.0.0.1:{port}?response_timeout=3s{params}");
    for params in [
        format!("&tls_ca={ca}&tls_cert={cert}&tls_key={key}"),
        format!("&tls_ca={ca}&tls_cert={cert}&tls_key={key}&tls_verify=ca"),
        format!("&tls_cert={cert}&tls_key={key}&tls_verify=none"),
    ] {
        lock_once(&url(&params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
    }
    // The system's roots do not know the test CA.
    refused(
        lock_once(&url(&format!("&tls_cert={cert}&tls_key={key}"))).await,
        ErrorKind::Auth,
        "the server's certificate was refused",
        "no CA",
    );
    for (params, kind, words, case) in refused_identities(&pki) {
        refused(
            lock_once(&url(&format!("&{params}"))).await,
            kind,
            words,
            case,
        );
    }
    // Clear text to a TLS port fails, quickly, and takes nothing.
    let t0 = Instant::now();
    let e = lock_once(&format!(
        "etcd://127.0.0.1:{port}?connect_timeout=1s&response_timeout=1s"
    ))
    .await
    .expect_err("clear text to a TLS member");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Protocol
        ),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // Password auth over TLS.
    etcd.ctl(&["user", "add", "root:s3cret", "--interactive=false"]);
    etcd.ctl(&["auth", "enable"]);
    let files = format!("&tls_ca={ca}&tls_cert={cert}&tls_key={key}");
    refused(
        lock_once(&format!(
            "etcds://root:wrong@127.0.0.1:{port}?response_timeout=3s{files}"
        ))
        .await,
        ErrorKind::Auth,
        "authentication failed",
        "a wrong password",
    );
    lock_once(&format!(
        "etcds://root:s3cret@127.0.0.1:{port}?response_timeout=3s{files}"
    ))
    .await
    .expect("the right password over TLS");
}
