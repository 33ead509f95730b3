//! What the bundled engines share beyond the engine interface ([`crate::engine`]): recipes
//! written once and used by several engines, and small helpers. An engine of your own may use
//! them; an application needs none of them.
//!
//! | recipe | what it is | used by |
//! |---|---|---|
//! | [`pool`] | many locks on each server session: placement, keep-alives, the session's end | PostgreSQL, MySQL/MariaDB |
//! | [`holders`] | the rows recorded holders (an election's leader) write about themselves, by token | PostgreSQL, MySQL/MariaDB |
//! | [`names`] | the names behind a server's lock ids, recorded in the background for `distlock list` | PostgreSQL, MySQL/MariaDB |
//! | [`queue`] | a FIFO queue of entries by creation order, each watching its predecessor | etcd, ZooKeeper |
//! | [`WakeHub`], [`PredecessorWatches`] | one subscription per name, shared by this client's waiters | Redis, etcd, ZooKeeper, PostgreSQL, file |
//!
//! The helpers: holder values ([`HolderValue`], [`tag_value`]), compact tokens for maps of many
//! leases ([`CompactToken`]), the errors two kinds of one name give ([`kind_conflict`],
//! [`shares_unbreakable`]).

pub mod holders;
pub mod names;
pub mod pool;
pub mod queue;

/// The wake-up hub lives beside [`Subscription`](crate::engine::Subscription), which it makes.
pub use crate::engine::wake::{PredecessorWatches, WakeHub};

use crate::engine::LeaseKind;
use crate::error::LockError;
pub use crate::sync::MutexExt;
pub use crate::token::{CompactToken, HolderValue, unix_ms};

/// A stored holder value with its lease's kind in front, for stores that keep the kind in the
/// value: an exclusive lease's value is unchanged (a mutex reads as before), another kind's
/// is `~<tag> <value>`.
pub fn tag_value(kind: LeaseKind, value: String) -> String {
    match kind {
        LeaseKind::Exclusive => value,
        k => format!("~{} {value}", k.tag()),
    }
}

/// Reads a value written by [`tag_value`]: the kind, and the holder value after it. A tag no
/// version of distlock writes reads as exclusive, the kind that lets nothing in beside it.
pub fn untag_value(value: &str) -> (LeaseKind, &str) {
    if let Some(rest) = value.strip_prefix('~')
        && let Some((tag, holder)) = rest.split_once(' ')
    {
        return (
            LeaseKind::from_tag(tag).unwrap_or(LeaseKind::Exclusive),
            holder,
        );
    }
    (LeaseKind::Exclusive, value)
}

/// The refusal of `force_release` on a name held in shares (readers, or a semaphore's
/// permits; `held_by` says which): each share ends with its own holder's lease, and none is
/// broken.
pub fn shares_unbreakable(name: &str, held_by: &str) -> LockError {
    LockError::new(
        crate::error::ErrorKind::Unsupported,
        format!(
            "{name:?} is held by {held_by}: each ends with its own holder's session or TTL \
             (breaking them is not supported)"
        ),
    )
}

/// What a break of `name` finds in its status `st`: `Ok(false)` when nothing holds it, `Ok(true)`
/// when a holder can be broken, and [`shares_unbreakable`] when a semaphore's permits hold it.
///
/// # Errors
/// `Unsupported` for a semaphore's permits.
pub fn breakable(name: &str, st: &crate::engine::LockStatus) -> Result<bool, LockError> {
    if !st.held {
        return Ok(false);
    }
    if st
        .holders
        .iter()
        .any(|h| matches!(h.kind, LeaseKind::Permit { .. }))
    {
        return Err(shares_unbreakable(name, "a semaphore's permits"));
    }
    Ok(true)
}

/// The error for a name used with two kinds that cannot meet: as a semaphore and as a lock,
/// or as semaphores of different sizes. Nothing is taken.
pub fn kind_conflict(name: &str, ours: LeaseKind, theirs: LeaseKind) -> LockError {
    let what = |k: LeaseKind| match k {
        LeaseKind::Permit { permits } => format!("a semaphore of {permits} permits"),
        LeaseKind::Shared | LeaseKind::Exclusive => "a lock (mutex or read-write)".to_owned(),
    };
    LockError::new(
        crate::error::ErrorKind::KindConflict,
        format!(
            "{name:?} is in use as {}, and was asked for as {}: one name is one kind, with one \
             capacity",
            what(theirs),
            what(ours)
        ),
    )
}
