//! The conformance cases of leader election. An engine without fences must refuse a campaign
//! with `Unsupported` and say why (an election's epoch is its fence); an engine with them must
//! keep one leader at a time, epochs that rise with every leader, a deadline that ends
//! leadership before anyone else can lead, and followers that see every leader once.

use std::time::{Duration, Instant};

use distlock_core::engine::Fencing;
use distlock_core::{ErrorKind, Fence, LockClient, Released};

use super::{MakeClient, key, opts};

/// Whether the engine behind `c` holds elections; if not, checks that a campaign fails with
/// `Unsupported` and says why.
async fn elects(c: &LockClient) -> bool {
    if c.backend().capabilities().fencing == Fencing::Monotonic {
        return true;
    }
    let e = c
        .election(key("unfenced"))
        .try_campaign()
        .await
        .expect_err("an engine without fences held an election");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(
        e.to_string().contains("fence"),
        "the refusal does not say why: {e}"
    );
    false
}

/// One leader at a time; the others wait. `leader()` names it with its value and epoch; a
/// resignation hands over within a few round trips (not a lease), to a leader whose epoch is
/// higher.
pub async fn an_election_has_one_leader_and_rising_epochs(make: &impl MakeClient) {
    let ttl = Duration::from_secs(10);
    let a = make.client(opts().ttl(ttl).build().unwrap()).await;
    if !elects(&a).await {
        return;
    }
    let b = make.client(opts().ttl(ttl).build().unwrap()).await;
    let name = key("election");
    let ea = a.election(&name).value("10.0.0.1:8080");
    let eb = b.election(&name).value("10.0.0.2:8080");
    assert_eq!(ea.leader().await.unwrap(), None, "nobody leads yet");
    let first = ea.campaign().await.unwrap();
    let first_epoch = first.epoch();
    assert!(first.is_leading());
    assert!(eb.try_campaign().await.unwrap().is_none(), "two leaders");
    let seen = eb.leader().await.unwrap().expect("a leader");
    assert_eq!(seen.epoch, Some(first.epoch()), "{seen:?}");
    assert_eq!(seen.value.as_deref(), Some("10.0.0.1:8080"), "{seen:?}");
    assert_eq!(seen.who, a.owner(), "{seen:?}");
    // A waiting campaigner takes over as soon as the leader resigns.
    let waiting = tokio::spawn(async move {
        let l = eb.campaign().await.unwrap();
        (l, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    assert_eq!(first.resign().await.unwrap(), Released::Held);
    let (second, at) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the follower took over well within the lease")
        .unwrap();
    assert!(
        at.duration_since(resigned) < Duration::from_secs(2),
        "the hand-over waited {:?}",
        at.duration_since(resigned)
    );
    let seen = ea.leader().await.unwrap().expect("a leader");
    assert!(second.epoch() > first_epoch, "{seen:?}");
    assert_eq!(seen.epoch, Some(second.epoch()));
    assert_eq!(seen.value.as_deref(), Some("10.0.0.2:8080"));
    assert_eq!(second.resign().await.unwrap(), Released::Held);
    assert_eq!(ea.leader().await.unwrap(), None);
}

/// A leader that stops renewing (dead, or paused) ends its leadership at its local deadline,
/// before a follower can lead; on engines whose leases expire, the follower then takes over
/// within the TTL and a wake-up, with a higher epoch.
pub async fn a_silent_leader_steps_down_before_the_next_leads(make: &impl MakeClient) {
    let ttl = Duration::from_millis(800);
    let a = make
        .client(opts().ttl(ttl).auto_renew(false).build().unwrap())
        .await;
    if !elects(&a).await {
        return;
    }
    let b = make.client(opts().ttl(ttl).build().unwrap()).await;
    let name = key("silent");
    let t0 = Instant::now();
    let old = a.election(&name).campaign().await.unwrap();
    let deadline = old.deadline();
    assert!(deadline <= t0 + ttl, "the deadline counts from the request");
    let lost = tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("leadership ends at its deadline");
    let ended = Instant::now();
    assert!(!old.is_leading(), "{lost}");
    assert!(ended >= deadline, "ended before its deadline");
    if !a.backend().capabilities().expiring {
        return; // Session engines free the lease when the holder's session ends.
    }
    let new = b
        .election(&name)
        .wait(distlock_core::Wait::Timeout(Duration::from_secs(5)))
        .campaign()
        .await
        .expect("a follower leads after the TTL");
    let took = Instant::now();
    assert!(took >= deadline, "the follower led before the old deadline");
    assert!(
        took.duration_since(t0) < ttl + Duration::from_secs(2),
        "the follower waited {:?}",
        took.duration_since(t0)
    );
    assert!(new.epoch() > old.epoch());
    drop(old);
    assert_eq!(new.resign().await.unwrap(), Released::Held);
}

/// A follower sees each leader once, in order, with its epoch and value, and nobody between
/// leaders; never two leaders with one epoch.
pub async fn observers_see_each_leader_once(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    if !elects(&a).await {
        return;
    }
    let b = make.client(opts().build().unwrap()).await;
    let name = key("observe");
    let mut obs = b
        .election(&name)
        .observe_interval(Duration::from_millis(50))
        .observe();
    assert_eq!(next_change(&mut obs).await, None, "nobody leads at first");
    let mut epochs = Vec::new();
    for value in ["first", "second", "third"] {
        let l = a.election(&name).value(value).campaign().await.unwrap();
        let seen = next_change(&mut obs).await.expect("the new leader");
        assert_eq!(seen.epoch, Some(l.epoch()), "{seen:?}");
        assert_eq!(seen.value.as_deref(), Some(value));
        epochs.push(l.epoch());
        assert_eq!(l.resign().await.unwrap(), Released::Held);
        assert_eq!(next_change(&mut obs).await, None, "the leader resigned");
    }
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
}

/// The observer's next change, within 5 s.
async fn next_change(obs: &mut distlock_core::Observer) -> Option<distlock_core::Leader> {
    tokio::time::timeout(Duration::from_secs(5), obs.changed())
        .await
        .expect("a change reported")
        .unwrap();
    obs.borrow().cloned()
}

/// `lead` campaigns again after a loss (here a break-glass release by another client): the
/// term of the lost leadership is cancelled, and the next one runs with a higher epoch. A term
/// that finishes resigns.
pub async fn a_lead_loop_campaigns_again_after_a_loss(make: &impl MakeClient) {
    let a = make
        .client(opts().ttl(Duration::from_secs(2)).build().unwrap())
        .await;
    if !elects(&a).await || a.backend().breaker().is_none() {
        return;
    }
    let b = make.client(opts().build().unwrap()).await;
    let name = key("lead-loop");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let election = a.election(&name);
    let ended = cancelled.clone();
    let looping = tokio::spawn(async move {
        election
            .lead(|epoch| {
                let (tx, ended) = (tx.clone(), ended.clone());
                async move {
                    // Counts the terms dropped before their end.
                    struct Dropped(std::sync::Arc<std::sync::atomic::AtomicU32>);
                    impl Drop for Dropped {
                        fn drop(&mut self) {
                            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    let _dropped = Dropped(ended);
                    let _ = tx.send(epoch);
                    std::future::pending::<()>().await;
                }
            })
            .await
    });
    let first = next_term(&mut rx).await;
    assert!(b.force_release(&name).await.unwrap().is_some(), "a held it");
    let second = next_term(&mut rx).await;
    assert!(second > first, "epochs {first} then {second}");
    assert_eq!(cancelled.load(std::sync::atomic::Ordering::SeqCst), 1);
    looping.abort();
    let _ = looping.await;
    // A term that finishes resigns: the name is free at once.
    let done = key("lead-once");
    let epoch = a.election(&done).lead(|epoch| async move { epoch }).await;
    assert!(epoch.unwrap().get() > 0);
    let g = b.try_acquire(&done).await.unwrap().expect("resigned");
    assert!(g.release().await.unwrap().was_held());
}

/// The epoch of the next term a lead loop began, within 10 s.
async fn next_term(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Fence>) -> Fence {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a term began")
        .expect("the loop runs")
}

/// A leader publishes a new value without a new election: its epoch stays, and a follower's
/// read and an observer see the new value. A value too long is refused before anything is
/// sent. Once another leader took over (after a break-glass release), the old leader's
/// proclamation fails with `Lost` and writes nothing.
pub async fn a_leader_proclaims_a_new_value(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    if !elects(&a).await {
        return;
    }
    let b = make.client(opts().build().unwrap()).await;
    let name = key("proclaim");
    let mut leading = a
        .election(&name)
        .value("10.0.0.1:8080")
        .campaign()
        .await
        .unwrap();
    let epoch = Some(leading.epoch());
    let mut observer = b
        .election(&name)
        .observe_interval(Duration::from_millis(50))
        .observe();
    let first = next_change(&mut observer).await.expect("a leader");
    assert_eq!(first.value.as_deref(), Some("10.0.0.1:8080"), "{first:?}");
    leading.proclaim("10.0.0.1:9090 (moved)").await.unwrap();
    assert_eq!(leading.value(), "10.0.0.1:9090 (moved)");
    assert!(leading.is_leading());
    let seen = b.election(&name).leader().await.unwrap().expect("a leader");
    assert_eq!(seen.epoch, epoch, "{seen:?}");
    assert_eq!(
        seen.value.as_deref(),
        Some("10.0.0.1:9090 (moved)"),
        "{seen:?}"
    );
    assert_eq!(seen.who, a.owner(), "{seen:?}");
    let next = next_change(&mut observer).await.expect("still a leader");
    assert_eq!(next.epoch, epoch, "{next:?}");
    assert_eq!(
        next.value.as_deref(),
        Some("10.0.0.1:9090 (moved)"),
        "{next:?}"
    );
    let e = leading
        .proclaim("x".repeat(distlock_core::MAX_VALUE_LEN + 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    if b.backend().breaker().is_none() {
        return;
    }
    assert!(b.force_release(&name).await.unwrap().is_some(), "a led");
    let next = b
        .election(&name)
        .value("10.0.0.2:8080")
        .campaign()
        .await
        .unwrap();
    let e = leading.proclaim("stale").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    let seen = b.election(&name).leader().await.unwrap().expect("a leader");
    assert_eq!(seen.epoch, Some(next.epoch()), "{seen:?}");
    assert_eq!(seen.value.as_deref(), Some("10.0.0.2:8080"), "{seen:?}");
}
