//! The conformance suite on a real redis-server, through the run-time (`AnyBackend`) path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::RedisServer;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let server = Arc::new(RedisServer::start()?);
    Some(move |options: LockOptions| {
        // Each client owns a handle on the server, which lives as long as the last of them.
        let server = server.clone();
        Box::pin(async move {
            let backend = distlock::open_backend(&server.url())
                .await
                .expect("connect to redis");
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
