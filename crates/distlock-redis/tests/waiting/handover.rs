//! Hand-over to the queued client, on a real redis-server: a release hands the lock to the
//! client queued first (turns alternate between clients, the lock is never free between them,
//! grants late or to a client nobody of which waits are not lost), and tasks and processes
//! contending hold it one at a time.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_core::{LockClient, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

use super::common::{client, event_only, redis, spawn_acquire, ttl};

/// Child processes of the contention test run this binary again with this test selected.
const WORKER_ENV: &str = "DISTLOCK_TEST_CONTENDER";

/// One round of the protected critical section. Returns an error string on a violation.
async fn critical_section(
    conn: &mut redis::aio::MultiplexedConnection,
    fence: u64,
) -> Result<(), String> {
    let inside: i64 = redis::cmd("INCR")
        .arg("test:inside")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    // The fenced write of the protected resource: accepted only with a fence above every one
    // seen before.
    let accepted: i64 = redis::Script::new(
        "local m = tonumber(redis.call('GET', KEYS[1]) or '0') \
         if tonumber(ARGV[1]) > m then redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0",
    )
    .key("test:max_fence")
    .arg(fence)
    .invoke_async(conn)
    .await
    .map_err(|e| e.to_string())?;
    let n: i64 = redis::cmd("GET")
        .arg("test:counter")
        .query_async::<Option<i64>>(conn)
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    tokio::task::yield_now().await;
    let _: () = redis::cmd("SET")
        .arg("test:counter")
        .arg(n + 1)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let _: i64 = redis::cmd("DECR")
        .arg("test:inside")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    if inside != 1 {
        return Err(format!("{inside} holders at once"));
    }
    if accepted != 1 {
        return Err(format!("fence {fence} was not above the last one"));
    }
    Ok(())
}

async fn contend(url: &str, tasks: usize, rounds: usize) -> Result<usize, String> {
    let backend = RedisBackend::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let c = LockClient::builder(backend)
        .options(ttl(10_000).build().unwrap())
        .build();
    let redis = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let c = c.clone();
        let mut conn = redis
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = c.acquire("contended").await.map_err(|e| e.to_string())?;
                let fence = g.fence().ok_or("no fence")?;
                critical_section(&mut conn, fence).await?;
                match g.release().await.map_err(|e| e.to_string())? {
                    Released::Held => {}
                    lost => return Err(format!("lease lost during the section: {lost:?}")),
                }
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(tasks * rounds)
}

/// Not a test on its own: the body of the child processes of
/// `tasks_and_processes_contend_with_one_holder_at_a_time` (does nothing unless started by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contender_process_entry() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    match contend(&url, 25, 3).await {
        Ok(n) => println!("\nCONTENDER-OK {n}"),
        Err(e) => println!("\nCONTENDER-FAIL {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_processes_contend_with_one_holder_at_a_time() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args([
                    "--exact",
                    "handover::contender_process_entry",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WORKER_ENV, &url)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn a contender")
        })
        .collect();
    let here = contend(&url, 100, 3).await.expect("this process");
    let mut total = here as u64;
    for child in children {
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("a contender hung")
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("CONTENDER-OK "))
            .unwrap_or_else(|| panic!("contender failed: {text}"))
            .parse()
            .unwrap();
        total += n;
    }
    assert_eq!(total, 300 + 4 * 75);
    assert_eq!(server.cli(&["GET", "test:counter"]), total.to_string());
    assert_eq!(server.cli(&["GET", "test:inside"]), "0");
    // Every acquisition got a new fence: the last one is the count of acquisitions.
    // Fences only grow (a busy first attempt uses a number up, so there are gaps).
    let max: u64 = server.cli(&["GET", "test:max_fence"]).parse().unwrap();
    assert!(max >= total, "{max} < {total}");
}

/// Two clients, three tasks each, take one key in a loop: a release hands the lock to the
/// other client (the one queued first), and the releasing client's own tasks queue behind it.
/// So turns alternate between the clients, instead of one client's tasks passing the lock
/// among themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_take_turns_between_waiting_clients() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = ttl(10_000).build().unwrap();
    let clients = [client(&server, opts).await, client(&server, opts).await];
    // Warm-up: each client waits once while the other holds, so both listen on their wake
    // channels before turns are counted. (Until a client listens, a release cannot hand it the
    // lock, and the other client's tasks pass the lock among themselves: under a loaded CI
    // machine, setting up the pub/sub connection took long enough to skew the count.)
    for (holder, waiter) in [(0, 1), (1, 0)] {
        let g = clients[holder].acquire("turns").await.unwrap();
        let c = clients[waiter].clone();
        let w = tokio::spawn(async move { c.acquire("turns").await.unwrap().release().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(g.release().await.unwrap(), Released::Held);
        assert_eq!(w.await.unwrap().unwrap(), Released::Held);
    }
    let sent_before: u64 = clients.iter().map(|c| redis(c).commands_sent()).sum();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for (who, c) in clients.iter().enumerate() {
        for _ in 0..3 {
            let c = c.clone();
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < stop {
                    let g = c.acquire("turns").await.unwrap();
                    log.lock().unwrap().push(who);
                    assert_eq!(g.release().await.unwrap(), Released::Held);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    assert!(log.len() >= 100, "only {} acquisitions", log.len());
    let repeats = log.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(
        repeats * 20 <= log.len(),
        "{repeats} of {} turns stayed with the same client: {:?}",
        log.len(),
        &log[..log.len().min(300)]
    );
    let first = log.iter().filter(|w| **w == 0).count();
    let second = log.len() - first;
    assert!(
        first.abs_diff(second) * 10 <= log.len(),
        "{first} vs {second}"
    );
    // One write per turn: the release (a PING, so that Redis tells the waiter before it answers
    // the releasing client, then the script), which hands the lock to the other client and
    // queues the releasing one again. The client handed the lock takes it without asking, and
    // the releasing client's next task neither races its release nor asks while the lock is
    // with the other client.
    let sent: u64 = clients
        .iter()
        .map(|c| redis(c).commands_sent())
        .sum::<u64>()
        - sent_before;
    assert!(
        sent as f64 <= 2.2 * log.len() as f64,
        "{sent} commands for {} acquisitions",
        log.len()
    );
}

/// A release hands the lock straight to the queued client: there is no moment when the key is
/// free (a plain `SET NX` right after the release fails), the lock holds the waiter's token,
/// a higher fence, and the waiter takes it without sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_queued_client() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = event_only(10);
    let holder = client(&server, opts).await;
    let waiter = client(&server, opts).await;
    let key = redis(&holder).lock_key("grant");
    let g = holder.acquire("grant").await.unwrap();
    let w = spawn_acquire(&waiter, "grant");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.cli(&["LLEN", &format!("{key}:waiters")]),
        "1",
        "the waiter is queued"
    );
    let sent_before = redis(&waiter).commands_sent();
    let first_fence = g.fence().unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let value = server.cli(&["GET", &key]);
    assert_eq!(
        server.cli(&["SET", &key, "intruder", "NX", "PX", "30000"]),
        "",
        "the lock was free for a plain client right after the release"
    );
    let got = tokio::time::timeout(Duration::from_secs(2), w)
        .await
        .expect("the handed lock was taken")
        .unwrap();
    assert!(value.starts_with(got.token().as_str()), "{value:?}");
    assert!(got.fence().unwrap() > first_fence, "{:?}", got.fence());
    assert_eq!(
        redis(&waiter).commands_sent(),
        sent_before,
        "the waiter asked again"
    );
    let pttl: i64 = server.cli(&["PTTL", &key]).parse().unwrap();
    assert!(pttl > 25_000, "written with the waiter's TTL: {pttl}");
    assert_eq!(got.release().await.unwrap(), Released::Held);
    assert_eq!(server.cli(&["EXISTS", &key]), "0");
}

/// Fresh clients start contending at once, round after round: the start-up is when a client's
/// registrations pile up (it queues before it hears its first grant), and a release can hand
/// the lock to a registration whose token already took and released it. That grant must be
/// taken over by the client's next task, not dropped: a dropped one left the lock with nobody
/// until its TTL ran out (here 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hand_over_leaves_the_lock_with_nobody() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = ttl(3_000).build().unwrap();
    let mut worst = Duration::ZERO;
    for round in 0..30 {
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(client(&server, opts).await);
        }
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let start = Instant::now() + Duration::from_millis(20);
        let stop = start + Duration::from_millis(200);
        let mut tasks = Vec::new();
        for c in &clients {
            for _ in 0..2 {
                let c = c.clone();
                let spans = spans.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(start.into()).await;
                    while Instant::now() < stop {
                        let g = c.acquire("startup").await.unwrap();
                        let got = Instant::now();
                        let fence = g.fence().unwrap();
                        let released = Instant::now();
                        assert_eq!(g.release().await.unwrap(), Released::Held);
                        spans.lock().unwrap().push((fence, got, released));
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut spans = spans.lock().unwrap().clone();
        spans.sort_by_key(|s| s.0);
        for w in spans.windows(2) {
            let gap = w[1].1.saturating_duration_since(w[0].2);
            if gap > worst {
                worst = gap;
            }
            assert!(
                gap < Duration::from_secs(1),
                "round {round}: the lock sat free for {gap:?} between fences {} and {}",
                w[0].0,
                w[1].0
            );
        }
    }
    eprintln!("longest hand-over in 30 rounds: {worst:?}");
}

/// While a client's subscription lingers (nobody of it waits), a release hands the lock to a
/// registration of that client it did not know about: the client passes the lock on to the
/// next waiter at once, instead of leaving it with nobody until the grant's TTL runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_client_nobody_of_which_waits_is_passed_on() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = event_only(20);
    let a = client(&server, opts).await;
    let b = client(&server, opts).await;
    let c = client(&server, opts).await;
    let key = redis(&a).lock_key("stray");
    let queue = format!("{key}:waiters");
    // B waits once, gets the lock and releases it: its subscription now lingers.
    let g = a.acquire("stray").await.unwrap();
    let w = spawn_acquire(&b, "stray");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let gb = w.await.unwrap();
    assert_eq!(gb.release().await.unwrap(), Released::Held);
    // A holds again, and C waits.
    let g = a.acquire("stray").await.unwrap();
    let w = spawn_acquire(&c, "stray");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.cli(&["LLEN", &queue]), "1", "C is queued");
    // A registration of B's at the head of the queue (say, from a request whose reply was
    // lost), with a 20 s TTL.
    let ghost = format!("{} 20000 999 ghosttoken b/0", redis(&b).wake_channel());
    server.cli(&["LPUSH", &queue, &ghost]);
    let released = Instant::now();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let gc = tokio::time::timeout(Duration::from_secs(3), w)
        .await
        .expect("the lock was left with B's ghost registration")
        .unwrap();
    // (B's subscription lingers for about a second: passing the lock on only when it ends
    // would be too late.)
    assert!(
        released.elapsed() < Duration::from_millis(300),
        "C got the lock {:?} after the release",
        released.elapsed()
    );
    assert!(server.cli(&["GET", &key]).starts_with(gc.token().as_str()));
    assert_eq!(gc.release().await.unwrap(), Released::Held);
}

/// A release hands the lock to a waiter's registration, but its message is late: the waiter's
/// next attempt finds the lock already its own and takes it. When the message then comes, the
/// waiter's wait is over (and its subscription gone or lingering): the message must not pass
/// on the lock a task of this client now holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_of_a_lock_already_taken_does_not_pass_it_on() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = event_only(20);
    let a = client(&server, opts).await;
    // Without the local queue, a waiter's subscription goes as soon as it has the lock.
    let b = LockClient::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .options(opts)
        .local_queue(false)
        .build();
    let key = redis(&a).lock_key("late");
    let queue = format!("{key}:waiters");
    let g = a.acquire("late").await.unwrap();
    let w = spawn_acquire(&b, "late");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // B's registration: `<wake channel> <ttl> <seq> <token> <owner>`.
    let reg = server.cli(&["LINDEX", &queue, "0"]);
    let parts: Vec<&str> = reg.split(' ').collect();
    assert_eq!(parts.len(), 5, "{reg:?}");
    let (channel, seq, token) = (parts[0], parts[2], parts[3]);
    assert_eq!(channel, redis(&b).wake_channel());
    // What a release does when it hands the lock over, except the message.
    let fence = server.cli(&[
        "EVAL",
        "redis.call('LPOP', KEYS[2]) \
         local f = redis.call('HINCRBY', KEYS[3], 'fence', 1) \
         redis.call('SET', KEYS[1], ARGV[1] .. ' 0 b', 'PX', 30000) \
         redis.call('HSET', KEYS[3], 'token', ARGV[1], 'holder_fence', f) \
         return f",
        "3",
        &key,
        &queue,
        &format!("{key}:meta"),
        token,
    ]);
    std::mem::forget(g);
    // Wake B without the grant ("try again"): it finds the lock its own and takes it.
    assert_eq!(server.cli(&["PUBLISH", channel, &key]), "1");
    let gb = tokio::time::timeout(Duration::from_secs(3), w)
        .await
        .expect("B took the lock")
        .unwrap();
    assert_eq!(gb.token().as_str(), token);
    assert_eq!(gb.fence(), Some(fence.parse().unwrap()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The grant's message, late.
    let grant = format!("\t{fence} {seq} {token} {key}");
    assert_eq!(server.cli(&["PUBLISH", channel, &grant]), "1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        server.cli(&["GET", &key]).starts_with(token),
        "the late message gave B's lock away"
    );
    assert_eq!(gb.release().await.unwrap(), Released::Held);
}

/// The release script checks the registration the client believes queued: one that has left
/// the queue (served, its message not yet read by the client) must not keep the client's
/// waiting tasks out of it. One that is there keeps its place.
#[test]
fn a_release_queues_our_tasks_again_when_the_registration_we_believe_in_has_left() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = redis::Client::open(server.url()).unwrap();
    // Another client, listening: the release hands the lock to it.
    let mut listener = redis.get_connection().unwrap();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("their-chan").unwrap();
    let mut con = redis.get_connection().unwrap();
    let keys = ["l:{k}", "l:{k}:meta", "l:{k}:waiters"];
    let theirs = "their-chan 10000 1 their-tok them";
    let believed = "our-chan 10000 1 old-tok us";
    let mine = "our-chan 10000 2 next-tok us";
    let mut release = |queue: &[&str]| -> (i64, Vec<String>) {
        let _: () = redis::cmd("DEL").arg(&keys[..]).query(&mut con).unwrap();
        let _: () = redis::cmd("SET")
            .arg(keys[0])
            .arg("our-tok 0 us")
            .query(&mut con)
            .unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg(keys[2])
            .arg(queue)
            .query(&mut con)
            .unwrap();
        let n: i64 = redis::Script::new(distlock_redis::release_script())
            .key(&keys[..])
            .arg("our-tok")
            .arg(0)
            .arg(mine)
            .arg(believed)
            .arg("our-chan")
            .invoke(&mut con)
            .unwrap();
        let left: Vec<String> = redis::cmd("LRANGE")
            .arg(keys[2])
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        (n, left)
    };
    // Our registration has gone: the next one is queued (3).
    assert_eq!(release(&[theirs]), (3, vec![mine.to_owned()]));
    // It is there: it keeps its place, nothing is added (2).
    assert_eq!(release(&[theirs, believed]), (2, vec![believed.to_owned()]));
}
