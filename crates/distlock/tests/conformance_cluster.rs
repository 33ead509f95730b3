//! The conformance suite on a three-master Redis Cluster, through the run-time (URL)
//! path.

use distlock_testkit::RedisCluster;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let cluster = RedisCluster::start(3)?;
    let url = cluster.url("");
    Some(clients_on(cluster, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@short setup());
distlock_testkit::conformance_group_tests!(@short setup());
