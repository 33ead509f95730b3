//! The conformance suite on a three-master Redis Cluster, through the run-time (`AnyBackend`)
//! path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock::{AnyBackend, LockClient, LockOptions};
use distlock_testkit::RedisCluster;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<AnyBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let cluster = Arc::new(RedisCluster::start(3)?);
    let url = cluster.url("");
    Some(move |options: LockOptions| {
        let (cluster, url) = (cluster.clone(), url.clone());
        Box::pin(async move {
            let backend = distlock::open_backend(&url)
                .await
                .expect("connect to the Cluster");
            drop(cluster);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
