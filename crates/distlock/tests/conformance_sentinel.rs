//! The conformance suite on a Redis master found through Sentinel, through the run-time
//! (`AnyBackend`) path. One sentinel is enough here (no failover is tested: see
//! `distlock-redis/tests/replication.rs`), and starts without waiting for its peers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::{RedisServer, Sentinels};

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let master = RedisServer::start()?;
    let sentinels = Sentinels::start(1, &master)?;
    let url = sentinels.url("");
    let servers = Arc::new((master, sentinels));
    Some(move |options: LockOptions| {
        let (servers, url) = (servers.clone(), url.clone());
        Box::pin(async move {
            let backend = distlock::open_backend(&url)
                .await
                .expect("connect through the sentinels");
            drop(servers);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
