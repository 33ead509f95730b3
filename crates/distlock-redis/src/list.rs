//! Listing the locks on Redis: `SCAN` with `MATCH` and `COUNT` on the server, or on every
//! master of a Cluster, never `KEYS`; each step is bounded work for the server.

use distlock_core::engine::{ErrorKind, LockError, Names};
use redis::Value;

use crate::connection::{ScanNode, ServerConnection};
use crate::keys::KeyLayout;

/// The keys scanned per `SCAN` step (its `COUNT`).
const SCAN_COUNT: usize = 500;

/// The suffixes of the keys that exist only while a lock is in use (held, queued for, or a
/// reader's or permit's set), after the lock key itself. The fence counters and the meta
/// hashes outlive their locks: a name that only has those is not listed.
const LIVE_SUFFIXES: [&str; 5] = [":waiters", ":permits", ":pqueue", ":plive", ":readers"];
/// The suffixes of the keys that outlive their locks.
const LASTING_SUFFIXES: [&str; 3] = [":fence", ":meta", ":pmeta"];

/// `s` with the glob characters of `MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name behind a key of the layout, if the key shows the lock in use.
pub(crate) fn live_name(layout: &KeyLayout, key: &str) -> Option<String> {
    let rest = key.strip_prefix(&layout.prefix)?;
    if LASTING_SUFFIXES.iter().any(|s| rest.ends_with(s)) {
        return None;
    }
    let lock = LIVE_SUFFIXES
        .iter()
        .find_map(|s| rest.strip_suffix(s))
        .unwrap_or(rest);
    if lock.is_empty() {
        return None;
    }
    if layout.hash_tag
        && let Some(inner) = lock.strip_prefix('{').and_then(|l| l.strip_suffix('}'))
        && !inner.contains(['{', '}'])
    {
        return Some(inner.to_owned());
    }
    // A name that carries its own hash tag (or a layout without tags) is the key as it is.
    Some(lock.to_owned())
}

/// Names of the locks in use under `layout` that start with `prefix`, scanning every node of
/// `conn` until `budget` names or the end.
pub(crate) async fn names(
    conn: &ServerConnection,
    layout: &KeyLayout,
    prefix: &str,
    budget: usize,
) -> Result<Names, LockError> {
    let pattern = format!("{}*", glob_escape(&layout.prefix));
    let mut names = Vec::new();
    for node in conn.scan_nodes().await? {
        let mut cursor = 0u64;
        loop {
            let (next, keys) = scan_step(conn, &node, cursor, &pattern).await?;
            names.extend(
                keys.iter()
                    .filter_map(|k| live_name(layout, k))
                    .filter(|n| n.starts_with(prefix)),
            );
            cursor = next;
            if cursor == 0 {
                break;
            }
            if names.len() >= budget {
                return Ok(Names::new(names, true));
            }
        }
    }
    Ok(Names::new(names, false))
}

/// One `SCAN` step on `node`: the next cursor and the keys (those not UTF-8 are left out: no
/// lock of ours has one).
async fn scan_step(
    conn: &ServerConnection,
    node: &ScanNode,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<String>), LockError> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    let reply = conn.on_node(node, cmd, "listing the locks (SCAN)").await?;
    let bad = || {
        LockError::new(
            ErrorKind::Protocol,
            format!("SCAN answered {reply:?}, not a cursor and keys"),
        )
    };
    let Value::Array(parts) = &reply else {
        return Err(bad());
    };
    let [next, Value::Array(keys)] = parts.as_slice() else {
        return Err(bad());
    };
    let next = match next {
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
    .ok_or_else(bad)?;
    let keys = keys
        .iter()
        .filter_map(|k| match k {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    Ok((next, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_back_to_the_names_in_use() {
        let layout = KeyLayout::default();
        let name = |k: &str| live_name(&layout, k);
        assert_eq!(name("distlock:{orders}").as_deref(), Some("orders"));
        assert_eq!(name("distlock:{orders}:waiters").as_deref(), Some("orders"));
        assert_eq!(name("distlock:{a:b}:readers").as_deref(), Some("a:b"));
        assert_eq!(name("distlock:{pool}:permits").as_deref(), Some("pool"));
        assert_eq!(name("distlock:{pool}:plive").as_deref(), Some("pool"));
        // What outlives a lock says nothing of its use.
        assert_eq!(name("distlock:{orders}:fence"), None);
        assert_eq!(name("distlock:{orders}:meta"), None);
        assert_eq!(name("distlock:{pool}:pmeta"), None);
        // A name with a hash tag of its own is stored as it is.
        assert_eq!(name("distlock:user{42}").as_deref(), Some("user{42}"));
        // Not ours.
        assert_eq!(name("cache:{orders}"), None);
        assert_eq!(name("distlock:"), None);
        let plain = KeyLayout {
            prefix: "app/".into(),
            hash_tag: false,
        };
        assert_eq!(
            live_name(&plain, "app/jobs:waiters").as_deref(),
            Some("jobs")
        );
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
