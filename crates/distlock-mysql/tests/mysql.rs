//! MySQL/MariaDB-specific behaviour on a real server: a killed connection, credentials, bad
//! input.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, LostReason, Released};
use distlock_mysql::{MysqlBackend, lock_name};
use distlock_testkit::{MARIADB_PASSWORD_USER, MariaDb};

async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = MysqlBackend::connect(url).await.expect("connect");
    distlock_testkit::client_of(backend, ttl, None)
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
    // MariaDB's fences come from a cached sequence: status bounds the holder's.
    assert!(st.held && st.last_fence >= g.fence(), "{st:?}");
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

/// The connection holding each of `many-0` … `many-{n-1}`, by name (MariaDB's sequence tables).
fn holders(db: &MariaDb, n: usize) -> HashMap<String, i64> {
    let out = db.sql(&format!(
        "SELECT seq, IS_USED_LOCK(CONCAT('dl:many-', seq)) FROM distlock.seq_0_to_{}",
        n - 1
    ));
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let i = w.next()?;
            let id = w.next()?.parse().ok()?;
            Some((format!("many-{i}"), id))
        })
        .collect()
}

/// The connections open from clients, not counting the one asking.
fn client_connections(db: &MariaDb) -> usize {
    db.sql(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' AND USER <> 'system user'",
    )
    .parse()
    .unwrap()
}

/// 1,000 locks on one client share a few connections; killing one of them loses exactly the
/// locks on it (at its next renewal), and every other lock stays held and renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_locks_share_a_few_sessions_and_a_killed_one_loses_exactly_its_own() {
    let Some(db) = MariaDb::start() else { return };
    let ttl = Duration::from_secs(3);
    let a = client(&db.url("?sessions=4"), ttl).await;
    let names: Vec<String> = (0..1000).map(|i| format!("many-{i}")).collect();
    let mut guards = Vec::new();
    for chunk in names.chunks(50) {
        let taken = futures_util::future::join_all(chunk.iter().map(|n| a.acquire(n))).await;
        guards.extend(taken.into_iter().map(|g| g.expect("free")));
    }
    let connections = client_connections(&db);
    assert!(
        (2..=4).contains(&connections),
        "4 sessions at most, not one per lock: {connections}"
    );
    let held = holders(&db, 1000);
    assert_eq!(held.len(), 1000);
    let ids: HashSet<i64> = held.values().copied().collect();
    assert!(ids.len() >= 2, "spread over sessions: {ids:?}");
    let victim = held["many-0"];
    let on_victim: HashSet<&str> = held
        .iter()
        .filter(|(_, id)| **id == victim)
        .map(|(n, _)| n.as_str())
        .collect();
    db.sql(&format!("KILL {victim}"));
    // Heard at the session's next statement (a renewal, a third of the TTL).
    for g in guards.iter().filter(|g| on_victim.contains(g.key())) {
        let why = tokio::time::timeout(ttl, g.lost()).await.expect("lost");
        assert_ne!(why, LostReason::Expired, "{why:?}");
    }
    tokio::time::sleep(ttl * 3).await;
    for g in &guards {
        assert_eq!(
            g.is_held(),
            !on_victim.contains(g.key()),
            "{}: only the victim's locks are lost",
            g.key()
        );
    }
    let still = holders(&db, 1000);
    assert_eq!(still.len(), 1000 - on_victim.len());
    assert!(still.keys().all(|n| !on_victim.contains(n.as_str())));
    for g in guards {
        let lost = on_victim.contains(g.key());
        assert_eq!(
            matches!(g.release().await.unwrap(), Released::Lost(_)),
            lost
        );
    }
    assert!(holders(&db, 1000).is_empty());
}

/// A name the pool is taking on its only session cannot go on another: the request waits for
/// room, and fails with a clear error when none comes in time (never a hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_at_its_limit_waits_then_fails_clearly() {
    let Some(db) = MariaDb::start() else { return };
    let backend = MysqlBackend::connect(&db.url("?sessions=1&pool_wait=300ms"))
        .await
        .unwrap();
    let a = LockClient::new(backend.clone());
    let b = LockClient::new(backend.clone());
    // Lock the fence sequence from elsewhere: the next acquire stays in flight.
    use mysql_async::prelude::Queryable;
    let mut admin = mysql_async::Conn::from_url(db.url("")).await.unwrap();
    admin
        .query_drop("LOCK TABLES distlock_fence WRITE")
        .await
        .unwrap();
    let first = tokio::spawn(async move { a.try_acquire("limited").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let e = b
        .try_acquire("limited")
        .await
        .expect_err("no session for it");
    assert_eq!(e.kind(), ErrorKind::Exhausted, "{e}");
    assert!(e.to_string().contains("sessions="), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(250) && t0.elapsed() < Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(500)).await;
    admin.query_drop("UNLOCK TABLES").await.unwrap();
    let g = first.await.unwrap().unwrap().expect("free");
    let t0 = Instant::now();
    assert!(b.try_acquire("limited").await.unwrap().is_none());
    assert!(t0.elapsed() < Duration::from_millis(100));
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let g = b.try_acquire("limited").await.unwrap().expect("free");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// Every connection the server allows is taken (a stampede of `distlock run` processes):
/// an attempt that may not wait says so with `Exhausted`, and one that may wait tries again
/// and takes the lock once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlasts_a_server_out_of_connections() {
    use mysql_async::prelude::Queryable;
    let Some(db) = MariaDb::start() else { return };
    let url = db.url("");
    let waiter = distlock_testkit::client_of(
        MysqlBackend::connect(&url).await.expect("connect"),
        Duration::from_secs(3),
        Some(Duration::from_secs(20)),
    );
    let quick = client(&url, Duration::from_secs(3)).await;
    db.sql("SET GLOBAL max_connections = 4");
    // Every slot taken (the account's extra one for an administrator too). The clients'
    // setup connections close in the background: a slot one frees after the first refusal is
    // taken too (once, under CI's load, `quick` found it and took the lock).
    let (mut fillers, refused) =
        distlock_testkit::fill_every_slot(|| mysql_async::Conn::from_url(url.as_str())).await;
    assert!(
        refused.to_string().contains("Too many connections"),
        "{refused}"
    );
    let free = async move {
        let mut last = fillers.pop().unwrap();
        last.query_drop("SET GLOBAL max_connections = 151")
            .await
            .unwrap();
        drop(last);
        drop(fillers);
    };
    let e = distlock_testkit::a_wait_outlasts_exhaustion(&quick, waiter, "crowded", free).await;
    assert!(e.to_string().contains("Too many connections"), "{e}");
}

/// MariaDB's fences come from a cached sequence, read in the acquiring statement: they keep
/// strictly increasing across a kill -9 and a restart of the server (which loses the cache
/// and skips ahead), and for clients that used the counter table before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_fences_keep_increasing_across_a_crash_and_restart() {
    let Some(mut db) = MariaDb::start() else {
        return;
    };
    // A client of the counter table first: the sequence starts above its fences.
    let old = client(&db.url("?fence=counter"), Duration::from_secs(5)).await;
    let mut last = 0;
    for _ in 0..3 {
        let g = old.acquire("seq").await.unwrap();
        last = g.fence().unwrap();
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    drop(old);
    let mut fences = Vec::new();
    for round in 0..3 {
        let c = client(&db.url(""), Duration::from_secs(5)).await;
        if round == 0 {
            let cache = db.sql("SELECT cache_size FROM distlock.distlock_fence");
            assert_eq!(cache, "1000", "a cached sequence");
        }
        for _ in 0..5 {
            let g = c.acquire("seq").await.unwrap();
            let f = g.fence().unwrap();
            assert!(f > last, "round {round}: fence {f} after {last}");
            last = f;
            // status: the holder, and an upper bound of its fence.
            let st = c.status("seq").await.unwrap();
            assert!(st.held && st.fence.is_none(), "{st:?}");
            assert!(st.last_fence >= Some(f), "{st:?}");
            assert!(st.owner.unwrap().contains(c.owner()));
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }
        fences.push(last);
        drop(c);
        // kill -9, and the same data again.
        db.restart();
    }
    eprintln!("last fence of each round: {fences:?}");
    // A killed server forgets the cached block: the next round skips ahead.
    assert!(fences[1] > fences[0] + 5);
}

/// A renewal that times out (the server paused) ends the session for the client, but the
/// connection stays open until the lease would have run out: closing it at once would free the
/// lock on the server, and the next holder would take it before the first one's deadline
/// (found by the fault harness's mysql scenario).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_times_out_does_not_free_the_lock_before_its_deadline() {
    let Some(db) = MariaDb::start() else { return };
    let ttl = Duration::from_secs(3);
    let a = client(&db.url("?response_timeout=200ms"), ttl).await;
    let b = client(&db.url(""), ttl).await;
    let g = a.try_acquire("paused").await.unwrap().expect("free");
    let taken = Instant::now();
    // The watchdog renews at a third of the TTL: pause the server across that renewal.
    tokio::time::sleep(Duration::from_millis(800)).await;
    db.pause();
    tokio::time::sleep(Duration::from_millis(700)).await;
    db.resume();
    let why = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("the timed-out renewal ends the lease for its holder");
    eprintln!("lost: {why}");
    let got = loop {
        if let Some(g2) = b.try_acquire("paused").await.unwrap() {
            break g2;
        }
        assert!(taken.elapsed() < Duration::from_secs(15), "never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = taken.elapsed();
    assert!(
        after >= ttl - Duration::from_millis(100),
        "the next holder took the lock {after:?} after the first, within its {ttl:?} lease"
    );
    assert_eq!(got.release().await.unwrap(), Released::Held);
}
