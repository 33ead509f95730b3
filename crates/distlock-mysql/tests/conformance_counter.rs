//! The conformance suite on a real MariaDB server, with the fences MySQL has (`fence=counter`:
//! a counter row per name, written by each acquire) instead of MariaDB's sequence.

use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDb;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let db = MariaDb::start()?;
    let url = db.url("?fence=counter");
    Some(clients_on(db, url, |url| async move {
        MysqlBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@short setup());
