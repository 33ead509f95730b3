//! The conformance suite over TLS (`memcacheds://`, a client certificate) on a memcached
//! server run with `-Z` and `ssl_verify_mode=2`.

use distlock_memcached::MemcachedBackend;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{Memcached, Pki};

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let mc = Memcached::start_tls(&pki)?;
    let url = mc.url(&format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    ));
    Some(clients_on((mc, pki), url, |url| async move {
        MemcachedBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
