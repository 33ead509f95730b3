//! The local queues' entries: a holder alone, a queue, hand-offs and subscriptions kept for the next head.

use std::sync::Arc;
use std::time::Duration;

use super::{LocalQueues, Slot};
use crate::lease::LeaseShared;
use crate::options::LockOptions;

fn lease(name: &str) -> Arc<LeaseShared> {
    Arc::new(LeaseShared::for_test(name))
}

fn opts() -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn held_alone(q: &LocalQueues<u8>, key: &str) -> Option<bool> {
    q.lock().get(key).map(|s| matches!(s, Slot::Held(_)))
}

/// A held name nobody here waits for keeps its holder alone; a waiter makes it a queue,
/// which goes back to the holder alone when the waiter leaves.
#[test]
fn a_held_name_without_waiters_keeps_its_holder_alone() {
    let q = LocalQueues::<u8>::new();
    let l = lease("a");
    q.set_holder("a", &l);
    assert_eq!(held_alone(&q, "a"), Some(true));
    assert!(q.live_holder("a").is_some_and(|h| Arc::ptr_eq(&h, &l)));
    let place = q.join("a", opts(), None);
    assert_eq!(held_alone(&q, "a"), Some(false));
    let (token, _, _) = q.next_waiter("a").expect("a waiter");
    drop(place);
    // The wait token the waiter was given stays for the next one until it is retired.
    assert_eq!(held_alone(&q, "a"), Some(false));
    q.retire_token("a", &token);
    assert_eq!(held_alone(&q, "a"), Some(true));
    q.clear_holder("a", &l);
    assert_eq!(held_alone(&q, "a"), None, "nothing left for the name");
}

/// A subscription kept for the next head keeps the queue (with its holder) until it is
/// taken; then the holder is alone again.
#[test]
fn a_parked_subscription_keeps_the_queue_until_taken() {
    let q = LocalQueues::<u8>::new();
    let l = lease("p");
    q.set_holder("p", &l);
    q.keep_subscription("p", crate::engine::Subscription::never());
    assert_eq!(held_alone(&q, "p"), Some(false));
    assert!(q.live_holder("p").is_some_and(|h| Arc::ptr_eq(&h, &l)));
    assert!(q.take_kept_subscription("p").is_some());
    assert_eq!(held_alone(&q, "p"), Some(true));
    q.clear_holder("p", &l);
    assert_eq!(held_alone(&q, "p"), None);
}

/// An offer withdrawn puts the waiter back at the head, behind the holder; once it leaves,
/// the holder is alone again.
#[test]
fn a_withdrawn_offer_puts_the_waiter_back_at_the_head() {
    let q = LocalQueues::<u8>::new();
    let l = lease("w");
    q.set_holder("w", &l);
    let mut first = q.join("w", opts(), None);
    let second = q.join("w", opts(), None);
    let offer = q.offer("w", &l).expect("a waiter to offer");
    q.withdraw("w", offer);
    assert!(matches!(
        first.position(),
        super::QueuePosition::Behind(Some(h)) if Arc::ptr_eq(&h, &l)
    ));
    drop(first);
    drop(second);
    assert_eq!(held_alone(&q, "w"), Some(true));
}

/// A hand-off to the head waiter leaves the new holder alone once nobody else waits.
#[test]
fn a_handoff_to_the_last_waiter_leaves_its_holder_alone() {
    let q = LocalQueues::<u8>::new();
    let (first, second) = (lease("b"), lease("b"));
    q.set_holder("b", &first);
    let mut place = q.join("b", opts(), None);
    let offer = q.offer("b", &first).expect("a waiter to offer");
    q.deliver("b", offer, &second, 7).expect("delivered");
    assert_eq!(held_alone(&q, "b"), Some(true));
    assert!(matches!(place.position(), super::QueuePosition::Handed(7)));
    drop(place);
    assert!(q.live_holder("b").is_some_and(|h| Arc::ptr_eq(&h, &second)));
}
