//! Where a lease goes in the pool: the choice of a session for a server name, and the
//! book-keeping of the names on each session.

use std::time::Duration;

use tokio::time::Instant;

use super::{Key, PoolLease, State, Tracked};
use crate::token::{CompactToken, Token};

pub(super) enum Choice {
    HeldHere,
    Use(u64),
    Open,
    Wait,
}

/// The locks a session carries before the pool opens another for the next (while it may):
/// the server's work for each statement may follow the locks its session holds (PostgreSQL ends
/// every transaction with a walk over the session's lock table, `LockReleaseAll`: a trivial
/// statement takes 287 µs with 10,000 advisory locks held against 14 µs with none, see
/// bench/pg_xact_cost.sh), so many locks are spread over the sessions the pool may open.
pub(super) const SPREAD_AT: usize = 1024;

/// Where a lease of `ttl` on `key` goes (see the module's doc).
/// The prefix of a server name held in shared mode: the key `s:<name>` is a shared hold of
/// `<name>` (a reader), which shares the name with other shared holds and conflicts with the
/// exclusive hold, the key `<name>`.
pub const SHARED_PREFIX: &str = "s:";

/// The key of `key`'s server name in the other mode (exclusive ↔ shared).
fn other_mode(key: &str) -> String {
    match key.strip_prefix(SHARED_PREFIX) {
        Some(name) => name.to_owned(),
        None => format!("{SHARED_PREFIX}{key}"),
    }
}

pub(super) fn choose<C>(st: &mut State<C>, key: &str, ttl: Duration, cap: usize) -> Choice {
    st.sessions.retain(|_, s| !s.session.is_over());
    // Held by a lease of this client: busy, unless both are shared holds. And a session never
    // carries both modes of one name (a session's shared and exclusive holds would not exclude
    // each other), nor the same one twice.
    let other = (!key.is_empty()).then(|| other_mode(key));
    let shared = key.starts_with(SHARED_PREFIX);
    if let Some(other) = &other
        && st.sessions.values().any(|s| {
            s.keys.get(other.as_str()) == Some(true) || (!shared && s.keys.get(key) == Some(true))
        })
    {
        return Choice::HeldHere;
    }
    let free = || {
        st.sessions.iter().filter(|(_, s)| {
            other
                .as_ref()
                .is_none_or(|o| !s.keys.contains(key) && !s.keys.contains(o.as_str()))
        })
    };
    let best = |same_ttl: bool| {
        free()
            .filter(|(_, s)| !same_ttl || s.ttl == ttl)
            .min_by_key(|(_, s)| (s.placing, s.keys.len()))
            .map(|(id, s)| (*id, s.placing, s.keys.len()))
    };
    let room = st.sessions.len() + st.opening < cap;
    match best(true) {
        // An idle session takes it, unless it carries many locks already and another session
        // may be opened (see `SPREAD_AT`).
        Some((id, 0, keys)) if keys < SPREAD_AT || !room => return Choice::Use(id),
        Some((id, _, _)) if !room => return Choice::Use(id),
        _ => {}
    }
    if room {
        return Choice::Open;
    }
    match best(false) {
        Some((id, _, _)) => Choice::Use(id),
        None => Choice::Wait,
    }
}

pub(super) fn reserve<C>(
    st: &mut State<C>,
    id: u64,
    name: &str,
    key: &str,
    token: &str,
) -> PoolLease<C> {
    let s = st
        .sessions
        .get_mut(&id)
        .expect("chosen under the same lock");
    s.placing += 1;
    s.empty_since = None;
    let key = Key::new(key);
    if !key.is_empty() {
        s.keys.taking(key.clone());
    }
    let session = s.session.clone();
    st.serial += 1;
    let token = Token::kept(token);
    if !token.as_str().is_empty() {
        let tracked = Tracked {
            key: key.clone(),
            session: session.clone(),
            serial: st.serial,
            name_held: st.name_hash(name),
            release_at: None,
        };
        st.leases.insert(CompactToken::from(&token), tracked);
    }
    PoolLease {
        token,
        key,
        session,
        serial: st.serial,
    }
}

/// Drops the lease's tracking and its name's reservation (if they are still this lease's).
pub(super) fn forget<C>(st: &mut State<C>, lease: &PoolLease<C>) {
    let token = lease.token.as_str();
    if st.lease(token).is_some_and(|t| t.serial == lease.serial) {
        st.forget(token);
    }
    if let Some(s) = st.sessions.get_mut(&lease.session.id) {
        s.keys.remove_taking(&lease.key);
        if s.keys.is_empty() {
            s.empty_since = Some(Instant::now());
        }
    }
}
