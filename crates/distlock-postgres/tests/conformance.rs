//! The conformance suite on a real PostgreSQL server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_core::{LockClient, LockOptions};
use distlock_postgres::PgBackend;
use distlock_testkit::Postgres;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<PgBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let pg = Arc::new(Postgres::start()?);
    let url = pg.url("");
    Some(move |options: LockOptions| {
        let (pg, url) = (pg.clone(), url.clone());
        Box::pin(async move {
            let backend = PgBackend::connect(&url)
                .await
                .expect("connect to PostgreSQL");
            drop(pg);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
