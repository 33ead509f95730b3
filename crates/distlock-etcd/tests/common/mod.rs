//! What the etcd test files share: a client, and the keys under a lock's prefix.

use std::time::Duration;

use distlock_core::LockClient;
use distlock_etcd::EtcdBackend;
use distlock_testkit::Etcd;

/// A client of `url` whose locks have `ttl`, waiting 30 s at most.
pub(crate) async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = EtcdBackend::connect(url).await.expect("connect");
    distlock_testkit::client_of(backend, ttl, Some(Duration::from_secs(30)))
}

/// The keys under `prefix` now.
pub(crate) fn keys_under(etcd: &Etcd, prefix: &str) -> Vec<String> {
    etcd.ctl(&["get", prefix, "--prefix", "--keys-only"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}
