//! Waiters on PostgreSQL are served in arrival order across kinds, through their tickets in
//! `distlock_waiters`: readers do not pass a waiting writer, permits go first come, first
//! served, and a waiter that stops holds nobody back for long.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::LockClient;
use distlock_core::engine::LeaseKind;
use distlock_postgres::PgBackend;
use distlock_testkit::{Postgres, client_of};

async fn client(url: &str) -> LockClient {
    let backend = PgBackend::connect(url).await.expect("connect");
    client_of(
        backend,
        Duration::from_secs(10),
        Some(Duration::from_secs(30)),
    )
}

type Order = Arc<Mutex<Vec<&'static str>>>;

/// A waiter `who` of `kind` on `key` (on a client of its own, as another process), which
/// notes its turn in `order` and holds the lease for `hold`.
async fn waiter(
    url: &str,
    key: &'static str,
    kind: LeaseKind,
    who: &'static str,
    order: &Order,
    hold: Duration,
) -> tokio::task::JoinHandle<()> {
    let c = client(url).await;
    let order = order.clone();
    tokio::spawn(async move {
        let g = c.lock(key).kind(kind).acquire().await.expect(who);
        order.lock().unwrap().push(who);
        tokio::time::sleep(hold).await;
        assert!(g.release().await.unwrap().was_held(), "{who}");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_served_in_arrival_order() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let holder = client(&url).await;
    let g = holder.acquire("rw").await.unwrap();
    let order = Order::default();
    let hold = Duration::from_millis(300);
    let gap = Duration::from_millis(300);
    let mut tasks = Vec::new();
    for (who, kind) in [
        ("reader 1", LeaseKind::Shared),
        ("writer 2", LeaseKind::Exclusive),
        ("reader 3", LeaseKind::Shared),
        ("writer 4", LeaseKind::Exclusive),
    ] {
        tasks.push(waiter(&url, "rw", kind, who, &order, hold).await);
        tokio::time::sleep(gap).await;
    }
    assert_eq!(holder.status("rw").await.unwrap().waiters, Some(4));
    assert!(g.release().await.unwrap().was_held());
    for t in tasks {
        t.await.unwrap();
    }
    // Without the tickets, the readers get in together as soon as the first writer leaves,
    // and the writers after them, in any order.
    assert_eq!(
        *order.lock().unwrap(),
        ["reader 1", "writer 2", "reader 3", "writer 4"]
    );
    assert_eq!(holder.status("rw").await.unwrap().waiters, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_go_first_come_first_served() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let holder = client(&url).await;
    let g = holder.semaphore("sem", 2).acquire().await.unwrap();
    let g2 = holder.semaphore("sem", 2).acquire().await.unwrap();
    let order = Order::default();
    let mut tasks = Vec::new();
    let permit = LeaseKind::Permit { permits: 2 };
    for who in ["first", "second", "third", "fourth"] {
        tasks.push(waiter(&url, "sem", permit, who, &order, Duration::from_millis(400)).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(holder.status("sem").await.unwrap().waiters, Some(4));
    // One permit comes back: the first waiter's, then the next holder's, one at a time.
    assert!(g.release().await.unwrap().was_held());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(g2.release().await.unwrap().was_held());
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["first", "second", "third", "fourth"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_holds_readers_back_briefly() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let reader = client(&url).await;
    let r = reader
        .read_lock("quit")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let writer = client(&url).await;
    let e = writer
        .lock("quit")
        .wait_timeout(Duration::from_millis(600))
        .acquire()
        .await
        .expect_err("the reader holds");
    assert_eq!(e.kind(), distlock_core::ErrorKind::Timeout, "{e}");
    // Its ticket lapses within a second or so of its last try (three times the poll, at
    // least one second): then readers come in again.
    let late = client(&url).await;
    let t0 = std::time::Instant::now();
    let r2 = late
        .read_lock("quit")
        .wait_timeout(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a reader once the writer's ticket lapsed");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_millis(2_000), "{waited:?}");
    assert_eq!(reader.status("quit").await.unwrap().waiters, Some(0));
    assert!(r2.release().await.unwrap().was_held());
    assert!(r.release().await.unwrap().was_held());
}

/// The waiters' markers on the server: shared advisory locks on two int4 keys, the first with
/// its top bit set (see the engine's `marker` module).
fn markers(pg: &Postgres) -> usize {
    pg.psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND granted AND classid >= 2147483648",
    )
    .parse()
    .expect("a count")
}

/// An attempt on a session whose timeout and label are already what it would set sends the
/// fast statement, which probes the waiters' marker instead of reading their tickets: it does
/// not pass a waiting writer either. Once nobody waits, no marker is left and it gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_session_does_not_pass_a_waiting_writer() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let reader = client(&url).await;
    let r = reader
        .read_lock("warm")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    // A reader's session that has taken a lease already: its settings are known.
    let late = client(&url).await;
    let g = late.read_lock("warm").try_acquire().await.unwrap().unwrap();
    assert!(g.release().await.unwrap().was_held());
    let writer = client(&url).await;
    let w = tokio::spawn(async move {
        let g = writer.lock("warm").acquire().await.expect("the writer");
        assert!(g.release().await.unwrap().was_held());
    });
    let t0 = std::time::Instant::now();
    while reader.status("warm").await.unwrap().waiters != Some(1) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the writer never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(markers(&pg), 1, "the waiting writer's marker");
    // Without the marker's probe (or the tickets' check behind it) it shares the reader's hold.
    assert!(
        late.read_lock("warm")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a reader passed a waiting writer"
    );
    assert!(r.release().await.unwrap().was_held());
    w.await.unwrap();
    assert_eq!(markers(&pg), 0, "a marker outlived its ticket");
    let g = late.read_lock("warm").try_acquire().await.unwrap();
    assert!(g.expect("nobody waits").release().await.unwrap().was_held());
}
