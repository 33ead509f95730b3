//! The conformance suite on PostgreSQL through the run-time (URL) path: the engine's
//! loss events must reach guards through the boxed backend too.

use distlock_testkit::Postgres;
use distlock_testkit::conformance::{MakeClient, clients_on};

fn setup() -> Option<impl MakeClient> {
    let pg = Postgres::start()?;
    let url = pg.url("");
    Some(clients_on(pg, url, |url| async move {
        distlock::open_backend(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
