//! Model check of the wait's rule for release events (loom, `.ci/loom`): [`Subscribing`]
//! decides a waiter's steps after each busy attempt, as in `wait_in`, against a release on
//! another thread. The events go through the real [`WakeHub`] (its mutex and counters loom's:
//! `crate::sync::shim`; its `Notify` tokio's, one step to loom, and a wake-up that never comes
//! shows as a deadlock); the engine is a lock behind a mutex, and its release publishes the
//! event after the lock is free, as the engines' do.

use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;

use super::{AfterBusy, Subscribing};
use crate::recipes::WakeHub;
use crate::sync::shim::{check, spawn};

const KEY: &str = "k";

/// Another client holds the lock and releases it while a task waits for it with events: the
/// task takes the lock, whenever the release comes (before its first attempt, between that
/// busy attempt and its subscription, or after), and never sleeps through it.
#[test]
fn a_release_between_a_busy_attempt_and_the_subscription_is_not_missed() {
    check(4, || {
        let hub = WakeHub::new(|_| {}, |_| {});
        // Whether the other client holds the lock.
        let held = Arc::new(Mutex::new(true));
        let releaser = {
            let (hub, held) = (hub.clone(), held.clone());
            spawn(move || {
                *held.lock().expect("the engine") = false;
                hub.notify(KEY);
            })
        };
        let mut rule = Subscribing::default();
        let mut sub = None;
        let mut attempts = 0;
        loop {
            attempts += 1;
            {
                let mut held = held.lock().expect("the engine");
                if !*held {
                    *held = true;
                    break;
                }
            }
            let next = match rule.after_busy(true) {
                AfterBusy::Subscribe => {
                    sub = Some(hub.subscribe(KEY));
                    rule.subscribed(true)
                }
                next => next,
            };
            match next {
                AfterBusy::Retry => {}
                AfterBusy::Pause => block_on(sub.as_mut().expect("subscribed").next()),
                AfterBusy::Subscribe => unreachable!("a subscription is asked for once"),
            }
        }
        releaser.join().expect("the releaser");
        assert!(attempts <= 3, "{attempts} attempts for one release");
    });
}
