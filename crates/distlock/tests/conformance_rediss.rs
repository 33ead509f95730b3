//! The conformance suite over TLS (`rediss://` with a CA and a client certificate) on a
//! redis-server that demands client certificates (`--tls-auth-clients yes`).

use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{Pki, RedisServer};

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let server = RedisServer::start_tls(&pki, true, &[])?;
    let url = format!(
        "rediss://127.0.0.1:{}/?tls_ca={}&tls_cert={}&tls_key={}",
        server.tls_port(),
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    Some(clients_on((server, pki), url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
