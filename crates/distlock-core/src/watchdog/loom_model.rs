//! Model check of the watchdog's batching against a release (loom, `.ci/loom`): the real
//! [`Schedule`] (as the watchdog's task drives it: collect the due leases, send them, settle the
//! replies) over real leases, whose mutex and atomics are loom's (`crate::sync::shim`), while
//! another thread releases one of them as a guard does (end it, then `close_gate`).

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize};
use tokio::time::Instant as TokioInstant;

use super::schedule::{Item, RenewOutcome, Schedule};
use crate::lease::LeaseShared;
use crate::sync::shim::{check, spawn};

/// Two leases due now; one is released while the watchdog ticks three times (the second tick
/// while the first batch is still out). Each due lease goes in one batch at a time (never in
/// a second while its renewal is out); no renewal of the released lease is out once its
/// release has closed the gate, and none is sent after; the released lease leaves the
/// schedule and the other stays in it, once.
#[test]
fn each_due_lease_in_one_batch_and_none_after_its_release() {
    check(4, || {
        let released = Arc::new(LeaseShared::for_test("released"));
        let kept = Arc::new(LeaseShared::for_test("kept"));
        let out = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let releaser = {
            let (lease, out, closed) = (released.clone(), out.clone(), closed.clone());
            spawn(move || {
                lease.mark_released();
                block_on(lease.close_gate());
                closed.store(true, SeqCst);
                assert_eq!(out.load(SeqCst), 0, "a renewal out after the release");
            })
        };
        let interval = kept.options().renew_interval();
        let start = TokioInstant::now();
        let mut schedule = Schedule::default();
        schedule.add(released.clone(), start);
        schedule.add(kept.clone(), start);
        let mut left_off = Vec::new();
        // The batch sent at the tick before, answered only after the next tick's collect.
        let mut pending: Vec<Item> = Vec::new();
        let mut kept_renewed = 0;
        let answer = |items: Vec<Item>, now, schedule: &mut Schedule, left_off: &mut Vec<_>| {
            for mut item in items {
                if Arc::ptr_eq(item.renewal.lease(), &released) {
                    out.fetch_sub(1, SeqCst);
                }
                item.outcome = Some(RenewOutcome::Renewed);
                schedule.settle(item, now, left_off);
            }
        };
        for tick in 0..3u32 {
            let now = start + interval * tick;
            let batch = schedule
                .collect(now, &mut left_off)
                .map(|b| b.items)
                .unwrap_or_default();
            for item in &batch {
                let lease = item.renewal.lease();
                assert!(
                    !pending
                        .iter()
                        .any(|i| Arc::ptr_eq(i.renewal.lease(), lease)),
                    "a lease in a second batch while its renewal is out"
                );
                if Arc::ptr_eq(lease, &released) {
                    out.fetch_add(1, SeqCst);
                    assert!(!closed.load(SeqCst), "a renewal sent after the release");
                } else {
                    kept_renewed += 1;
                }
            }
            answer(
                std::mem::replace(&mut pending, batch),
                now,
                &mut schedule,
                &mut left_off,
            );
        }
        answer(pending, start + interval * 3, &mut schedule, &mut left_off);
        releaser.join().expect("the releaser");
        let late = start + interval * 10;
        let batch = schedule
            .collect(late, &mut left_off)
            .map(|b| b.items)
            .unwrap_or_default();
        // Due at the first tick and at the third (out at the second, and answered then).
        assert_eq!(
            kept_renewed, 2,
            "the kept lease was not in each batch it was due for"
        );
        assert_eq!(batch.len(), 1, "not the kept lease alone in the last batch");
        assert!(Arc::ptr_eq(batch[0].renewal.lease(), &kept));
        assert!(
            left_off.iter().any(|l| Arc::ptr_eq(l, &released)),
            "the released lease stayed"
        );
        assert_eq!(
            schedule.len(),
            1,
            "the schedule keeps a lease twice, or lost one"
        );
    });
}
