//! The conformance suite on ZooKeeper through the run-time (URL) path: the engine's
//! loss events must reach guards through the boxed backend too.

use distlock_testkit::ZooKeeper;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let zk = ZooKeeper::start()?;
    let url = zk.url("");
    Some(clients_on(zk, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
