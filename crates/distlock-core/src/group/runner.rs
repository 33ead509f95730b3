//! A member's task: reads the group's members every interval, takes the partitions that
//! rendezvous hashing gives this member (a campaign a partition, which waits for the owner
//! before to let go or run out), and lets go of the ones that moved away once the grace is
//! over. It holds the membership's lease, so that the lease goes with it however it ends. It
//! ends when the membership is lost (every partition let go at once), dropped (the same), or
//! left (the membership's lease released first, then each partition drained for the grace).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::membership::{Shared, Stop};
use super::{Group, Owned, OwnershipEvent, hrw};
use crate::election::Leadership;
use crate::engine::LostReason;
use crate::error::{ErrorKind, LockError};
use crate::guard::Fence;
use crate::recipes::MutexExt;

/// A partition held: its lease, the task that tells its loss, and when it is let go if it
/// moved away.
struct Held {
    lease: Leadership,
    watch: JoinHandle<()>,
    until: Option<Instant>,
}

impl Held {
    fn owned(&self, partition: u32) -> Owned {
        Owned {
            partition,
            fence: self.lease.epoch(),
        }
    }
}

/// A campaign's outcome: its partition, its number, and the leadership or the error.
type Taken = (u32, u64, Result<Leadership, LockError>);

/// The member's task state.
struct Runner {
    group: Group,
    id: String,
    shared: Arc<Shared>,
    held: BTreeMap<u32, Held>,
    /// The campaigns in flight, by partition, each with its number: an outcome whose number
    /// is not the one here is an aborted campaign's, and let go.
    pending: HashMap<u32, (u64, JoinHandle<()>)>,
    campaigns: u64,
    /// The partitions assigned to this member at the last complete read.
    wanted: Vec<bool>,
    got: mpsc::UnboundedSender<Taken>,
    lost: mpsc::UnboundedSender<(u32, Fence, LostReason)>,
}

pub(crate) async fn run(
    group: Group,
    id: String,
    membership: Leadership,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<Stop>,
) -> Result<(), LockError> {
    let (got, mut got_rx) = mpsc::unbounded_channel();
    let (lost, mut lost_rx) = mpsc::unbounded_channel();
    let partitions = group.partition_count();
    let mut tick = tokio::time::interval(group.poll_interval());
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut r = Runner {
        group,
        id,
        shared,
        held: BTreeMap::new(),
        pending: HashMap::new(),
        campaigns: 0,
        wanted: vec![false; partitions as usize],
        got,
        lost,
    };
    loop {
        let drain_at = r.held.values().filter_map(|h| h.until).min();
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_ok() && *stop.borrow() == Stop::Leave {
                    // The membership goes first: the others start taking our partitions
                    // over as we let them go.
                    let released = membership.resign().await.map(drop);
                    r.end(true, &mut got_rx, &mut lost_rx).await;
                    return released;
                }
                r.end(false, &mut got_rx, &mut lost_rx).await;
                return Ok(());
            }
            reason = membership.lost() => {
                tracing::warn!(group = %r.group.name(), member = %r.id, %reason,
                    "group membership lost: letting every partition go");
                r.end(false, &mut got_rx, &mut lost_rx).await;
                return Err(LockError::new(
                    ErrorKind::Lost,
                    format!("the membership of group {:?} was lost: {reason}", r.group.name()),
                ));
            }
            Some(taken) = got_rx.recv() => r.taken(taken),
            Some((p, fence, reason)) = lost_rx.recv() => r.lost(p, fence, reason),
            () = async {
                match drain_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => r.let_go_drained().await,
            _ = tick.tick() => r.refresh().await,
        }
    }
}

impl Runner {
    /// Reads the members and moves partitions to match. A read that fails, is cut short or
    /// takes longer than the interval (a second at least) changes nothing: the leases decide
    /// who owns what, and a missed read only delays a move.
    async fn refresh(&mut self) {
        let limit = self.group.poll_interval().max(Duration::from_secs(1));
        let members = match tokio::time::timeout(limit, self.group.members()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                tracing::debug!(group = %self.group.name(), error = %e, "reading the members");
                return;
            }
            Err(_) => {
                tracing::debug!(group = %self.group.name(), "reading the members timed out");
                return;
            }
        };
        let partitions = self.group.partition_count();
        let mut ids: Vec<&str> = members
            .iter()
            .filter(|m| m.partitions == partitions)
            .map(|m| m.id.as_str())
            .collect();
        if !ids.contains(&self.id.as_str()) {
            // Our lease is ours (else we would have ended): a read that missed it counts us.
            ids.push(self.id.as_str());
        }
        let me = ids.iter().position(|i| *i == self.id);
        self.wanted = hrw::assign(&ids, partitions)
            .into_iter()
            .map(|o| o.is_some() && o == me)
            .collect();
        self.reconcile().await;
    }

    /// Campaigns for the partitions wanted and not held, stops those no longer wanted, and
    /// starts draining the ones held that moved away (or keeps one that came back).
    async fn reconcile(&mut self) {
        let now = Instant::now();
        let until = self.drain_deadline(now);
        let wanted = std::mem::take(&mut self.wanted);
        for (p, &want) in (0..).zip(&wanted) {
            match (want, self.held.get_mut(&p)) {
                (true, Some(h)) => {
                    if h.until.take().is_some() {
                        let owned = h.owned(p);
                        self.shared.tell(OwnershipEvent::Kept(owned));
                    }
                }
                (true, None) => {
                    if !self.pending.contains_key(&p) {
                        self.campaign(p);
                    }
                }
                (false, Some(h)) => {
                    if h.until.is_none() {
                        h.until = Some(until);
                        let owned = h.owned(p);
                        self.shared.tell(OwnershipEvent::Draining { owned, until });
                    }
                }
                (false, None) => {
                    if let Some((_, task)) = self.pending.remove(&p) {
                        task.abort();
                    }
                }
            }
        }
        self.wanted = wanted;
        self.let_go_drained().await;
    }

    /// When a partition that moves away now is let go.
    fn drain_deadline(&self, now: Instant) -> Instant {
        // The grace is checked when the group is used (a day at most).
        now.checked_add(self.group.grace_time()).unwrap_or(now)
    }

    fn campaign(&mut self, p: u32) {
        self.campaigns += 1;
        let number = self.campaigns;
        let election = self.group.partition_election(p, &self.id);
        let got = self.got.clone();
        let task = tokio::spawn(async move {
            let taken = election.campaign().await;
            let _ = got.send((p, number, taken));
        });
        self.pending.insert(p, (number, task));
    }

    /// A campaign ended.
    fn taken(&mut self, (p, number, taken): Taken) {
        if self.pending.get(&p).is_none_or(|(n, _)| *n != number) {
            // An aborted campaign's outcome, after a newer one started or none is wanted:
            // let it go (dropping a leadership resigns).
            return;
        }
        self.pending.remove(&p);
        let lease = match taken {
            Ok(l) => l,
            Err(e) => {
                // Tried again at the next read.
                tracing::warn!(group = %self.group.name(), partition = p, error = %e,
                    "taking a partition");
                return;
            }
        };
        if !self.wanted.get(p as usize).copied().unwrap_or(false) {
            // It moved away while we waited: let it go.
            return;
        }
        // Never two records of one partition: an older one is forgotten first.
        let _ = self.forget(p, None);
        let handle = lease.guard().handle();
        let fence = lease.epoch();
        let lost = self.lost.clone();
        let watch_handle = handle.clone();
        let watch = tokio::spawn(async move {
            let reason = watch_handle.lost().await;
            let _ = lost.send((p, fence, reason));
        });
        self.shared.held.locked().insert(p, handle);
        let held = Held {
            lease,
            watch,
            until: None,
        };
        let owned = held.owned(p);
        self.held.insert(p, held);
        self.shared.tell(OwnershipEvent::Gained(owned));
    }

    /// A partition's lease was lost.
    fn lost(&mut self, p: u32, fence: Fence, reason: LostReason) {
        if self.held.get(&p).is_some_and(|h| h.lease.epoch() == fence) {
            let _ = self.forget(p, Some(reason));
        }
    }

    /// Takes `p` out of what we hold, and tells it; its lease is given back to let go (dropped,
    /// it is released in the background).
    fn forget(&mut self, p: u32, reason: Option<LostReason>) -> Option<Leadership> {
        let held = self.held.remove(&p)?;
        held.watch.abort();
        self.shared.held.locked().remove(&p);
        self.shared.tell(OwnershipEvent::Lost {
            owned: held.owned(p),
            reason,
        });
        Some(held.lease)
    }

    /// Lets go of every partition whose grace is over, the releases sent together.
    async fn let_go_drained(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.until.is_some_and(|u| u <= now))
            .map(|(&p, _)| p)
            .collect();
        self.let_go(due).await;
    }

    async fn let_go(&mut self, partitions: Vec<u32>) {
        let leases: Vec<Leadership> = partitions
            .into_iter()
            .filter_map(|p| self.forget(p, None))
            .collect();
        join_all(leases.into_iter().map(Leadership::resign)).await;
    }

    /// Ends: campaigns stopped (one that won meanwhile let go), and every partition let go,
    /// drained first when leaving (a loss during the drain told as a loss).
    async fn end(
        &mut self,
        leave: bool,
        got_rx: &mut mpsc::UnboundedReceiver<Taken>,
        lost_rx: &mut mpsc::UnboundedReceiver<(u32, Fence, LostReason)>,
    ) {
        for (_, (_, task)) in self.pending.drain() {
            task.abort();
        }
        // Outcomes already sent: every one is now stale (nothing pending), so dropped.
        while got_rx.try_recv().is_ok() {}
        if leave {
            let until = self.drain_deadline(Instant::now());
            for (&p, h) in &mut self.held {
                if h.until.is_none() {
                    h.until = Some(until);
                    self.shared.tell(OwnershipEvent::Draining {
                        owned: h.owned(p),
                        until,
                    });
                }
            }
            while let Some(at) = self.held.values().filter_map(|h| h.until).min() {
                tokio::select! {
                    Some((p, fence, reason)) = lost_rx.recv() => self.lost(p, fence, reason),
                    () = tokio::time::sleep_until(at.into()) => self.let_go_drained().await,
                }
            }
        } else {
            let all: Vec<u32> = self.held.keys().copied().collect();
            self.let_go(all).await;
        }
    }
}
