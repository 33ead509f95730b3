//! The run-time (URL) path on MariaDB: `open_backend` makes a client that holds, fences,
//! reports and lists as the engine does. The whole conformance suite runs on MariaDB in
//! `distlock-mysql`'s own tests.

use distlock_testkit::MariaDb;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let db = MariaDb::start()?;
    let url = db.url("");
    Some(clients_on(db, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(@url setup());
