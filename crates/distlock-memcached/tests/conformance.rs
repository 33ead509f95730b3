//! The conformance suite on a real memcached server (marked "no fencing").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_core::{LockClient, LockOptions};
use distlock_memcached::MemcachedBackend;
use distlock_testkit::Memcached;

type ClientFuture = Pin<Box<dyn Future<Output = LockClient<MemcachedBackend>> + Send>>;

fn setup() -> Option<impl Fn(LockOptions) -> ClientFuture> {
    let mc = Arc::new(Memcached::start()?);
    let url = mc.url("");
    Some(move |options: LockOptions| {
        let (mc, url) = (mc.clone(), url.clone());
        Box::pin(async move {
            let backend = MemcachedBackend::connect(&url)
                .await
                .expect("connect to memcached");
            drop(mc);
            LockClient::builder(backend).options(options).build()
        }) as ClientFuture
    })
}

distlock_testkit::conformance_tests!(setup());
