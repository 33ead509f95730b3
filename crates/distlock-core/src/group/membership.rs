//! A member's side of a group: [`Membership`], what it owns ([`Owned`]) and the events of its
//! ownership ([`OwnershipEvent`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{broadcast, watch};

use super::{Group, hrw, runner};
use crate::election::Leadership;
use crate::engine::LostReason;
use crate::error::{ErrorKind, LockError};
use crate::guard::Fence;
use crate::lease::{LeaseEnd, LeaseHandle};
use crate::recipes::MutexExt;

/// How many ownership events a slow subscriber may fall behind before it misses some.
const EVENTS_KEPT: usize = 4096;

/// A partition this member owns, with its lease's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owned {
    /// The partition.
    pub partition: u32,
    /// Its fence: above every earlier owner's of the partition.
    pub fence: Fence,
}

/// A change of what a member owns, as [`Membership::events`] tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnershipEvent {
    /// The partition is ours, with this fence.
    Gained(Owned),
    /// The partition has moved to another member: it stays ours, its fence valid, until
    /// `until` (the group's grace), then it is let go.
    Draining {
        /// The partition and its fence.
        owned: Owned,
        /// When it is let go.
        until: Instant,
    },
    /// A draining partition was assigned to this member again before its grace ended: it stays
    /// ours, with the same fence.
    Kept(Owned),
    /// The partition is ours no longer: released, or its lease lost (then with the reason).
    Lost {
        /// The partition and the fence it had.
        owned: Owned,
        /// Why the lease was lost; `None` when this member let it go.
        reason: Option<LostReason>,
    },
}

/// What a member and its task share: the partitions held, and the events.
pub(crate) struct Shared {
    pub(crate) held: Mutex<BTreeMap<u32, LeaseHandle>>,
    pub(crate) events: broadcast::Sender<OwnershipEvent>,
}

impl Shared {
    pub(crate) fn tell(&self, event: OwnershipEvent) {
        // Nobody listening is not an error.
        let _ = self.events.send(event);
    }
}

/// How the member's task is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Keep going.
    Run,
    /// A graceful leave: drain every partition for the grace, then let it go.
    Leave,
}

/// This process's membership of a group, from [`Group::join`]: the membership's lease (renewed
/// by the watchdog, like a leader's), and a task that takes the partitions assigned to this
/// member and lets go of the ones that move away.
///
/// Act on a key only while [`fence_for`](Self::fence_for) gives its partition's fence, and
/// write with that fence: the partition may move at any time (a member joins, this one pauses
/// past its lease), and a store that keeps the highest fence it has seen refuses a stale
/// owner. Dropping the membership lets go of everything at once; [`leave`](Self::leave) drains
/// first.
#[must_use = "dropping a membership leaves the group at once"]
pub struct Membership {
    group: Group,
    id: String,
    value: String,
    epoch: Fence,
    /// The membership's lease, which the task holds (so that the lease goes if the task ever
    /// ends, however it ends).
    lease: LeaseHandle,
    shared: Arc<Shared>,
    /// The receiver made with the channel, before the task started: the first call of
    /// `events` gets it, so that it misses nothing from the join on.
    first_events: Mutex<Option<broadcast::Receiver<OwnershipEvent>>>,
    stop: watch::Sender<Stop>,
    task: Option<tokio::task::JoinHandle<Result<(), LockError>>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("group", &self.group.name())
            .field("id", &self.id)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// The membership of `id` in `group`, whose lease is `lease`; its task started.
    pub(crate) fn start(group: Group, id: String, value: String, lease: Leadership) -> Self {
        let (events, first_events) = broadcast::channel(EVENTS_KEPT);
        let shared = Arc::new(Shared {
            held: Mutex::new(BTreeMap::new()),
            events,
        });
        let (stop, stopped) = watch::channel(Stop::Run);
        let (epoch, handle) = (lease.epoch(), lease.guard().handle());
        let task = tokio::spawn(runner::run(
            group.clone(),
            id.clone(),
            lease,
            shared.clone(),
            stopped,
        ));
        Membership {
            group,
            id,
            value,
            epoch,
            lease: handle,
            shared,
            first_events: Mutex::new(Some(first_events)),
            stop,
            task: Some(task),
        }
    }

    /// The member's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The value it published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Its epoch: its membership lease's fence.
    pub fn epoch(&self) -> Fence {
        self.epoch
    }

    /// Whether it is still a member: its lease is ours, its local deadline has not passed, and
    /// its task runs.
    pub fn is_member(&self) -> bool {
        self.lease.is_held() && self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Resolves when the membership ends without a leave: its lease lost (its task then lets
    /// every partition go), or its task stopped (then `Expired`: the lease was let go with it).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) -> LostReason {
        match self.lease.ended().await {
            LeaseEnd::Lost(reason) => reason,
            LeaseEnd::Released => LostReason::Expired,
        }
    }

    /// The partitions this member owns now, with their fences, in order (the ones whose lease
    /// is still valid on this process's clock).
    pub fn owned(&self) -> Vec<Owned> {
        self.shared
            .held
            .locked()
            .iter()
            .filter(|(_, h)| h.is_held())
            .filter_map(|(&partition, h)| {
                Some(Owned {
                    partition,
                    fence: Fence::new(h.fence()?),
                })
            })
            .collect()
    }

    /// The fence of `key`'s partition while this member owns it; `None` otherwise (route the
    /// key to its owner: [`Group::owner_of`]).
    pub fn fence_for(&self, key: &str) -> Option<Fence> {
        let p = hrw::partition_of(key, self.group.partition_count());
        let held = self.shared.held.locked();
        let h = held.get(&p).filter(|h| h.is_held())?;
        h.fence().map(Fence::new)
    }

    /// The events of this member's ownership: each partition gained, draining, kept and lost. The
    /// first call's receiver has every event from the join on; a later call's, from then on.
    /// A subscriber that falls more than 4,096 events behind misses the oldest
    /// (`RecvError::Lagged`); [`owned`](Self::owned) is always current.
    pub fn events(&self) -> broadcast::Receiver<OwnershipEvent> {
        self.first_events
            .locked()
            .take()
            .unwrap_or_else(|| self.shared.events.subscribe())
    }

    /// Leaves the group gracefully: the membership's lease goes first (the other members then
    /// take over its partitions as they are let go), each partition is kept for the group's
    /// grace, then released.
    ///
    /// # Errors
    /// `Lost` when the membership had ended already (its partitions were let go then); the
    /// engine's, from the membership's release (its lease then runs out by itself). The
    /// partitions are let go either way.
    ///
    /// # Cancel safety
    /// Once called, the leave goes on in the background if the future is dropped: each
    /// partition still drains for the grace.
    pub async fn leave(mut self) -> Result<(), LockError> {
        let _ = self.stop.send(Stop::Leave);
        match self.task.take() {
            Some(task) => match task.await {
                Ok(done) => done,
                Err(e) => Err(LockError::new(
                    ErrorKind::Lost,
                    format!("the group member's task ended before the leave: {e}"),
                )),
            },
            None => Ok(()),
        }
    }
}
