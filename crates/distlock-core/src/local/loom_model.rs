//! Model checks of the local queue's hand-off (loom, `.ci/loom`): the real [`LocalQueues`],
//! its mutex and id counter loom's (`crate::sync::shim`); its waiters' `Notify` and hand-off
//! channel are tokio's, which loom does not see into (each call counts as one step, and a
//! wake-up that never comes shows as a deadlock).
//!
//! The holder's side is the guard's release (`guard.rs`'s `finish` and `hand_off`, without the
//! engine's round trips): end the lease, offer it to the head of the queue, deliver it or offer
//! it to the next waiter if that one has gone, and otherwise release it on the engine; then
//! clear the holder. The waiter's side is the wait's `turn` (`acquire/wait.rs`): its position,
//! and a wait for a change while it is behind. One thing is left out: a waiter behind a live
//! holder also wakes when that holder's lease ends (a timer, which needs tokio's runtime); here
//! every holder clears itself, which wakes the head too.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use loom::future::block_on;
use loom::sync::atomic::AtomicBool;

use super::{LocalQueues, QueuePlace, QueuePosition};
use crate::lease::LeaseShared;
use crate::options::LockOptions;
use crate::sync::shim::{check, spawn};

const KEY: &str = "k";

/// The lock as the engine sees it: whether it is free there (released by the last holder).
type EngineFree = Arc<AtomicBool>;

/// Every lease of a run, kept until its threads are joined: loom does not see std's `Arc`
/// count (the core's), so a lease dropped on one thread would look to it as racing a read of
/// its atomics on another.
type Leases = Arc<std::sync::Mutex<Vec<Arc<LeaseShared>>>>;

fn new_lease(leases: &Leases) -> Arc<LeaseShared> {
    let lease = Arc::new(LeaseShared::for_test(KEY));
    leases
        .lock()
        .expect("the model's leases")
        .push(lease.clone());
    lease
}

/// A lease handed to a waiter. Dropped untaken (its waiter has gone), it is released as the
/// guard's `Handoff` is: on the engine, then cleared from the queue.
struct Handed {
    queues: Arc<LocalQueues<Handed>>,
    engine_free: EngineFree,
    lease: Option<Arc<LeaseShared>>,
}

impl Handed {
    /// The lease, taken by the task that received it. The hand-off's channel is tokio's, whose
    /// happens-before loom does not see; `deliver` sends under the queue's mutex, so taking
    /// that mutex once here stands in for the channel's edge (without it, loom would see the
    /// lease's atomics, made on the holder's thread, read here unsynchronised).
    fn take(&mut self) -> Option<Arc<LeaseShared>> {
        let _ = self.queues.live_holder(KEY);
        self.lease.take()
    }

    /// The waiter releases the lease it was handed (no waiter is left to hand it to).
    fn release(mut self) {
        if let Some(lease) = self.take() {
            release_on_engine(&self.queues, &lease, &self.engine_free);
        }
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(lease) = self.take() {
            release_on_engine(&self.queues, &lease, &self.engine_free);
        }
    }
}

fn release_on_engine(queues: &LocalQueues<Handed>, lease: &Arc<LeaseShared>, free: &EngineFree) {
    lease.mark_released();
    free.store(true, SeqCst);
    queues.clear_holder(KEY, lease);
}

/// The guard's release of `lease`, with a hand-off to a local waiter if one is there.
fn release(
    queues: &Arc<LocalQueues<Handed>>,
    lease: &Arc<LeaseShared>,
    free: &EngineFree,
    leases: &Leases,
) {
    lease.mark_released();
    let mut offer = queues.offer(KEY, lease);
    while let Some(o) = offer {
        let next = new_lease(leases);
        let value = Handed {
            queues: queues.clone(),
            engine_free: free.clone(),
            lease: Some(next.clone()),
        };
        match queues.deliver(KEY, o, &next, value) {
            Ok(()) => {
                queues.clear_holder(KEY, lease);
                return;
            }
            Err(mut back) => {
                // That waiter has gone: nobody must release this lease on its behalf.
                back.lease = None;
                offer = queues.offer(KEY, lease);
            }
        }
    }
    release_on_engine(queues, lease, free);
}

/// A waiter's turn: `Some` when a holder handed it the lease, `None` when it is the head and
/// must ask the engine.
fn turn(place: &mut QueuePlace<'_, Handed>) -> Option<Handed> {
    block_on(async {
        loop {
            match place.position() {
                QueuePosition::Handed(h) => return Some(h),
                QueuePosition::Head => return None,
                QueuePosition::Behind(_) => {
                    if let Some(h) = place.changed(None).await {
                        return Some(h);
                    }
                }
            }
        }
    })
}

/// Waits for the turn and checks what it got: a lease still held on the engine, or the head's
/// turn to ask the engine only once no holder of ours keeps the lock there.
fn wait_and_check(queues: &Arc<LocalQueues<Handed>>, free: &EngineFree) {
    let mut place = queues.join(KEY, LockOptions::default(), None);
    match turn(&mut place) {
        Some(handed) => {
            assert!(!free.load(SeqCst), "handed a lease released on the engine");
            handed.release();
        }
        None => assert!(
            free.load(SeqCst),
            "the head went to the engine while a holder of ours had the lock"
        ),
    }
}

/// A queue whose name a task holds: the queue, the holder's lease, the engine, the leases.
fn held() -> (
    Arc<LocalQueues<Handed>>,
    Arc<LeaseShared>,
    EngineFree,
    Leases,
) {
    let leases = Leases::default();
    let queues = Arc::new(LocalQueues::new());
    let first = new_lease(&leases);
    queues.set_holder(KEY, &first);
    (queues, first, Arc::new(AtomicBool::new(false)), leases)
}

/// A holder releases while a task joins the queue: the task is handed the lease (never one
/// released on the engine), or is told to ask the engine once the holder released it there;
/// it is always woken; and the queue keeps nothing once both are done.
#[test]
fn a_release_hands_the_lock_to_the_waiter_or_frees_it() {
    check(|| {
        let (queues, first, free, leases) = held();
        let holder = {
            let (queues, free, leases) = (queues.clone(), free.clone(), leases.clone());
            spawn(move || release(&queues, &first, &free, &leases))
        };
        wait_and_check(&queues, &free);
        holder.join().expect("the holder");
        assert!(queues.is_empty(), "the queue kept an entry");
    });
}

/// As above, with a second task that joins and leaves at once (a wait dropped, perhaps while
/// it is being offered the lease, or after it was delivered): the lease reaches the waiter
/// that stays, or is released on the engine first; never both, never neither.
#[test]
fn a_waiter_that_leaves_does_not_take_the_hand_off_with_it() {
    check(|| {
        let (queues, first, free, leases) = held();
        let holder = {
            let (queues, free, leases) = (queues.clone(), free.clone(), leases.clone());
            spawn(move || release(&queues, &first, &free, &leases))
        };
        let leaver = {
            let queues = queues.clone();
            spawn(move || drop(queues.join(KEY, LockOptions::default(), None)))
        };
        wait_and_check(&queues, &free);
        holder.join().expect("the holder");
        leaver.join().expect("the task that left");
        assert!(queues.is_empty(), "the queue kept an entry");
    });
}
