//! Group membership, and partitions with one fenced owner at a time: `client.group(name)`.
//!
//! A member holds a lease on its own name, like a leader (its epoch is that lease's fence, its
//! value rides in the holder's label), so `members()` is a listing of the group's member names.
//! A group has `P` partitions; a key's partition is a stable hash of it, and a partition's owner
//! is chosen by rendezvous hashing over the live members ([`hrw`]), so a join or a leave moves
//! about `1/N` of them. A member acts on a partition only while it holds that partition's
//! lease, an election on the partition's name: the lease passes on only once the owner before
//! released it or its lease ran out, and its fence strictly increases, so a protected resource
//! refuses a stale owner's writes. The members' views of the group may differ for a moment (a
//! join seen by one member before another); that moves partitions later or sooner, never to two
//! owners at once, which the leases alone decide.
//!
//! Everything is written on the election, so every engine with leases, fences and a listing
//! has groups. See `docs/ownership.md`.

use std::time::Duration;

use crate::client::LockClient;
use crate::election::{DEFAULT_OBSERVE_INTERVAL, Election, MAX_VALUE_LEN, leader_of};
use crate::engine::Fencing;
use crate::error::{ErrorKind, LockError};
use crate::guard::Fence;
use crate::options::{LockOptions, LockOptionsBuilder};

mod hrw;
mod membership;
mod names;
mod runner;
mod watch;

pub use membership::{Membership, Owned, OwnershipEvent};
pub use names::{MAX_GROUP_LEN, MAX_MEMBER_LEN, MAX_PARTITIONS};
pub use watch::GroupWatch;

/// A group's number of partitions unless [`Group::partitions`] says another.
pub const DEFAULT_PARTITIONS: u32 = 256;

/// The most members a group lists.
const MAX_MEMBERS: usize = 100_000;

/// The longest grace a group takes.
pub const MAX_GRACE: Duration = Duration::from_secs(24 * 60 * 60);

/// A group of members that share its partitions, made by [`LockClient::group`].
///
/// ```no_run
/// # async fn demo(locks: distlock_core::LockClient) -> Result<(), distlock_core::LockError> {
/// let group = locks.group("orders");
/// let me = group.join("node-1", "10.0.0.5:8080").await?;
/// // Serve a request for a key only while this member owns its partition, and write with the
/// // partition's fence, so that a store refuses a stale owner.
/// if let Some(fence) = me.fence_for("order:42") {
///     println!("serving order:42 with fence {fence}");
/// }
/// // A router that does not join asks who owns a key.
/// if let Some(owner) = group.owner_of("order:42").await? {
///     println!("order:42 is {}'s, at {}", owner.member, owner.value);
/// }
/// me.leave().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Group {
    client: LockClient,
    name: String,
    partitions: u32,
    options: LockOptionsBuilder,
    grace: Duration,
    interval: Duration,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .field("partitions", &self.partitions)
            .field("grace", &self.grace)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// One live member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// Its id, unique in the group.
    pub id: String,
    /// The value it published when it joined (its address, say).
    pub value: String,
    /// Its epoch: the fence of its membership's lease, above every earlier membership of its id.
    pub epoch: Fence,
    /// The number of partitions it joined with.
    pub partitions: u32,
}

/// A group's members as one read found them, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct View {
    /// Counts the views a [`GroupWatch`] has given, from 1 (0 for a view read once).
    pub version: u64,
    /// The live members, sorted by id.
    pub members: Vec<Member>,
}

impl View {
    /// The member that rendezvous hashing gives `partition` to among these members.
    pub fn owner_of_partition(&self, partition: u32) -> Option<&Member> {
        let id = hrw::owner(self.members.iter().map(|m| m.id.as_str()), partition)?;
        self.members.iter().find(|m| m.id == id)
    }
}

/// Who owns a key: [`Group::owner_of`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyOwner {
    /// The key's partition.
    pub partition: u32,
    /// The member that owns it: the holder of the partition's lease, or, while nobody holds
    /// it, the member that rendezvous hashing gives it to (it takes it within a wake-up).
    pub member: String,
    /// That member's published value (empty when it has left since).
    pub value: String,
    /// The partition's fence when its lease is held, `None` between two owners.
    pub fence: Option<Fence>,
}

/// One partition of [`Group::partition_map`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionState {
    /// Its number.
    pub partition: u32,
    /// The member holding its lease, if anybody.
    pub holder: Option<String>,
    /// Its fence, while held.
    pub fence: Option<Fence>,
    /// The member that rendezvous hashing gives it to among the live members.
    pub assigned: Option<String>,
}

impl LockClient {
    /// The group `name`: its members, partitions and owners. Nothing is sent until it is used.
    /// Its leases take this client's options (TTL, waits), and [`Group::options`] others.
    pub fn group(&self, name: impl Into<String>) -> Group {
        Group {
            client: self.clone(),
            name: name.into(),
            partitions: DEFAULT_PARTITIONS,
            options: self.default_options().to_builder(),
            grace: Duration::ZERO,
            interval: DEFAULT_OBSERVE_INTERVAL,
        }
    }
}

impl Group {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of partitions (default [`DEFAULT_PARTITIONS`]): fixed while any lease of the
    /// group lives, so a member that joins with another number gets `KindConflict`.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// The TTL of the membership's and the partitions' leases.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// Replaces the leases' options.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options.to_builder();
        self
    }

    /// How long an owner keeps a partition that has moved to another member before it lets it
    /// go, to finish what it was doing with it (default none). The partition stays its own, and
    /// its fence valid, until then; the new owner takes it at once after.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How often a member reads the group's members, and a [`GroupWatch`] reads them again
    /// (default 1 s; 10 ms at least): a join or a leave moves partitions within it.
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = every.max(Duration::from_millis(10));
        self
    }

    /// The partition of `key` among this group's partitions (see the module's doc).
    pub fn partition_of(&self, key: &str) -> u32 {
        hrw::partition_of(key, self.partitions)
    }

    fn check(&self) -> Result<(), LockError> {
        names::check_group(&self.name)?;
        names::check_partitions(self.partitions)?;
        if self.grace > MAX_GRACE {
            return Err(LockError::new(
                ErrorKind::Config,
                format!(
                    "a group's grace is at most {MAX_GRACE:?}, not {:?}",
                    self.grace
                ),
            ));
        }
        let backend = self.client.backend();
        if let Fencing::Unavailable(why) = backend.capabilities().fencing {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot hold a group: a partition's owner is known by its \
                     lease's fence, and this engine gives none ({why})",
                    backend.name()
                ),
            ));
        }
        Ok(())
    }

    /// The election of `name` with `value` published and the group's options.
    fn election(&self, name: String, value: String) -> Election {
        self.client
            .election(name)
            .value(value)
            .options(self.options.clone().build().unwrap_or_default())
    }

    /// The live members, sorted by id: one listing of the members' names.
    ///
    /// # Errors
    /// `InvalidKey` for a bad group name, `Config` for a grace over [`MAX_GRACE`],
    /// `Unsupported` on an engine without fences or listings, `Exhausted` past 100,000
    /// members, and the engine's errors (a member's status that cannot be read among them:
    /// a read is whole or fails).
    ///
    /// # Cancel safety
    /// Cancel-safe (reads).
    pub async fn members(&self) -> Result<Vec<Member>, LockError> {
        self.check()?;
        let prefix = names::members_prefix(&self.name);
        let listing = self.client.list(&prefix, MAX_MEMBERS).await?;
        if listing.more {
            return Err(LockError::new(
                ErrorKind::Exhausted,
                format!(
                    "group {:?} lists more than {MAX_MEMBERS} members",
                    self.name
                ),
            ));
        }
        // A member whose status could not be read makes the read fail: a view without it
        // would move its partitions, and could miss a member with another number of them.
        if let Some((name, Err(e))) = listing
            .locks
            .iter()
            .map(|l| (&l.name, &l.status))
            .find(|(_, s)| s.is_err())
        {
            return Err(LockError::new(
                e.kind(),
                format!("reading member {name:?} of group {:?}: {e}", self.name),
            ));
        }
        let mut out: Vec<Member> = listing
            .locks
            .iter()
            .filter_map(|l| {
                let id = l.name.strip_prefix(&prefix)?;
                // A lock under the members' names that no member took is not a member.
                let leader = leader_of(l.status.as_ref().ok()?)?;
                let (partitions, value) = names::read_published(leader.value.as_deref()?)?;
                Some(Member {
                    id: id.to_owned(),
                    value: value.to_owned(),
                    epoch: leader.epoch?,
                    partitions,
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The members now, as a [`View`] of version 0.
    ///
    /// # Errors
    /// As [`members`](Self::members).
    pub async fn view(&self) -> Result<View, LockError> {
        Ok(View {
            version: 0,
            members: self.members().await?,
        })
    }

    /// Each change of the group's members, as it is read (see [`GroupWatch`]).
    pub fn watch(&self) -> GroupWatch {
        GroupWatch::new(self.clone())
    }

    /// Who owns `key`, without joining (for routers): its partition, the member holding that
    /// partition's lease (or the one it goes to while nobody holds it), that member's value and
    /// the partition's fence. `None` when the group has no member.
    ///
    /// # Errors
    /// `KindConflict` when the partition's owner took it with another number of partitions
    /// than this `Group`'s; as [`members`](Self::members) otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe (reads).
    pub async fn owner_of(&self, key: &str) -> Result<Option<KeyOwner>, LockError> {
        self.check()?;
        let partition = self.partition_of(key);
        let holder = self
            .client
            .election(names::partition_name(&self.name, partition))
            .leader()
            .await?;
        if let Some(leader) = holder
            && let Some((p, member)) = leader.value.as_deref().and_then(names::read_published)
        {
            self.same_partitions(p)?;
            // The holder's published value: one read of its membership.
            let value = self
                .client
                .election(names::member_name(&self.name, member))
                .leader()
                .await?
                .and_then(|l| l.value)
                .and_then(|v| names::read_published(&v).map(|(_, v)| v.to_owned()))
                .unwrap_or_default();
            return Ok(Some(KeyOwner {
                partition,
                member: member.to_owned(),
                value,
                fence: leader.epoch,
            }));
        }
        let members = self.members().await?;
        let live: Vec<&str> = self.live_ids(&members)?;
        Ok(hrw::owner(live, partition).map(|id| KeyOwner {
            partition,
            member: id.to_owned(),
            value: members
                .iter()
                .find(|m| m.id == id)
                .map(|m| m.value.clone())
                .unwrap_or_default(),
            fence: None,
        }))
    }

    /// Every partition: its holder and fence, and the member it is assigned to now.
    ///
    /// # Errors
    /// As [`owner_of`](Self::owner_of).
    pub async fn partition_map(&self) -> Result<Vec<PartitionState>, LockError> {
        self.check()?;
        let members = self.members().await?;
        let live = self.live_ids(&members)?;
        let assigned = hrw::assign(&live, self.partitions);
        let mut out: Vec<PartitionState> = assigned
            .iter()
            .zip(0..)
            .map(|(a, partition)| PartitionState {
                partition,
                holder: None,
                fence: None,
                assigned: a.map(|i| live[i].to_owned()),
            })
            .collect();
        let prefix = names::partitions_prefix(&self.name);
        let listing = self.client.list(&prefix, MAX_PARTITIONS as usize).await?;
        for l in &listing.locks {
            let Some(p) = names::partition_of_name(&prefix, &l.name) else {
                continue;
            };
            let Some(leader) = l.status.as_ref().ok().and_then(leader_of) else {
                continue;
            };
            let Some((n, member)) = leader.value.as_deref().and_then(names::read_published) else {
                continue;
            };
            self.same_partitions(n)?;
            if let Some(slot) = out.get_mut(p as usize) {
                slot.holder = Some(member.to_owned());
                slot.fence = leader.epoch;
            }
        }
        Ok(out)
    }

    /// The ids of `members` that share this group's number of partitions; `KindConflict` if a
    /// member has another.
    fn live_ids<'a>(&self, members: &'a [Member]) -> Result<Vec<&'a str>, LockError> {
        for m in members {
            self.same_partitions(m.partitions)?;
        }
        Ok(members.iter().map(|m| m.id.as_str()).collect())
    }

    fn same_partitions(&self, found: u32) -> Result<(), LockError> {
        if found == self.partitions {
            Ok(())
        } else {
            Err(LockError::new(
                ErrorKind::KindConflict,
                format!(
                    "group {:?} has {found} partitions, and this one was asked with {}: a \
                     group's number of partitions is fixed while any of its leases lives",
                    self.name, self.partitions
                ),
            ))
        }
    }

    /// Joins the group as `id`, publishing `value` (an address, say): the membership's lease,
    /// and a task of its own that takes the partitions assigned to this member and lets go of
    /// the ones that move away (after the grace). See [`Membership`].
    ///
    /// # Errors
    /// - `InvalidKey` for a bad group name or member id; `Config` for a bad number of
    ///   partitions or a value the engine cannot hold; `Unsupported` on an engine without
    ///   fences or listings;
    /// - `Busy` when a live member has this id already (its lease runs out in its TTL if it
    ///   died);
    /// - `KindConflict` when a live lease of the group was taken with another number of
    ///   partitions (nothing stays taken then);
    /// - the engine's errors.
    ///
    /// # Cancel safety
    /// Cancel-safe: a join dropped half-way lets go of what it took.
    pub async fn join(
        &self,
        id: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Membership, LockError> {
        let (id, value) = (id.into(), value.into());
        self.check()?;
        names::check_member(&id)?;
        self.options.clone().build()?;
        let published = names::publish(self.partitions, &value);
        if published.len() > MAX_VALUE_LEN {
            return Err(LockError::new(
                ErrorKind::Config,
                format!(
                    "a member's value is at most {} bytes in a group of {} partitions, not {}",
                    MAX_VALUE_LEN - (published.len() - value.len()),
                    self.partitions,
                    value.len()
                ),
            ));
        }
        let lease = self
            .election(names::member_name(&self.name, &id), published)
            .try_campaign()
            .await?
            .ok_or_else(|| {
                LockError::new(
                    ErrorKind::Busy,
                    format!(
                        "a live member of group {:?} has the id {id:?} already",
                        self.name
                    ),
                )
            })?;
        // Written first, read after: of two members that join with different numbers of
        // partitions at once, the later one's read finds the earlier one's lease. The read
        // starts once the listing shows our own lease (an engine that records names for its
        // listings in the background shows it a moment after), so it sees every lease written
        // before ours.
        if let Err(e) = self.conflicts(&id, lease.epoch()).await {
            let _ = lease.resign().await;
            return Err(e);
        }
        Ok(Membership::start(self.clone(), id, value, lease))
    }

    /// `KindConflict` if a live member or partition owner of the group has another number of
    /// partitions than ours, read once the listing shows member `id` at `epoch`.
    async fn conflicts(&self, id: &str, epoch: Fence) -> Result<(), LockError> {
        const SHOWS_WITHIN: Duration = Duration::from_secs(5);
        let since = std::time::Instant::now();
        let mut pause = Duration::from_millis(5);
        let members = loop {
            let members = self.members().await?;
            if members.iter().any(|m| m.id == id && m.epoch == epoch) {
                break members;
            }
            if since.elapsed() > SHOWS_WITHIN {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!(
                        "member {id:?} of group {:?} does not show in the engine's listing \
                         {SHOWS_WITHIN:?} after it joined",
                        self.name
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        };
        self.live_ids(&members)?;
        self.partition_map().await.map(drop)
    }

    pub(crate) fn grace_time(&self) -> Duration {
        self.grace
    }

    pub(crate) fn poll_interval(&self) -> Duration {
        self.interval
    }

    pub(crate) fn partition_count(&self) -> u32 {
        self.partitions
    }

    /// The election of `partition`, published as `id`'s.
    pub(crate) fn partition_election(&self, partition: u32, id: &str) -> Election {
        self.election(
            names::partition_name(&self.name, partition),
            names::publish(self.partitions, id),
        )
    }
}
