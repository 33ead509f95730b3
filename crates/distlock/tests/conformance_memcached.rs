//! The conformance suite on memcached through the run-time (URL) path (`open_backend`).

use distlock_testkit::Memcached;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let mc = Memcached::start()?;
    let url = mc.url("");
    Some(clients_on(mc, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
