//! The queue recipe's record of this client's entries: one map, by lock name.
//!
//! A name is the key (the core's own copy of it, shared, see [`AcquireRequest::name_arc`]),
//! and its entries sit in the map's slot: most names have one entry of this client, kept inline
//! with no allocation of its own; a name with several (readers, permits, a holder and the one
//! task of this client that waits behind it) keeps them in a `Vec`. Every lookup comes with the
//! lock's name, so no second map by token is needed.
//!
//! [`AcquireRequest::name_arc`]: crate::engine::AcquireRequest::name_arc

use std::collections::HashMap;
use std::sync::Arc;

use super::{Entry, QueuedEntry};
use crate::engine::LeaseKind;
use crate::token::{CompactToken, Token};

/// One entry of ours, without its name (the map's key).
#[derive(Debug, Clone)]
struct Item<Id> {
    /// Its token (the lease has the token too: the compact form, 24 bytes where a `Token`
    /// takes 40).
    token: CompactToken,
    entry: QueuedEntry<Id>,
    /// Whether it holds its lease ([`HELD`]), and its fence in the other 63 bits,
    /// [`NO_FENCE`] for none: 8 bytes where an `Option<u64>` and a `bool` take 24.
    fence_held: u64,
}

/// The bit of [`Item::fence_held`] set while the entry holds its lease.
const HELD: u64 = 1 << 63;

/// [`Item::fence_held`]'s fence when the store gives none. Stores give fences below it: etcd's
/// revisions and ZooKeeper's zxids are positive `i64`s, and `i64::MAX` is never reached (a
/// fence from it up would read as none).
const NO_FENCE: u64 = HELD - 1;

impl<Id: Clone> Item<Id> {
    fn new(token: &Token, e: Entry<Id>) -> Self {
        let fence = e.fence.map_or(NO_FENCE, |f| f.min(NO_FENCE));
        Item {
            token: CompactToken::from(token),
            entry: e.entry,
            fence_held: fence | if e.held { HELD } else { 0 },
        }
    }

    fn fence(&self) -> Option<u64> {
        let fence = self.fence_held & !HELD;
        (fence != NO_FENCE).then_some(fence)
    }

    fn held(&self) -> bool {
        self.fence_held & HELD != 0
    }

    fn to_entry(&self, name: &Arc<str>) -> Entry<Id> {
        Entry {
            name: name.clone(),
            entry: self.entry.clone(),
            fence: self.fence(),
            held: self.held(),
        }
    }
}

/// A name's entries: one inline, or several.
#[derive(Debug)]
enum Items<Id> {
    One(Item<Id>),
    Many(Vec<Item<Id>>),
}

impl<Id> Items<Id> {
    fn as_slice(&self) -> &[Item<Id>] {
        match self {
            Items::One(item) => std::slice::from_ref(item),
            Items::Many(items) => items,
        }
    }

    fn find(&self, token: &str) -> Option<&Item<Id>> {
        self.as_slice().iter().find(|i| i.token.matches(token))
    }

    fn push(&mut self, item: Item<Id>) {
        match self {
            Items::Many(items) => items.push(item),
            Items::One(_) => {
                let Items::One(first) = std::mem::replace(self, Items::Many(Vec::new())) else {
                    unreachable!("matched One above")
                };
                *self = Items::Many(vec![first, item]);
            }
        }
    }
}

/// Our entries, by name.
pub(super) struct RecipeState<Id> {
    by_name: HashMap<Arc<str>, Items<Id>, foldhash::fast::RandomState>,
    count: usize,
}

impl<Id: Clone> RecipeState<Id> {
    pub(super) fn new() -> Self {
        RecipeState {
            by_name: HashMap::default(),
            count: 0,
        }
    }

    /// How many entries of ours there are.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Records `token`'s entry (replacing the one it had).
    pub(super) fn insert(&mut self, token: Token, e: Entry<Id>) {
        self.remove(&e.name, token.as_str());
        let name = e.name.clone();
        let item = Item::new(&token, e);
        self.count += 1;
        match self.by_name.get_mut(&*name) {
            Some(items) => items.push(item),
            None => {
                self.by_name.insert(name, Items::One(item));
            }
        }
    }

    /// Takes out `token`'s entry of `name`.
    pub(super) fn remove(&mut self, name: &str, token: &str) -> Option<Entry<Id>> {
        let (key, items) = self.by_name.get_key_value(name)?;
        let key = key.clone();
        let at = items
            .as_slice()
            .iter()
            .position(|i| i.token.matches(token))?;
        let item = match self.by_name.get_mut(name)? {
            Items::One(_) => match self.by_name.remove(name) {
                Some(Items::One(item)) => item,
                _ => unreachable!("the slot held one entry"),
            },
            Items::Many(items) => {
                let item = items.swap_remove(at);
                if items.is_empty() {
                    self.by_name.remove(name);
                } else if items.len() == 1 {
                    // Back to one entry, inline: a name's Vec goes with its crowd.
                    if let Some(Items::Many(mut rest)) = self.by_name.remove(name)
                        && let Some(only) = rest.pop()
                    {
                        self.by_name.insert(key.clone(), Items::One(only));
                    }
                }
                item
            }
        };
        self.count -= 1;
        let (fence, held) = (item.fence(), item.held());
        Some(Entry {
            name: key,
            entry: item.entry,
            fence,
            held,
        })
    }

    /// `token`'s entry of `name`.
    pub(super) fn get(&self, name: &str, token: &str) -> Option<Entry<Id>> {
        let (key, items) = self.by_name.get_key_value(name)?;
        items.find(token).map(|i| i.to_entry(key))
    }

    /// The id of `token`'s entry of `name` if it holds its lease (no copy of the rest).
    pub(super) fn held_id(&self, name: &str, token: &str) -> Option<Id> {
        let item = self.by_name.get(name)?.find(token)?;
        item.held().then(|| item.entry.id.clone())
    }

    /// Marks `token`'s entry of `name` as holding its lease.
    pub(super) fn set_held(&mut self, name: &str, token: &str) {
        let Some(items) = self.by_name.get_mut(name) else {
            return;
        };
        let item = match items {
            Items::One(item) => Some(item),
            Items::Many(items) => items.iter_mut().find(|i| i.token.matches(token)),
        };
        if let Some(item) = item.filter(|i| i.token.matches(token)) {
            item.fence_held |= HELD;
        }
    }

    /// Changes `token`'s entry of `name`, keeping the map in step (the change may give it
    /// another name).
    pub(super) fn update(&mut self, name: &str, token: &str, f: impl FnOnce(&mut Entry<Id>)) {
        let Some(token) = self
            .by_name
            .get(name)
            .and_then(|items| items.find(token))
            .map(|i| i.token.to_token())
        else {
            return;
        };
        let Some(mut e) = self.remove(name, token.as_str()) else {
            return;
        };
        f(&mut e);
        self.insert(token, e);
    }

    /// `name`'s entries that hold their lease, with their tokens.
    pub(super) fn held_of(&self, name: &str) -> Vec<(String, Entry<Id>)> {
        let Some((key, items)) = self.by_name.get_key_value(name) else {
            return Vec::new();
        };
        items
            .as_slice()
            .iter()
            .filter(|i| i.held())
            .map(|i| (i.token.to_token().to_string(), i.to_entry(key)))
            .collect()
    }

    /// Takes out the entries of `name` that `leave` removes: queued (not held) and exclusive.
    /// A reader or a permit waits on its own (no local queue) and removes its entry itself when
    /// it stops waiting; another task's entry may be queued right now while this client's last
    /// subscription goes.
    pub(super) fn take_waiting(&mut self, name: &str) -> Vec<(Token, Entry<Id>)> {
        let tokens: Vec<Token> = self.by_name.get(name).map_or_else(Vec::new, |items| {
            items
                .as_slice()
                .iter()
                .filter(|i| !i.held() && i.entry.kind == LeaseKind::Exclusive)
                .map(|i| i.token.to_token())
                .collect()
        });
        tokens
            .into_iter()
            .filter_map(|t| self.remove(name, t.as_str()).map(|e| (t, e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &Arc<str>, seq: i64, kind: LeaseKind, held: bool) -> Entry<i64> {
        Entry {
            name: name.clone(),
            entry: QueuedEntry {
                id: seq,
                seq,
                kind,
                seen_at: 0,
            },
            fence: Some(seq as u64),
            held,
        }
    }

    #[test]
    fn entries_are_found_by_name_and_token_and_one_per_name_stays_inline() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut st = RecipeState::new();
        let (t1, t2, t3) = (Token::generate(), Token::generate(), Token::generate());
        st.insert(t1.clone(), entry(&a, 1, LeaseKind::Exclusive, true));
        st.insert(t2.clone(), entry(&a, 2, LeaseKind::Exclusive, false));
        st.insert(t3.clone(), entry(&b, 3, LeaseKind::Shared, false));
        assert_eq!(st.len(), 3);
        assert!(matches!(st.by_name.get("a"), Some(Items::Many(v)) if v.len() == 2));
        assert!(matches!(st.by_name.get("b"), Some(Items::One(_))));
        // A token is looked for under its own name only.
        assert!(st.get("b", t1.as_str()).is_none());
        assert_eq!(st.held_id("a", t1.as_str()), Some(1));
        assert_eq!(st.held_id("a", t2.as_str()), None, "queued, not held");
        assert_eq!(st.held_of("a").len(), 1);
        st.set_held("b", t3.as_str());
        assert_eq!(st.held_id("b", t3.as_str()), Some(3));
        // The queued exclusive entry goes with its name's last waiter; the held one stays, and
        // the name is back to one entry inline.
        let gone = st.take_waiting("a");
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].0, t2);
        assert!(matches!(st.by_name.get("a"), Some(Items::One(_))));
        // A change of id keeps the entry where it is; the key stays the core's copy.
        st.update("a", t1.as_str(), |e| e.entry.id = 10);
        assert_eq!(st.held_id("a", t1.as_str()), Some(10));
        assert!(Arc::ptr_eq(&st.get("a", t1.as_str()).unwrap().name, &a));
        assert!(st.remove("a", t1.as_str()).is_some());
        assert!(st.remove("a", t1.as_str()).is_none());
        assert!(!st.by_name.contains_key("a"));
        assert_eq!(st.len(), 1);
        // Inserting a token again replaces its entry.
        st.insert(t3.clone(), entry(&b, 4, LeaseKind::Shared, true));
        assert_eq!(st.len(), 1);
        assert_eq!(st.held_id("b", t3.as_str()), Some(4));
        assert_eq!(st.get("b", t3.as_str()).unwrap().fence, Some(4));
        // A store without fences: none comes back.
        let mut unfenced = entry(&b, 5, LeaseKind::Shared, true);
        unfenced.fence = None;
        st.insert(t3.clone(), unfenced);
        assert_eq!(st.get("b", t3.as_str()).unwrap().fence, None);
        assert_eq!(st.remove("b", t3.as_str()).unwrap().fence, None);
    }

    #[test]
    fn a_name_with_one_entry_of_ours_is_one_map_slot() {
        // The key (16 bytes) and the entry inline (an etcd key's id: 16 bytes): no Vec, no
        // second map by token.
        let slot = std::mem::size_of::<(Arc<str>, Items<Arc<str>>)>();
        assert!(slot <= 88, "{slot}");
        // A fence and whether the entry is held share one word, and read back apart.
        let name: Arc<str> = "n".into();
        let t = Token::generate();
        for (fence, held) in [
            (Some(0), true),
            (Some(7), false),
            (None, true),
            (None, false),
        ] {
            let mut e = entry(&name, 1, LeaseKind::Exclusive, held);
            e.fence = fence;
            let item = Item::new(&t, e);
            assert_eq!((item.fence(), item.held()), (fence, held));
        }
    }
}
