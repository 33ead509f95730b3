//! Listing the locks on etcd: a paged range read of the keys (no values) under the prefix.

use distlock_core::engine::{LockError, Names};

use crate::backend::EtcdBackend;
use crate::error::map_err;
use crate::wire::{RangeRequest, prefix_end};

/// The keys read per page.
const PAGE: i64 = 500;

/// The lock name of a holder's or waiter's key `<prefix><name>/<client>-<n>`.
fn name_of<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    let (name, _) = key.strip_prefix(prefix)?.rsplit_once('/')?;
    (!name.is_empty()).then_some(name)
}

/// Each key under the prefix is a holder or a waiter on a lease: a name found is in use.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for EtcdBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
        const DOING: &str = "listing the locks (a range read)";
        let base = &self.store().prefix;
        let start = format!("{base}{prefix}").into_bytes();
        let end = prefix_end(&start);
        let mut from = start;
        let mut names: Vec<String> = Vec::new();
        loop {
            let mut read = RangeRequest::key(from.clone()).limit(PAGE).keys_only();
            read.range_end = end.clone();
            let page = self
                .store()
                .members
                .retry(|c| {
                    let read = read.clone();
                    async move { c.range(read).await }
                })
                .await
                .map_err(|e| map_err(e, DOING))?;
            for kv in &page.kvs {
                if let Some(name) = std::str::from_utf8(&kv.key)
                    .ok()
                    .and_then(|k| name_of(base, k))
                    && names.last().is_none_or(|last| last != name)
                {
                    names.push(name.to_owned());
                }
            }
            let Some(last) = page.kvs.last() else { break };
            if !page.more {
                break;
            }
            if names.len() >= budget {
                return Ok(Names::new(names, true));
            }
            // The next page starts right after the last key read.
            from = last.key.clone();
            from.push(0);
        }
        Ok(Names::new(names, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_locks() {
        assert_eq!(name_of("distlock/", "distlock/orders/c1-0"), Some("orders"));
        assert_eq!(name_of("distlock/", "distlock/a/b/c1-3"), Some("a/b"));
        assert_eq!(name_of("distlock/", "distlock/orders"), None);
        assert_eq!(name_of("distlock/", "other/orders/c1-0"), None);
        assert_eq!(name_of("distlock/", "distlock//c1-0"), None);
    }
}
