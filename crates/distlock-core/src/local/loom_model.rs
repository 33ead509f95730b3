//! Model checks of the local queue's hand-off (loom, `.ci/loom`): the real [`LocalQueues`],
//! its mutex and id counter loom's (`crate::sync::shim`); its waiters' `Notify` and hand-off
//! channel are tokio's, which loom does not see into (each call counts as one step, and a
//! wake-up that never comes shows as a deadlock).
//!
//! The holder's side is the guard's release (`guard.rs`'s `finish` and `hand_off`, without the
//! engine's round trips): end the lease, offer it to the head of the queue, deliver it (or
//! offer it to the next waiter if that one has gone), or put the waiter back if the hand-off's
//! renewal failed; otherwise release it on the engine; then clear the holder. The waiter's side
//! is the wait's `turn` (`acquire/wait.rs`): its position, and a wait for a change while it is
//! behind. One thing is left out: a waiter behind a live holder also wakes when that holder's
//! lease ends (a timer, which needs tokio's runtime); here every holder clears itself, which
//! wakes the head too.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize};

use super::{LocalQueues, QueuePlace, QueuePosition};
use crate::lease::LeaseShared;
use crate::options::LockOptions;
use crate::sync::shim::{check, spawn};

const KEY: &str = "k";

/// One run's queue, the lock as the engine sees it, and what the tasks that held it saw.
struct World {
    queues: LocalQueues<Handed>,
    /// Whether the lock is free on the engine (released by the last holder).
    engine_free: AtomicBool,
    /// Tasks of ours that hold the lock now.
    holding: AtomicUsize,
    /// The waiters, in the order they got the lock.
    order: std::sync::Mutex<Vec<&'static str>>,
    /// Every lease of the run, kept until its threads are joined: loom does not see std's
    /// `Arc` count (the core's), so a lease dropped on one thread would look to it as racing a
    /// read of its atomics on another.
    leases: std::sync::Mutex<Vec<Arc<LeaseShared>>>,
}

impl World {
    fn new_lease(&self) -> Arc<LeaseShared> {
        let lease = Arc::new(LeaseShared::for_test(KEY));
        self.leases.lock().expect("the leases").push(lease.clone());
        lease
    }

    /// A world in which a task of ours holds the lock: with its lease.
    fn held() -> (Arc<World>, Arc<LeaseShared>) {
        let world = Arc::new(World {
            queues: LocalQueues::new(),
            engine_free: AtomicBool::new(false),
            holding: AtomicUsize::new(0),
            order: std::sync::Mutex::default(),
            leases: std::sync::Mutex::default(),
        });
        let first = world.new_lease();
        world.queues.set_holder(KEY, &first);
        (world, first)
    }

    fn release_on_engine(&self, lease: &Arc<LeaseShared>) {
        lease.mark_released();
        self.engine_free.store(true, SeqCst);
        self.queues.clear_holder(KEY, lease);
    }

    /// The guard's release of `lease`, with a hand-off to a local waiter if one is there;
    /// `renewed`: whether the hand-off's renewal succeeds.
    fn release(self: &Arc<Self>, lease: &Arc<LeaseShared>, renewed: bool) {
        lease.mark_released();
        let mut offer = self.queues.offer(KEY, lease);
        if !renewed && let Some(o) = offer.take() {
            self.queues.withdraw(KEY, o);
        }
        while let Some(o) = offer {
            let next = self.new_lease();
            let value = Handed {
                world: self.clone(),
                lease: Some(next.clone()),
            };
            match self.queues.deliver(KEY, o, &next, value) {
                Ok(()) => {
                    self.queues.clear_holder(KEY, lease);
                    return;
                }
                Err(mut back) => {
                    // That waiter has gone: nobody must release this lease on its behalf.
                    back.lease = None;
                    offer = self.queues.offer(KEY, lease);
                }
            }
        }
        self.release_on_engine(lease);
    }

    /// `place`'s task waits for its turn, checks what it got (a lease still held on the
    /// engine, or the head's turn to ask the engine once no holder of ours keeps the lock
    /// there), holds the lock, and releases it with a hand-off.
    fn wait_hold_release(self: &Arc<Self>, mut place: QueuePlace<'_, Handed>, name: &'static str) {
        let lease = match turn(&mut place) {
            Some(mut handed) => {
                assert!(
                    !self.engine_free.load(SeqCst),
                    "handed a lease released on the engine"
                );
                handed.take().expect("a lease")
            }
            None => {
                assert!(
                    self.engine_free.swap(false, SeqCst),
                    "the head went to the engine while a holder of ours had the lock"
                );
                let lease = self.new_lease();
                self.queues.set_holder(KEY, &lease);
                lease
            }
        };
        drop(place);
        assert_eq!(
            self.holding.fetch_add(1, SeqCst),
            0,
            "two tasks hold the lock"
        );
        self.order.lock().expect("the order").push(name);
        self.holding.fetch_sub(1, SeqCst);
        self.release(&lease, true);
    }

    /// After the run: nobody holds the lock, it is free on the engine, the queue keeps
    /// nothing, and the waiters got it in `order`.
    fn check_end(&self, order: &[&str]) {
        assert!(self.engine_free.load(SeqCst), "the lock was never released");
        assert!(self.queues.is_empty(), "the queue kept an entry");
        assert_eq!(*self.order.lock().expect("the order"), order);
    }
}

/// A lease handed to a waiter. Dropped untaken (its waiter has gone), it is released as the
/// guard's `Handoff` is: on the engine, then cleared from the queue.
struct Handed {
    world: Arc<World>,
    lease: Option<Arc<LeaseShared>>,
}

impl Handed {
    /// The lease, taken by the task that received it. The hand-off's channel is tokio's, whose
    /// happens-before loom does not see; `deliver` sends under the queue's mutex, so taking
    /// that mutex once here stands in for the channel's edge (without it, loom would see the
    /// lease's atomics, made on the holder's thread, read here unsynchronised).
    fn take(&mut self) -> Option<Arc<LeaseShared>> {
        let _ = self.world.queues.live_holder(KEY);
        self.lease.take()
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(lease) = self.take() {
            self.world.release_on_engine(&lease);
        }
    }
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

fn join(world: &World) -> QueuePlace<'_, Handed> {
    world.queues.join(KEY, LockOptions::default(), None)
}

/// A holder releases while a task joins the queue: the task is handed the lease (never one
/// released on the engine), or is told to ask the engine once the holder released it there;
/// it is always woken; and the queue keeps nothing once both are done.
#[test]
fn a_release_hands_the_lock_to_the_waiter_or_frees_it() {
    check(4, || {
        let (world, first) = World::held();
        let holder = {
            let world = world.clone();
            spawn(move || world.release(&first, true))
        };
        world.wait_hold_release(join(&world), "waiter");
        holder.join().expect("the holder");
        world.check_end(&["waiter"]);
    });
}

/// Two tasks queued in turn while a holder releases: the first is handed the lock, and the
/// second gets it only from the first (FIFO), never while another task holds it.
#[test]
fn the_first_waiter_gets_the_lock_first() {
    // Three threads (two waiters and the holder): 9 s at 3 preemptions, 36 s at 4.
    check(3, || {
        let (world, first) = World::held();
        let place = join(&world);
        let second = {
            let world = world.clone();
            spawn(move || world.wait_hold_release(join(&world), "second"))
        };
        let holder = {
            let world = world.clone();
            spawn(move || world.release(&first, true))
        };
        world.wait_hold_release(place, "first");
        holder.join().expect("the holder");
        second.join().expect("the second waiter");
        world.check_end(&["first", "second"]);
    });
}

/// As the first, with a second task that joins and leaves at once (a wait dropped, perhaps
/// while it is being offered the lease, or after it was delivered): the lease reaches the
/// waiter that stays, or is released on the engine first; never both, never neither.
#[test]
fn a_waiter_that_leaves_does_not_take_the_hand_off_with_it() {
    check(4, || {
        let (world, first) = World::held();
        let holder = {
            let world = world.clone();
            spawn(move || world.release(&first, true))
        };
        let leaver = {
            let world = world.clone();
            spawn(move || drop(join(&world)))
        };
        world.wait_hold_release(join(&world), "waiter");
        holder.join().expect("the holder");
        leaver.join().expect("the task that left");
        world.check_end(&["waiter"]);
    });
}

/// The hand-off's renewal fails: the offered waiter is put back at the head, woken, and goes
/// to the engine once the holder released the lock there.
#[test]
fn a_failed_hand_off_puts_the_waiter_back_at_the_head() {
    check(4, || {
        let (world, first) = World::held();
        let place = join(&world);
        let holder = {
            let world = world.clone();
            spawn(move || world.release(&first, false))
        };
        world.wait_hold_release(place, "waiter");
        holder.join().expect("the holder");
        world.check_end(&["waiter"]);
    });
}
