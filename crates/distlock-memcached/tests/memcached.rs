//! memcached-specific behaviour on a real server: an eviction loses the lock, and the watchdog
//! says so; no fence; bad input.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, Released};
use distlock_memcached::MemcachedBackend;
use distlock_testkit::Memcached;

async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = MemcachedBackend::connect(url).await.expect("connect");
    distlock_testkit::client_of(backend, ttl, None)
}

/// The seed's first flaw: memcached evicts a lock under memory pressure without a word. The
/// watchdog's next renewal finds it gone and the lost signal fires, while another client has
/// already taken the "free" lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_loses_the_lock_and_the_watchdog_reports_it() {
    let Some(mc) = Memcached::start_with_memory(2) else {
        return;
    };
    let url = mc.url("");
    let ttl = Duration::from_secs(6);
    let a = client(&url, ttl).await;
    let b = client(&url, ttl).await;
    let g = a.acquire("evicted").await.unwrap();
    assert_eq!(g.fence(), None, "memcached gives no fence");
    let before = mc.stat("evictions").unwrap();
    // Junk of every size around the lock item's, so its slab class fills too.
    tokio::task::block_in_place(|| {
        for size in (40..=200).step_by(8) {
            mc.fill(4000, size);
        }
    });
    assert!(
        mc.stat("evictions").unwrap() > before,
        "nothing was evicted"
    );
    // Evicted: another client finds the lock free while the first still believes it holds it.
    let g2 = b
        .try_acquire("evicted")
        .await
        .unwrap()
        .expect("the item is gone");
    assert!(g.is_held(), "nothing has told the first holder yet");
    // Its next renewal (a third of the TTL at the latest) finds the item replaced.
    let t0 = Instant::now();
    let why = tokio::time::timeout(ttl / 2, g.lost())
        .await
        .expect("the watchdog reports the loss");
    assert!(t0.elapsed() <= ttl / 3 + Duration::from_secs(1));
    eprintln!("lost: {why}");
    assert!(!g.is_held());
    // Its release never deletes the new holder's lock.
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    assert!(b.status("evicted").await.unwrap().held);
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_spaced_keys_are_hashed_and_bad_servers_are_clear_errors() {
    let Some(mc) = Memcached::start() else { return };
    let backend = MemcachedBackend::connect(&mc.url("")).await.unwrap();
    assert_eq!(backend.item("orders"), "distlock:orders");
    let long = "k".repeat(1000);
    for name in [long.as_str(), "with space", "tab\there"] {
        let item = backend.item(name);
        assert!(
            item.starts_with("distlock:sha256:") && item.len() == 16 + 64,
            "{item}"
        );
    }
    let c = LockClient::new(backend);
    let g = c.try_acquire("with space").await.unwrap().expect("free");
    assert!(c.try_acquire("with space").await.unwrap().is_none());
    assert_eq!(g.release().await.unwrap(), Released::Held);

    let port = distlock_testkit::free_port();
    let t0 = Instant::now();
    let e = MemcachedBackend::connect(&format!("memcached://127.0.0.1:{port}?connect_timeout=1s"))
        .await
        .expect_err("nobody listens");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// A server that stops answering: the request fails with `Timeout` after the response timeout
/// (the connection keeps one reply deadline, moved before each request), the connection is
/// dropped so that its late reply is never read as another request's, and once the server is
/// back the lock is usable again: the timed-out attempt's item is cleaned up or expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_out_and_its_late_replies_are_not_misread() {
    let Some(mc) = Memcached::start() else { return };
    let c = client(&mc.url("?response_timeout=300ms"), Duration::from_secs(3)).await;
    for _ in 0..50 {
        let g = c.try_acquire("p").await.unwrap().expect("free");
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    mc.pause();
    let t0 = Instant::now();
    let e = c.try_acquire("p").await.expect_err("the server is paused");
    let took = t0.elapsed();
    mc.resume();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let until = Instant::now() + Duration::from_secs(6);
    let g = loop {
        if let Some(g) = c.try_acquire("p").await.unwrap() {
            break g;
        }
        assert!(Instant::now() < until, "the lock never came free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = c.status("p").await.unwrap();
    assert!(status.held, "{status:?}");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    assert!(!c.status("p").await.unwrap().held);
}

/// Ten thousand locks held by one client stay held: their renewals (one request each, as
/// memcached has no batch command) go out as pipelines on the client's connections, not on a
/// connection per lock, which memcached refuses past its limit (1,024 by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_are_renewed_within_the_servers_connections() {
    let Some(mc) = Memcached::start() else { return };
    let c = client(&mc.url(""), Duration::from_secs(3)).await;
    let mut guards = Vec::new();
    for i in 0..10_000 {
        guards.push(c.acquire(&format!("many-{i}")).await.unwrap());
    }
    // Two TTLs: every lock renewed several times.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 10,000 locks lost");
    assert_eq!(
        mc.stat("rejected_connections"),
        Some(0),
        "connections refused to the client's renewals"
    );
    let other = client(&mc.url(""), Duration::from_secs(5)).await;
    assert!(other.try_acquire("many-5678").await.unwrap().is_none());
}

/// A renewal writes the holder's value again as it was (the client keeps its parts, not a copy
/// of it): the label and the time the lock was taken stay what `status` showed.
#[tokio::test]
async fn a_renewal_writes_the_same_holder_value_again() {
    let Some(mc) = Memcached::start() else { return };
    let c = client(&mc.url(""), Duration::from_secs(3)).await;
    let g = c.acquire("same-value").await.unwrap();
    let before = c.status("same-value").await.unwrap();
    assert!(
        before
            .owner
            .as_deref()
            .is_some_and(|o| o.contains(" since "))
    );
    // An explicit renewal, then one of the watchdog's (a third of the TTL).
    g.extend(Duration::from_secs(3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = c.status("same-value").await.unwrap();
    assert!(after.held);
    assert_eq!(before.owner, after.owner);
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// Renewals go out as a pipeline (one write for many). A pipeline with no answer in time is
/// kept with its replies unread; the server carries its renewals out when it is back, which
/// changes each item's CAS, and the next renewal reads those replies first: every lock stays
/// held and is released as ours, not lost as taken by another holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_renewals_given_up_is_read_before_the_next() {
    let Some(mc) = Memcached::start() else { return };
    let c = client(&mc.url("?response_timeout=300ms"), Duration::from_secs(3)).await;
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(c.acquire(&format!("piped-{i}")).await.unwrap());
    }
    // The first renewals (a third of the TTL in) find the server paused, and time out.
    tokio::time::sleep(Duration::from_millis(500)).await;
    mc.pause();
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    mc.resume();
    // Renewed again after the server is back, twice.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 50 locks lost");
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

/// The item's value, read on a connection of our own (`mg <item> v`).
fn raw_value(port: u16, item: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(format!("mg {item} v\r\n").as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(2).filter(|w| *w == b"\r\n").count() < 2 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).expect("text");
    text.split("\r\n").nth(1).expect("a value").to_owned()
}

/// The item's CAS changes behind the client with its value the same (as a renewal given up
/// whose effect came late, its reply never read): the next renewal, the watchdog's pipeline or
/// an `extend`, is refused for its CAS, reads the item, finds our token and renews by the CAS
/// read; a release does the same. The lock is never reported taken by another holder.
#[tokio::test]
async fn a_cas_not_learned_is_read_from_the_item_when_it_still_carries_our_token() {
    let Some(mc) = Memcached::start() else { return };
    let url = mc.url("");
    let c = client(&url, Duration::from_secs(3)).await;
    let g = c.acquire("recas").await.unwrap();
    let item = MemcachedBackend::connect(&url)
        .await
        .expect("connect")
        .item("recas");
    let rewrite = || {
        let value = raw_value(mc.port(), &item);
        let line = format!("ms {item} {} T30\r\n{value}", value.len());
        assert_eq!(mc.command(&line), "HD");
    };
    // The watchdog's next renewal (a third of the TTL), in a pipeline.
    rewrite();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(g.is_held(), "the watchdog's renewal lost the lock");
    // An extend, alone.
    rewrite();
    g.extend(Duration::from_secs(3))
        .await
        .expect("renewed by the CAS read");
    // The release.
    rewrite();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    assert!(!c.status("recas").await.unwrap().held);
}

/// The seconds an item has left, read on the kit's own connection.
fn seconds_left(mc: &Memcached, item: &str) -> i64 {
    let line = mc.command(&format!("mg {item} t"));
    let t = line.split(' ').find_map(|w| w.strip_prefix('t'));
    t.and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no TTL in {line:?}"))
}

/// Several names are added in their order and given back on a busy one (the items added before
/// it are gone from the server); a resend with our token finds its items ours; a renewal
/// touches none of them unless every one is ours; a release deletes only ours.
#[tokio::test]
async fn many_names_are_added_in_order_and_given_back_on_a_busy_one() {
    use distlock_core::engine::{AcquireMany, AcquireMode, LeaseCheck, ManyAttempt, MultiLock};
    use distlock_core::{Clock, SystemClock, Token};

    let Some(mc) = Memcached::start() else { return };
    let b = MemcachedBackend::connect(&mc.url(""))
        .await
        .expect("connect");
    let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(SystemClock);
    let ttl = Duration::from_secs(10);
    let names = ["many-a", "many-b", "many-c"];
    let items: Vec<String> = names.iter().map(|n| b.item(n)).collect();
    let absent = |item: &str| mc.command(&format!("mg {item}")) == "EN";
    // Another holder's item on the last name.
    assert_eq!(mc.command(&format!("ms {} 5 T30\r\nother", items[2])), "HD");
    let ours = Token::generate();
    let req = AcquireMany::new(&names, &ours, ttl, "me", &clock);
    assert_eq!(
        b.acquire_all(&req).await.unwrap(),
        ManyAttempt::Busy {
            name: 2,
            holder_ttl: None
        }
    );
    for item in &items[..2] {
        assert!(absent(item), "{item} was left taken by a busy attempt");
    }
    assert_eq!(mc.command(&format!("md {}", items[2])), "HD");
    let got = b.acquire_all(&req).await.unwrap();
    assert_eq!(
        got,
        ManyAttempt::Acquired {
            fences: vec![None; 3]
        }
    );
    // A resend of the same request: its items carry our token, so they are ours.
    let resent = req.mode(AcquireMode::Try.resent());
    assert_eq!(b.acquire_all(&resent).await.unwrap(), got);
    // Another token finds the first name busy, and renews or releases nothing.
    let other = Token::generate();
    let theirs = AcquireMany::new(&names, &other, ttl, "them", &clock);
    assert!(matches!(
        b.acquire_all(&theirs).await.unwrap(),
        ManyAttempt::Busy { name: 0, .. }
    ));
    assert_eq!(
        b.renew_all(&names, &other, ttl).await.unwrap(),
        LeaseCheck::Foreign
    );
    assert_eq!(
        b.release_all(&names, &other).await.unwrap(),
        LeaseCheck::Foreign
    );
    let long = Duration::from_secs(60);
    assert_eq!(
        b.renew_all(&names, &ours, long).await.unwrap(),
        LeaseCheck::Ours
    );
    assert!(seconds_left(&mc, &items[0]) > 30, "not renewed");
    // One name gone: the renewal touches none of the others.
    assert_eq!(mc.command(&format!("md {}", items[1])), "HD");
    assert_eq!(
        b.renew_all(&names, &ours, Duration::from_secs(300))
            .await
            .unwrap(),
        LeaseCheck::Missing
    );
    assert!(
        seconds_left(&mc, &items[0]) <= 62,
        "renewed with a name gone"
    );
    // The release deletes what is still ours, and says one was gone.
    assert_eq!(
        b.release_all(&names, &ours).await.unwrap(),
        LeaseCheck::Missing
    );
    for item in &items {
        assert!(absent(item), "{item} stayed after the release");
    }
    assert_eq!(
        b.release_all(&names, &ours).await.unwrap(),
        LeaseCheck::Missing
    );
}
