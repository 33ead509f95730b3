//! The pool's logic, on sessions that are numbers.

use std::sync::atomic::{AtomicBool, AtomicUsize};

use super::renew::LOOKUPS_PER_LOCK;
use super::*;
use crate::engine::{
    BoxFuture, LeaseCheck, LeaseKind, LeaseRef, LostReason, RenewItem, SessionWatch,
};
use crate::error::ErrorKind;
use crate::token::Token;

/// Sessions that are numbers, and a record of the statements the pool ran.
#[derive(Default)]
struct Fake {
    opened: AtomicUsize,
    closed: Mutex<Vec<usize>>,
    unlocked: Mutex<Vec<String>>,
    pings: AtomicUsize,
    fail_unlock: AtomicBool,
}

#[async_trait::async_trait]
impl SessionOps for Arc<Fake> {
    type Conn = usize;

    async fn open(&self, _end: SessionEnd) -> Result<usize, LockError> {
        Ok(self.opened.fetch_add(1, Ordering::SeqCst))
    }

    fn close(&self, conn: &usize) {
        self.closed.locked().push(*conn);
    }

    async fn unlock(&self, _conn: &usize, key: &str) -> Result<bool, LockError> {
        if self.fail_unlock.load(Ordering::SeqCst) {
            return Err(LockError::new(ErrorKind::Timeout, "no answer"));
        }
        self.unlocked.locked().push(key.to_owned());
        Ok(true)
    }

    async fn ping(
        &self,
        _: &usize,
        keep: &(dyn Fn() -> Duration + Send + Sync),
    ) -> Result<(), LockError> {
        assert!(keep() >= Duration::from_secs(1));
        self.pings.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn pool(sessions: usize) -> (Arc<Fake>, Arc<SessionPool<Arc<Fake>>>) {
    let fake = Arc::new(Fake::default());
    let limits = PoolLimits {
        sessions,
        wait: Duration::from_millis(300),
    };
    (fake.clone(), SessionPool::new(fake, limits))
}

const TTL: Duration = Duration::from_secs(10);

/// What the core's loss watcher makes of the pool's answers for the lease of `token`: the end
/// of its session, if the lease is still on it then.
fn end_of(p: &Arc<SessionPool<Arc<Fake>>>, token: &str) -> BoxFuture<'static, LostReason> {
    let (p, token) = (p.clone(), token.to_owned());
    let SessionWatch::Shared { session, end } = p.session_end(&token) else {
        return Box::pin(std::future::pending());
    };
    Box::pin(async move {
        let why = end.wait().await;
        if !p.still_on(&token, session) {
            return std::future::pending().await;
        }
        why
    })
}

async fn take(p: &SessionPool<Arc<Fake>>, name: &str, token: &str) -> PoolLease<usize> {
    match p.place(name, name, token, TTL).await.unwrap() {
        Placement::On(l) => {
            assert!(p.confirm(&l, Instant::now(), TTL, true));
            l
        }
        Placement::HeldHere => panic!("{name} is held here"),
    }
}

#[tokio::test]
async fn one_after_another_share_one_session() {
    let (fake, p) = pool(4);
    for i in 0..20 {
        take(&p, &format!("k{i}"), &format!("t{i}")).await;
    }
    assert_eq!(fake.opened.load(Ordering::SeqCst), 1);
    assert_eq!(p.open_sessions(), 1);
}

/// Past `SPREAD_AT` locks on a session, the next go to a new one while the cap allows, and the
/// sessions then fill evenly: a server whose every statement walks its session's locks
/// (PostgreSQL) pays for an eighth of them, not all.
#[tokio::test]
async fn many_locks_spread_over_the_sessions_the_cap_allows() {
    let (fake, p) = pool(4);
    let n = 4 * super::place::SPREAD_AT + 100;
    for i in 0..n {
        take(&p, &format!("k{i}"), &format!("t{i}")).await;
    }
    assert_eq!(fake.opened.load(Ordering::SeqCst), 4);
    let most = p.most_keys_on_a_session();
    assert!(most <= n / 4 + 1, "{most} of {n} locks on one session");
}

#[tokio::test]
async fn a_held_name_is_busy_here_and_never_placed_twice() {
    let (_, p) = pool(4);
    take(&p, "a", "t1").await;
    assert!(matches!(
        p.place("a", "a", "t2", TTL).await.unwrap(),
        Placement::HeldHere
    ));
    // Being taken (not yet confirmed): a second request goes to another session.
    let Placement::On(b1) = p.place("b", "b", "t3", TTL).await.unwrap() else {
        panic!()
    };
    let Placement::On(b2) = p.place("b", "b", "t4", TTL).await.unwrap() else {
        panic!()
    };
    assert_ne!(b1.session().number(), b2.session().number());
}

#[tokio::test]
async fn shared_holds_of_a_name_go_on_separate_sessions_and_exclude_its_exclusive_hold() {
    let (_, p) = pool(4);
    let shared = format!("{SHARED_PREFIX}a");
    let r1 = take(&p, &shared, "r1").await;
    // A second reader of the same client: not busy, on another session.
    let r2 = take(&p, &shared, "r2").await;
    assert_ne!(r1.session().number(), r2.session().number());
    // A writer of the client while its readers hold: busy at once.
    assert!(matches!(
        p.place("a", "a", "w", TTL).await.unwrap(),
        Placement::HeldHere
    ));
    // And a reader while its writer holds.
    take(&p, "b", "w2").await;
    assert!(matches!(
        p.place("b", &format!("{SHARED_PREFIX}b"), "r3", TTL)
            .await
            .unwrap(),
        Placement::HeldHere
    ));
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_a_request_waits_for_room_then_fails_clearly() {
    let (_, p) = pool(1);
    let Placement::On(pending) = p.place("x", "x", "t1", TTL).await.unwrap() else {
        panic!()
    };
    // Room comes: the first request gives up the name.
    let p2 = p.clone();
    let waiter = tokio::spawn(async move { p2.place("x", "x", "t2", TTL).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    p.withdraw(&pending);
    waiter.await.unwrap().expect("placed once there was room");
    // No room comes: a clear error after the pool's wait.
    let t0 = Instant::now();
    let e = p.place("x", "x", "t3", TTL).await.expect_err("at the cap");
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    assert_eq!(t0.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn the_timeout_covers_the_latest_deadline_on_the_session() {
    let (_, p) = pool(1);
    let l = take(&p, "a", "t1").await;
    let s = l.session().clone();
    assert_eq!(
        p.keep_for(&s, Duration::from_secs(30)),
        Duration::from_secs(30)
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    // A shorter lease now must not cut the longer one short.
    assert_eq!(
        p.keep_for(&s, Duration::from_secs(10)),
        Duration::from_secs(25)
    );
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(
        p.keep_for(&s, Duration::from_secs(10)),
        Duration::from_secs(10)
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_nobody_renews_is_released_at_its_deadline() {
    let (fake, p) = pool(1);
    let Placement::On(l) = p.place("a", "a", "t1", TTL).await.unwrap() else {
        panic!()
    };
    assert!(p.confirm(&l, Instant::now(), Duration::from_secs(2), false));
    tokio::time::sleep(Duration::from_millis(1900)).await;
    assert!(fake.unlocked.locked().is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*fake.unlocked.locked(), ["a"]);
    assert!(p.held("a", "t1").is_none());
    // Detached: released after what is left.
    take(&p, "b", "t2").await;
    p.detach("b", "t2", Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(*fake.unlocked.locked(), ["a", "b"]);
}

#[tokio::test]
async fn a_session_that_cannot_unlock_is_closed_and_its_leases_hear_it() {
    let (fake, p) = pool(1);
    take(&p, "a", "t1").await;
    take(&p, "b", "t2").await;
    let end = end_of(&p, "t2");
    fake.fail_unlock.store(true, Ordering::SeqCst);
    // Closing the session freed the lock, which it held.
    assert_eq!(p.release("a", "t1").await.unwrap(), LeaseCheck::Ours);
    assert_eq!(*fake.closed.locked(), [0]);
    assert_eq!(end.await, LostReason::Unreachable);
    assert_eq!(p.open_sessions(), 0);
    let token = Token::parse("t2").unwrap();
    let lease = LeaseRef::new("b", &token, LeaseKind::Exclusive);
    let r = p.renew_many(&[RenewItem::new(lease, TTL)]).await;
    assert_eq!(r[0].as_ref().ok(), Some(&LeaseCheck::Missing));
}

/// Tokens `t0`.. and names `k0`.., `n` of each.
fn tokens_and_names(n: usize) -> (Vec<Token>, Vec<String>) {
    let tokens = (0..n)
        .map(|i| Token::parse(&format!("t{i}")).unwrap())
        .collect();
    (tokens, (0..n).map(|i| format!("k{i}")).collect())
}

/// A renewal of each name with its token, exclusive, for `TTL`.
fn renew_items<'a>(tokens: &'a [Token], names: &'a [String]) -> Vec<RenewItem<'a>> {
    tokens
        .iter()
        .zip(names)
        .map(|(t, n)| RenewItem::new(LeaseRef::new(n, t, LeaseKind::Exclusive), TTL))
        .collect()
}

#[tokio::test]
async fn renewals_send_one_statement_per_session() {
    let (fake, p) = pool(2);
    let (tokens, names) = tokens_and_names(10);
    for (t, name) in tokens.iter().zip(&names) {
        take(&p, name, t.as_str()).await;
    }
    let r = p.renew_many(&renew_items(&tokens, &names)).await;
    assert!(r.iter().all(|r| r.as_ref().ok() == Some(&LeaseCheck::Ours)));
    assert_eq!(fake.pings.load(Ordering::SeqCst), p.open_sessions());
}

/// A call larger than one hold of the pool's lock answers each lease at its own place: the
/// leases looked up in later steps too, and one it does not know, past the first step.
#[tokio::test]
async fn a_renewal_call_of_many_steps_answers_each_lease_in_place() {
    let (fake, p) = pool(2);
    let n = 2 * LOOKUPS_PER_LOCK + 500;
    let (tokens, names) = tokens_and_names(n);
    let unknown = LOOKUPS_PER_LOCK + 7;
    for (i, (t, name)) in tokens.iter().zip(&names).enumerate() {
        if i != unknown {
            take(&p, name, t.as_str()).await;
        }
    }
    let r = p.renew_many(&renew_items(&tokens, &names)).await;
    assert_eq!(r.len(), n);
    for (i, r) in r.iter().enumerate() {
        let want = if i == unknown {
            LeaseCheck::Missing
        } else {
            LeaseCheck::Ours
        };
        assert_eq!(r.as_ref().ok(), Some(&want), "lease {i}");
    }
    assert_eq!(fake.pings.load(Ordering::SeqCst), p.open_sessions());
}

#[tokio::test(start_paused = true)]
async fn a_lease_released_at_its_deadline_does_not_hear_its_session_end() {
    let (_, p) = pool(1);
    let Placement::On(l) = p.place("a", "a", "t1", TTL).await.unwrap() else {
        panic!()
    };
    assert!(p.confirm(&l, Instant::now(), Duration::from_secs(1), false));
    let end = end_of(&p, "t1");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(p.held("a", "t1").is_none(), "released at its deadline");
    // Its session ends afterwards (the server's idle timeout, say): the lease had ended
    // already, as expired, and hears nothing.
    l.session().end().end(LostReason::Unreachable);
    let heard = tokio::time::timeout(Duration::from_secs(5), end).await;
    assert!(heard.is_err(), "{heard:?}");
}

/// A held lock is one record in the pool's map: its server name inline in it (and in its
/// session's set of names), its token inline (a generated one), and no copy of the lease that
/// the engine was handed.
#[tokio::test]
async fn a_held_lock_is_one_record_with_its_server_name_inline() {
    let (_, p) = pool(1);
    let token = Token::generate();
    let lease = take(&p, "once", token.as_str()).await;
    {
        let st = p.state.locked();
        let (kept, t) = st
            .leases
            .get_key_value(&CompactToken::of(token.as_str()))
            .unwrap();
        assert_eq!(kept.to_token(), token);
        assert!(t.held());
        assert_eq!(t.serial, lease.serial);
        assert!(matches!(t.key, super::Key::Inline { .. }));
        assert_eq!(t.key, lease.key);
        let s = st.sessions.values().next().unwrap();
        assert_eq!(s.keys.get("once"), Some(true));
        let key = s.keys.held_key("once").unwrap();
        assert!(matches!(key, super::Key::Inline { .. }));
    }
    drop(lease);
    let held = p.held("once", token.as_str()).unwrap();
    assert_eq!(held.key(), "once");
    // The token with another lock's name is not this lease.
    assert!(p.held("twice", token.as_str()).is_none());
    assert!(!p.rekey("twice", token.as_str(), "s:twice"));
    assert_eq!(
        p.release("twice", token.as_str()).await.unwrap(),
        LeaseCheck::Missing
    );
    assert_eq!(
        p.release("once", token.as_str()).await.unwrap(),
        LeaseCheck::Ours
    );
    assert!(p.held("once", token.as_str()).is_none());
}

/// A downgraded lease (its server name changed on the same session) is the same lease: it
/// still hears its session end, and a release at its deadline still comes.
#[tokio::test(start_paused = true)]
async fn a_rekeyed_lease_still_hears_its_session_end_and_its_deadline() {
    let (_, p) = pool(1);
    let Placement::On(l) = p.place("a", "a", "t1", TTL).await.unwrap() else {
        panic!()
    };
    assert!(p.confirm(&l, Instant::now(), TTL, true));
    let end = end_of(&p, "t1");
    assert!(p.rekey("a", "t1", "s:a"));
    l.session().end().end(LostReason::Unreachable);
    let heard = tokio::time::timeout(Duration::from_secs(5), end).await;
    assert_eq!(heard.ok(), Some(LostReason::Unreachable));

    let Placement::On(l) = p.place("b", "b", "t2", TTL).await.unwrap() else {
        panic!()
    };
    assert!(p.confirm(&l, Instant::now(), Duration::from_secs(1), false));
    assert!(p.rekey("b", "t2", "s:b"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(p.held("b", "t2").is_none(), "released at its deadline");
}

/// The pool's record of a lease, in its map by token (a client holds 100,000 leases).
#[cfg(target_pointer_width = "64")]
#[test]
fn a_tracked_lease_is_a_record_of_56_bytes() {
    assert_eq!(std::mem::size_of::<Tracked<()>>(), 56);
    assert_eq!(std::mem::size_of::<(CompactToken, Tracked<()>)>(), 80);
}
