//! `zks://` against a real ZooKeeper server whose secure client port demands client
//! certificates (`ssl.clientAuth=need`), with certificates made at run time.

use distlock_core::{ErrorKind, LockError};
use distlock_testkit::tls_cases::{refused, refused_identities};
use distlock_testkit::{Pki, ZooKeeper};
use distlock_zookeeper::ZkBackend;

async fn lock_once(url: &str) -> Result<(), LockError> {
    distlock_testkit::tls_cases::lock_once(ZkBackend::connect(url).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_takes_good_clients_and_refuses_the_rest() {
    let pki = Pki::generate();
    let Some(zk) = ZooKeeper::start_tls(&pki) else {
        return;
    };
    // Short limits: a refused handshake is retried by the client until they pass.
    let limits = "connect_timeout=1s&session_timeout=2s";
    let url = |params: &str| zk.tls_url(&format!("?{limits}&{params}"));
    let ca = pki.ca.display();
    let (cert, key) = (pki.client.cert.display(), pki.client.key.display());
    for params in [
        format!("tls_ca={ca}&tls_cert={cert}&tls_key={key}"),
        format!("tls_ca={ca}&tls_cert={cert}&tls_key={key}&tls_verify=ca"),
    ] {
        lock_once(&url(&params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
    }
    refused(
        lock_once(&url(&format!(
            "tls_ca={}&tls_cert={cert}&tls_key={key}",
            pki.other_ca.display()
        )))
        .await,
        ErrorKind::Auth,
        "the server's certificate was refused",
        "another CA",
    );
    for (params, kind, words, case) in refused_identities(&pki) {
        refused(lock_once(&url(&params)).await, kind, words, case);
    }
    refused(
        lock_once(&url(&format!("tls_ca={ca}&tls_verify=none"))).await,
        ErrorKind::Unsupported,
        "always checks the server's chain",
        "encryption without verification",
    );
    // Clear text to the TLS port: the server never answers a session, a typed error.
    let port = zk
        .tls_url("")
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let e = lock_once(&format!("zk://127.0.0.1:{port}?{limits}"))
        .await
        .expect_err("clear text to a TLS port");
    assert!(
        matches!(e.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{e}"
    );
}
