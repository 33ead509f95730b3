//! The conformance suite on a real MariaDB server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_core::{LockClient, LockOptions};
use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDb;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<MysqlBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let db = Arc::new(MariaDb::start()?);
    let url = db.url("");
    Some(move |options: LockOptions| {
        let (db, url) = (db.clone(), url.clone());
        Box::pin(async move {
            let backend = MysqlBackend::connect(&url)
                .await
                .expect("connect to MariaDB");
            drop(db);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
