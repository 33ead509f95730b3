//! Model checks of a lease (loom, `.ci/loom`): its end, and the gate between its renewals and
//! its release. The lease is the real [`LeaseShared`], its mutex and atomics loom's
//! (`crate::sync::shim`); its `Notify` (tokio's) and the cell that holds it are not loom's, so
//! each of their calls counts as one step, and a wake-up that never comes shows as a deadlock.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize};

use super::{LeaseEnd, LeaseShared, LostReason, losses::LossCounter};
use crate::sync::shim::{check, spawn};

/// Three ends race (lost twice, released once): the first wins, and every caller is told that
/// one; it never changes after; the loss watcher's counter hears of it once; and a reader that
/// saw the lease lost sees the same reason ever after.
#[test]
fn a_lease_ends_once_and_the_first_end_wins() {
    check(4, || {
        let lease = Arc::new(LeaseShared::for_test("k"));
        let counter = Arc::new(LossCounter::default());
        lease.set_loss_counter(&counter);
        let ender = |end: LeaseEnd| {
            let lease = lease.clone();
            spawn(move || match end {
                LeaseEnd::Lost(reason) => lease.lose(reason),
                LeaseEnd::Released => lease.mark_released(),
            })
        };
        let stolen = ender(LeaseEnd::Lost(LostReason::Stolen));
        let released = ender(LeaseEnd::Released);
        let first = lease.lost_by_now();
        let mine = lease.lose(LostReason::Unreachable);
        let then = lease.lost_by_now();
        let stolen = stolen.join().expect("the thread that lost it");
        let released = released.join().expect("the thread that released it");
        assert_eq!(mine, stolen, "two ends of one lease");
        assert_eq!(mine, released, "two ends of one lease");
        assert_eq!(lease.snapshot().end, Some(mine), "the end changed");
        assert_eq!(then, mine.lost(), "the lost reason read is not the end");
        if let Some(reason) = first {
            assert_eq!(Some(reason), mine.lost(), "the lost reason changed");
        }
        assert!(!lease.is_held());
        assert_eq!(
            counter.ends_told(),
            1,
            "the loss watcher heard the end {} times",
            counter.ends_told()
        );
    });
}

/// A renewal takes the gate (`begin_renewal`) and checks that the lease has not ended, as the
/// watchdog does, while the release ends the lease and closes the gate (`close_gate`, awaited
/// as the guard's release awaits it). Once `close_gate` has returned no renewal is in flight,
/// and none starts after; and `close_gate` always returns (a renewal's end wakes it: the
/// lease's `Notify` is made by the first waiter, and a renewal that ends finds it).
#[test]
fn no_renewal_is_in_flight_once_the_gate_is_closed() {
    check(4, || {
        let lease = Arc::new(LeaseShared::for_test("k"));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let renewer = {
            let (lease, in_flight, closed) = (lease.clone(), in_flight.clone(), closed.clone());
            spawn(move || {
                for _ in 0..2 {
                    let Some(renewal) = lease.begin_renewal() else {
                        return;
                    };
                    if lease.snapshot().end.is_none() {
                        in_flight.fetch_add(1, SeqCst);
                        assert!(!closed.load(SeqCst), "a renewal sent after the release");
                        in_flight.fetch_sub(1, SeqCst);
                    }
                    drop(renewal);
                }
            })
        };
        lease.mark_released();
        block_on(lease.close_gate());
        closed.store(true, SeqCst);
        assert_eq!(
            in_flight.load(SeqCst),
            0,
            "a renewal in flight after the release"
        );
        assert!(lease.begin_renewal().is_none(), "the gate opened again");
        renewer.join().expect("the renewer");
    });
}
