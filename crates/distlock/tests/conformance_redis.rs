//! The conformance suite on a real redis-server, through the run-time (`AnyBackend`) path.

use std::future::Future;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::RedisServer;

fn setup() -> Option<
    impl Fn(LockOptions) -> std::pin::Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>,
> {
    let server = Arc::new(RedisServer::start()?);
    Some(move |options: LockOptions| {
        let url = server.url();
        let keep = server.clone();
        Box::pin(async move {
            let backend = distlock::open_backend(&url)
                .await
                .expect("connect to redis");
            drop(keep);
            LockClient::builder(backend).options(options).build()
        }) as std::pin::Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>
    })
}

distlock_testkit::conformance_tests!(setup());
