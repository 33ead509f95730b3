//! Digest authentication against a real ZooKeeper server that refuses sessions without it.

use distlock_core::{ErrorKind, LockClient};
use distlock_testkit::ZooKeeper;
use distlock_zookeeper::ZkBackend;

async fn client(url: &str) -> LockClient {
    LockClient::new(ZkBackend::connect(url).await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_users_own_their_nodes_and_others_are_refused() {
    let Some(zk) = ZooKeeper::start_requiring_digest() else {
        return;
    };
    let port = zk.servers()[0].port();
    let url =
        |cred: &str| format!("zk://{cred}127.0.0.1:{port}?connect_timeout=1s&session_timeout=2s");

    // No credentials: the server ends the session.
    let e = ZkBackend::connect(&url(""))
        .await
        .expect_err("a session without auth");
    assert!(
        matches!(e.kind(), ErrorKind::Auth | ErrorKind::Connection),
        "{e}"
    );

    let alice = client(&url("alice:s3cret@")).await;
    let g = alice.acquire("digest-lock").await.expect("alice locks");
    assert!(g.fence().is_some());

    // The same user with another password is another identity: it can neither take the lock,
    // nor read who holds it, nor break it.
    let mallory = client(&url("alice:guess@")).await;
    let e = mallory
        .try_acquire("digest-lock")
        .await
        .expect_err("another password");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    let e = mallory
        .status("digest-lock")
        .await
        .expect_err("another password reads nothing");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(g.is_held());

    // The same credentials share the lock namespace.
    let alice2 = client(&url("alice:s3cret@")).await;
    assert!(alice2.try_acquire("digest-lock").await.unwrap().is_none());
    assert!(alice2.status("digest-lock").await.unwrap().held);
    assert!(g.release().await.unwrap().was_held());
    let g2 = alice2
        .try_acquire("digest-lock")
        .await
        .unwrap()
        .expect("free again");
    assert!(g2.release().await.unwrap().was_held());
}
