//! The local queues' map of names: each slot is found by the name it carries (its holder's
//! lease's copy, or its queue's), so the map keeps no key beside it: a held name is one
//! 16-byte slot, where a map from the name to the slot takes 32 (a client holds 100,000).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::Slot;

/// Slots by name.
pub(super) struct Slots<T> {
    table: HashTable<Slot<T>>,
    /// Seeded per map; foldhash rather than SipHash (the map is touched twice per acquisition,
    /// and its names are the process's own).
    hasher: foldhash::fast::RandomState,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            table: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<T> Slots<T> {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    pub(super) fn get(&self, name: &str) -> Option<&Slot<T>> {
        self.table.find(self.hash(name), |s| s.name() == name)
    }

    pub(super) fn get_mut(&mut self, name: &str) -> Option<&mut Slot<T>> {
        let hash = self.hash(name);
        self.table.find_mut(hash, |s| s.name() == name)
    }

    #[cfg(all(test, distlock_loom))]
    pub(super) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub(super) fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Puts `slot` under its name, in place of the slot that name had.
    pub(super) fn insert(&mut self, slot: Slot<T>) {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(slot.name());
        match self.table.entry(
            hash,
            |s| s.name() == slot.name(),
            |s| hasher.hash_one(s.name()),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut o) => *o.get_mut() = slot,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(slot);
            }
        }
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<Slot<T>> {
        let hash = self.hash(name);
        match self.table.find_entry(hash, |s| s.name() == name) {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }
}
