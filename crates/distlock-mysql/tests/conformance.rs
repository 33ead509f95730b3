//! The conformance suite on a real MariaDB server (fences from its sequence).

use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDb;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let db = MariaDb::start()?;
    let url = db.url("");
    Some(clients_on(db, url, |url| async move {
        MysqlBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(setup());
