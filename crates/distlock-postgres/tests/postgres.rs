//! PostgreSQL-specific behaviour on a real server: a terminated session, credentials and
//! privileges, bad input.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, LockOptions, LostReason, Released};
use distlock_postgres::{FencedUpdate, PgBackend, lock_id, tokio_postgres};
use distlock_testkit::{PG_PASSWORD_USER, Postgres};

async fn client(url: &str, ttl: Duration) -> LockClient<PgBackend> {
    let backend = PgBackend::connect(url).await.expect("connect");
    LockClient::builder(backend)
        .options(
            LockOptions::builder()
                .ttl(ttl)
                .wait_timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .build()
}

/// The pid of the session holding the advisory lock of `name`.
fn holder_pid(pg: &Postgres, name: &str) -> Option<i32> {
    let id = lock_id(name);
    let pid = pg.psql(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
         AND classid = (({id}::bigint >> 32) & 4294967295)::oid \
         AND objid = ({id}::bigint & 4294967295)::oid"
    ));
    pid.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_fires_the_lost_signal_at_once() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let ttl = Duration::from_secs(30);
    let a = client(&url, ttl).await;
    let b = client(&url, ttl).await;
    let g = a.acquire("terminated").await.unwrap();
    let pid = holder_pid(&pg, "terminated").expect("a session holds it");
    let t0 = Instant::now();
    assert_eq!(pg.psql(&format!("SELECT pg_terminate_backend({pid})")), "t");
    let why = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the lost signal fires long before the TTL");
    assert_eq!(why, LostReason::Stolen);
    assert!(!g.is_held());
    assert!(t0.elapsed() < Duration::from_secs(2));
    // Free at once for the others, with a higher fence.
    let g2 = b.try_acquire("terminated").await.unwrap().expect("free");
    assert!(g2.fence() > g.fence());
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_privileges_are_checked() {
    let Some(pg) = Postgres::start() else { return };
    let (user, pw) = PG_PASSWORD_USER;
    let port = pg.port();
    let wrong = format!("postgres://{user}:wrong@127.0.0.1:{port}/postgres");
    let e = PgBackend::connect(&wrong)
        .await
        .expect_err("wrong password");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    // The server's own words, not tokio-postgres's "db error".
    assert!(
        e.to_string().contains(&format!(
            "password authentication failed for user \"{user}\""
        )),
        "{e}"
    );
    assert!(!e.to_string().contains("wrong@"), "{e}");
    let right = format!("postgres://{user}:{pw}@127.0.0.1:{port}/postgres");
    // The role may not create the engine's objects in public (PostgreSQL 15's default).
    let e = PgBackend::connect(&right)
        .await
        .expect_err("no CREATE on public");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(
        e.to_string()
            .contains("permission denied for schema public"),
        "{e}"
    );
    let e = PgBackend::connect(&format!("postgres://postgres@127.0.0.1:{port}/nosuchdb"))
        .await
        .expect_err("no such database");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(
        e.to_string()
            .contains("database \"nosuchdb\" does not exist"),
        "{e}"
    );
    // Once an administrator made them and granted their use, it takes locks.
    drop(PgBackend::connect(&pg.url("")).await.unwrap());
    pg.psql(&format!("GRANT USAGE ON SEQUENCE distlock_fence TO {user}"));
    let c = client(&right, Duration::from_secs(5)).await;
    let g = c.acquire("granted").await.unwrap();
    assert!(g.fence().is_some());
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers_are_clear_errors() {
    for bad in ["postgres://", "postgres://h?schema=a;b", "mysql://h"] {
        let e = PgBackend::connect(bad).await.expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
    }
    let port = distlock_testkit::free_port();
    let t0 = Instant::now();
    let e = PgBackend::connect(&format!("postgres://127.0.0.1:{port}/x?connect_timeout=1"))
        .await
        .expect_err("nobody listens");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_holder_and_its_remaining_lease() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let a = client(&url, Duration::from_secs(10)).await;
    let g = a.acquire("shown").await.unwrap();
    let st = a.status("shown").await.unwrap();
    assert!(st.held);
    assert_eq!(st.fence, g.fence());
    assert!(st.owner.unwrap().contains(a.owner()));
    let ttl = st.ttl.expect("remaining lease");
    assert!(
        ttl <= Duration::from_secs(10) && ttl > Duration::from_secs(8),
        "{ttl:?}"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    assert!(!a.status("shown").await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_scoped_locks_end_with_their_transaction() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    let a = PgBackend::connect(&url).await.unwrap();
    let b = PgBackend::connect(&url).await.unwrap();
    pg.psql("CREATE TABLE ledger (id int PRIMARY KEY, n int NOT NULL)");
    pg.psql("INSERT INTO ledger VALUES (1, 0)");

    // Held by one transaction: the other cannot take it, nor a session lock of the same name.
    let x = a.xact_lock("ledger", None).await.unwrap().expect("free");
    assert!(b.xact_lock("ledger", None).await.unwrap().is_none());
    let sessions = LockClient::new(b.clone());
    assert!(sessions.try_acquire("ledger").await.unwrap().is_none());
    let t0 = Instant::now();
    let e = b
        .xact_lock("ledger", Some(Duration::from_millis(200)))
        .await
        .expect_err("still taken");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(150));

    // The work commits with the release.
    x.client()
        .execute("UPDATE ledger SET n = n + 1 WHERE id = 1", &[])
        .await
        .unwrap();
    let first = x.fence();
    x.commit().await.unwrap();
    assert_eq!(pg.psql("SELECT n FROM ledger"), "1");

    // A waiter takes it the moment it is free, with a higher fence.
    let y = b
        .xact_lock("ledger", Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("free");
    assert!(y.fence() > first);
    y.client()
        .execute("UPDATE ledger SET n = n + 10 WHERE id = 1", &[])
        .await
        .unwrap();
    // Dropped without commit: rolled back, and free again.
    drop(y);
    let z = tokio::time::timeout(
        Duration::from_secs(5),
        a.xact_lock("ledger", Some(Duration::from_secs(5))),
    )
    .await
    .expect("freed by the dropped transaction")
    .unwrap()
    .expect("free");
    assert_eq!(
        pg.psql("SELECT n FROM ledger"),
        "1",
        "the dropped work rolled back"
    );
    z.rollback().await.unwrap();
}

/// The old holder pauses past its TTL (the server ends its silent session), a new holder writes
/// the row, and the old holder's late write is refused by the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_s_fenced_write_is_refused() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    pg.psql(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, \
         fence bigint NOT NULL DEFAULT 0); INSERT INTO accounts (id, balance) VALUES (7, 100)",
    );
    let update = FencedUpdate::new("accounts", "id", "fence", "balance = $3").unwrap();
    let (rows, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);

    let ttl = Duration::from_millis(300);
    let old = LockClient::builder(PgBackend::connect(&url).await.unwrap())
        .options(
            LockOptions::builder()
                .ttl(ttl)
                .auto_renew(false)
                .build()
                .unwrap(),
        )
        .build();
    let new = client(&url, Duration::from_secs(10)).await;
    let g1 = old.acquire("account-7").await.unwrap();
    let f1 = g1.fence().unwrap();
    assert!(update.run(&rows, &7i32, f1, &[&110i32]).await.unwrap());
    // The old holder goes quiet past its TTL: the server ends its session.
    tokio::time::sleep(ttl * 2).await;
    let g2 = new
        .acquire("account-7")
        .await
        .expect("the silent session ended");
    let f2 = g2.fence().unwrap();
    assert!(f2 > f1);
    assert!(update.run(&rows, &7i32, f2, &[&120i32]).await.unwrap());
    // The old holder wakes up and writes: refused.
    assert!(!update.run(&rows, &7i32, f1, &[&999i32]).await.unwrap());
    assert_eq!(
        pg.psql("SELECT balance, fence FROM accounts"),
        format!("120|{f2}")
    );
    // The same holder may write again; no row, no write.
    assert!(update.run(&rows, &7i32, f2, &[&130i32]).await.unwrap());
    assert!(!update.run(&rows, &8i32, f2, &[&1i32]).await.unwrap());
    assert!(matches!(g1.release().await.unwrap(), Released::Lost(_)));
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

/// The optimistic alternative (docs/fencing.md): no lock, a version column, and a retry when
/// the conditional update finds the version moved. 4 writers × 25 increments lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_version_column_loses_no_update() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url("");
    pg.psql(
        "CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL, version bigint NOT NULL); \
         INSERT INTO counters VALUES (1, 0, 0)",
    );
    let mut writers = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        writers.push(tokio::spawn(async move {
            let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut retries = 0u32;
            for _ in 0..25 {
                loop {
                    let row = db
                        .query_one("SELECT n, version FROM counters WHERE id = 1", &[])
                        .await
                        .unwrap();
                    let (n, version): (i32, i64) = (row.get(0), row.get(1));
                    tokio::task::yield_now().await;
                    let written = db
                        .execute(
                            "UPDATE counters SET n = $1, version = version + 1 \
                             WHERE id = 1 AND version = $2",
                            &[&(n + 1), &version],
                        )
                        .await
                        .unwrap();
                    if written == 1 {
                        break;
                    }
                    retries += 1;
                }
            }
            retries
        }));
    }
    let mut retries = 0;
    for w in writers {
        retries += w.await.unwrap();
    }
    assert_eq!(pg.psql("SELECT n, version FROM counters"), "100|100");
    eprintln!("optimistic writers retried {retries} times");
}
