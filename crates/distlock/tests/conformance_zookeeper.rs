//! The run-time (URL) path on ZooKeeper: `open_backend` makes a client that holds, fences,
//! reports and lists as the engine does. The whole conformance suite runs on ZooKeeper in
//! `distlock-zookeeper`'s own tests.

use distlock_testkit::ZooKeeper;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let zk = ZooKeeper::start()?;
    let url = zk.url("");
    Some(clients_on(zk, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(@url setup());
