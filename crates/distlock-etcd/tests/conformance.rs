//! The conformance suite on a real etcd member.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_core::{LockClient, LockOptions};
use distlock_etcd::EtcdBackend;
use distlock_testkit::Etcd;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<EtcdBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let etcd = Arc::new(Etcd::start()?);
    let url = etcd.url("");
    Some(move |options: LockOptions| {
        let (etcd, url) = (etcd.clone(), url.clone());
        Box::pin(async move {
            let backend = EtcdBackend::connect(&url).await.expect("connect to etcd");
            drop(etcd);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
