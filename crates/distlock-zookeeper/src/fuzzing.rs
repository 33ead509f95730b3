//! The fuzz targets' way in (`fuzz/`): built only with `--cfg fuzzing`, which `cargo fuzz`
//! and `.ci/fuzz` pass, never in a normal build. Each function takes untrusted bytes as a
//! server could send them and must return, whatever they are, without a panic.

use distlock_core::LeaseKind;
use distlock_core::recipes::{HolderValue, untag_value};

use crate::Layout;
use crate::layout::{foreign, is_kazoo, is_own, kind_of, push_node_prefix, refuse, seq_of};

/// `bytes` as a lock's children, one name a line, as `getChildren` returns them (any client
/// of the server may have made them): each name's sequence number, kind and owner, and the
/// first foreign node for each layout with its refusal; each line also as a node's stored
/// data. The first four bytes, as a sequence number, must read back from every node name
/// distlock writes.
pub fn node_names(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let children: Vec<String> = text.split('\n').map(str::to_owned).collect();
    for child in &children {
        let _ = seq_of(child);
        let _ = kind_of(child);
        let _ = is_kazoo(child);
        let _ = is_own(child, "tok");
        let (_, holder) = untag_value(child);
        let _ = HolderValue::parse(holder).label();
    }
    for layout in [Layout::Curator, Layout::Kazoo] {
        if let Some(child) = foreign(&children, layout) {
            let _ = refuse("/distlock/x", child, layout).to_string();
        }
    }

    let mut four = [0u8; 4];
    for (to, from) in four.iter_mut().zip(bytes) {
        *to = *from;
    }
    // ZooKeeper appends the sequence as `%010d` (a wrapped counter is negative).
    let seq = i32::from_be_bytes(four);
    for layout in [Layout::Curator, Layout::Kazoo] {
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 3 },
        ] {
            let mut path = String::new();
            push_node_prefix(&mut path, "/distlock/x", "tok", kind, layout);
            path.push_str(&format!("{seq:010}"));
            let child = path.rsplit_once('/').map_or("", |(_, c)| c);
            assert_eq!(
                (seq_of(child), kind_of(child)),
                (Some(i64::from(seq)), kind),
                "{child}"
            );
            assert!(is_own(child, "tok"), "{child}");
        }
    }
}
