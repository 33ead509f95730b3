//! The conformance suite on a real ZooKeeper server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_core::{LockClient, LockOptions};
use distlock_testkit::ZooKeeper;
use distlock_zookeeper::ZkBackend;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<ZkBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let zk = Arc::new(ZooKeeper::start()?);
    let url = zk.url("");
    Some(move |options: LockOptions| {
        let (zk, url) = (zk.clone(), url.clone());
        Box::pin(async move {
            let backend = ZkBackend::connect(&url)
                .await
                .expect("connect to ZooKeeper");
            drop(zk);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
