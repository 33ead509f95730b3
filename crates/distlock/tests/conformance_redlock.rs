//! The conformance suite on Redlock over three real redis-server masters, through the run-time
//! (`AnyBackend`) path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::RedisServer;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start())
        .collect::<Option<_>>()?;
    let url = format!(
        "redlock://{}",
        masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let masters = Arc::new(masters);
    Some(move |options: LockOptions| {
        let (masters, url) = (masters.clone(), url.clone());
        Box::pin(async move {
            let backend = distlock::open_backend(&url)
                .await
                .expect("connect to the masters");
            drop(masters);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
