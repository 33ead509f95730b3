//! The server names on one session of the pool: those its leases hold, and the few being
//! taken now (a request between its placement and its answer). Two sets, so that a held name
//! is its key alone, with no flag beside it (a client holds 100,000 locks).

use std::collections::HashSet;

use super::{Hasher, Key};

/// A session's names. A name is in one set at most: a session never carries one name twice.
#[derive(Default)]
pub(super) struct Names {
    held: HashSet<Key, Hasher>,
    taking: HashSet<Key, Hasher>,
}

impl Names {
    /// Whether `key` is on the session: held (`Some(true)`) or being taken (`Some(false)`).
    pub(super) fn get(&self, key: &str) -> Option<bool> {
        if self.held.contains(key) {
            Some(true)
        } else if self.taking.contains(key) {
            Some(false)
        } else {
            None
        }
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Records `key` as being taken on the session.
    pub(super) fn taking(&mut self, key: Key) {
        self.taking.insert(key);
    }

    /// `key`, being taken, is held now.
    pub(super) fn taken(&mut self, key: &str) {
        if let Some(key) = self.taking.take(key) {
            self.held.insert(key);
        }
    }

    /// The held name `old` is `new` now (a downgrade's other mode, on the same session).
    pub(super) fn rename(&mut self, old: &str, new: Key) {
        self.held.remove(old);
        self.taking.remove(old);
        self.held.insert(new);
    }

    /// Drops `key`, held or being taken.
    pub(super) fn remove(&mut self, key: &str) {
        if !self.held.remove(key) {
            self.taking.remove(key);
        }
    }

    /// Drops `key` if it is being taken (not once held).
    pub(super) fn remove_taking(&mut self, key: &str) {
        self.taking.remove(key);
    }

    pub(super) fn len(&self) -> usize {
        self.held.len() + self.taking.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty() && self.taking.is_empty()
    }

    /// The set's own copy of the held name `key`.
    #[cfg(test)]
    pub(super) fn held_key(&self, key: &str) -> Option<&Key> {
        self.held.get(key)
    }
}
