//! Sharing a path with kazoo: its node names, made here by hand as kazoo makes them, hold
//! distlock back; `layout=kazoo` names distlock's nodes so kazoo sees them; a client refuses a
//! lock queued for by a layout it does not write, and leaves nothing behind.

use std::time::Duration;

use distlock_core::{ErrorKind, LockClient};
use distlock_testkit::{ZooKeeper, client_of};
use distlock_zookeeper::ZkBackend;
use zookeeper_client::{Acls, Client, CreateMode};

async fn client(url: &str) -> LockClient {
    let backend = ZkBackend::connect(url).await.expect("connect");
    client_of(
        backend,
        Duration::from_secs(10),
        Some(Duration::from_secs(5)),
    )
}

async fn raw(url: &str) -> Client {
    Client::connect(&url["zk://".len()..])
        .await
        .expect("raw client")
}

/// A node as kazoo's `Lock` makes it: `<uuid hex>__lock__<seq>`, ephemeral and sequential.
async fn kazoo_node(zk: &Client, parent: &str) -> String {
    zk.mkdir(
        parent,
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .ok();
    let prefix = format!("{parent}/2f1c9a0e8b7d4c3a9e1f0a2b3c4d5e6f__lock__");
    let (_, seq) = zk
        .create(
            &prefix,
            b"",
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("kazoo's node");
    format!("{prefix}{seq}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_holder_is_refused_by_the_default_layout_and_waited_for_by_kazoos() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let zkc = raw(&url).await;
    let parent = "/distlock/jobs";
    let node = kazoo_node(&zkc, parent).await;

    let curator = client(&url).await;
    let e = curator.try_acquire("jobs").await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::KindConflict, "{e}");
    assert!(e.message().contains("layout=kazoo"), "{e}");
    assert_eq!(
        zkc.list_children(parent).await.unwrap().len(),
        1,
        "ours was deleted"
    );

    let kazoo = client(&format!("{url}?layout=kazoo")).await;
    assert!(
        kazoo.try_acquire("jobs").await.unwrap().is_none(),
        "kazoo holds it"
    );
    zkc.delete(&node, None).await.unwrap();
    let g = kazoo.try_acquire("jobs").await.unwrap().expect("free now");
    let children = zkc.list_children(parent).await.unwrap();
    let token = g.token();
    let expected = format!("_c_{}__lock__", token.as_str());
    assert!(
        children.len() == 1
            && children[0].starts_with(&expected)
            && children[0].len() == expected.len() + 10,
        "named as kazoo names its nodes: {children:?}"
    );
    assert!(g.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_layout_client_refuses_a_lock_queued_for_in_curators_layout() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let curator = client(&url).await;
    let held = curator.acquire("mixed").await.unwrap();
    let kazoo = client(&format!("{url}?layout=kazoo")).await;
    let e = kazoo.try_acquire("mixed").await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::KindConflict, "{e}");
    assert!(e.message().contains("layout=curator"), "{e}");
    let zkc = raw(&url).await;
    assert_eq!(zkc.list_children("/distlock/mixed").await.unwrap().len(), 1);
    assert!(held.release().await.unwrap().was_held());
    // Alone on the path, either layout takes it.
    let again = kazoo.try_acquire("mixed").await.unwrap().expect("free");
    assert!(again.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_finds_kazoos_node_at_its_next_look_gives_up_its_place() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let zkc = raw(&url).await;
    let holder = client(&url).await;
    let held = holder.acquire("later").await.unwrap();
    let waiter = client(&url).await;
    let waiting = tokio::spawn(async move { waiter.acquire("later").await.map(|_| ()) });
    // Queued (its node stays), then kazoo's node comes behind it.
    let parent = "/distlock/later";
    let t0 = std::time::Instant::now();
    while zkc.list_children(parent).await.unwrap().len() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kazoos = kazoo_node(&zkc, parent).await;
    assert!(held.release().await.unwrap().was_held());
    let e = waiting
        .await
        .unwrap()
        .expect_err("refused at its next look");
    assert_eq!(e.kind(), ErrorKind::KindConflict, "{e}");
    // Only kazoo's node is left.
    let t0 = std::time::Instant::now();
    loop {
        let left = zkc.list_children(parent).await.unwrap();
        if left.len() == 1 {
            assert!(kazoos.ends_with(&left[0]), "{left:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the waiter's node stayed: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
