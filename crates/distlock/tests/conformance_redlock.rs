//! The conformance suite on Redlock over three real redis-server masters, through the run-time
//! (URL) path.

use distlock_testkit::RedisServer;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start())
        .collect::<Option<_>>()?;
    let url = format!(
        "redlock://{}",
        masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    Some(clients_on(masters, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@short setup());
distlock_testkit::conformance_group_tests!(@why setup());
