//! The highest fence this client saw for each lock: sent with each acquisition as a floor, so
//! a server that lost its counter and whose clock is behind (see `scripts/fence.lua`) still
//! gives this client rising fences, and checked against each fence that comes back.
//!
//! Names are kept as 64-bit hashes (16 bytes a lock), in two generations: when the current one
//! is full it becomes the previous one and the one before is dropped, so the locks taken
//! lately are always remembered (a client holding 100,000 locks keeps them all) and the memory
//! stays bounded. Two names with one hash share a floor: a higher floor only makes the fence
//! jump further, and the check could at worst log a false alarm (one chance in 2^64).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

/// Names a generation holds at most (two generations: at most 4 MiB of map).
const GENERATION: usize = 131_072;

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<u64, u64>,
    previous: HashMap<u64, u64>,
}

/// Per lock name: the highest fence seen.
#[derive(Debug, Default)]
pub(crate) struct SeenFences {
    highest: Mutex<Generations>,
    hasher: foldhash::fast::RandomState,
}

impl SeenFences {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The highest fence seen for `name`, 0 when none.
    pub(crate) fn floor(&self, name: &str) -> u64 {
        let h = self.hash(name);
        let g = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        g.current
            .get(&h)
            .or_else(|| g.previous.get(&h))
            .copied()
            .unwrap_or(0)
    }

    /// Notes a fence this client got for `name`, and logs an error when it is not above every
    /// fence seen before for it (a hand-over written by a server that lost its counter and
    /// whose clock is behind: the floor this client sends cannot reach a fence another client
    /// asked for).
    pub(crate) fn record(&self, name: &str, fence: u64) {
        let h = self.hash(name);
        let before = {
            let mut g = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
            let earlier = g.previous.get(&h).copied().unwrap_or(0);
            if g.current.len() >= GENERATION && !g.current.contains_key(&h) {
                g.previous = std::mem::take(&mut g.current);
            }
            let slot = g.current.entry(h).or_insert(earlier);
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

    /// Past a generation's worth of names, the latest generation's are all still known, the
    /// first name (two generations back) is forgotten, and the memory stays bounded.
    #[test]
    fn the_latest_names_are_kept_and_the_memory_is_bounded() {
        let seen = SeenFences::default();
        let n = 2 * GENERATION + 10;
        for i in 0..n {
            seen.record(&format!("k{i}"), i as u64 + 1);
        }
        for i in n - GENERATION..n {
            assert_eq!(seen.floor(&format!("k{i}")), i as u64 + 1, "k{i} forgotten");
        }
        assert_eq!(seen.floor("k0"), 0);
        let g = seen.highest.lock().unwrap();
        assert!(g.current.len() + g.previous.len() <= 2 * GENERATION);
    }

    /// A name from the previous generation keeps its floor when it is recorded again.
    #[test]
    fn a_name_from_the_previous_generation_keeps_its_floor() {
        let seen = SeenFences::default();
        seen.record("old", 50);
        for i in 0..GENERATION {
            seen.record(&format!("k{i}"), 1);
        }
        assert_eq!(seen.floor("old"), 50);
        seen.record("old", 40);
        assert_eq!(seen.floor("old"), 50);
    }
}
