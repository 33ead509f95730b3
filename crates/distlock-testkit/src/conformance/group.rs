//! Cases of groups (membership and partition owners), for the engines with fences and
//! listings ([`conformance_group_tests!`](crate::conformance_group_tests)), and the one case an
//! engine without them runs: it refuses, saying why.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, Group, LockClient, Membership, OwnershipEvent};

use super::{MakeClient, key, opts};

/// Declares one `#[tokio::test]` per group case, each calling `$setup` for its own fixture
/// (as [`conformance_tests!`](crate::conformance_tests)); `@why` declares only the case of an
/// engine that cannot hold groups.
#[macro_export]
macro_rules! conformance_group_tests {
    ($setup:expr) => {
        $crate::conformance_tests!(@cases $setup;
            group_members_join_watch_and_leave,
            group_partitions_have_one_owner_each_and_follow_the_members,
            group_grace_keeps_a_moved_partition_until_it_ends,
            group_partition_count_is_fixed_while_the_group_lives,
            group_refuses_bad_input,
            group_join_dropped_half_way_leaves_nothing
        );
    };
    // The case that covers the most, for another setup of an engine that runs them all.
    (@short $setup:expr) => {
        $crate::conformance_tests!(@cases $setup;
            group_partitions_have_one_owner_each_and_follow_the_members
        );
    };
    (@why $setup:expr) => {
        $crate::conformance_tests!(@cases $setup; group_is_refused_with_the_reason);
    };
}

/// How long a group case waits for its partitions to settle.
const SETTLE: Duration = Duration::from_secs(10);

/// A client for one member (a process of its own), with leases of `ttl`.
async fn member_client(make: &impl MakeClient, ttl: Duration) -> LockClient {
    make.client(opts().ttl(ttl).build().unwrap()).await
}

/// The group `name` on `c`: `partitions`, a fast interval, no grace.
fn group(c: &LockClient, name: &str, partitions: u32) -> Group {
    c.group(name)
        .partitions(partitions)
        .interval(Duration::from_millis(50))
}

/// Waits until `done` holds (every 20 ms), at most [`SETTLE`]; panics with `what` otherwise.
async fn settle(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + SETTLE;
    while !done() {
        assert!(
            Instant::now() < until,
            "not settled within {SETTLE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every partition's owner among `members`, or `None` if one is owned twice or not at all.
fn owners(members: &[&Membership], partitions: u32) -> Option<BTreeMap<u32, (String, u64)>> {
    let mut out = BTreeMap::new();
    for m in members {
        for o in m.owned() {
            if out
                .insert(o.partition, (m.id().to_owned(), o.fence.get()))
                .is_some()
            {
                return None;
            }
        }
    }
    (out.len() == partitions as usize).then_some(out)
}

/// An engine without fences or listings refuses a group, and says why.
pub async fn group_is_refused_with_the_reason(make: &impl MakeClient) {
    let c = make.client(opts().build().unwrap()).await;
    let err = c
        .group(key("group-why"))
        .join("m", "v")
        .await
        .expect_err("an engine without fences held a group");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().len() > 40, "no reason given: {err}");
}

/// Members join with a value and an epoch, a watch sees each change with a rising version,
/// an id in use is `Busy`, and a member that leaves is gone.
pub async fn group_members_join_watch_and_leave(make: &impl MakeClient) {
    let ttl = Duration::from_secs(5);
    let (a, b, c) = (
        member_client(make, ttl).await,
        member_client(make, ttl).await,
        member_client(make, ttl).await,
    );
    let name = key("group-members");
    let ga = group(&a, &name, 8);
    let ma = ga.join("m-a", "10.0.0.1:80").await.unwrap();
    assert!(ma.is_member() && ma.epoch().get() > 0);
    let mut watch = group(&c, &name, 8).watch();
    let v1 = watch.changed().await.unwrap().clone();
    assert_eq!(v1.version, 1);
    assert_eq!(v1.members.len(), 1);
    assert_eq!(
        (v1.members[0].id.as_str(), v1.members[0].value.as_str()),
        ("m-a", "10.0.0.1:80")
    );
    assert_eq!(v1.members[0].epoch, ma.epoch());
    assert_eq!(v1.members[0].partitions, 8);
    let mb = group(&b, &name, 8)
        .join("m-b", "10.0.0.2:80")
        .await
        .unwrap();
    let v2 = watch.changed().await.unwrap().clone();
    assert_eq!(v2.version, 2);
    let ids: Vec<&str> = v2.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["m-a", "m-b"]);
    // An id in use.
    let taken = group(&c, &name, 8)
        .join("m-a", "10.0.0.3:80")
        .await
        .expect_err("two live members with one id");
    assert_eq!(taken.kind(), ErrorKind::Busy, "{taken}");
    mb.leave().await.unwrap();
    let v3 = watch.changed().await.unwrap().clone();
    assert_eq!(v3.version, 3);
    assert_eq!(v3.members.len(), 1);
    assert_eq!(v3.members[0].id, "m-a");
    ma.leave().await.unwrap();
    assert!(ga.members().await.unwrap().is_empty());
}

/// Three members share 16 partitions, one owner each, as rendezvous hashing says; the map and
/// `owner_of` agree; when one leaves, the others take its partitions with higher fences.
pub async fn group_partitions_have_one_owner_each_and_follow_the_members(make: &impl MakeClient) {
    const P: u32 = 16;
    let ttl = Duration::from_secs(5);
    let name = key("group-owners");
    let clients = [
        member_client(make, ttl).await,
        member_client(make, ttl).await,
        member_client(make, ttl).await,
    ];
    let mut members = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        members.push(
            group(c, &name, P)
                .join(format!("m-{i}"), format!("10.0.0.{i}:80"))
                .await
                .unwrap(),
        );
    }
    let mut events = members[0].events();
    let router = group(&clients[0], &name, P);
    let view = router.view().await.unwrap();
    assert_eq!(view.members.len(), 3);
    settle("every partition owned once, as assigned", || {
        owners(&members.iter().collect::<Vec<_>>(), P).is_some_and(|o| {
            o.iter()
                .all(|(p, (id, _))| view.owner_of_partition(*p).is_some_and(|m| &m.id == id))
        })
    })
    .await;
    let before = owners(&members.iter().collect::<Vec<_>>(), P).unwrap();
    // The map as another process reads it.
    let map = router.partition_map().await.unwrap();
    assert_eq!(map.len(), P as usize);
    for s in &map {
        let (id, fence) = &before[&s.partition];
        assert_eq!(s.holder.as_ref(), Some(id));
        assert_eq!(s.assigned.as_ref(), Some(id));
        assert_eq!(s.fence.map(|f| f.get()), Some(*fence));
    }
    // A key's owner, as a router asks and as the members see it.
    for k in 0..32 {
        let k = format!("order:{k}");
        let owner = router.owner_of(&k).await.unwrap().expect("an owner");
        assert_eq!(owner.partition, router.partition_of(&k));
        let (id, fence) = &before[&owner.partition];
        assert_eq!(&owner.member, id);
        assert_eq!(owner.fence.map(|f| f.get()), Some(*fence));
        let n: usize = owner.member[2..].parse().unwrap();
        assert_eq!(owner.value, format!("10.0.0.{n}:80"));
        for (i, m) in members.iter().enumerate() {
            assert_eq!(m.fence_for(&k).is_some(), i == n, "{k} on m-{i}");
        }
    }
    // Member 0 heard of each partition it gained.
    let mut gained = BTreeSet::new();
    while let Ok(e) = events.try_recv() {
        if let OwnershipEvent::Gained(o) = e {
            gained.insert(o.partition);
        }
    }
    let mine: BTreeSet<u32> = members[0].owned().iter().map(|o| o.partition).collect();
    assert!(mine.is_subset(&gained), "{mine:?} not all in {gained:?}");
    // Member 1 leaves: its partitions go to the others, with higher fences.
    let leaver = members.remove(1);
    leaver.leave().await.unwrap();
    settle("the leaver's partitions taken over", || {
        owners(&members.iter().collect::<Vec<_>>(), P).is_some()
    })
    .await;
    let after = owners(&members.iter().collect::<Vec<_>>(), P).unwrap();
    for (p, (id, fence)) in &before {
        let (now_id, now_fence) = &after[p];
        if id == "m-1" {
            assert_ne!(now_id, "m-1");
            assert!(
                now_fence > fence,
                "partition {p}: fence {now_fence} after {fence}"
            );
        } else {
            // Rendezvous hashing moves only the leaver's partitions.
            assert_eq!((now_id, now_fence), (id, fence), "partition {p} moved");
        }
    }
    for m in members {
        m.leave().await.unwrap();
    }
}

/// A partition that moves to a newcomer stays with its owner for the grace (draining, its
/// fence valid), and the newcomer takes it after, with a higher fence.
pub async fn group_grace_keeps_a_moved_partition_until_it_ends(make: &impl MakeClient) {
    const P: u32 = 8;
    let grace = Duration::from_millis(600);
    let ttl = Duration::from_secs(5);
    let (a, b) = (
        member_client(make, ttl).await,
        member_client(make, ttl).await,
    );
    let name = key("group-grace");
    let ma = group(&a, &name, P)
        .grace(grace)
        .join("m-a", "a")
        .await
        .unwrap();
    settle("the first member owns everything", || {
        ma.owned().len() == P as usize
    })
    .await;
    let first: BTreeMap<u32, u64> = ma
        .owned()
        .iter()
        .map(|o| (o.partition, o.fence.get()))
        .collect();
    let mut events = ma.events();
    let joined = Instant::now();
    let mb = group(&b, &name, P)
        .grace(grace)
        .join("m-b", "b")
        .await
        .unwrap();
    let mut draining = BTreeMap::new();
    let mut let_go = BTreeMap::new();
    while draining.is_empty() || let_go.len() < draining.len() {
        let e = tokio::time::timeout(SETTLE, events.recv())
            .await
            .expect("no ownership event")
            .unwrap();
        match e {
            OwnershipEvent::Draining { owned, until } => {
                assert!(until >= joined + grace);
                // Still ours, its fence valid, while it drains.
                assert!(ma.owned().iter().any(|o| o.partition == owned.partition));
                draining.insert(owned.partition, until);
            }
            OwnershipEvent::Lost { owned, reason } => {
                assert_eq!(reason, None, "partition {} lost", owned.partition);
                let_go.insert(owned.partition, Instant::now());
            }
            OwnershipEvent::Gained(_) => {}
            _ => {}
        }
    }
    // Each let go once its grace was over, not before.
    for (p, at) in &let_go {
        assert!(
            *at >= draining[p],
            "partition {p} let go before its grace ended"
        );
    }
    settle("the newcomer owns the moved partitions", || {
        owners(&[&ma, &mb], P).is_some()
    })
    .await;
    // Within the grace, a read of the members (50 ms) and a wake-up (a second allowed for a
    // loaded machine), counted from the join.
    let bound = grace + Duration::from_millis(50) + Duration::from_secs(1);
    assert!(
        joined.elapsed() < bound,
        "the moved partitions owned again {:?} after the join (bound {bound:?})",
        joined.elapsed()
    );
    for o in mb.owned() {
        assert!(let_go.contains_key(&o.partition));
        assert!(o.fence.get() > first[&o.partition]);
    }
    ma.leave().await.unwrap();
    mb.leave().await.unwrap();
}

/// A member that joins with another number of partitions than the live ones gets
/// `KindConflict`, and stays out.
pub async fn group_partition_count_is_fixed_while_the_group_lives(make: &impl MakeClient) {
    let ttl = Duration::from_secs(5);
    let (a, b) = (
        member_client(make, ttl).await,
        member_client(make, ttl).await,
    );
    let name = key("group-count");
    let ma = group(&a, &name, 8).join("m-a", "a").await.unwrap();
    let err = group(&b, &name, 16)
        .join("m-b", "b")
        .await
        .expect_err("a member with another number of partitions joined");
    assert_eq!(err.kind(), ErrorKind::KindConflict, "{err}");
    let ids: Vec<String> = group(&b, &name, 8)
        .members()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, ["m-a"]);
    ma.leave().await.unwrap();
}

/// Bad group names, member ids and partition counts are refused before anything is sent.
pub async fn group_refuses_bad_input(make: &impl MakeClient) {
    let c = make.client(opts().build().unwrap()).await;
    let kind = |r: Result<Membership, distlock_core::LockError>| r.map(drop).map_err(|e| e.kind());
    assert_eq!(
        kind(c.group("a/b").join("m", "v").await),
        Err(ErrorKind::InvalidKey)
    );
    assert_eq!(
        kind(c.group("").join("m", "v").await),
        Err(ErrorKind::InvalidKey)
    );
    let name = key("group-bad");
    assert_eq!(
        kind(c.group(&name).join("", "v").await),
        Err(ErrorKind::InvalidKey)
    );
    assert_eq!(
        kind(c.group(&name).join("a\nb", "v").await),
        Err(ErrorKind::InvalidKey)
    );
    assert_eq!(
        kind(c.group(&name).partitions(0).join("m", "v").await),
        Err(ErrorKind::Config)
    );
    assert_eq!(
        kind(c.group(&name).join("m", "v".repeat(5_000)).await),
        Err(ErrorKind::Config)
    );
    assert_eq!(
        kind(
            c.group(&name)
                .grace(Duration::from_secs(2 * 86_400))
                .join("m", "v")
                .await
        ),
        Err(ErrorKind::Config)
    );
    assert!(c.group(&name).members().await.unwrap().is_empty());
}

/// A join whose future is dropped half-way leaves no member behind (its lease let go at once,
/// not left to run out), and the id can join again.
pub async fn group_join_dropped_half_way_leaves_nothing(make: &impl MakeClient) {
    let c = member_client(make, Duration::from_secs(30)).await;
    let name = key("group-dropped");
    let g = group(&c, &name, 8);
    for wait_us in [1, 100, 1_000, 5_000] {
        let _ = tokio::time::timeout(Duration::from_micros(wait_us), g.join("m-a", "a")).await;
        // Joined or not, nothing stays: a finished join's membership was dropped too.
        let until = Instant::now() + Duration::from_secs(5);
        while !g.members().await.unwrap().is_empty() {
            assert!(
                Instant::now() < until,
                "a dropped join left its member behind"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let m = g.join("m-a", "a").await.unwrap();
    m.leave().await.unwrap();
}
