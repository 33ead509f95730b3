//! The conformance suite on a real ZooKeeper server.

use distlock_testkit::ZooKeeper;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_zookeeper::ZkBackend;

fn setup() -> Option<impl MakeClient> {
    let zk = ZooKeeper::start()?;
    let url = zk.url("");
    Some(clients_on(zk, url, |url| async move {
        ZkBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(setup());
