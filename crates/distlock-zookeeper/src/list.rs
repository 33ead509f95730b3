//! Listing the locks on ZooKeeper: the children under the prefix, walked breadth first (a
//! name with `/` is a path of nodes), a bounded number of reads.

use distlock_core::engine::{LockError, Names};
use zookeeper_client::Error;

use crate::backend::ZkBackend;

/// The marker that starts the name of every holder's or waiter's node.
const NODE_MARK: &str = "_c_";

/// Whether `child` is a lock node (ours in either layout, Curator's, or kazoo's), not a name.
fn is_lock_node(child: &str) -> bool {
    child.starts_with(NODE_MARK) || crate::layout::is_kazoo(child)
}

/// A lock's parent node is in use while it has a holder's or waiter's node; its other children
/// are the next segments of longer names.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for ZkBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
        const DOING: &str = "listing the locks (the prefix's children)";
        let root = self.store().sessions.config.prefix.clone();
        let client = self.sessions().current().client.clone();
        let mut names = Vec::new();
        // Names relative to the root, whose children are still to read.
        let mut todo = std::collections::VecDeque::from([String::new()]);
        // Each name costs the read of its node; parents left empty by ended locks cost one
        // each too, up to a bound.
        let most_reads = budget.saturating_mul(4).saturating_add(16);
        let mut reads = 0usize;
        while let Some(rel) = todo.pop_front() {
            if names.len() >= budget || reads >= most_reads {
                return Ok(Names::new(names, true));
            }
            reads += 1;
            let path = if rel.is_empty() {
                root.clone()
            } else {
                format!("{root}/{rel}")
            };
            let children = match self
                .store()
                .call(DOING, client.list_children(&path))
                .await?
            {
                Ok(c) => c,
                // Gone since its parent was read (or no lock was ever taken).
                Err(Error::NoNode) => continue,
                Err(e) => return Err(crate::session::map_err(e, DOING)),
            };
            if !rel.is_empty() && children.iter().any(|c| is_lock_node(c)) {
                names.push(rel.clone());
            }
            for child in children.into_iter().filter(|c| !is_lock_node(c)) {
                let next = if rel.is_empty() {
                    child
                } else {
                    format!("{rel}/{child}")
                };
                // Only the subtrees that can hold a name with the prefix.
                if next.starts_with(prefix) || prefix.starts_with(&next) {
                    todo.push_back(next);
                }
            }
        }
        Ok(Names::new(names, false))
    }
}
