//! The pool's record of one lease, in its map by token: a client holds 100,000 leases, so
//! the record packs what it keeps (a held flag in a hash's spare bit, a deadline in 8 bytes).

use std::sync::Arc;

use tokio::time::Instant;

use super::{Key, PoolLease, Session};
use crate::token::CompactToken;

/// A lease the pool tracks, under its token: one record a lease, in the map itself (56 bytes,
/// its server name inline, and its compact token's 24, in a map of 100,000).
pub(super) struct Tracked<C> {
    /// Its server name (a copy is in its session's set of names).
    pub(super) key: Key,
    pub(super) session: Arc<Session<C>>,
    /// See [`PoolLease::serial`].
    pub(super) serial: u64,
    /// Its lock's name, hashed with the map's hasher, the lowest bit replaced by whether the
    /// lease is held (8 bytes where the two took 16): a call that gives the token with another
    /// lock's name does not reach the lease (a check, the token being the lease's identity).
    pub(super) name_held: u64,
    /// The client releases it then (its holder does not renew it); packed (see
    /// [`clock::pack`](crate::clock::pack)), 8 bytes where an `Option<Instant>` takes 16.
    pub(super) release_at: Option<std::num::NonZeroI64>,
}

impl<C> Tracked<C> {
    /// Whether the lease is taken (confirmed), not only being placed.
    pub(super) fn held(&self) -> bool {
        self.name_held & 1 == 1
    }

    pub(super) fn set_held(&mut self) {
        self.name_held |= 1;
    }

    /// Whether it is on the lock whose name hashed to `name` (see [`State::name_hash`](super::State::name_hash)).
    pub(super) fn on(&self, name: u64) -> bool {
        self.name_held & !1 == name
    }

    pub(super) fn release_at(&self) -> Option<Instant> {
        let at = self.release_at?;
        Some(Instant::from_std(crate::clock::unpack(at.get())))
    }

    pub(super) fn set_release_at(&mut self, at: Option<Instant>) {
        self.release_at = at.map(packed_release);
    }

    /// Whether its release is due at `at` (compared packed, as kept).
    pub(super) fn release_due(&self, at: Instant) -> bool {
        self.release_at.is_some_and(|r| r <= packed_release(at))
    }
}

/// `at` packed for [`Tracked::release_at`]: the instant the clock's packing starts from (0) is
/// kept as 1 ns after (the `Option` takes its `None` from the zero), on both sides of a
/// comparison.
fn packed_release(at: Instant) -> std::num::NonZeroI64 {
    const ONE: std::num::NonZeroI64 = std::num::NonZeroI64::new(1).unwrap();
    std::num::NonZeroI64::new(crate::clock::pack(at.into_std())).unwrap_or(ONE)
}

impl<C> Tracked<C> {
    /// The engine's copy of the lease of `token`.
    pub(super) fn lease(&self, token: &CompactToken) -> PoolLease<C> {
        PoolLease {
            token: token.to_token(),
            key: self.key.clone(),
            session: self.session.clone(),
            serial: self.serial,
        }
    }
}
