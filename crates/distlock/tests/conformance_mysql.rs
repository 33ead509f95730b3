//! The conformance suite on MariaDB through the run-time (URL) path (`open_backend`).

use distlock_testkit::MariaDb;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let db = MariaDb::start()?;
    let url = db.url("");
    Some(clients_on(db, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
