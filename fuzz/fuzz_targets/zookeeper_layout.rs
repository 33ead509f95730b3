//! ZooKeeper lock nodes as the server lists them (`getChildren`, one name a line), which any
//! client of the server could have made (Curator, kazoo, distlock in either layout): each
//! name's sequence number, lease kind and owner, the foreign node a layout refuses, and each
//! line as a node's stored data. A name distlock writes must read back its kind and sequence
//! (the first four bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    distlock_zookeeper::fuzzing::node_names(data);
});
