//! etcd sessions on a real member: one lease for all of a client's renewed locks, locks that
//! are not renewed (or no longer) ending after their TTL whatever else the client holds, every
//! lock of a revoked session lost at once with the reason, keys left by given-up requests
//! cleaned up, an idle client's session running out by itself, and a client's key names reused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::engine::{AcquireMode, AcquireRequest, Attempt, Clock, LeaseKind, LeaseRef};
use distlock_core::{Backend, LockClient, LostReason, Released, SystemClock, Token};
use distlock_etcd::EtcdBackend;
use distlock_testkit::{Etcd, FaultProxy, LinkMode};

mod common;
use common::{client, keys_under};

/// A member and two clients of it with locks of `ttl`.
async fn two_clients(ttl: Duration) -> Option<(Etcd, LockClient, LockClient)> {
    let etcd = Etcd::start()?;
    let url = etcd.url("");
    let (a, b) = (client(&url, ttl).await, client(&url, ttl).await);
    Some((etcd, a, b))
}

/// The ids (hex) of the leases the cluster has now.
fn leases(etcd: &Etcd) -> Vec<String> {
    etcd.ctl(&["lease", "list"])
        .lines()
        .skip(1) // "found N leases"
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The keys attached to lease `id` (hex), from `etcdctl lease timetolive --keys`.
fn attached(etcd: &Etcd, id: &str) -> Vec<String> {
    let out = etcd.ctl(&["lease", "timetolive", id, "--keys"]);
    // "lease 694d… granted with TTL(5s), remaining(4s), attached keys([a b c])"
    let Some(list) = out
        .split("attached keys([")
        .nth(1)
        .and_then(|rest| rest.split("])").next())
    else {
        return Vec::new();
    };
    list.split_whitespace().map(str::to_owned).collect()
}

/// The lease (hex) the only key under `prefix` is attached to.
fn lease_of(etcd: &Etcd, prefix: &str) -> String {
    let out = etcd.ctl(&["get", prefix, "--prefix", "-w", "fields"]);
    let lease = out
        .lines()
        .find_map(|l| l.strip_prefix("\"Lease\" : "))
        .unwrap_or_else(|| panic!("no key under {prefix}: {out}"));
    format!("{:x}", lease.trim().parse::<i64>().expect("a lease id"))
}

fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_locks_of_a_client_share_one_session_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let c = client(&etcd.url(""), Duration::from_secs(5)).await;
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(c.acquire(&format!("shared-{i}")).await.unwrap());
    }
    let ids = leases(&etcd);
    assert_eq!(ids.len(), 1, "one session lease for 50 locks: {ids:?}");
    assert_eq!(attached(&etcd, &ids[0]).len(), 50);
    // Renewals keep all of them on it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guards.iter().all(|g| g.is_held()));
    assert_eq!(leases(&etcd).len(), 1);
    for g in guards {
        assert!(g.release().await.unwrap().was_held());
    }
    assert!(attached(&etcd, &ids[0]).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_nobody_renews_ends_after_its_ttl_beside_renewed_ones() {
    let Some((etcd, a, b)) = two_clients(Duration::from_secs(2)).await else {
        return;
    };
    let renewed = a.acquire("kept").await.unwrap();
    let t0 = Instant::now();
    let unrenewed = a.lock("unkept").auto_renew(false).acquire().await.unwrap();
    // On a lease of its own, not the session's.
    assert_ne!(
        lease_of(
            &etcd,
            &a.engine::<EtcdBackend>()
                .expect("the engine")
                .lock_prefix("unkept")
        ),
        lease_of(
            &etcd,
            &a.engine::<EtcdBackend>()
                .expect("the engine")
                .lock_prefix("kept")
        )
    );
    let g = b
        .acquire("unkept")
        .await
        .expect("the unrenewed lock runs out");
    assert!(t0.elapsed() >= Duration::from_millis(1900), "freed early");
    assert!(t0.elapsed() < Duration::from_secs(8), "freed late");
    assert!(!unrenewed.is_held());
    assert!(renewed.is_held(), "the renewed lock is still held");
    assert!(b.try_acquire("kept").await.unwrap().is_none());
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_lock_ends_after_its_ttl_while_the_client_holds_others() {
    let Some((_etcd, a, b)) = two_clients(Duration::from_secs(2)).await else {
        return;
    };
    let kept = a.acquire("kept").await.unwrap();
    let t0 = Instant::now();
    let leaked = a.acquire("leaked").await.unwrap().leak();
    let g = b.acquire("leaked").await.expect("the leaked lock runs out");
    assert!(
        Instant::now() >= leaked.valid_until,
        "taken before the leaked lease ended"
    );
    assert!(t0.elapsed() < Duration::from_secs(8), "freed late");
    assert!(kept.is_held());
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_limit_frees_the_lock_while_the_session_lives_on() {
    let Some((_etcd, a, b)) = two_clients(Duration::from_secs(2)).await else {
        return;
    };
    let kept = a.acquire("kept").await.unwrap();
    let t0 = Instant::now();
    let limited = a
        .lock("limited")
        .max_hold(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let g = b.acquire("limited").await.expect("freed at the hold limit");
    assert!(t0.elapsed() >= Duration::from_millis(2900), "freed early");
    assert!(t0.elapsed() < Duration::from_secs(9), "freed late");
    assert!(!limited.is_held());
    assert!(kept.is_held());
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_every_lock_on_it_with_the_reason() {
    let Some((etcd, a, b)) = two_clients(Duration::from_secs(3)).await else {
        return;
    };
    let guards = [
        a.acquire("s1").await.unwrap(),
        a.acquire("s2").await.unwrap(),
        a.acquire("s3").await.unwrap(),
    ];
    let lease = lease_of(
        &etcd,
        &a.engine::<EtcdBackend>()
            .expect("the engine")
            .lock_prefix("s1"),
    );
    etcd.ctl(&["lease", "revoke", &lease]);
    for g in &guards {
        let why = tokio::time::timeout(Duration::from_secs(3), g.lost())
            .await
            .expect("lost within a renewal interval");
        // Revoked under its holders well before it could run out: removed, not expired,
        // whether the session's keep-alive or a renewal finds it gone first.
        assert_eq!(why, LostReason::Stolen);
    }
    // The others can take them at once, and the client's next lock gets a new session.
    for name in ["s1", "s2", "s3"] {
        assert!(b.try_acquire(name).await.unwrap().is_some());
    }
    let next = a.acquire("s4").await.unwrap();
    assert_ne!(
        lease_of(
            &etcd,
            &a.engine::<EtcdBackend>()
                .expect("the engine")
                .lock_prefix("s4")
        ),
        lease
    );
    assert!(next.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_on_our_session_that_we_do_not_know_is_deleted_at_a_renewal() {
    let Some(etcd) = Etcd::start() else { return };
    let a = client(&etcd.url(""), Duration::from_secs(2)).await;
    let g = a.acquire("real").await.unwrap();
    let lease = lease_of(
        &etcd,
        &a.engine::<EtcdBackend>()
            .expect("the engine")
            .lock_prefix("real"),
    );
    // What a request given up after it was sent leaves when it lands after its clean-up.
    let stray = format!(
        "{}0123456789abcdef0123456789abcdef",
        a.engine::<EtcdBackend>()
            .expect("the engine")
            .lock_prefix("stray")
    );
    etcd.ctl(&["put", &stray, "v", &format!("--lease={lease}")]);
    eventually("the stray key is deleted", Duration::from_secs(4), || {
        etcd.ctl(&["get", &stray, "--keys-only"]).trim().is_empty()
    });
    assert!(g.is_held());
    assert!(a.try_acquire("stray").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_lets_its_session_run_out() {
    let Some(etcd) = Etcd::start() else { return };
    let a = client(&etcd.url(""), Duration::from_secs(1)).await;
    let g = a.acquire("brief").await.unwrap();
    assert_eq!(leases(&etcd).len(), 1);
    assert!(g.release().await.unwrap().was_held());
    // Nothing held or awaited: no keep-alive, and the lease runs out (its TTL is at least
    // etcd's minimum, a few seconds).
    eventually(
        "the idle session's lease runs out",
        Duration::from_secs(10),
        || leases(&etcd).is_empty(),
    );
    // The next lock gets a new session.
    let g = a.acquire("brief").await.unwrap();
    assert_eq!(leases(&etcd).len(), 1);
    assert!(g.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_release_went_unanswered_is_not_in_our_way() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let a = client(
        &etcd.url("?response_timeout=300ms"),
        Duration::from_secs(10),
    )
    .await;
    let g = a.acquire("unanswered").await.unwrap();
    // The server is down while the release is sent, and back (with its data) after.
    etcd.members_mut()[0].kill();
    let released = g.release().await;
    etcd.members_mut()[0].restart();
    assert!(released.is_err(), "the release was answered: {released:?}");
    // The key is still there (its lease lives 10 s), but it is ours, released: the next first
    // attempt deletes it instead of reporting the lock busy.
    let prefix = a
        .engine::<EtcdBackend>()
        .expect("the engine")
        .lock_prefix("unanswered");
    let left = etcd.ctl(&["get", &prefix, "--prefix", "--keys-only"]);
    assert_eq!(left.lines().filter(|l| !l.trim().is_empty()).count(), 1);
    let g = a
        .try_acquire("unanswered")
        .await
        .unwrap()
        .expect("not kept out by our own released key");
    assert!(g.release().await.unwrap().was_held());
}

/// An acquire whose replies were lost is given up, and its clean-up deletes the key it may have
/// written, in the background. The same client's next first attempt, sent at once, must not be
/// kept out by that key, whether it reads it before the clean-up's delete is sent, while it is
/// in flight, or just before it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_up_acquire_does_not_keep_the_next_try_of_its_client_out() {
    let Some(etcd) = Etcd::start() else { return };
    let proxy = FaultProxy::start(([127, 0, 0, 1], etcd.members()[0].port()).into())
        .await
        .unwrap();
    let a = client(
        &format!("etcd://127.0.0.1:{}?response_timeout=300ms", proxy.port()),
        Duration::from_secs(10),
    )
    .await;
    let prefix = a
        .engine::<EtcdBackend>()
        .expect("the engine")
        .lock_prefix("given-up");
    for round in 0..10 {
        // A warm connection, so the write reaches the server before its reply is lost.
        let warm = a.try_acquire("warm").await.unwrap().expect("free");
        assert!(warm.release().await.unwrap().was_held());
        proxy.set(LinkMode::LoseReplies);
        let lost = a.try_acquire("given-up").await;
        proxy.set(LinkMode::Pass);
        assert!(lost.is_err(), "round {round}: answered: {lost:?}");
        let g = a
            .try_acquire("given-up")
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: kept out by our given-up key"));
        assert!(g.release().await.unwrap().was_held());
        eventually("the given-up key deleted", Duration::from_secs(5), || {
            keys_under(&etcd, &prefix).is_empty()
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_taking_a_lock_again_writes_the_same_key_and_concurrent_ones_differ() {
    let Some((etcd, a, b)) = two_clients(Duration::from_secs(5)).await else {
        return;
    };
    let prefix = a
        .engine::<EtcdBackend>()
        .expect("the engine")
        .lock_prefix("again");
    let g = a.acquire("again").await.unwrap();
    let first = keys_under(&etcd, &prefix);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    for _ in 0..3 {
        let g = a.acquire("again").await.unwrap();
        assert_eq!(keys_under(&etcd, &prefix), first, "a new key name");
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    // Another client's key has another name; and two acquisitions of this client at once
    // (the second queued behind the other client) have two.
    let held_by_b = b.acquire("again").await.unwrap();
    let queued = a.engine::<EtcdBackend>().expect("the engine").clone();
    let token = Token::generate();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let req = AcquireRequest::new("again", &token, Duration::from_secs(5), "test", &clock)
        .mode(AcquireMode::Wait);
    let attempt = queued.acquire(&req).await.unwrap();
    assert!(!matches!(attempt, Attempt::Acquired { .. }), "{attempt:?}");
    let g = a.try_acquire("again").await.unwrap();
    assert!(g.is_none(), "b holds it");
    let waiting = tokio::spawn(async move { a.acquire("again").await.map(|g| g.fence()) });
    eventually("three keys queued", Duration::from_secs(5), || {
        keys_under(&etcd, &prefix).len() == 3
    });
    let names = keys_under(&etcd, &prefix);
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3, "{names:?}");
    assert_eq!(held_by_b.release().await.unwrap(), Released::Held);
    queued
        .release(&LeaseRef::new("again", &token, LeaseKind::Exclusive))
        .await
        .unwrap();
    let fence = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    assert!(fence.is_some());
}

/// A write of a given-up acquisition can land after the clean-up that deleted its key was
/// answered (a request queued at a follower during an election reaches the new leader later).
/// Its key name is never given out again, so the key it recreates is nobody's: the next first
/// attempt deletes it and takes the lock, under a name of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_of_a_given_up_acquire_is_nobody_s_key() {
    let Some(etcd) = Etcd::start() else { return };
    let proxy = FaultProxy::start(([127, 0, 0, 1], etcd.members()[0].port()).into())
        .await
        .unwrap();
    let a = client(
        &format!("etcd://127.0.0.1:{}?response_timeout=300ms", proxy.port()),
        Duration::from_secs(10),
    )
    .await;
    let prefix = a
        .engine::<EtcdBackend>()
        .expect("the engine")
        .lock_prefix("late");
    let warm = a.try_acquire("warm").await.unwrap().expect("free");
    // Our key names: <prefix><client>-<n>, n the lowest free; the first for "late" is -0.
    let warm_key = keys_under(
        &etcd,
        &a.engine::<EtcdBackend>()
            .expect("the engine")
            .lock_prefix("warm"),
    );
    let client_part = warm_key[0]
        .rsplit('/')
        .next()
        .unwrap()
        .trim_end_matches("-0");
    let given_up = format!("{prefix}{client_part}-0");
    assert!(warm.release().await.unwrap().was_held());
    proxy.set(LinkMode::LoseReplies);
    let lost = a.try_acquire("late").await;
    proxy.set(LinkMode::Pass);
    assert!(lost.is_err(), "answered: {lost:?}");
    // The clean-up deletes what the lost write made.
    eventually("the given-up key deleted", Duration::from_secs(5), || {
        keys_under(&etcd, &prefix).is_empty()
    });
    // The same write lands again, late (here, by hand).
    etcd.ctl(&["put", &given_up, "late"]);
    for _ in 0..3 {
        let g = a
            .try_acquire("late")
            .await
            .unwrap()
            .expect("not kept out by the late write");
        let keys = keys_under(&etcd, &prefix);
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_ne!(keys[0], given_up, "the given-up name was given out again");
        assert!(g.release().await.unwrap().was_held());
    }
}

/// etcd#16221: in etcd's own read-write recipe, a writer whose lease was revoked while it
/// waited kept waiting on its predecessor and then took the lock beside the next writer,
/// because it never looked at its own key again. Here, a waiting writer whose session is
/// revoked never reports the lock taken: the writer behind it gets the lock when the reader
/// leaves, and the revoked one's acquire fails (`Lost`) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_waiting_writer_never_takes_the_lock_beside_the_next_etcd_16221() {
    let Some(etcd) = Etcd::start() else { return };
    let url = etcd.url("");
    let ttl = Duration::from_secs(5);
    let (a, b, c) = (
        client(&url, ttl).await,
        client(&url, ttl).await,
        client(&url, ttl).await,
    );
    let name = "rw-16221";
    let prefix = a
        .engine::<EtcdBackend>()
        .expect("the engine")
        .lock_prefix(name);
    let before = leases(&etcd);
    let reader = a.read_lock(name).acquire().await.unwrap();
    let with_a = leases(&etcd);
    let queued = |n: usize| keys_under(&etcd, &prefix).len() == n;
    let first = {
        let b = b.clone();
        tokio::spawn(async move {
            b.write_lock(name)
                .wait_timeout(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    eventually("the first writer queued", Duration::from_secs(5), || {
        queued(2)
    });
    let revoked: Vec<String> = leases(&etcd)
        .into_iter()
        .filter(|l| !with_a.contains(l) && !before.contains(l))
        .collect();
    assert_eq!(revoked.len(), 1, "the first writer's session: {revoked:?}");
    let second = {
        let c = c.clone();
        tokio::spawn(async move {
            c.write_lock(name)
                .wait_timeout(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    eventually("the second writer queued", Duration::from_secs(5), || {
        queued(3)
    });
    etcd.ctl(&["lease", "revoke", &revoked[0]]);
    eventually(
        "the revoked writer's key gone",
        Duration::from_secs(5),
        || queued(2),
    );
    assert!(reader.release().await.unwrap().was_held());
    let holder = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second writer was let in")
        .unwrap()
        .expect("the second writer");
    // The revoked writer must not hold the lock beside it: its wait ends in an error (or is
    // still waiting), never in a guard.
    let outcome = tokio::time::timeout(Duration::from_secs(5), first).await;
    if let Ok(joined) = outcome {
        let e = joined
            .unwrap()
            .map(|_| ())
            .expect_err("two writers at once");
        assert_eq!(e.kind(), distlock_core::ErrorKind::Lost, "{e}");
    }
    assert!(holder.is_held());
    assert!(holder.release().await.unwrap().was_held());
}

/// An etcd lease revoked under a leader ends that leadership at once, not at the next renewal
/// (the leader's own key is watched), and the follower leads with a higher epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_ends_leadership_at_once() {
    let Some((etcd, a, b)) = two_clients(Duration::from_secs(15)).await else {
        return;
    };
    let leading = a.election("leader").value("a").campaign().await.unwrap();
    // The leader's lease, before a follower's key joins the prefix.
    let lease = lease_of(
        &etcd,
        &a.engine::<EtcdBackend>()
            .expect("the engine")
            .lock_prefix("leader"),
    );
    let follower = tokio::spawn(async move {
        let l = b.election("leader").value("b").campaign().await.unwrap();
        (l, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    etcd.ctl(&["lease", "revoke", &lease]);
    let why = tokio::time::timeout(Duration::from_secs(15), leading.lost())
        .await
        .expect("leadership ends");
    let ended = t0.elapsed();
    assert_eq!(why, LostReason::Stolen);
    assert!(!leading.is_leading());
    assert!(
        ended < Duration::from_secs(1),
        "ended {ended:?} after the revoke"
    );
    let (next, at) = follower.await.unwrap();
    assert!(next.epoch() > leading.epoch());
    assert!(at.duration_since(t0) < Duration::from_secs(2));
    assert!(next.resign().await.unwrap().was_held());
}

/// A resend (after a lost reply, or after an acquisition found from earlier ran out before it
/// was confirmed) whose key is gone asks for the lock again: it is not told that its place in
/// a queue was lost (which would end a wait, or report a free lock as unreachable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_whose_key_is_gone_takes_the_lock_again() {
    let Some(etcd) = Etcd::start() else { return };
    let backend = EtcdBackend::connect(&etcd.url("")).await.expect("connect");
    let prefix = backend.lock_prefix("resent");
    let token = Token::generate();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let req = AcquireRequest::new("resent", &token, Duration::from_secs(5), "test", &clock);
    let first = backend.acquire(&req).await.unwrap();
    assert!(matches!(first, Attempt::Acquired { .. }), "{first:?}");
    // The key goes (its lease ran out, say) while the client still has the entry.
    let gone = etcd.ctl(&["del", &prefix, "--prefix"]);
    assert_eq!(gone, "1", "one key deleted");
    let resend = AcquireRequest::new("resent", &token, Duration::from_secs(5), "test", &clock)
        .mode(AcquireMode::Resend { wait: false });
    let again = backend.acquire(&resend).await;
    assert!(
        matches!(
            again,
            Ok(Attempt::Acquired { .. } | Attempt::AcquiredEarlier { .. })
        ),
        "{again:?}"
    );
    assert_eq!(keys_under(&etcd, &prefix).len(), 1, "its key is back");
    let released = backend
        .release(&LeaseRef::new("resent", &token, LeaseKind::Exclusive))
        .await
        .unwrap();
    assert_eq!(released, distlock_core::engine::LeaseCheck::Ours);
    assert!(keys_under(&etcd, &prefix).is_empty());
}
