//! A group's lock names and the values its holders publish.
//!
//! A member of group `G` holds the lock `group/G/member/<id>`, and the owner of partition `p`
//! holds `group/G/partition/<p>`: each is an election (see `election.rs`), so its fence is the
//! member's epoch or the partition's fence, and its value rides in the holder's label. The
//! value a member publishes is `<P>/<its value>` and a partition's owner publishes
//! `<P>/<member id>`, where `P` is the group's number of partitions: every live lease of the
//! group says which `P` it was taken with.

use crate::error::{ErrorKind, LockError};

/// The longest group name, in bytes.
pub const MAX_GROUP_LEN: usize = 256;

/// The longest member id, in bytes.
pub const MAX_MEMBER_LEN: usize = 256;

/// The most partitions a group may have.
pub const MAX_PARTITIONS: u32 = 65_536;

/// Checks a group name: non-empty, at most [`MAX_GROUP_LEN`] bytes, no `/` (it separates the
/// group's names) and no control character.
pub(crate) fn check_group(name: &str) -> Result<(), LockError> {
    let why = if name.is_empty() {
        "a group's name is empty"
    } else if name.len() > MAX_GROUP_LEN {
        "a group's name is longer than 256 bytes"
    } else if name.contains('/') {
        "a group's name may not contain '/'"
    } else if name.chars().any(char::is_control) {
        "a group's name contains a control character"
    } else {
        return Ok(());
    };
    Err(LockError::new(
        ErrorKind::InvalidKey,
        format!("{why}: {name:?}"),
    ))
}

/// Checks a member id: non-empty, at most [`MAX_MEMBER_LEN`] bytes, no control character.
pub(crate) fn check_member(id: &str) -> Result<(), LockError> {
    let why = if id.is_empty() {
        "a member id is empty"
    } else if id.len() > MAX_MEMBER_LEN {
        "a member id is longer than 256 bytes"
    } else if id.chars().any(char::is_control) {
        "a member id contains a control character"
    } else {
        return Ok(());
    };
    Err(LockError::new(
        ErrorKind::InvalidKey,
        format!("{why}: {id:?}"),
    ))
}

/// Checks a number of partitions: 1 to [`MAX_PARTITIONS`].
pub(crate) fn check_partitions(p: u32) -> Result<(), LockError> {
    if (1..=MAX_PARTITIONS).contains(&p) {
        Ok(())
    } else {
        Err(LockError::new(
            ErrorKind::Config,
            format!("a group has 1 to {MAX_PARTITIONS} partitions, not {p}"),
        ))
    }
}

/// The prefix of every member's lock name of `group`.
pub(crate) fn members_prefix(group: &str) -> String {
    format!("group/{group}/member/")
}

/// The lock name of member `id` of `group`.
pub(crate) fn member_name(group: &str, id: &str) -> String {
    format!("group/{group}/member/{id}")
}

/// The prefix of every partition's lock name of `group`.
pub(crate) fn partitions_prefix(group: &str) -> String {
    format!("group/{group}/partition/")
}

/// The lock name of `partition` of `group`.
pub(crate) fn partition_name(group: &str, partition: u32) -> String {
    format!("group/{group}/partition/{partition}")
}

/// The partition a lock name of [`partitions_prefix`] is of.
pub(crate) fn partition_of_name(prefix: &str, name: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// What a holder of the group publishes: `<partitions>/<rest>`.
pub(crate) fn publish(partitions: u32, rest: &str) -> String {
    format!("{partitions}/{rest}")
}

/// Reads a value of [`publish`]: the number of partitions and the rest.
pub(crate) fn read_published(value: &str) -> Option<(u32, &str)> {
    let (p, rest) = value.split_once('/')?;
    Some((p.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_go_both_ways() {
        assert_eq!(
            member_name("orders", "10.0.0.5:80"),
            "group/orders/member/10.0.0.5:80"
        );
        let prefix = partitions_prefix("orders");
        assert_eq!(
            partition_of_name(&prefix, &partition_name("orders", 17)),
            Some(17)
        );
        assert_eq!(partition_of_name(&prefix, "group/orders/partition/x"), None);
        assert_eq!(partition_of_name(&prefix, "group/other/partition/1"), None);
        assert_eq!(read_published(&publish(256, "a/b")), Some((256, "a/b")));
        assert_eq!(read_published("x/y"), None);
        assert_eq!(read_published("256"), None);
    }

    #[test]
    fn bad_names_ids_and_sizes_are_refused() {
        let kind = |r: Result<(), LockError>| r.map_err(|e| e.kind());
        assert_eq!(kind(check_group("")), Err(ErrorKind::InvalidKey));
        assert_eq!(kind(check_group("a/b")), Err(ErrorKind::InvalidKey));
        assert_eq!(kind(check_group("a\nb")), Err(ErrorKind::InvalidKey));
        assert_eq!(
            kind(check_group(&"g".repeat(257))),
            Err(ErrorKind::InvalidKey)
        );
        assert!(check_group("orders:eu").is_ok());
        assert_eq!(kind(check_member("")), Err(ErrorKind::InvalidKey));
        assert_eq!(kind(check_member("a\0")), Err(ErrorKind::InvalidKey));
        assert!(check_member("10.0.0.5:8080/x").is_ok());
        assert_eq!(kind(check_partitions(0)), Err(ErrorKind::Config));
        assert_eq!(kind(check_partitions(65_537)), Err(ErrorKind::Config));
        assert!(check_partitions(1).is_ok() && check_partitions(65_536).is_ok());
    }
}
