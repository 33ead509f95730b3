//! The conformance suite on a real PostgreSQL server.

use distlock_postgres::PgBackend;
use distlock_testkit::Postgres;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let pg = Postgres::start()?;
    let url = pg.url("");
    Some(clients_on(pg, url, |url| async move {
        PgBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
distlock_testkit::conformance_many_tests!(@brief setup());
distlock_testkit::conformance_group_tests!(setup());
