//! The conformance suite over TLS (`etcds://`, a client certificate) on an etcd member run
//! with `--client-cert-auth`.

use distlock_etcd::EtcdBackend;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{Etcd, Pki};

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let etcd = Etcd::start_tls(&pki)?;
    let url = etcd.url(&format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    ));
    Some(clients_on((etcd, pki), url, |url| async move {
        EtcdBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
