//! Several names at once on a real PostgreSQL server: the lease is its session's.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, Released};
use distlock_postgres::{PgBackend, lock_id};
use distlock_testkit::Postgres;

async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = PgBackend::connect(url).await.expect("connect");
    distlock_testkit::client_of(backend, ttl, Some(Duration::from_secs(10)))
}

/// The pids of the sessions holding the advisory locks of `names`, one line each.
fn holder_pids(pg: &Postgres, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let id = lock_id(name);
            pg.psql(&format!(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
                 AND granted AND classid = (({id}::bigint >> 32) & 4294967295)::oid \
                 AND objid = ({id}::bigint & 4294967295)::oid"
            ))
        })
        .collect()
}

/// Every name of a multi-name lease is on one session; terminating it loses the lease at its
/// next renewal, and every name is free for others at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_loses_a_multi_name_lease_and_frees_every_name() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let ttl = Duration::from_millis(1500);
    let a = client(&url, ttl).await;
    let b = client(&url, Duration::from_secs(30)).await;
    let names = ["kill-a", "kill-b", "kill-c"];
    let g = a
        .lock_many(names)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    // `list` shows every name (recorded in the background, as a single lock's).
    let t0 = Instant::now();
    loop {
        let listing = b.list("kill-", 10).await.unwrap();
        let listed: Vec<&str> = listing.locks.iter().map(|l| l.name.as_str()).collect();
        if listed == names {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "listed {listed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pids = holder_pids(&pg, &names);
    assert!(!pids[0].is_empty(), "held");
    assert!(pids.iter().all(|p| *p == pids[0]), "one session: {pids:?}");
    assert_eq!(
        pg.psql(&format!("SELECT pg_terminate_backend({})", pids[0])),
        "t"
    );
    for name in names {
        let x = b
            .try_acquire(name)
            .await
            .unwrap()
            .expect("freed by the session's end");
        assert_eq!(x.release().await.unwrap(), Released::Held);
    }
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost at the next renewal");
    assert!(t0.elapsed() < ttl, "lost at a renewal, not at the TTL");
    assert!(!g.is_held());
    assert!(matches!(g.release().await, Ok(Released::Lost(_)) | Err(_)));
    // Nothing was left behind: all the names together again.
    let again = b
        .lock_many(names)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert_eq!(again.release().await.unwrap(), Released::Held);
}

/// A resent attempt (the same token) finds the names its first send took, with their fences;
/// a busy attempt leaves nothing taken; status names the holder of every name; a single-name
/// waiter wakes when the multi-name lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_finds_its_names_and_a_release_wakes_single_waiters() {
    use std::sync::Arc;

    use distlock_core::engine::{AcquireMany, AcquireMode, Backend, Clock, ManyAttempt, Token};

    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let backend = PgBackend::connect(&url).await.expect("connect");
    let multi = backend.multi_lock().expect("the capability");
    let clock: Arc<dyn Clock> = Arc::new(distlock_core::SystemClock);
    let names = ["resend-a", "resend-b"];
    let token = Token::generate();
    let ttl = Duration::from_secs(30);
    let req = AcquireMany::new(&names, &token, ttl, "me", &clock);
    let first = multi.acquire_all(&req).await.unwrap();
    let ManyAttempt::Acquired { fences } = &first else {
        panic!("{first:?}")
    };
    assert!(fences.iter().all(Option::is_some), "{fences:?}");
    let again = multi
        .acquire_all(&req.mode(AcquireMode::Resend { wait: false }))
        .await
        .unwrap();
    assert_eq!(again, first, "the same names and fences");
    // Another token: busy at the first name, and nothing kept.
    let other = Token::generate();
    let busy = multi
        .acquire_all(&AcquireMany::new(
            &["resend-0", "resend-a"],
            &other,
            ttl,
            "you",
            &clock,
        ))
        .await
        .unwrap();
    assert!(
        matches!(busy, ManyAttempt::Busy { name: 1, .. }),
        "{busy:?}"
    );
    assert_eq!(holder_pids(&pg, &["resend-0"]), [""], "rolled back");

    let c = client(&url, ttl).await;
    let st = c.status("resend-b").await.unwrap();
    assert!(st.held, "{st:?}");
    assert_eq!(st.owner.as_deref(), Some("me"));
    // A long back-off: only the release's notification wakes the waiter in time.
    let slow = c
        .default_options()
        .to_builder()
        .backoff(
            distlock_core::Backoff::new(Duration::from_secs(10), Duration::from_secs(20)).unwrap(),
        )
        .wake_fallback(Duration::from_secs(20))
        .build()
        .unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("resend-b").options(slow).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished());
    let released = Instant::now();
    let check = multi.release_all(&names, &token).await.unwrap();
    assert_eq!(check, distlock_core::engine::LeaseCheck::Ours);
    let g = waiter.await.unwrap().expect("taken after the release");
    assert!(
        released.elapsed() < Duration::from_millis(500),
        "woke {:?} after",
        released.elapsed()
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    assert_eq!(
        multi.release_all(&names, &token).await.unwrap(),
        distlock_core::engine::LeaseCheck::Missing
    );
}

/// Thousands of names in one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_names_are_one_statement() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let a = client(&url, Duration::from_secs(30)).await;
    let names: Vec<String> = (0..5000).map(|i| format!("bulk-{i}")).collect();
    let t0 = Instant::now();
    let g = a
        .lock_many(names.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(g.fences().len(), 5000);
    let held = pg.psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
    );
    assert_eq!(held, "5000");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let held = pg.psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
    );
    assert_eq!(held, "0");
}
