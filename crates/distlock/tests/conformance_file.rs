//! The conformance suite on the embedded file engine (real flock on real files).

use std::sync::Arc;

use distlock::file::FileBackend;
use distlock::{LockClient, LockOptions};

fn setup() -> Option<impl Fn(LockOptions) -> std::future::Ready<LockClient>> {
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    Some(move |options: LockOptions| {
        // A separate backend per client: separate open files, as in separate processes.
        let backend = FileBackend::new(dir.path()).expect("file backend");
        std::future::ready(LockClient::builder(backend).options(options).build())
    })
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(setup());
