//! The highest fence this client saw for each lock: sent with each acquisition as a floor, so
//! a server that lost its counter and whose clock is behind (see `scripts/fence.lua`) still
//! gives this client rising fences, and checked against each fence that comes back.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// The locks remembered at most; past that the memory starts over (the server's clock floor
/// still holds; only the client's own check of a lock it has not taken since is lost).
const CAP: usize = 65_536;

/// Per lock name: the highest fence seen.
#[derive(Debug, Default)]
pub(crate) struct SeenFences {
    highest: Mutex<HashMap<String, u64>>,
}

impl SeenFences {
    /// The highest fence seen for `name`, 0 when none.
    pub(crate) fn floor(&self, name: &str) -> u64 {
        let map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(name).copied().unwrap_or(0)
    }

    /// Notes a fence this client got for `name`, and logs an error when it is not above every
    /// fence seen before for it (a hand-over written by a server that lost its counter and
    /// whose clock is behind: the floor this client sends cannot reach a fence another client
    /// asked for).
    pub(crate) fn record(&self, name: &str, fence: u64) {
        let before = {
            let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
            if map.len() >= CAP && !map.contains_key(name) {
                map.clear();
            }
            let slot = map.entry(name.to_owned()).or_insert(0);
            let before = *slot;
            *slot = before.max(fence);
            before
        };
        if fence < before {
            tracing::error!(target: "distlock", key = name, fence, seen = before,
                "a fence went back: the Redis server lost its fence counter and its clock is \
                 behind the one that gave the higher fence; a fenced resource will refuse this \
                 holder's writes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_highest_fence_seen_per_lock() {
        let seen = SeenFences::default();
        assert_eq!(seen.floor("a"), 0);
        seen.record("a", 10);
        seen.record("a", 7);
        seen.record("b", 3);
        assert_eq!(seen.floor("a"), 10);
        assert_eq!(seen.floor("b"), 3);
    }

    #[test]
    fn the_memory_is_bounded() {
        let seen = SeenFences::default();
        for i in 0..CAP + 10 {
            seen.record(&format!("k{i}"), 1);
        }
        let len = seen.highest.lock().unwrap().len();
        assert!(len <= CAP, "{len}");
    }
}
