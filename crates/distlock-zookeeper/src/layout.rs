//! Lock node names: the two layouts distlock writes, and how it reads every recipe's.
//!
//! ZooKeeper has no lock of its own: each client library names its ephemeral sequential nodes
//! its own way, and sees only the nodes whose names it can read. Two layouts are common:
//!
//! | layout | exclusive | shared | read by |
//! |---|---|---|---|
//! | Curator's (the default) | `_c_<token>-lock-<seq>` | `_c_<token>-r-lock-<seq>` | Curator's `InterProcessMutex` (the sequence after the last `lock-`) |
//! | kazoo's (`layout=kazoo`) | `_c_<token>__lock__<seq>` | `_c_<token>__rlock__<seq>` | kazoo's `Lock`, `ReadLock`, `WriteLock` (only names ending in `__lock__` or `__rlock__` and the sequence) |
//!
//! A permit's node is `_c_<token>-p<N>-lock-<seq>` in both (no library's semaphore queues
//! this way). kazoo's `Semaphore` counts every child of its path as a lease, distlock's nodes
//! included, but its own leases (`<uuid hex>`, no sequence number) have no place in a queue:
//! a client that finds one refuses the name, whatever its layout. distlock reads both layouts, so it always waits for a kazoo or Curator holder;
//! but kazoo does not see Curator's names, nor Curator kazoo's. So each time a client reads a
//! lock's queue (its first attempt, and each look of a waiter) and finds a node of the layout
//! it does not write, it refuses the lock (`KindConflict`, naming the parameter to set) and
//! deletes its own node. A client of the other layout that arrives once it holds the lock
//! cannot be stopped from ignoring its node: give every client of one path the same layout.

use distlock_core::engine::{ErrorKind, LeaseKind, LockError};

/// The layout of the lock nodes a client writes (the URL's `layout=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Curator's names, as distlock always wrote them.
    #[default]
    Curator,
    /// kazoo's names: its `Lock`, `ReadLock` and `WriteLock` exclude distlock and are excluded.
    Kazoo,
}

impl Layout {
    /// `curator` or `kazoo`.
    pub(crate) fn parse(s: &str) -> Result<Layout, LockError> {
        match s {
            "curator" => Ok(Layout::Curator),
            "kazoo" => Ok(Layout::Kazoo),
            other => Err(LockError::new(
                ErrorKind::Config,
                format!("layout={other:?}: curator (the default) or kazoo"),
            )),
        }
    }

    /// Its name in a URL.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Layout::Curator => "curator",
            Layout::Kazoo => "kazoo",
        }
    }
}

/// kazoo's markers before the sequence number, with the kind each asks for.
const KAZOO: [(&str, LeaseKind); 2] = [
    ("__rlock__", LeaseKind::Shared),
    ("__lock__", LeaseKind::Exclusive),
];

/// A kazoo node's kind and sequence number (kazoo writes `-?\d{10}` after its marker).
fn kazoo(child: &str) -> Option<(LeaseKind, i64)> {
    KAZOO.iter().find_map(|(marker, kind)| {
        let (_, seq) = child.rsplit_once(marker)?;
        let digits = seq.strip_prefix('-').unwrap_or(seq);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        seq.parse().ok().map(|s| (*kind, s))
    })
}

/// Whether `child` is a lock node in kazoo's layout (made by kazoo or by distlock).
pub(crate) fn is_kazoo(child: &str) -> bool {
    kazoo(child).is_some()
}

/// The sequence number at the end of a lock node's name, in either layout.
pub(crate) fn seq_of(child: &str) -> Option<i64> {
    if let Some((_, seq)) = kazoo(child) {
        return Some(seq);
    }
    child.rsplit_once("-lock-")?.1.parse().ok()
}

/// The kind of lease a lock node's name asks for. A name distlock did not write (Curator's
/// `_c_<uuid>-lock-`, kazoo's `<uuid>__lock__`) reads as its library means it.
pub(crate) fn kind_of(child: &str) -> LeaseKind {
    if let Some((kind, _)) = kazoo(child) {
        return kind;
    }
    child
        .rsplit_once("-lock-")
        .and_then(|(head, _)| head.rsplit_once('-'))
        .and_then(|(_, tag)| LeaseKind::from_tag(tag))
        .unwrap_or(LeaseKind::Exclusive)
}

/// Whether `child` is a lease of kazoo's `Semaphore`: a UUID's 32 hex digits.
fn is_kazoo_lease(child: &str) -> bool {
    child.len() == 32
        && child
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The first node of `children` that a holder of the other layout than `mine` made, which
/// that layout's libraries cannot be told about (a permit's node is in neither: every client
/// writes it the same way), or a lease of kazoo's `Semaphore`.
pub(crate) fn foreign(children: &[String], mine: Layout) -> Option<&str> {
    children.iter().map(String::as_str).find(|c| {
        if is_kazoo_lease(c) {
            return true;
        }
        let theirs = if kazoo(c).is_some() {
            Layout::Kazoo
        } else if seq_of(c).is_some() && !matches!(kind_of(c), LeaseKind::Permit { .. }) {
            Layout::Curator
        } else {
            return false;
        };
        theirs != mine
    })
}

/// The refusal of a lock whose queue has `child`, a node of the other layout than `mine` (or
/// a lease of kazoo's `Semaphore`).
pub(crate) fn refuse(parent: &str, child: &str, mine: Layout) -> LockError {
    if is_kazoo_lease(child) {
        return LockError::new(
            ErrorKind::KindConflict,
            format!(
                "{parent} holds a lease of kazoo's Semaphore ({child}), whose leases are not \
                 queued: distlock's locks and semaphores do not share a path with it. Nothing \
                 was taken"
            ),
        );
    }
    let (theirs, library) = match mine {
        Layout::Curator => (Layout::Kazoo, "kazoo"),
        Layout::Kazoo => (Layout::Curator, "Curator (or distlock's default layout)"),
    };
    LockError::new(
        ErrorKind::KindConflict,
        format!(
            "{parent} is queued for by {library} ({child}), which cannot see this client's \
             {}-layout nodes: nothing was taken. Open the URL with layout={} to share the \
             lock with it",
            mine.name(),
            theirs.name()
        ),
    )
}

/// The name of a lock node before ZooKeeper appends its sequence number, appended to `out`
/// (the parent may be given as its parts, unformatted).
pub(crate) fn push_node_prefix(
    out: &mut String,
    parent: impl std::fmt::Display,
    token: &str,
    kind: LeaseKind,
    layout: Layout,
) {
    use std::fmt::Write;
    // Formatting into a `String` cannot fail.
    let _ = match (layout, kind) {
        (Layout::Kazoo, LeaseKind::Exclusive) => write!(out, "{parent}/_c_{token}__lock__"),
        (Layout::Kazoo, LeaseKind::Shared) => write!(out, "{parent}/_c_{token}__rlock__"),
        (_, LeaseKind::Exclusive) => write!(out, "{parent}/_c_{token}-lock-"),
        (_, k) => write!(out, "{parent}/_c_{token}-{}-lock-", k.tag()),
    };
}

/// Whether `child` is a node made with `token` (in either layout).
pub(crate) fn is_own(child: &str, token: &str) -> bool {
    child
        .strip_prefix("_c_")
        .and_then(|rest| rest.strip_prefix(token))
        .is_some_and(|rest| rest.starts_with('-') || rest.starts_with("__"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(kind: LeaseKind, layout: Layout) -> String {
        let mut out = String::new();
        push_node_prefix(&mut out, "/d/x", "tok", kind, layout);
        out
    }

    #[test]
    fn each_layout_reads_back_its_kind_and_sequence() {
        for layout in [Layout::Curator, Layout::Kazoo] {
            for kind in [
                LeaseKind::Exclusive,
                LeaseKind::Shared,
                LeaseKind::Permit { permits: 3 },
            ] {
                let path = format!("{}0000000042", prefix(kind, layout));
                let child = path.rsplit_once('/').map(|(_, c)| c).unwrap_or_default();
                assert_eq!((seq_of(child), kind_of(child)), (Some(42), kind), "{child}");
                assert!(is_own(child, "tok") && !is_own(child, "to"), "{child}");
            }
        }
        assert_eq!(
            prefix(LeaseKind::Exclusive, Layout::Kazoo),
            "/d/x/_c_tok__lock__"
        );
        assert_eq!(
            prefix(LeaseKind::Shared, Layout::Curator),
            "/d/x/_c_tok-r-lock-"
        );
    }

    #[test]
    fn kazoos_own_names_read_as_kazoo_means_them() {
        let lock = "2f1c9a0e8b7d4c3a9e1f0a2b3c4d5e6f__lock__0000000007";
        let read = "2f1c9a0e8b7d4c3a9e1f0a2b3c4d5e6f__rlock__0000000008";
        assert_eq!(
            (seq_of(lock), kind_of(lock)),
            (Some(7), LeaseKind::Exclusive)
        );
        assert_eq!((seq_of(read), kind_of(read)), (Some(8), LeaseKind::Shared));
        // A negative sequence (the counter wrapped), as kazoo's pattern allows.
        assert_eq!(seq_of("x__lock__-000000001"), Some(-1));
        // Not a lock node: kazoo's lease holder, or a marker without digits.
        assert_eq!(seq_of("lease_holder"), None);
        assert_eq!(seq_of("x__lock__"), None);
    }

    #[test]
    fn a_node_of_the_other_layout_is_foreign_and_a_permit_is_nobodys() {
        let children = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let kazoo_node = "u__lock__0000000001";
        let curator_node = "_c_u-lock-0000000002";
        let permit = "_c_t-p3-lock-0000000003";
        let both = children(&[kazoo_node, curator_node, permit]);
        assert_eq!(foreign(&both, Layout::Curator), Some(kazoo_node));
        assert_eq!(foreign(&both, Layout::Kazoo), Some(curator_node));
        assert_eq!(
            foreign(&children(&[curator_node, permit, "junk"]), Layout::Curator),
            None
        );
        assert_eq!(
            foreign(&children(&[kazoo_node, permit]), Layout::Kazoo),
            None
        );
        // A lease of kazoo's Semaphore is refused by both layouts.
        let lease = "2f1c9a0e8b7d4c3a9e1f0a2b3c4d5e6f";
        for layout in [Layout::Curator, Layout::Kazoo] {
            assert_eq!(foreign(&children(&[permit, lease]), layout), Some(lease));
            let e = refuse("/distlock/pool", lease, layout);
            assert!(e.message().contains("Semaphore"), "{e}");
        }
        let e = refuse("/distlock/jobs", kazoo_node, Layout::Curator);
        assert_eq!(e.kind(), ErrorKind::KindConflict);
        assert!(e.message().contains("layout=kazoo"), "{e}");
        assert!(Layout::parse("zookeeper").is_err());
        assert_eq!(Layout::parse("kazoo").map(Layout::name).ok(), Some("kazoo"));
    }
}
