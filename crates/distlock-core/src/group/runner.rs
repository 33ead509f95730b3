//! A member's task: reads the group's members every interval, takes the partitions that
//! rendezvous hashing gives this member (a campaign a partition, which waits for the owner
//! before to let go or run out), and lets go of the ones that moved away once the grace is
//! over. It ends when the membership is lost (every partition let go at once), dropped (the
//! same), or left (each partition drained for the grace first).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::membership::{Shared, Stop};
use super::{Group, Owned, OwnershipEvent, hrw};
use crate::election::Leadership;
use crate::engine::LostReason;
use crate::error::LockError;
use crate::guard::Fence;
use crate::lease::LeaseHandle;
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

/// The member's task state.
struct Runner {
    group: Group,
    id: String,
    shared: Arc<Shared>,
    held: BTreeMap<u32, Held>,
    /// The campaigns in flight, by partition.
    pending: HashMap<u32, JoinHandle<()>>,
    /// The partitions assigned to this member at the last read.
    wanted: Vec<bool>,
    got: mpsc::UnboundedSender<(u32, Result<Leadership, LockError>)>,
    lost: mpsc::UnboundedSender<(u32, Fence, LostReason)>,
}

pub(crate) async fn run(
    group: Group,
    id: String,
    membership: LeaseHandle,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<Stop>,
) {
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
        wanted: vec![false; partitions as usize],
        got,
        lost,
    };
    loop {
        let drain_at = r.held.values().filter_map(|h| h.until).min();
        tokio::select! {
            biased;
            changed = stop.changed() => {
                let leave = changed.is_ok() && *stop.borrow() == Stop::Leave;
                r.end(leave).await;
                return;
            }
            reason = membership.lost() => {
                tracing::warn!(group = %r.group.name(), member = %r.id, %reason,
                    "group membership lost: letting every partition go");
                r.end(false).await;
                return;
            }
            Some((p, taken)) = got_rx.recv() => r.taken(p, taken),
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
    /// Reads the members and moves partitions to match.
    async fn refresh(&mut self) {
        let members = match self.group.members().await {
            Ok(m) => m,
            Err(e) => {
                // The leases decide who owns what; a missed read only delays a move.
                tracing::debug!(group = %self.group.name(), error = %e, "reading the members");
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
        let grace = self.group.grace_time();
        let wanted = std::mem::take(&mut self.wanted);
        for (p, &want) in (0..).zip(&wanted) {
            match (want, self.held.get_mut(&p)) {
                (true, Some(h)) => h.until = None,
                (true, None) => {
                    if !self.pending.contains_key(&p) {
                        self.campaign(p);
                    }
                }
                (false, Some(h)) => {
                    if h.until.is_none() {
                        let until = now + grace;
                        h.until = Some(until);
                        let owned = h.owned(p);
                        self.shared.tell(OwnershipEvent::Draining { owned, until });
                    }
                }
                (false, None) => {
                    if let Some(task) = self.pending.remove(&p) {
                        task.abort();
                    }
                }
            }
        }
        self.wanted = wanted;
        self.let_go_drained().await;
    }

    fn campaign(&mut self, p: u32) {
        let election = self.group.partition_election(p, &self.id);
        let got = self.got.clone();
        let task = tokio::spawn(async move {
            let taken = election.campaign().await;
            let _ = got.send((p, taken));
        });
        self.pending.insert(p, task);
    }

    /// A campaign ended.
    fn taken(&mut self, p: u32, taken: Result<Leadership, LockError>) {
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
            // It moved away while we waited: let it go (dropping resigns).
            return;
        }
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
            self.forget(p, Some(reason));
        }
    }

    /// Takes `p` out of what we hold; its lease is dropped (a release spawned, if still ours).
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

    /// Lets go of every partition whose grace is over.
    async fn let_go_drained(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.until.is_some_and(|u| u <= now))
            .map(|(&p, _)| p)
            .collect();
        for p in due {
            if let Some(lease) = self.forget(p, None) {
                let _ = lease.resign().await;
            }
        }
    }

    /// Ends: campaigns stopped, and every partition let go, drained first when leaving.
    async fn end(&mut self, leave: bool) {
        for (_, task) in self.pending.drain() {
            task.abort();
        }
        if leave {
            let until = Instant::now() + self.group.grace_time();
            for (&p, h) in &mut self.held {
                if h.until.is_none() {
                    h.until = Some(until);
                    self.shared.tell(OwnershipEvent::Draining {
                        owned: h.owned(p),
                        until,
                    });
                }
            }
            while let Some(at) = self.held.values().filter_map(|h| h.until).max() {
                tokio::time::sleep_until(at.into()).await;
                self.let_go_drained().await;
            }
        } else {
            let all: Vec<u32> = self.held.keys().copied().collect();
            for p in all {
                if let Some(lease) = self.forget(p, None) {
                    let _ = lease.resign().await;
                }
            }
        }
    }
}
