//! Release events on PostgreSQL: a release statement notifies the lock's waiters (`NOTIFY`
//! when the lock has a waiter's ticket), and another client's waiter, listening, tries again at
//! once instead of at the end of its back-off. A holder whose session dies sends nothing: its
//! waiters still find the lock free at their next attempt.
//!
//! The waiters here back off for a whole second between attempts, so a waiter that got in
//! within a fraction of it was woken.

use std::time::{Duration, Instant};

use distlock_core::engine::LeaseKind;
use distlock_core::{Backoff, LockClient, LockOptions};
use distlock_postgres::PgBackend;
use distlock_testkit::Postgres;

/// A client whose waiters back off `pause` between attempts (events on or off).
async fn client(url: &str, pause: Duration, events: bool) -> LockClient {
    let backend = PgBackend::connect(url).await.expect("connect");
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(20))
        .backoff(Backoff::new(pause, pause).unwrap())
        .events(events)
        .build()
        .unwrap();
    LockClient::builder(backend).options(options).build()
}

/// How long another client's waiter of `kind` takes to get `key` after the holder (of
/// `holder_kind`) releases it.
async fn takeover(
    url: &str,
    key: &'static str,
    holder_kind: LeaseKind,
    kind: LeaseKind,
    events: bool,
) -> Duration {
    let pause = Duration::from_secs(1);
    let holder = client(url, pause, events).await;
    let waiter = client(url, pause, events).await;
    let g = holder.lock(key).kind(holder_kind).acquire().await.unwrap();
    let w = tokio::spawn(async move {
        let g = waiter.lock(key).kind(kind).acquire().await.unwrap();
        let got = Instant::now();
        assert!(g.release().await.unwrap().was_held());
        got
    });
    // The waiter has tried, taken its ticket, subscribed, tried again, and sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(g.release().await.unwrap().was_held());
    w.await.unwrap() - released
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_another_clients_waiter_at_once() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let permits = LeaseKind::Permit { permits: 1 };
    for (key, holder, kind) in [
        ("mutex", LeaseKind::Exclusive, LeaseKind::Exclusive),
        ("rw", LeaseKind::Exclusive, LeaseKind::Shared),
        ("wr", LeaseKind::Shared, LeaseKind::Exclusive),
        ("sem", permits, permits),
    ] {
        let took = takeover(&url, key, holder, kind, true).await;
        assert!(
            took < Duration::from_millis(200),
            "{key}: the waiter got in {took:?} after the release"
        );
    }
    // The control: without events the same waiter sleeps out its pause.
    let took = takeover(
        &url,
        "polled",
        LeaseKind::Exclusive,
        LeaseKind::Exclusive,
        false,
    )
    .await;
    assert!(
        took > Duration::from_millis(300),
        "without events the waiter got in {took:?} after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_release_sends_no_notification() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let c = client(&url, Duration::from_millis(50), true).await;
    // A session that listens on every lock's channel the test uses.
    let (spy, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("spy");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut conn = conn;
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.channel().to_owned());
            }
        }
    });
    let channel = format!("distlock:{}", distlock_postgres::lock_id("quiet"));
    spy.batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .unwrap();
    for _ in 0..5 {
        let g = c.acquire("quiet").await.unwrap();
        assert!(g.release().await.unwrap().was_held());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        rx.try_recv().is_err(),
        "a release nobody waited for notified"
    );
    // Contended: the release notifies the waiter's channel.
    let other = client(&url, Duration::from_secs(1), true).await;
    let g = c.acquire("quiet").await.unwrap();
    let w = tokio::spawn(async move { other.acquire("quiet").await.unwrap().release().await });
    // Released once the waiter is queued (its ticket is what the release notifies for).
    let queued = tokio::time::Instant::now() + Duration::from_secs(10);
    while c.status("quiet").await.unwrap().waiters < Some(1) {
        assert!(
            tokio::time::Instant::now() < queued,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(g.release().await.unwrap().was_held());
    assert!(w.await.unwrap().unwrap().was_held());
    let heard = tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(heard, channel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_waiter_still_gets_in() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let pause = Duration::from_millis(100);
    let holder = client(&url, pause, true).await;
    let waiter = client(&url, pause, true).await;
    let _g = holder.acquire("dead").await.unwrap();
    let w = tokio::spawn(async move { waiter.acquire("dead").await.map(|g| g.fence()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The holder's session ends without a release statement.
    let id = distlock_postgres::lock_id("dead");
    let pid = pg.psql(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
         AND classid = (({id}::bigint >> 32) & 4294967295)::oid \
         AND objid = ({id}::bigint & 4294967295)::oid"
    ));
    assert_eq!(pg.psql(&format!("SELECT pg_terminate_backend({pid})")), "t");
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the waiter got in")
        .unwrap()
        .unwrap();
    // Its back-off, not the one-second fallback of an engine whose events cover deaths.
    assert!(started.elapsed() < Duration::from_millis(800));
}

/// A permit waiter's busy attempt gives back the size hold it took, which frees no permit: it
/// notifies nobody (it used to wake its own waiter, which tried again at once, a busy loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiters_busy_attempts_notify_nobody() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let holder = client(&url, Duration::from_millis(50), true).await;
    let waiter = client(&url, Duration::from_millis(50), true).await;
    let (spy, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("spy");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut conn = conn;
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.channel().to_owned());
            }
        }
    });
    // A semaphore's waiters listen on its base id's channel (see the README).
    let base = distlock_postgres::lock_id("busy\0permits");
    spy.batch_execute(&format!("LISTEN \"distlock:{base}\""))
        .await
        .unwrap();
    let g = holder.semaphore("busy", 1).acquire().await.unwrap();
    let e = waiter
        .semaphore("busy", 1)
        .wait_timeout(Duration::from_millis(500))
        .acquire()
        .await
        .expect_err("the permit is held");
    assert_eq!(e.kind(), distlock_core::ErrorKind::Timeout, "{e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut heard = 0;
    while rx.try_recv().is_ok() {
        heard += 1;
    }
    assert_eq!(heard, 0, "busy attempts notified");
    assert!(g.release().await.unwrap().was_held());
}
