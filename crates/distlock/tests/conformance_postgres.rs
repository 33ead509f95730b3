//! The run-time (URL) path on PostgreSQL: `open_backend` makes a client that holds, fences,
//! reports and lists as the engine does. The whole conformance suite runs on PostgreSQL in
//! `distlock-postgres`'s own tests.

use distlock_testkit::Postgres;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let pg = Postgres::start()?;
    let url = pg.url("");
    Some(clients_on(pg, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(@url setup());
