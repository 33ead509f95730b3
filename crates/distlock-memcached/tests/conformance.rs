//! The conformance suite on a real memcached server (marked "no fencing").

use distlock_memcached::MemcachedBackend;
use distlock_testkit::Memcached;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let mc = Memcached::start()?;
    let url = mc.url("");
    Some(clients_on(mc, url, |url| async move {
        MemcachedBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(@why setup());
