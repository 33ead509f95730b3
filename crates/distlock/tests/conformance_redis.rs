//! The conformance suite on a real redis-server, through the run-time (URL) path.

use distlock_testkit::RedisServer;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let server = RedisServer::start()?;
    let url = server.url();
    Some(clients_on(server, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(setup());
distlock_testkit::conformance_group_tests!(setup());
