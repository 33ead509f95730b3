//! The conformance suite on a Redis master found through Sentinel, through the run-time
//! (URL) path. One sentinel is enough here (no failover is tested: see
//! `distlock-redis/tests/replication.rs`), and starts without waiting for its peers.

use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{RedisServer, Sentinels};

fn setup() -> Option<impl MakeClient> {
    let master = RedisServer::start()?;
    let sentinels = Sentinels::start(1, &master)?;
    let url = sentinels.url("");
    Some(clients_on((master, sentinels), url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@short setup());
distlock_testkit::conformance_group_tests!(@short setup());
