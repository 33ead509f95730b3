//! The run-time (URL) path on memcached: `open_backend` makes a client that holds, reports
//! and lists as the engine does. The whole conformance suite runs on memcached in
//! `distlock-memcached`'s own tests.

use distlock_testkit::Memcached;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let mc = Memcached::start()?;
    let url = mc.url("");
    Some(clients_on(mc, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(@url setup());
