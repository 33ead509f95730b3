//! The conformance suite on memcached through the run-time (`AnyBackend`) path (`open_backend`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::Memcached;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let pg = Arc::new(Memcached::start()?);
    let url = pg.url("");
    Some(move |options: LockOptions| {
        let (pg, url) = (pg.clone(), url.clone());
        Box::pin(async move {
            let backend = distlock::open_backend(&url)
                .await
                .expect("connect to memcached");
            drop(pg);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
