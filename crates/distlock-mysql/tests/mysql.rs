//! MySQL/MariaDB-specific behaviour on a real server: a killed connection, credentials, bad
//! input.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, LockOptions, Released};
use distlock_mysql::{MysqlBackend, lock_name};
use distlock_testkit::{MARIADB_PASSWORD_USER, MariaDb};

async fn client(url: &str, ttl: Duration) -> LockClient<MysqlBackend> {
    let backend = MysqlBackend::connect(url).await.expect("connect");
    LockClient::builder(backend)
        .options(LockOptions::builder().ttl(ttl).build().unwrap())
        .build()
}

/// An operator kills the holder's connection: the lock is free at once for the others, and the
/// holder's next renewal (a third of the TTL) reports it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_reported_lost_by_the_next_renewal() {
    let Some(db) = MariaDb::start() else { return };
    let url = db.url("");
    let ttl = Duration::from_secs(3);
    let a = client(&url, ttl).await;
    let b = client(&url, ttl).await;
    let g = a.acquire("killed").await.unwrap();
    let id = db.sql(&format!("SELECT IS_USED_LOCK('{}')", lock_name("killed")));
    db.sql(&format!("KILL {id}"));
    // KILL returns before the killed connection has ended and let its locks go.
    let t0 = Instant::now();
    while db.sql(&format!("SELECT IS_USED_LOCK('{}')", lock_name("killed"))) != "NULL" {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the killed connection kept its lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let g2 = b
        .try_acquire("killed")
        .await
        .unwrap()
        .expect("freed with the connection");
    assert!(g2.fence() > g.fence());
    let t0 = Instant::now();
    tokio::time::timeout(ttl, g.lost())
        .await
        .expect("the renewal finds the lock gone");
    assert!(t0.elapsed() <= ttl / 3 + Duration::from_millis(500));
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_and_bad_input_is_clear() {
    let Some(db) = MariaDb::start() else { return };
    let (user, pw) = MARIADB_PASSWORD_USER;
    let port = db.port();
    let e = MysqlBackend::connect(&format!("mysql://{user}:wrong@127.0.0.1:{port}/distlock"))
        .await
        .expect_err("wrong password");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(e.to_string().contains("Access denied for user"), "{e}");
    assert!(!e.to_string().contains("wrong@"), "{e}");
    let e = MysqlBackend::connect(&format!("mysql://{user}:{pw}@127.0.0.1:{port}/mysql"))
        .await
        .expect_err("no rights on that database");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    let c = client(
        &format!("mariadb://{user}:{pw}@127.0.0.1:{port}/distlock"),
        Duration::from_secs(5),
    )
    .await;
    let g = c
        .acquire("it's a name with 'quotes' and spaces")
        .await
        .unwrap();
    assert!(g.fence().is_some());
    let st = c
        .status("it's a name with 'quotes' and spaces")
        .await
        .unwrap();
    assert!(st.held && st.fence == g.fence());
    assert_eq!(g.release().await.unwrap(), Released::Held);

    let free = distlock_testkit::free_port();
    let t0 = Instant::now();
    let e = MysqlBackend::connect(&format!("mysql://root@127.0.0.1:{free}/distlock"))
        .await
        .expect_err("nobody listens");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    let e = MysqlBackend::connect(&format!("mysql://root@127.0.0.1:{port}/nosuchdb"))
        .await
        .expect_err("unknown database");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("Unknown database 'nosuchdb'"), "{e}");
}
