//! The conformance suite on a real etcd member.

use distlock_etcd::EtcdBackend;
use distlock_testkit::Etcd;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let etcd = Etcd::start()?;
    let url = etcd.url("");
    Some(clients_on(etcd, url, |url| async move {
        EtcdBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(setup());
