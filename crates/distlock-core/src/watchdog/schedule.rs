//! The watchdog's schedule: every lease it renews, in a min-heap by due time. A tick costs in
//! proportion to the leases due then, never to all the leases held: the next due time is the
//! heap's top, a batch is taken off the top, and an answer comes back with its lease. A
//! released lease is not looked for: it leaves when it comes up (its lease says it ended).
//!
//! A lease costs one heap slot (its due time and the lease): 16 bytes. Its renewals so far are
//! counted on the lease.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant as TokioInstant;

use crate::lease::{LeaseShared, Renewal};

/// A lease the watchdog renews, at its place in the heap: 16 bytes (a client holding 100,000
/// locks has as many).
struct Due {
    /// When it is due, in nanoseconds since the schedule's `base`.
    at: u64,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RenewOutcome {
    Renewed,
    Failed,
    Ended,
}

/// One lease in a batch, its renewal in flight until the reply is settled, and then how it
/// ended (in place: a batch of 100,000 leases is not copied into a list of outcomes). 24 bytes.
pub(super) struct Item {
    pub(super) renewal: Renewal,
    /// The TTL asked, in nanoseconds.
    ttl: u64,
    /// How the renewal ended; `None` while it is in flight.
    pub(super) outcome: Option<RenewOutcome>,
}

impl Item {
    fn new(renewal: Renewal, ttl: Duration) -> Self {
        Item {
            renewal,
            ttl: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            outcome: None,
        }
    }

    /// The TTL asked.
    pub(super) fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl)
    }
}

/// The leases of one renewal call, and the latest of their deadlines: the call has until then
/// (read by [`Schedule::collect`] while each lease was in the cache).
pub(super) struct Batch {
    pub(super) items: Vec<Item>,
    pub(super) deadline: std::time::Instant,
}

/// The leases and their due times. Every lease the watchdog renews is in the heap once, or in
/// flight (out of the heap until its reply is settled).
pub(super) struct Schedule {
    /// The instant the heap's times count from.
    base: TokioInstant,
    heap: BinaryHeap<Reverse<Due>>,
    in_flight: usize,
    /// Heap slots looked at, for the tests that count the work a tick does.
    #[cfg(test)]
    visits: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        let now = TokioInstant::now();
        Schedule {
            // Before any due time of a lease handed over before the task started (an hour back,
            // or the clock's start if it is younger).
            base: now.checked_sub(Duration::from_secs(3600)).unwrap_or(now),
            heap: BinaryHeap::new(),
            in_flight: 0,
            #[cfg(test)]
            visits: 0,
        }
    }
}

impl Schedule {
    /// `t` as the heap keeps it (a time before the base counts as the base).
    fn at(&self, t: TokioInstant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A time of the heap as an instant.
    fn instant(&self, at: u64) -> TokioInstant {
        self.base + Duration::from_nanos(at)
    }

    /// Leases in the schedule (released ones that have not come up yet, and those in flight,
    /// included).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len() + self.in_flight
    }

    /// Adds a lease whose first renewal is due at `due`.
    pub(super) fn add(&mut self, lease: Arc<LeaseShared>, due: TokioInstant) {
        let at = self.at(due);
        self.heap.push(Reverse(Due { at, lease }));
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
                return Some(self.instant(top.at));
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
            if self.instant(top.at) > now + top.lease.options().renew_interval() / 2 {
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
                d.at = self.at(now + d.lease.options().renew_interval() / 4);
                later.push(Reverse(d));
                continue;
            };
            let lease = &d.lease;
            let st = lease.snapshot();
            let mut ttl = st.ttl;
            let mut done = st.end.is_some();
            // A limit past what an instant holds (`Duration::MAX`) is none.
            if let Some(end) = lease
                .options()
                .max_hold()
                .and_then(|max_hold| lease.acquired_at().checked_add(max_hold))
            {
                let left = end.saturating_duration_since(lease.now());
                // Whole milliseconds, as engines want them.
                let left = Duration::from_millis(left.as_millis() as u64);
                // Hold limit reached: no more renewals, the lease runs out.
                done |= left.is_zero();
                ttl = ttl.min(left);
            }
            // At the hold limit the lease is left to run out: it is not ended here, so that
            // `detach_unrenewed` still hands it to the engine (a session's key must leave the
            // session to expire).
            done = done || lease.end_if_past_deadline().is_some();
            if done {
                drop(renewal);
                left_off.push(d.lease);
                continue;
            }
            self.in_flight += 1;
            // On its way from here (one visit of the lease a tick, while it is in the cache:
            // a batch of 50,000 leases does not fit, and each pass over it misses again).
            lease.renew_sent();
            batch.push(Item::new(renewal, ttl));
            deadline = deadline.max(Some(st.valid_until));
        }
        self.heap.extend(later);
        deadline.map(|deadline| Batch {
            items: batch,
            deadline,
        })
    }

    /// Records how a lease's renewal ended (its item's outcome; one still unset counts as
    /// failed), and when it is due again. A lease that ended leaves the schedule (to
    /// `left_off`).
    pub(super) fn settle(
        &mut self,
        item: Item,
        now: TokioInstant,
        left_off: &mut Vec<Arc<LeaseShared>>,
    ) {
        #[cfg(test)]
        {
            self.visits += 1;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        let outcome = item.outcome.unwrap_or(RenewOutcome::Failed);
        // The gate opens here, as the renewal is settled.
        let lease = item.renewal.lease().clone();
        drop(item);
        let interval = lease.options().renew_interval();
        let at = match outcome {
            RenewOutcome::Renewed => {
                lease.count_renewal();
                now + interval
            }
            RenewOutcome::Failed => {
                // Try again sooner, but not in a tight loop, and before the deadline.
                let left = lease
                    .snapshot()
                    .valid_until
                    .saturating_duration_since(lease.now());
                let retry = (interval / 4).max(Duration::from_millis(5));
                now + retry.min(left)
            }
            RenewOutcome::Ended => {
                left_off.push(lease);
                return;
            }
        };
        let at = self.at(at);
        self.heap.push(Reverse(Due { at, lease }));
    }
}

/// Whether a lease needs no more renewals: ended, or at its limit of renewals.
fn finished(d: &Due) -> bool {
    if d.lease.snapshot().end.is_some() {
        return true;
    }
    d.lease
        .options()
        .max_renewals()
        .is_some_and(|max| d.lease.renewals() >= max)
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
            for mut item in s
                .collect(now, &mut left_off)
                .map_or(Vec::new(), |b| b.items)
            {
                item.outcome = Some(RenewOutcome::Renewed);
                s.settle(item, now, &mut left_off);
                renewed += 1;
            }
        }
        assert!(left_off.is_empty());
        assert_eq!(s.len(), n);
        assert!(renewed >= 2 * n, "{renewed} renewals of {n} leases");
        s.visits as f64 / n as f64
    }

    /// A held lock costs the watchdog a heap slot, and a batch's item while it is renewed:
    /// 100,000 locks are a heap of 1.6 MB and a batch of 2.4 MB.
    #[test]
    fn a_lease_costs_the_watchdog_16_bytes_and_24_in_flight() {
        assert_eq!(std::mem::size_of::<Reverse<Due>>(), 16);
        assert_eq!(std::mem::size_of::<Item>(), 24);
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
        let mut items = batch.map(|b| b.items).unwrap_or_default();
        assert_eq!(items.len(), 1);
        // In flight: nothing due until it is answered, and its gate is taken till then.
        assert_eq!(s.next_due(&mut left_off), None);
        assert!(kept.begin_renewal().is_none());
        let mut item = items.pop().unwrap();
        item.outcome = Some(RenewOutcome::Renewed);
        s.settle(item, t0, &mut left_off);
        assert_eq!(kept.renewals(), 1);
        assert!(
            kept.begin_renewal().is_some(),
            "the gate opens as it is settled"
        );
        assert_eq!(s.next_due(&mut left_off), Some(t0 + Duration::from_secs(1)));
        let batch = s.collect(t0 + Duration::from_secs(1), &mut left_off);
        let mut items = batch.map(|b| b.items).unwrap_or_default();
        assert_eq!(items.len(), 1);
        let mut item = items.pop().unwrap();
        item.outcome = Some(RenewOutcome::Ended);
        s.settle(item, t0, &mut left_off);
        assert_eq!(s.len(), 0);
        assert_eq!(kept.renewals(), 1);
    }

    /// A lease at its limit of renewals leaves when it next comes up; one whose renewal was
    /// never answered counts as failed and is due again soon, not renewed.
    #[test]
    fn renewals_are_counted_on_the_lease_up_to_its_limit() {
        let options = LockOptions::builder()
            .ttl(Duration::from_secs(3))
            .max_renewals(1)
            .build()
            .expect("options");
        let l = lease_with(options);
        let t0 = TokioInstant::now();
        let mut s = Schedule::default();
        s.add(l.clone(), t0);
        let mut left_off = Vec::new();
        let take = |s: &mut Schedule, at, left_off: &mut Vec<_>| {
            s.collect(at, left_off)
                .map(|b| b.items)
                .unwrap_or_default()
                .pop()
        };
        // Unanswered: failed, due again a quarter interval later, not counted.
        let item = take(&mut s, t0, &mut left_off).expect("due");
        s.settle(item, t0, &mut left_off);
        assert_eq!(l.renewals(), 0);
        assert_eq!(
            s.next_due(&mut left_off),
            Some(t0 + Duration::from_millis(250))
        );
        let mut item = take(&mut s, t0 + Duration::from_millis(250), &mut left_off).expect("due");
        item.outcome = Some(RenewOutcome::Renewed);
        s.settle(item, t0, &mut left_off);
        assert_eq!(l.renewals(), 1);
        // At its limit: it leaves the schedule when it comes up.
        assert_eq!(s.next_due(&mut left_off), None);
        assert_eq!(left_off.len(), 1);
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
