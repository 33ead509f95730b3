//! The conformance suite on MariaDB through the run-time (`AnyBackend`) path (`open_backend`).

use distlock::AnyBackend;
use distlock_testkit::MariaDb;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient<AnyBackend>> {
    let db = MariaDb::start()?;
    let url = db.url("");
    Some(clients_on(db, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
