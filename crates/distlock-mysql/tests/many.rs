//! Several names at once on a real MariaDB server: the lease is its connection's.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, Released};
use distlock_mysql::{MysqlBackend, lock_name};
use distlock_testkit::MariaDb;

async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = MysqlBackend::connect(url).await.expect("connect");
    distlock_testkit::client_of(backend, ttl, None)
}

/// Every name of a multi-name lease is on one connection; killing it loses the lease at its
/// next renewal, and frees every name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_loses_a_multi_name_lease_and_frees_every_name() {
    let Some(db) = MariaDb::start() else { return };
    let url = db.url("");
    let ttl = Duration::from_secs(3);
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
    let holder = |name: &str| db.sql(&format!("SELECT IS_USED_LOCK('{}')", lock_name(name)));
    let ids: Vec<String> = names.iter().map(|n| holder(n)).collect();
    assert_ne!(ids[0], "NULL", "held");
    assert!(ids.iter().all(|i| *i == ids[0]), "one connection: {ids:?}");
    let t0 = Instant::now();
    db.sql(&format!("KILL {}", ids[0]));
    // KILL returns before the killed connection has ended and let its locks go.
    for name in names {
        while holder(name) != "NULL" {
            assert!(t0.elapsed() < Duration::from_secs(5), "{name} stayed taken");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost at the next renewal");
    assert!(t0.elapsed() < ttl, "lost at a renewal, not at the TTL");
    assert!(!g.is_held());
    assert!(matches!(g.release().await, Ok(Released::Lost(_)) | Err(_)));
    for name in names {
        let x = b.try_acquire(name).await.unwrap().expect("freed");
        assert_eq!(x.release().await.unwrap(), Released::Held);
    }
    let again = b
        .lock_many(names)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert_eq!(again.release().await.unwrap(), Released::Held);
}

/// A resent attempt (the same token) finds the names its first send took, with their fences;
/// a busy attempt leaves nothing taken; status names the holder of every name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_finds_its_names_and_a_busy_attempt_keeps_nothing() {
    use std::sync::Arc;

    use distlock_core::engine::{
        AcquireMany, AcquireMode, Backend, Clock, LeaseCheck, ManyAttempt, Token,
    };

    let Some(db) = MariaDb::start() else { return };
    for url in [db.url(""), db.url("?fence=counter")] {
        let backend = MysqlBackend::connect(&url).await.expect("connect");
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
        assert_eq!(
            db.sql(&format!("SELECT IS_USED_LOCK('{}')", lock_name("resend-0"))),
            "NULL",
            "rolled back"
        );
        let c = client(&url, ttl).await;
        let st = c.status("resend-b").await.unwrap();
        assert!(st.held, "{st:?}");
        assert!(
            st.owner.as_deref().is_some_and(|o| o.starts_with("me")),
            "{st:?}"
        );
        assert_eq!(
            multi.release_all(&names, &token).await.unwrap(),
            LeaseCheck::Ours
        );
        assert!(!c.status("resend-b").await.unwrap().held);
        assert_eq!(
            multi.release_all(&names, &token).await.unwrap(),
            LeaseCheck::Missing
        );
    }
}

/// Thousands of names in one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_names_are_one_round_trip() {
    let Some(db) = MariaDb::start() else { return };
    for url in [db.url(""), db.url("?fence=counter")] {
        let a = client(&url, Duration::from_secs(30)).await;
        let names: Vec<String> = (0..3000).map(|i| format!("bulk-{i}")).collect();
        let t0 = Instant::now();
        let g = a
            .lock_many(names.clone())
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert_eq!(g.fences().len(), 3000);
        assert!(g.fences().iter().all(Option::is_some));
        let id = db.sql(&format!(
            "SELECT IS_USED_LOCK('{}')",
            lock_name("bulk-2999")
        ));
        assert_ne!(id, "NULL");
        assert_eq!(g.release().await.unwrap(), Released::Held);
        let id = db.sql(&format!(
            "SELECT IS_USED_LOCK('{}')",
            lock_name("bulk-2999")
        ));
        assert_eq!(id, "NULL");
    }
}
