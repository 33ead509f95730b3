//! Acquisitions whose replies were lost or came late: resent with the same token, counted
//! once, and cleaned up when given up.

use super::*;

#[tokio::test]
async fn a_lost_reply_is_resent_with_the_same_token_and_counted_once() {
    let fake = Arc::new(Fake::new());
    fake.lose_replies.store(2, Ordering::SeqCst);
    let client = LockClient::new(FakeEngine(fake.clone()));
    let g = client
        .try_acquire("k")
        .await
        .unwrap()
        .expect("ours after two lost replies");
    assert_eq!(g.fence(), Some(1), "the fence was counted once");
    let seen = fake.state.lock().unwrap().tokens_seen.clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|t| t == g.token().as_str()),
        "resends reuse the token"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// Waits (half a second at most) until the fake holds no lock: a given-up acquire's clean-up
/// runs in the background.
async fn until_no_lock_left(fake: &Fake) {
    for _ in 0..100 {
        if fake.state.lock().unwrap().locks.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn giving_up_after_ambiguous_errors_releases_what_may_have_been_taken() {
    let fake = Arc::new(Fake::new());
    fake.lose_replies.store(10, Ordering::SeqCst);
    let client = LockClient::new(FakeEngine(fake.clone()));
    let e = client.try_acquire("k").await.expect_err("every reply lost");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    until_no_lock_left(&fake).await;
    let st = fake.state.lock().unwrap();
    assert!(
        st.locks.is_empty(),
        "a lock taken by a lost request was left behind"
    );
    assert_eq!(st.released.len(), 1);
    assert_eq!(st.released[0], st.tokens_seen[0]);
}

#[tokio::test]
async fn a_resend_refused_outright_still_cleans_up_what_the_lost_reply_took() {
    // The first request took the lock and its reply was lost; the resend was refused (say, no
    // leader): a clear error, but about the resend only.
    let fake = Arc::new(Fake::new());
    fake.lose_replies.store(1, Ordering::SeqCst);
    fake.refuse_from_attempt.store(2, Ordering::SeqCst);
    let client = LockClient::new(FakeEngine(fake.clone()));
    let e = client.try_acquire("k").await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Protocol);
    until_no_lock_left(&fake).await;
    let st = fake.state.lock().unwrap();
    assert!(
        st.locks.is_empty(),
        "the lock the lost reply took was left behind"
    );
    assert_eq!(st.released, vec![st.tokens_seen[0].clone()]);
}

#[tokio::test]
async fn an_earlier_acquisition_the_engine_denies_is_still_released() {
    // Taken long ago (a place that came up while the queue was read, say), and the renewal
    // that should confirm it answers that it is gone: a replica just promoted may answer so
    // before it has applied the write. The attempt reports the lock busy, and releases the
    // token all the same, so that a write applied after all is not left to keep the lock.
    let fake = Arc::new(Fake::new());
    *fake.taken_ago.lock().unwrap() = Some(Duration::from_secs(25));
    *fake.renew.lock().unwrap() = Renew::Missing;
    let client = LockClient::new(FakeEngine(fake.clone()));
    assert!(client.try_acquire("k").await.unwrap().is_none());
    until_no_lock_left(&fake).await;
    let st = fake.state.lock().unwrap();
    assert!(
        st.locks.is_empty(),
        "the denied acquisition was left behind"
    );
    assert_eq!(st.released, vec![st.tokens_seen[0].clone()]);
}

#[tokio::test]
async fn a_clear_refusal_is_not_resent() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let other = LockClient::new(FakeEngine(fake.clone()));
    let holder = client.try_acquire("k").await.unwrap().expect("free");
    assert!(other.try_acquire("k").await.unwrap().is_none());
    assert_eq!(
        fake.state.lock().unwrap().tokens_seen.len(),
        2,
        "busy is an answer, not resent"
    );
    // The holder's own client knows the lock is taken here: no request at all.
    assert!(client.try_acquire("k").await.unwrap().is_none());
    assert_eq!(fake.state.lock().unwrap().tokens_seen.len(), 2);
    assert_eq!(holder.release().await.unwrap(), Released::Held);
}

#[tokio::test]
async fn an_earlier_acquisition_that_ran_out_unconfirmed_is_asked_for_again() {
    // Found taken long ago (the first send's reply came late: a member was killed under it),
    // and the renewal that should confirm it finds it gone: it ran out. Nobody else holds the
    // lock, so the attempt is not "busy": it asks once more, with the same token, and takes it.
    let fake = Arc::new(Fake::new());
    *fake.taken_ago.lock().unwrap() = Some(Duration::from_secs(25));
    *fake.renew.lock().unwrap() = Renew::MissingOnce;
    let client = LockClient::new(FakeEngine(fake.clone()));
    let g = client
        .try_acquire("k")
        .await
        .unwrap()
        .expect("asked again, and taken");
    let seen = fake.state.lock().unwrap().tokens_seen.clone();
    assert_eq!(seen.len(), 2, "one attempt more");
    assert!(seen.iter().all(|t| t == g.token().as_str()));
    assert!(g.is_held());
    assert_eq!(g.release().await.unwrap(), Released::Held);
}
