//! The rows recorded holders write about themselves, as their client keeps track of them: the
//! engines whose server shows a lock's holder only as a session (PostgreSQL's `pg_locks`,
//! MySQL's `IS_USED_LOCK`) have a holder that `status` must name exactly (an election's
//! leader, with its epoch) write a row of its own once the lock is ours, and delete it at its
//! release. The client keeps, by token, what it needs to find that row again and to give the
//! holder's fence without a read: the row's key and the fence it wrote.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::sync::MutexExt;

/// The rows this client's recorded holders wrote, by token: `V` is what the engine keeps of
/// each (its row's key and fence, in the server's types).
#[derive(Debug)]
pub struct HolderRows<V> {
    by_token: Mutex<HashMap<String, V>>,
}

impl<V> Default for HolderRows<V> {
    fn default() -> Self {
        HolderRows {
            by_token: Mutex::new(HashMap::new()),
        }
    }
}

impl<V: Clone> HolderRows<V> {
    /// The holder of `token` wrote the row `row`.
    pub fn insert(&self, token: &str, row: V) {
        self.by_token.locked().insert(token.to_owned(), row);
    }

    /// The row the holder of `token` wrote, if any.
    pub fn get(&self, token: &str) -> Option<V> {
        self.by_token.locked().get(token).cloned()
    }

    /// Forgets the row of the holder of `token` (its lease ended), and gives it back, to be
    /// deleted on the server.
    pub fn remove(&self, token: &str) -> Option<V> {
        self.by_token.locked().remove(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_found_by_its_token_until_it_is_removed() {
        let rows = HolderRows::default();
        rows.insert("t1", (7_i64, 3_u64));
        assert_eq!(rows.get("t1"), Some((7, 3)));
        assert_eq!(rows.get("t2"), None);
        assert_eq!(rows.remove("t1"), Some((7, 3)));
        assert_eq!(rows.get("t1"), None);
        assert_eq!(rows.remove("t1"), None);
    }
}
