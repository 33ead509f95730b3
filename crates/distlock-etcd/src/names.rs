//! This client's etcd key names: which acquisition each one belongs to, and the session it
//! lives on. One map, by key name, for both (a client holding 100,000 locks kept three maps,
//! 112 bytes of slots a lock, where this one takes 56).
//!
//! An acquisition keeps its name from its first write until its key is known to be gone (its
//! delete answered, or nothing written), so that no other acquisition of this client takes that
//! name while a write of it may still land.
//!
//! A given-up acquisition's name is not given out again even once its delete was answered: a
//! write whose reply was lost can still land after that (a request queued at a follower during
//! an election is forwarded to the new leader later), and the key it creates must then be
//! nobody's, a stale key that the next first attempt deletes, not a later acquisition's.
//!
//! A multi-name hold's keys are named by its token instead, and kept apart ([`ManyHolds`]).
//!
//! Most acquisitions have their lock's first name (`…-0`): a token's key is found by reading
//! that name's owner, and only the tokens with a later name are kept in a map by token.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use distlock_core::recipes::{CompactToken, MutexExt};
use tokio::sync::Notify;

use crate::session::Session;

/// One of our key names: one copy, shared by the queue recipe's entry and this map.
pub(crate) type Key = Arc<str>;

/// How many given-up key names a client keeps out of use (each one an acquisition whose reply
/// was lost and that was then given up: rare).
const BURNED_KEPT: usize = 4096;

/// Whose a key name is.
enum Owner {
    /// Nobody's, and free to give out (the entry is there for its session only).
    Free,
    /// Out of use, but no acquisition's (a key left to run out, or being deleted).
    Nobody,
    /// The acquisition of this token's (in its compact form: 24 bytes where a `Token` takes 40).
    Token(CompactToken),
}

/// The session one of our keys lives on, and the signal of its moves for the watch of its
/// session's end (made when that watch starts).
struct OnSession {
    session: Arc<Session>,
    moved: Option<Arc<Notify>>,
}

/// What this client knows of one key name.
struct KeyUse {
    owner: Owner,
    /// The session it lives on (or is about to be written on). A key is entered before the
    /// request that writes it is sent, and leaves when it is deleted: a key attached to one of
    /// our sessions that has none here was written by a request given up before its reply.
    on: Option<OnSession>,
}

impl KeyUse {
    fn unused() -> KeyUse {
        KeyUse {
            owner: Owner::Free,
            on: None,
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self.owner, Owner::Free) && self.on.is_none()
    }
}

/// The key names in use, by name (see the module's doc).
#[derive(Default)]
pub(crate) struct KeyNames {
    keys: HashMap<Key, KeyUse, foldhash::fast::RandomState>,
    /// The tokens whose key is not their lock's first name.
    later: HashMap<CompactToken, Key>,
    /// Given-up acquisitions' names, oldest first: never given out again (the oldest are let
    /// go past [`BURNED_KEPT`]).
    burned: VecDeque<Key>,
    /// The same names, to look up.
    burned_set: HashSet<Key>,
    /// Names of keys left to run out by themselves (see `Linger`), soonest end first: in use
    /// until then.
    lingering: BinaryHeap<Reverse<(Instant, Key)>>,
    /// A buffer to write a name in before looking it up (see [`KeyNames::scratch`]).
    scratch: String,
}

impl KeyNames {
    /// The scratch buffer, emptied, for a name to look up; give it back with
    /// [`KeyNames::put_scratch`] (a lookup then allocates nothing).
    pub(crate) fn scratch(&mut self) -> String {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        s
    }

    /// Gives the scratch buffer back (one grown past a few kilobytes is let go).
    pub(crate) fn put_scratch(&mut self, s: String) {
        if s.capacity() <= 4096 {
            self.scratch = s;
        }
    }

    /// The key of `token`, whose lock's first name is `first`.
    pub(crate) fn key_of(&self, first: &str, token: &CompactToken) -> Option<Key> {
        match self.keys.get_key_value(first) {
            Some((
                key,
                KeyUse {
                    owner: Owner::Token(t),
                    ..
                },
            )) if t == token => Some(key.clone()),
            _ => self.later.get(token).cloned(),
        }
    }

    /// Whether `key` can be given to an acquisition: out of use, and never burned.
    pub(crate) fn available(&self, key: &str) -> bool {
        !self.in_use(key) && !self.burned_set.contains(key)
    }

    /// Whether `key` is out of use for new acquisitions (some acquisition's, or nobody's until
    /// its key is known to be gone).
    pub(crate) fn in_use(&self, key: &str) -> bool {
        self.keys
            .get(key)
            .is_some_and(|u| !matches!(u.owner, Owner::Free))
    }

    /// Gives `key` to `token`'s acquisition (`first`: the key is its lock's first name).
    pub(crate) fn give(&mut self, key: Key, token: CompactToken, first: bool) {
        if !first {
            self.later.insert(token.clone(), key.clone());
        }
        self.keys.entry(key).or_insert_with(KeyUse::unused).owner = Owner::Token(token);
    }

    /// Makes `key`'s owner `to`; the token that had it no longer has it.
    fn set_owner(&mut self, key: &str, to: Owner) {
        let Some(u) = self.keys.get_mut(key) else {
            return;
        };
        let before = std::mem::replace(&mut u.owner, to);
        if u.is_empty() {
            self.keys.remove(key);
        }
        if let Owner::Token(t) = before
            && self.later.get(&t).is_some_and(|k| **k == *key)
        {
            self.later.remove(&t);
        }
    }

    /// `key` is gone: its name is free for the next acquisition.
    pub(crate) fn free_key(&mut self, key: &str) {
        self.set_owner(key, Owner::Free);
    }

    /// `key` stays out of use, but its token no longer has it (its next attempt takes another
    /// name).
    pub(crate) fn release_token_of(&mut self, key: &str) {
        if self
            .keys
            .get(key)
            .is_some_and(|u| matches!(u.owner, Owner::Token(_)))
        {
            self.set_owner(key, Owner::Nobody);
        }
    }

    /// `key` was left on the server to run out by itself at `until`: nobody's, and out of use
    /// until then.
    pub(crate) fn linger(&mut self, key: Key, until: Instant) {
        self.set_owner(&key, Owner::Nobody);
        self.lingering.push(Reverse((until, key)));
    }

    /// `key`'s acquisition was given up and its key deleted: nobody's from now, and never given
    /// out again.
    pub(crate) fn burn(&mut self, key: Key) {
        self.set_owner(&key, Owner::Free);
        self.burned_set.insert(key.clone());
        self.burned.push_back(key);
        if self.burned.len() > BURNED_KEPT
            && let Some(oldest) = self.burned.pop_front()
        {
            self.burned_set.remove(&oldest);
        }
    }

    /// Whether any key is left to run out.
    pub(crate) fn lingers(&self) -> bool {
        !self.lingering.is_empty()
    }

    /// Gives back the names of left keys whose lease has run out by `now`.
    pub(crate) fn expire_lingering(&mut self, now: Instant) {
        while let Some(Reverse((until, _))) = self.lingering.peek()
            && *until <= now
        {
            if let Some(Reverse((_, key))) = self.lingering.pop() {
                self.set_owner(&key, Owner::Free);
            }
        }
    }

    /// The session `key` lives on.
    pub(crate) fn session_of(&self, key: &str) -> Option<Arc<Session>> {
        self.keys
            .get(key)
            .and_then(|u| u.on.as_ref())
            .map(|o| o.session.clone())
    }

    /// Whether `key` lives on one of our sessions as far as we know.
    pub(crate) fn is_on_session(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|u| u.on.is_some())
    }

    /// Records that `key` now lives on `session` (or is about to be written on it).
    pub(crate) fn set_session(&mut self, key: &Key, session: Arc<Session>) {
        let u = self.keys.entry(key.clone()).or_insert_with(KeyUse::unused);
        match &mut u.on {
            Some(o) if Arc::ptr_eq(&o.session, &session) => {}
            Some(o) => {
                o.session.remove_key();
                session.add_key();
                o.session = session;
                // Only the watch on this key's session follows it: a move costs the same
                // however many locks this client holds.
                if let Some(moved) = &o.moved {
                    moved.notify_waiters();
                }
            }
            None => {
                session.add_key();
                u.on = Some(OnSession {
                    session,
                    moved: None,
                });
            }
        }
    }

    /// Forgets the session of `key` (it was deleted, or its request given up).
    pub(crate) fn forget(&mut self, key: &str) {
        let Some(u) = self.keys.get_mut(key) else {
            return;
        };
        if let Some(before) = u.on.take() {
            before.session.remove_key();
        }
        if u.is_empty() {
            self.keys.remove(key);
        }
    }

    /// The session `key` lives on, and the signal of its moves to another (made at the first
    /// call).
    pub(crate) fn watch_session(&mut self, key: &str) -> Option<(Arc<Session>, Arc<Notify>)> {
        let o = self.keys.get_mut(key)?.on.as_mut()?;
        let moved = o
            .moved
            .get_or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Some((o.session.clone(), moved))
    }
}

/// One multi-name hold, or an attempt in flight, of this client.
#[derive(Clone)]
pub(crate) struct Hold {
    /// The session its keys are (or are being) written on.
    pub(crate) session: Arc<Session>,
    /// Each key's create revision once held; `None` while the attempt is in flight.
    pub(crate) fences: Option<Vec<i64>>,
}

/// This client's multi-name holds and attempts, by token.
///
/// Their keys stay out of [`KeyNames`]: their names come from the token, so no name is given
/// out or reserved. But the renewals' sweep deletes any key on our sessions that this client
/// does not know, so a multi-name key is known here, from before its write is sent until its
/// release is answered; a multi-name key of ours whose token is not here is stale, and deleted
/// (by the sweep, or by an attempt of this client that finds it holding a name).
#[derive(Default)]
pub(crate) struct ManyHolds {
    by_token: Mutex<HashMap<String, Hold>>,
}

impl ManyHolds {
    /// Whether `token` has a multi-name hold or attempt here.
    pub(crate) fn knows(&self, token: &str) -> bool {
        self.by_token.locked().contains_key(token)
    }

    pub(crate) fn get(&self, token: &str) -> Option<Hold> {
        self.by_token.locked().get(token).cloned()
    }

    pub(crate) fn put(&self, token: &str, session: Arc<Session>, fences: Option<Vec<i64>>) {
        self.by_token
            .locked()
            .insert(token.to_owned(), Hold { session, fences });
    }

    pub(crate) fn take(&self, token: &str) -> Option<Hold> {
        self.by_token.locked().remove(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::engine::Token;

    fn token() -> CompactToken {
        CompactToken::from(&Token::generate())
    }

    #[test]
    fn a_token_finds_its_key_by_its_first_name_or_the_later_map() {
        let mut names = KeyNames::default();
        let (a, b) = (token(), token());
        names.give(Key::from("l/c-0"), a.clone(), true);
        names.give(Key::from("l/c-1"), b.clone(), false);
        assert_eq!(names.key_of("l/c-0", &a).as_deref(), Some("l/c-0"));
        assert_eq!(names.key_of("l/c-0", &b).as_deref(), Some("l/c-1"));
        assert!(!names.available("l/c-0") && !names.available("l/c-1"));
        // The first name freed: the later one is still found, and the first given out again.
        names.free_key("l/c-0");
        assert_eq!(names.key_of("l/c-0", &a), None);
        assert_eq!(names.key_of("l/c-0", &b).as_deref(), Some("l/c-1"));
        assert!(names.available("l/c-0"));
        names.free_key("l/c-1");
        assert_eq!(names.key_of("l/c-0", &b), None);
        assert!(names.keys.is_empty() && names.later.is_empty());
    }

    #[test]
    fn released_lingering_and_burned_names_stay_out_of_use() {
        let mut names = KeyNames::default();
        let (a, b, c) = (token(), token(), token());
        names.give(Key::from("x/c-0"), a.clone(), true);
        names.give(Key::from("y/c-0"), b.clone(), true);
        names.give(Key::from("z/c-1"), c.clone(), false);
        // Released by its token, its delete not answered yet: nobody's, out of use.
        names.release_token_of("x/c-0");
        assert_eq!(names.key_of("x/c-0", &a), None);
        assert!(names.in_use("x/c-0"));
        // Left to run out: out of use until then.
        let now = Instant::now();
        names.linger(Key::from("y/c-0"), now);
        assert_eq!(names.key_of("y/c-0", &b), None);
        assert!(names.in_use("y/c-0"));
        names.expire_lingering(now);
        assert!(names.available("y/c-0"));
        // Burned: never given out again, and its token forgotten.
        names.burn(Key::from("z/c-1"));
        assert_eq!(names.key_of("z/c-0", &c), None);
        assert!(!names.in_use("z/c-1") && !names.available("z/c-1"));
        assert!(names.later.is_empty());
    }
}
