//! The conformance suite on the in-memory engine of the test kit (`MemoryStore`): it behaves as
//! every real engine must, so that tests of the core on it (`waiting`) test the core.

use distlock_core::{LockClient, LockOptions};
use distlock_testkit::MemoryStore;

fn setup() -> Option<impl distlock_testkit::conformance::MakeClient> {
    let store = MemoryStore::new();
    Some(move |options: LockOptions| {
        let backend = store.backend();
        async move { LockClient::builder(backend).options(options).build() }
    })
}

distlock_testkit::conformance_tests!(setup());
