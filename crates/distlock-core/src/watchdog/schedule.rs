//! The watchdog's schedule: every lease it renews, in a min-heap by due time. A tick costs in
//! proportion to the leases due then, never to all the leases held: the next due time is the
//! heap's top, a batch is taken off the top, and an answer comes back with its lease. A
//! released lease is not looked for: it leaves when it comes up (its lease says it ended).
//!
//! A lease costs one heap slot (its due time, its renewals so far, and the lease): 32 bytes.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant as TokioInstant;

use crate::lease::{LeaseShared, Renewal};

/// A lease the watchdog renews, at its place in the heap.
struct Due {
    at: TokioInstant,
    renewals: u32,
    lease: Arc<LeaseShared>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

/// How a renewal ended, for [`Schedule::settle`].
pub(super) enum RenewOutcome {
    Renewed,
    Failed,
    Ended,
}

/// One lease in a batch, its renewal in flight until the reply is settled.
pub(super) struct Item {
    pub(super) renewal: Renewal,
    pub(super) ttl: Duration,
    pub(super) renewals: u32,
}

/// A settled renewal's lease and its count, for [`Schedule::settle`].
pub(super) struct Settled {
    pub(super) lease: Arc<LeaseShared>,
    pub(super) renewals: u32,
    pub(super) outcome: RenewOutcome,
}

/// The leases of one renewal call, and the latest of their deadlines: the call has until then
/// (read by [`Schedule::collect`] while each lease was in the cache).
pub(super) struct Batch {
    pub(super) items: Vec<Item>,
    pub(super) deadline: std::time::Instant,
}

/// The leases and their due times. Every lease the watchdog renews is in the heap once, or in
/// flight (out of the heap until its reply is settled).
#[derive(Default)]
pub(super) struct Schedule {
    heap: BinaryHeap<Reverse<Due>>,
    in_flight: usize,
    /// Heap slots looked at, for the tests that count the work a tick does.
    #[cfg(test)]
    visits: u64,
}

/// Seeded bug `renew-after-loss`: ended leases stay in the watchdog and are renewed for as long
/// as the engine still has their token.
pub(super) fn renew_after_loss() -> bool {
    crate::seeded::on(crate::seeded::SeededBug::RenewAfterLoss)
}

impl Schedule {
    /// Leases in the schedule (released ones that have not come up yet, and those in flight,
    /// included).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len() + self.in_flight
    }

    /// Adds a lease whose first renewal is due at `due`.
    pub(super) fn add(&mut self, lease: Arc<LeaseShared>, due: TokioInstant) {
        self.heap.push(Reverse(Due {
            at: due,
            renewals: 0,
            lease,
        }));
    }

    /// When the first lease is due (`None`: nothing to renew), after taking off the top the
    /// leases that need no more renewals: ended (released or lost), or at their limit of
    /// renewals. Those whose holder may still have them go to `left_off` (see
    /// `detach_unrenewed`).
    pub(super) fn next_due(
        &mut self,
        left_off: &mut Vec<Arc<LeaseShared>>,
    ) -> Option<TokioInstant> {
        while let Some(Reverse(top)) = self.heap.peek() {
            #[cfg(test)]
            {
                self.visits += 1;
            }
            if !finished(top) {
                return Some(top.at);
            }
            if let Some(Reverse(d)) = self.heap.pop() {
                left_off.push(d.lease);
            }
        }
        None
    }

    /// Takes off every lease due by `now`, or due within half its interval (renewing a little
    /// early aligns leases, so they share later ticks): the batch to send. A lease that ended
    /// or reached its hold limit leaves the schedule (to `left_off`). `None` when no lease is
    /// to be renewed.
    pub(super) fn collect(
        &mut self,
        now: TokioInstant,
        left_off: &mut Vec<Arc<LeaseShared>>,
    ) -> Option<Batch> {
        let mut batch = Vec::new();
        let mut deadline = None;
        // Leases put back for later go in after the loop, which would otherwise meet them
        // again at the top.
        let mut later = Vec::new();
        while let Some(Reverse(top)) = self.heap.peek() {
            #[cfg(test)]
            {
                self.visits += 1;
            }
            if top.at > now + top.lease.options().renew_interval() / 2 {
                break;
            }
            let Some(Reverse(mut d)) = self.heap.pop() else {
                break;
            };
            if finished(&d) {
                left_off.push(d.lease);
                continue;
            }
            // A release has closed the gate: the lease is going away; look again later.
            let Some(renewal) = d.lease.begin_renewal() else {
                d.at = now + d.lease.options().renew_interval() / 4;
                later.push(Reverse(d));
                continue;
            };
            let lease = &d.lease;
            let st = lease.snapshot();
            let mut ttl = st.ttl;
            let mut done = st.end.is_some() && !renew_after_loss();
            if let Some(max_hold) = lease.options().max_hold() {
                let left = (lease.acquired_at() + max_hold).saturating_duration_since(lease.now());
                // Whole milliseconds, as engines want them.
                let left = Duration::from_millis(left.as_millis() as u64);
                // Hold limit reached: no more renewals, the lease runs out.
                done |= left.is_zero();
                ttl = ttl.min(left);
            }
            // At the hold limit the lease is left to run out: it is not ended here, so that
            // `detach_unrenewed` still hands it to the engine (a session's key must leave the
            // session to expire).
            done = done || (lease.end_if_past_deadline().is_some() && !renew_after_loss());
            if done {
                drop(renewal);
                left_off.push(d.lease);
                continue;
            }
            self.in_flight += 1;
            // On its way from here (one visit of the lease a tick, while it is in the cache:
            // a batch of 50,000 leases does not fit, and each pass over it misses again).
            lease.renew_sent();
            batch.push(Item {
                renewal,
                ttl,
                renewals: d.renewals,
            });
            deadline = deadline.max(Some(st.valid_until));
        }
        self.heap.extend(later);
        deadline.map(|deadline| Batch {
            items: batch,
            deadline,
        })
    }

    /// Records how a lease's renewal ended, and when it is due again. A lease that ended
    /// leaves the schedule (to `left_off`).
    pub(super) fn settle(
        &mut self,
        settled: Settled,
        now: TokioInstant,
        left_off: &mut Vec<Arc<LeaseShared>>,
    ) {
        #[cfg(test)]
        {
            self.visits += 1;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        let Settled {
            lease,
            renewals,
            outcome,
        } = settled;
        let interval = lease.options().renew_interval();
        let (at, renewals) = match outcome {
            RenewOutcome::Renewed => (now + interval, renewals.saturating_add(1)),
            RenewOutcome::Failed => {
                // Try again sooner, but not in a tight loop, and before the deadline.
                let left = lease
                    .snapshot()
                    .valid_until
                    .saturating_duration_since(lease.now());
                let retry = (interval / 4).max(Duration::from_millis(5));
                (now + retry.min(left), renewals)
            }
            RenewOutcome::Ended => {
                left_off.push(lease);
                return;
            }
        };
        self.heap.push(Reverse(Due {
            at,
            renewals,
            lease,
        }));
    }
}

/// Whether a lease needs no more renewals: ended, or at its limit of renewals.
fn finished(d: &Due) -> bool {
    if d.lease.snapshot().end.is_some() && !renew_after_loss() {
        return true;
    }
    d.lease
        .options()
        .max_renewals()
        .is_some_and(|max| d.renewals >= max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::engine::LeaseKind;
    use crate::lease::LeaseSpec;
    use crate::options::LockOptions;
    use crate::token::Token;

    fn lease(ttl: Duration) -> Arc<LeaseShared> {
        lease_with(LockOptions::builder().ttl(ttl).build().expect("options"))
    }

    fn lease_with(options: LockOptions) -> Arc<LeaseShared> {
        let spec = LeaseSpec {
            key: "k".into(),
            token: Token::generate(),
            kind: LeaseKind::Exclusive,
            fence: None,
            clock: Arc::new(SystemClock),
            options,
            recorded: false,
            engine: "test",
        };
        Arc::new(LeaseShared::new(spec, std::time::Instant::now()))
    }

    /// Holds `n` leases whose first renewals are spread evenly over one interval, then runs
    /// the watchdog's ticks through three intervals (each lease renewed and answered when
    /// due): the entries looked at in all, per lease.
    fn visits_per_lease(n: usize) -> f64 {
        let ttl = Duration::from_secs(3);
        let interval = Duration::from_secs(1);
        let t0 = TokioInstant::now();
        let mut s = Schedule::default();
        let leases: Vec<_> = (0..n).map(|_| lease(ttl)).collect();
        for (i, l) in leases.iter().enumerate() {
            s.add(l.clone(), t0 + interval * (i as u32 + 1) / n as u32);
        }
        let mut left_off = Vec::new();
        let end = t0 + interval * 3;
        let mut renewed = 0;
        // The task's loop, on a clock of our own: sleep to the next due time, take the batch,
        // answer it at once.
        while let Some(now) = s.next_due(&mut left_off) {
            if now > end {
                break;
            }
            for item in s
                .collect(now, &mut left_off)
                .map_or(Vec::new(), |b| b.items)
            {
                let lease = item.renewal.lease().clone();
                drop(item.renewal);
                let settled = Settled {
                    lease,
                    renewals: item.renewals,
                    outcome: RenewOutcome::Renewed,
                };
                s.settle(settled, now, &mut left_off);
                renewed += 1;
            }
        }
        assert!(left_off.is_empty());
        assert_eq!(s.len(), n);
        assert!(renewed >= 2 * n, "{renewed} renewals of {n} leases");
        s.visits as f64 / n as f64
    }

    /// The work of a tick follows the leases due, not the leases held: ten times the leases,
    /// about the same work per lease (the old watchdog looked at every lease at each of its
    /// wake-ups, a hundred times the work for ten times the leases).
    #[test]
    fn the_work_per_lease_does_not_grow_with_the_leases_held() {
        let small = visits_per_lease(500);
        let large = visits_per_lease(5000);
        assert!(small < 20.0, "{small} entries looked at per lease");
        assert!(
            large < small * 1.5,
            "{large} per lease with 5,000 leases against {small} with 500"
        );
    }

    /// Leases released or ended leave when they come up; a lease renewed keeps its place, and
    /// every entry not in flight is due in the heap once.
    #[test]
    fn ended_leases_leave_and_the_others_stay_due() {
        let t0 = TokioInstant::now();
        let mut s = Schedule::default();
        let (kept, released) = (lease(Duration::from_secs(3)), lease(Duration::from_secs(3)));
        s.add(kept.clone(), t0 + Duration::from_millis(10));
        s.add(released.clone(), t0 + Duration::from_millis(5));
        released.mark_released();
        let mut left_off = Vec::new();
        // The released lease is at the top: it leaves, and the kept one is next.
        assert_eq!(
            s.next_due(&mut left_off),
            Some(t0 + Duration::from_millis(10))
        );
        assert_eq!(left_off.len(), 1);
        assert_eq!(s.len(), 1);
        let batch = s.collect(t0 + Duration::from_millis(10), &mut left_off);
        assert_eq!(batch.as_ref().map(|b| b.items.len()), Some(1));
        // In flight: nothing due until it is answered.
        assert_eq!(s.next_due(&mut left_off), None);
        let settled = |outcome| Settled {
            lease: kept.clone(),
            renewals: 0,
            outcome,
        };
        drop(batch);
        s.settle(settled(RenewOutcome::Renewed), t0, &mut left_off);
        assert_eq!(s.next_due(&mut left_off), Some(t0 + Duration::from_secs(1)));
        let batch = s.collect(t0 + Duration::from_secs(1), &mut left_off);
        assert_eq!(batch.as_ref().map(|b| b.items.len()), Some(1));
        drop(batch);
        s.settle(settled(RenewOutcome::Ended), t0, &mut left_off);
        assert_eq!(s.len(), 0);
    }

    /// A lease whose gate is taken (a release or a handover holds it) is looked at again a
    /// quarter interval later, once per tick: the tick does not meet it again and spin.
    #[test]
    fn a_lease_with_its_gate_taken_waits_a_quarter_interval() {
        let t0 = TokioInstant::now();
        let mut s = Schedule::default();
        let l = lease(Duration::from_secs(3));
        s.add(l.clone(), t0);
        let held = l.begin_renewal().expect("the gate is open");
        let mut left_off = Vec::new();
        assert!(s.collect(t0, &mut left_off).is_none());
        assert_eq!(
            s.next_due(&mut left_off),
            Some(t0 + Duration::from_millis(250))
        );
        drop(held);
        let batch = s.collect(t0 + Duration::from_millis(250), &mut left_off);
        assert_eq!(batch.map(|b| b.items.len()), Some(1));
    }

    /// A lease at its hold limit leaves the schedule still unended, even past its deadline:
    /// the engine is then told to let it run out (an etcd key leaves its session), which it
    /// skips for a lease already ended.
    #[test]
    fn a_lease_at_its_hold_limit_leaves_unended() {
        let options = LockOptions::builder()
            .ttl(Duration::from_millis(20))
            .max_hold(Duration::from_millis(5))
            .build()
            .expect("options");
        let l = lease_with(options);
        let mut s = Schedule::default();
        s.add(l.clone(), TokioInstant::now());
        std::thread::sleep(Duration::from_millis(40));
        let mut left_off = Vec::new();
        assert!(s.collect(TokioInstant::now(), &mut left_off).is_none());
        assert_eq!(left_off.len(), 1);
        assert!(l.snapshot().end.is_none(), "ended by the watchdog");
    }
}
