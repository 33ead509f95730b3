//! The conformance suite over TLS (`rediss://` with a CA and a client certificate) on a
//! redis-server that demands client certificates (`--tls-auth-clients yes`).

use distlock::AnyBackend;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{Pki, RedisServer, free_port};

fn setup() -> Option<impl MakeClient<AnyBackend>> {
    let pki = Pki::generate();
    let tls_port = free_port();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        pki.server.cert.to_str()?,
        "--tls-key-file",
        pki.server.key.to_str()?,
        "--tls-ca-cert-file",
        pki.ca.to_str()?,
        "--tls-auth-clients",
        "yes",
    ])?;
    let url = format!(
        "rediss://127.0.0.1:{tls_port}/?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    Some(clients_on((server, pki), url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
