//! The conformance suite over TLS (`zks://`, a client certificate) on a ZooKeeper server with a
//! secure client port that demands client certificates.

use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{Pki, ZooKeeper};
use distlock_zookeeper::ZkBackend;

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let zk = ZooKeeper::start_tls(&pki)?;
    let url = zk.tls_url(&format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    ));
    Some(clients_on((zk, pki), url, |url| async move {
        ZkBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
